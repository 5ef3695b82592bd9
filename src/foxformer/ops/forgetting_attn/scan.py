"""The gate cumsum of the op on a GPU: ``c = cumsum(max(log f, floor))`` in float64, and its gradient, in Triton.

``cumsum.gate_cumsum_heads_first`` (torch) is the reference and what the CPU runs. On a GPU its four kernels (a
cast, the clamp, a transposing copy and torch's float64 scan, which gives each of the B * H rows one block) took
~60 us for the forward and as much for the reverse cumsum of the backward at B * T = 32K, H = 24 (the eleventh
session's D 64 profile, docs/bench/profile_attention_bd30b56/): ~1.5% of the D 64 forward kernel's 4.1 ms,
the margin the forward target is missed by. Here each direction is two launches of B * H * (T / CHUNK)
programs: every chunk's sum, then every chunk's scan started from the sum of the chunks before it (after it,
for the reverse scan of the backward). Same values as torch up to float64 rounding of the summation order.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .cumsum import LOG_FGATE_FLOOR
from .tiles import LAUNCH_OPTIONS


def _chunk(T: int) -> int:
    """Tokens per program: 1024, more for sequences past 4M tokens (at most 4096 chunks a row). Not tuned yet:
    chosen so that the benchmark's shape (B * H = 48 rows of 16K) gives 768 programs, ~6 per SM of an H200."""
    return max(1024, triton.next_power_of_2(triton.cdiv(T, 4096)))


@triton.jit
def _load_row(X, LOGF, row, t, t_ok, H, stride_xb, stride_xh, stride_xt, stride_fb, stride_ft, stride_fh,
              floor, GRAD: tl.constexpr):
    """Row ``row`` = b * H + h at positions t, float64: the clamped gate (forward) or the incoming gradient
    (GRAD); 0 past T."""
    b = (row // H).to(tl.int64)
    h = row % H
    if GRAD:
        g = tl.load(X + b * stride_xb + h * stride_xh + t.to(tl.int64) * stride_xt, mask=t_ok, other=0.0)
        return g.to(tl.float64)
    lf = tl.load(LOGF + b * stride_fb + t.to(tl.int64) * stride_ft + h * stride_fh, mask=t_ok, other=0.0)
    # clamp's rule: NaN stays NaN (a comparison with NaN is false)
    lf = lf.to(tl.float64)
    return tl.where(t_ok, tl.where(lf < floor, floor, lf), 0.0)


@triton.jit
def _chunk_sums_kernel(X, LOGF, SUMS, T, H, n_chunks,
                       stride_xb, stride_xh, stride_xt, stride_fb, stride_ft, stride_fh, floor,
                       CHUNK: tl.constexpr, GRAD: tl.constexpr):
    row = tl.program_id(0) // n_chunks
    chunk = tl.program_id(0) % n_chunks
    t = chunk * CHUNK + tl.arange(0, CHUNK)
    x = _load_row(X, LOGF, row, t, t < T, H, stride_xb, stride_xh, stride_xt, stride_fb, stride_ft, stride_fh,
                  floor, GRAD)
    tl.store(SUMS + row.to(tl.int64) * n_chunks + chunk, tl.sum(x, 0))


@triton.jit
def _chunk_scan_kernel(X, LOGF, SUMS, OUT, T, H, n_chunks,
                       stride_xb, stride_xh, stride_xt, stride_fb, stride_ft, stride_fh,
                       stride_ob, stride_oh, stride_ot, floor,
                       CHUNK: tl.constexpr, BLOCK_C: tl.constexpr, GRAD: tl.constexpr):
    """Forward: OUT[b, h, t] = sum of the clamped gates up to t. GRAD: OUT[b, t, h] (strides given so) = sum of
    the masked gradient from t to the end."""
    row = tl.program_id(0) // n_chunks
    chunk = tl.program_id(0) % n_chunks
    j = tl.arange(0, BLOCK_C)
    before = (j > chunk) if GRAD else (j < chunk)
    sums = tl.load(SUMS + row.to(tl.int64) * n_chunks + j, mask=before & (j < n_chunks), other=0.0)
    t = chunk * CHUNK + tl.arange(0, CHUNK)
    t_ok = t < T
    x = _load_row(X, LOGF, row, t, t_ok, H, stride_xb, stride_xh, stride_xt, stride_fb, stride_ft, stride_fh,
                  floor, GRAD)
    y = tl.sum(sums, 0) + tl.cumsum(x, 0, reverse=GRAD)
    b = (row // H).to(tl.int64)
    h = row % H
    if GRAD:
        # clamp(min)'s gradient: through where log f >= floor (-inf and anything lower get none)
        lf = tl.load(LOGF + b * stride_fb + t.to(tl.int64) * stride_ft + h * stride_fh, mask=t_ok, other=0.0)
        y = tl.where(lf.to(tl.float32) >= floor, y, 0.0)
    if OUT.dtype.element_ty != tl.float64:
        # through float32, as the interpreter converts float64 to bfloat16 wrongly (a gradient: 1 ulp at most)
        y = y.to(tl.float32)
    tl.store(OUT + b * stride_ob + h * stride_oh + t.to(tl.int64) * stride_ot, y.to(OUT.dtype.element_ty),
             mask=t_ok)


def _launch(x, log_f, out, out_strides, grad: bool) -> None:
    B, T, H = log_f.shape
    chunk = _chunk(T)
    n_chunks = triton.cdiv(T, chunk)
    sums = torch.empty(B * H * n_chunks, dtype=torch.float64, device=log_f.device)
    x_strides = (x.stride(0), x.stride(1), x.stride(2)) if grad else (0, 0, 0)
    common = (T, H, n_chunks, *x_strides, log_f.stride(0), log_f.stride(1), log_f.stride(2))
    _chunk_sums_kernel[(B * H * n_chunks,)](x, log_f, sums, *common, LOG_FGATE_FLOOR, CHUNK=chunk, GRAD=grad,
                                            num_warps=4, **LAUNCH_OPTIONS)
    _chunk_scan_kernel[(B * H * n_chunks,)](x, log_f, sums, out, *common, *out_strides, LOG_FGATE_FLOOR,
                                            CHUNK=chunk, BLOCK_C=max(2, triton.next_power_of_2(n_chunks)),
                                            GRAD=grad, num_warps=4, **LAUNCH_OPTIONS)


def triton_gate_cumsum(log_f: torch.Tensor) -> torch.Tensor:
    """gate_cumsum_heads_first(log_f) (no initial value): log_f [B, T, H] -> float64 [B, H, T], contiguous."""
    B, T, H = log_f.shape
    c = torch.empty(B, H, T, dtype=torch.float64, device=log_f.device)
    _launch(log_f, log_f, c, (c.stride(0), c.stride(1), c.stride(2)), grad=False)
    return c


def triton_gate_cumsum_grad(grad_c: torch.Tensor, log_f: torch.Tensor) -> torch.Tensor:
    """The gradient of triton_gate_cumsum: grad_c [B, H, T] -> [B, T, H] in log_f's dtype (the reverse cumsum,
    zero where the clamp cut the gate)."""
    out = torch.empty_like(log_f, memory_format=torch.contiguous_format)
    # out [B, T, H] written through (batch, head, position) strides; grad_c read as (batch, head, position)
    _launch(grad_c, log_f, out, (out.stride(0), out.stride(2), out.stride(1)), grad=True)
    return out
