"""One decoded token into a KV cache, in one kernel: its k and v rows, and its c extended from the last.

A static (graph-captured) decode step writes, per layer, the new token's k and v at a device-held position,
extends c by the token's gate (``c = max(log f, floor) + c_last``, float64) into the c storage and ``c_last``,
and keeps the token's raw k / v candidates for the next token's shift (Pro blocks). As separate torch ops
that is up to nine kernels a layer (a cast, a clamp, an add, three index copies or puts, three copies),
each a few microseconds of launch and gap in a batch-1 step whose useful work is a few microseconds: the
Triton kernel does it in one, for dense buffers and for page pools (the evicting cache). The torch path
(paging.append_token_torch) is the reference and what runs on the CPU; both give the same bits.
"""
from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from ..gpu import on_gpu_of_inputs
from .checks import CACHE_BACKENDS, check_backend, check_gate_values
from .cumsum import LOG_FGATE_FLOOR
from .paging import append_token_torch
from .tiles import LAUNCH_OPTIONS


@triton.jit
def _copy_row(DST, SRC, b, h, stride_db, stride_dh, stride_sb, stride_sh, d, d_ok, ON: tl.constexpr):
    if ON:
        x = tl.load(SRC + b * stride_sb + h * stride_sh + d, mask=d_ok)
        tl.store(DST + b * stride_db + h * stride_dh + d, x, mask=d_ok)


@triton.jit
def _append_kernel(K, V, LOGF, AT, KBUF, VBUF, CBUF, CLAST, KLAST, KRAW, VLAST, VRAW, TABLE,
                   stride_kb, stride_kh, stride_vb, stride_vh, stride_fb, stride_fh,
                   stride_kbb, stride_kbt, stride_kbh, stride_vbb, stride_vbt, stride_vbh,
                   stride_cbb, stride_cbh, stride_cbt, stride_clb, stride_clh,
                   stride_klb, stride_klh, stride_krb, stride_krh, stride_vlb, stride_vlh, stride_vrb, stride_vrh,
                   stride_tb, stride_th, Hkv, PAGE, floor,
                   D: tl.constexpr, BLOCK_D: tl.constexpr, G: tl.constexpr, BLOCK_G: tl.constexpr,
                   K_SHIFT: tl.constexpr, V_SHIFT: tl.constexpr, PAGED: tl.constexpr):
    """One (batch row, kv head): its k, v rows, the c of its G query heads and its token-shift rows.

    Dense: k, v go to row ``at`` of [B, capacity, Hkv, D], c to [B, Hq, capacity]. PAGED: to row ``at % PAGE``
    of page ``TABLE[b, h, at // PAGE]`` of pools [P, PAGE, D] and c [P, PAGE, G] (the *_bh strides are 0)."""
    pid = tl.program_id(0)
    b = (pid // Hkv).to(tl.int64)
    h = pid % Hkv
    at = tl.load(AT)
    g = tl.arange(0, BLOCK_G)
    hq = h * G + g
    g_ok = g < G
    if PAGED:
        blk = tl.load(TABLE + b * stride_tb + h * stride_th + at // PAGE).to(tl.int64)
        row = at % PAGE
        c_head = g
    else:
        blk = b
        row = at
        c_head = hq
    d = tl.arange(0, BLOCK_D)
    d_ok = d < D
    k = tl.load(K + b * stride_kb + h * stride_kh + d, mask=d_ok)
    tl.store(KBUF + blk * stride_kbb + row * stride_kbt + h * stride_kbh + d, k, mask=d_ok)
    v = tl.load(V + b * stride_vb + h * stride_vh + d, mask=d_ok)
    tl.store(VBUF + blk * stride_vbb + row * stride_vbt + h * stride_vbh + d, v, mask=d_ok)
    lf = tl.load(LOGF + b * stride_fb + hq * stride_fh, mask=g_ok).to(tl.float64)
    # clamp's rule: NaN stays NaN (a comparison with NaN is false)
    lf = tl.where(lf < floor, floor, lf)
    c = lf + tl.load(CLAST + b * stride_clb + hq * stride_clh, mask=g_ok)
    tl.store(CBUF + blk * stride_cbb + c_head * stride_cbh + row * stride_cbt, c, mask=g_ok)
    tl.store(CLAST + b * stride_clb + hq * stride_clh, c, mask=g_ok)
    _copy_row(KLAST, KRAW, b, h, stride_klb, stride_klh, stride_krb, stride_krh, d, d_ok, K_SHIFT)
    _copy_row(VLAST, VRAW, b, h, stride_vlb, stride_vlh, stride_vrb, stride_vrh, d, d_ok, V_SHIFT)


def _check_position(at: int, pool_pages: Optional[int], rows: int, page_table: Optional[torch.Tensor]) -> None:
    """``at`` a row of dense storage (rows: its capacity), or of a mapped page of a pool (rows: the page size)."""
    if page_table is None:
        if not 0 <= at < rows:
            raise ValueError(f"at = {at} is outside the storage's {rows} positions")
        return
    if not 0 <= at < page_table.shape[2] * rows:
        raise ValueError(f"at = {at} is past the page table's {page_table.shape[2]} pages of {rows} positions")
    pages = page_table[:, :, at // rows]
    if bool(((pages < 0) | (pages >= pool_pages)).any()):
        raise ValueError(f"the page of position {at} is not mapped in every (batch, kv head) of the page table "
                         f"(entries {pages.flatten().tolist()[:8]} ..., pool pages 0 to {pool_pages - 1})")


@on_gpu_of_inputs
def append_token_(k_buf: torch.Tensor, v_buf: torch.Tensor, c_buf: torch.Tensor, c_last: torch.Tensor,
                  at: torch.Tensor, k: torch.Tensor, v: torch.Tensor, log_f: torch.Tensor,
                  k_shift: Optional[tuple[torch.Tensor, torch.Tensor]] = None,
                  v_shift: Optional[tuple[torch.Tensor, torch.Tensor]] = None, *,
                  page_table: Optional[torch.Tensor] = None, backend: str = "auto") -> None:
    """Write one token into cache storage, in place.

    Args:
        k_buf, v_buf: dense [B, capacity, Hkv, D], or with ``page_table`` page pools [P, PAGE, D].
        c_buf: float64, dense [B, Hq, capacity], or with ``page_table`` a pool [P, PAGE, G] (G = Hq // Hkv).
        c_last: float64 [B, Hq], c of the newest cached token, replaced by the new token's.
        at: int64 [1] on the storage's device, the position written (read on the device: no host sync; on the
            CPU it must be a position of the storage, and log_f without NaN or positive values: ValueError).
        k, v: [B, 1, Hkv, D] the token's rows; log_f: [B, 1, Hq] its log forget gate (clamped at
            LOG_FGATE_FLOOR as gate_cumsum does).
        k_shift, v_shift: optional (state, raw), both [B, Hkv, D]: raw (the token's k / v candidates before
            the token shift) copied into state (the cache's shift state for the next token).
        page_table: int [B, Hkv, NP] or None (dense): position ``at`` of (b, h) is row ``at % PAGE`` of page
            ``page_table[b, h, at // PAGE]``, which must be mapped already.
        backend: "auto" (triton for CUDA tensors, torch otherwise) | "triton" | "torch".
    """
    B, _, Hkv, D = k.shape
    Hq = c_last.shape[1]
    if page_table is None:
        want_k, want_c = (B, k_buf.shape[1], Hkv, D), (B, Hq, k_buf.shape[1])
    else:
        if page_table.dim() != 3 or tuple(page_table.shape[:2]) != (B, Hkv):
            raise ValueError(f"page_table must be [B, Hkv, pages] = [{B}, {Hkv}, pages], got {tuple(page_table.shape)}")
        want_k, want_c = (k_buf.shape[0], k_buf.shape[1], D), (k_buf.shape[0], k_buf.shape[1], Hq // max(Hkv, 1))
    if k.dim() != 4 or k.shape[1] != 1 or v.shape != k.shape or k_buf.shape != want_k or v_buf.shape != want_k:
        raise ValueError(f"k and v must be [B, 1, Hkv, D] rows for storage of shape {want_k}, got {tuple(k.shape)}, "
                         f"{tuple(v.shape)} and storage {tuple(k_buf.shape)}, {tuple(v_buf.shape)}")
    if log_f.shape != (B, 1, Hq) or c_last.shape != (B, Hq) or Hq % Hkv or c_buf.shape != want_c:
        raise ValueError(f"log_f must be [B, 1, Hq] = {(B, 1, Hq)}, c_last [B, Hq] with Hq a multiple of Hkv = {Hkv} "
                         f"and c_buf {want_c}, got {tuple(log_f.shape)}, {tuple(c_last.shape)}, {tuple(c_buf.shape)}")
    if c_buf.dtype != torch.float64 or c_last.dtype != torch.float64:
        raise TypeError(f"c_buf and c_last must be float64, got {c_buf.dtype}, {c_last.dtype}")
    for name, pair in (("k_shift", k_shift), ("v_shift", v_shift)):
        if pair is not None and not (pair[0].shape == pair[1].shape == (B, Hkv, D)):
            raise ValueError(f"{name} must be (state, raw), both [B, Hkv, D] = {(B, Hkv, D)}, got "
                             f"{tuple(pair[0].shape)}, {tuple(pair[1].shape)}")
    if not isinstance(at, torch.Tensor):
        raise TypeError(f"at must be an int64 tensor of one element, got {type(at).__name__}")
    if at.dtype != torch.int64 or at.numel() != 1 or at.device != k_buf.device:
        raise TypeError(f"at must be an int64 tensor of one element on the storage's device ({k_buf.device}), got "
                        f"{at.dtype} {tuple(at.shape)} on {at.device}")
    if k_buf.device.type == "cpu":  # values: free here, a device sync on a GPU (there the caller's contract)
        _check_position(int(at), k_buf.shape[0] if page_table is not None else None, k_buf.shape[1], page_table)
        check_gate_values(log_f, "log_f")
    check_backend(backend, CACHE_BACKENDS)
    if backend == "auto":
        backend = "triton" if k_buf.is_cuda else "torch"
    if backend == "torch":
        return append_token_torch(k_buf, v_buf, c_buf, c_last, at, k, v, log_f, k_shift, v_shift, page_table)
    # The kernel reads rows along the last dim (a projection's view has it contiguous already).
    k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (k, v))
    shifts = []
    for pair in (k_shift, v_shift):
        # absent: k's rows stand in (never read); present: rows read and written along a contiguous last dim
        state, raw = pair if pair is not None else (k[:, 0], k[:, 0])
        if state.stride(-1) != 1:
            raise ValueError(f"a shift state needs a contiguous last dim, got strides {tuple(state.stride())}")
        shifts.append((state, raw if raw.stride(-1) == 1 else raw.contiguous()))
    (kl, kr), (vl, vr) = shifts
    paged = page_table is not None
    if paged:
        # read as TABLE + at // PAGE: a view with a last stride of 2 wrote the token to another entry's page
        table, page = page_table if page_table.stride(-1) == 1 else page_table.contiguous(), k_buf.shape[1]
        kb_strides = (k_buf.stride(0), k_buf.stride(1), 0)
        vb_strides = (v_buf.stride(0), v_buf.stride(1), 0)
        # c pool [P, PAGE, G]: as (block, head, row) strides
        cb_strides = (c_buf.stride(0), c_buf.stride(2), c_buf.stride(1))
    else:
        table, page = c_last, 1  # a placeholder, never read
        kb_strides = (k_buf.stride(0), k_buf.stride(1), k_buf.stride(2))
        vb_strides = (v_buf.stride(0), v_buf.stride(1), v_buf.stride(2))
        cb_strides = (c_buf.stride(0), c_buf.stride(1), c_buf.stride(2))
    G = Hq // Hkv
    _append_kernel[(B * Hkv,)](
        k, v, log_f, at, k_buf, v_buf, c_buf, c_last, kl, kr, vl, vr, table,
        k.stride(0), k.stride(2), v.stride(0), v.stride(2), log_f.stride(0), log_f.stride(2),
        *kb_strides, *vb_strides, *cb_strides, c_last.stride(0), c_last.stride(1),
        kl.stride(0), kl.stride(1), kr.stride(0), kr.stride(1), vl.stride(0), vl.stride(1), vr.stride(0), vr.stride(1),
        table.stride(0), table.stride(1), Hkv, page, LOG_FGATE_FLOOR,
        D=D, BLOCK_D=triton.next_power_of_2(D), G=G, BLOCK_G=max(2, triton.next_power_of_2(G)),
        K_SHIFT=k_shift is not None, V_SHIFT=v_shift is not None, PAGED=paged, num_warps=1, **LAUNCH_OPTIONS)
