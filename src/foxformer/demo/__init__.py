"""`foxformer demo`: the project's main job, end to end on the built-in corpus.

prepare the SymPy-source corpus -> train a tiny FoX (Pro) and a tiny Transformer (Pro) for the same number of
tokens, as many as the whole demo's ``--minutes`` hold (demo.budget) -> evaluate validation loss and per-position
loss L(i) -> one PNG and a Markdown report in the run directory. Rerunning resumes or reuses whatever is already finished.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
import time
from typing import Callable

import numpy as np
import torch

from ..argtypes import SettingError
from ..json_text import json_text
from ..paths import write_text
from . import budget

MODELS = ("fox-pro-tiny", "transformer-pro-tiny")
LABELS = {"fox-pro-tiny": "FoX (Pro)", "transformer-pro-tiny": "Transformer (Pro)"}


def _device_defaults(device: str) -> dict:
    """Tokenizer, context and batch that give a useful few-minute run.

    On a CPU a tiny model with GPT-2's 50K-way softmax spends ~97% of its time in the output layer and sees too
    few tokens in minutes to learn anything; with byte-level tokens it sees millions and its per-position loss
    shows context use. GPUs take the GPT-2 tokenizer and longer sequences.
    """
    if device == "cuda":
        return {"tokenizer": "gpt2", "context": 2048, "batch_tokens": 65536, "micro_batch_size": 0, "lr": 3e-3,
                "eval_tokens": 2**18}
    return {"tokenizer": "bytes", "context": 512, "batch_tokens": 8192, "micro_batch_size": 16, "lr": 5e-3,
            "eval_tokens": 2**17}


def _probe_step(preset: str, geo: dict, device: str, vocab_size: int) -> Callable[[], int]:
    """A fresh ``preset`` on ``device`` ("cuda:1": that GPU) and a call that takes one training step of it at the
    demo's geometry and returns the step's tokens."""
    from ..models import FoxForCausalLM, get_preset
    from ..train.validation import autocast

    torch.manual_seed(0)
    model = FoxForCausalLM(get_preset(preset, vocab_size=vocab_size)).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    # at the size training will run (a larger batch is slower per token on a CPU)
    mbs = geo["micro_batch_size"] or max(1, geo["batch_tokens"] // geo["context"])
    x = torch.randint(0, vocab_size, (mbs, geo["context"]), device=device)
    gpu = torch.device(device).type == "cuda"

    def step() -> int:
        if gpu:
            torch.cuda.synchronize(device)
        with autocast(torch.device(device), bf16=gpu):  # as the training it sizes runs
            loss = model(x, labels=x).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if gpu:
            torch.cuda.synchronize(device)
        return x.numel()

    return step


def _measure(geo: dict, device: str, vocab_size: int, seconds: float) -> dict:
    """Each model's tokens/s on ``device``, measured for about ``seconds``."""
    steps = {p: _probe_step(p, geo, device, vocab_size) for p in MODELS}
    return budget.measure_speeds(steps, time.monotonic, seconds)


# validations while a model trains (and one at its end): the plan reserves their time
_EVALS = 6


def _cadence(plan: dict) -> dict:
    """The TrainConfig keys of how often a demo run validates and saves, and on how many tokens."""
    total, batch = plan["total_tokens"], plan["batch_tokens"]
    return {"eval_tokens": min(plan["eval_tokens"], 2 * batch), "eval_every_tokens": max(batch, total // _EVALS),
            "checkpoint_every_tokens": max(batch, total // 4)}


def _plan(out: str, clocked: budget.Clocked, device: str, geo: dict, vocab_size: int, log) -> dict:
    """Same token budget for both models, sized from their measured speeds on ``device`` to what is left of the
    demo's minutes; saved so reruns agree. The plan records the device's type: another GPU of the machine
    ("cuda:1") keeps the plan."""
    path = os.path.join(out, "demo_plan.json")
    kind = torch.device(device).type
    minutes = clocked.minutes
    wanted = {"minutes": minutes, "device": kind, **{k: v for k, v in geo.items() if k != "eval_tokens"}}
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            plan = json.load(f)
        if all(plan.get(k) == v for k, v in wanted.items()):
            log(f"reusing the plan of {path}: the steps of the run it began")
            return {**plan, "eval_tokens": geo["eval_tokens"]}
        if any(os.path.isdir(os.path.join(out, p)) for p in MODELS):
            raise SettingError("out", lambda name: f"{out!r} holds demo runs made with another plan ({path}); use "
                                                   f"another {name('out')} or delete it (nothing was overwritten)")
    speeds = _measure(geo, device, vocab_size, budget.MEASURE_SHARE * 60 * minutes)
    log("measured speed (after warm-up steps): " + ", ".join(f"{p} {s:,.0f} tok/s" for p, s in speeds.items()))
    left = clocked.left_s()
    during = _cadence({**geo, "total_tokens": 0})["eval_tokens"]
    shares = budget.share_out(left, speeds, geo["batch_tokens"],
                              geo["eval_tokens"] + (_EVALS + 1) * during)
    if shares.overrun:
        log(f"warning: {max(left, 0) / 60:.2f} of the {minutes:g} minutes were left after preparing the data and "
            f"measuring the speed, too few for {budget.MIN_STEPS} steps of each model and their evaluation: each "
            f"trains {budget.MIN_STEPS} steps and the demo takes longer than --minutes")
    plan = {"minutes": minutes, "device": kind, **geo, "total_tokens": shares.steps * geo["batch_tokens"],
            "speeds": speeds, "shares": dataclasses.asdict(shares)}
    write_text(path, json.dumps(plan, indent=2))  # a rerun reads it back: a truncated one would stop it
    return plan


def _per_position_smooth(curve: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Average L(i) over log-spaced position bins (raw L(i) is too noisy to read)."""
    n = curve.size
    edges = np.unique(np.round(np.geomspace(1, n + 1, num=min(n, 48))).astype(int))
    xs, ys = [], []
    for a, b in zip(edges[:-1], edges[1:]):
        xs.append(0.5 * (a + b - 1))
        ys.append(float(curve[a - 1:b - 1].mean()))
    return np.asarray(xs), np.asarray(ys)


def _plot(out: str, results: dict, tokenizer: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ..train.metrics import read_metrics

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    for preset, res in results.items():
        recs = read_metrics(res["out_dir"])
        tr = [(r["tokens"], r["loss"]) for r in recs if r.get("kind") == "train"]
        ev = [(r["tokens"], r["val_loss"]) for r in recs if r.get("kind") == "eval"]
        # in millions, as the report's curve: matplotlib's own ticks put a "1e6" in the corner
        line = ax1.plot([t / 1e6 for t, _ in ev], [v for _, v in ev], marker="o", ms=3,
                        label=f"{LABELS[preset]} val")[0]
        if tr:
            ax1.plot([t / 1e6 for t, _ in tr], [v for _, v in tr], alpha=0.3, color=line.get_color(),
                     label=f"{LABELS[preset]} train")
        xs, ys = _per_position_smooth(np.asarray(res["per_position"]))
        ax2.plot(xs, ys, label=f"{LABELS[preset]} (val {res['val_loss']:.3f})", color=line.get_color())
    # byte-level losses (the CPU default) were labelled per token, a figure the report's text gives per byte
    unit = "nats/byte" if tokenizer == "bytes" else "nats/token"
    ax1.set(xlabel="training tokens [M]", ylabel=f"loss ({unit})", title="Loss during training")
    ax1.legend()
    ax1.grid(alpha=0.3)
    ax2.set(xlabel="position i in the sequence", ylabel=f"validation loss L(i) ({unit})", xscale="log",
            title="Per-position validation loss")
    ax2.legend()
    ax2.grid(alpha=0.3)
    fig.tight_layout()
    path = os.path.join(out, "demo.png")
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _report(out: str, plan: dict, data_manifest: dict, results: dict, png: str, wall: float) -> str:
    lines = [
        "# foxformer demo",
        "",
        f"Built-in corpus: {', '.join(s['spec'] for s in data_manifest['sources'])} "
        f"({data_manifest['split']['train']['tokens']:,} training / {data_manifest['split']['val']['tokens']:,} "
        f"validation tokens, split by document; tokenizer {data_manifest['tokenizer']}).",
        f"Device: {plan['device']}; context {plan['context']}; {plan['batch_tokens']:,} tokens per step; "
        f"{plan['total_tokens']:,} training tokens per model; peak learning rate {plan['lr']}. "
        f"Demo wall time {wall / 60:.1f} min.",
        *([""] + ["Byte-level tokens (the CPU default: a tiny model with GPT-2's 50K-way output layer would spend "
                  "nearly all its time there): losses are in nats per byte."] if plan["tokenizer"] == "bytes" else []),
        "",
        "| model | parameters | non-embedding | steps | tokens | tokens/s | train loss | val loss |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for preset, r in results.items():
        lines.append(f"| {LABELS[preset]} (`{preset}`) | {r['params']:,} | {r['non_embedding_params']:,} | {r['step']} | "
                     f"{r['tokens']:,} | {r['tokens_per_s'] or 0:,.0f} | {r['train_loss'] or float('nan'):.4f} | "
                     f"{r['val_loss']:.4f} |")
    lines += [
        "",
        f"![losses]({os.path.basename(png)})",
        "",
        "Left: training loss (faint) and validation loss against training tokens. Right: validation loss at each "
        "position i of the sequence, L(i), averaged over log-spaced bins: a model that uses more context has a curve "
        "that keeps falling with i.",
        "",
        "These are minutes-long runs of two-layer models: the numbers show the pipeline working, not the "
        "paper's results. Run directories (config, checkpoints, metrics.jsonl, Hugging Face export):",
        "",
    ]
    lines += [f"- `{os.path.relpath(r['out_dir'], out)}/`" for r in results.values()]
    lines += ["", f"Reproduce: `foxformer demo --minutes {plan['minutes']} --out {out}`", ""]
    path = os.path.join(out, "report.md")
    write_text(path, "\n".join(lines))
    return path


def _train_config(preset: str, device: str, geo: dict, **run):
    """A TrainConfig of ``preset`` at the demo's tokenizer and geometry (``geo``, or the plan made of it);
    ``run``: its other keys."""
    from ..train.config import TrainConfig

    return TrainConfig(preset=preset, tokenizer=geo["tokenizer"], context=geo["context"],
                       batch_tokens=geo["batch_tokens"], micro_batch_size=geo["micro_batch_size"], lr=geo["lr"],
                       device=device, **run)


def _as_setting(check, *args):
    """``check(*args)``, where the ValueError of a check that names its setting ("context: ...", as TrainConfig
    and resolve_device do) becomes a SettingError of it: the demo's command names the flag that set it."""
    try:
        return check(*args)
    except SettingError:
        raise
    except ValueError as e:
        field, sep, reason = str(e).partition(": ")
        if not sep:
            raise
        raise SettingError(field, reason) from None


def run_demo(out: str = "runs/demo", minutes: float = 3.0, device: str = "auto", progress: bool = True,
             sources: list[str] | None = None, overrides: dict | None = None) -> dict:
    """Run the whole demo; returns a summary dict (also written to ``<out>/demo_summary.json``).

    ``device``: "auto", "cpu", "cuda" or "cuda:N", the GPU that probes, trains and evaluates both models.

    ``overrides`` replaces entries of the device defaults (tokenizer, context, batch_tokens, micro_batch_size,
    lr, eval_tokens).
    """
    from ..data.dataset import TokenDataset
    from ..data.preparation import PrepareConfig, prepare
    from ..train.distributed import init_distributed, resolve_device
    from ..train.loop import train
    from ..train.validation import evaluate

    # isfinite: inf and nan pass `<= 0` and only failed after data preparation and probing, as a NaN cast
    if not isinstance(minutes, (int, float)) or not math.isfinite(minutes) or minutes <= 0:
        raise SettingError("minutes", f"expected a positive number, got {minutes!r}")
    # `--device cuda` without a GPU ended in torch's assertion, after the data was prepared. The index stays:
    # "cuda:1" was cut to its type, and the demo trained on cuda:0
    where = _as_setting(resolve_device, device)
    device = str(where)
    geo = _device_defaults(where.type)
    unknown = set(overrides or {}) - set(geo)
    if unknown:
        raise ValueError(f"overrides: unknown keys {sorted(unknown)}; expected some of {sorted(geo)}")
    geo.update(overrides or {})
    context = geo["context"]
    sized = not isinstance(context, bool) and isinstance(context, int) and context > 0  # else refused below
    if sized and "context" in (overrides or {}) and "batch_tokens" not in overrides:
        # the device's batch is whole sequences of its own context: another --context (one not dividing 8192 on a
        # CPU) failed after the data preparation and the speed probe, on a batch_tokens no demo flag sets
        geo["batch_tokens"] = max(1, round(geo["batch_tokens"] / geo["context"])) * geo["context"]
        if "micro_batch_size" not in overrides:  # the CPU's 16 sequences a pass need not divide the new batch
            geo["micro_batch_size"] = 0
    # the runs' own checks, before any work: `--context 1` passed the demo's and was refused only after the data
    # preparation and the speed probe (a context of 0 was a traceback from an empty forward in the probe)
    _as_setting(lambda: _train_config(MODELS[0], device, geo, max_steps=1).validate())

    def log(msg: str) -> None:
        print(f"[demo] {msg}", file=sys.stderr, flush=True)

    clocked = budget.Clocked.starting(minutes, time.monotonic)
    log(f"about {minutes:g} minute{'s' * (minutes != 1)} in all: preparing the data, measuring the speed, training "
        f"and evaluating both models, the report (not counted: Python loading torch before this line)")
    data_dir = os.path.join(out, f"data-{geo['tokenizer'].replace(':', '_').replace('/', '_')}")
    log(f"preparing the built-in corpus into {data_dir}")
    manifest = prepare(PrepareConfig(sources=sources or ["builtin:sympy"], out_dir=data_dir,
                                     tokenizer=geo["tokenizer"]), progress=progress)
    vocab_size = int(np.ceil(manifest["vocab_size"] / 64) * 64)
    if where.index is not None:
        # Triton launches its kernels on the current GPU: the speed probe's tensors lay on another one. Training
        # makes the run's GPU current too (init_distributed)
        torch.cuda.set_device(where)
    plan = _plan(out, clocked, device, geo, vocab_size, log)
    log(f"plan: {plan['total_tokens'] // plan['batch_tokens']:,} steps ({plan['total_tokens']:,} tokens) per model "
        f"at context {plan['context']}")
    # a plan of an earlier version has no shares: its runs go on without a limit
    shares = budget.Shares(**plan["shares"]) if "shares" in plan else None
    results = {}
    for preset in MODELS:
        run_dir = os.path.join(out, preset)
        limit = None if shares is None else budget.run_limit(preset, clocked.left_s(), shares)
        said = "" if shares is None else (f": about {shares.minutes[preset]:.2f} of the demo's {minutes:g} "
                                          f"minute{'s' * (minutes != 1)}"
                                          + (f", training at most {limit:g}" if limit is not None else ""))
        log(f"training {preset} -> {run_dir}{said}")
        cfg = _train_config(preset, device, plan, data_dir=data_dir, out_dir=run_dir,
                            total_tokens=plan["total_tokens"], max_minutes=limit, **_cadence(plan),
                            progress=progress, log_every=10)
        summary = train(cfg)
        if summary.get("time_limit"):
            log(f"warning: {preset} reached its time limit ({limit:g} minutes) after {summary['step']:,} of "
                f"{plan['total_tokens'] // plan['batch_tokens']:,} steps: it trained slower than measured (other load "
                f"on the machine?), so the two models did not see the same tokens")
        log(f"evaluating {preset}")
        from ..models import FoxForCausalLM
        from ..models.calls import hf_progress

        with hf_progress(progress):  # transformers' loading bar wrote its frames into a log off a terminal
            model = FoxForCausalLM.from_pretrained(summary["hf_dir"]).to(device)
        val = TokenDataset(data_dir, "val", plan["context"], expect_tokenizer=geo["tokenizer"])
        info = init_distributed(device, "none")
        loss, per_pos = evaluate(model, val, max(1, plan["eval_tokens"] // plan["context"]),
                                 plan["micro_batch_size"] or 8, info, where.type == "cuda")
        results[preset] = {**summary, "val_loss": loss, "per_position": per_pos.tolist()}
        del model
    png = _plot(out, results, plan["tokenizer"])
    wall = clocked.elapsed_s()
    report = _report(out, plan, manifest, results, png, wall)
    summary = {"out": out, "report": report, "plot": png, "plan": plan, "wall_s": wall,
               "models": {p: {k: v for k, v in r.items() if k != "per_position"} for p, r in results.items()}}
    write_text(os.path.join(out, "demo_summary.json"),
               json_text({**summary, "per_position": {p: r["per_position"] for p, r in results.items()}}))
    log(f"done in {wall / 60:.1f} minutes ({minutes:g} planned): {report}")
    return summary
