"""Shared pieces of the benchmarks: environment record, timing, tables, JSON."""
from __future__ import annotations

import contextlib
import gzip
import json
import os
import platform

import torch

from ..eval.outputs import note_replacing
from ..paths import write_json, write_text
from ..provenance import code_version
from .timeline import timeline_summary


def environment(device: torch.device | str | None = None) -> dict:
    """What the numbers were measured on; stored next to every result. ``device``: the one the benchmark ran on (a
    CPU run on a machine with a GPU was recorded as run on that GPU, with its CUDA version and SM count); None: the
    machine's GPU where it has one, else its CPU. A CPU's record names the processor and torch's thread count, which
    its timings scale with (OMP_NUM_THREADS)."""
    env = {"torch": torch.__version__, "python": platform.python_version(), "device": "cpu",
           "commit": code_version()}
    try:
        import triton
        env["triton"] = triton.__version__
    except ImportError:
        env["triton"] = None
    device = torch.device(device if device is not None else "cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cuda":
        env["device"] = torch.cuda.get_device_name(device)
        env["cuda"] = torch.version.cuda
        env["sm_count"] = torch.cuda.get_device_properties(device).multi_processor_count
    else:
        env["cpu"] = _cpu_name()
        env["threads"] = torch.get_num_threads()
    return env


def _cpu_name() -> str | None:
    """The processor's model name (/proc/cpuinfo; platform.processor() is empty on Linux), or None."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name":
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or None


def run_record(args, benchmark: str) -> dict:
    """How a result was asked for: ``foxformer bench <benchmark>`` and every option's value as it ran (defaults filled
    in), stored beside ``environment()`` in each benchmark's JSON (a run with --backend triton read like one with
    auto)."""
    # "_parser" is argparse's object, left in by a bare parse_args
    settings = {k: v for k, v in vars(args).items()
                if k not in ("func", "command", "bench_command") and not k.startswith("_")}
    return {"command": f"foxformer bench {benchmark}", "settings": settings}


class ResultFile:
    """A benchmark's --out JSON, rewritten after every row so that a run cut short keeps what it measured: each
    rewrite atomic (paths.write_json: a Ctrl-C mid-write leaves the last whole one), ``"complete": false`` until the
    last (a cut run's file read like a finished one with fewer rows), an earlier run's file noted before the first
    rewrite takes its place (as the other commands note theirs; the earlier file went without a word), and no file
    for an empty path (bench model and decode wrote none; bench attention failed after its first row)."""

    def __init__(self, path: str | None):
        self.path, self._first = path, True

    def write(self, payload: dict, complete: bool = False) -> None:
        if not self.path:
            return
        if self._first and os.path.exists(self.path):
            note_replacing(self.path, elsewhere="--out FILE")
        self._first = False
        write_json(self.path, {**payload, "complete": complete})


def preset_config(preset: str, said: str, flags: dict[str, str], **overrides):
    """``get_preset(preset, **overrides)``, a refusal named as the command line set it: by ``flags[field]`` for the
    first field it is about that a flag set ({field: flag}), else by ``said``, what named the preset (``--presets
    fox-pro-125m:num_heads=5``); get_preset and FoxConfig name a function and a field the user never typed."""
    from foxformer.models import get_preset
    from foxformer.models.config import ConfigError

    try:
        return get_preset(preset, **overrides)
    except ConfigError as e:
        raise ValueError(f"{next((flags[f] for f in e.fields if f in flags), said)}: {e.reason}") from None
    except ValueError as e:  # an unknown preset
        raise ValueError(f"{said}: {e}") from None


def time_ms(fn, warmup_ms: int = 100, rep_ms: int = 400, grad_to_none=(), cuda: bool | None = None) -> float:
    """Median wall time of fn in milliseconds (device events on CUDA; cuda=False times a CPU function on a machine
    that has a GPU too, by the clock, as without one). grad_to_none: leaves whose ``.grad``
    is dropped before each timed call, so that a backward stores its gradients instead of adding them to the
    last call's (an add over every input that a training step, whose attention inputs are not leaves, never
    runs: the `aten::add_` rows of every provider in docs/bench/profile_attention_f165756/)."""
    grad_to_none = list(grad_to_none)
    if torch.cuda.is_available() if cuda is None else cuda:
        import triton.testing
        return float(triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms, grad_to_none=grad_to_none or None,
                                             return_mode="median"))
    import time
    fn()
    times = []
    for _ in range(5):
        for x in grad_to_none:
            x.grad = None
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return sorted(times)[len(times) // 2]


def device_heading(env: dict) -> str:
    """The line above a benchmark's table that names the device of ``env`` (environment()) its rows ran on: a CPU
    run under --device auto, the default, printed a table that read like a GPU's. On a CPU it says what its numbers
    are for."""
    if env["device"] != "cpu":
        return f"device: {env['device']}"
    threads = f"{env['threads']} thread{'s' if env['threads'] != 1 else ''}"
    return (f"device: cpu ({env['cpu'] or 'processor unknown'}, {threads}); CPU timings check the code path and are "
            f"not comparable with the GPU figures")


def print_table(rows: list[dict], columns: list[str], heading: str | None = None) -> str:
    """``rows`` under ``columns``, aligned, below ``heading`` where given, printed and returned. A column no row has
    a value in is left out: a CPU's peak memory, a floor without a measured bandwidth and an error column where
    nothing failed took bench decode's CPU table to 330 characters a line, a third of them dashes."""
    columns = [c for c in columns if any(r.get(c) is not None for r in rows)] or columns
    widths = [max(len(c), *(len(_fmt(r.get(c))) for r in rows)) for c in columns]
    lines = [heading] if heading else []
    lines.append(" | ".join(c.ljust(w) for c, w in zip(columns, widths)))
    lines.append("-+-".join("-" * w for w in widths))
    lines += [" | ".join(_fmt(r.get(c)).ljust(w) for c, w in zip(columns, widths)) for r in rows]
    text = "\n".join(lines)
    print(text, flush=True)
    return text


def _fmt(x) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.3g}" if abs(x) < 10 else f"{x:.1f}"
    return str(x)


def write_profile(prof, path: str, device: torch.device, rows: int = 60, steps: int = 1) -> None:
    """Top operators / kernels of a torch.profiler run by self device time (CPU time on CPU), as text, then the
    device's busy and idle time per step and its longest gaps (bench.timeline); the timeline itself goes beside
    it (``<path without .txt>.trace.json.gz``, for chrome://tracing or Perfetto). ``steps``: how many steps the
    profile holds."""
    key = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    trace = f"{os.path.splitext(path)[0]}.trace.json.gz"
    prof.export_chrome_trace(trace)
    with gzip.open(trace, "rt") as f:
        summary = timeline_summary(json.load(f), steps)
    write_text(path, prof.key_averages().table(sort_by=key, row_limit=rows, max_name_column_width=90) + "\n" + summary)


def gluon_fwd_options(changes: dict | None):
    """The Gluon forward's configs with ``changes`` applied for a block (launch.fwd_options), or nothing to do."""
    if not changes:
        return contextlib.nullcontext()
    # only here: the launcher needs Triton's Gluon, which a CPU install may lack
    from foxformer.ops.forgetting_attn.hopper.launch import fwd_options

    return fwd_options(changes)
