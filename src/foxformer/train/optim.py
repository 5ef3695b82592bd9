"""AdamW with the paper's decay rules, and a learning-rate schedule counted in tokens."""

from __future__ import annotations

import math

import torch
from torch import nn

from .config import TrainConfig

# Parameters whose names contain one of these never get weight decay: norms, biases, and the forget gate
# and key/value-shift gate projections, whose scale sets a decay rate rather than a capacity to regularize.
# (The SwiGLU "gate_proj" and the output gate "g_proj" are ordinary projections and are decayed.)
NO_DECAY_MARKERS = ("norm", "bias", "fgate", "shift")


def wants_decay(name: str, param: nn.Parameter) -> bool:
    lowered = name.lower()
    return param.ndim >= 2 and not any(m in lowered for m in NO_DECAY_MARKERS)


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if p.requires_grad:
            (decay if wants_decay(name, p) else no_decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def build_optimizer(model: nn.Module, cfg: TrainConfig, device_type: str) -> torch.optim.Optimizer:
    """AdamW; fused kernels on CUDA (one launch per step), foreach elsewhere."""
    kwargs = {"fused": True} if device_type == "cuda" else {"foreach": True}
    return torch.optim.AdamW(param_groups(model, cfg.weight_decay), lr=cfg.lr, betas=(cfg.beta1, cfg.beta2),
                             eps=cfg.eps, **kwargs)


def learning_rate(tokens: int, cfg: TrainConfig) -> float:
    """Learning rate for the step that ends with ``tokens`` tokens seen.

    Linear warmup to ``lr`` over ``cfg.warmup`` tokens, then decay to ``min_lr_ratio * lr`` at the horizon.
    """
    peak, floor = cfg.lr, cfg.lr * cfg.min_lr_ratio
    warmup, horizon = cfg.warmup, cfg.horizon_tokens
    if warmup > 0 and tokens < warmup:
        return peak * tokens / warmup
    if cfg.schedule == "constant" or horizon <= warmup:
        return peak
    progress = min(1.0, (tokens - warmup) / (horizon - warmup))
    if cfg.schedule == "linear":
        return peak + (floor - peak) * progress
    return floor + 0.5 * (peak - floor) * (1.0 + math.cos(math.pi * progress))
