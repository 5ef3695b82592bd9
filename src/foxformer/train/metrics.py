"""Throughput bookkeeping (MFU against a per-device peak), forget-gate statistics of the evaluations, and the
run's metric sinks (JSONL, TensorBoard)."""

from __future__ import annotations

import contextlib
import json
import os
from typing import Callable, Optional

import torch

from ..models.layers import ForgetGate
from ..paths import write_text

# Dense peaks (FLOP/s, no sparsity) by substring of torch.cuda.get_device_name(); the first match wins, so
# "H100 PCIe" precedes "H100", "A100" precedes "A10" and "L40S", "L40" precede "L4". Per compute dtype:
# "bf16" / "fp16" on tensor cores with fp32 accumulation (what autocast runs), "tf32" (fp32 matmuls where
# TF32 is allowed) and "fp32" (fp32 matmuls without TF32, on CUDA cores). A dtype missing from a row is not
# known: MFU is then n/a instead of a ratio against another dtype's peak.
_HOPPER = {"bf16": 989e12, "fp16": 989e12, "tf32": 494.5e12, "fp32": 67e12}
_AMPERE_DC = {"bf16": 312e12, "fp16": 312e12, "tf32": 156e12, "fp32": 19.5e12}
PEAKS = (("H200", _HOPPER), ("H100 PCIe", {"bf16": 756e12, "fp16": 756e12, "tf32": 378e12, "fp32": 51e12}),
         ("H100", _HOPPER), ("H800", _HOPPER), ("GH200", _HOPPER), ("B200", {"bf16": 2250e12, "fp16": 2250e12}),
         ("A100", _AMPERE_DC), ("A800", _AMPERE_DC),
         ("L40S", {"bf16": 362e12, "fp16": 362e12, "tf32": 183e12, "fp32": 91.6e12}),
         ("L40", {"bf16": 181e12, "fp16": 181e12, "tf32": 90.5e12, "fp32": 90.5e12}),
         ("L4", {"bf16": 121e12, "fp16": 121e12, "tf32": 60e12, "fp32": 30.3e12}),
         ("A10", {"bf16": 125e12, "fp16": 125e12, "tf32": 62.5e12, "fp32": 31.2e12}),
         ("4090", {"bf16": 165e12, "fp16": 165e12, "tf32": 82.6e12, "fp32": 82.6e12}),
         ("3090", {"bf16": 71e12, "fp16": 71e12, "tf32": 35.6e12, "fp32": 35.6e12}))


def peak_flops(device_name: str, dtype: str = "bf16") -> float | None:
    """Dense peak FLOP/s of the GPU named ``device_name`` for ``dtype`` (a key of PEAKS' rows); None where
    either is unknown."""
    for key, peaks in PEAKS:
        if key in device_name:
            return peaks.get(dtype)
    return None


def device_peak_flops(device: torch.device, dtype: str = "bf16") -> float | None:
    """Peak FLOP/s of ``device`` for ``dtype``; None where unknown (CPU: MFU is reported as n/a)."""
    if device.type != "cuda":
        return None
    return peak_flops(torch.cuda.get_device_name(device), dtype)


def mfu(tokens_per_s: float | None, flops_per_token: float, peak: float | None, world_size: int = 1) -> float | None:
    """Model FLOPs utilisation of ``world_size`` devices of ``peak`` FLOP/s each; None without a peak or a
    throughput (CPU, an unknown GPU, a run that failed). ``flops_per_token``: the model's training_flops_per_token,
    which leaves out the LM head's product."""
    if not peak or tokens_per_s is None:
        return None
    return tokens_per_s * flops_per_token / (peak * world_size)


class StepSpeed:
    """Tokens per second of the steps this process took, smoothed, for the ETA. The first step is left out: it
    holds the start-up (the first kernels, the allocator, torch.compile), and its ETA said 2:59:51 at 759 tok/s
    where the following steps ran 13K tok/s."""

    def __init__(self) -> None:
        self.tokens_per_s: float | None = None
        self.steps = 0

    def add(self, tokens_per_s: float) -> None:
        self.steps += 1
        if self.steps == 1:
            return
        last = self.tokens_per_s
        self.tokens_per_s = tokens_per_s if last is None else 0.8 * last + 0.2 * tokens_per_s

    def eta(self, tokens_left: float) -> float | None:
        """Seconds for ``tokens_left`` more tokens; None until a step after the first was timed."""
        return tokens_left / self.tokens_per_s if self.tokens_per_s else None


def eta_string(seconds: float | None) -> str:
    if seconds is None or seconds != seconds or seconds == float("inf"):
        return "?"
    seconds = int(seconds)
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


class GateMeans:
    """Sums of log f per layer and head over the tokens that the forwards inside ``forget_gate_means`` read.
    ``rows``: how many leading rows of the next forwards count (None: all); a rank pads its last batch of an
    evaluation with copies of sequences that the others read."""

    def __init__(self, num_gates: int):
        self.sums: list[Optional[torch.Tensor]] = [None] * num_gates
        self.tokens = 0
        self.rows: Optional[int] = None

    def result(self, reduce: Callable[[torch.Tensor], torch.Tensor] | None = None) -> Optional[list]:
        """Mean log f, [layers][heads] as lists (None for a model without forget gates); ``reduce`` sums over
        ranks (every rank calls it, also one whose rows were all copies: ranks may read unequal token counts)."""
        if not self.sums or self.sums[0] is None:
            return None
        sums = torch.stack(self.sums)
        totals = torch.cat([sums.flatten(), sums.new_tensor([float(self.tokens)])])
        if reduce is not None:
            totals = reduce(totals)
        if not totals[-1]:
            return None
        return (totals[:-1] / totals[-1]).reshape(sums.shape).cpu().tolist()


@contextlib.contextmanager
def forget_gate_means(model: torch.nn.Module):
    """Collects the forget gates' log f of every forward inside the block (training logs them with each
    evaluation, so that the gates' course over training can be compared across seeds)."""
    gates = [m for m in model.modules() if isinstance(m, ForgetGate)]
    acc = GateMeans(len(gates))

    def hook(i: int):
        def fn(module, inputs, log_f):
            log_f = log_f.detach()[:acc.rows]
            total = log_f.double().sum(dim=(0, 1))
            acc.sums[i] = total if acc.sums[i] is None else acc.sums[i] + total
            if i == 0:
                acc.tokens += log_f.shape[0] * log_f.shape[1]
        return fn

    handles = [g.register_forward_hook(hook(i)) for i, g in enumerate(gates)]
    try:
        yield acc
    finally:
        for h in handles:
            h.remove()


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
        write_text(self.path, "".join(k + "\n" for k in keep))

    def write(self, record: dict) -> None:
        try:
            self._file.write(json.dumps(record) + "\n")
            self._file.flush()
        except OSError as e:  # a full disk said "no space left on device" and not where
            raise OSError(e.errno, e.strerror, self.path) from None
        if self._tb is not None:
            kind = record.get("kind", "train")
            for key, value in record.items():
                if isinstance(value, (int, float)) and key not in ("step", "kind", "data_crc"):
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
