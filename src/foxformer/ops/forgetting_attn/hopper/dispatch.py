"""Which calls the Gluon Hopper kernels cover; everything else runs on the Triton kernels.

Two checks, at two times:
- ``static_reason`` when the backend is resolved (the Python call, also while torch.compile traces):
  Triton's Gluon API, an sm_90 GPU, fp16 / bf16 and head dim 64 or 128;
- ``layout_reason`` inside the op, on real tensors: TMA reads rows of ``[B, T, H * D]`` views, so each
  tensor needs packed heads, 16-byte aligned strides and base address. A tensor that fails it (a slice
  at an odd offset, say) runs on the Triton kernels, which read any strides.
Each returns None when covered, or the reason in words.
"""
from __future__ import annotations

import functools

import torch

from .compat import AVAILABLE, MISSING_REASON

HEAD_DIMS = (64, 128)
DTYPES = (torch.float16, torch.bfloat16)
CAPABILITY = (9, 0)
_TMA_ALIGN = 16  # bytes: TMA's rule for the base address and every stride but the last


@functools.lru_cache(maxsize=None)
def _capability(index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


def device_capability(device: torch.device) -> tuple[int, int] | None:
    """(major, minor) of a CUDA device, None for any other device."""
    if device.type != "cuda":
        return None
    return _capability(device.index if device.index is not None else torch.cuda.current_device())


def static_reason(dtype: torch.dtype, head_dim: int, capability: tuple[int, int] | None) -> str | None:
    if not AVAILABLE:
        return MISSING_REASON
    if capability != CAPABILITY:
        where = "a CPU tensor" if capability is None else f"an sm_{capability[0]}{capability[1]} GPU"
        return f"the Gluon kernels need an sm_90 GPU (H100 / H200), got {where}"
    if dtype not in DTYPES:
        return f"the Gluon kernels take float16 or bfloat16, got {dtype}"
    if head_dim not in HEAD_DIMS:
        return f"the Gluon kernels take head dim {' or '.join(map(str, HEAD_DIMS))}, got {head_dim}"
    return None


def layout_reason(**tensors: torch.Tensor) -> str | None:
    """None if every ``[B, T, H, D]`` tensor can be read and written by TMA as ``[B, T, H * D]`` rows."""
    for name, x in tensors.items():
        size = x.element_size()
        B, T, H, D = x.shape
        if x.stride(3) != 1 or (H > 1 and x.stride(2) != D):
            return f"{name} needs packed heads (strides [.., .., {D}, 1]), got {tuple(x.stride())}"
        if x.data_ptr() % _TMA_ALIGN or any((s * size) % _TMA_ALIGN for s in x.stride()[:2]):
            return f"{name} needs a 16-byte aligned base address and strides, got strides {tuple(x.stride())}"
    return None
