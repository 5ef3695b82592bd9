"""An evicting cache's windowed scan for dead keys, in one kernel per layer.

Every EVICT_EVERY decode steps each layer of an evicting cache looks at the ``window`` oldest live keys of each
(batch row, kv head) and advances its start past those no later query can weigh above the bound:
key j is dead for query head h once ``c_j >= c_now - delta`` (models/kvcache/policy.py), and a kv entry goes
when every query head of its group allows it. As torch ops that is about a dozen small kernels a layer (the
page gather of c among them), a few microseconds each in a batch-1 step; the Triton kernel does it in one.
The torch path (paging.evict_scan_torch) is the reference and what runs on the CPU; both give the same starts
(but for a key whose c lies within float64 rounding of the threshold).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..gpu import on_gpu_of_inputs
from .checks import CACHE_BACKENDS, check_backend
from .paging import evict_scan_torch
from .tiles import LAUNCH_OPTIONS


@triton.jit(do_not_specialize=["last_int"])
def _evict_scan_kernel(START, CPAGES, TABLE, CLAST, LAST, last_int, delta_hi, delta_lo, Hkv, window,
                       stride_tb, stride_th, stride_cp, stride_cr, stride_cg, stride_clb, stride_clh,
                       PAGE: tl.constexpr, G: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_W: tl.constexpr,
                       LAST_ON_DEVICE: tl.constexpr):
    """One (batch row, kv head): count each query head's dead keys in the window, keep the smallest count."""
    pid = tl.program_id(0)
    b = (pid // Hkv).to(tl.int64)
    h = pid % Hkv
    first = tl.load(START + pid).to(tl.int64)                   # start is [B, Hkv], contiguous
    if LAST_ON_DEVICE:
        last = tl.load(LAST)
    else:
        last = last_int
    w = tl.arange(0, BLOCK_W)
    w_ok = w < window
    pos = tl.minimum(first + w, last)
    page = tl.load(TABLE + b * stride_tb + h * stride_th + pos // PAGE, mask=w_ok, other=0).to(tl.int64)
    g = tl.arange(0, BLOCK_G)
    g_ok = g < G
    ok = g_ok[:, None] & w_ok[None, :]
    c = tl.load(CPAGES + page[None, :] * stride_cp + (pos % PAGE)[None, :] * stride_cr + g[:, None] * stride_cg,
                mask=ok, other=0.0)
    # delta as two float32 halves (Triton passes Python floats as float32): c_last - delta to float64 rounding
    c_now = tl.load(CLAST + b * stride_clb + (h * G + g) * stride_clh, mask=g_ok, other=0.0)
    threshold = (c_now - delta_hi) - delta_lo  # float32 scalars widen exactly
    dead = tl.sum((ok & (c >= threshold[:, None])).to(tl.int64), 1)
    # a kv entry goes only when every query head of its group allows it
    least = tl.min(tl.where(g_ok, dead, window), 0)
    tl.store(START + pid, tl.maximum(first, first + least))


@on_gpu_of_inputs
def evict_scan_(start: torch.Tensor, c_pages: torch.Tensor, table: torch.Tensor, c_last: torch.Tensor,
                delta: float, window: int, last: int | torch.Tensor, backend: str = "auto") -> None:
    """Advance ``start`` in place past the dead keys among the ``window`` oldest live keys of each (b, h).

    Args:
        start: int64 [B, Hkv] (contiguous), the first live key of each (batch row, kv head).
        c_pages: float64 page pool [P, PAGE, G] of c; table: int [B, Hkv, pages], the page table.
        c_last: float64 [B, Hq], c of the newest position; delta: the bound (<= 0, policy.py).
        window: keys examined per (b, h); last: the newest position (an int, or an int64 [1] device tensor in a
            static step: read on the device). Positions past it are read as it (never dead).
        backend: "auto" (triton for CUDA tensors, torch otherwise) | "triton" | "torch".
    """
    B, Hkv = start.shape
    G = c_pages.shape[2]
    if start.dtype != torch.int64 or not start.is_contiguous() or tuple(table.shape[:2]) != (B, Hkv):
        raise ValueError(f"start must be a contiguous int64 [B, Hkv] with the table's [B, Hkv] = "
                         f"{tuple(table.shape[:2])}, got {start.dtype} {tuple(start.shape)}")
    if c_last.shape != (B, Hkv * G) or c_last.dtype != torch.float64 or c_pages.dtype != torch.float64:
        raise ValueError(f"c_last must be float64 [B, Hq] = {(B, Hkv * G)} and c_pages float64, got "
                         f"{c_last.dtype} {tuple(c_last.shape)}, {c_pages.dtype}")
    check_backend(backend, CACHE_BACKENDS)
    if backend == "auto":
        backend = "triton" if start.is_cuda else "torch"
    if backend == "torch":
        return evict_scan_torch(start, c_pages, table, c_last, delta, window, last)
    on_device = isinstance(last, torch.Tensor)
    table = table if table.stride(-1) == 1 else table.contiguous()  # read as TABLE + pos // PAGE, as in decode.py
    delta_hi = float(torch.tensor(delta, dtype=torch.float32))
    _evict_scan_kernel[(B * Hkv,)](
        start, c_pages, table, c_last, last if on_device else start, 0 if on_device else int(last), delta_hi,
        float(delta) - delta_hi,
        Hkv, window, table.stride(0), table.stride(1), c_pages.stride(0), c_pages.stride(1), c_pages.stride(2),
        c_last.stride(0), c_last.stride(1),
        PAGE=c_pages.shape[1], G=G, BLOCK_G=max(2, triton.next_power_of_2(G)),
        BLOCK_W=max(2, triton.next_power_of_2(window)), LAST_ON_DEVICE=on_device, num_warps=1, **LAUNCH_OPTIONS)
