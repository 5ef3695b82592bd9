"""What the Pro block's kernels share: tile sizes, row indexing, the compute dtype and the weight gradient's reduction.

Each program takes BLOCK_T rows of one head: a [BLOCK_T, D] tile of a [B, T, H, D] tensor whose rows (b, t) may
lie at any strides (the model's q, k, v and gate are views of one joint product), each row of D contiguous.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ..forgetting_attn.tiles import LAUNCH_OPTIONS



@dataclass(frozen=True)
class Tile:
    """One pass's launch: ``elements`` of a program's [BLOCK_T, BLOCK_D] tile and its warps; ``heads_inner``
    numbers the programs head-fastest, so that those running at once read the same rows' heads (adjacent in
    memory) rather than one head's rows (a head's D elements every H * D). ``gather_next`` (shift_bwd with a shift
    only) takes the backward's next-row norm gradients from the program's own tile (shift's gather kernel) instead
    of recomputing them."""
    elements: int = 4096
    num_warps: int = 4
    heads_inner: bool = False
    gather_next: bool = False


# One entry per kernel and pass, the fastest of 1K-16K elements x 1-8 warps at FoX (Pro) 125M's four calls at 16K
# on an H100 (`python scripts/tune_pro_ops.py`, docs/bench/pro_ops_tune_fbff5a5_h100.json): 2K x 4 for both
# shift passes (k's backward 0.262 ms against 0.460 at the first guess, 4K x 4), 1K x 2 for gate's forward, 2K x 4
# for its backward (0.267 against 0.323). Larger tiles with few warps ran up to 20x slower. Each pass's best tile of a
# later sweep, and heads_inner, timed level with these in the model's step (docs/bench/ab_pro_tiles_fce6a94_h100.json).
# gather_next (the shift's backward computing each row's norm gradient once) from `python scripts/tune_pro_ops.py
# --layout separate` on an H100 (forty-ninth session, docs/bench/pro_ops_tune_separate_d8f1741_h100.json): k's
# backward 0.254 ms against 0.291 at 2K x 4 (77 registers against 128 and 8 bytes of spills, sm_90a), v's 0.174
# against 0.175. In the model's step it is below the noise (0.3087 s a step with it and Inductor's
# realize_reads_threshold at 8, 0.3089 with neither: docs/bench/model_125m_*_d8f1741_h100.json).
TILES = {"shift_fwd": Tile(2048, 4), "shift_bwd": Tile(2048, 4, gather_next=True), "gate_fwd": Tile(1024, 2),
         "gate_bwd": Tile(2048, 4)}


def block_sizes(D: int, kernel: str) -> tuple[int, int, int, bool]:
    """(BLOCK_T, BLOCK_D, num_warps, heads_inner) of a head dim D for one of TILES' kernels."""
    tile_ = TILES[kernel]
    block_d = triton.next_power_of_2(D)
    return max(1, tile_.elements // block_d), block_d, tile_.num_warps, tile_.heads_inner


def grid(n_rows: int, heads: int, block_t: int, heads_inner: bool) -> tuple[int, ...]:
    """One axis of row blocks x heads, head-fastest, or two (row blocks, heads): see Tile.heads_inner."""
    blocks = triton.cdiv(n_rows, block_t)
    return (blocks * heads,) if heads_inner else (blocks, heads)


def last_dim_contiguous(x: torch.Tensor) -> torch.Tensor:
    """The kernels read rows at any strides but each row's D elements contiguous."""
    return x if x.stride(-1) == 1 else x.contiguous()


def reduce_partials(partials: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """The weight gradient from per-program sums [programs, H, D]: a deterministic torch reduction instead of
    atomics, summed over heads too for a weight [D] shared by all heads."""
    dims = (0,) if weight.dim() == 2 else (0, 1)
    return partials.sum(dims).to(weight.dtype)


def partials_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


@triton.jit
def up(x, F64: tl.constexpr):
    """x in the compute dtype: fp32, fp64 for fp64 inputs."""
    if F64:
        y = x.to(tl.float64)
    else:
        y = x.to(tl.float32)
    return y


@triton.jit
def program(H, HEADS_INNER: tl.constexpr):
    """(row block, head) of this program, in grid's numbering."""
    if HEADS_INNER:
        pid = tl.program_id(0)
        blk = pid // H
        h = pid % H
    else:
        blk = tl.program_id(0)
        h = tl.program_id(1)
    return blk, h


@triton.jit
def tile(blk, T, n_rows, D, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr):
    """Row block blk's tile: its rows (flat b * T + t, b, t, in range; int64 [BLOCK_T]) and columns (d, in range)."""
    n = blk.to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    d = tl.arange(0, BLOCK_D)
    return n, n // T, n % T, n < n_rows, d, d < D


@triton.jit
def sigmoid(z):
    return 1.0 / (1.0 + tl.exp(-z))


@triton.jit
def rstd(u, D, eps):
    """1 / RMS of each row of u [BLOCK_T, BLOCK_D] (padding columns are zeros), [BLOCK_T]."""
    return 1.0 / tl.sqrt(tl.sum(u * u, axis=1) / D + eps)


@triton.jit
def rms_norm_grad(u, r, gw, D):
    """The gradient of u through ``u * r`` (r = rstd(u)), given ``gw``: the output's gradient times the weight."""
    return r[:, None] * gw - u * (r * r * r * tl.sum(gw * u, axis=1) / D)[:, None]


__all__ = ["LAUNCH_OPTIONS", "TILES", "Tile", "block_sizes", "grid", "last_dim_contiguous", "partials_dtype",
           "program", "reduce_partials", "rms_norm_grad", "rstd", "sigmoid", "tile", "up"]
