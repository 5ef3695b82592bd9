"""Gluon backward kernels of Forgetting Attention for Hopper (sm_90a); deterministic, no atomics.

The maths and the two dc terms are those of the Triton backward (../bwd.py): with p_ij the forward
probabilities, dP_ij = do_i . v_j and delta_i = do_i . o_i,

    dS_ij = p_ij (dP_ij - delta_i),   dq_i = scale sum_j dS_ij k_j,   dk_j = scale sum_i dS_ij q_i,
    dv_j = sum_i p_ij do_i,           dc_t = rowsum_t(dS) - colsum_t(dS)

Two kernels, each with two consumer warpgroups and one loader warp, as the forward:
- ``dkdv_kernel`` (key-stationary): a CTA holds 128 keys (64 per warpgroup) and streams the query
  tiles of every query head of its GQA group: S^T = K Q^T and dP^T = V dO^T by wgmma from shared
  memory, then dV += P^T dO and dK += dS^T Q with P^T, dS^T as register operands. The dS column sums
  (the key term of dc) are row sums of dS^T in registers.
- ``dq_kernel`` (query-stationary): the forward's schedule (same loader) with S = Q K^T, dP = dO V^T,
  dQ += dS K and the dS row sums.
Every product is written by one CTA in a fixed order, so gradients are bitwise reproducible.

Persistent (``PERSISTENT``; BwdConfig.dkdv_persistent / dq_persistent, the default at D 64): one CTA an SM, whose
loader takes tiles from an int32 counter in the launch order (an atomic add, so the SMs that finish first take the
next tiles, as the hardware scheduler would) and hands each id to the consumers through a two-slot ring
(``_publish_task`` / ``_receive_task``); the next tile's K / V (dk/dv) or Q / dO (dq) are loaded as soon as the
consumers release the last one's, while they store its results. Each tile's arithmetic is that of one CTA a tile,
so both schedules give bitwise the same gradients.

With ``MMA_SUMS`` the two dS sums come from the tensor cores instead: one more wgmma per tile multiplies the
bf16 dS that the dQ / dK product reads by a [K, 8] matrix of ones. Summing a tile across its columns in registers
is ~62 additions and shuffles per thread and tile; at D 64 leaving the sums out took the dk/dv kernel from 6.6 to
6.0 ms and dq from 4.9 to 4.7 (docs/bench/hopper_tune_188e4b6_locate_h200.json). Both sums then add the same rounded
values, which is what keeps dc consistent over the reverse cumsum (the row sums alone from bf16 dS, the column sums
from fp32, lost it: docs/bench/history.md, tenth session). The extra n8 products and registers keep most of that
saving: taken at D 64 only (launch.BWD_CONFIGS says by how much).
"""
from __future__ import annotations

from .compat import gl, gluon, mbarrier, thread_barrier, tma_load, warpgroup_mma, warpgroup_mma_wait
from .common import (LOG2E, SUM_N, WG_ROWS, fill_ones, key_tiles, kv_loader, kv_ring, launch_order, ones_ring,
                     query_program, query_task, release_stage, row_starts, sequence_of, split_c)

# Per-query vectors the dk/dv loader stages beside each Q / dO tile, one row each. With the diagonal
# tiles' bias split as (cq_hi - ck_hi) * log2(e) + (cq_lo - ck_lo) * log2(e), lse folds into the lo term:
# the consumers then hold two vectors per masked tile instead of three (their registers are the limit).
VEC_ROW2 = gl.constexpr(0)    # (c_i - r) * log2(e) - lse_i * log2(e): the unmasked tiles' row term
VEC_CQ_HI = gl.constexpr(1)   # c_i - r, float32 hi part
VEC_CQ_LO2 = gl.constexpr(2)  # (c_i - r) lo part * log2(e) - lse_i * log2(e)
VEC_DELTA = gl.constexpr(3)   # delta_i
N_VEC = gl.constexpr(4)
# _dkdv_tile's MASK: which path a query tile takes (TILE_EITHER: decided tile by tile).
TILE_EITHER = gl.constexpr(0)
TILE_MASKED = gl.constexpr(1)
TILE_UNMASKED = gl.constexpr(2)
@gluon.jit
def _publish_task(task_smem, task_ready, task_empty, task, j):
    """Hand the j-th task id to the consumers through a two-slot ring."""
    one_l: gl.constexpr = gl.BlockedLayout([1], [32], [gl.num_warps()], [0])
    s = j % 2
    mbarrier.wait(task_empty.index(s), ((j // 2) & 1) ^ 1)
    task_smem.index(s).store(gl.zeros([1], gl.int32, one_l) + task)
    thread_barrier()
    mbarrier.arrive(task_ready.index(s), count=1)


@gluon.jit
def _task_ring():
    """Shared memory and barriers of the two-slot ring that hands task ids from the loader to the two consumer
    warpgroups of a persistent kernel."""
    task_smem = gl.allocate_shared_memory(gl.int32, [2, 1], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    task_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    task_empty = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(2):
        mbarrier.init(task_ready.index(i), count=1)
        mbarrier.init(task_empty.index(i), count=2)
    return task_smem, task_ready, task_empty


@gluon.jit
def _receive_task(task_smem, task_ready, task_empty, j):
    """The j-th task id of _publish_task; its slot is released at once (the id is in registers)."""
    one_l: gl.constexpr = gl.BlockedLayout([1], [32], [gl.num_warps()], [0])
    s = j % 2
    mbarrier.wait(task_ready.index(s), (j // 2) & 1)
    task = gl.sum(task_smem.index(s).load(one_l), 0)
    release_stage(task_empty.index(s))
    return task


# ----------------------------------------------------------------------------------------------
# dq and the dS row sums (query-stationary)
# ----------------------------------------------------------------------------------------------


@gluon.jit
def _row_deltas(O, DO, DLse, Delta, zb, tok0, head, m0w, n_q, vec_base, stride_b, stride_t, stride_h,
                HEAD_DIM: gl.constexpr, HAS_DLSE: gl.constexpr):
    """delta_i = do_i . o_i (minus dlse_i) of this warpgroup's 64 query rows, also stored for the dk/dv kernel
    (which then runs after this one): the row-delta kernel's work without its launch. O and dO are read from
    global memory once per CTA, while the loader fills the K / V ring; both are packed like dQ. 64 columns at a
    time: whole rows of 128 spilled at D 128 (sm_90a compile, 136 bytes)."""
    ld_l: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    rows = m0w + gl.arange(0, WG_ROWS, layout=gl.SliceLayout(1, ld_l))
    cols = gl.arange(0, 64, layout=gl.SliceLayout(0, ld_l))
    ok = rows < n_q
    base = row_starts(zb, tok0 + rows, head, stride_b, stride_t, stride_h)
    delta = gl.zeros([WG_ROWS], gl.float32, gl.SliceLayout(1, ld_l))
    for d0 in gl.static_range(0, HEAD_DIM, 64):
        offs = base + (d0 + cols)[None, :]
        o = gl.load(O + offs, mask=ok[:, None], other=0.0).to(gl.float32)
        do = gl.load(DO + offs, mask=ok[:, None], other=0.0).to(gl.float32)
        delta += gl.sum(o * do, 1)
    if HAS_DLSE:
        # A gradient on lse adds dlse_i * p_ij to dS_ij, i.e. it shifts delta_i by -dlse_i.
        delta -= gl.load(DLse + vec_base + rows, mask=ok, other=0.0)
    gl.store(Delta + vec_base + rows, delta, mask=ok)
    return delta


@gluon.jit
def _dq_tile(q_w, do_w, k_smem, v_smem, c_smem, ones_smem, k_ready, v_ready, kc_empty, v_empty, dq, rowsum, rows8, i,
             it0, lo, offs_n, masked, cq_hi, cq_lo, row2, lse2, delta, pos_q, zero_s, scale2, WG: gl.constexpr,
             HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, NUM_STAGES: gl.constexpr, MMA_SUMS: gl.constexpr):
    """Key tile i of _dq_consumer (ring position it0 + i, first key lo + i * BLOCK_N): dQ and the dS row sums
    updated. masked: a runtime flag, or a constant in the split loops."""
    s_layout: gl.constexpr = zero_s.type.layout
    dq_layout: gl.constexpr = dq.type.layout
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=dq_layout, k_width=2)
    col_l: gl.constexpr = gl.SliceLayout(0, s_layout)
    dtype: gl.constexpr = q_w.dtype
    s = (it0 + i) % NUM_STAGES
    ph = ((it0 + i) // NUM_STAGES) & 1
    k_tile = k_smem.index(s).reshape([BLOCK_N, HEAD_DIM])
    v_tile = v_smem.index(s).reshape([BLOCK_N, HEAD_DIM])
    mbarrier.wait(k_ready.index(s), ph)
    s_tok = warpgroup_mma(q_w, k_tile.permute((1, 0)), zero_s, use_acc=False, is_async=True)
    mbarrier.wait(v_ready.index(s), ph)
    dp_tok = warpgroup_mma(do_w, v_tile.permute((1, 0)), zero_s, use_acc=False, is_async=True)
    qk = warpgroup_mma_wait(1, deps=[s_tok])
    if masked:
        ck_hi = c_smem.index(3 * s + 1).load(col_l)
        ck_lo = c_smem.index(3 * s + 2).load(col_l)
        cols = lo + i * BLOCK_N + offs_n
        bias = ((cq_hi[:, None] - ck_hi[None, :]) + (cq_lo[:, None] - ck_lo[None, :])) * LOG2E
        # Mask the exponent's argument: a hidden key may carry a large positive bias.
        sc = gl.where(cols[None, :] <= pos_q[:, None], qk * scale2 + bias - lse2[:, None], float("-inf"))
    else:
        ck2 = c_smem.index(3 * s).load(col_l)
        sc = qk * scale2 + (row2[:, None] - ck2[None, :])
    p = gl.exp2(sc)
    dp = warpgroup_mma_wait(0, deps=[dp_tok])
    release_stage(v_empty.index(s))
    ds = p * (dp - delta[:, None])
    if MMA_SUMS:
        ds_a = gl.convert_layout(ds.to(dtype), a_layout)
        tok = warpgroup_mma(ds_a, k_tile, dq, is_async=True)
        # The same registers: the A operand's layout does not depend on the product's width.
        ones = ones_smem.index(WG * NUM_STAGES + s).permute((1, 0))
        a_sum_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=rows8.type.layout, k_width=2)
        sum_tok = warpgroup_mma(gl.convert_layout(ds_a, a_sum_layout), ones, rows8, is_async=True)
        dq, rows8, _ = warpgroup_mma_wait(0, deps=[tok, sum_tok, k_tile])
    else:
        # Summed before the product is issued, so the fp32 tile dies before the wait (after it, dq ran 0.1-0.5 ms
        # slower at D 64: hopper_tune_715b73a_h200.json's default rows).
        rowsum += gl.sum(ds, 1)
        tok = warpgroup_mma(gl.convert_layout(ds.to(dtype), a_layout), k_tile, dq, is_async=True)
        dq, _ = warpgroup_mma_wait(0, deps=[tok, k_tile])
    release_stage(kc_empty.index(s))
    return dq, rowsum, rows8


@gluon.jit
def _dq_consumer(q_smem, do_smem, k_smem, v_smem, c_smem, ones_smem, q_bar, k_ready, v_ready, kc_empty, v_empty,
                 C, Lse, Delta, DQ, RowSum, O, DO, DLse, zb, tok0, head, m0, off, n_q, c_base, r, lo, n_tiles,
                 scale, scale2, stride_dqb, stride_dqt, stride_dqh, stride_lb, stride_lh,
                 WG: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr,
                 NUM_STAGES: gl.constexpr, FUSED_DELTA: gl.constexpr, HAS_DLSE: gl.constexpr,
                 MMA_SUMS: gl.constexpr, SPLIT_LOOPS: gl.constexpr, q_empty=None, q_phase=0, it0=0,
                 PERSISTENT: gl.constexpr = False):
    """dQ and the dS row sums of this warpgroup's 64 query rows. PERSISTENT: one task of several (kv_loader's);
    the ones are filled by the caller, and Q / dO are released on q_empty before the stores."""
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, BLOCK_N, 16])
    dq_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                         instr_shape=[16, HEAD_DIM, 16])
    sum_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                          instr_shape=[16, SUM_N, 16])
    row_l: gl.constexpr = gl.SliceLayout(1, s_layout)
    col_l: gl.constexpr = gl.SliceLayout(0, s_layout)
    dtype: gl.constexpr = q_smem.dtype

    q_w = q_smem.index(WG).reshape([WG_ROWS, HEAD_DIM])
    do_w = do_smem.index(WG).reshape([WG_ROWS, HEAD_DIM])
    m0w = m0 + WG * WG_ROWS
    rows = m0w + gl.arange(0, WG_ROWS, layout=row_l)
    row_ok = rows < n_q
    pos_q = off + rows
    cq_hi, cq_lo = split_c(gl.load(C + c_base + pos_q, mask=row_ok, other=r), r)
    vec_base = zb.to(gl.int64) * stride_lb + head * stride_lh + tok0
    lse2 = gl.load(Lse + vec_base + rows, mask=row_ok, other=0.0) * LOG2E
    if FUSED_DELTA:
        delta = gl.convert_layout(_row_deltas(O, DO, DLse, Delta, zb, tok0, head, m0w, n_q, vec_base, stride_dqb,
                                              stride_dqt, stride_dqh, HEAD_DIM, HAS_DLSE), row_l)
    else:
        delta = gl.load(Delta + vec_base + rows, mask=row_ok, other=0.0)
    # lse joins the per-row term of unmasked tiles: one subtraction per element fewer.
    row2 = cq_hi * LOG2E - lse2
    n_unmasked = gl.minimum(gl.maximum(off + m0w + 1 - lo, 0) // BLOCK_N, n_tiles)
    offs_n = gl.arange(0, BLOCK_N, layout=col_l)

    dq = gl.zeros([WG_ROWS, HEAD_DIM], gl.float32, dq_layout)
    rowsum = gl.zeros([WG_ROWS], gl.float32, row_l)
    zero_s = gl.zeros([WG_ROWS, BLOCK_N], gl.float32, s_layout)
    if MMA_SUMS:
        if not PERSISTENT:
            fill_ones(ones_smem, WG, NUM_STAGES, BLOCK_N)
        rows8 = gl.zeros([WG_ROWS, SUM_N], gl.float32, sum_layout)
    mbarrier.wait(q_bar, q_phase)
    if not MMA_SUMS:
        rows8 = rowsum  # a placeholder _dq_tile passes through
    if SPLIT_LOOPS:
        # The unmasked tiles [0, n_unmasked), then the masked rest, in loops of their own: each tile's path is known
        # at compile time (BwdConfig.dq_split_loops).
        for i in range(n_unmasked):
            dq, rowsum, rows8 = _dq_tile(q_w, do_w, k_smem, v_smem, c_smem, ones_smem, k_ready, v_ready, kc_empty,
                                         v_empty, dq, rowsum, rows8, i, it0, lo, offs_n, False, cq_hi,
                                         cq_lo, row2, lse2, delta, pos_q, zero_s, scale2, WG, HEAD_DIM, BLOCK_N,
                                         NUM_STAGES, MMA_SUMS)
        for i in range(n_unmasked, n_tiles):
            dq, rowsum, rows8 = _dq_tile(q_w, do_w, k_smem, v_smem, c_smem, ones_smem, k_ready, v_ready, kc_empty,
                                         v_empty, dq, rowsum, rows8, i, it0, lo, offs_n, True, cq_hi,
                                         cq_lo, row2, lse2, delta, pos_q, zero_s, scale2, WG, HEAD_DIM, BLOCK_N,
                                         NUM_STAGES, MMA_SUMS)
    else:
        for i in range(n_tiles):
            dq, rowsum, rows8 = _dq_tile(q_w, do_w, k_smem, v_smem, c_smem, ones_smem, k_ready, v_ready, kc_empty,
                                         v_empty, dq, rowsum, rows8, i, it0, lo, offs_n, i >= n_unmasked, cq_hi,
                                         cq_lo, row2, lse2, delta, pos_q, zero_s, scale2, WG, HEAD_DIM, BLOCK_N,
                                         NUM_STAGES, MMA_SUMS)
    if PERSISTENT:
        # Every product that reads Q and dO has been waited for: the loader may bring the next task's.
        release_stage(q_empty)
    if MMA_SUMS:
        # The SUM_N columns hold the same sum: their mean is exact.
        rowsum = gl.convert_layout(gl.sum(rows8, 1) * (1.0 / SUM_N), row_l)

    dq = dq * scale
    st_l: gl.constexpr = gl.BlockedLayout([1, 8], [32 // (HEAD_DIM // 8), HEAD_DIM // 8], [4, 1], [1, 0])
    rows_st = m0w + gl.arange(0, WG_ROWS, layout=gl.SliceLayout(1, st_l))
    cols_st = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, st_l))
    ptrs = DQ + row_starts(zb, tok0 + rows_st, head, stride_dqb, stride_dqt, stride_dqh) + cols_st[None, :]
    gl.store(ptrs, gl.convert_layout(dq.to(dtype), st_l), mask=(rows_st < n_q)[:, None])
    gl.store(RowSum + vec_base + rows, rowsum, mask=row_ok)


@gluon.jit
def _dq_persistent_loader(q_desc, do_desc, k_desc, v_desc, C, q_smem, do_smem, k_smem, v_smem, c_smem, q_bar, q_empty,
                          k_ready, v_ready, kc_empty, v_empty, task_smem, task_ready, task_empty, Counter, n_tasks,
                          CuSeqlens, PruneBound, seqlen_q, seqlen_k, n_blocks, n_heads, group, stride_cb, stride_ch,
                          HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, NUM_STAGES: gl.constexpr,
                          IS_VARLEN: gl.constexpr, PRUNE: gl.constexpr, HEAD_GROUP: gl.constexpr):
    """Tasks from Counter in turn; each id is handed to the consumers, then kv_loader loads its Q, dO and tiles."""
    BLOCK_M: gl.constexpr = 2 * WG_ROWS
    task = gl.atomic_add(Counter, 1)
    _publish_task(task_smem, task_ready, task_empty, task, 0)
    j = 1
    it = 0
    nq = 0
    while task < n_tasks:
        head, pid_z, pid_m, zb, tok0, n_q, n_k, m0 = query_task(task, n_tasks, n_blocks, n_heads, CuSeqlens,
                                                                seqlen_q, seqlen_k, BLOCK_M, IS_VARLEN, HEAD_GROUP)
        if m0 < n_q:
            off, c_base, r, lo, n_tiles = key_tiles(C, PruneBound, zb, tok0, head, pid_z, pid_m, m0, n_q, n_k,
                                                    n_blocks, n_heads, stride_cb, stride_ch, BLOCK_M, BLOCK_N, PRUNE)
            kv_loader(q_desc, do_desc, k_desc, v_desc, C, q_smem, do_smem, k_smem, v_smem, c_smem,
                      q_bar, k_ready, v_ready, kc_empty, v_empty,
                      zb, tok0 + m0, tok0, head * HEAD_DIM, (head // group) * HEAD_DIM, c_base, r, lo, n_tiles,
                      n_k, BLOCK_N, NUM_STAGES, 2, True, q_empty, (nq & 1) ^ 1, it, True)
            it += n_tiles
            nq += 1
        task = gl.atomic_add(Counter, 1)
        _publish_task(task_smem, task_ready, task_empty, task, j)
        j += 1


@gluon.jit
def _dq_persistent_consumer(q_smem, do_smem, k_smem, v_smem, c_smem, ones_smem, q_bar, q_empty, k_ready, v_ready,
                            kc_empty, v_empty, task_smem, task_ready, task_empty, n_tasks, CuSeqlens, PruneBound,
                            C, Lse, Delta, DQ, RowSum, O, DO, DLse, seqlen_q, seqlen_k, n_blocks, n_heads, scale,
                            scale2, stride_dqb, stride_dqt, stride_dqh, stride_cb, stride_ch, stride_lb, stride_lh,
                            WG: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr,
                            NUM_STAGES: gl.constexpr, FUSED_DELTA: gl.constexpr, HAS_DLSE: gl.constexpr,
                            MMA_SUMS: gl.constexpr, SPLIT_LOOPS: gl.constexpr, IS_VARLEN: gl.constexpr,
                            PRUNE: gl.constexpr,
                            HEAD_GROUP: gl.constexpr):
    BLOCK_M: gl.constexpr = 2 * WG_ROWS
    if MMA_SUMS:
        fill_ones(ones_smem, WG, NUM_STAGES, BLOCK_N)
    task = _receive_task(task_smem, task_ready, task_empty, 0)
    j = 1
    it = 0
    nq = 0
    while task < n_tasks:
        head, pid_z, pid_m, zb, tok0, n_q, n_k, m0 = query_task(task, n_tasks, n_blocks, n_heads, CuSeqlens,
                                                                seqlen_q, seqlen_k, BLOCK_M, IS_VARLEN, HEAD_GROUP)
        if m0 < n_q:
            off, c_base, r, lo, n_tiles = key_tiles(C, PruneBound, zb, tok0, head, pid_z, pid_m, m0, n_q, n_k,
                                                    n_blocks, n_heads, stride_cb, stride_ch, BLOCK_M, BLOCK_N, PRUNE)
            _dq_consumer(q_smem, do_smem, k_smem, v_smem, c_smem, ones_smem, q_bar, k_ready, v_ready, kc_empty,
                         v_empty, C, Lse, Delta, DQ, RowSum, O, DO, DLse, zb, tok0, head, m0, off, n_q,
                         c_base, r, lo, n_tiles, scale, scale2, stride_dqb, stride_dqt, stride_dqh,
                         stride_lb, stride_lh, WG, HEAD_DIM, BLOCK_N, NUM_STAGES, FUSED_DELTA, HAS_DLSE, MMA_SUMS,
                         SPLIT_LOOPS,
                         q_empty, nq & 1, it, True)
            it += n_tiles
            nq += 1
        task = _receive_task(task_smem, task_ready, task_empty, j)
        j += 1


@gluon.jit
def _dq_persistent(q_desc, do_desc, k_desc, v_desc, C, Lse, Delta, DQ, RowSum, O, DO, DLse, CuSeqlens, PruneBound,
                   Counter, stride_dqb, stride_dqt, stride_dqh, stride_cb, stride_ch, stride_lb, stride_lh,
                   seqlen_q, seqlen_k, scale, scale2, n_blocks, n_heads, group, n_tasks,
                   HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, NUM_STAGES: gl.constexpr,
                   IS_VARLEN: gl.constexpr, PRUNE: gl.constexpr, CONSUMER_REGS: gl.constexpr,
                   HEAD_GROUP: gl.constexpr, FUSED_DELTA: gl.constexpr, HAS_DLSE: gl.constexpr,
                   MMA_SUMS: gl.constexpr, SPLIT_LOOPS: gl.constexpr):
    q_smem, k_smem, v_smem, c_smem, q_bar, k_ready, v_ready, kc_empty, v_empty = kv_ring(
        q_desc, k_desc, 2, BLOCK_N, HEAD_DIM, NUM_STAGES)
    do_smem = gl.allocate_shared_memory(q_desc.dtype, [2, 1, WG_ROWS, HEAD_DIM], do_desc.layout)
    ones_smem = ones_ring(q_desc.dtype, 2, NUM_STAGES, BLOCK_N)
    q_empty = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(q_empty, count=2)
    task_smem, task_ready, task_empty = _task_ring()
    gl.warp_specialize([
        (_dq_persistent_loader, (q_desc, do_desc, k_desc, v_desc, C, q_smem, do_smem, k_smem, v_smem, c_smem, q_bar,
                                 q_empty, k_ready, v_ready, kc_empty, v_empty, task_smem, task_ready, task_empty,
                                 Counter, n_tasks, CuSeqlens, PruneBound, seqlen_q, seqlen_k, n_blocks, n_heads, group,
                                 stride_cb, stride_ch, HEAD_DIM, BLOCK_N, NUM_STAGES, IS_VARLEN, PRUNE, HEAD_GROUP)),
        (_dq_persistent_consumer, (q_smem, do_smem, k_smem, v_smem, c_smem, ones_smem, q_bar, q_empty, k_ready,
                                   v_ready, kc_empty, v_empty, task_smem, task_ready, task_empty, n_tasks, CuSeqlens,
                                   PruneBound, C, Lse, Delta, DQ, RowSum, O, DO, DLse, seqlen_q, seqlen_k, n_blocks,
                                   n_heads, scale, scale2, stride_dqb, stride_dqt, stride_dqh, stride_cb, stride_ch,
                                   stride_lb, stride_lh, 0, HEAD_DIM, BLOCK_N, NUM_STAGES, FUSED_DELTA, HAS_DLSE,
                                   MMA_SUMS, SPLIT_LOOPS, IS_VARLEN, PRUNE, HEAD_GROUP)),
        (_dq_persistent_consumer, (q_smem, do_smem, k_smem, v_smem, c_smem, ones_smem, q_bar, q_empty, k_ready,
                                   v_ready, kc_empty, v_empty, task_smem, task_ready, task_empty, n_tasks, CuSeqlens,
                                   PruneBound, C, Lse, Delta, DQ, RowSum, O, DO, DLse, seqlen_q, seqlen_k, n_blocks,
                                   n_heads, scale, scale2, stride_dqb, stride_dqt, stride_dqh, stride_cb, stride_ch,
                                   stride_lb, stride_lh, 1, HEAD_DIM, BLOCK_N, NUM_STAGES, FUSED_DELTA, HAS_DLSE,
                                   MMA_SUMS, SPLIT_LOOPS, IS_VARLEN, PRUNE, HEAD_GROUP)),
    ], [4, 4], [CONSUMER_REGS, CONSUMER_REGS])


@gluon.jit
def _dq_one(q_desc, do_desc, k_desc, v_desc, C, Lse, Delta, DQ, RowSum, O, DO, DLse, CuSeqlens, PruneBound,
            stride_dqb, stride_dqt, stride_dqh, stride_cb, stride_ch, stride_lb, stride_lh,
            seqlen_q, seqlen_k, scale, scale2, n_blocks, n_heads, group,
            HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, NUM_WG: gl.constexpr,
            NUM_STAGES: gl.constexpr, IS_VARLEN: gl.constexpr, PRUNE: gl.constexpr,
            CONSUMER_REGS: gl.constexpr, HEAD_GROUP: gl.constexpr, FUSED_DELTA: gl.constexpr,
            HAS_DLSE: gl.constexpr, MMA_SUMS: gl.constexpr, SPLIT_LOOPS: gl.constexpr):
    """The program's own query tile (query_program)."""
    BLOCK_M: gl.constexpr = NUM_WG * WG_ROWS
    head, pid_z, pid_m, zb, tok0, n_q, n_k, m0 = query_program(n_blocks, n_heads, CuSeqlens, seqlen_q, seqlen_k,
                                                               BLOCK_M, IS_VARLEN, HEAD_GROUP)
    if m0 < n_q:
        off, c_base, r, lo, n_tiles = key_tiles(C, PruneBound, zb, tok0, head, pid_z, pid_m, m0, n_q, n_k, n_blocks,
                                                n_heads, stride_cb, stride_ch, BLOCK_M, BLOCK_N, PRUNE)
        q_smem, k_smem, v_smem, c_smem, q_bar, k_ready, v_ready, kc_empty, v_empty = kv_ring(
            q_desc, k_desc, NUM_WG, BLOCK_N, HEAD_DIM, NUM_STAGES)
        do_smem = gl.allocate_shared_memory(q_desc.dtype, [NUM_WG, 1, WG_ROWS, HEAD_DIM], do_desc.layout)
        ones_smem = ones_ring(q_desc.dtype, NUM_WG, NUM_STAGES, BLOCK_N)
        kv_head = head // group
        if NUM_WG == 3:
            gl.warp_specialize([
                (kv_loader, (q_desc, do_desc, k_desc, v_desc, C, q_smem, do_smem, k_smem, v_smem, c_smem,
                             q_bar, k_ready, v_ready, kc_empty, v_empty,
                             zb, tok0 + m0, tok0, head * HEAD_DIM, kv_head * HEAD_DIM, c_base, r, lo, n_tiles,
                             n_k, BLOCK_N, NUM_STAGES, NUM_WG, True)),
                (_dq_consumer, (q_smem, do_smem, k_smem, v_smem, c_smem, ones_smem, q_bar, k_ready, v_ready, kc_empty,
                                v_empty, C, Lse, Delta, DQ, RowSum, O, DO, DLse, zb, tok0, head, m0, off, n_q,
                                c_base, r, lo, n_tiles, scale, scale2, stride_dqb, stride_dqt, stride_dqh,
                                stride_lb, stride_lh,
                                0, HEAD_DIM, BLOCK_N, NUM_STAGES, FUSED_DELTA, HAS_DLSE, MMA_SUMS, SPLIT_LOOPS)),
                (_dq_consumer, (q_smem, do_smem, k_smem, v_smem, c_smem, ones_smem, q_bar, k_ready, v_ready, kc_empty,
                                v_empty, C, Lse, Delta, DQ, RowSum, O, DO, DLse, zb, tok0, head, m0, off, n_q,
                                c_base, r, lo, n_tiles, scale, scale2, stride_dqb, stride_dqt, stride_dqh,
                                stride_lb, stride_lh,
                                1, HEAD_DIM, BLOCK_N, NUM_STAGES, FUSED_DELTA, HAS_DLSE, MMA_SUMS, SPLIT_LOOPS)),
                (_dq_consumer, (q_smem, do_smem, k_smem, v_smem, c_smem, ones_smem, q_bar, k_ready, v_ready, kc_empty,
                                v_empty, C, Lse, Delta, DQ, RowSum, O, DO, DLse, zb, tok0, head, m0, off, n_q,
                                c_base, r, lo, n_tiles, scale, scale2, stride_dqb, stride_dqt, stride_dqh,
                                stride_lb, stride_lh,
                                2, HEAD_DIM, BLOCK_N, NUM_STAGES, FUSED_DELTA, HAS_DLSE, MMA_SUMS, SPLIT_LOOPS)),
            ], [4, 4, 4], [CONSUMER_REGS, CONSUMER_REGS, CONSUMER_REGS])
        else:
            gl.warp_specialize([
                (kv_loader, (q_desc, do_desc, k_desc, v_desc, C, q_smem, do_smem, k_smem, v_smem, c_smem,
                             q_bar, k_ready, v_ready, kc_empty, v_empty,
                             zb, tok0 + m0, tok0, head * HEAD_DIM, kv_head * HEAD_DIM, c_base, r, lo, n_tiles,
                             n_k, BLOCK_N, NUM_STAGES, NUM_WG, True)),
                (_dq_consumer, (q_smem, do_smem, k_smem, v_smem, c_smem, ones_smem, q_bar, k_ready, v_ready, kc_empty,
                                v_empty, C, Lse, Delta, DQ, RowSum, O, DO, DLse, zb, tok0, head, m0, off, n_q,
                                c_base, r, lo, n_tiles, scale, scale2, stride_dqb, stride_dqt, stride_dqh,
                                stride_lb, stride_lh,
                                0, HEAD_DIM, BLOCK_N, NUM_STAGES, FUSED_DELTA, HAS_DLSE, MMA_SUMS, SPLIT_LOOPS)),
                (_dq_consumer, (q_smem, do_smem, k_smem, v_smem, c_smem, ones_smem, q_bar, k_ready, v_ready, kc_empty,
                                v_empty, C, Lse, Delta, DQ, RowSum, O, DO, DLse, zb, tok0, head, m0, off, n_q,
                                c_base, r, lo, n_tiles, scale, scale2, stride_dqb, stride_dqt, stride_dqh,
                                stride_lb, stride_lh,
                                1, HEAD_DIM, BLOCK_N, NUM_STAGES, FUSED_DELTA, HAS_DLSE, MMA_SUMS, SPLIT_LOOPS)),
            ], [4, 4], [CONSUMER_REGS, CONSUMER_REGS])


@gluon.jit(do_not_specialize=["stride_dqb", "stride_dqt", "stride_dqh", "stride_cb", "stride_ch", "stride_lb",
                              "stride_lh", "seqlen_q", "seqlen_k", "n_blocks", "n_heads", "group", "n_tasks"])
def dq_kernel(q_desc, do_desc, k_desc, v_desc, C, Lse, Delta, DQ, RowSum, O, DO, DLse, CuSeqlens, PruneBound, Counter,
              stride_dqb, stride_dqt, stride_dqh, stride_cb, stride_ch, stride_lb, stride_lh,
              seqlen_q, seqlen_k, scale, scale2, n_blocks, n_heads, group, n_tasks,
              HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, NUM_WG: gl.constexpr,
              NUM_STAGES: gl.constexpr, IS_VARLEN: gl.constexpr, PRUNE: gl.constexpr,
              CONSUMER_REGS: gl.constexpr, HEAD_GROUP: gl.constexpr, FUSED_DELTA: gl.constexpr,
              HAS_DLSE: gl.constexpr, MMA_SUMS: gl.constexpr, SPLIT_LOOPS: gl.constexpr, PERSISTENT: gl.constexpr):
    """FUSED_DELTA: the consumers compute delta from O and dO (`_row_deltas`) instead of reading it, and store it for
    the dk/dv kernel, which must then be launched after this one. O, DO, DLse: placeholders otherwise.
    PERSISTENT (two warpgroups): one CTA an SM taking the n_tasks query tiles in turn from the int32 Counter.
    SPLIT_LOOPS: unmasked and masked key tiles in loops of their own (BwdConfig.dq_split_loops)."""
    if PERSISTENT:
        _dq_persistent(q_desc, do_desc, k_desc, v_desc, C, Lse, Delta, DQ, RowSum, O, DO, DLse, CuSeqlens, PruneBound,
                       Counter, stride_dqb, stride_dqt, stride_dqh, stride_cb, stride_ch, stride_lb, stride_lh,
                       seqlen_q, seqlen_k, scale, scale2, n_blocks, n_heads, group, n_tasks, HEAD_DIM, BLOCK_N,
                       NUM_STAGES, IS_VARLEN, PRUNE, CONSUMER_REGS, HEAD_GROUP, FUSED_DELTA, HAS_DLSE, MMA_SUMS,
                       SPLIT_LOOPS)
    else:
        _dq_one(q_desc, do_desc, k_desc, v_desc, C, Lse, Delta, DQ, RowSum, O, DO, DLse, CuSeqlens, PruneBound,
                stride_dqb, stride_dqt, stride_dqh, stride_cb, stride_ch, stride_lb, stride_lh, seqlen_q, seqlen_k,
                scale, scale2, n_blocks, n_heads, group, HEAD_DIM, BLOCK_N, NUM_WG, NUM_STAGES, IS_VARLEN, PRUNE,
                CONSUMER_REGS, HEAD_GROUP, FUSED_DELTA, HAS_DLSE, MMA_SUMS, SPLIT_LOOPS)


# ----------------------------------------------------------------------------------------------
# dk, dv and the dS column sums (key-stationary)
# ----------------------------------------------------------------------------------------------


@gluon.jit
def _query_range(pid_z, head, pid_n, n0, off, n_q, n_blocks, n_heads_q, PruneBound,
                 BLOCK_M: gl.constexpr, PRUNE: gl.constexpr):
    """Query tiles [i_lo, i_lo + n_tiles * BLOCK_M) that see key block n0, for query head `head`."""
    i_lo = gl.maximum(n0 - off, 0)
    i_end = n_q
    if PRUNE:
        # From here on c[first query] - c[last key] <= delta (tiles.tile_bounds, key-stationary).
        i_end = gl.minimum(n_q, gl.load(PruneBound + (pid_z * n_heads_q + head) * n_blocks + pid_n))
    return i_lo, gl.cdiv(gl.maximum(i_end - i_lo, 0), BLOCK_M)


@gluon.jit
def _dkdv_load_task(q_desc, do_desc, k_desc, v_desc, C, Lse, Delta, q_smem, do_smem, k_smem, v_smem, vec_smem,
                    kv_bar, ready, empty, zb, tok0, n0, kv_head, pid_z, pid_n, off, n_q, n_k, n_blocks, n_heads_q,
                    stride_cb, stride_ch, stride_lb, stride_lh, PruneBound, group, it,
                    HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, NUM_STAGES: gl.constexpr,
                    PRUNE: gl.constexpr):
    """The loads of one key block: its K and V, then the Q / dO tiles and query vectors of every query head of
    its group through the ring, whose it-th fill this task's first is. Returns the ring position after it."""
    vec_layout: gl.constexpr = gl.BlockedLayout([1], [32], [gl.num_warps()], [0])
    offs = gl.arange(0, BLOCK_M, layout=vec_layout)
    mbarrier.expect(kv_bar, k_desc.block_type.nbytes + v_desc.block_type.nbytes)
    tma_load(k_desc, [zb, tok0 + n0, kv_head * HEAD_DIM], kv_bar, k_smem)
    tma_load(v_desc, [zb, tok0 + n0, kv_head * HEAD_DIM], kv_bar, v_smem)
    n_last = gl.minimum(n0 + 2 * WG_ROWS, n_k) - 1
    for g in range(group):
        head = kv_head * group + g
        c_base = zb.to(gl.int64) * stride_cb + head.to(gl.int64) * stride_ch + tok0
        vec_base = zb.to(gl.int64) * stride_lb + head.to(gl.int64) * stride_lh + tok0
        r = gl.load(C + c_base + n_last)
        i_lo, n_tiles = _query_range(pid_z, head, pid_n, n0, off, n_q, n_blocks, n_heads_q, PruneBound,
                                     BLOCK_M, PRUNE)
        # The vectors of the next tile are loaded one iteration ahead, hiding their latency.
        rows = i_lo + offs
        ok = rows < n_q
        cq = gl.load(C + c_base + off + rows, mask=ok, other=r)
        lse2 = gl.load(Lse + vec_base + rows, mask=ok, other=0.0) * LOG2E
        delta = gl.load(Delta + vec_base + rows, mask=ok, other=0.0)
        for t in range(n_tiles):
            s = it % NUM_STAGES
            ph = (it // NUM_STAGES) & 1
            i0 = i_lo + t * BLOCK_M
            nxt = i0 + BLOCK_M + offs
            ok_n = nxt < n_q
            cq_n = gl.load(C + c_base + off + nxt, mask=ok_n, other=r)
            lse2_n = gl.load(Lse + vec_base + nxt, mask=ok_n, other=0.0) * LOG2E
            delta_n = gl.load(Delta + vec_base + nxt, mask=ok_n, other=0.0)
            mbarrier.wait(empty.index(s), ph ^ 1)
            mbarrier.expect(ready.index(s), q_desc.block_type.nbytes + do_desc.block_type.nbytes)
            tma_load(q_desc, [zb, tok0 + i0, head * HEAD_DIM], ready.index(s), q_smem.index(s))
            tma_load(do_desc, [zb, tok0 + i0, head * HEAD_DIM], ready.index(s), do_smem.index(s))
            cq_hi, cq_lo = split_c(cq, r)
            vec_smem.index(N_VEC * s + VEC_ROW2).store(cq_hi * LOG2E - lse2)
            vec_smem.index(N_VEC * s + VEC_CQ_HI).store(cq_hi)
            vec_smem.index(N_VEC * s + VEC_CQ_LO2).store(cq_lo * LOG2E - lse2)
            vec_smem.index(N_VEC * s + VEC_DELTA).store(delta)
            thread_barrier()
            mbarrier.arrive(ready.index(s), count=1)
            cq = cq_n
            lse2 = lse2_n
            delta = delta_n
            it += 1
    return it


@gluon.jit
def _dkdv_tile(q_smem, do_smem, k_w, v_w, vec_smem, ones_smem, ready, empty, dk, dv, colsum, cols8, it, i0, keys,
               kw0, ck_hi, ck_lo2, ck2, off, n_q, zero_st, scale2, offs_m,
               MASK: gl.constexpr, WG: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr,
               NUM_STAGES: gl.constexpr, MMA_SUMS: gl.constexpr):
    """One query tile of _dkdv_consume_task: dV, dK and the dS column sums updated. MASK: TILE_MASKED (some pair of
    the tile is hidden, the diagonal, or some query is past n_q), TILE_UNMASKED, or TILE_EITHER (decided here)."""
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=dv.type.layout, k_width=2)
    qry_l: gl.constexpr = gl.SliceLayout(0, zero_st.type.layout)
    dtype: gl.constexpr = q_smem.dtype
    s = it % NUM_STAGES
    ph = (it // NUM_STAGES) & 1
    q_tile = q_smem.index(s).reshape([BLOCK_M, HEAD_DIM])
    do_tile = do_smem.index(s).reshape([BLOCK_M, HEAD_DIM])
    mbarrier.wait(ready.index(s), ph)
    s_tok = warpgroup_mma(k_w, q_tile.permute((1, 0)), zero_st, use_acc=False, is_async=True)
    dp_tok = warpgroup_mma(v_w, do_tile.permute((1, 0)), zero_st, use_acc=False, is_async=True)
    if MASK == TILE_EITHER:
        # Unmasked: every query of the tile comes at or after this warpgroup's last key, and exists.
        masked = (off + i0 < kw0 + WG_ROWS - 1) | (i0 + BLOCK_M > n_q)
    else:
        masked = MASK == TILE_MASKED
    qk_t = warpgroup_mma_wait(1, deps=[s_tok])
    if masked:
        cq_hi = vec_smem.index(N_VEC * s + VEC_CQ_HI).load(qry_l)
        cq_lo2 = vec_smem.index(N_VEC * s + VEC_CQ_LO2).load(qry_l)
        rows = i0 + offs_m
        visible = (keys[:, None] <= off + rows[None, :]) & (rows < n_q)[None, :]
        # hi differences of nearby c are exact; mask the exponent's argument, not the result (a hidden key may
        # carry a large positive bias).
        sc = ((cq_hi[None, :] - ck_hi[:, None]) * LOG2E
              + (qk_t * scale2 + (cq_lo2[None, :] - ck_lo2[:, None])))
        p_t = gl.exp2(gl.where(visible, sc, float("-inf")))
    else:
        row2 = vec_smem.index(N_VEC * s + VEC_ROW2).load(qry_l)
        p_t = gl.exp2(qk_t * scale2 + (row2[None, :] - ck2[:, None]))
    dv_tok = warpgroup_mma(gl.convert_layout(p_t.to(dtype), a_layout), do_tile, dv, is_async=True)
    dp_t = warpgroup_mma_wait(1, deps=[dp_tok])
    # delta apart, not as the dP product's starting value: the tensor cores' accumulation from -delta lost the
    # cancellation the gate gradient rests on (dlog_f 6e-2 off at gates of -30, exactly 0 for one token: removed
    # dkdv_delta_acc, thirty-second session).
    delta = vec_smem.index(N_VEC * s + VEC_DELTA).load(qry_l)
    ds_t = p_t * (dp_t - delta[None, :])
    if MMA_SUMS:
        ds_a = gl.convert_layout(ds_t.to(dtype), a_layout)
        dk_tok = warpgroup_mma(ds_a, q_tile, dk, is_async=True)
        ones = ones_smem.index(WG * NUM_STAGES + s).permute((1, 0))
        a_sum_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=cols8.type.layout, k_width=2)
        sum_tok = warpgroup_mma(gl.convert_layout(ds_a, a_sum_layout), ones, cols8, is_async=True)
        dv, dk, cols8, _, _ = warpgroup_mma_wait(0, deps=[dv_tok, dk_tok, sum_tok, q_tile, do_tile])
    else:
        # As in the dq kernel: the sum before the product (after it the dk/dv kernel took 7.6 ms, not 6.6).
        colsum += gl.sum(ds_t, 1)
        dk_tok = warpgroup_mma(gl.convert_layout(ds_t.to(dtype), a_layout), q_tile, dk, is_async=True)
        dv, dk, _, _ = warpgroup_mma_wait(0, deps=[dv_tok, dk_tok, q_tile, do_tile])
    release_stage(empty.index(s))
    return dk, dv, colsum, cols8, it + 1


@gluon.jit
def _dkdv_consume_task(q_smem, do_smem, k_smem, v_smem, vec_smem, ones_smem, kv_bar, kv_empty, ready, empty,
                       C, DK, DV, ColSum, zb, tok0, n0, kv_head, pid_z, pid_n, off, n_q, n_k, n_blocks, n_heads_q,
                       scale, scale2, stride_cb, stride_ch, stride_dkb, stride_dkt, stride_dkh,
                       stride_dvb, stride_dvt, stride_dvh, PruneBound, group, kv_phase, it,
                       WG: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr,
                       NUM_STAGES: gl.constexpr, PRUNE: gl.constexpr, MMA_SUMS: gl.constexpr,
                       PERSISTENT: gl.constexpr, SPLIT_LOOPS: gl.constexpr):
    """dK, dV and the dS column sums of one key block (this warpgroup's 64 keys); with PERSISTENT, K and V are
    released on kv_empty before the stores. Returns the ring position after the task's tiles."""
    # Transposed orientation: tiles are [keys, queries], so dK and dV accumulate without transposes.
    st_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                         instr_shape=[16, BLOCK_M, 16])
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                          instr_shape=[16, HEAD_DIM, 16])
    sum_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                          instr_shape=[16, SUM_N, 16])
    key_l: gl.constexpr = gl.SliceLayout(1, st_layout)
    qry_l: gl.constexpr = gl.SliceLayout(0, st_layout)
    dtype: gl.constexpr = k_smem.dtype

    k_w = k_smem.reshape([2 * WG_ROWS, HEAD_DIM]).slice(WG * WG_ROWS, WG_ROWS)
    v_w = v_smem.reshape([2 * WG_ROWS, HEAD_DIM]).slice(WG * WG_ROWS, WG_ROWS)
    kw0 = n0 + WG * WG_ROWS
    keys = kw0 + gl.arange(0, WG_ROWS, layout=key_l)
    key_ok = keys < n_k
    n_last = gl.minimum(n0 + 2 * WG_ROWS, n_k) - 1
    offs_m = gl.arange(0, BLOCK_M, layout=qry_l)

    dk = gl.zeros([WG_ROWS, HEAD_DIM], gl.float32, acc_layout)
    dv = gl.zeros([WG_ROWS, HEAD_DIM], gl.float32, acc_layout)
    zero_st = gl.zeros([WG_ROWS, BLOCK_M], gl.float32, st_layout)
    mbarrier.wait(kv_bar, kv_phase)
    for g in range(group):
        head = kv_head * group + g
        c_base = zb.to(gl.int64) * stride_cb + head.to(gl.int64) * stride_ch + tok0
        # Reference: c at the block's last key, so c[j] - r >= 0 >= c[p_i] - r on unmasked tiles.
        r = gl.load(C + c_base + n_last)
        ck_hi, ck_lo = split_c(gl.load(C + c_base + keys, mask=key_ok, other=r), r)
        ck2 = ck_hi * LOG2E
        ck_lo2 = ck_lo * LOG2E
        colsum = gl.zeros([WG_ROWS], gl.float32, key_l)
        if MMA_SUMS:
            cols8 = gl.zeros([WG_ROWS, SUM_N], gl.float32, sum_layout)
        i_lo, n_tiles = _query_range(pid_z, head, pid_n, n0, off, n_q, n_blocks, n_heads_q, PruneBound,
                                     BLOCK_M, PRUNE)
        if not MMA_SUMS:
            cols8 = colsum  # a placeholder _dkdv_tile passes through
        if SPLIT_LOOPS:
            # Tiles [0, n_head) hold the diagonal, [n_body, n_tiles) run past n_q: those runs are masked, each in
            # its own loop, so the unmasked loop's registers are allocated without the masked path's.
            n_head = gl.minimum(gl.cdiv(gl.maximum(kw0 + WG_ROWS - 1 - off - i_lo, 0), BLOCK_M), n_tiles)
            n_body = gl.maximum(gl.minimum(gl.maximum(n_q - i_lo, 0) // BLOCK_M, n_tiles), n_head)
            for t in range(n_head):
                dk, dv, colsum, cols8, it = _dkdv_tile(
                    q_smem, do_smem, k_w, v_w, vec_smem, ones_smem, ready, empty, dk, dv, colsum, cols8, it,
                    i_lo + t * BLOCK_M, keys, kw0, ck_hi, ck_lo2, ck2, off, n_q, zero_st, scale2, offs_m,
                    TILE_MASKED, WG, HEAD_DIM, BLOCK_M, NUM_STAGES, MMA_SUMS)
            for t in range(n_head, n_body):
                dk, dv, colsum, cols8, it = _dkdv_tile(
                    q_smem, do_smem, k_w, v_w, vec_smem, ones_smem, ready, empty, dk, dv, colsum, cols8, it,
                    i_lo + t * BLOCK_M, keys, kw0, ck_hi, ck_lo2, ck2, off, n_q, zero_st, scale2, offs_m,
                    TILE_UNMASKED, WG, HEAD_DIM, BLOCK_M, NUM_STAGES, MMA_SUMS)
            for t in range(n_body, n_tiles):
                dk, dv, colsum, cols8, it = _dkdv_tile(
                    q_smem, do_smem, k_w, v_w, vec_smem, ones_smem, ready, empty, dk, dv, colsum, cols8, it,
                    i_lo + t * BLOCK_M, keys, kw0, ck_hi, ck_lo2, ck2, off, n_q, zero_st, scale2, offs_m,
                    TILE_MASKED, WG, HEAD_DIM, BLOCK_M, NUM_STAGES, MMA_SUMS)
        else:
            for t in range(n_tiles):
                dk, dv, colsum, cols8, it = _dkdv_tile(
                    q_smem, do_smem, k_w, v_w, vec_smem, ones_smem, ready, empty, dk, dv, colsum, cols8, it,
                    i_lo + t * BLOCK_M, keys, kw0, ck_hi, ck_lo2, ck2, off, n_q, zero_st, scale2, offs_m,
                    TILE_EITHER, WG, HEAD_DIM, BLOCK_M, NUM_STAGES, MMA_SUMS)
        if MMA_SUMS:
            colsum = gl.convert_layout(gl.sum(cols8, 1) * (1.0 / SUM_N), key_l)
        gl.store(ColSum + c_base + keys, colsum, mask=key_ok)
    if PERSISTENT:
        # Every product that reads K and V has been waited for: the loader may bring the next task's.
        release_stage(kv_empty)

    dk = dk * scale
    st_l: gl.constexpr = gl.BlockedLayout([1, 8], [32 // (HEAD_DIM // 8), HEAD_DIM // 8], [4, 1], [1, 0])
    keys_st = kw0 + gl.arange(0, WG_ROWS, layout=gl.SliceLayout(1, st_l))
    cols_st = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, st_l))
    st_mask = (keys_st < n_k)[:, None]
    gl.store(DK + row_starts(zb, tok0 + keys_st, kv_head, stride_dkb, stride_dkt, stride_dkh) + cols_st[None, :],
             gl.convert_layout(dk.to(dtype), st_l), mask=st_mask)
    gl.store(DV + row_starts(zb, tok0 + keys_st, kv_head, stride_dvb, stride_dvt, stride_dvh) + cols_st[None, :],
             gl.convert_layout(dv.to(dtype), st_l), mask=st_mask)
    return it


@gluon.jit
def _dkdv_task(task, n_tasks, n_blocks, n_heads, CuSeqlens, seqlen_q, seqlen_k, IS_VARLEN: gl.constexpr,
               HEAD_GROUP: gl.constexpr):
    """(key block, kv head, sequence, batch index, first token, query and key lengths, first key) of task `task`
    of n_tasks, in the heaviest-first order; first key >= key length: an empty task (a short packed sequence)."""
    pid_n, kv_head, pid_z = launch_order(task, n_tasks, n_blocks, n_heads, HEAD_GROUP)
    zb, tok0, n_q, n_k = sequence_of(pid_z, CuSeqlens, seqlen_q, seqlen_k, IS_VARLEN)
    return pid_n, kv_head, pid_z, zb, tok0, n_q, n_k, pid_n * (2 * WG_ROWS)


@gluon.jit
def _dkdv_loader(q_desc, do_desc, k_desc, v_desc, C, Lse, Delta, q_smem, do_smem, k_smem, v_smem, vec_smem,
                 kv_bar, ready, empty, zb, tok0, n0, kv_head, pid_z, pid_n, off, n_q, n_k, n_blocks, n_heads_q,
                 stride_cb, stride_ch, stride_lb, stride_lh, PruneBound, group,
                 HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, NUM_STAGES: gl.constexpr,
                 PRUNE: gl.constexpr):
    """The loader of one CTA a tile: its one task from ring position 0, passed as n0 * 0 (a literal 0 would reach
    _dkdv_load_task as a constexpr, which its loops cannot carry)."""
    _dkdv_load_task(q_desc, do_desc, k_desc, v_desc, C, Lse, Delta, q_smem, do_smem, k_smem, v_smem, vec_smem,
                    kv_bar, ready, empty, zb, tok0, n0, kv_head, pid_z, pid_n, off, n_q, n_k, n_blocks, n_heads_q,
                    stride_cb, stride_ch, stride_lb, stride_lh, PruneBound, group, n0 * 0,
                    HEAD_DIM, BLOCK_M, NUM_STAGES, PRUNE)


@gluon.jit
def _dkdv_persistent_loader(q_desc, do_desc, k_desc, v_desc, C, Lse, Delta, q_smem, do_smem, k_smem, v_smem,
                            vec_smem, kv_bar, kv_empty, ready, empty, task_smem, task_ready, task_empty, Counter,
                            n_tasks, CuSeqlens, seqlen_q, seqlen_k, n_blocks, n_heads, stride_cb, stride_ch,
                            stride_lb, stride_lh, PruneBound, group,
                            HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, NUM_STAGES: gl.constexpr,
                            PRUNE: gl.constexpr, IS_VARLEN: gl.constexpr, HEAD_GROUP: gl.constexpr):
    """Tasks taken from Counter in turn until none is left: each id is handed to the consumers, and a task's
    K / V wait until the consumers have released the last task's."""
    n_heads_q = n_heads * group
    task = gl.atomic_add(Counter, 1)
    _publish_task(task_smem, task_ready, task_empty, task, 0)
    j = 1
    it = 0
    kv = 0
    while task < n_tasks:
        pid_n, kv_head, pid_z, zb, tok0, n_q, n_k, n0 = _dkdv_task(task, n_tasks, n_blocks, n_heads, CuSeqlens,
                                                                  seqlen_q, seqlen_k, IS_VARLEN, HEAD_GROUP)
        if n0 < n_k:
            mbarrier.wait(kv_empty, (kv & 1) ^ 1)
            it = _dkdv_load_task(q_desc, do_desc, k_desc, v_desc, C, Lse, Delta, q_smem, do_smem, k_smem, v_smem,
                                 vec_smem, kv_bar, ready, empty, zb, tok0, n0, kv_head, pid_z, pid_n, n_k - n_q,
                                 n_q, n_k, n_blocks, n_heads_q, stride_cb, stride_ch, stride_lb, stride_lh,
                                 PruneBound, group, it, HEAD_DIM, BLOCK_M, NUM_STAGES, PRUNE)
            kv += 1
        task = gl.atomic_add(Counter, 1)
        _publish_task(task_smem, task_ready, task_empty, task, j)
        j += 1


@gluon.jit
def _dkdv_consumer(q_smem, do_smem, k_smem, v_smem, vec_smem, ones_smem, kv_bar, kv_empty, ready, empty,
                   C, DK, DV, ColSum, zb, tok0, n0, kv_head, pid_z, pid_n, off, n_q, n_k, n_blocks, n_heads_q,
                   scale, scale2, stride_cb, stride_ch, stride_dkb, stride_dkt, stride_dkh,
                   stride_dvb, stride_dvt, stride_dvh, PruneBound, group,
                   WG: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr,
                   NUM_STAGES: gl.constexpr, PRUNE: gl.constexpr, MMA_SUMS: gl.constexpr,
                   SPLIT_LOOPS: gl.constexpr):
    """A consumer of one CTA a tile (ring from position 0, as _dkdv_loader)."""
    if MMA_SUMS:
        fill_ones(ones_smem, WG, NUM_STAGES, BLOCK_M)
    _dkdv_consume_task(q_smem, do_smem, k_smem, v_smem, vec_smem, ones_smem, kv_bar, kv_empty, ready, empty,
                       C, DK, DV, ColSum, zb, tok0, n0, kv_head, pid_z, pid_n, off, n_q, n_k, n_blocks, n_heads_q,
                       scale, scale2, stride_cb, stride_ch, stride_dkb, stride_dkt, stride_dkh,
                       stride_dvb, stride_dvt, stride_dvh, PruneBound, group, 0, n0 * 0,
                       WG, HEAD_DIM, BLOCK_M, NUM_STAGES, PRUNE, MMA_SUMS, False, SPLIT_LOOPS)


@gluon.jit
def _dkdv_persistent_consumer(q_smem, do_smem, k_smem, v_smem, vec_smem, ones_smem, kv_bar, kv_empty, ready, empty,
                              task_smem, task_ready, task_empty, n_tasks, CuSeqlens, seqlen_q, seqlen_k,
                              C, DK, DV, ColSum, n_blocks, n_heads, scale, scale2, stride_cb, stride_ch,
                              stride_dkb, stride_dkt, stride_dkh, stride_dvb, stride_dvt, stride_dvh, PruneBound,
                              group, WG: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr,
                              NUM_STAGES: gl.constexpr, PRUNE: gl.constexpr, MMA_SUMS: gl.constexpr,
                              IS_VARLEN: gl.constexpr, HEAD_GROUP: gl.constexpr, SPLIT_LOOPS: gl.constexpr):
    n_heads_q = n_heads * group
    if MMA_SUMS:
        fill_ones(ones_smem, WG, NUM_STAGES, BLOCK_M)
    task = _receive_task(task_smem, task_ready, task_empty, 0)
    j = 1
    it = 0
    kv = 0
    while task < n_tasks:
        pid_n, kv_head, pid_z, zb, tok0, n_q, n_k, n0 = _dkdv_task(task, n_tasks, n_blocks, n_heads, CuSeqlens,
                                                                  seqlen_q, seqlen_k, IS_VARLEN, HEAD_GROUP)
        if n0 < n_k:
            it = _dkdv_consume_task(q_smem, do_smem, k_smem, v_smem, vec_smem, ones_smem, kv_bar, kv_empty,
                                    ready, empty, C, DK, DV, ColSum, zb, tok0, n0, kv_head, pid_z, pid_n,
                                    n_k - n_q, n_q, n_k, n_blocks, n_heads_q, scale, scale2, stride_cb,
                                    stride_ch, stride_dkb, stride_dkt, stride_dkh, stride_dvb, stride_dvt,
                                    stride_dvh, PruneBound, group, kv & 1, it,
                                    WG, HEAD_DIM, BLOCK_M, NUM_STAGES, PRUNE, MMA_SUMS, True,
                                    SPLIT_LOOPS)
            kv += 1
        task = _receive_task(task_smem, task_ready, task_empty, j)
        j += 1


@gluon.jit
def _dkdv_smem(q_desc, do_desc, k_desc, v_desc, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr,
               NUM_STAGES: gl.constexpr, PERSISTENT: gl.constexpr):
    """Shared memory and barriers of a dk/dv CTA: one K / V block, a ring of Q / dO tiles and their query
    vectors, the ones of MMA_SUMS; kv_empty (the consumers release K / V) only where PERSISTENT waits on it.

    No barrier is allocated that no partition uses: the allocator may place a buffer that nothing reads in the
    space of a live one, and a barrier's init there (a generic-proxy write) can land after a TMA load into that
    space. A tree that allocated two unused barriers (b6c60a2, "ping-pong" off) had them on the dq kernel's
    Q / dO buffer in its sm_90a SASS and trained to NaN gradients at the first step (docs/benchmarks.md)."""
    BLOCK_N: gl.constexpr = 2 * WG_ROWS
    dtype: gl.constexpr = q_desc.dtype
    k_smem = gl.allocate_shared_memory(dtype, [1, BLOCK_N, HEAD_DIM], k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [1, BLOCK_N, HEAD_DIM], v_desc.layout)
    q_smem = gl.allocate_shared_memory(dtype, [NUM_STAGES, 1, BLOCK_M, HEAD_DIM], q_desc.layout)
    do_smem = gl.allocate_shared_memory(dtype, [NUM_STAGES, 1, BLOCK_M, HEAD_DIM], do_desc.layout)
    vec_smem = gl.allocate_shared_memory(gl.float32, [N_VEC * NUM_STAGES, BLOCK_M],
                                         gl.SwizzledSharedLayout(1, 1, 1, [0]))
    ones_smem = ones_ring(dtype, 2, NUM_STAGES, BLOCK_M)
    kv_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    if PERSISTENT:
        kv_empty = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    else:
        kv_empty = kv_bar  # a placeholder: one CTA a tile never releases its K / V
    ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(kv_bar, count=1)
    if PERSISTENT:
        mbarrier.init(kv_empty, count=2)
    for i in gl.static_range(NUM_STAGES):
        # ready: the TMA bytes of Q and dO plus the loader's arrival after it stored the vectors.
        mbarrier.init(ready.index(i), count=2)
        mbarrier.init(empty.index(i), count=2)
    return k_smem, v_smem, q_smem, do_smem, vec_smem, ones_smem, kv_bar, kv_empty, ready, empty


@gluon.jit
def _dkdv_one(q_desc, do_desc, k_desc, v_desc, C, Lse, Delta, DK, DV, ColSum, CuSeqlens, PruneBound,
              stride_dkb, stride_dkt, stride_dkh, stride_dvb, stride_dvt, stride_dvh,
              stride_cb, stride_ch, stride_lb, stride_lh, seqlen_q, seqlen_k, scale, scale2, n_blocks, n_heads, group,
              HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, NUM_STAGES: gl.constexpr, IS_VARLEN: gl.constexpr,
              PRUNE: gl.constexpr, CONSUMER_REGS: gl.constexpr, HEAD_GROUP: gl.constexpr, MMA_SUMS: gl.constexpr,
              SPLIT_LOOPS: gl.constexpr):
    """The program's own task."""
    pid_n, kv_head, pid_z, zb, tok0, n_q, n_k, n0 = _dkdv_task(gl.program_id(0), gl.num_programs(0), n_blocks, n_heads,
                                                              CuSeqlens, seqlen_q, seqlen_k, IS_VARLEN, HEAD_GROUP)
    if n0 < n_k:
        off = n_k - n_q
        n_heads_q = n_heads * group
        k_smem, v_smem, q_smem, do_smem, vec_smem, ones_smem, kv_bar, kv_empty, ready, empty = _dkdv_smem(
            q_desc, do_desc, k_desc, v_desc, HEAD_DIM, BLOCK_M, NUM_STAGES, False)
        gl.warp_specialize([
            (_dkdv_loader, (q_desc, do_desc, k_desc, v_desc, C, Lse, Delta, q_smem, do_smem, k_smem, v_smem,
                            vec_smem, kv_bar, ready, empty, zb, tok0, n0, kv_head, pid_z, pid_n, off, n_q, n_k,
                            n_blocks, n_heads_q, stride_cb, stride_ch, stride_lb, stride_lh, PruneBound,
                            group, HEAD_DIM, BLOCK_M, NUM_STAGES, PRUNE)),
            (_dkdv_consumer, (q_smem, do_smem, k_smem, v_smem, vec_smem, ones_smem, kv_bar, kv_empty, ready, empty,
                              C, DK, DV, ColSum, zb, tok0, n0, kv_head, pid_z, pid_n, off, n_q, n_k, n_blocks,
                              n_heads_q, scale, scale2, stride_cb, stride_ch, stride_dkb, stride_dkt, stride_dkh,
                              stride_dvb, stride_dvt, stride_dvh, PruneBound, group,
                              0, HEAD_DIM, BLOCK_M, NUM_STAGES, PRUNE, MMA_SUMS, SPLIT_LOOPS)),
            (_dkdv_consumer, (q_smem, do_smem, k_smem, v_smem, vec_smem, ones_smem, kv_bar, kv_empty, ready, empty,
                              C, DK, DV, ColSum, zb, tok0, n0, kv_head, pid_z, pid_n, off, n_q, n_k, n_blocks,
                              n_heads_q, scale, scale2, stride_cb, stride_ch, stride_dkb, stride_dkt, stride_dkh,
                              stride_dvb, stride_dvt, stride_dvh, PruneBound, group,
                              1, HEAD_DIM, BLOCK_M, NUM_STAGES, PRUNE, MMA_SUMS, SPLIT_LOOPS)),
        ], [4, 4], [CONSUMER_REGS, CONSUMER_REGS])


@gluon.jit
def _dkdv_persistent(q_desc, do_desc, k_desc, v_desc, C, Lse, Delta, DK, DV, ColSum, CuSeqlens, PruneBound, Counter,
                     stride_dkb, stride_dkt, stride_dkh, stride_dvb, stride_dvt, stride_dvh,
                     stride_cb, stride_ch, stride_lb, stride_lh, seqlen_q, seqlen_k, scale, scale2, n_blocks,
                     n_heads, group, n_tasks, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr,
                     NUM_STAGES: gl.constexpr, IS_VARLEN: gl.constexpr, PRUNE: gl.constexpr,
                     CONSUMER_REGS: gl.constexpr, HEAD_GROUP: gl.constexpr, MMA_SUMS: gl.constexpr,
                     SPLIT_LOOPS: gl.constexpr):
    """One CTA an SM: tasks from Counter, their ids passed from the loader to the consumers through task_smem."""
    k_smem, v_smem, q_smem, do_smem, vec_smem, ones_smem, kv_bar, kv_empty, ready, empty = _dkdv_smem(
        q_desc, do_desc, k_desc, v_desc, HEAD_DIM, BLOCK_M, NUM_STAGES, True)
    task_smem, task_ready, task_empty = _task_ring()
    gl.warp_specialize([
        (_dkdv_persistent_loader, (q_desc, do_desc, k_desc, v_desc, C, Lse, Delta, q_smem, do_smem, k_smem, v_smem,
                                   vec_smem, kv_bar, kv_empty, ready, empty, task_smem, task_ready, task_empty,
                                   Counter, n_tasks, CuSeqlens, seqlen_q, seqlen_k, n_blocks, n_heads, stride_cb,
                                   stride_ch, stride_lb, stride_lh, PruneBound, group,
                                   HEAD_DIM, BLOCK_M, NUM_STAGES, PRUNE, IS_VARLEN, HEAD_GROUP)),
        (_dkdv_persistent_consumer, (q_smem, do_smem, k_smem, v_smem, vec_smem, ones_smem, kv_bar, kv_empty, ready,
                                     empty, task_smem, task_ready, task_empty, n_tasks, CuSeqlens, seqlen_q, seqlen_k,
                                     C, DK, DV, ColSum, n_blocks, n_heads, scale, scale2, stride_cb, stride_ch,
                                     stride_dkb, stride_dkt, stride_dkh, stride_dvb, stride_dvt, stride_dvh,
                                     PruneBound, group, 0, HEAD_DIM, BLOCK_M, NUM_STAGES, PRUNE, MMA_SUMS,
                                     IS_VARLEN, HEAD_GROUP, SPLIT_LOOPS)),
        (_dkdv_persistent_consumer, (q_smem, do_smem, k_smem, v_smem, vec_smem, ones_smem, kv_bar, kv_empty, ready,
                                     empty, task_smem, task_ready, task_empty, n_tasks, CuSeqlens, seqlen_q, seqlen_k,
                                     C, DK, DV, ColSum, n_blocks, n_heads, scale, scale2, stride_cb, stride_ch,
                                     stride_dkb, stride_dkt, stride_dkh, stride_dvb, stride_dvt, stride_dvh,
                                     PruneBound, group, 1, HEAD_DIM, BLOCK_M, NUM_STAGES, PRUNE, MMA_SUMS,
                                     IS_VARLEN, HEAD_GROUP, SPLIT_LOOPS)),
    ], [4, 4], [CONSUMER_REGS, CONSUMER_REGS])


@gluon.jit(do_not_specialize=["stride_dkb", "stride_dkt", "stride_dkh", "stride_dvb", "stride_dvt", "stride_dvh",
                              "stride_cb", "stride_ch", "stride_lb", "stride_lh", "seqlen_q", "seqlen_k",
                              "n_blocks", "n_heads", "group", "n_tasks"])
def dkdv_kernel(q_desc, do_desc, k_desc, v_desc, C, Lse, Delta, DK, DV, ColSum, CuSeqlens, PruneBound, Counter,
                stride_dkb, stride_dkt, stride_dkh, stride_dvb, stride_dvt, stride_dvh,
                stride_cb, stride_ch, stride_lb, stride_lh,
                seqlen_q, seqlen_k, scale, scale2, n_blocks, n_heads, group, n_tasks,
                HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr,
                NUM_STAGES: gl.constexpr, IS_VARLEN: gl.constexpr, PRUNE: gl.constexpr,
                CONSUMER_REGS: gl.constexpr, HEAD_GROUP: gl.constexpr, MMA_SUMS: gl.constexpr,
                PERSISTENT: gl.constexpr, EQUAL_LEN: gl.constexpr, SPLIT_LOOPS: gl.constexpr):
    """Tasks: key blocks of 128 x kv heads x sequences (n_tasks), the first key blocks (the heaviest) first; one a
    program, or with PERSISTENT one CTA an SM taking them in turn from the int32 Counter (zero at launch).
    EQUAL_LEN: the launch has seqlen_q == seqlen_k, so the queries' offset into the keys (n_k - n_q) is 0 at
    compile time (BwdConfig.dkdv_equal_len). SPLIT_LOOPS: masked and unmasked query tiles in loops of their own
    (BwdConfig.dkdv_split_loops)."""
    if EQUAL_LEN:
        seqlen_k = seqlen_q
    if PERSISTENT:
        _dkdv_persistent(q_desc, do_desc, k_desc, v_desc, C, Lse, Delta, DK, DV, ColSum, CuSeqlens, PruneBound,
                         Counter, stride_dkb, stride_dkt, stride_dkh, stride_dvb, stride_dvt, stride_dvh,
                         stride_cb, stride_ch, stride_lb, stride_lh, seqlen_q, seqlen_k, scale, scale2, n_blocks,
                         n_heads, group, n_tasks, HEAD_DIM, BLOCK_M, NUM_STAGES, IS_VARLEN, PRUNE, CONSUMER_REGS,
                         HEAD_GROUP, MMA_SUMS, SPLIT_LOOPS)
    else:
        _dkdv_one(q_desc, do_desc, k_desc, v_desc, C, Lse, Delta, DK, DV, ColSum, CuSeqlens, PruneBound,
                  stride_dkb, stride_dkt, stride_dkh, stride_dvb, stride_dvt, stride_dvh,
                  stride_cb, stride_ch, stride_lb, stride_lh, seqlen_q, seqlen_k, scale, scale2, n_blocks,
                  n_heads, group, HEAD_DIM, BLOCK_M, NUM_STAGES, IS_VARLEN, PRUNE, CONSUMER_REGS, HEAD_GROUP,
                  MMA_SUMS, SPLIT_LOOPS)
