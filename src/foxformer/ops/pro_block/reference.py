"""Exact PyTorch references of the Pro block's fused ops: the CPU path and the tests' oracle (exact in float64).

Both compute in fp32 (fp64 for fp64 inputs) and round once to the input's dtype, as the kernels do; the model's
unfused modules round after each step (KVShift's lerp, then RMSNorm) in the input's dtype.
"""
from __future__ import annotations

from typing import Optional

import torch


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _rms_normalize(u: torch.Tensor, eps: float) -> torch.Tensor:
    return u * torch.rsqrt(u.square().mean(-1, keepdim=True) + eps)


def shift_norm_reference(x: torch.Tensor, logits: Optional[torch.Tensor] = None, prev: Optional[torch.Tensor] = None,
                         starts: Optional[torch.Tensor] = None, weight: Optional[torch.Tensor] = None,
                         eps: float = 1e-6) -> torch.Tensor:
    """foxformer.ops.shift_norm in plain PyTorch (no input checks; same arguments)."""
    cd = compute_dtype(x.dtype)
    y = x.to(cd)
    if logits is not None:
        first = y.new_zeros(y[:, :1].shape) if prev is None else prev[:, None].to(cd)
        shifted = torch.cat((first, y[:, :-1]), dim=1)
        if starts is not None:
            shifted = shifted.masked_fill(starts[:, :, None, None], 0.0)
        y = torch.lerp(y, shifted, torch.sigmoid(logits.to(cd))[..., None])
    if weight is not None:
        y = _rms_normalize(y, eps) * weight.to(cd)
    return y.to(x.dtype)


def gate_norm_reference(o: torch.Tensor, g: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """foxformer.ops.gate_norm in plain PyTorch (no input checks; same arguments)."""
    cd = compute_dtype(o.dtype)
    y = _rms_normalize(o.to(cd), eps) * weight.to(cd) * torch.sigmoid(g.to(cd)).reshape(o.shape)
    return y.to(o.dtype)
