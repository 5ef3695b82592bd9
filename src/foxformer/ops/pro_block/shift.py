"""Triton kernels of shift_norm: the token shift and the RMSNorm of one head's rows in one pass, and its gradient.

Forward, per row (b, t, h): ``u = x + a (s - x)`` with ``a = sigmoid(logit)``, ``s`` the row at t - 1 (``prev`` at
t = 0, zeros without it or at a sequence start), then ``y = u * rstd(u) * w``. The backward recomputes u and
the norm's gradient ``du`` instead of saving them, and needs ``du`` of the next row too: ``dx_t = (1 - a_t) du_t +
a_{t+1} du_{t+1}``. Each program recomputes its rows shifted by one rather than exchanging them with the next
program: the extra reads are of rows it or its neighbour loads anyway (cache hits), and one launch writes dx. The
gather kernel (Tile.gather_next) computes each row's du once instead, shifting it within the tile: half the norm
gradients and the loads they need, a tile through shared memory, and 1 / BLOCK_T of the rows computed twice.
"""
from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from ..gpu import on_gpu_of_inputs
from .tiles import (LAUNCH_OPTIONS, TILES, block_sizes, grid, last_dim_contiguous, partials_dtype,
                    program, reduce_partials, rms_norm_grad, rstd, sigmoid, tile, up)


@triton.jit
def _mix(X, LOGITS, PREV, STARTS, b, t, ok, h, d, d_ok,
         sx_b, sx_t, sx_h, sl_b, sl_t, sl_h, sp_b, sp_h, ss_b, ss_t,
         HAS_SHIFT: tl.constexpr, HAS_PREV: tl.constexpr, HAS_STARTS: tl.constexpr, F64: tl.constexpr):
    """(u [BLOCK_T, BLOCK_D], s - x, a [BLOCK_T], fresh [BLOCK_T]): the shifted rows, in the compute dtype; fresh:
    the row is no sequence start, so its s is the previous candidate (or prev), not zeros."""
    x_row = b * sx_b + t * sx_t + h * sx_h
    x = up(tl.load(X + x_row[:, None] + d[None, :], mask=ok[:, None] & d_ok[None, :], other=0.0), F64)
    fresh = ok
    if HAS_SHIFT:
        if HAS_STARTS:
            fresh = fresh & (tl.load(STARTS + b * ss_b + t * ss_t, mask=ok, other=1) == 0)
        from_x = fresh & (t > 0)
        s = up(tl.load(X + (x_row - sx_t)[:, None] + d[None, :], mask=from_x[:, None] & d_ok[None, :], other=0.0),
               F64)
        if HAS_PREV:
            from_prev = fresh & (t == 0)
            p = tl.load(PREV + (b * sp_b + h * sp_h)[:, None] + d[None, :], mask=from_prev[:, None] & d_ok[None, :],
                        other=0.0)
            s += up(p, F64)
        a = sigmoid(up(tl.load(LOGITS + b * sl_b + t * sl_t + h * sl_h, mask=ok, other=0.0), F64))
        diff = s - x
        u = x + a[:, None] * diff
    else:
        a = up(tl.zeros_like(t), F64)  # no shift: a = 0, u = x
        diff = x
        u = x
    return u, diff, a, fresh


@triton.jit
def _shift_norm_fwd_kernel(X, LOGITS, PREV, STARTS, W, Y, T, n_rows, H, D, eps,
                           sx_b, sx_t, sx_h, sl_b, sl_t, sl_h, sp_b, sp_h, ss_b, ss_t, sw_h,
                           HAS_SHIFT: tl.constexpr, HAS_PREV: tl.constexpr, HAS_STARTS: tl.constexpr,
                           HAS_WEIGHT: tl.constexpr, F64: tl.constexpr, BLOCK_T: tl.constexpr,
                           BLOCK_D: tl.constexpr, HEADS_INNER: tl.constexpr):
    blk, h = program(H, HEADS_INNER)
    n, b, t, ok, d, d_ok = tile(blk, T, n_rows, D, BLOCK_T, BLOCK_D)
    u, _, _, _ = _mix(X, LOGITS, PREV, STARTS, b, t, ok, h, d, d_ok, sx_b, sx_t, sx_h, sl_b, sl_t, sl_h, sp_b, sp_h,
                      ss_b, ss_t, HAS_SHIFT, HAS_PREV, HAS_STARTS, F64)
    if HAS_WEIGHT:
        w = up(tl.load(W + h * sw_h + d, mask=d_ok, other=0.0), F64)
        u = u * rstd(u, D, eps)[:, None] * w[None, :]
    y_row = (n * H + h) * D
    tl.store(Y + y_row[:, None] + d[None, :], u.to(Y.dtype.element_ty), mask=ok[:, None] & d_ok[None, :])


@triton.jit
def _row_grads(X, LOGITS, PREV, STARTS, W, DY, n, T, ok, h, d, d_ok, D, eps,
               sx_b, sx_t, sx_h, sl_b, sl_t, sl_h, sp_b, sp_h, ss_b, ss_t, sw_h, sd_b, sd_t, sd_h,
               HAS_SHIFT: tl.constexpr, HAS_PREV: tl.constexpr, HAS_STARTS: tl.constexpr,
               HAS_WEIGHT: tl.constexpr, F64: tl.constexpr):
    """(du, s - x, a, fresh, dy * u * rstd) of rows n: du is the gradient of u (through the norm)."""
    b = n // T
    t = n % T
    u, diff, a, fresh = _mix(X, LOGITS, PREV, STARTS, b, t, ok, h, d, d_ok, sx_b, sx_t, sx_h, sl_b, sl_t, sl_h,
                             sp_b, sp_h, ss_b, ss_t, HAS_SHIFT, HAS_PREV, HAS_STARTS, F64)
    dy_row = b * sd_b + t * sd_t + h * sd_h
    dy = up(tl.load(DY + dy_row[:, None] + d[None, :], mask=ok[:, None] & d_ok[None, :], other=0.0), F64)
    if HAS_WEIGHT:
        w = up(tl.load(W + h * sw_h + d, mask=d_ok, other=0.0), F64)
        r = rstd(u, D, eps)
        du = rms_norm_grad(u, r, dy * w[None, :], D)
        dw = dy * u * r[:, None]
    else:
        du = dy
        dw = dy
    return du, diff, a, fresh, dw


@triton.jit
def _shift_norm_bwd_kernel(X, LOGITS, PREV, STARTS, W, DY, DX, DLOGITS, DPREV, DW_PART, T, n_rows, H, D, eps,
                           sx_b, sx_t, sx_h, sl_b, sl_t, sl_h, sp_b, sp_h, ss_b, ss_t, sw_h, sd_b, sd_t, sd_h,
                           HAS_SHIFT: tl.constexpr, HAS_PREV: tl.constexpr, HAS_STARTS: tl.constexpr,
                           HAS_WEIGHT: tl.constexpr, F64: tl.constexpr, BLOCK_T: tl.constexpr,
                           BLOCK_D: tl.constexpr, HEADS_INNER: tl.constexpr):
    blk, h = program(H, HEADS_INNER)
    n, b, t, ok, d, d_ok = tile(blk, T, n_rows, D, BLOCK_T, BLOCK_D)
    tile_ok = ok[:, None] & d_ok[None, :]
    du, diff, a, fresh, dw = _row_grads(X, LOGITS, PREV, STARTS, W, DY, n, T, ok, h, d, d_ok, D, eps,
                                        sx_b, sx_t, sx_h, sl_b, sl_t, sl_h, sp_b, sp_h, ss_b, ss_t, sw_h,
                                        sd_b, sd_t, sd_h, HAS_SHIFT, HAS_PREV, HAS_STARTS, HAS_WEIGHT, F64)
    dx = du
    if HAS_SHIFT:
        # row t + 1 of the same sequence read this row as its s
        nxt = ok & (t + 1 < T)
        du1, _, a1, fresh1, _ = _row_grads(X, LOGITS, PREV, STARTS, W, DY, n + 1, T, nxt, h, d, d_ok, D, eps,
                                           sx_b, sx_t, sx_h, sl_b, sl_t, sl_h, sp_b, sp_h, ss_b, ss_t, sw_h,
                                           sd_b, sd_t, sd_h, HAS_SHIFT, HAS_PREV, HAS_STARTS, HAS_WEIGHT, F64)
        dx = du * (1.0 - a)[:, None] + du1 * tl.where(nxt & fresh1, a1, 0.0)[:, None]
        dlogit = tl.sum(du * diff, axis=1) * a * (1.0 - a)
        tl.store(DLOGITS + n * H + h, dlogit.to(DLOGITS.dtype.element_ty), mask=ok)
        if HAS_PREV:
            first = ok & (t == 0)
            dprev = du * tl.where(fresh, a, 0.0)[:, None]
            tl.store(DPREV + ((b * H + h) * D)[:, None] + d[None, :], dprev.to(DPREV.dtype.element_ty),
                     mask=first[:, None] & d_ok[None, :])
    tl.store(DX + ((n * H + h) * D)[:, None] + d[None, :], dx.to(DX.dtype.element_ty), mask=tile_ok)
    if HAS_WEIGHT:
        part = tl.sum(dw, axis=0)
        tl.store(DW_PART + (blk * H + h) * D + d, part.to(DW_PART.dtype.element_ty), mask=d_ok)


@triton.jit
def _shift_norm_bwd_gather_kernel(X, LOGITS, PREV, STARTS, W, DY, DX, DLOGITS, DPREV, DW_PART, T, n_rows, H, D, eps,
                                  sx_b, sx_t, sx_h, sl_b, sl_t, sl_h, sp_b, sp_h, ss_b, ss_t, sw_h, sd_b, sd_t, sd_h,
                                  HAS_PREV: tl.constexpr, HAS_STARTS: tl.constexpr, HAS_WEIGHT: tl.constexpr,
                                  F64: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr,
                                  HEADS_INNER: tl.constexpr):
    """The shift's backward with one norm gradient a row: a program's BLOCK_T rows overlap the next program's by one,
    it writes the first BLOCK_T - 1, and takes each one's du_{t+1} from its own tile through tl.gather (a pass
    through shared memory) instead of recomputing the next rows."""
    blk, h = program(H, HEADS_INNER)
    i = tl.arange(0, BLOCK_T)
    n = blk.to(tl.int64) * (BLOCK_T - 1) + i
    ok = n < n_rows
    t = n % T
    d = tl.arange(0, BLOCK_D)
    d_ok = d < D
    du, diff, a, fresh, dw = _row_grads(X, LOGITS, PREV, STARTS, W, DY, n, T, ok, h, d, d_ok, D, eps,
                                        sx_b, sx_t, sx_h, sl_b, sl_t, sl_h, sp_b, sp_h, ss_b, ss_t, sw_h,
                                        sd_b, sd_t, sd_h, True, HAS_PREV, HAS_STARTS, HAS_WEIGHT, F64)
    out = ok & (i < BLOCK_T - 1)
    # the reductions and their stores before the gather, so that diff and dw are dead across it: 77 registers
    # against 96 in the other order (k's case, 2048 x 4, compiled for sm_90a)
    dlogit = tl.sum(du * diff, axis=1) * a * (1.0 - a)
    tl.store(DLOGITS + n * H + h, dlogit.to(DLOGITS.dtype.element_ty), mask=out)
    if HAS_PREV:
        first = out & (t == 0)
        dprev = du * tl.where(fresh, a, 0.0)[:, None]
        tl.store(DPREV + (((n // T) * H + h) * D)[:, None] + d[None, :], dprev.to(DPREV.dtype.element_ty),
                 mask=first[:, None] & d_ok[None, :])
    if HAS_WEIGHT:
        part = tl.sum(tl.where(out[:, None], dw, 0.0), axis=0)
        tl.store(DW_PART + (blk * H + h) * D + d, part.to(DW_PART.dtype.element_ty), mask=d_ok)
    # each row's share of the row above's dx: zero where its s is prev or zeros (t = 0, a start, past the end)
    to_above = du * tl.where(fresh & (t > 0), a, 0.0)[:, None]
    below = tl.broadcast_to(tl.minimum(i + 1, BLOCK_T - 1)[:, None], (BLOCK_T, BLOCK_D))
    dx = du * (1.0 - a)[:, None] + tl.gather(to_above, below, axis=0)
    tl.store(DX + ((n * H + h) * D)[:, None] + d[None, :], dx.to(DX.dtype.element_ty),
             mask=out[:, None] & d_ok[None, :])


def _operands(x, logits, prev, starts, weight) -> tuple[list, list, dict]:
    """(pointers, strides, flags) of the optional inputs; x stands in for an absent tensor (never read)."""
    if prev is not None:
        prev = last_dim_contiguous(prev)
    if weight is not None:
        weight = last_dim_contiguous(weight)
    if starts is not None:
        starts = starts.view(torch.uint8)  # same bytes; Triton reads bool pointers as i1
    ptrs = [x if p is None else p for p in (logits, prev, starts, weight)]
    strides = [*(logits.stride() if logits is not None else (0, 0, 0)),
               *((prev.stride(0), prev.stride(1)) if prev is not None else (0, 0)),
               *(starts.stride() if starts is not None else (0, 0)),
               weight.stride(0) if weight is not None and weight.dim() == 2 else 0]
    flags = dict(HAS_SHIFT=logits is not None, HAS_PREV=prev is not None, HAS_STARTS=starts is not None,
                 HAS_WEIGHT=weight is not None, F64=x.dtype == torch.float64)
    return ptrs, strides, flags


@on_gpu_of_inputs
def shift_norm_forward(x: torch.Tensor, logits: Optional[torch.Tensor], prev: Optional[torch.Tensor],
                       starts: Optional[torch.Tensor], weight: Optional[torch.Tensor], eps: float) -> torch.Tensor:
    """y [B, T, H, D] contiguous, in x's dtype (arguments checked by the caller: interface.shift_norm)."""
    x = last_dim_contiguous(x)
    B, T, H, D = x.shape
    y = torch.empty(B, T, H, D, dtype=x.dtype, device=x.device)
    ptrs, strides, flags = _operands(x, logits, prev, starts, weight)
    block_t, block_d, num_warps, heads_inner = block_sizes(D, "shift_fwd")
    _shift_norm_fwd_kernel[grid(B * T, H, block_t, heads_inner)](
        x, *ptrs, y, T, B * T, H, D, eps, x.stride(0), x.stride(1), x.stride(2), *strides, **flags,
        BLOCK_T=block_t, BLOCK_D=block_d, HEADS_INNER=heads_inner, num_warps=num_warps, **LAUNCH_OPTIONS)
    return y


@on_gpu_of_inputs
def shift_norm_backward(dy, x, logits, prev, starts, weight, eps: float):
    """(dx, dlogits, dprev, dweight), contiguous, each in its input's dtype; None where that input is None."""
    x, dy = last_dim_contiguous(x), last_dim_contiguous(dy)
    B, T, H, D = x.shape
    block_t, block_d, num_warps, heads_inner = block_sizes(D, "shift_bwd")
    ptrs, strides, flags = _operands(x, logits, prev, starts, weight)
    kernel, step = _shift_norm_bwd_kernel, block_t
    if logits is not None and TILES["shift_bwd"].gather_next:
        block_t = max(2, block_t)  # each program's last row is the next one's first
        kernel, step = _shift_norm_bwd_gather_kernel, block_t - 1
        del flags["HAS_SHIFT"]
    n_programs = triton.cdiv(B * T, step)
    dx = torch.empty(B, T, H, D, dtype=x.dtype, device=x.device)
    dlogits = None if logits is None else torch.empty(B, T, H, dtype=logits.dtype, device=x.device)
    dprev = None if prev is None else torch.empty(B, H, D, dtype=prev.dtype, device=x.device)
    partials = None if weight is None else torch.empty(n_programs, H, D, dtype=partials_dtype(x.dtype),
                                                       device=x.device)
    outs = [dx if o is None else o for o in (dlogits, dprev, partials)]
    kernel[grid(B * T, H, step, heads_inner)](
        x, *ptrs, dy, dx, *outs, T, B * T, H, D, eps, x.stride(0), x.stride(1), x.stride(2), *strides,
        dy.stride(0), dy.stride(1), dy.stride(2), **flags,
        BLOCK_T=block_t, BLOCK_D=block_d, HEADS_INNER=heads_inner, num_warps=num_warps, **LAUNCH_OPTIONS)
    return dx, dlogits, dprev, None if weight is None else reduce_partials(partials, weight)
