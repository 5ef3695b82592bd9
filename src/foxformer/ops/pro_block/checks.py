"""Input checks of shift_norm and gate_norm: a one-line ValueError / TypeError naming the argument, and the gate
logits' values under the attention ops' policy (forgetting_attn.checks.values_checked)."""
from __future__ import annotations

import math

import torch

from ..forgetting_attn.checks import (_FLOAT_DTYPES, NonFiniteValueError, _compiling, _first_bad, _require_tensor,
                                     check_backend, check_triton_device, unwrapped, values_checked)

BACKENDS = ("auto", "triton", "torch")
_KERNEL_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _float_tensor(x, name: str, shape: tuple) -> None:
    _require_tensor(x, name)
    if tuple(x.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(x.shape)}")
    if x.dtype not in _FLOAT_DTYPES:
        raise TypeError(f"{name} must be a floating tensor, got {x.dtype}")


def _heads_tensor(x, name: str) -> None:
    _require_tensor(x, name)
    if x.dim() != 4 or 0 in x.shape:
        raise ValueError(f"{name} must be a non-empty [batch, seq, heads, dim] tensor, got shape {tuple(x.shape)}")
    if x.dtype not in _FLOAT_DTYPES:
        raise TypeError(f"{name} must be a floating tensor, got {x.dtype}")


def _check_weight(weight, H: int, D: int) -> None:
    _require_tensor(weight, "weight")
    if tuple(weight.shape) not in ((D,), (H, D)):
        raise ValueError(f"weight must be [dim] = {(D,)} or [heads, dim] = {(H, D)}, got {tuple(weight.shape)}")
    _float_tensor(weight, "weight", weight.shape)


def _check_eps(eps) -> None:
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0 < eps < math.inf:
        raise ValueError(f"eps must be a positive finite number, got {eps!r}")


def _same_device(x: torch.Tensor, **others) -> None:
    for name, t in others.items():
        if t is not None and t.device != x.device:
            raise ValueError(f"{name} is on {t.device}, the input on {x.device}: all tensors must be on one device")


def check_gate_logits(logits: torch.Tensor, op: str, name: str) -> None:
    """Refuse NaN in gate logits [B, T, H] (or [B, T, H, D], counted per head), read as the attention ops read their
    gates: on CPU always (compiled: an assert in the graph), on CUDA only with FOXFORMER_CHECK_VALUES=1 (a sync).
    NaN alone: a logit of -inf or +inf is a gate shut (sigmoid 0) or open (1), whose outputs and gradients are finite
    in both ops (the kernels' 1 / (1 + exp(-z)) too); a NaN logit can only give a NaN output."""
    if _compiling():
        if logits.device.type == "cpu":
            torch._assert_async(~torch.isnan(logits).any(), f"{op}: {name} must not hold NaN")
        return
    if not values_checked(logits):
        return
    nan = torch.isnan(logits)
    per_head = nan.dim() == 4
    nan = unwrapped(nan.any(-1) if per_head else nan)
    if nan.any():
        raise NonFiniteValueError(f"{op}: {name} contains NaN", f"({'per head: ' if per_head else ''}{_first_bad(nan)})"
                                  f": NaN gate logits come from NaN in what made them (their projection's input or "
                                  f"weights); find the first with torch.isnan")


def check_shift_norm(x, logits, prev, starts, weight, eps) -> None:
    _heads_tensor(x, "x")
    B, T, H, D = x.shape
    if logits is None and weight is None:
        raise ValueError("shift_norm needs logits (the token shift), weight (the RMSNorm) or both")
    if logits is None and (prev is not None or starts is not None):
        raise ValueError("prev and starts belong to the token shift: pass logits with them")
    if logits is not None:
        _float_tensor(logits, "logits", (B, T, H))
    if prev is not None:
        _float_tensor(prev, "prev", (B, H, D))
    if starts is not None:
        _require_tensor(starts, "starts")
        if tuple(starts.shape) != (B, T) or starts.dtype != torch.bool:
            raise ValueError(f"starts must be a bool tensor [batch, seq] = {(B, T)}, got {starts.dtype} "
                             f"{tuple(starts.shape)}")
    if weight is not None:
        _check_weight(weight, H, D)
    _check_eps(eps)
    _same_device(x, logits=logits, prev=prev, starts=starts, weight=weight)
    if logits is not None:
        check_gate_logits(logits, "shift_norm", "logits")


def check_gate_norm(o, g, weight, eps) -> None:
    _heads_tensor(o, "o")
    B, T, H, D = o.shape
    _require_tensor(g, "g")
    if tuple(g.shape) not in ((B, T, H * D), (B, T, H, D)):
        raise ValueError(f"g must be [batch, seq, heads * dim] = {(B, T, H * D)} or [batch, seq, heads, dim] = "
                         f"{(B, T, H, D)}, got {tuple(g.shape)}")
    _float_tensor(g, "g", g.shape)
    _check_weight(weight, H, D)
    _check_eps(eps)
    _same_device(o, g=g, weight=weight)
    check_gate_logits(g if g.dim() == 4 else g.unflatten(-1, (H, D)), "gate_norm", "g")


def resolve_backend(backend: str, x: torch.Tensor) -> str:
    """"auto": the Triton kernels for CUDA tensors of fp16 / bf16 / fp32, the torch reference otherwise; "triton"
    also takes CPU tensors under TRITON_INTERPRET=1, and fp64."""
    check_backend(backend, BACKENDS)
    if backend == "auto":
        return "triton" if x.is_cuda and x.dtype in _KERNEL_DTYPES else "torch"
    if backend == "triton":
        check_triton_device(x)
    return backend
