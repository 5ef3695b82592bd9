"""Throughput bookkeeping (MFU against a per-device peak) and the run's metric sinks (JSONL, TensorBoard)."""

from __future__ import annotations

import json
import os

import torch

# Dense bf16 tensor-core peaks (FLOP/s, no sparsity) by substring of torch.cuda.get_device_name().
PEAK_BF16 = (("H200", 989e12), ("H100", 989e12), ("H800", 989e12), ("GH200", 989e12), ("B200", 2250e12),
             ("A100", 312e12), ("A800", 312e12), ("L40S", 362e12), ("L40", 181e12), ("L4", 121e12),
             ("A10", 125e12), ("4090", 165e12), ("3090", 71e12))


def device_peak_flops(device: torch.device) -> float | None:
    """Peak bf16 FLOP/s of ``device``; None where unknown (CPU: MFU is reported as n/a)."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    for key, peak in PEAK_BF16:
        if key in name:
            return peak
    return None


def mfu(tokens_per_s: float | None, flops_per_token: float, peak: float | None, world_size: int = 1) -> float | None:
    """Model FLOPs utilisation of ``world_size`` devices of ``peak`` FLOP/s each; None without a peak or a
    throughput (CPU, an unknown GPU, a run that failed)."""
    if not peak or tokens_per_s is None:
        return None
    return tokens_per_s * flops_per_token / (peak * world_size)


def eta_string(seconds: float | None) -> str:
    if seconds is None or seconds != seconds or seconds == float("inf"):
        return "?"
    seconds = int(seconds)
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


class MetricsSink:
    """Appends records to ``metrics.jsonl`` (and TensorBoard scalars when available). Rank 0 only."""

    def __init__(self, run_dir: str, resume_step: int, tensorboard: bool):
        self.path = os.path.join(run_dir, "metrics.jsonl")
        self._truncate_after(resume_step)
        self._file = open(self.path, "a")
        self._tb = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self._tb = SummaryWriter(os.path.join(run_dir, "tensorboard"), purge_step=resume_step or None)
            except ImportError:  # tensorboard is optional
                self._tb = None

    def _truncate_after(self, step: int) -> None:
        """Drop records of steps that a resumed run will redo (they came after the checkpoint)."""
        if not os.path.exists(self.path):
            return
        with open(self.path) as f:
            keep = []
            for line in f:
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    continue  # a line cut by a crash
                if rec.get("step", 0) <= step:
                    keep.append(json.dumps(rec))
        tmp = f"{self.path}.tmp-{os.getpid()}"
        with open(tmp, "w") as f:
            f.write("".join(k + "\n" for k in keep))
        os.replace(tmp, self.path)

    def write(self, record: dict) -> None:
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        if self._tb is not None:
            kind = record.get("kind", "train")
            for key, value in record.items():
                if isinstance(value, (int, float)) and key not in ("step", "kind"):
                    self._tb.add_scalar(f"{kind}/{key}", value, record["step"])

    def close(self) -> None:
        self._file.close()
        if self._tb is not None:
            self._tb.close()


def read_metrics(run_dir: str) -> list[dict]:
    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]
