"""Adaptive computation pruning: which (query block, key block) tiles can be skipped.

Maths (README.md here): with U >= max |scale * q_i . k_j| over a (batch, head) and N the most keys
a row can see, every pair with ``c[p_i] - c[j] <= delta``, ``delta = log(eps) - 2U - log(N)``,
carries probability at most eps / N, so a row loses at most eps in total. c never increases, so a
tile's largest ``c[p_i] - c[j]`` sits at its first query and last key, and the test on those two
values is conservative for every pair of the tile.

Every backend (three Triton kernels, the chunked torch backend) applies that test at its own
granularity; each decision is conservative on its own, so they never need to agree tile by tile.
This module computes delta (the only new kernel input) and the statistics users tune eps with.
"""
from __future__ import annotations

import math
import os

import torch
import triton
import triton.language as tl

from .cumsum import gate_cumsum_heads_first
from .threshold import pruning_threshold
from .tiles import LAUNCH_OPTIONS, launch_grid, program_ids

# The kernels compute |q . k| in fp32 from rounded inputs; a tiny relative margin on U keeps "auto"
# an upper bound of what they actually compute.
_AUTO_MARGIN = 1.0 + 1e-4


def check_pruning(prune_eps, qk_bound, B: int, Hq: int, device: torch.device) -> None:
    """Validate prune_eps / qk_bound (ValueError / TypeError naming the argument)."""
    if prune_eps is None:
        if qk_bound is not None:
            # ignored without a word: a caller who took the bound for the switch got no pruning and no hint
            shown = (f"a tensor of shape {tuple(qk_bound.shape)}" if isinstance(qk_bound, torch.Tensor)
                     else repr(qk_bound))
            raise ValueError(f"qk_bound ({shown}) was given without prune_eps: qk_bound is the bound U on "
                             f"|softmax_scale * q . k| that tile pruning's threshold uses, and it only applies with "
                             f"prune_eps, which turns pruning on; pass prune_eps as well, or leave qk_bound None")
        return
    if isinstance(prune_eps, bool) or not isinstance(prune_eps, (int, float)):
        raise TypeError(f"prune_eps must be a float in (0, 1) or None, got {type(prune_eps).__name__}")
    if not 0.0 < float(prune_eps) < 1.0:
        raise ValueError(f"prune_eps must be in (0, 1), got {prune_eps!r}")
    if qk_bound is None or (isinstance(qk_bound, str) and qk_bound == "auto"):
        return
    if isinstance(qk_bound, str):
        raise ValueError(f"qk_bound must be 'auto', a float >= 0 or a tensor, got {qk_bound!r}")
    if isinstance(qk_bound, torch.Tensor):
        try:
            # broadcast_shapes also accepts shapes that would grow [B, Hq] (e.g. [3, 1, Hq] or, with
            # B = 1, [2, 1]); prune_delta then failed in broadcast_to with a bare RuntimeError
            fits = torch.broadcast_shapes(qk_bound.shape, (B, Hq)) == (B, Hq)
        except RuntimeError:
            fits = False
        if not fits:
            raise ValueError(f"qk_bound must broadcast to [B, Hq] = {(B, Hq)}, got shape {tuple(qk_bound.shape)}")
        if qk_bound.device != device:
            raise ValueError(f"qk_bound must be on {device}, got {qk_bound.device}")
        if not (qk_bound.is_floating_point() or qk_bound.dtype in (torch.int32, torch.int64)):
            raise TypeError(f"qk_bound must be a real tensor, got {qk_bound.dtype}")
        # a value check costs a sync on CUDA: same policy as check_gate_values
        if torch.compiler.is_compiling():
            return
        if device.type == "cuda" and os.environ.get("FOXFORMER_CHECK_VALUES", "0") != "1":
            return
        if not (torch.isfinite(qk_bound).all() and (qk_bound >= 0).all()):
            raise ValueError("qk_bound must be finite and >= 0")
        return
    if isinstance(qk_bound, bool) or not isinstance(qk_bound, (int, float)):
        raise TypeError(f"qk_bound must be 'auto', a float or a tensor, got {type(qk_bound).__name__}")
    # a comparison, not math.isfinite: under torch.compile a float that varies between calls is a
    # SymFloat, which math.isfinite cannot trace (NaN fails the comparison too)
    if not 0 <= qk_bound < math.inf:
        raise ValueError(f"qk_bound must be finite and >= 0, got {qk_bound!r}")


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
        # The torch ops below ran at about a fifth of memory bandwidth (0.4 ms for q and k of 32K
        # tokens x 24 heads x 64 on an H200, 2026-11-29), a 4-7% overhead for pruning on short
        # sequences; squares summed in fp32 are at least as exact as a norm in the input dtype.
        return max_sq_row_norms(x).double().sqrt()
    # Norms in the inputs' own dtype: reductions accumulate half types in fp32 anyway, and asking for
    # dtype=float32 made torch copy x to fp32 first. The rounding of each norm to the input dtype
    # (at most one unit roundoff) is covered by auto_qk_bound's rounding factor.
    return torch.linalg.vector_norm(x, dim=-1).amax(dim=1).double()


def auto_qk_bound(q: torch.Tensor, k: torch.Tensor, scale: float) -> torch.Tensor:
    """U = scale * max_i ||q_i|| * max_j ||k_j|| per (batch, query head): float64 [B, Hq].

    q [B, Tq, Hq, D], k [B, Tk, Hkv, D]. O(T * D) against the attention's O(T^2 * D): one Triton
    pass over q and k on CUDA (a custom op, so torch.compile traces it without a graph break),
    plain torch ops elsewhere.
    """
    Hq, Hkv = q.shape[2], k.shape[2]
    q_max = _max_row_norms(q)                                       # [B, Hq]
    k_max = _max_row_norms(k).repeat_interleave(Hq // Hkv, dim=1)   # [B, Hkv] -> [B, Hq]
    rounding = (1.0 + torch.finfo(q.dtype).eps) * (1.0 + torch.finfo(k.dtype).eps)
    return (q_max * k_max) * (abs(scale) * _AUTO_MARGIN * rounding)


def prune_delta(q: torch.Tensor, k: torch.Tensor, prune_eps: float, qk_bound, scale: float,
                n_keys: int) -> torch.Tensor:
    """The skip threshold delta = log(eps) - 2U - log(N), float64 [B, Hq] (contiguous).

    qk_bound: None or "auto" (from the norms of q and k), a float, or a tensor broadcastable to
    [B, Hq]. A given bound is trusted: if some |scale * q . k| exceeds it, more than eps can be
    pruned from a row (the caller's contract). n_keys: keys a row can see at most (Tk, or the
    longest packed sequence).
    """
    B, Hq = q.shape[0], q.shape[2]
    if qk_bound is None or isinstance(qk_bound, str):
        u = auto_qk_bound(q, k, scale)
    elif isinstance(qk_bound, torch.Tensor):
        u = qk_bound.to(device=q.device, dtype=torch.float64)
    else:
        u = torch.full((B, Hq), float(qk_bound), dtype=torch.float64, device=q.device)
    return torch.broadcast_to(pruning_threshold(prune_eps, u, n_keys), (B, Hq)).contiguous()


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
    B, Tq, Hq, D = q.shape
    Tk = k.shape[1]
    if c is None:
        if log_fgate is None:
            raise ValueError("pass log_fgate or c")
        c_t = gate_cumsum_heads_first(log_fgate)
    else:
        c_t = c.transpose(1, 2).double().contiguous()
    if block_m is None or block_n is None:
        cfg = fwd_config(D, q)
        block_m = block_m or cfg.block_m
        block_n = block_n or cfg.block_n
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(D)
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
