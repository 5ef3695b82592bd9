"""Fused Triton forward kernel of Forgetting Attention (FlashAttention-2 style).

For query row i at key position p_i = Tk - Tq + i and visible keys j <= p_i:

    s_ij = scale * q_i . k_j + c[p_i] - c[j],   out_i = softmax_j(s_ij) @ v,   lse_i = logsumexp_j(s_ij)

The kernel works in base 2 (exp2) and converts lse back to natural log on store.

Precision of c: c is float64 and large at long context. Each program takes a float64 reference
r = c[first query position of the block]; c tiles are loaded as float64, shifted by r and only then
rounded to float32. Off-diagonal key tiles (all keys before the block) have c[j] - r >= 0 and
c[p_i] - r <= 0, so their difference never cancels and plain float32 is exact to the last bit of the
result. The diagonal tiles can hold pairs on the same side of a large gate drop (e.g. a clamped
-inf gate inside the block), so there both sides are split into float32 hi + lo parts: hi differences
of nearby values are exact (Sterbenz), and lo restores the bits lost by rounding to float32.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .tiles import LAUNCH_OPTIONS, launch_grid, program_ids, query_key_range, seq_bounds, tile_bounds

LOG2E = tl.constexpr(1.4426950408889634)
LN2 = tl.constexpr(0.6931471805599453)


@dataclass(frozen=True)
class KernelConfig:
    """Tile sizes and launch options of one kernel (block_m: query rows, block_n: key rows)."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int


# Tuning knobs (H100/H200, bf16/fp16), keyed by the padded head dim BLOCK_D: the first entry whose key
# is >= BLOCK_D wins. Picked by a small sweep on one H200 (triton 3.6, bf16, B=2, T=16K; forward at
# 305 / 379 / 400 TFLOP/s for D = 64 / 128 / 256).
# Head dims up to BOUNDED_RANGE_MAX_D run the forward unpruned through the pruned kernel with all-zero
# bounds (the key range then starts at a loaded 0, not a constant), a faster schedule at D = 64: 5.15
# against 5.52 ms at 16K, 38.5 against 40.9 ms at 64K (H200, 2026-11-29, `gpu_bench.sh attnlong` at
# commits 16e2708 and 3791807). At D = 128 the two paths ran within 2% of each other (open-gate rows
# of `gpu_bench.sh prunegiven`, 16e2708), so D = 128 keeps the plain one.
BOUNDED_RANGE_MAX_D = 64
FWD_CONFIGS: dict[int, KernelConfig] = {
    64: KernelConfig(block_m=128, block_n=64, num_warps=4, num_stages=3),
    128: KernelConfig(block_m=128, block_n=128, num_warps=8, num_stages=3),
    256: KernelConfig(block_m=128, block_n=64, num_warps=8, num_stages=2),
}
# Interpreter (CPU tensors): small and unequal blocks so tests cross several full and partial tiles.
INTERPRET_FWD_CONFIG = KernelConfig(block_m=32, block_n=16, num_warps=1, num_stages=1)


def is_interpreted(t: torch.Tensor) -> bool:
    return t.device.type == "cpu" or os.environ.get("TRITON_INTERPRET", "0") == "1"


def block_d_for(head_dim: int) -> int:
    return max(16, triton.next_power_of_2(head_dim))


def pick_config(table: dict[int, KernelConfig], interpret_config: KernelConfig, head_dim: int,
                t: torch.Tensor) -> KernelConfig:
    if is_interpreted(t):
        return interpret_config
    block_d = block_d_for(head_dim)
    for key in sorted(table):
        if block_d <= key:
            return table[key]
    raise ValueError(f"head dim {head_dim} > {max(table)} is not supported")


def fwd_config(head_dim: int, t: torch.Tensor) -> KernelConfig:
    """Forward tile config for this head dim on t's device."""
    return pick_config(FWD_CONFIGS, INTERPRET_FWD_CONFIG, head_dim, t)


def upcast_dots(t: torch.Tensor) -> bool:
    return t.dtype == torch.bfloat16 and is_interpreted(t)


def dot_precision(dtype: torch.dtype) -> str:
    # fp32 inputs exist for testing only: keep them exact instead of tf32.
    return "ieee" if dtype == torch.float32 else "tf32"


# ----------------------------------------------------------------------------------------------
# Shared device helpers (also used by bwd.py)
# ----------------------------------------------------------------------------------------------


@triton.jit
def load_tile(ptrs, rows_ok, cols_ok, CHECK_ROWS: tl.constexpr, CHECK_COLS: tl.constexpr):
    """Load a 2-D tile, masking only what the call site cannot prove in bounds."""
    if CHECK_ROWS:
        if CHECK_COLS:
            x = tl.load(ptrs, mask=rows_ok[:, None] & cols_ok[None, :], other=0.0)
        else:
            x = tl.load(ptrs, mask=rows_ok[:, None], other=0.0)
    else:
        if CHECK_COLS:
            x = tl.load(ptrs, mask=cols_ok[None, :], other=0.0)
        else:
            x = tl.load(ptrs)
    return x


@triton.jit
def mma(a, b, acc, DOT_PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """acc + a @ b with fp32 accumulation; UPCAST works around the interpreter's bf16 dot
    (it multiplies the raw uint16 storage), and is never set on the GPU."""
    if UPCAST:
        a = a.to(tl.float32)
        b = b.to(tl.float32)
    return tl.dot(a, b, acc, input_precision=DOT_PRECISION)


@triton.jit
def split_f64(x):
    """float64 -> float32 hi + float32 lo with hi + lo == x to about 48 bits."""
    hi = x.to(tl.float32)
    lo = (x - hi.to(tl.float64)).to(tl.float32)
    return hi, lo


@triton.jit
def rel_c(c_ptrs, ok, r):
    """c at c_ptrs minus the float64 reference r (0 where not ok), still float64."""
    x = tl.load(c_ptrs, mask=ok, other=0.0) - r
    return tl.where(ok, x, 0.0)


@triton.jit
def query_c(c_base, p_first, pos_q, row_ok):
    """A query block's float64 reference r = c[first query] and its rows' c - r as fp32 hi + lo (and hi
    in log2 units, for unmasked tiles)."""
    r = tl.load(c_base + p_first)
    cq_hi, cq_lo = split_f64(rel_c(c_base + pos_q, row_ok, r))
    return r, cq_hi, cq_lo, cq_hi * LOG2E


# ----------------------------------------------------------------------------------------------
# Forward kernel
# ----------------------------------------------------------------------------------------------


@triton.jit
def kv_tile_logits(q, cq2, cq_hi, cq_lo, pos_q, k_base, v_base, c_base, r, n0, hi, stride_kt, stride_vt, scale2,
                   offs_n, offs_d, d_ok,
                   MASKED: tl.constexpr, MASK_D: tl.constexpr, DOT_PRECISION: tl.constexpr,
                   UPCAST: tl.constexpr):
    """The key / value tile at n0 and the biased logits of the query rows against it, in log2 units:
    s = (scale * q.k + c_i - c_j) / ln 2, -inf where the key is not visible (MASKED tiles only; padded
    rows carry pos_q < 0 or beyond every key and are never stored). Shared by the forward and dq steps."""
    cols = n0 + offs_n
    col_ok = cols < hi
    n0_64 = tl.cast(n0, tl.int64)
    k = load_tile(k_base + n0_64 * stride_kt + offs_n[:, None] * stride_kt + offs_d[None, :],
                  col_ok, d_ok, MASKED, MASK_D)
    v = load_tile(v_base + n0_64 * stride_vt + offs_n[:, None] * stride_vt + offs_d[None, :],
                  col_ok, d_ok, MASKED, MASK_D)
    qk = mma(q, tl.trans(k), None, DOT_PRECISION, UPCAST)
    if MASKED:
        ck_hi, ck_lo = split_f64(rel_c(c_base + cols, col_ok, r))
        bias = ((cq_hi[:, None] - ck_hi[None, :]) + (cq_lo[:, None] - ck_lo[None, :])) * LOG2E
        # Mask the logit, not its exponent: a hidden key may carry a large positive bias.
        s = tl.where(cols[None, :] <= pos_q[:, None], qk * scale2 + bias, float("-inf"))
    else:
        ck2 = (tl.load(c_base + cols) - r).to(tl.float32) * LOG2E
        s = qk * scale2 + (cq2[:, None] - ck2[None, :])
    return k, v, s


@triton.jit
def _fwd_step(acc, l_i, m_i, q, cq2, cq_hi, cq_lo, pos_q,
              k_base, v_base, c_base, r, n0, hi, stride_kt, stride_vt, scale2,
              offs_n, offs_d, d_ok,
              MASKED: tl.constexpr, MASK_D: tl.constexpr, DOT_PRECISION: tl.constexpr,
              UPCAST: tl.constexpr):
    k, v, s = kv_tile_logits(q, cq2, cq_hi, cq_lo, pos_q, k_base, v_base, c_base, r, n0, hi, stride_kt, stride_vt,
                             scale2, offs_n, offs_d, d_ok, MASKED, MASK_D, DOT_PRECISION, UPCAST)
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None]
    acc = mma(p.to(v.dtype), v, acc, DOT_PRECISION, UPCAST)
    return acc, l_i, m_new


@triton.jit
def _fwd_kernel(
    Q, K, V, C, Out, Lse, CuSeqlens, PruneBound,
    stride_qb, stride_qt, stride_qh,
    stride_kb, stride_kt, stride_kh,
    stride_vb, stride_vt, stride_vh,
    stride_ob, stride_ot, stride_oh,
    stride_cb, stride_ch,
    stride_lb, stride_lh,
    seqlen_q, seqlen_k, scale2, n_blocks, n_heads,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    MASK_D: tl.constexpr, IS_VARLEN: tl.constexpr, DOT_PRECISION: tl.constexpr, UPCAST: tl.constexpr,
    PRUNE: tl.constexpr,
):
    blk, head, pid_z = program_ids(n_blocks, n_heads)
    # Heaviest (last) query blocks first: causal work grows with the block index.
    pid_m = n_blocks - 1 - blk
    zb, tok0, n_q, n_k = seq_bounds(CuSeqlens, pid_z, seqlen_q, seqlen_k, IS_VARLEN)
    m0 = pid_m * BLOCK_M
    if m0 >= n_q:
        return
    off = n_k - n_q
    kv_head = head // GROUP

    q_base = Q + zb * stride_qb + (tok0 + m0) * stride_qt + head * stride_qh
    k_base = K + zb * stride_kb + tok0 * stride_kt + kv_head * stride_kh
    v_base = V + zb * stride_vb + tok0 * stride_vt + kv_head * stride_vh
    c_base = C + zb * stride_cb + head * stride_ch + tok0

    offs_m = tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    rows = m0 + offs_m
    row_ok = rows < n_q
    d_ok = offs_d < HEAD_DIM
    q = load_tile(q_base + offs_m[:, None] * stride_qt + offs_d[None, :], row_ok, d_ok, True, MASK_D)

    p_first = off + m0
    pos_q = off + rows
    r, cq_hi, cq_lo, cq2 = query_c(c_base, p_first, pos_q, row_ok)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)

    slot = (pid_z * n_heads + head) * n_blocks + pid_m  # PruneBound: [n_z, Hq, n_blocks] contiguous
    lo, mid, hi = query_key_range(PruneBound, slot, p_first, n_k, BLOCK_M, BLOCK_N, PRUNE)
    for n0 in range(lo, mid, BLOCK_N):
        acc, l_i, m_i = _fwd_step(acc, l_i, m_i, q, cq2, cq_hi, cq_lo, pos_q,
                                  k_base, v_base, c_base, r, n0, hi, stride_kt, stride_vt, scale2,
                                  offs_n, offs_d, d_ok, False, MASK_D, DOT_PRECISION, UPCAST)
    for n0 in range(mid, hi, BLOCK_N):
        acc, l_i, m_i = _fwd_step(acc, l_i, m_i, q, cq2, cq_hi, cq_lo, pos_q,
                                  k_base, v_base, c_base, r, n0, hi, stride_kt, stride_vt, scale2,
                                  offs_n, offs_d, d_ok, True, MASK_D, DOT_PRECISION, UPCAST)

    # Every real row sees its diagonal key, so l_i > 0; padded rows are finite and never stored.
    out = acc / l_i[:, None]
    o_base = Out + zb * stride_ob + (tok0 + m0) * stride_ot + head * stride_oh
    o_ptrs = o_base + offs_m[:, None] * stride_ot + offs_d[None, :]
    tl.store(o_ptrs, out.to(Out.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])
    lse = (m_i + tl.log2(l_i)) * LN2
    tl.store(Lse + zb * stride_lb + head * stride_lh + tok0 + rows, lse, mask=row_ok)


# ----------------------------------------------------------------------------------------------
# Launcher
# ----------------------------------------------------------------------------------------------


def check_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, c: torch.Tensor,
                 cu_seqlens: torch.Tensor | None, max_seqlen: int | None) -> None:
    """Cheap contract checks (the public interface validates user input in full)."""
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"q, k, v must be [B, T, H, D]; got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    B, Tq, Hq, D = q.shape
    Bk, Tk, Hkv, Dk = k.shape
    if v.shape != k.shape or Bk != B or Dk != D:
        raise ValueError(f"k, v must be [{B}, Tk, Hkv, {D}]; got {tuple(k.shape)}, {tuple(v.shape)}")
    if not 1 <= D <= 256:
        raise ValueError(f"head dim must be in 1..256, got {D}")
    if Hq % Hkv != 0:
        raise ValueError(f"q heads ({Hq}) must be a multiple of kv heads ({Hkv})")
    if Tq > Tk:
        raise ValueError(f"q length {Tq} must not exceed k length {Tk}")
    if q.dtype not in (torch.float16, torch.bfloat16, torch.float32) or k.dtype != q.dtype or v.dtype != q.dtype:
        raise TypeError(f"q, k, v must share a dtype in fp16/bf16/fp32; got {q.dtype}, {k.dtype}, {v.dtype}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        # D = 1: one element per row is read, and torch keeps any last stride (even through .contiguous());
        # the same for empty tensors (B = 0), of which nothing is read
        if t.stride(-1) != 1 and t.shape[-1] != 1 and t.numel():
            raise ValueError(f"{name} must have a contiguous last dim, got strides {t.stride()}")
    if c.dtype != torch.float64 or tuple(c.shape) != (B, Hq, Tk):
        raise ValueError(f"c must be float64 [{B}, {Hq}, {Tk}]; got {c.dtype} {tuple(c.shape)}")
    if cu_seqlens is not None:
        if B != 1 or Tq != Tk:
            raise ValueError(f"cu_seqlens needs B == 1 and Tq == Tk; got B={B}, Tq={Tq}, Tk={Tk}")
        if cu_seqlens.dtype != torch.int32 or cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2:
            raise ValueError("cu_seqlens must be int32 [N + 1] with N >= 1")
        if max_seqlen is None or max_seqlen < 1:
            raise ValueError("max_seqlen (int >= 1) is required with cu_seqlens")


def check_prune_delta(prune_delta: torch.Tensor | None, B: int, Hq: int, q: torch.Tensor) -> bool:
    """True when pruning is on; the kernels index prune_delta as a contiguous [B, Hq] float64."""
    if prune_delta is None:
        return False
    if (prune_delta.dtype != torch.float64 or tuple(prune_delta.shape) != (B, Hq)
            or not prune_delta.is_contiguous() or prune_delta.device != q.device):
        raise ValueError(f"prune_delta must be a contiguous float64 [{B}, {Hq}] tensor on {q.device}, "
                         f"got {prune_delta.dtype} {tuple(prune_delta.shape)}")
    return True


def triton_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, c: torch.Tensor, scale: float,
                   cu_seqlens: torch.Tensor | None = None, max_seqlen: int | None = None,
                   *, out: torch.Tensor | None = None, prune_delta: torch.Tensor | None = None,
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """Forgetting Attention forward.

    q [B, Tq, Hq, D]; k, v [B, Tk, Hkv, D]; c float64 [B, Hq, Tk]; optional out [B, Tq, Hq, D] to write into.
    prune_delta: optional float64 [B, Hq] threshold (pruning.prune_delta); key tiles with
    c[first query] - c[last key] <= delta are skipped. c must be non-increasing along T then.
    Returns out [B, Tq, Hq, D] (q's dtype) and lse float32 [B, Hq, Tq] (natural log).
    """
    check_inputs(q, k, v, c, cu_seqlens, max_seqlen)
    B, Tq, Hq, D = q.shape
    Tk, Hkv = k.shape[1], k.shape[2]
    c = c.contiguous()
    varlen = cu_seqlens is not None
    # Varlen: tokens outside every segment are never visited; zeros keep them defined.
    alloc = torch.zeros if varlen else torch.empty
    if out is None:
        out = alloc((B, Tq, Hq, D), dtype=q.dtype, device=q.device)
    elif out.shape != q.shape or out.dtype != q.dtype or out.stride(-1) != 1:
        raise ValueError(f"out must be {tuple(q.shape)} {q.dtype} with a contiguous last dim")
    lse = alloc((B, Hq, Tq), dtype=torch.float32, device=q.device)
    if B == 0 or Tq == 0 or Hq == 0:
        return out, lse

    prune = check_prune_delta(prune_delta, B, Hq, q)
    cfg = fwd_config(D, q)
    block_d = block_d_for(D)
    if varlen:
        n_blocks, n_z = triton.cdiv(int(max_seqlen), cfg.block_m), cu_seqlens.numel() - 1
        cu = cu_seqlens.contiguous()  # read as CuSeqlens + i: a strided view would give wrong bounds
    else:
        n_blocks, n_z = triton.cdiv(Tq, cfg.block_m), B
        cu = lse  # placeholder pointer, never read
    grid = launch_grid(n_blocks, Hq, n_z)
    if prune:
        bound = tile_bounds(c, prune_delta, cu, varlen, n_z, Tq, Tk, n_blocks, cfg.block_m, cfg.block_n, False)
    elif block_d <= BOUNDED_RANGE_MAX_D:
        bound, prune = torch.zeros((n_z, Hq, n_blocks), dtype=torch.int32, device=q.device), True
    else:
        bound = c  # placeholder pointer, never read
    _fwd_kernel[grid](
        q, k, v, c, out, lse, cu, bound,
        q.stride(0), q.stride(1), q.stride(2),
        k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2),
        out.stride(0), out.stride(1), out.stride(2),
        c.stride(0), c.stride(1),
        lse.stride(0), lse.stride(1),
        Tq, Tk, float(scale) * math.log2(math.e), n_blocks, Hq,
        GROUP=Hq // Hkv, HEAD_DIM=D,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_D=block_d,
        MASK_D=(block_d != D), IS_VARLEN=varlen, DOT_PRECISION=dot_precision(q.dtype),
        UPCAST=upcast_dots(q), PRUNE=prune,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, **LAUNCH_OPTIONS,
    )
    return out, lse
