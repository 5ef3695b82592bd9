"""`foxformer bench scaling`: compare training runs of the same token batches on different numbers of GPUs.

The first run is the reference (usually one GPU, with gradient accumulation standing in for the other
ranks); every other run is compared with it step by step. Training makes the data order a function of the
step alone (train/loop.py), so runs of any world size see the same sequences at the same step and their
losses differ only by floating-point rounding: reduction order, and with FSDP2 its bf16 parameter copies
(MixedPrecisionPolicy) where one GPU and DDP cast fp32 weights op by op under autocast. The match
criterion is relative (|loss - reference| / reference at every shared step), because early-training
losses swing by nats from batch to batch and a small relative drift shows up as a large absolute one
there. Throughput is the median of the per-step tokens/s
after `--skip` steps (compilation and allocator warm-up). Scaling efficiency is
`tokens/s / (world_size * reference tokens/s per GPU)`; a run resumed on another number of GPUs has no one
world size, so it gets none (its losses still compare), and a reference like that gives no run one.
"""
from __future__ import annotations

import argparse
import math
import os
import statistics
import sys

import yaml

from ..train.metrics import read_metrics
from .common import ResultFile, environment, print_table, run_record

# What must be the same as in the reference for a run to be a measurement of the same training (same model,
# data order, batch and schedule): config.yaml keys, then start-record facts derived from them. World size,
# parallelism, micro-batching, device and stop conditions may differ: they are what is compared. data_dir is
# left out: one dataset may sit at another (relative / absolute) path.
SETUP_KEYS = ("preset", "model", "tokenizer", "context", "roll", "batch_tokens", "lr", "min_lr_ratio",
              "schedule", "weight_decay", "beta1", "beta2", "eps", "grad_clip", "seed", "compile",
              "activation_checkpointing", "fused_loss")
DERIVED_KEYS = ("vocab_size", "bf16", "seqs_per_step", "warmup_tokens", "horizon_tokens", "non_embedding_params")


def _setup(run_dir: str, start: dict) -> dict:
    path = os.path.join(run_dir, "config.yaml")
    config = {}
    if os.path.exists(path):
        with open(path) as f:
            config = yaml.safe_load(f) or {}
    setup = {k: config[k] for k in SETUP_KEYS if k in config}
    setup.update({k: start[k] for k in DERIVED_KEYS if k in start})
    return setup


def summarize(run_dir: str, skip: int) -> dict:
    """Start record, losses by step and median throughput of one run folder."""
    records = read_metrics(run_dir)
    starts = [r for r in records if r.get("kind") == "start"]
    train = [r for r in records if r.get("kind") == "train"]
    if not starts or not train:
        raise ValueError(f"{run_dir}: no training records in metrics.jsonl (did the run start?)")
    timed = [r["tokens_per_s"] for r in train[skip:]] or [r["tokens_per_s"] for r in train]
    mfus = [r["mfu"] for r in train[skip:] if r.get("mfu") is not None]  # None on CPU
    first = starts[0]
    worlds = [s["world_size"] for s in starts]
    return {"run": run_dir, "commit": first.get("commit"), "world_size": first["world_size"], "parallel": first["parallel"],
            "grad_accum": first["grad_accum"], "micro_batch_size": first["micro_batch_size"],
            "segments": ",".join(str(w) for w in worlds),  # world size of each (re)start
            "world_size_changed": len(set(worlds)) > 1,
            "losses": {r["step"]: r["loss"] for r in train}, "tokens_per_s": statistics.median(timed),
            "mfu": statistics.median(mfus) if mfus else None, "setup": _setup(run_dir, first)}


def differences(run: dict, ref: dict) -> str | None:
    """'key value != reference value' for each setup key both runs record and that differs, or None."""
    a, b = run.get("setup") or {}, ref.get("setup") or {}
    diffs = [f"{k} {a[k]} != {b[k]}" for k in a if k in b and a[k] != b[k]]
    return "; ".join(diffs) or None


def compare(runs: list[dict], tolerance: float) -> list[dict]:
    """One row per run: loss difference to the reference over shared steps, throughput, efficiency."""
    ref = runs[0]
    # A run resumed on another world size has a throughput median over segments of different sizes: dividing
    # it by either size (or comparing with it) measures no configuration.
    ref_changed = ref.get("world_size_changed", False)
    per_gpu = None if ref_changed else ref["tokens_per_s"] / ref["world_size"]
    rows = []
    for run in runs:
        changed = run.get("world_size_changed", False)
        note = None
        if changed:
            note = (f"world size changed mid-run (segments {run['segments']}): no tokens/s per GPU or efficiency"
                    + ("; no run gets one, all are measured against this reference" if run is ref else ""))
        elif ref_changed:
            note = f"the reference's world size changed mid-run (segments {ref['segments']}): no efficiency"
        run_per_gpu = None if changed else run["tokens_per_s"] / run["world_size"]
        shared = sorted(set(run["losses"]) & set(ref["losses"]))
        diffs = [abs(run["losses"][s] - ref["losses"][s]) for s in shared]
        rel = [d / abs(ref["losses"][s]) for d, s in zip(diffs, shared)]
        worst = max(rel) if rel else None
        rows.append({"run": run["run"], "commit": run["commit"], "gpus": run["world_size"],
                     "segments": run["segments"], "differs": differences(run, ref),
                     "parallel": run["parallel"],
                     "accum": run["grad_accum"], "steps": len(shared),
                     "max_dloss": max(diffs) if diffs else None,
                     "mean_dloss": sum(diffs) / len(diffs) if diffs else None, "max_rel": worst,
                     "loss_match": worst is not None and worst <= tolerance,
                     "tok_s": run["tokens_per_s"], "tok_s_per_gpu": run_per_gpu,
                     "efficiency": None if run_per_gpu is None or per_gpu is None else run_per_gpu / per_gpu,
                     "mfu": run["mfu"], "world_size_changed": changed, "note": note})
    return rows


def run(args: argparse.Namespace) -> int:
    try:
        if not (math.isfinite(args.tolerance) and args.tolerance >= 0):
            raise ValueError(f"--tolerance must be a finite number >= 0, got {args.tolerance}")
        for d in args.runs:
            if not os.path.isdir(d):
                raise ValueError(f"{d}: no such run folder")
        runs = [summarize(d, args.skip) for d in args.runs]  # ValueError: no records, a broken metrics line
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    rows = compare(runs, args.tolerance)
    text = print_table(rows, ["run", "gpus", "segments", "parallel", "accum", "steps", "max_dloss", "mean_dloss",
                              "max_rel", "loss_match", "tok_s", "tok_s_per_gpu", "efficiency", "mfu"])
    # The runs' own commits are in the rows; env is where this report was made.
    ResultFile(args.out).write({"env": environment(), **run_record(args, "scaling"), "reference": args.runs[0],
                               "tolerance": args.tolerance, "skip": args.skip, "rows": rows, "table": text,
                               "losses": {r["run"]: r["losses"] for r in runs}}, complete=True)
    for r in rows:
        if r["differs"]:
            print(f"{r['run']}: not comparable with the reference {args.runs[0]} (another training setup: "
                  f"{r['differs']}); its loss difference and efficiency measure that, not scaling")
    for r in rows:
        if r["world_size_changed"]:
            print(f"{r['run']}: {r['note']}")
    bad = [r["run"] for r in rows if not r["loss_match"]]
    if bad:
        print(f"loss differs from the reference by more than {args.tolerance:.1%} in: {', '.join(bad)}")
    return 1 if (bad or any(r["differs"] for r in rows)) and args.strict else 0
