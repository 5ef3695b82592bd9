"""Gluon forward kernel of Forgetting Attention for Hopper (sm_90a): TMA, wgmma, warp specialization.

One CTA computes a query tile of 64 rows per consumer warpgroup (two or three) of one (sequence, head), heaviest
causal tiles first. The partitions share a ring of NUM_STAGES shared-memory stages (common.py):

- the consumer warpgroups (4 warps each), each owning 64 query rows: S = Q K^T and O += P V with
  asynchronous wgmma, the online softmax in registers, P fed to the second wgmma from registers.
  Each warpgroup releases a stage on its own, so they drift apart and one's softmax overlaps another's
  matrix products (FA3's ping-pong, without explicit scheduling). With ``OVERLAP`` (D 128) each
  warpgroup also overlaps itself: QK^T of tile i is issued beside PV of tile i - 1 (``_fwd_loop_overlap``);
- one loader warp (common.kv_loader): TMA copies of Q once and of K, V per stage, and the key tile's ``c``.

Scores are in log2 units: ``s = qk * scale * log2(e) + (c_i - c_j) * log2(e)``; on tiles wholly before
the query block (at D 64) the row's ``c_i`` moves into the row maximum (``_tile_softmax``). ``MAX_FREE`` takes no
row maximum at all (fwd_kernel). Rows past the end of a sequence and keys past it come from TMA's zero fill (or
the next packed sequence): keys are cut by the causal mask, and such rows are never stored.
"""
from __future__ import annotations

from .common import (LOG2E, SUM_N, WG_ROWS, fill_ones, key_tiles, kv_loader, kv_ring, ones_ring, query_program,
                     release_stage, row_starts, split_c)
from .compat import gl, gluon, mbarrier, warpgroup_mma, warpgroup_mma_wait

LN2 = gl.constexpr(0.6931471805599453)
# The window of a row's sum under MAX_FREE (fwd_kernel): within it P, l and O stay normal floats far from overflow
# (O <= l max|v|) for any T < 2^31, so the result is the maximum-subtracting kernel's.
FREE_LO = gl.constexpr(2.0 ** -64)
FREE_HI = gl.constexpr(2.0 ** 64)


@gluon.jit
def _masked_scores(qk, c_smem, s, cols, pos_q, cq_hi, cq_lo, scale2, col_l: gl.constexpr):
    """Biased log2-domain logits of a diagonal tile; -inf where a key is after the row."""
    ck_hi = c_smem.index(3 * s + 1).load(col_l)
    ck_lo = c_smem.index(3 * s + 2).load(col_l)
    # Nearby c on either side of a large drop: hi differences are exact, lo restores the rest.
    bias = ((cq_hi[:, None] - ck_hi[None, :]) + (cq_lo[:, None] - ck_lo[None, :])) * LOG2E
    # Mask the logit, not its exponent: a hidden key may carry a large positive bias.
    return gl.where(cols[None, :] <= pos_q[:, None], qk * scale2 + bias, float("-inf"))


@gluon.jit
def _tile_softmax(qk, c_smem, s, masked, cols, pos_q, cq2, cq_hi, cq_lo, scale2, m_i, l_i,
                  dtype: gl.constexpr, p_layout: gl.constexpr, orow_l: gl.constexpr, col_l: gl.constexpr,
                  FOLD_ROW: gl.constexpr):
    """One tile's online-softmax update: P (as wgmma's register A operand), the rescale of O, m, l.

    m stays in the biased domain (lse = m + log2 l). On unmasked tiles the row's c_i is a constant
    that softmax does not see, so the scores there are t = qk * scale2 - c_j (one FMA) and the row
    term joins the per-row maximum: exp2(t - (m - c_i)). That is one ALU operation per score fewer
    than adding the whole bias, with no precision lost: on those tiles c_j - r >= 0 >= c_i - r, so
    |c_j - r| and |m - c_i| never exceed the |c_i - c_j| that the full bias would round at.
    FOLD_ROW = False adds the whole bias (see FwdConfig.fold_row).
    """
    if masked:
        sc = _masked_scores(qk, c_smem, s, cols, pos_q, cq_hi, cq_lo, scale2, col_l)
        m_new = gl.maximum(m_i, gl.max(sc, 1))
        p = gl.exp2(sc - m_new[:, None])
    elif FOLD_ROW:
        ck2 = c_smem.index(3 * s).load(col_l)
        t = qk * scale2 - ck2[None, :]
        m_new = gl.maximum(m_i, gl.max(t, 1) + cq2)
        p = gl.exp2(t - (m_new - cq2)[:, None])
    else:
        ck2 = c_smem.index(3 * s).load(col_l)
        sc = qk * scale2 + (cq2[:, None] - ck2[None, :])
        m_new = gl.maximum(m_i, gl.max(sc, 1))
        p = gl.exp2(sc - m_new[:, None])
    alpha = gl.exp2(m_i - m_new)
    l_i = l_i * alpha + gl.sum(p, 1)
    p16 = gl.convert_layout(p.to(dtype), p_layout)
    return p16, gl.convert_layout(alpha, orow_l), m_new, l_i


@gluon.jit
def _tile_exp(qk, c_smem, s, masked, cols, pos_q, cq2, cq_hi, cq_lo, scale2, col_l: gl.constexpr):
    """MAX_FREE's tile: P = exp2 of the biased logits themselves, with no row maximum taken out (fwd_kernel's
    docstring). Unmasked tiles add the row and key terms as one difference: (c_i - r) <= 0 <= (c_j - r) there, so
    neither term exceeds the |c_i - c_j| the sum rounds at."""
    if masked:
        sc = _masked_scores(qk, c_smem, s, cols, pos_q, cq_hi, cq_lo, scale2, col_l)
    else:
        ck2 = c_smem.index(3 * s).load(col_l)
        sc = qk * scale2 + (cq2[:, None] - ck2[None, :])
    return gl.exp2(sc)


@gluon.jit
def _tile_p(qk, c_smem, s, masked, cols, pos_q, cq2, cq_hi, cq_lo, scale2, m_i, l_i, dtype: gl.constexpr,
            p_layout: gl.constexpr, orow_l: gl.constexpr, col_l: gl.constexpr, FOLD_ROW: gl.constexpr,
            MAX_FREE: gl.constexpr):
    """P of one tile as wgmma's register A operand, with the row state: _tile_softmax's (p16, alpha, m, l), or under
    MAX_FREE _tile_exp's P with its fp32 row sum added to m_i (the lse's; no maximum is kept) and in alpha's place
    (nothing is rescaled), l_i left to the caller's wgmma (_pv)."""
    if MAX_FREE:
        p = _tile_exp(qk, c_smem, s, masked, cols, pos_q, cq2, cq_hi, cq_lo, scale2, col_l)
        m_i = m_i + gl.sum(p, 1)
        p16 = gl.convert_layout(p.to(dtype), p_layout)
        alpha = m_i
    else:
        p16, alpha, m_i, l_i = _tile_softmax(qk, c_smem, s, masked, cols, pos_q, cq2, cq_hi, cq_lo, scale2, m_i, l_i,
                                             dtype, p_layout, orow_l, col_l, FOLD_ROW)
    return p16, alpha, m_i, l_i


@gluon.jit
def _pv(p16, v_t, acc, l_i, ones_smem, s, WG: gl.constexpr, NUM_STAGES: gl.constexpr, MAX_FREE: gl.constexpr):
    """Issue O += P V (and, for MAX_FREE, l += P times ones beside it); returns the tokens to wait."""
    o_tok = warpgroup_mma(p16, v_t, acc, is_async=True)
    sum_tok = o_tok
    if MAX_FREE:
        # The same registers: the A operand's layout does not depend on the product's width.
        sum_a: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=l_i.type.layout, k_width=2)
        ones = ones_smem.index(WG * NUM_STAGES + s).permute((1, 0))
        sum_tok = warpgroup_mma(gl.convert_layout(p16, sum_a), ones, l_i, is_async=True)
    return o_tok, sum_tok


@gluon.jit
def _pv_wait(o_tok, sum_tok, operand, l_i, MAX_FREE: gl.constexpr):
    """Wait for _pv's products, keeping operand (P or V) alive until then: (acc, l)."""
    if MAX_FREE:
        acc, l_i, _ = warpgroup_mma_wait(0, deps=[o_tok, sum_tok, operand])
    else:
        acc, _ = warpgroup_mma_wait(0, deps=[o_tok, operand])
    return acc, l_i


@gluon.jit
def _fwd_tile(acc, m_i, l_i, q_w, k_smem, v_smem, c_smem, ones_smem, k_ready, v_ready, kc_empty, v_empty, zero_qk,
              offs_n, pos_q, cq2, cq_hi, cq_lo, scale2, lo, i, masked, p_layout: gl.constexpr, orow_l: gl.constexpr,
              col_l: gl.constexpr, WG: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr,
              NUM_STAGES: gl.constexpr, FOLD_ROW: gl.constexpr, MAX_FREE: gl.constexpr):
    """Tile i: QK^T, softmax, PV in turn; each wgmma waited at once (the loads still run ahead). masked: a runtime
    flag, or a constant in the split loops (_fwd_loop). MAX_FREE: no maximum, no rescaling of O; l_i is a
    [WG_ROWS, SUM_N] accumulator that P times a matrix of ones adds to beside the PV product, m_i the fp32 row sum."""
    s = i % NUM_STAGES
    ph = (i // NUM_STAGES) & 1
    mbarrier.wait(k_ready.index(s), ph)
    k_t = k_smem.index(s).reshape([BLOCK_N, HEAD_DIM]).permute((1, 0))
    tok = warpgroup_mma(q_w, k_t, zero_qk, use_acc=False, is_async=True)
    qk, _, _ = warpgroup_mma_wait(0, deps=[tok, q_w, k_t])
    p16, alpha, m_i, l_i = _tile_p(qk, c_smem, s, masked, lo + i * BLOCK_N + offs_n, pos_q, cq2, cq_hi, cq_lo, scale2,
                                   m_i, l_i, q_w.dtype, p_layout, orow_l, col_l, FOLD_ROW, MAX_FREE)
    release_stage(kc_empty.index(s))
    if not MAX_FREE:
        acc = acc * alpha[:, None]
    v_t = v_smem.index(s).reshape([BLOCK_N, HEAD_DIM])
    mbarrier.wait(v_ready.index(s), ph)
    o_tok, sum_tok = _pv(p16, v_t, acc, l_i, ones_smem, s, WG, NUM_STAGES, MAX_FREE)
    acc, l_i = _pv_wait(o_tok, sum_tok, v_t, l_i, MAX_FREE)
    release_stage(v_empty.index(s))
    return acc, m_i, l_i


@gluon.jit
def _fwd_loop(acc, m_i, l_i, q_w, k_smem, v_smem, c_smem, ones_smem, k_ready, v_ready, kc_empty, v_empty,
              zero_qk, offs_n, pos_q, cq2, cq_hi, cq_lo, scale2, lo, n_tiles, n_unmasked, WG: gl.constexpr,
              HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, NUM_STAGES: gl.constexpr, FOLD_ROW: gl.constexpr,
              SPLIT_LOOPS: gl.constexpr, MAX_FREE: gl.constexpr):
    """The tiles one after another (_fwd_tile). SPLIT_LOOPS: the unmasked tiles [0, n_unmasked) and the masked rest
    in loops of their own, each tile's path known at compile time (FwdConfig.split_loops)."""
    col_l: gl.constexpr = gl.SliceLayout(0, zero_qk.type.layout)
    orow_l: gl.constexpr = gl.SliceLayout(1, acc.type.layout)
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc.type.layout, k_width=2)
    if SPLIT_LOOPS:
        for i in range(n_unmasked):
            acc, m_i, l_i = _fwd_tile(acc, m_i, l_i, q_w, k_smem, v_smem, c_smem, ones_smem, k_ready, v_ready,
                                      kc_empty, v_empty, zero_qk, offs_n, pos_q, cq2, cq_hi, cq_lo, scale2, lo, i,
                                      False, p_layout, orow_l, col_l, WG, HEAD_DIM, BLOCK_N, NUM_STAGES, FOLD_ROW,
                                      MAX_FREE)
        for i in range(n_unmasked, n_tiles):
            acc, m_i, l_i = _fwd_tile(acc, m_i, l_i, q_w, k_smem, v_smem, c_smem, ones_smem, k_ready, v_ready,
                                      kc_empty, v_empty, zero_qk, offs_n, pos_q, cq2, cq_hi, cq_lo, scale2, lo, i,
                                      True, p_layout, orow_l, col_l, WG, HEAD_DIM, BLOCK_N, NUM_STAGES, FOLD_ROW,
                                      MAX_FREE)
    else:
        for i in range(n_tiles):
            acc, m_i, l_i = _fwd_tile(acc, m_i, l_i, q_w, k_smem, v_smem, c_smem, ones_smem, k_ready, v_ready,
                                      kc_empty, v_empty, zero_qk, offs_n, pos_q, cq2, cq_hi, cq_lo, scale2, lo, i,
                                      i >= n_unmasked, p_layout, orow_l, col_l, WG, HEAD_DIM, BLOCK_N, NUM_STAGES,
                                      FOLD_ROW, MAX_FREE)
    return acc, m_i, l_i


@gluon.jit
def _fwd_loop_overlap(acc, m_i, l_i, q_w, k_smem, v_smem, c_smem, ones_smem, k_ready, v_ready, kc_empty, v_empty,
                      zero_qk, offs_n, pos_q, cq2, cq_hi, cq_lo, scale2, lo, n_tiles, n_unmasked, WG: gl.constexpr,
                      HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, NUM_STAGES: gl.constexpr,
                      FOLD_ROW: gl.constexpr, MAX_FREE: gl.constexpr):
    """FA3's intra-warpgroup overlap: QK^T of tile i is issued beside PV of tile i - 1, and tile i's softmax
    runs while that PV is on the tensor cores. P of tile i - 1 stays in registers until its PV is waited."""
    col_l: gl.constexpr = gl.SliceLayout(0, zero_qk.type.layout)
    orow_l: gl.constexpr = gl.SliceLayout(1, acc.type.layout)
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc.type.layout, k_width=2)
    dtype: gl.constexpr = q_w.dtype
    mbarrier.wait(k_ready.index(0), 0)
    k_t = k_smem.index(0).reshape([BLOCK_N, HEAD_DIM]).permute((1, 0))
    tok = warpgroup_mma(q_w, k_t, zero_qk, use_acc=False, is_async=True)
    qk = warpgroup_mma_wait(0, deps=[tok])
    # acc is zero: tile 0's rescale factor is not needed
    p16, _, m_i, l_i = _tile_p(qk, c_smem, 0, 0 >= n_unmasked, lo + offs_n, pos_q, cq2, cq_hi, cq_lo, scale2, m_i,
                               l_i, dtype, p_layout, orow_l, col_l, FOLD_ROW, MAX_FREE)
    release_stage(kc_empty.index(0))
    for i in range(1, n_tiles):
        s = i % NUM_STAGES
        sp = (i - 1) % NUM_STAGES
        mbarrier.wait(k_ready.index(s), (i // NUM_STAGES) & 1)
        k_t = k_smem.index(s).reshape([BLOCK_N, HEAD_DIM]).permute((1, 0))
        s_tok = warpgroup_mma(q_w, k_t, zero_qk, use_acc=False, is_async=True)
        v_t = v_smem.index(sp).reshape([BLOCK_N, HEAD_DIM])
        mbarrier.wait(v_ready.index(sp), ((i - 1) // NUM_STAGES) & 1)
        o_tok, sum_tok = _pv(p16, v_t, acc, l_i, ones_smem, sp, WG, NUM_STAGES, MAX_FREE)
        qk = warpgroup_mma_wait(1, deps=[s_tok])
        p_next, alpha, m_i, l_i = _tile_p(qk, c_smem, s, i >= n_unmasked, lo + i * BLOCK_N + offs_n, pos_q, cq2,
                                          cq_hi, cq_lo, scale2, m_i, l_i, dtype, p_layout, orow_l, col_l, FOLD_ROW,
                                          MAX_FREE)
        release_stage(kc_empty.index(s))
        acc, l_i = _pv_wait(o_tok, sum_tok, p16, l_i, MAX_FREE)
        release_stage(v_empty.index(sp))
        if not MAX_FREE:
            acc = acc * alpha[:, None]
        p16 = p_next
    sp = (n_tiles - 1) % NUM_STAGES
    v_t = v_smem.index(sp).reshape([BLOCK_N, HEAD_DIM])
    mbarrier.wait(v_ready.index(sp), ((n_tiles - 1) // NUM_STAGES) & 1)
    o_tok, sum_tok = _pv(p16, v_t, acc, l_i, ones_smem, sp, WG, NUM_STAGES, MAX_FREE)
    acc, l_i = _pv_wait(o_tok, sum_tok, p16, l_i, MAX_FREE)
    release_stage(v_empty.index(sp))
    return acc, m_i, l_i


@gluon.jit
def _fwd_consumer(q_smem, k_smem, v_smem, c_smem, ones_smem, q_bar, k_ready, v_ready, kc_empty, v_empty,
                  C, Out, Lse, zb, tok0, head, m0, off, n_q, c_base, r, lo, n_tiles, scale2,
                  stride_ob, stride_ot, stride_oh, stride_lb, stride_lh,
                  WG: gl.constexpr, NUM_WG: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr,
                  NUM_STAGES: gl.constexpr, FOLD_ROW: gl.constexpr, OVERLAP: gl.constexpr,
                  SPLIT_LOOPS: gl.constexpr, MAX_FREE: gl.constexpr):
    qk_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                         instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, HEAD_DIM, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    row_l: gl.constexpr = gl.SliceLayout(1, qk_layout)
    col_l: gl.constexpr = gl.SliceLayout(0, qk_layout)
    orow_l: gl.constexpr = gl.SliceLayout(1, o_layout)
    dtype: gl.constexpr = q_smem.dtype

    q_w = q_smem.index(WG).reshape([WG_ROWS, HEAD_DIM])
    m0w = m0 + WG * WG_ROWS
    rows = m0w + gl.arange(0, WG_ROWS, layout=row_l)
    row_ok = rows < n_q
    pos_q = off + rows
    cq_hi, cq_lo = split_c(gl.load(C + c_base + pos_q, mask=row_ok, other=r), r)
    cq2 = cq_hi * LOG2E
    # Tiles before n_unmasked lie wholly at or before this warpgroup's first row: no mask needed.
    n_unmasked = gl.minimum(gl.maximum(off + m0w + 1 - lo, 0) // BLOCK_N, n_tiles)

    m_i = gl.full([WG_ROWS], 0.0 if MAX_FREE else float("-inf"), gl.float32, row_l)
    l_i = gl.zeros([WG_ROWS], gl.float32, row_l)
    acc = gl.zeros([WG_ROWS, HEAD_DIM], gl.float32, o_layout)
    zero_qk = gl.zeros([WG_ROWS, BLOCK_N], gl.float32, qk_layout)
    offs_n = gl.arange(0, BLOCK_N, layout=col_l)
    if MAX_FREE:
        sum_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                              instr_shape=[16, SUM_N, 16])
        fill_ones(ones_smem, WG, NUM_STAGES, BLOCK_N)
        l_i = gl.zeros([WG_ROWS, SUM_N], gl.float32, sum_layout)

    mbarrier.wait(q_bar, 0)
    if OVERLAP:
        acc, m_i, l_i = _fwd_loop_overlap(acc, m_i, l_i, q_w, k_smem, v_smem, c_smem, ones_smem, k_ready, v_ready,
                                          kc_empty, v_empty, zero_qk, offs_n, pos_q, cq2, cq_hi, cq_lo, scale2, lo,
                                          n_tiles, n_unmasked, WG, HEAD_DIM, BLOCK_N, NUM_STAGES, FOLD_ROW, MAX_FREE)
    else:
        acc, m_i, l_i = _fwd_loop(acc, m_i, l_i, q_w, k_smem, v_smem, c_smem, ones_smem, k_ready, v_ready,
                                  kc_empty, v_empty, zero_qk, offs_n, pos_q, cq2, cq_hi, cq_lo, scale2, lo, n_tiles,
                                  n_unmasked, WG, HEAD_DIM, BLOCK_N, NUM_STAGES, FOLD_ROW, SPLIT_LOOPS, MAX_FREE)
    if MAX_FREE:
        # Two sums of P: O divides by the sum of the bf16 P it summed (the wgmma's; its SUM_N columns hold the same
        # sum, so their mean is exact), the lse is that of the fp32 P (m_i). With no row maximum no P is exactly 1,
        # and either sum alone fails a row of one dominant key by up to 2^-9: the fp32 one in O (the backward's
        # delta = dO . O then misses dP, dq 150% off at gates of -30), the bf16 one in lse (dv 0.4% off; GPU tests,
        # thirty-sixth session).
        l_i = gl.convert_layout(gl.sum(l_i, 1) * (1.0 / SUM_N), row_l)
        # A row whose sum left the window gets a NaN lse, which the REDO launch finds and computes again.
        lse2 = gl.where((m_i >= FREE_LO) & (m_i <= FREE_HI), gl.log2(m_i), float("nan"))
    else:
        lse2 = m_i + gl.log2(l_i)
    # Every real row saw its own key, so l_i > 0; padded rows are finite and never stored.
    o = acc / gl.convert_layout(l_i, orow_l)[:, None]
    out_l: gl.constexpr = gl.BlockedLayout([1, 8], [32 // (HEAD_DIM // 8), HEAD_DIM // 8], [4, 1], [1, 0])
    o_st = gl.convert_layout(o.to(dtype), out_l)
    rows_o = m0w + gl.arange(0, WG_ROWS, layout=gl.SliceLayout(1, out_l))
    cols_o = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, out_l))
    o_ptrs = Out + row_starts(zb, tok0 + rows_o, head, stride_ob, stride_ot, stride_oh) + cols_o[None, :]
    gl.store(o_ptrs, o_st, mask=(rows_o < n_q)[:, None])
    lse = lse2 * LN2
    gl.store(Lse + zb.to(gl.int64) * stride_lb + head * stride_lh + tok0 + rows, lse, mask=row_ok)


# Integers that reach a partition must stay runtime values: Triton would turn a 1 into a constant.
@gluon.jit(do_not_specialize=["stride_ob", "stride_ot", "stride_oh", "stride_cb", "stride_ch", "stride_lb",
                              "stride_lh", "seqlen_q", "seqlen_k", "n_blocks", "n_heads", "group"])
def fwd_kernel(q_desc, k_desc, v_desc, C, Out, Lse, CuSeqlens, PruneBound,
               stride_ob, stride_ot, stride_oh, stride_cb, stride_ch, stride_lb, stride_lh,
               seqlen_q, seqlen_k, scale2, n_blocks, n_heads, group,
               HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, NUM_WG: gl.constexpr,
               NUM_STAGES: gl.constexpr, IS_VARLEN: gl.constexpr, PRUNE: gl.constexpr,
               CONSUMER_REGS: gl.constexpr, FOLD_ROW: gl.constexpr, OVERLAP: gl.constexpr,
               SPLIT_LOOPS: gl.constexpr, HEAD_GROUP: gl.constexpr, MAX_FREE: gl.constexpr, REDO: gl.constexpr):
    """One query tile (module docstring). MAX_FREE: softmax without a row maximum. The scores exp2 takes are then the
    biased logits themselves (log2 units, c_i - c_j included), so a row's sum l is 2^(its lse): while l lies in
    [FREE_LO, FREE_HI] its largest P (>= l / T) is a normal float and P, l and O stay far from overflowing, and the
    result is that of the maximum-subtracting kernel. Rows outside get a NaN lse; REDO (the regular kernel, launched
    after) skips every tile whose rows' lse holds no NaN and computes the others again, overwriting out and lse."""
    BLOCK_M: gl.constexpr = NUM_WG * WG_ROWS
    head, pid_z, pid_m, zb, tok0, n_q, n_k, m0 = query_program(n_blocks, n_heads, CuSeqlens, seqlen_q, seqlen_k,
                                                               BLOCK_M, IS_VARLEN, HEAD_GROUP)
    todo = m0 < n_q
    if REDO:
        rows_l: gl.constexpr = gl.BlockedLayout([1], [32], [gl.num_warps()], [0])
        n_nan = m0 * 0
        for w in gl.static_range(NUM_WG):
            rows = m0 + w * WG_ROWS + gl.arange(0, WG_ROWS, layout=rows_l)
            lse = gl.load(Lse + zb.to(gl.int64) * stride_lb + head * stride_lh + tok0 + rows, mask=rows < n_q,
                          other=0.0)
            n_nan += gl.sum((lse != lse).to(gl.int32), 0)
        todo = todo & (n_nan > 0)
    if todo:
        off, c_base, r, lo, n_tiles = key_tiles(C, PruneBound, zb, tok0, head, pid_z, pid_m, m0, n_q, n_k, n_blocks,
                                                n_heads, stride_cb, stride_ch, BLOCK_M, BLOCK_N, PRUNE)
        q_smem, k_smem, v_smem, c_smem, q_bar, k_ready, v_ready, kc_empty, v_empty = kv_ring(
            q_desc, k_desc, NUM_WG, BLOCK_N, HEAD_DIM, NUM_STAGES)
        if MAX_FREE:
            ones_smem = ones_ring(q_desc.dtype, NUM_WG, NUM_STAGES, BLOCK_N)
        else:
            ones_smem = c_smem  # a placeholder no partition reads
        kv_head = head // group
        if NUM_WG == 3:
            gl.warp_specialize([
                (kv_loader, (q_desc, q_desc, k_desc, v_desc, C, q_smem, q_smem, k_smem, v_smem, c_smem,
                             q_bar, k_ready, v_ready, kc_empty, v_empty,
                             zb, tok0 + m0, tok0, head * HEAD_DIM, kv_head * HEAD_DIM, c_base, r, lo, n_tiles,
                             n_k, BLOCK_N, NUM_STAGES, NUM_WG, False)),
                (_fwd_consumer, (q_smem, k_smem, v_smem, c_smem, ones_smem, q_bar, k_ready, v_ready, kc_empty, v_empty,
                                 C, Out, Lse, zb, tok0, head, m0, off, n_q, c_base, r, lo, n_tiles, scale2,
                                 stride_ob, stride_ot, stride_oh, stride_lb, stride_lh,
                                 0, NUM_WG, HEAD_DIM, BLOCK_N, NUM_STAGES, FOLD_ROW, OVERLAP, SPLIT_LOOPS, MAX_FREE)),
                (_fwd_consumer, (q_smem, k_smem, v_smem, c_smem, ones_smem, q_bar, k_ready, v_ready, kc_empty, v_empty,
                                 C, Out, Lse, zb, tok0, head, m0, off, n_q, c_base, r, lo, n_tiles, scale2,
                                 stride_ob, stride_ot, stride_oh, stride_lb, stride_lh,
                                 1, NUM_WG, HEAD_DIM, BLOCK_N, NUM_STAGES, FOLD_ROW, OVERLAP, SPLIT_LOOPS, MAX_FREE)),
                (_fwd_consumer, (q_smem, k_smem, v_smem, c_smem, ones_smem, q_bar, k_ready, v_ready, kc_empty, v_empty,
                                 C, Out, Lse, zb, tok0, head, m0, off, n_q, c_base, r, lo, n_tiles, scale2,
                                 stride_ob, stride_ot, stride_oh, stride_lb, stride_lh,
                                 2, NUM_WG, HEAD_DIM, BLOCK_N, NUM_STAGES, FOLD_ROW, OVERLAP, SPLIT_LOOPS, MAX_FREE)),
            ], [4, 4, 4], [CONSUMER_REGS, CONSUMER_REGS, CONSUMER_REGS])
        else:
            gl.warp_specialize([
                (kv_loader, (q_desc, q_desc, k_desc, v_desc, C, q_smem, q_smem, k_smem, v_smem, c_smem,
                             q_bar, k_ready, v_ready, kc_empty, v_empty,
                             zb, tok0 + m0, tok0, head * HEAD_DIM, kv_head * HEAD_DIM, c_base, r, lo, n_tiles,
                             n_k, BLOCK_N, NUM_STAGES, NUM_WG, False)),
                (_fwd_consumer, (q_smem, k_smem, v_smem, c_smem, ones_smem, q_bar, k_ready, v_ready, kc_empty, v_empty,
                                 C, Out, Lse, zb, tok0, head, m0, off, n_q, c_base, r, lo, n_tiles, scale2,
                                 stride_ob, stride_ot, stride_oh, stride_lb, stride_lh,
                                 0, NUM_WG, HEAD_DIM, BLOCK_N, NUM_STAGES, FOLD_ROW, OVERLAP, SPLIT_LOOPS, MAX_FREE)),
                (_fwd_consumer, (q_smem, k_smem, v_smem, c_smem, ones_smem, q_bar, k_ready, v_ready, kc_empty, v_empty,
                                 C, Out, Lse, zb, tok0, head, m0, off, n_q, c_base, r, lo, n_tiles, scale2,
                                 stride_ob, stride_ot, stride_oh, stride_lb, stride_lh,
                                 1, NUM_WG, HEAD_DIM, BLOCK_N, NUM_STAGES, FOLD_ROW, OVERLAP, SPLIT_LOOPS, MAX_FREE)),
            ], [4, 4], [CONSUMER_REGS, CONSUMER_REGS])
