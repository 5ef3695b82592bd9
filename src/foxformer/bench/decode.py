"""`foxformer bench decode` (also `foxformer bench-decode`): decoding speed and memory at long context.

For each context length and batch size: prefill ``context`` random tokens (in chunks), then time
``steps`` single-token decode steps. Models: the foxformer preset without and with KV eviction, along each
``--decode`` path (eager, CUDA graphs, graphs of the compiled step), and transformers' own LlamaForCausalLM
of the same size as the anchors (``--anchors``: its eager SDPA forward with a DynamicCache, "llama-sdpa";
its StaticCache under torch.compile(mode="reduce-overhead"), "llama-static-compiled").
Rows are labelled by the preset's kind ("fox", "transformer" or "linear", see ``model_kind``; "+evict"
for the eviction row) and carry the preset name in "preset" and the path the steps took in "decode".
Reported: ms per step (the median of per-step times, each step synced as generation does; the mean and
the 90th percentile beside it), tokens/s (batch / median step), prefill time, peak device memory during
decoding, cache bytes, the fraction of keys eviction kept, the largest log-probability difference that
eviction caused on the same token stream (the measured output error), and the memory-bandwidth floor of
the step (decode_steps.py) with the measured time's multiple of it. ``--profile DIR``: a few more steps of each
row under torch.profiler, their operator and kernel table in DIR (where a step's time goes).

Random-init FoX gates all start near f = 0.5 and would evict everything; ``--gates realistic`` sets
each layer's gate biases to timescales geometric in [2, max context] across heads (the "realistic
gates" of DESIGN.md) so that eviction sees a mix of short and long heads. ``--model`` benches a trained
model instead, against the Transformer preset of its own block and size. Eviction needs a forget gate, cached
keys and a bound on |q.k| (QK-norm, or ``--evict-qk-bound``); without them (a Transformer or linear-attention
preset, FoX without QK-norm) the "+evict" rows are marked "skipped" instead of reporting an eviction that dropped
nothing.
"""
from __future__ import annotations

import gc
import os
import sys
from typing import Optional

import torch

from foxformer.models.calls import fox_blocks
from foxformer.train.distributed import resolve_device

from ..progress import progress_bar
from .common import ResultFile, device_heading, environment, preset_config, print_table, run_record
from .decode_steps import HF_PATHS, copy_bandwidth, measure_decode

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def realistic_gates(model, max_context: int, noise: float = 0.0) -> None:
    """Gate bias of every layer = timescales geometric in [2, max_context] across heads; weights scaled
    by ``noise`` (0: data-independent decay)."""
    from foxformer.models.layers import timescale_bias

    with torch.no_grad():
        for block in fox_blocks(model, "realistic gates"):
            gate = block.attn.fgate
            if gate is None:
                continue
            bias = timescale_bias(gate.num_heads, 2.0, float(max_context))
            if gate.kind == "data_dependent":
                gate.proj.bias.copy_(bias.to(gate.proj.bias))
                gate.proj.weight.mul_(noise)
            else:
                gate.bias.copy_(bias.to(gate.bias))


def model_kind(config) -> str:
    """The row label of a foxformer model: "linear" (gated linear attention), "fox" (softmax attention with a
    forget gate) or "transformer" (without one)."""
    if getattr(config, "attention", None) == "linear":
        return "linear"
    return "fox" if getattr(config, "has_fgate", False) else "transformer"


def _anchors(args, device: torch.device) -> list[str]:
    if args.anchors != "auto":
        return [a for a in args.anchors.split(",") if a]
    # The compiled anchor's compile is what a GPU user runs; on the CPU it would only time inductor.
    return list(HF_PATHS) if device.type == "cuda" else ["sdpa"]


def preset_model_config(args):
    """The FoxConfig of --preset as the benchmark builds it (--vocab-size, positions past the longest of
    --contexts), refused in the words of those flags."""
    flags = {"vocab_size": "--vocab-size", "max_position_embeddings": "--contexts"}
    given = {} if args.vocab_size is None else {"vocab_size": args.vocab_size}
    return preset_config(args.preset, "--preset", flags, max_position_embeddings=max(max(args.contexts) * 2, 16384),
                         **given)


def _build(args, device: torch.device, dtype: torch.dtype):
    """[(label, preset, model, evict_eps, decode path)]: preset is None for a --model (the settings record its
    path)."""
    from foxformer.models import FoxForCausalLM, get_preset

    from .model import llama_anchor

    models = []
    if args.model:
        from foxformer.train.loading import load_model
        fox = load_model(args.model, device=device, dtype=dtype, progress=not args.no_progress,
                         said_as="--model").model
    else:
        torch.manual_seed(0)
        fox = FoxForCausalLM(preset_model_config(args))
        if args.gates == "realistic":
            realistic_gates(fox, args.gate_tmax or max(args.contexts))
        fox = fox.to(device=device, dtype=dtype).eval()
    kind, preset = model_kind(fox.config), None if args.model else args.preset
    for evict in (False, True):
        for path in args.decode:
            models.append((f"{kind}+evict" if evict else kind, preset, fox, args.evict_eps if evict else None, path))
    if args.baseline:
        anchor, unmatched = anchor_preset(args.preset, fox.config if args.model else None)
        if anchor is None:
            print(f"bench decode: {args.model} has {unmatched}, which no transformer preset has: no llama-sdpa "
                  f"anchor", file=sys.stderr)
        else:
            llama = llama_anchor(get_preset(anchor, vocab_size=fox.config.vocab_size))
            llama.config.use_cache = True
            llama = llama.to(device=device, dtype=dtype).eval()
            for path in _anchors(args, device):
                models.append((f"llama-{path}", anchor, llama, None, path))
    return models


def anchor_preset(preset: Optional[str], config=None) -> tuple[Optional[str], Optional[str]]:
    """(the Transformer preset the Llama anchor is built from, None), or (None, what the model has that no preset has):
    transformer-<block>-<size> of ``preset``, or for a loaded model (``config``; ``preset`` None) of its own block
    (LLaMA or Pro) and (num_layers, hidden_size): --preset's default (Pro, 125M) stood in for a --model of any block
    and size."""
    from foxformer.models.presets import SIZES, block_of

    if config is None:
        _, block, size = preset.split("-")
        return f"transformer-{block}-{size}", None
    block = block_of(config)
    if block is None:
        return None, "a block with some of the Pro block's additions but not all"
    sizes = [s for s, shape in SIZES.items() if shape == (config.num_layers, config.hidden_size)]
    if not sizes:
        return None, f"hidden_size {config.hidden_size} and {config.num_layers} layers"
    return f"transformer-{block}-{sizes[0]}", None


def evict_skip_reason(model, evict_eps: float, qk_bound: Optional[float]) -> Optional[str]:
    """Why the +evict row could not evict a single key (it would report kept_fraction 1 and
    max_logprob_diff 0 as if eviction were free), or None when some layer evicts."""
    if not getattr(model.config, "has_fgate", False):
        return "the model has no forget gate (a softmax Transformer): eviction needs a FoX model"
    if getattr(model.config, "attention", None) == "linear":
        return "the model keeps a fixed-size recurrent state (attention='linear'), no keys to evict"
    bound = qk_bound if qk_bound is not None else model.config.evict_qk_bound
    if all(block.attn.eviction_bound(bound) is None for block in fox_blocks(model, "eviction")):
        return "no layer can evict: the model has no QK-norm, so pass --evict-qk-bound (your bound on |q.k| * scale)"
    return None


def run(args) -> dict:
    device = resolve_device(args.device, "--device")
    dtype = DTYPES[args.dtype] if args.dtype != "auto" else (torch.bfloat16 if device.type == "cuda" else torch.float32)
    if args.kernel:
        cfg = preset_model_config(args)
        if cfg.attention == "linear":
            raise SystemExit(f"error: --kernel times the FoX decode op over cached keys; {args.preset} decodes with "
                             "a fixed-size recurrent state instead: bench the whole model (without --kernel)")
        rows = kernel_rows(args.contexts, args.batches, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, device, dtype,
                           args.num_splits)
        payload = {"env": environment(device), **run_record(args, "decode"), "dtype": str(dtype).removeprefix("torch."),
                   "rows": rows}
        print_table(rows, ["context", "batch", "splits", "fox_ms", "sdpa_ms", "fox_gb_s", "sdpa_gb_s", "error"],
                    device_heading(payload["env"]))
        ResultFile(args.out).write(payload, complete=True)
        if args.out:
            print(f"wrote {args.out}")
        return payload
    models = _build(args, device, dtype)
    qk_bound = getattr(args, "evict_qk_bound", None)
    skip = {name: evict_skip_reason(m, eps, qk_bound) for name, _, m, eps, _ in models if eps is not None}
    for name, reason in skip.items():
        if reason:
            print(f"bench decode: skipping the {name} row: {reason}", file=sys.stderr)
    env = environment(device)
    bandwidth = copy_bandwidth(device)
    env["copy_gb_s"] = None if bandwidth is None else bandwidth / 1e9
    # the dtype that ran: the settings say "auto" unless --dtype was given
    payload = {"env": env, **run_record(args, "decode"), "dtype": str(dtype).removeprefix("torch."),
               "rows": []}
    rows, out = payload["rows"], ResultFile(args.out)
    jobs = [(*entry, ctx, b) for ctx in args.contexts for b in args.batches for entry in models]
    # the no-eviction row of the same model object and path is the reference of the eviction row's max_logprob_diff
    reference, before_eager = {}, {}
    for name, preset, model, eps, path, ctx, b in progress_bar(jobs, desc="bench decode", unit="row",
                                                               wanted=not args.no_progress):
        if skip.get(name):
            rows.append({"model": name, "preset": preset, "context": ctx, "batch": b, "evict_eps": eps,
                         "skipped": skip[name]})
            continue
        try:
            row = measure_decode(model, vocab=model.config.vocab_size, context=ctx, batch=b, steps=args.steps,
                                 warmup=args.warmup, evict_eps=eps, prefill_chunk=args.prefill_chunk, device=device,
                                 evict_qk_bound=qk_bound if eps is not None else None, decode=path,
                                 bandwidth=bandwidth, profile_path=_profile_path(args.profile, name, path, ctx, b))
        except torch.cuda.OutOfMemoryError:
            row = {"context": ctx, "batch": b, "decode": path, "error": "out of memory"}
        except Exception as e:  # noqa: BLE001  (an anchor that fails to compile must not lose the other rows)
            if path not in HF_PATHS[1:]:
                raise
            row = {"context": ctx, "batch": b, "decode": path, "error": f"{type(e).__name__}: {e}"[:300]}
        row["model"] = name
        row["preset"] = preset
        if eps is not None:
            row["evict_eps"] = eps
        lp = row.pop("logprobs", None)
        key = (id(model), path, ctx, b)
        if eps is None and lp is not None:
            reference[key] = lp
        elif lp is not None and key in reference:
            row["max_logprob_diff"] = float((lp - reference[key]).abs().max())
        # every path decodes the same token stream: its log-probabilities against the eager path's (0 for CUDA
        # graphs, which replay the eager path's kernels on the same storage), whichever of them ran first (with
        # --decode graphs,eager the rows before eager's went without)
        same = (id(model), eps, ctx, b)
        if lp is not None and path == "eager":
            reference[same] = lp
            for earlier, earlier_lp in before_eager.pop(same, []):
                earlier["logprob_diff_vs_eager"] = float((earlier_lp - lp).abs().max())
        elif lp is not None and same in reference:
            row["logprob_diff_vs_eager"] = float((lp - reference[same]).abs().max())
        elif lp is not None:
            before_eager.setdefault(same, []).append((row, lp))
        rows.append(row)
        out.write(payload)  # after every row: a run cut short keeps what it measured
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    columns = ["model", "decode", "context", "batch", "tokens_per_s", "ms_per_step", "ms_per_step_p90", "x_floor",
               "ms_host_per_step", "ms_per_token_streamed", "x_floor_streamed", "prefill_s", "peak_mem_gib",
               "cache_gib", "live_gib", "kept_fraction", "max_logprob_diff", "logprob_diff_vs_eager", "error",
               "skipped"]
    print_table(rows, columns, device_heading(env))
    out.write(payload, complete=True)
    if args.out:
        print(f"wrote {args.out}")
    return payload


def _profile_path(folder: Optional[str], name: str, path: str, context: int, batch: int) -> Optional[str]:
    """DIR/<row>_<path>_<context>_b<batch>.txt of a --profile run (None without one)."""
    if not folder:
        return None
    return os.path.join(folder, f"{name.replace('+', '_')}_{path}_{context}_b{batch}.txt")


@torch.no_grad()
def kernel_rows(contexts: list[int], batches: list[int], heads: int, kv_heads: int, head_dim: int,
                device: torch.device, dtype: torch.dtype, num_splits: Optional[list[int]] = None) -> list[dict]:
    """The attention op alone for one new token: FoX decode op (Triton on CUDA) against SDPA with
    the same q / k / v (what a softmax Transformer runs), as time and effective bandwidth; with num_splits, a
    row per key-split count of the decode kernel besides the default's."""
    from foxformer.ops import gate_cumsum
    from foxformer.ops.forgetting_attn.decode import forgetting_attention_decode

    from .common import time_ms

    rows = []
    # a CPU's op timed by the clock also on a machine with a GPU, as bench attention times it: not by triton's
    # do_bench, whose events and cache flushes are the GPU's
    cuda = device.type == "cuda"
    for T in contexts:
        for B in batches:
            try:
                q = torch.randn(B, 1, heads, head_dim, device=device, dtype=dtype)
                k = torch.randn(B, T, kv_heads, head_dim, device=device, dtype=dtype)
                v = torch.randn_like(k)
                c = gate_cumsum(torch.full((B, T, heads), -1e-4, device=device))
                kv_bytes = 2 * k.numel() * k.element_size() + c.numel() * 8
                fox = time_ms(lambda: forgetting_attention_decode(q, k, v, c), cuda=cuda)
                qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
                sdpa = time_ms(lambda: torch.nn.functional.scaled_dot_product_attention(
                    qt, kt, vt, enable_gqa=heads != kv_heads), cuda=cuda)
                sdpa_bytes = 2 * k.numel() * k.element_size()
                rows.append({"model": "op", "context": T, "batch": B, "splits": "auto", "fox_ms": fox, "sdpa_ms": sdpa,
                             "fox_gb_s": kv_bytes / fox / 1e6, "sdpa_gb_s": sdpa_bytes / sdpa / 1e6})
                for n in num_splits or []:
                    ms = time_ms(lambda: forgetting_attention_decode(q, k, v, c, num_splits=n), cuda=cuda)
                    rows.append({"model": "op", "context": T, "batch": B, "splits": n, "fox_ms": ms,
                                 "fox_gb_s": kv_bytes / ms / 1e6})
            except torch.cuda.OutOfMemoryError:
                rows.append({"model": "op", "context": T, "batch": B, "error": "out of memory"})
            finally:
                q = k = v = c = None
                if device.type == "cuda":
                    torch.cuda.empty_cache()
    return rows
