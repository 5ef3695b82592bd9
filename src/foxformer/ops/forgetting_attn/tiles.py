"""Tile ranges of the Forgetting Attention kernels: which rows and keys a program visits.

``seq_bounds`` maps a program to its sequence (dense batch or packed varlen). With pruning,
``tile_bounds`` runs one small search kernel per launch and the attention kernels load its result:
the first key block a query block keeps (forward, dq), or the first query tile a key block skips
(dk/dv); ``query_key_range`` turns that into the loop bounds of the query-stationary kernels.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


# A tile is skipped iff c[its first query] - c[its last key] <= delta (pruning.py). c never increases,
# so along one axis the skipped tiles form a prefix (keys) or a suffix (queries). The boundary is found
# by a SEARCH_WIDTH-ary search: each round loads SEARCH_WIDTH probes of c at once and keeps the one
# group where the predicate flips, so 64K tokens (1024 blocks) take 2 dependent rounds of loads, where
# a binary search took 10 (about 1 us of load latency per round per program on an H200, 2026-11-29).
SEARCH_WIDTH = tl.constexpr(64)


@triton.jit
def first_true(c_ptr, step, ref, delta, n, KEEP_ABOVE: tl.constexpr, WIDTH: tl.constexpr):
    """Smallest i in [0, n] whose x = c_ptr[i * step] satisfies the predicate (n: none does), for a
    predicate false then true along i: ``ref - x > delta`` (KEEP_ABOVE) or else ``x - ref <= delta``."""
    offs = tl.arange(0, WIDTH)
    lo = n * 0
    hi = n
    while lo < hi:
        group = (hi - lo + WIDTH - 1) // WIDTH
        probe = lo + (offs + 1) * group - 1          # the last index of each group
        valid = probe < hi
        x = tl.load(c_ptr + probe * step, mask=valid, other=0.0)
        if KEEP_ABOVE:
            pred = ref - x > delta
        else:
            pred = x - ref <= delta
        n_false = tl.sum((valid & (pred == 0)).to(tl.int32), axis=0)   # false probes come first
        hi = tl.minimum(hi, lo + (n_false + 1) * group - 1)
        lo = lo + n_false * group
    return lo


@triton.jit
def first_kept_key_block(c_base, c_query, delta, last, BLOCK_N: tl.constexpr):
    """Smallest key block b in [0, last] with c_query - c[b * BLOCK_N + BLOCK_N - 1] > delta
    (block `last` holds the query itself and is always kept)."""
    return first_true(c_base + (BLOCK_N - 1), BLOCK_N, c_query, delta, last, True, SEARCH_WIDTH)


@triton.jit
def first_pruned_query_tile(c_base, c_key, delta, start, n_tiles, BLOCK_M: tl.constexpr):
    """Smallest t in [0, n_tiles] such that the query tile at position start + t * BLOCK_M has
    c[start + t * BLOCK_M] - c_key <= delta (n_tiles: no tile is pruned)."""
    return first_true(c_base + start, BLOCK_M, c_key, delta, n_tiles, False, SEARCH_WIDTH)


# Every CUDA grid axis but the first stops at 65535, which query tiles (T = 4M at 64 rows), batch entries
# or packed sequences, and batch * heads all pass at realistic sizes: the kernels take one flat axis.
MAX_GRID = 2**31 - 1


# Options of every kernel launch of this package. FMA contraction (a * b + c in one instruction) is what the
# kernels were tuned and their test tolerances set with; Triton 3.9 applies it by default but warns that 3.10
# will not, which would cost the issue-bound attention loops an instruction per score. Asked for explicitly.
LAUNCH_OPTIONS = dict(enable_fp_fusion=True)


def launch_grid(n_blocks: int, n_heads: int, n_z: int) -> tuple[int]:
    """The grid of a launch of n_blocks x n_heads x n_z programs (see program_ids)."""
    n = n_blocks * n_heads * n_z
    if n > MAX_GRID:
        raise ValueError(f"{n_blocks} blocks x {n_heads} heads x {n_z} sequences = {n} programs is more "
                         f"than one launch takes ({MAX_GRID})")
    return (n,)


@triton.jit
def program_ids(n_blocks, n_heads):
    """(block, head, sequence) of a program of a launch_grid launch; the block varies fastest."""
    pid = tl.program_id(0)
    rest = pid // n_blocks
    return pid % n_blocks, rest % n_heads, rest // n_heads


@triton.jit
def seq_bounds(CuSeqlens, pid_z, seqlen_q, seqlen_k, IS_VARLEN: tl.constexpr):
    """(batch index, first token, query length, key length) of sequence pid_z, as int64 offsets."""
    if IS_VARLEN:
        start = tl.load(CuSeqlens + pid_z)
        n_q = tl.load(CuSeqlens + pid_z + 1) - start
        n_k = n_q
        tok0 = start.to(tl.int64)
        zb = tok0 * 0
    else:
        n_q = seqlen_q
        n_k = seqlen_k
        zb = pid_z.to(tl.int64)
        tok0 = zb * 0
    return zb, tok0, n_q, n_k


@triton.jit
def query_key_range(PruneBound, slot, p_first, n_k,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PRUNE: tl.constexpr):
    """Key range [lo, hi) of a query-stationary program; pruning raises lo past the key blocks this query
    block may skip (tile_bounds found them, at PruneBound[slot]). Tiles in [lo, mid) lie entirely at or
    before p_first: visible to every row, no mask."""
    lo = 0
    if PRUNE:
        lo = tl.multiple_of(tl.load(PruneBound + slot), BLOCK_N)  # tile_bounds returns block starts
    hi = tl.minimum(n_k, p_first + BLOCK_M)
    mid = lo + (tl.maximum(p_first + 1 - lo, 0) // BLOCK_N) * BLOCK_N
    return lo, mid, hi


# The searches run in a kernel of their own, once per (block, head, sequence), and the attention
# kernels load one integer. With the searches inside the attention kernels, pruning with gates that
# prune nothing made the backward 3% to 9% slower (H200, 2026-11-29, `gpu_bench.sh prunegiven`): a
# data-dependent while loop in front of the main loops, though it ran only two rounds.
@triton.jit
def _tile_bounds_kernel(C, PruneDelta, CuSeqlens, Bound, stride_cb, stride_ch, seqlen_q, seqlen_k,
                        n_blocks, n_heads,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, KEY_STATIONARY: tl.constexpr,
                        IS_VARLEN: tl.constexpr):
    pid, head, pid_z = program_ids(n_blocks, n_heads)
    zb, tok0, n_q, n_k = seq_bounds(CuSeqlens, pid_z, seqlen_q, seqlen_k, IS_VARLEN)
    off = n_k - n_q
    c_base = C + zb * stride_cb + head * stride_ch + tok0
    delta = tl.load(PruneDelta + zb * n_heads + head)  # [B, Hq]; B == 1 (zb == 0) with varlen
    out = Bound + tl.program_id(0)  # [n_z, Hq, n_blocks]: the launch's program order
    if KEY_STATIONARY:
        # dk/dv: query tiles from the returned row on have c[first query] - c[last key] <= delta
        n0 = pid * BLOCK_N
        if n0 < n_k:
            i_lo = tl.maximum(n0 - off, 0)
            r = tl.load(c_base + tl.minimum(n0 + BLOCK_N, n_k) - 1)
            n_tiles = tl.cdiv(tl.maximum(n_q - i_lo, 0), BLOCK_M)
            tl.store(out, i_lo + first_pruned_query_tile(c_base, r, delta, off + i_lo, n_tiles, BLOCK_M) * BLOCK_M)
    else:
        # forward, dq: the first key (a multiple of BLOCK_N) a query block keeps
        m0 = pid * BLOCK_M
        if m0 < n_q:
            p_first = off + m0
            r = tl.load(c_base + p_first)
            tl.store(out, first_kept_key_block(c_base, r, delta, p_first // BLOCK_N, BLOCK_N) * BLOCK_N)


def tile_bounds(c: torch.Tensor, prune_delta: torch.Tensor, cu: torch.Tensor, varlen: bool, n_z: int,
                seqlen_q: int, seqlen_k: int, n_blocks: int, block_m: int, block_n: int,
                key_stationary: bool) -> torch.Tensor:
    """Where each program of an attention launch of n_blocks x Hq x n_z programs starts or stops skipping
    tiles, int32 [n_z, Hq, n_blocks]. Query-stationary (forward, dq): the first kept key. Key-stationary
    (dk/dv, grid over query heads here): the first pruned query row. c float64 [B, Hq, Tk] contiguous."""
    Hq = c.shape[1]
    bound = torch.empty((n_z, Hq, n_blocks), dtype=torch.int32, device=c.device)
    _tile_bounds_kernel[launch_grid(n_blocks, Hq, n_z)](
        c, prune_delta, cu, bound, c.stride(0), c.stride(1), seqlen_q, seqlen_k, n_blocks, Hq,
        BLOCK_M=block_m, BLOCK_N=block_n, KEY_STATIONARY=key_stationary, IS_VARLEN=varlen, num_warps=2,
        **LAUNCH_OPTIONS,
    )
    return bound
