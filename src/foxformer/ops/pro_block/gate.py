"""Triton kernels of gate_norm: ``y = o * rstd(o) * w * sigmoid(g)`` per row of one head, and its gradient, each
in one pass over o, g (and dy) with no intermediate written."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..gpu import on_gpu_of_inputs
from .tiles import (LAUNCH_OPTIONS, block_sizes, grid, last_dim_contiguous, partials_dtype,
                    program, reduce_partials, rms_norm_grad, rstd, sigmoid, tile, up)


@triton.jit
def _load_rows(P, b, t, h, d, mask, s_b, s_t, s_h, F64: tl.constexpr):
    return up(tl.load(P + (b * s_b + t * s_t + h * s_h)[:, None] + d[None, :], mask=mask, other=0.0), F64)


@triton.jit
def _gate_norm_kernel(O, G, W, DY, Y, DO, DG, DW_PART, T, n_rows, H, D, eps,
                      so_b, so_t, so_h, sg_b, sg_t, sg_h, sd_b, sd_t, sd_h, sw_h,
                      BACKWARD: tl.constexpr, F64: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr,
                      HEADS_INNER: tl.constexpr):
    """Forward: Y. BACKWARD: DO, DG and the weight gradient's per-row-block sums DW_PART [blocks, H, D]."""
    blk, h = program(H, HEADS_INNER)
    n, b, t, ok, d, d_ok = tile(blk, T, n_rows, D, BLOCK_T, BLOCK_D)
    mask = ok[:, None] & d_ok[None, :]
    o = _load_rows(O, b, t, h, d, mask, so_b, so_t, so_h, F64)
    sg = sigmoid(_load_rows(G, b, t, h, d, mask, sg_b, sg_t, sg_h, F64))
    w = up(tl.load(W + h * sw_h + d, mask=d_ok, other=0.0), F64)
    r = rstd(o, D, eps)
    out = (n * H + h) * D
    if BACKWARD:
        dy = _load_rows(DY, b, t, h, d, mask, sd_b, sd_t, sd_h, F64)
        normed = o * r[:, None]
        dg = dy * normed * w[None, :] * sg * (1.0 - sg)
        do = rms_norm_grad(o, r, dy * sg * w[None, :], D)
        tl.store(DO + out[:, None] + d[None, :], do.to(DO.dtype.element_ty), mask=mask)
        tl.store(DG + out[:, None] + d[None, :], dg.to(DG.dtype.element_ty), mask=mask)
        part = tl.sum(dy * sg * normed, axis=0)
        tl.store(DW_PART + (blk * H + h) * D + d, part.to(DW_PART.dtype.element_ty), mask=d_ok)
    else:
        y = o * r[:, None] * w[None, :] * sg
        tl.store(Y + out[:, None] + d[None, :], y.to(Y.dtype.element_ty), mask=mask)


def _heads(g: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
    """g as [B, T, H, D] (a view: its rows' D elements are contiguous)."""
    g = last_dim_contiguous(g)
    return g if g.dim() == 4 else g.unflatten(-1, o.shape[2:])


def _launch(o, g, weight, eps, dy=None, outs=(None, None, None, None)):
    o = last_dim_contiguous(o)
    g = _heads(g, o)
    weight = last_dim_contiguous(weight)
    B, T, H, D = o.shape
    block_t, block_d, num_warps, heads_inner = block_sizes(D, "gate_fwd" if dy is None else "gate_bwd")
    dy_strides = (0, 0, 0) if dy is None else (dy.stride(0), dy.stride(1), dy.stride(2))
    ptrs = [o if p is None else p for p in (dy, *outs)]
    _gate_norm_kernel[grid(B * T, H, block_t, heads_inner)](
        o, g, weight, *ptrs, T, B * T, H, D, eps, o.stride(0), o.stride(1), o.stride(2), g.stride(0), g.stride(1),
        g.stride(2), *dy_strides, weight.stride(0) if weight.dim() == 2 else 0, BACKWARD=dy is not None,
        F64=o.dtype == torch.float64, BLOCK_T=block_t, BLOCK_D=block_d, HEADS_INNER=heads_inner, num_warps=num_warps,
        **LAUNCH_OPTIONS)


@on_gpu_of_inputs
def gate_norm_forward(o: torch.Tensor, g: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """y [B, T, H, D] contiguous, in o's dtype (arguments checked by the caller: interface.gate_norm)."""
    y = torch.empty(o.shape, dtype=o.dtype, device=o.device)
    _launch(o, g, weight, eps, outs=(y, None, None, None))
    return y


@on_gpu_of_inputs
def gate_norm_backward(dy, o, g, weight, eps: float):
    """(do, dg, dweight): do [B, T, H, D], dg in g's shape, contiguous, each in its input's dtype."""
    dy = last_dim_contiguous(dy)
    B, T, H, D = o.shape
    do = torch.empty(o.shape, dtype=o.dtype, device=o.device)
    dg = torch.empty(g.shape, dtype=g.dtype, device=g.device)
    n_programs = triton.cdiv(B * T, block_sizes(D, "gate_bwd")[0])
    partials = torch.empty(n_programs, H, D, dtype=partials_dtype(o.dtype), device=o.device)
    _launch(o, g, weight, eps, dy=dy, outs=(None, do, dg, partials))
    return do, dg, reduce_partials(partials, weight)
