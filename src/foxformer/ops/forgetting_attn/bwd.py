"""Fused Triton backward kernels of Forgetting Attention (deterministic, no atomics).

With p_ij the forward probabilities, dP_ij = do_i . v_j and delta_i = do_i . o_i:

    dS_ij = p_ij (dP_ij - delta_i)
    dq_i = scale sum_j dS_ij k_j,   dk_j = scale sum_i dS_ij q_i,   dv_j = sum_i p_ij do_i
    dc_t = sum_j dS_{i(t) j}  -  sum_i dS_{i t}      (i(t): the query row at key position t, if any)

Three launches: delta (per query row), dk/dv (key-stationary; loops over the query heads of its GQA
group and accumulates the dS column sums per query head) and dq (query-stationary; accumulates the dS
row sums). Both dc terms come from the same dS, so rows of dS need not sum to zero exactly.
c precision follows fwd.py: float64 reference per program, hi/lo float32 split on diagonal tiles.
Pruning (prune_delta, see fwd.py and pruning.py): dq skips a prefix of key blocks like the forward;
dk/dv stops each GQA head's query loop at the first query tile that may be skipped. Each kernel
decides at its own tile sizes, conservatively, so all skipped pairs pass the pair test.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from .fwd import (
    LOG2E,
    KernelConfig,
    block_d_for,
    check_inputs,
    check_prune_delta,
    dot_precision,
    is_interpreted,
    kv_tile_logits,
    query_c,
    load_tile,
    mma,
    pick_config,
    rel_c,
    split_f64,
    upcast_dots,
)
from .tiles import LAUNCH_OPTIONS, launch_grid, program_ids, query_key_range, seq_bounds, tile_bounds

# Tuning knobs (H100/H200, bf16/fp16), keyed by padded head dim as in fwd.py; picked by a small sweep
# on one H200 (triton 3.6, bf16, B=2, T=16K), timing each kernel alone.
# dk/dv kernel: block_n = keys per program (stationary), block_m = query rows per step.
DKDV_CONFIGS: dict[int, KernelConfig] = {
    64: KernelConfig(block_m=64, block_n=64, num_warps=4, num_stages=3),
    128: KernelConfig(block_m=32, block_n=64, num_warps=4, num_stages=4),
    256: KernelConfig(block_m=64, block_n=32, num_warps=4, num_stages=2),
}
# dq kernel: block_m = query rows per program (stationary), block_n = keys per step.
DQ_CONFIGS: dict[int, KernelConfig] = {
    64: KernelConfig(block_m=128, block_n=64, num_warps=4, num_stages=2),
    128: KernelConfig(block_m=64, block_n=64, num_warps=4, num_stages=2),
    256: KernelConfig(block_m=128, block_n=32, num_warps=8, num_stages=2),
}
DELTA_BLOCK_M = 128
INTERPRET_DKDV_CONFIG = KernelConfig(block_m=16, block_n=32, num_warps=1, num_stages=1)
INTERPRET_DQ_CONFIG = KernelConfig(block_m=16, block_n=32, num_warps=1, num_stages=1)


def dkdv_config(head_dim: int, t: torch.Tensor) -> KernelConfig:
    return pick_config(DKDV_CONFIGS, INTERPRET_DKDV_CONFIG, head_dim, t)


def dq_config(head_dim: int, t: torch.Tensor) -> KernelConfig:
    return pick_config(DQ_CONFIGS, INTERPRET_DQ_CONFIG, head_dim, t)


# ----------------------------------------------------------------------------------------------
# delta_i = do_i . o_i
# ----------------------------------------------------------------------------------------------


@triton.jit
def _delta_kernel(O, DO, DLse, Delta,
                  stride_ob, stride_ot, stride_oh, stride_db, stride_dt, stride_dh,
                  stride_eb, stride_eh, seqlen, n_blocks, n_heads,
                  HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr,
                  HAS_DLSE: tl.constexpr):
    pid_m, head, zb = program_ids(n_blocks, n_heads)
    zb = zb.to(tl.int64)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    row_ok = rows < seqlen
    d_ok = offs_d < HEAD_DIM
    rows64 = rows.to(tl.int64)
    o = load_tile(O + zb * stride_ob + head * stride_oh + rows64[:, None] * stride_ot + offs_d[None, :],
                  row_ok, d_ok, True, True)
    do = load_tile(DO + zb * stride_db + head * stride_dh + rows64[:, None] * stride_dt + offs_d[None, :],
                   row_ok, d_ok, True, True)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
    if HAS_DLSE:
        # A gradient on lse adds dlse_i * p_ij to dS_ij, i.e. it shifts delta_i by -dlse_i.
        delta -= tl.load(DLse + zb * stride_eb + head * stride_eh + rows, mask=row_ok, other=0.0)
    tl.store(Delta + zb * stride_eb + head * stride_eh + rows, delta, mask=row_ok)


def row_deltas(out: torch.Tensor, do: torch.Tensor, dlse: torch.Tensor | None, delta: torch.Tensor) -> None:
    """delta_i = do_i . o_i (minus dlse_i) into delta float32 [B, Hq, Tq] (contiguous); out, do [B, Tq, Hq, D]."""
    B, Tq, Hq, D = out.shape
    delta_block = 32 if is_interpreted(out) else DELTA_BLOCK_M
    n_dblocks = triton.cdiv(Tq, delta_block)
    _delta_kernel[launch_grid(n_dblocks, Hq, B)](
        out, do, dlse if dlse is not None else delta, delta,
        out.stride(0), out.stride(1), out.stride(2), do.stride(0), do.stride(1), do.stride(2),
        delta.stride(0), delta.stride(1), Tq, n_dblocks, Hq,
        BLOCK_M=delta_block, HAS_DLSE=dlse is not None, HEAD_DIM=D, BLOCK_D=block_d_for(D), **LAUNCH_OPTIONS,
    )


# ----------------------------------------------------------------------------------------------
# dk, dv and the dS column sums (key-stationary)
# ----------------------------------------------------------------------------------------------


@triton.jit
def _dkdv_step(dk, dv, colsum, k, v, ck2, ck_hi, ck_lo, cols,
               q_base, do_base, c_base, lse_base, delta_base, r, i0, n_q, off,
               stride_qt, stride_dot, scale2, offs_m, offs_d, d_ok,
               MASKED: tl.constexpr, MASK_D: tl.constexpr, DOT_PRECISION: tl.constexpr,
               UPCAST: tl.constexpr):
    rows = i0 + offs_m
    row_ok = rows < n_q
    i0_64 = tl.cast(i0, tl.int64)
    q = load_tile(q_base + i0_64 * stride_qt + offs_m[:, None] * stride_qt + offs_d[None, :],
                  row_ok, d_ok, MASKED, MASK_D)
    do = load_tile(do_base + i0_64 * stride_dot + offs_m[:, None] * stride_dot + offs_d[None, :],
                   row_ok, d_ok, MASKED, MASK_D)
    pos_q = off + rows
    # Transposed orientation: tiles are [keys, queries] so dk/dv accumulate without transposes.
    qkT = mma(k, tl.trans(q), None, DOT_PRECISION, UPCAST)
    if MASKED:
        lse2 = tl.load(lse_base + rows, mask=row_ok, other=0.0) * LOG2E
        delta = tl.load(delta_base + rows, mask=row_ok, other=0.0)
        cq_hi, cq_lo = split_f64(rel_c(c_base + pos_q, row_ok, r))
        biasT = ((cq_hi[None, :] - ck_hi[:, None]) + (cq_lo[None, :] - ck_lo[:, None])) * LOG2E
        # Mask the exponent, not the result: masked entries may have large positive bias.
        visible = (cols[:, None] <= pos_q[None, :]) & row_ok[None, :]
        pT = tl.exp2(tl.where(visible, qkT * scale2 + biasT - lse2[None, :], float("-inf")))
    else:
        delta = tl.load(delta_base + rows)
        # lse joins the per-row term: one subtraction per element fewer than a separate "- lse"
        row2 = (tl.load(c_base + pos_q) - r).to(tl.float32) * LOG2E - tl.load(lse_base + rows) * LOG2E
        pT = tl.exp2(qkT * scale2 + (row2[None, :] - ck2[:, None]))
    dv = mma(pT.to(do.dtype), do, dv, DOT_PRECISION, UPCAST)
    dpT = mma(v, tl.trans(do), None, DOT_PRECISION, UPCAST)
    dsT = pT * (dpT - delta[None, :])
    dk = mma(dsT.to(q.dtype), q, dk, DOT_PRECISION, UPCAST)
    colsum += tl.sum(dsT, 1)
    return dk, dv, colsum


@triton.jit
def _dkdv_kernel(
    Q, K, V, C, DO, Lse, Delta, DK, DV, ColSum, CuSeqlens, PruneBound,
    stride_qb, stride_qt, stride_qh,
    stride_kb, stride_kt, stride_kh,
    stride_vb, stride_vt, stride_vh,
    stride_dob, stride_dot, stride_doh,
    stride_dkb, stride_dkt, stride_dkh,
    stride_dvb, stride_dvt, stride_dvh,
    stride_cb, stride_ch,
    stride_lb, stride_lh,
    seqlen_q, seqlen_k, scale, scale2, n_blocks, n_heads,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    MASK_D: tl.constexpr, IS_VARLEN: tl.constexpr, DOT_PRECISION: tl.constexpr, UPCAST: tl.constexpr,
    PRUNE: tl.constexpr,
):
    pid_n, kv_head, pid_z = program_ids(n_blocks, n_heads)
    zb, tok0, n_q, n_k = seq_bounds(CuSeqlens, pid_z, seqlen_q, seqlen_k, IS_VARLEN)
    n0 = pid_n * BLOCK_N
    if n0 >= n_k:
        return
    off = n_k - n_q

    offs_m = tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    cols = n0 + offs_n
    col_ok = cols < n_k
    d_ok = offs_d < HEAD_DIM
    k = load_tile(K + zb * stride_kb + (tok0 + n0) * stride_kt + kv_head * stride_kh
                  + offs_n[:, None] * stride_kt + offs_d[None, :], col_ok, d_ok, True, MASK_D)
    v = load_tile(V + zb * stride_vb + (tok0 + n0) * stride_vt + kv_head * stride_vh
                  + offs_n[:, None] * stride_vt + offs_d[None, :], col_ok, d_ok, True, MASK_D)
    dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)

    # Query rows [i_lo, n_q) see this block; pruning stops each head's loops early (below).
    # Rows in [i_lo, i_mid) are on the diagonal band: causal mask needed. Rows from i_mid on sit at or
    # after the block's last key: full tiles in [i_mid, i_full) need no mask, then one masked tail tile.
    i_lo = tl.maximum(n0 - off, 0)
    n_band = tl.maximum(n0 + BLOCK_N - 1 - off - i_lo, 0)
    i_mid = i_lo + tl.cdiv(n_band, BLOCK_M) * BLOCK_M
    i_full = i_mid + (tl.maximum(n_q - i_mid, 0) // BLOCK_M) * BLOCK_M
    # Reference: c at the block's last key, so that c[j] - r >= 0 >= c[p_i] - r on unmasked tiles.
    n_last = tl.minimum(n0 + BLOCK_N, n_k) - 1

    for g in range(GROUP):
        head = kv_head * GROUP + g
        q_base = Q + zb * stride_qb + tok0 * stride_qt + head * stride_qh
        do_base = DO + zb * stride_dob + tok0 * stride_dot + head * stride_doh
        c_base = C + zb * stride_cb + head * stride_ch + tok0
        lse_base = Lse + zb * stride_lb + head * stride_lh + tok0
        delta_base = Delta + zb * stride_lb + head * stride_lh + tok0
        r = tl.load(c_base + n_last)
        ck_hi, ck_lo = split_f64(rel_c(c_base + cols, col_ok, r))
        ck2 = ck_hi * LOG2E
        colsum = tl.zeros([BLOCK_N], tl.float32)
        band_end = i_mid
        full_end = i_full
        tail_end = n_q
        if PRUNE:
            # Query tiles from i_hi on have c[first query] - c[last key] <= delta: skip them
            # (PruneBound: [n_z, Hq, n_kblocks], from tile_bounds).
            i_hi = tl.load(PruneBound + (pid_z * (GROUP * n_heads) + head) * n_blocks + pid_n)
            band_end = tl.minimum(i_mid, i_hi)
            full_end = tl.minimum(i_full, i_hi)
            tail_end = tl.minimum(n_q, i_hi)
        for i0 in range(i_lo, band_end, BLOCK_M):
            dk, dv, colsum = _dkdv_step(dk, dv, colsum, k, v, ck2, ck_hi, ck_lo, cols,
                                        q_base, do_base, c_base, lse_base, delta_base, r, i0, n_q, off,
                                        stride_qt, stride_dot, scale2, offs_m, offs_d, d_ok,
                                        True, MASK_D, DOT_PRECISION, UPCAST)
        for i0 in range(i_mid, full_end, BLOCK_M):
            dk, dv, colsum = _dkdv_step(dk, dv, colsum, k, v, ck2, ck_hi, ck_lo, cols,
                                        q_base, do_base, c_base, lse_base, delta_base, r, i0, n_q, off,
                                        stride_qt, stride_dot, scale2, offs_m, offs_d, d_ok,
                                        False, MASK_D, DOT_PRECISION, UPCAST)
        for i0 in range(i_full, tail_end, BLOCK_M):
            dk, dv, colsum = _dkdv_step(dk, dv, colsum, k, v, ck2, ck_hi, ck_lo, cols,
                                        q_base, do_base, c_base, lse_base, delta_base, r, i0, n_q, off,
                                        stride_qt, stride_dot, scale2, offs_m, offs_d, d_ok,
                                        True, MASK_D, DOT_PRECISION, UPCAST)
        tl.store(ColSum + zb * stride_cb + head * stride_ch + tok0 + cols, colsum, mask=col_ok)

    dk = dk * scale
    st_mask = col_ok[:, None] & d_ok[None, :]
    tl.store(DK + zb * stride_dkb + (tok0 + n0) * stride_dkt + kv_head * stride_dkh
             + offs_n[:, None] * stride_dkt + offs_d[None, :], dk.to(DK.dtype.element_ty), mask=st_mask)
    tl.store(DV + zb * stride_dvb + (tok0 + n0) * stride_dvt + kv_head * stride_dvh
             + offs_n[:, None] * stride_dvt + offs_d[None, :], dv.to(DV.dtype.element_ty), mask=st_mask)


# ----------------------------------------------------------------------------------------------
# dq and the dS row sums (query-stationary)
# ----------------------------------------------------------------------------------------------


@triton.jit
def _dq_step(dq, rowsum, q, do, lse2, delta, row2, cq_hi, cq_lo, pos_q,
             k_base, v_base, c_base, r, n0, hi, stride_kt, stride_vt, scale2,
             offs_n, offs_d, d_ok,
             MASKED: tl.constexpr, MASK_D: tl.constexpr, DOT_PRECISION: tl.constexpr,
             UPCAST: tl.constexpr):
    # pos_q is -1 on padded rows, which masks them out entirely. Unmasked tiles take lse inside the
    # per-row term (row2 = cq2 - lse2: one subtraction per element fewer); masked tiles subtract it.
    k, v, s = kv_tile_logits(q, row2, cq_hi, cq_lo, pos_q, k_base, v_base, c_base, r, n0, hi, stride_kt,
                             stride_vt, scale2, offs_n, offs_d, d_ok, MASKED, MASK_D, DOT_PRECISION, UPCAST)
    if MASKED:
        p = tl.exp2(s - lse2[:, None])
    else:
        p = tl.exp2(s)
    dp = mma(do, tl.trans(v), None, DOT_PRECISION, UPCAST)
    ds = p * (dp - delta[:, None])
    dq = mma(ds.to(k.dtype), k, dq, DOT_PRECISION, UPCAST)
    rowsum += tl.sum(ds, 1)
    return dq, rowsum


@triton.jit
def _dq_kernel(
    Q, K, V, C, DO, Lse, Delta, DQ, RowSum, CuSeqlens, PruneBound,
    stride_qb, stride_qt, stride_qh,
    stride_kb, stride_kt, stride_kh,
    stride_vb, stride_vt, stride_vh,
    stride_dob, stride_dot, stride_doh,
    stride_dqb, stride_dqt, stride_dqh,
    stride_cb, stride_ch,
    stride_lb, stride_lh,
    seqlen_q, seqlen_k, scale, scale2, n_blocks, n_heads,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    MASK_D: tl.constexpr, IS_VARLEN: tl.constexpr, DOT_PRECISION: tl.constexpr, UPCAST: tl.constexpr,
    PRUNE: tl.constexpr,
):
    blk, head, pid_z = program_ids(n_blocks, n_heads)
    pid_m = n_blocks - 1 - blk
    zb, tok0, n_q, n_k = seq_bounds(CuSeqlens, pid_z, seqlen_q, seqlen_k, IS_VARLEN)
    m0 = pid_m * BLOCK_M
    if m0 >= n_q:
        return
    off = n_k - n_q
    kv_head = head // GROUP

    k_base = K + zb * stride_kb + tok0 * stride_kt + kv_head * stride_kh
    v_base = V + zb * stride_vb + tok0 * stride_vt + kv_head * stride_vh
    c_base = C + zb * stride_cb + head * stride_ch + tok0
    lse_base = Lse + zb * stride_lb + head * stride_lh + tok0
    delta_base = Delta + zb * stride_lb + head * stride_lh + tok0

    offs_m = tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    rows = m0 + offs_m
    row_ok = rows < n_q
    d_ok = offs_d < HEAD_DIM
    q = load_tile(Q + zb * stride_qb + (tok0 + m0) * stride_qt + head * stride_qh
                  + offs_m[:, None] * stride_qt + offs_d[None, :], row_ok, d_ok, True, MASK_D)
    do = load_tile(DO + zb * stride_dob + (tok0 + m0) * stride_dot + head * stride_doh
                   + offs_m[:, None] * stride_dot + offs_d[None, :], row_ok, d_ok, True, MASK_D)
    lse2 = tl.load(lse_base + rows, mask=row_ok, other=0.0) * LOG2E
    delta = tl.load(delta_base + rows, mask=row_ok, other=0.0)

    p_first = off + m0
    pos_q = tl.where(row_ok, off + rows, -1)
    r, cq_hi, cq_lo, cq2 = query_c(c_base, p_first, pos_q, row_ok)
    row2 = cq2 - lse2

    dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    rowsum = tl.zeros([BLOCK_M], tl.float32)
    slot = (pid_z * n_heads + head) * n_blocks + pid_m  # PruneBound: [n_z, Hq, n_blocks] contiguous
    lo, mid, hi = query_key_range(PruneBound, slot, p_first, n_k, BLOCK_M, BLOCK_N, PRUNE)
    for n0 in range(lo, mid, BLOCK_N):
        dq, rowsum = _dq_step(dq, rowsum, q, do, lse2, delta, row2, cq_hi, cq_lo, pos_q,
                              k_base, v_base, c_base, r, n0, hi, stride_kt, stride_vt, scale2,
                              offs_n, offs_d, d_ok, False, MASK_D, DOT_PRECISION, UPCAST)
    for n0 in range(mid, hi, BLOCK_N):
        dq, rowsum = _dq_step(dq, rowsum, q, do, lse2, delta, row2, cq_hi, cq_lo, pos_q,
                              k_base, v_base, c_base, r, n0, hi, stride_kt, stride_vt, scale2,
                              offs_n, offs_d, d_ok, True, MASK_D, DOT_PRECISION, UPCAST)

    dq = dq * scale
    tl.store(DQ + zb * stride_dqb + (tok0 + m0) * stride_dqt + head * stride_dqh
             + offs_m[:, None] * stride_dqt + offs_d[None, :], dq.to(DQ.dtype.element_ty),
             mask=row_ok[:, None] & d_ok[None, :])
    tl.store(RowSum + zb * stride_lb + head * stride_lh + tok0 + rows, rowsum, mask=row_ok)


# ----------------------------------------------------------------------------------------------
# Launcher
# ----------------------------------------------------------------------------------------------


def triton_backward(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, c: torch.Tensor,
                    out: torch.Tensor, lse: torch.Tensor, scale: float,
                    cu_seqlens: torch.Tensor | None = None, max_seqlen: int | None = None,
                    *, dlse: torch.Tensor | None = None, prune_delta: torch.Tensor | None = None,
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Forgetting Attention backward.

    do, out [B, Tq, Hq, D]; q, k, v, c as in triton_forward; lse float32 [B, Hq, Tq];
    dlse: optional gradient on lse [B, Hq, Tq] (None means zero).
    prune_delta: optional float64 [B, Hq] skip threshold, as in triton_forward (pass the forward's).
    Returns dq [B, Tq, Hq, D], dk, dv [B, Tk, Hkv, D] (input dtypes) and dc float32 [B, Hq, Tk].
    """
    check_inputs(q, k, v, c, cu_seqlens, max_seqlen)
    B, Tq, Hq, D = q.shape
    Tk, Hkv = k.shape[1], k.shape[2]
    for name, t in (("do", do), ("out", out)):
        if t.shape != q.shape or (t.stride(-1) != 1 and t.shape[-1] != 1 and t.numel()):  # see check_inputs
            raise ValueError(f"{name} must be {tuple(q.shape)} with a contiguous last dim, got {tuple(t.shape)}")
    if lse.shape != (B, Hq, Tq) or lse.dtype != torch.float32:
        raise ValueError(f"lse must be float32 [{B}, {Hq}, {Tq}], got {lse.dtype} {tuple(lse.shape)}")
    if dlse is not None:
        if dlse.shape != (B, Hq, Tq):
            raise ValueError(f"dlse must be [{B}, {Hq}, {Tq}], got {tuple(dlse.shape)}")
        dlse = dlse.to(torch.float32).contiguous()
    prune = check_prune_delta(prune_delta, B, Hq, q)
    if do.dtype != q.dtype:
        do = do.to(q.dtype)
    c = c.contiguous()
    lse = lse.contiguous()
    varlen = cu_seqlens is not None
    alloc = torch.zeros if varlen else torch.empty
    dq = alloc((B, Tq, Hq, D), dtype=q.dtype, device=q.device)
    dk = alloc((B, Tk, Hkv, D), dtype=k.dtype, device=k.device)
    dv = alloc((B, Tk, Hkv, D), dtype=v.dtype, device=v.device)
    colsum = alloc((B, Hq, Tk), dtype=torch.float32, device=q.device)
    rowsum = alloc((B, Hq, Tq), dtype=torch.float32, device=q.device)
    delta = alloc((B, Hq, Tq), dtype=torch.float32, device=q.device)
    if B == 0 or Tq == 0 or Hq == 0:
        return dq, dk.zero_(), dv.zero_(), colsum.zero_()

    block_d = block_d_for(D)
    common = dict(HEAD_DIM=D, BLOCK_D=block_d)
    row_deltas(out, do, dlse, delta)

    kern = dict(GROUP=Hq // Hkv, MASK_D=(block_d != D), IS_VARLEN=varlen,
                DOT_PRECISION=dot_precision(q.dtype), UPCAST=upcast_dots(q), PRUNE=prune, **common)
    if varlen:
        n_z, cu = cu_seqlens.numel() - 1, cu_seqlens.contiguous()  # read by pointer, as in the forward
    else:
        n_z, cu = B, lse  # placeholder pointer, never read
    scale = float(scale)
    scale2 = scale * math.log2(math.e)
    # The kernels index lse, delta, dlse and rowsum with lse's strides, and colsum with c's: all are
    # contiguous and of one shape, so strides agree wherever a dim has more than one entry.

    cfg = dkdv_config(D, q)
    n_kblocks = triton.cdiv(int(max_seqlen) if varlen else Tk, cfg.block_n)
    bound = tile_bounds(c, prune_delta, cu, varlen, n_z, Tq, Tk, n_kblocks, cfg.block_m, cfg.block_n,
                        True) if prune else c
    _dkdv_kernel[launch_grid(n_kblocks, Hkv, n_z)](
        q, k, v, c, do, lse, delta, dk, dv, colsum, cu, bound,
        q.stride(0), q.stride(1), q.stride(2),
        k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2),
        do.stride(0), do.stride(1), do.stride(2),
        dk.stride(0), dk.stride(1), dk.stride(2),
        dv.stride(0), dv.stride(1), dv.stride(2),
        c.stride(0), c.stride(1),
        lse.stride(0), lse.stride(1),
        Tq, Tk, scale, scale2, n_kblocks, Hkv,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, num_warps=cfg.num_warps, num_stages=cfg.num_stages, **kern,
        **LAUNCH_OPTIONS,
    )

    cfg = dq_config(D, q)
    n_qblocks = triton.cdiv(int(max_seqlen) if varlen else Tq, cfg.block_m)
    bound = tile_bounds(c, prune_delta, cu, varlen, n_z, Tq, Tk, n_qblocks, cfg.block_m, cfg.block_n,
                        False) if prune else c
    _dq_kernel[launch_grid(n_qblocks, Hq, n_z)](
        q, k, v, c, do, lse, delta, dq, rowsum, cu, bound,
        q.stride(0), q.stride(1), q.stride(2),
        k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2),
        do.stride(0), do.stride(1), do.stride(2),
        dq.stride(0), dq.stride(1), dq.stride(2),
        c.stride(0), c.stride(1),
        lse.stride(0), lse.stride(1),
        Tq, Tk, scale, scale2, n_qblocks, Hq,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, num_warps=cfg.num_warps, num_stages=cfg.num_stages, **kern,
        **LAUNCH_OPTIONS,
    )

    # dc_t = (row sum of dS at the query sitting on position t) - (column sum of dS at key t).
    dc = colsum.neg_()
    dc[:, :, Tk - Tq:] += rowsum
    return dq, dk, dv, dc
