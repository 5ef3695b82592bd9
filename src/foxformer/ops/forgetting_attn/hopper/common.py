"""What the Gluon Hopper kernels share: which tile a program computes, the ring of K / V / c stages and the loader
warp that fills it, the stage releases and the ones operand of the sums by wgmma.

Query-stationary kernels (the forward, dq) hold one query tile per CTA and stream key tiles through a ring of
NUM_STAGES shared-memory stages; one loader warp issues the TMA copies of Q (and dO) once and of K, V per stage,
and stages each key tile's ``c`` beside them. The bias needs ``c_k - r`` per key, with ``r = c[first query]`` a
float64 reference per CTA (fwd.py in the parent folder explains the precision scheme). Loading float64 ``c_k`` in
the consumers put global-load latency and float64 arithmetic on their critical path (the probe in shared/hopper
lost 30-35% to it); the loader loads ``c_k`` one tile ahead, forms ``c_k - r`` in float64 and stores it to shared
memory as float32 ``hi * log2(e)`` (unmasked tiles) and ``hi``, ``lo`` (diagonal tiles, where nearby pairs need
the exact split). The consumers read 32 floats per thread per tile.
"""
from __future__ import annotations

from .compat import fence_async_shared, gl, gluon, mbarrier, thread_barrier, tma_load

LOG2E = gl.constexpr(1.4426950408889634)
# Query rows per consumer warpgroup: wgmma's M.
WG_ROWS = gl.constexpr(64)
# Width of the ones operand that sums P (forward, MAX_FREE) or dS (backward, MMA_SUMS) by wgmma: the narrowest wgmma there is.
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
def release_stage(bar):
    """Arrive on bar once the whole warpgroup is done with the stage (the arrive is one thread's)."""
    thread_barrier()
    mbarrier.arrive(bar, count=1)
