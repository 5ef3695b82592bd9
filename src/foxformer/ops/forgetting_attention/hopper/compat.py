"""The Gluon names the Hopper kernels use, across Triton releases.

Triton 3.6 (the H200 machine's) and 3.9 (what CI installs) spell some Gluon builtins differently:
TMA copies became ``tma.async_load`` / ``tma.async_store`` (the old names raise in 3.9), and the
partition-wide ``gl.thread_barrier`` became ``gl.barrier``, and 3.9 names the TMA reduction into global
memory ``tma.async_atomic_add`` where 3.6 has only the builder call (``tma_atomic_add`` wraps it). Everything else the kernels use is spelt
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
    tma_load = tma_store = tma_atomic_add = thread_barrier = None
else:
    AVAILABLE = True
    MISSING_REASON = ""
    tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
    tma_store = getattr(tma, "async_store", None) or tma.async_copy_shared_to_global
    thread_barrier = getattr(gl, "thread_barrier", None) or gl.barrier
    tma_atomic_add = getattr(tma, "async_atomic_add", None)
    if tma_atomic_add is None:
        from triton._C.libtriton import ir
        from triton.experimental.gluon.language._core import builtin

        @builtin
        def tma_atomic_add(tensor_desc, coord, src, _semantic=None):
            """Add the shared-memory tile src into global memory at coord (TMA reduction, fp32 adds in L2)."""
            coord = _semantic._convert_to_ir_values(coord, require_i64=False)
            _semantic.builder.create_async_tma_reduce(ir.DESCRIPTOR_REDUCE_KIND.ADD, tensor_desc.handle, coord,
                                                      src.handle)

__all__ = [
    "AVAILABLE", "MISSING_REASON", "TensorDescriptor", "fence_async_shared", "gl", "gluon", "mbarrier",
    "thread_barrier", "tma",
    "tma_atomic_add", "tma_load", "tma_store", "warpgroup_mma", "warpgroup_mma_wait",
]
