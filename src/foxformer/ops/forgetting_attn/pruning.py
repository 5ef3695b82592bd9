"""Adaptive computation pruning: which (query block, key block) tiles can be skipped.

Maths (README.md here): with U >= max |scale * q_i . k_j| over a (batch, head) and N the most keys
a row can see, every pair with ``c[p_i] - c[j] <= delta``, ``delta = log(eps) - 2U - log(N)``,
carries probability at most eps / N, so a row loses at most eps in total. c never increases, so a
tile's largest ``c[p_i] - c[j]`` sits at its first query and last key, and the test on those two
values is conservative for every pair of the tile.

Every backend (three Triton kernels, the chunked torch backend) applies that test at its own
granularity; each decision is conservative on its own, so they never need to agree tile by tile.
threshold.py computes delta (the only new kernel input) and checks the arguments without Triton; this
module adds the Triton pass over the norms of q and k that an "auto" bound takes on CUDA, and the
statistics users tune eps with.
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from .. import gpu
from . import threshold
from .checks import (check_common, check_gate_values, check_heads_tensor, check_one_device, check_qk_shapes,
                     check_softmax_scale)
from .cumsum import gate_cumsum_heads_first
from .threshold import check_pruning, max_row_norms
from .tiles import LAUNCH_OPTIONS, launch_grid, program_ids


@triton.jit
def _max_sq_norm_kernel(X, Out, T, stride_b, stride_t, stride_h, n_blocks, n_heads,
                        D: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr):
    pid_t, head, b = program_ids(n_blocks, n_heads)
    rows = pid_t * BLOCK_T + tl.arange(0, BLOCK_T)
    offs_d = tl.arange(0, BLOCK_D)
    ptrs = X + b.to(tl.int64) * stride_b + rows.to(tl.int64)[:, None] * stride_t + head * stride_h + offs_d[None, :]
    x = tl.load(ptrs, mask=(rows[:, None] < T) & (offs_d[None, :] < D), other=0.0).to(tl.float32)
    # squares are >= 0, so the float max is also the max of their bit patterns as int32
    tl.atomic_max(Out + b * n_heads + head, tl.max(tl.sum(x * x, 1), 0).to(tl.int32, bitcast=True))


@torch.library.custom_op("foxformer::max_sq_row_norms", mutates_args=())
def max_sq_row_norms(x: torch.Tensor) -> torch.Tensor:
    """max_t ||x[b, t, h]||^2 in fp32, [B, H], for x [B, T, H, D] (Triton: one read of x)."""
    B, T, H, D = x.shape
    out = torch.zeros((B, H), dtype=torch.int32, device=x.device)
    if out.numel() and T:
        # Untuned: the whole pass over q and k (32K tokens x 24 heads x 64) costs about 0.09 ms, the gap
        # between the auto and given-bound forward rows of `gpu_bench.sh prune` / `prunegiven` (16e2708).
        block_t = 64
        n_blocks = triton.cdiv(T, block_t)
        with gpu.gpu_of(x):
            _max_sq_norm_kernel[launch_grid(n_blocks, H, B)](
                x, out, T, x.stride(0), x.stride(1), x.stride(2), n_blocks, H,
                D=D, BLOCK_T=block_t, BLOCK_D=triton.next_power_of_2(D), num_warps=4, **LAUNCH_OPTIONS)
    return out.view(torch.float32)


@max_sq_row_norms.register_fake
def _max_sq_row_norms_fake(x):
    return x.new_empty((x.shape[0], x.shape[2]), dtype=torch.float32)


def _max_row_norms(x: torch.Tensor) -> torch.Tensor:
    """max_t ||x[b, t, h]|| per (batch, head), float64 [B, H]."""
    if (x.is_cuda or os.environ.get("TRITON_INTERPRET", "0") == "1") and x.stride(-1) == 1:
        # The torch ops of threshold.max_row_norms ran at about a fifth of memory bandwidth (0.4 ms for q and k
        # of 32K tokens x 24 heads x 64 on an H200, 2026-11-29), a 4-7% overhead for pruning on short
        # sequences; squares summed in fp32 are at least as exact as a norm in the input dtype.
        return max_sq_row_norms(x).double().sqrt()
    return max_row_norms(x)


def auto_qk_bound(q: torch.Tensor, k: torch.Tensor, scale: float | None) -> torch.Tensor:
    """U = scale * max_i ||q_i|| * max_j ||k_j|| per (batch, query head): float64 [B, Hq].

    q [B, Tq, Hq, D], k [B, Tk, Hkv, D]; scale: the softmax scale (None: 1 / sqrt(D), as in
    forgetting_attention). O(T * D) against the attention's O(T^2 * D): one Triton pass over q and k
    on CUDA (a custom op, so torch.compile traces it without a graph break), plain torch ops elsewhere.
    """
    for x, name in ((q, "q"), (k, "k")):
        check_heads_tensor(x, name)
    check_qk_shapes(q, k)
    check_one_device(q=q, k=k)
    return threshold.auto_qk_bound(q, k, check_softmax_scale(scale, q.shape[-1]), _max_row_norms)


def prune_delta(q: torch.Tensor, k: torch.Tensor, prune_eps: float, qk_bound, scale: float,
                n_keys: int) -> torch.Tensor:
    """threshold.prune_delta, an "auto" bound from the Triton pass over q and k on CUDA."""
    return threshold.prune_delta(q, k, prune_eps, qk_bound, scale, n_keys, _max_row_norms)


def key_block_starts(c: torch.Tensor, delta: torch.Tensor, positions: torch.Tensor,
                     block_n: int) -> torch.Tensor:
    """First kept key of each query block, as the forward and dq kernels compute it.

    c [B, H, T] float64 (one sequence); delta [B, H]; positions [Q] int64: key position of each
    block's first query. Returns int64 [B, H, Q], a multiple of block_n: key blocks before it have
    ``c[p0] - c[last key] <= delta`` and are skipped.
    """
    ends = c[..., block_n - 1::block_n]                                        # [B, H, n_full]
    if ends.shape[-1] == 0:
        return torch.zeros(*c.shape[:2], positions.numel(), dtype=torch.int64, device=c.device)
    cq = c[..., positions]                                                      # [B, H, Q]
    n_pruned = torch.zeros(*c.shape[:2], positions.numel(), dtype=torch.int64, device=c.device)
    step = max(1, (1 << 22) // max(1, ends.numel()))  # bounds the [B, H, Q, n_full] temporary
    for s in range(0, positions.numel(), step):
        d = cq[..., s:s + step, None] - ends[..., None, :]
        n_pruned[..., s:s + step] = (d <= delta[..., None, None]).sum(-1)
    return n_pruned * block_n


def pruning_stats(q: torch.Tensor, k: torch.Tensor, log_fgate: torch.Tensor, prune_eps: float, *,
                  qk_bound="auto", softmax_scale: float | None = None,
                  cu_seqlens: torch.Tensor | None = None, block_m: int | None = None,
                  block_n: int | None = None, c: torch.Tensor | None = None) -> torch.Tensor:
    """Fraction of causal (query block, key block) tiles the forward kernel keeps, per head.

    Args:
        q: [B, Tq, Hq, D]; k: [B, Tk, Hkv, D] (only their norms and shapes are used).
        log_fgate: [B, Tk, Hq] log forget gates (or pass ``c`` [B, Tk, Hq], the float64 cumsum,
            and log_fgate=None).
        prune_eps, qk_bound, softmax_scale, cu_seqlens: as in ``forgetting_attention``.
        block_m, block_n: tile sizes; default: the Triton forward's tiles for q's head dim and
            device (the dq and dk/dv kernels use other tiles and keep about the same fraction).

    Returns:
        float64 [B, Hq]: kept tiles / causal tiles (1.0 = nothing pruned). With cu_seqlens
        (B = 1), tiles of all sequences are pooled.
    """
    from .fwd import fwd_config

    if prune_eps is None:  # check_pruning lets None through (pruning off), prune_delta needs a float
        raise TypeError("prune_eps must be a float in (0, 1), got None")
    for name, size in (("block_m", block_m), ("block_n", block_n)):
        if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 1):
            raise ValueError(f"{name} must be a positive int or None, got {size!r}")
    if (log_fgate is None) == (c is None):
        raise ValueError("pass log_fgate or c (with log_fgate=None), one of the two")
    gate, name = (log_fgate, "log_fgate") if c is None else (c, "c")
    # forgetting_attention's checks: a [B, H, T] gate failed in a broadcast, a NaN or positive one was counted as
    # given. k stands in for v, which the tile counts do not read.
    scale, _ = check_common(q, k, k, gate, name, softmax_scale, cu_seqlens, None)
    check_gate_values(gate, name, allow_positive=c is not None)
    B, Tq, Hq, D = q.shape
    Tk = k.shape[1]
    c_t = gate_cumsum_heads_first(log_fgate) if c is None else c.transpose(1, 2).contiguous()
    if block_m is None or block_n is None:
        cfg = fwd_config(D, q)
        block_m = block_m or cfg.block_m
        block_n = block_n or cfg.block_n
    if cu_seqlens is None:
        segments, n_keys = [(0, Tk)], Tk
    else:
        bounds = cu_seqlens.tolist()
        segments = list(zip(bounds[:-1], bounds[1:]))
        n_keys = max(e - s for s, e in segments)
    check_pruning(prune_eps, qk_bound, B, Hq, q.device)
    delta = prune_delta(q, k, prune_eps, qk_bound, scale, n_keys)
    kept = torch.zeros(B, Hq, dtype=torch.float64, device=q.device)
    total = 0
    for s, e in segments:
        seg_c = c_t[..., s:e]
        n_k = e - s
        n_q = n_k if cu_seqlens is not None else Tq
        off = n_k - n_q
        m0 = torch.arange(0, n_q, block_m, device=q.device)
        hi = torch.clamp(off + m0 + block_m, max=n_k)
        causal = (hi + block_n - 1) // block_n                                    # [Q]
        lo = key_block_starts(seg_c, delta, off + m0, block_n) // block_n         # [B, H, Q]
        kept += (causal - lo).sum(-1).double()
        total += int(causal.sum())
    return kept / total
