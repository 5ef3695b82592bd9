"""`foxformer bench-model`: training throughput and peak memory of whole models.

One training step = forward + backward + AdamW step under --dtype autocast (bf16 by default; fp32
master weights; fp32 runs without autocast),
B = tokens_per_step // context sequences of length `context`. The anchor is transformers' own
LlamaForCausalLM with SDPA, built at the size of our Transformer (LLaMA) preset of the same size.
MFU is measured against the device's dense peak for --dtype (``mfu_peak``), null with a note where that
peak is not known.
"""
from __future__ import annotations

import argparse
import gc
import math
import os
import re
import sys
import time

import torch

from foxformer.json_text import print_json
from foxformer.models import FoxForCausalLM, count_non_embedding, training_flops_per_token
from foxformer.models.config import FoxConfig
from foxformer.train.config import parse_overrides
from foxformer.train.distributed import resolve_device
from foxformer.train.metrics import mfu, peak_flops

from .cli import configure_model, model_defaults
from ..progress import progress_bar
from .common import (ResultFile, device_heading, environment, gluon_fwd_options, preset_config, print_table, run_record,
                     write_profile)

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
# The FoxConfig fields a flag sets on every row (and on the anchors), for errors in the flag's words.
FLAGS = {"attention_backend": "--backend", "vocab_size": "--vocab-size", "gradient_checkpointing": "--grad-ckpt"}


def llama_anchor(cfg: FoxConfig):
    """transformers.LlamaForCausalLM with the dimensions of ``cfg`` (SDPA attention, RoPE theta 500000)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    lcfg = LlamaConfig(vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size,
                       intermediate_size=cfg.intermediate_size, num_hidden_layers=cfg.num_layers,
                       num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_kv_heads,
                       head_dim=cfg.head_dim, rope_theta=cfg.rope_theta, rms_norm_eps=cfg.rms_norm_eps,
                       tie_word_embeddings=cfg.tie_embeddings, max_position_embeddings=1 << 20,
                       attn_implementation="sdpa", use_cache=False)
    return LlamaForCausalLM(lcfg)


def mfu_peak(device_name: str, dtype: str, override: float | None = None,
             tf32: bool | None = None) -> tuple[float | None, str, str | None]:
    """(peak FLOP/s, the compute dtype it is for, a note why it is None) for --dtype ``dtype`` on the device
    named ``device_name`` ("cpu" off CUDA). fp32 matmuls run on TF32 tensor cores where TF32 is allowed
    (``tf32``, default: torch's current setting), about 7x the plain fp32 peak on H100; ``override`` is
    --peak-flops."""
    if dtype == "fp32" and (torch.backends.cuda.matmul.allow_tf32 if tf32 is None else tf32):
        dtype = "tf32"
    if override:
        return override, dtype, None
    peak = peak_flops(device_name, dtype)
    if peak is None:
        return None, dtype, (f"MFU n/a: no known dense {dtype} peak for {device_name!r}; "
                             "pass --peak-flops (per device, FLOP/s)")
    return peak, dtype, None


def _size_of(preset: str) -> str:
    return preset.split("-")[-1]


def measure(model: torch.nn.Module, vocab: int, context: int, batch: int, steps: int, warmup: int,
            dtype: torch.dtype, device: torch.device, desc: str, loss_kwargs: dict | None = None,
            profile_path: str | None = None, progress: bool = True) -> dict:
    """Median step time and peak memory of `steps` timed training steps after `warmup` ones; with
    profile_path, one more step under torch.profiler, its operator table written there."""
    model.to(device).train()
    fused = device.type == "cuda"
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=fused)
    g = torch.Generator(device="cpu").manual_seed(0)
    ids = torch.randint(0, vocab, (batch, context), generator=g).to(device)
    use_amp = dtype != torch.float32

    def train_step() -> torch.Tensor:
        with torch.autocast(device.type, dtype=dtype, enabled=use_amp):
            loss = model(input_ids=ids, labels=ids, **(loss_kwargs or {})).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize()
        return loss

    times = []
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    for i in progress_bar(range(warmup + steps), desc=desc, unit="step", wanted=progress, leave=False):
        t0 = time.perf_counter()
        loss = train_step()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    step = sorted(times)[len(times) // 2]
    peak = torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else None
    if profile_path:
        with torch.profiler.profile() as prof:
            loss = train_step()
        write_profile(prof, profile_path, device)
    return {"step_s": step, "tokens_per_s": batch * context / step, "peak_mem_gib": peak,
            "loss": float(loss.detach()), "step_times": times}


def _preset_spec(spec: str) -> tuple[str, dict]:
    """``"fox-pro-125m:head_dim=128"`` -> ``("fox-pro-125m", {"head_dim": 128})``: a preset with FoxConfig
    overrides of its own (values as YAML reads them), so that one run can time a preset beside a variant of it."""
    name, *items = spec.split(":")
    return name, parse_overrides(items, f"--presets {spec}")


def _file_name(name: str) -> str:
    """``name`` with only [A-Za-z0-9._-] (a row such as "fox-pro-125m:head_dim=128" names its profile files)."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", name)


def _check(args: argparse.Namespace) -> tuple[list[tuple[str, str, dict, FoxConfig]], dict]:
    """(row name, preset name, that row's FoxConfig overrides, its config) for each --presets entry and the
    overrides every row shares, or a ValueError naming the bad option: checked before any model is measured (an
    unknown preset late in --presets used to end in a traceback after the earlier ones had run, their
    results lost)."""
    model_defaults(args)  # the sizes left out, for the device: a GPU's, or a CPU's
    if args.tokens_per_step % args.context:
        raise ValueError(f"--tokens-per-step ({args.tokens_per_step}) must be a multiple of --context "
                         f"({args.context})")
    # inf passed (an MFU of 0 in every row), as nan had before it was refused
    if args.peak_flops is not None and not (math.isfinite(args.peak_flops) and args.peak_flops > 0):
        raise ValueError(f"--peak-flops must be a finite number > 0, got {args.peak_flops}")
    # --gluon-fwd on a CPU named every FoX row after a Gluon setting that no kernel of the run applied
    if not gluon_runs_on(resolve_device(args.device, "--device")) and args.gluon_fwd:
        raise ValueError("--gluon-fwd sets the Gluon forward kernels, which run on an sm_90 GPU (H100 / H200); no "
                         "row runs them on the CPU: leave it out")
    given_backend = args.backend is not None
    if not given_backend:  # the record (run_record) says what ran: the config's own
        args.backend = FoxConfig.attention_backend
    overrides = {"attention_backend": args.backend}
    if args.vocab_size:
        overrides["vocab_size"] = args.vocab_size
    if args.grad_ckpt:
        overrides["gradient_checkpointing"] = True
    rows = []
    for spec in (p.strip() for p in args.presets.split(",")):
        preset, own = _preset_spec(spec)
        said = f"--presets {spec}"
        # the row's own override wins over the flag's, and its error is the row's
        cfg = preset_config(preset, said, {**FLAGS, **dict.fromkeys(own, said)}, **{**overrides, **own})
        rows.append((spec, preset, own, cfg))
    if len({row[0] for row in rows}) < len(rows):
        raise ValueError(f"--presets names a row twice: {args.presets!r}")
    if given_backend and not args.anchor and all("attention_backend" in own for _, _, own, _ in rows):
        raise ValueError("--backend: every --presets row sets its own attention_backend and --no-anchor leaves no "
                         "anchor to take it; leave --backend out")
    return rows, overrides


def gluon_runs_on(device: torch.device) -> bool:
    """Whether the Gluon kernels, which --gluon-fwd configures, can run on ``device`` (a GPU's; the op checks which)."""
    return device.type == "cuda"


def _fwd_label(changes: dict) -> str:
    """A --gluon-fwd setting as it names a row: 'default', or '64:max_free=True,...;128:...'."""
    if not changes:
        return "default"
    return ";".join(("" if dim is None else f"{dim}:") + ",".join(f"{k}={v}" for k, v in fields.items())
                    for dim, fields in changes.items())


def run(args: argparse.Namespace) -> int:
    try:
        specs, overrides = _check(args)
        for changes in args.gluon_fwd or []:  # every setting checked before the first model is built
            with gluon_fwd_options(changes):
                pass
        return _run(args, specs, overrides)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def _measure_settings(model, cfg, args, name, batch, dtype, device, loss_kwargs, settings):
    """One result per Gluon forward setting, the settings taken in turn for --rounds rounds on the one (compiled)
    model: its step times pooled over the rounds (median), so that drift in the machine falls on every setting.
    Yields the results after each round (a run cut by a time limit keeps the rounds it finished)."""
    times: list[list[float]] = [[] for _ in settings]
    results: list[dict] = [{} for _ in settings]
    for r in range(args.rounds):
        for i, changes in enumerate(settings):
            label = name if len(settings) == 1 else f"{name} [{_fwd_label(changes)}]"
            prof = (os.path.join(args.profile, f"{_file_name(label)}.txt")
                    if args.profile and r == 0 else None)
            with gluon_fwd_options(changes):
                res = measure(model, cfg.vocab_size, args.context, batch, args.steps, args.warmup, dtype, device,
                              label, loss_kwargs, prof, progress=not args.no_progress)
            times[i] += res.pop("step_times")
            peak = max(filter(None, (results[i].get("peak_mem_gib"), res["peak_mem_gib"])), default=None)
            step = sorted(times[i])[len(times[i]) // 2]
            results[i] = {**res, "step_s": step, "tokens_per_s": batch * args.context / step, "peak_mem_gib": peak,
                          "name": label, "gluon_fwd": _fwd_label(changes), "rounds": r + 1}
        yield [dict(res) for res in results]


def _run(args: argparse.Namespace, specs, overrides) -> int:
    device = resolve_device(args.device, "--device")
    dtype = DTYPES[args.dtype]
    batch = args.tokens_per_step // args.context
    entries = []
    for name, preset, own, cfg in specs:
        entries.append((name, preset, own, cfg, True, lambda c=cfg: FoxForCausalLM(c)))
    if args.anchor:
        for size in dict.fromkeys(_size_of(spec[1]) for spec in specs):
            ref = preset_config(f"transformer-llama-{size}", "--presets", FLAGS, **overrides)
            entries.append((f"hf-llama-sdpa-{size}", f"transformer-llama-{size}", {}, ref, False,
                            lambda c=ref: llama_anchor(c)))

    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    peak, peak_dtype, mfu_note = mfu_peak(device_name, args.dtype, args.peak_flops)
    if mfu_note and device.type == "cuda":
        print(f"bench model: {mfu_note}", file=sys.stderr)
    rows, out = [], ResultFile(args.out)
    payload = {"benchmark": "model_training", "device": str(device), "device_name": device_name,
               "torch": torch.__version__, "compile": args.compile, "fused_loss": args.fused_loss,
               "tokens_per_step": args.tokens_per_step, "steps": args.steps, "warmup": args.warmup,
               "peak_flops": peak, "peak_dtype": peak_dtype, "mfu_note": mfu_note, "env": environment(device),
               **run_record(args, "model"),
               "gluon_fwd": [_fwd_label(c) for c in args.gluon_fwd or []], "rounds": args.rounds,
               "results": rows}
    for name, preset, own, cfg, ours, build in entries:
        torch.manual_seed(0)
        model = build()
        if args.grad_ckpt and not isinstance(model, FoxForCausalLM):
            model.gradient_checkpointing_enable()
        if args.compile:
            model = torch.compile(model)
        # the Gluon forward's settings matter only where the model runs Forgetting Attention
        settings = (args.gluon_fwd or [{}]) if ours and cfg.attention == "forgetting" else [{}]
        flops = training_flops_per_token(cfg, args.context)
        facts = dict(preset=preset, overrides=own, context=args.context, batch=batch, dtype=args.dtype,
                     non_embedding_params=count_non_embedding(cfg))
        first = len(rows)
        loss_kwargs = {"return_logits": False} if args.fused_loss and ours else None  # the anchor keeps its own
        try:
            for results in _measure_settings(model, cfg, args, name, batch, dtype, device, loss_kwargs, settings):
                for res in results:
                    res.update(facts, model_tflops=flops * res["tokens_per_s"] / 1e12,
                               mfu=mfu(res["tokens_per_s"], flops, peak))
                rows[first:] = results
                out.write(payload)  # a run cut by a time limit keeps the rows (and rounds) measured so far
        except torch.OutOfMemoryError:
            rows[first:] = [{"name": name, **facts, "step_s": None, "tokens_per_s": None, "peak_mem_gib": None,
                             "loss": None, "model_tflops": None, "mfu": None, "error": "OOM"}]
            out.write(payload)
        for res in rows[first:]:
            print_json(res)
        del model
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()

    # aligned as the other benchmarks' tables (its cells were joined by " | " at whatever width they had)
    print_table(rows, ["name", "context", "batch", "tokens_per_s", "step_s", "peak_mem_gib", "model_tflops", "mfu"],
                device_heading(payload["env"]))
    out.write(payload, complete=True)  # creates the folder
    if args.out:  # as bench attention and decode say where their rows went
        print(f"wrote {args.out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="foxformer bench-model", description=__doc__)
    configure_model(parser)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main())
