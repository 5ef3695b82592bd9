"""The error that ends a run whose loss, gradients or validation stopped being finite, with what to change."""

from __future__ import annotations

from . import checkpoint as ckpt
from .config import TrainConfig


class TrainingDiverged(FloatingPointError, ValueError):
    """The loss or the gradients stopped being finite. A ValueError too: what fixes it is a setting (lr, warm-up,
    clipping), and the CLI gives those as one error line, not a traceback."""


def diverged(cfg: TrainConfig, step: int, what: str) -> TrainingDiverged:
    """The error for step ``step``, at which ``what`` happened; raised before that step's checkpoint, so the run's
    checkpoints all hold finite weights (a non-finite gradient already made the weights NaN in memory)."""
    clip = "" if cfg.grad_clip > 0 else ", and clip the gradients (--set grad_clip=1; 0 turned clipping off)"
    if ckpt.list_checkpoints(cfg.out_dir):
        saved = f"the checkpoints in {ckpt.checkpoint_root(cfg.out_dir)} are from before it"
        start = "another --out; --init-from one of those checkpoints keeps its weights"
    else:
        saved, start = "the run has no checkpoint", "another --out"
    # a resume keeps the run's lr and schedule (resume refuses to change them) and would diverge at this step again
    return TrainingDiverged(
        f"training diverged at step {step}: {what}; step {step} was not checkpointed, and {saved}. Start a new run "
        f"({start}) with a lower --lr (now {cfg.lr:g}) or a longer --warmup-tokens (now {cfg.warmup:,}){clip}")
