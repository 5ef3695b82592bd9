"""The Gluon names the Hopper kernels use, across Triton releases.

Triton 3.6 (the H200 machine's) and 3.9 (what CI installs) spell some Gluon builtins differently:
TMA copies became ``tma.async_load`` / ``tma.async_store`` (the old names raise in 3.9), and the
partition-wide ``gl.thread_barrier`` became ``gl.barrier``. Everything else the kernels use is spelt
the same in both. ``AVAILABLE`` is False where Triton has no Gluon Hopper API at all (older releases,
or a Triton without the NVIDIA backend); the dispatcher then never picks the Gluon backend.
"""
from __future__ import annotations

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                                  warpgroup_mma_wait)
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
except ImportError as exc:  # pragma: no cover - depends on the installed Triton
    AVAILABLE = False
    MISSING_REASON = f"Triton has no Gluon Hopper API ({exc})"
    gluon = gl = mbarrier = tma = TensorDescriptor = fence_async_shared = None
    warpgroup_mma = warpgroup_mma_wait = None
    tma_load = tma_store = thread_barrier = None
else:
    AVAILABLE = True
    MISSING_REASON = ""
    tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
    tma_store = getattr(tma, "async_store", None) or tma.async_copy_shared_to_global
    thread_barrier = getattr(gl, "thread_barrier", None) or gl.barrier

__all__ = [
    "AVAILABLE", "MISSING_REASON", "TensorDescriptor", "fence_async_shared", "gl", "gluon", "mbarrier",
    "thread_barrier", "tma", "tma_load", "tma_store", "warpgroup_mma", "warpgroup_mma_wait",
]
