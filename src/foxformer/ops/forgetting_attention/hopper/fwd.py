"""Gluon forward kernel of Forgetting Attention for Hopper (sm_90a): TMA, wgmma, warp specialization.

One CTA computes a BLOCK_M = 128-row query tile of one (sequence, head), heaviest causal tiles first.
Three partitions share a ring of NUM_STAGES shared-memory stages:

- two consumer warpgroups (4 warps each), each owning 64 query rows: S = Q K^T and O += P V with
  asynchronous wgmma, the online softmax in registers, P fed to the second wgmma from registers.
  Each warpgroup releases a stage on its own, so the two drift apart and one's softmax overlaps the
  other's matrix products (FA3's ping-pong, without explicit scheduling). With ``OVERLAP`` (D 128) each
  warpgroup also overlaps itself: QK^T of tile i is issued beside PV of tile i - 1 (``_fwd_loop_overlap``);
- one loader warp: TMA copies of Q once and of K, V per stage, and the key tile's ``c``.

The bias needs ``c_k - r`` per key, with ``r = c[first query]`` a float64 reference per CTA (fwd.py
in the parent folder explains the precision scheme). Loading float64 ``c_k`` in the consumers put
global-load latency and float64 arithmetic on their critical path (the probe in shared/hopper lost
30-35% to it); here the loader warp loads ``c_k`` one tile ahead, forms ``c_k - r`` in float64 and
stores it to shared memory as float32 ``hi * log2(e)`` (unmasked tiles) and ``hi``, ``lo`` (diagonal
tiles, where nearby pairs need the exact split). The consumers read 32 floats per thread per tile.

Scores are in log2 units: ``s = qk * scale * log2(e) + (c_i - c_j) * log2(e)``; on tiles wholly before
the query block (at D 64) the row's ``c_i`` moves into the row maximum (``_tile_softmax``). Rows past the end
of a sequence and keys past it come from TMA's zero fill (or the next packed sequence): keys are
cut by the causal mask, and such rows are never stored.
"""
from __future__ import annotations

from .compat import (
    fence_async_shared,
    gl,
    gluon,
    mbarrier,
    thread_barrier,
    tma_load,
    warpgroup_mma,
    warpgroup_mma_wait,
)

LOG2E = gl.constexpr(1.4426950408889634)
LN2 = gl.constexpr(0.6931471805599453)
# Query rows per consumer warpgroup: wgmma's M.
WG_ROWS = gl.constexpr(64)
# The window of a row's sum under MAX_FREE (fwd_kernel): within it P, l and O stay normal floats far from overflow
# (O <= l max|v|) for any T < 2^31, so the result is the maximum-subtracting kernel's.
FREE_LO = gl.constexpr(2.0 ** -64)
FREE_HI = gl.constexpr(2.0 ** 64)

# Width of the ones operand that sums P (forward) or dS (backward) by wgmma (MMA_SUMS): the narrowest wgmma there is.
SUM_N = gl.constexpr(8)


@gluon.jit
def fill_ones(ones_smem, WG: gl.constexpr, NUM_STAGES: gl.constexpr, K: gl.constexpr):
    """This warpgroup's [SUM_N, K] ones, one copy per stage, written by the generic proxy and fenced for wgmma's
    (async) reads. A copy per stage: its address then moves with the stage as the other operand's does, so the
    wgmma descriptors are formed in the loop (uniform registers); one loop-invariant copy kept its 8 descriptors in
    16 vector registers, and the dk/dv kernel at D 64 spilled 248 bytes instead of 152 (sm_90a, Triton 3.6)."""
    fill_l: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [1, 4], [1, 0])
    for st in gl.static_range(NUM_STAGES):
        ones_smem.index(WG * NUM_STAGES + st).store(gl.full([SUM_N, K], 1.0, ones_smem.dtype, fill_l))
    fence_async_shared()
    thread_barrier()


@gluon.jit
def ones_ring(dtype: gl.constexpr, NUM_WG: gl.constexpr, NUM_STAGES: gl.constexpr, K: gl.constexpr):
    """[NUM_STAGES * NUM_WG, SUM_N, K]: the ones of fill_ones."""
    return gl.allocate_shared_memory(dtype, [NUM_STAGES * NUM_WG, SUM_N, K],
                                     gl.NVMMASharedLayout.get_default_for([SUM_N, K], dtype))


@gluon.jit
def row_starts(zb, tokens, head, stride_b, stride_t, stride_h):
    """[rows, 1] int64 element offsets of rows ``tokens`` of ``head`` in batch entry ``zb`` of a [B, T, H, D]
    tensor packed like the outputs, in a form the compiler knows to be a multiple of 8 elements (the launcher
    passes only such strides: ``launch.packed_strides``). The kernels keep their integer arguments out of
    Triton's specialization (a stride of 1 would become a constant, which a partition cannot take), and that drops
    the strides' divisibility too: without it every 16-byte piece of a row moves as eight 2-byte accesses (Nsight
    Compute on the H200: 7 of every 8 sectors of the output stores excess; docs/benchmarks.md, "Where the rest
    is"). ``(x // 8) * 8`` is x here and carries the divisibility, where Triton 3.6 keeps neither ``multiple_of``
    nor ``assume`` on a scalar argument. The row offsets are rounded, not the strides: rounded strides were hoisted
    out of the persistent dk/dv kernel's task loop and cost its tile loop 12 instructions and 40 bytes of spills."""
    start = zb.to(gl.int64) * stride_b + tokens.to(gl.int64) * stride_t + head * stride_h
    return ((start // 8) * 8)[:, None]


@gluon.jit
def sequence_of(pid_z, CuSeqlens, seqlen_q, seqlen_k, IS_VARLEN: gl.constexpr):
    """(batch index, first token, query length, key length) of sequence pid_z (dense batch or packed)."""
    if IS_VARLEN:
        start = gl.load(CuSeqlens + pid_z)
        n_q = gl.load(CuSeqlens + pid_z + 1) - start
        n_k = n_q
        tok0 = start
        zb = pid_z * 0
    else:
        n_q = seqlen_q
        n_k = seqlen_k
        tok0 = pid_z * 0
        zb = pid_z
    return zb, tok0, n_q, n_k


@gluon.jit
def split_c(x, r):
    """float64 c minus the float64 reference r as float32 hi + lo (hi + lo == x - r to ~48 bits)."""
    d = x - r
    hi = d.to(gl.float32)
    lo = (d - hi.to(gl.float64)).to(gl.float32)
    return hi, lo


@gluon.jit
def heaviest_first(n_blocks, n_heads, HEAD_GROUP: gl.constexpr):
    """(tile, head, sequence) of this program; tile 0 is a head's heaviest. Launch order: groups of HEAD_GROUP
    (sequence, head) pairs in turn, and within a group the heaviest tiles of all its pairs, then the next lighter.

    The GPU starts programs in launch order as SMs free up. With one pair a group the last pair's heavy tiles
    start last and run alone: a list-scheduling model puts that tail at ~2% of the D 64 forward at 16K.
    Interleaving a few pairs shortens it while the programs running at once still share the K and V of a few
    heads in L2 (4, the default, took the D 64 forward from 4.35 to 3.98-4.05 ms in the thirteenth session);
    interleaving all pairs lost 3-11% (twelfth session)."""
    return launch_order(gl.program_id(0), gl.num_programs(0), n_blocks, n_heads, HEAD_GROUP)


@gluon.jit
def launch_order(pid, n_programs, n_blocks, n_heads, HEAD_GROUP: gl.constexpr):
    """heaviest_first's (tile, head, sequence) of the pid-th of n_programs tasks (persistent kernels take their
    tasks in this order)."""
    n_zh = n_programs // n_blocks
    zh0 = pid // (HEAD_GROUP * n_blocks) * HEAD_GROUP
    size = gl.minimum(n_zh - zh0, HEAD_GROUP)
    local = pid - zh0 * n_blocks
    zh = zh0 + local % size
    return local // size, zh % n_heads, zh // n_heads


@gluon.jit
def query_program(n_blocks, n_heads, CuSeqlens, seqlen_q, seqlen_k, BLOCK_M: gl.constexpr,
                  IS_VARLEN: gl.constexpr, HEAD_GROUP: gl.constexpr):
    """(query head, sequence, query tile, batch index, first token, query and key lengths, first row) of a
    query-stationary program. Tiles run heaviest (last) first: causal work grows with the tile index."""
    return query_task(gl.program_id(0), gl.num_programs(0), n_blocks, n_heads, CuSeqlens, seqlen_q, seqlen_k, BLOCK_M,
                      IS_VARLEN, HEAD_GROUP)


@gluon.jit
def query_task(task, n_tasks, n_blocks, n_heads, CuSeqlens, seqlen_q, seqlen_k, BLOCK_M: gl.constexpr,
               IS_VARLEN: gl.constexpr, HEAD_GROUP: gl.constexpr):
    """query_program's values for the task-th of n_tasks in the launch order (persistent kernels)."""
    tile, head, pid_z = launch_order(task, n_tasks, n_blocks, n_heads, HEAD_GROUP)
    pid_m = n_blocks - 1 - tile
    zb, tok0, n_q, n_k = sequence_of(pid_z, CuSeqlens, seqlen_q, seqlen_k, IS_VARLEN)
    return head, pid_z, pid_m, zb, tok0, n_q, n_k, pid_m * BLOCK_M


@gluon.jit
def key_tiles(C, PruneBound, zb, tok0, head, pid_z, pid_m, m0, n_q, n_k, n_blocks, n_heads, stride_cb, stride_ch,
              BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, PRUNE: gl.constexpr):
    """(Tk - Tq, the offset of this head's c, the float64 reference r = c[first query], the first key and
    the number of key tiles) of a query tile starting at row m0 < n_q."""
    off = n_k - n_q
    c_base = zb.to(gl.int64) * stride_cb + head.to(gl.int64) * stride_ch + tok0
    r = gl.load(C + c_base + off + m0)
    lo = m0 * 0
    if PRUNE:
        # PruneBound: [n_z, Hq, n_blocks], the first key (a multiple of BLOCK_N) this tile keeps.
        lo = gl.load(PruneBound + (pid_z * n_heads + head) * n_blocks + pid_m)
    n_tiles = gl.cdiv(gl.minimum(n_k, off + m0 + BLOCK_M) - lo, BLOCK_N)
    return off, c_base, r, lo, n_tiles


@gluon.jit
def kv_ring(q_desc, k_desc, NUM_WG: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr,
            NUM_STAGES: gl.constexpr):
    """Shared memory and barriers of a query-stationary CTA: each consumer's Q rows (a second buffer of
    the same shape serves dO), and a ring of K, V and c stages."""
    dtype: gl.constexpr = q_desc.dtype
    q_smem = gl.allocate_shared_memory(dtype, [NUM_WG, 1, WG_ROWS, HEAD_DIM], q_desc.layout)
    k_smem = gl.allocate_shared_memory(dtype, [NUM_STAGES, 1, BLOCK_N, HEAD_DIM], k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [NUM_STAGES, 1, BLOCK_N, HEAD_DIM], k_desc.layout)
    c_smem = gl.allocate_shared_memory(gl.float32, [3 * NUM_STAGES, BLOCK_N], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    kc_empty = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    v_empty = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for i in gl.static_range(NUM_STAGES):
        # k_ready completes on the TMA bytes plus the loader's arrival after it stored c.
        mbarrier.init(k_ready.index(i), count=2)
        mbarrier.init(v_ready.index(i), count=1)
        # Every consumer warpgroup releases every stage.
        mbarrier.init(kc_empty.index(i), count=NUM_WG)
        mbarrier.init(v_empty.index(i), count=NUM_WG)
    return q_smem, k_smem, v_smem, c_smem, q_bar, k_ready, v_ready, kc_empty, v_empty


@gluon.jit
def kv_loader(q_desc, do_desc, k_desc, v_desc, C, q_smem, do_smem, k_smem, v_smem, c_smem,
              q_bar, k_ready, v_ready, kc_empty, v_empty,
              zb, q_t0, kv_t0, q_col, kv_col, c_base, r, lo, n_tiles, n_k,
              BLOCK_N: gl.constexpr, NUM_STAGES: gl.constexpr, NUM_WG: gl.constexpr, HAS_DO: gl.constexpr,
              q_empty=None, q_phase=0, it0=0, PERSISTENT: gl.constexpr = False):
    """The loader warpgroup of the query-stationary kernels (forward, dq): each consumer's 64 rows of Q
    (and dO) once, then per stage a K tile, a V tile and the key tile's c relative to r (see the module
    docstring). PERSISTENT: one task of several, whose Q waits for q_empty's phase q_phase (the consumers
    done with the last task's) and whose tiles take the ring from position it0."""
    c_layout: gl.constexpr = gl.BlockedLayout([1], [32], [gl.num_warps()], [0])
    offs = gl.arange(0, BLOCK_N, layout=c_layout)

    if PERSISTENT:
        mbarrier.wait(q_empty, q_phase)
    if HAS_DO:
        mbarrier.expect(q_bar, NUM_WG * (q_desc.block_type.nbytes + do_desc.block_type.nbytes))
    else:
        mbarrier.expect(q_bar, NUM_WG * q_desc.block_type.nbytes)
    for w in gl.static_range(NUM_WG):
        tma_load(q_desc, [zb, q_t0 + w * WG_ROWS, q_col], q_bar, q_smem.index(w))
        if HAS_DO:
            tma_load(do_desc, [zb, q_t0 + w * WG_ROWS, q_col], q_bar, do_smem.index(w))
    # c of the next tile is loaded one iteration ahead, so its latency hides behind the waits.
    x = gl.load(C + c_base + lo + offs, mask=lo + offs < n_k, other=r)
    for i in range(n_tiles):
        s = (it0 + i) % NUM_STAGES
        ph = ((it0 + i) // NUM_STAGES) & 1
        n0 = lo + i * BLOCK_N
        # Empty barriers start in phase 0: waiting for phase 1 passes on each stage's first use.
        mbarrier.wait(kc_empty.index(s), ph ^ 1)
        mbarrier.expect(k_ready.index(s), k_desc.block_type.nbytes)
        tma_load(k_desc, [zb, kv_t0 + n0, kv_col], k_ready.index(s), k_smem.index(s))
        nxt = n0 + BLOCK_N + offs
        x_next = gl.load(C + c_base + nxt, mask=nxt < n_k, other=r)
        hi, lo_part = split_c(x, r)
        c_smem.index(3 * s).store(hi * LOG2E)
        c_smem.index(3 * s + 1).store(hi)
        c_smem.index(3 * s + 2).store(lo_part)
        thread_barrier()
        mbarrier.arrive(k_ready.index(s), count=1)
        mbarrier.wait(v_empty.index(s), ph ^ 1)
        mbarrier.expect(v_ready.index(s), v_desc.block_type.nbytes)
        tma_load(v_desc, [zb, kv_t0 + n0, kv_col], v_ready.index(s), v_smem.index(s))
        x = x_next


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
def release_stage(bar):
    """Arrive on bar once the whole warpgroup is done with the stage (the arrive is one thread's)."""
    thread_barrier()
    mbarrier.arrive(bar, count=1)


@gluon.jit
def _tile_p(qk, c_smem, s, masked, cols, pos_q, cq2, cq_hi, cq_lo, scale2, m_i, l_i, dtype: gl.constexpr,
            p_layout: gl.constexpr, orow_l: gl.constexpr, col_l: gl.constexpr, FOLD_ROW: gl.constexpr,
            MAX_FREE: gl.constexpr, MMA_SUMS: gl.constexpr):
    """P of one tile as wgmma's register A operand, with the row state: _tile_softmax's (p16, alpha, m, l), or under
    MAX_FREE _tile_exp's P with l summed here (MMA_SUMS: by the caller's wgmma), m unchanged and in alpha's place
    (nothing is rescaled)."""
    if MAX_FREE:
        p = _tile_exp(qk, c_smem, s, masked, cols, pos_q, cq2, cq_hi, cq_lo, scale2, col_l)
        if not MMA_SUMS:
            l_i = l_i + gl.sum(p, 1)
        p16 = gl.convert_layout(p.to(dtype), p_layout)
        alpha = m_i
    else:
        p16, alpha, m_i, l_i = _tile_softmax(qk, c_smem, s, masked, cols, pos_q, cq2, cq_hi, cq_lo, scale2, m_i, l_i,
                                             dtype, p_layout, orow_l, col_l, FOLD_ROW)
    return p16, alpha, m_i, l_i


@gluon.jit
def _pv(p16, v_t, acc, l_i, ones_smem, s, WG: gl.constexpr, NUM_STAGES: gl.constexpr, MAX_FREE: gl.constexpr,
        MMA_SUMS: gl.constexpr):
    """Issue O += P V (and, for MAX_FREE with MMA_SUMS, l += P times ones beside it); returns the tokens to wait."""
    o_tok = warpgroup_mma(p16, v_t, acc, is_async=True)
    sum_tok = o_tok
    if MAX_FREE and MMA_SUMS:
        # The same registers: the A operand's layout does not depend on the product's width.
        sum_a: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=l_i.type.layout, k_width=2)
        ones = ones_smem.index(WG * NUM_STAGES + s).permute((1, 0))
        sum_tok = warpgroup_mma(gl.convert_layout(p16, sum_a), ones, l_i, is_async=True)
    return o_tok, sum_tok


@gluon.jit
def _pv_wait(o_tok, sum_tok, operand, l_i, MAX_FREE: gl.constexpr, MMA_SUMS: gl.constexpr):
    """Wait for _pv's products, keeping operand (P or V) alive until then: (acc, l)."""
    if MAX_FREE and MMA_SUMS:
        acc, l_i, _ = warpgroup_mma_wait(0, deps=[o_tok, sum_tok, operand])
    else:
        acc, _ = warpgroup_mma_wait(0, deps=[o_tok, operand])
    return acc, l_i


@gluon.jit
def _fwd_tile(acc, m_i, l_i, q_w, k_smem, v_smem, c_smem, ones_smem, k_ready, v_ready, kc_empty, v_empty, zero_qk,
              offs_n, pos_q, cq2, cq_hi, cq_lo, scale2, lo, i, masked, p_layout: gl.constexpr, orow_l: gl.constexpr,
              col_l: gl.constexpr, WG: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr,
              NUM_STAGES: gl.constexpr, FOLD_ROW: gl.constexpr, MAX_FREE: gl.constexpr, MMA_SUMS: gl.constexpr):
    """Tile i: QK^T, softmax, PV in turn; each wgmma waited at once (the loads still run ahead). masked: a runtime
    flag, or a constant in the split loops (_fwd_loop). MAX_FREE: no maximum, no rescaling of O; with MMA_SUMS l_i is
    a [WG_ROWS, SUM_N] accumulator that P times a matrix of ones adds to beside the PV product."""
    s = i % NUM_STAGES
    ph = (i // NUM_STAGES) & 1
    mbarrier.wait(k_ready.index(s), ph)
    k_t = k_smem.index(s).reshape([BLOCK_N, HEAD_DIM]).permute((1, 0))
    tok = warpgroup_mma(q_w, k_t, zero_qk, use_acc=False, is_async=True)
    qk, _, _ = warpgroup_mma_wait(0, deps=[tok, q_w, k_t])
    p16, alpha, m_i, l_i = _tile_p(qk, c_smem, s, masked, lo + i * BLOCK_N + offs_n, pos_q, cq2, cq_hi, cq_lo, scale2,
                                   m_i, l_i, q_w.dtype, p_layout, orow_l, col_l, FOLD_ROW, MAX_FREE, MMA_SUMS)
    release_stage(kc_empty.index(s))
    if not MAX_FREE:
        acc = acc * alpha[:, None]
    v_t = v_smem.index(s).reshape([BLOCK_N, HEAD_DIM])
    mbarrier.wait(v_ready.index(s), ph)
    o_tok, sum_tok = _pv(p16, v_t, acc, l_i, ones_smem, s, WG, NUM_STAGES, MAX_FREE, MMA_SUMS)
    acc, l_i = _pv_wait(o_tok, sum_tok, v_t, l_i, MAX_FREE, MMA_SUMS)
    release_stage(v_empty.index(s))
    return acc, m_i, l_i


@gluon.jit
def _fwd_loop(acc, m_i, l_i, q_w, k_smem, v_smem, c_smem, ones_smem, k_ready, v_ready, kc_empty, v_empty,
              zero_qk, offs_n, pos_q, cq2, cq_hi, cq_lo, scale2, lo, n_tiles, n_unmasked, WG: gl.constexpr,
              HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, NUM_STAGES: gl.constexpr, FOLD_ROW: gl.constexpr,
              SPLIT_LOOPS: gl.constexpr, MAX_FREE: gl.constexpr, MMA_SUMS: gl.constexpr):
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
                                      MAX_FREE, MMA_SUMS)
        for i in range(n_unmasked, n_tiles):
            acc, m_i, l_i = _fwd_tile(acc, m_i, l_i, q_w, k_smem, v_smem, c_smem, ones_smem, k_ready, v_ready,
                                      kc_empty, v_empty, zero_qk, offs_n, pos_q, cq2, cq_hi, cq_lo, scale2, lo, i,
                                      True, p_layout, orow_l, col_l, WG, HEAD_DIM, BLOCK_N, NUM_STAGES, FOLD_ROW,
                                      MAX_FREE, MMA_SUMS)
    else:
        for i in range(n_tiles):
            acc, m_i, l_i = _fwd_tile(acc, m_i, l_i, q_w, k_smem, v_smem, c_smem, ones_smem, k_ready, v_ready,
                                      kc_empty, v_empty, zero_qk, offs_n, pos_q, cq2, cq_hi, cq_lo, scale2, lo, i,
                                      i >= n_unmasked, p_layout, orow_l, col_l, WG, HEAD_DIM, BLOCK_N, NUM_STAGES,
                                      FOLD_ROW, MAX_FREE, MMA_SUMS)
    return acc, m_i, l_i


@gluon.jit
def _fwd_loop_overlap(acc, m_i, l_i, q_w, k_smem, v_smem, c_smem, ones_smem, k_ready, v_ready, kc_empty, v_empty,
                      zero_qk, offs_n, pos_q, cq2, cq_hi, cq_lo, scale2, lo, n_tiles, n_unmasked, WG: gl.constexpr,
                      HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, NUM_STAGES: gl.constexpr,
                      FOLD_ROW: gl.constexpr, MAX_FREE: gl.constexpr, MMA_SUMS: gl.constexpr):
    """FA3's intra-warpgroup overlap: QK^T of tile i is issued beside PV of tile i - 1, and tile i's softmax
    runs while that PV is on the tensor cores. P of tile i - 1 stays in registers until its PV is waited."""
    col_l: gl.constexpr = gl.SliceLayout(0, zero_qk.type.layout)
    orow_l: gl.constexpr = gl.SliceLayout(1, acc.type.layout)
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc.type.layout, k_width=2)
    # PV and, with MMA_SUMS, its row sums are in flight while QK^T is waited for
    N_PV: gl.constexpr = 2 if MAX_FREE and MMA_SUMS else 1
    dtype: gl.constexpr = q_w.dtype
    mbarrier.wait(k_ready.index(0), 0)
    k_t = k_smem.index(0).reshape([BLOCK_N, HEAD_DIM]).permute((1, 0))
    tok = warpgroup_mma(q_w, k_t, zero_qk, use_acc=False, is_async=True)
    qk = warpgroup_mma_wait(0, deps=[tok])
    # acc is zero: tile 0's rescale factor is not needed
    p16, _, m_i, l_i = _tile_p(qk, c_smem, 0, 0 >= n_unmasked, lo + offs_n, pos_q, cq2, cq_hi, cq_lo, scale2, m_i,
                               l_i, dtype, p_layout, orow_l, col_l, FOLD_ROW, MAX_FREE, MMA_SUMS)
    release_stage(kc_empty.index(0))
    for i in range(1, n_tiles):
        s = i % NUM_STAGES
        sp = (i - 1) % NUM_STAGES
        mbarrier.wait(k_ready.index(s), (i // NUM_STAGES) & 1)
        k_t = k_smem.index(s).reshape([BLOCK_N, HEAD_DIM]).permute((1, 0))
        s_tok = warpgroup_mma(q_w, k_t, zero_qk, use_acc=False, is_async=True)
        v_t = v_smem.index(sp).reshape([BLOCK_N, HEAD_DIM])
        mbarrier.wait(v_ready.index(sp), ((i - 1) // NUM_STAGES) & 1)
        o_tok, sum_tok = _pv(p16, v_t, acc, l_i, ones_smem, sp, WG, NUM_STAGES, MAX_FREE, MMA_SUMS)
        qk = warpgroup_mma_wait(N_PV, deps=[s_tok])
        p_next, alpha, m_i, l_i = _tile_p(qk, c_smem, s, i >= n_unmasked, lo + i * BLOCK_N + offs_n, pos_q, cq2,
                                          cq_hi, cq_lo, scale2, m_i, l_i, dtype, p_layout, orow_l, col_l, FOLD_ROW,
                                          MAX_FREE, MMA_SUMS)
        release_stage(kc_empty.index(s))
        acc, l_i = _pv_wait(o_tok, sum_tok, p16, l_i, MAX_FREE, MMA_SUMS)
        release_stage(v_empty.index(sp))
        if not MAX_FREE:
            acc = acc * alpha[:, None]
        p16 = p_next
    sp = (n_tiles - 1) % NUM_STAGES
    v_t = v_smem.index(sp).reshape([BLOCK_N, HEAD_DIM])
    mbarrier.wait(v_ready.index(sp), ((n_tiles - 1) // NUM_STAGES) & 1)
    o_tok, sum_tok = _pv(p16, v_t, acc, l_i, ones_smem, sp, WG, NUM_STAGES, MAX_FREE, MMA_SUMS)
    acc, l_i = _pv_wait(o_tok, sum_tok, p16, l_i, MAX_FREE, MMA_SUMS)
    release_stage(v_empty.index(sp))
    return acc, m_i, l_i


@gluon.jit
def _fwd_consumer(q_smem, k_smem, v_smem, c_smem, ones_smem, q_bar, k_ready, v_ready, kc_empty, v_empty,
                  C, Out, Lse, zb, tok0, head, m0, off, n_q, c_base, r, lo, n_tiles, scale2,
                  stride_ob, stride_ot, stride_oh, stride_lb, stride_lh,
                  WG: gl.constexpr, NUM_WG: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr,
                  NUM_STAGES: gl.constexpr, FOLD_ROW: gl.constexpr, OVERLAP: gl.constexpr,
                  SPLIT_LOOPS: gl.constexpr, MAX_FREE: gl.constexpr, MMA_SUMS: gl.constexpr):
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

    m_i = gl.full([WG_ROWS], float("-inf"), gl.float32, row_l)
    l_i = gl.zeros([WG_ROWS], gl.float32, row_l)
    acc = gl.zeros([WG_ROWS, HEAD_DIM], gl.float32, o_layout)
    zero_qk = gl.zeros([WG_ROWS, BLOCK_N], gl.float32, qk_layout)
    offs_n = gl.arange(0, BLOCK_N, layout=col_l)
    if MAX_FREE and MMA_SUMS:
        sum_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                              instr_shape=[16, SUM_N, 16])
        fill_ones(ones_smem, WG, NUM_STAGES, BLOCK_N)
        l_i = gl.zeros([WG_ROWS, SUM_N], gl.float32, sum_layout)

    mbarrier.wait(q_bar, 0)
    if OVERLAP:
        acc, m_i, l_i = _fwd_loop_overlap(acc, m_i, l_i, q_w, k_smem, v_smem, c_smem, ones_smem, k_ready, v_ready,
                                          kc_empty, v_empty, zero_qk, offs_n, pos_q, cq2, cq_hi, cq_lo, scale2, lo,
                                          n_tiles, n_unmasked, WG, HEAD_DIM, BLOCK_N, NUM_STAGES, FOLD_ROW, MAX_FREE,
                                          MMA_SUMS)
    else:
        acc, m_i, l_i = _fwd_loop(acc, m_i, l_i, q_w, k_smem, v_smem, c_smem, ones_smem, k_ready, v_ready,
                                  kc_empty, v_empty, zero_qk, offs_n, pos_q, cq2, cq_hi, cq_lo, scale2, lo, n_tiles,
                                  n_unmasked, WG, HEAD_DIM, BLOCK_N, NUM_STAGES, FOLD_ROW, SPLIT_LOOPS, MAX_FREE,
                                  MMA_SUMS)
    if MAX_FREE:
        if MMA_SUMS:
            # The SUM_N columns hold the same sum: their mean is exact.
            l_i = gl.convert_layout(gl.sum(l_i, 1) * (1.0 / SUM_N), row_l)
        # A row whose sum left the window gets a NaN lse, which the REDO launch finds and computes again.
        lse2 = gl.where((l_i >= FREE_LO) & (l_i <= FREE_HI), gl.log2(l_i), float("nan"))
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
               SPLIT_LOOPS: gl.constexpr, HEAD_GROUP: gl.constexpr, MAX_FREE: gl.constexpr,
               MMA_SUMS: gl.constexpr, REDO: gl.constexpr):
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
        if MAX_FREE and MMA_SUMS:
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
                                 0, NUM_WG, HEAD_DIM, BLOCK_N, NUM_STAGES, FOLD_ROW, OVERLAP, SPLIT_LOOPS, MAX_FREE,
                                 MMA_SUMS)),
                (_fwd_consumer, (q_smem, k_smem, v_smem, c_smem, ones_smem, q_bar, k_ready, v_ready, kc_empty, v_empty,
                                 C, Out, Lse, zb, tok0, head, m0, off, n_q, c_base, r, lo, n_tiles, scale2,
                                 stride_ob, stride_ot, stride_oh, stride_lb, stride_lh,
                                 1, NUM_WG, HEAD_DIM, BLOCK_N, NUM_STAGES, FOLD_ROW, OVERLAP, SPLIT_LOOPS, MAX_FREE,
                                 MMA_SUMS)),
                (_fwd_consumer, (q_smem, k_smem, v_smem, c_smem, ones_smem, q_bar, k_ready, v_ready, kc_empty, v_empty,
                                 C, Out, Lse, zb, tok0, head, m0, off, n_q, c_base, r, lo, n_tiles, scale2,
                                 stride_ob, stride_ot, stride_oh, stride_lb, stride_lh,
                                 2, NUM_WG, HEAD_DIM, BLOCK_N, NUM_STAGES, FOLD_ROW, OVERLAP, SPLIT_LOOPS, MAX_FREE,
                                 MMA_SUMS)),
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
                                 0, NUM_WG, HEAD_DIM, BLOCK_N, NUM_STAGES, FOLD_ROW, OVERLAP, SPLIT_LOOPS, MAX_FREE,
                                 MMA_SUMS)),
                (_fwd_consumer, (q_smem, k_smem, v_smem, c_smem, ones_smem, q_bar, k_ready, v_ready, kc_empty, v_empty,
                                 C, Out, Lse, zb, tok0, head, m0, off, n_q, c_base, r, lo, n_tiles, scale2,
                                 stride_ob, stride_ot, stride_oh, stride_lb, stride_lh,
                                 1, NUM_WG, HEAD_DIM, BLOCK_N, NUM_STAGES, FOLD_ROW, OVERLAP, SPLIT_LOOPS, MAX_FREE,
                                 MMA_SUMS)),
            ], [4, 4], [CONSUMER_REGS, CONSUMER_REGS])
