"""Forgetting Attention for decoding: a few new queries against a long (possibly evicted) KV cache.

For query row i at key position p_i = Tk - Tq + i and live keys start[b, g] <= j <= p_i:

    out_i = softmax_j(scale * q_i . k_j + c[p_i] - c[j]) @ v

The Triton kernel splits the keys of each (batch, kv head) across programs (flash decoding): at
batch 1 a 64K cache still yields hundreds of programs. One program packs the whole GQA group and
all Tq queries as the rows of one tile, so every key and value row is read once per kv head.
Partial results (unnormalised out, running max and sum in base 2) are merged by a second kernel.

c stays float64 until the subtraction c[p_i] - c[j]: both operands are large at long context and
their difference is what matters (see cumsum.py).
"""
from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from typing import Optional

import torch
import triton
import triton.language as tl

from ..gpu import on_gpu_of_inputs
from .checks import CACHE_BACKENDS, check_backend, check_softmax_scale, check_triton_device
from .decode_checks import check_decode
from .paging import gather_live
from .tiles import LAUNCH_OPTIONS, launch_grid

LOG2E = tl.constexpr(1.4426950408889634)
# The Triton path reads a tensor seq_len on the device (no host sync), so a CUDA graph can replay a decode call
# while the cache grows (models/kvcache/graphs.py); the portable ops of a standalone export cannot.
READS_LENGTH_ON_DEVICE = True

# Keys per program at least this many: fewer and the merge costs more than the split gains.
_MIN_KEYS_PER_SPLIT = 256
_DEFAULT_TARGET_PROGRAMS = 4 * 132  # a few waves on an H100/H200 (132 SMs)


def _interpreted(t: torch.Tensor) -> bool:
    return t.device.type == "cpu" or os.environ.get("TRITON_INTERPRET", "0") == "1"


def forgetting_attention_decode(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, c: torch.Tensor,
                                start: Optional[torch.Tensor] = None, *, page_table: Optional[torch.Tensor] = None,
                                seq_len: Optional[int | torch.Tensor] = None, softmax_scale: Optional[float] = None,
                                backend: str = "auto", num_splits: Optional[int] = None) -> torch.Tensor:
    """Attention of the last ``Tq`` positions against a cache, dense or paged (the Triton kernel is forward only,
    and warns where its inputs require grad; the torch path is differentiable).

    Args:
        q: [B, Tq, Hq, D], the newest Tq positions (Tq small: 1 for decoding, a few for speculative or
            chunked steps; any Tq is correct, but prefill is faster with ``forgetting_attention``).
        k, v: dense [B, Tk, Hkv, D] (may be strided views of larger buffers, the last dim contiguous), or
            with ``page_table`` page pools [P, PAGE, D].
        c: float64 running gate cumsum (gate_cumsum's dtype; any other dtype is a TypeError: the bias
            c_i - c_j of two large entries needs its low bits): dense [B, Tk, Hq] (may be a transposed view of
            a [B, Hq, cap] buffer), or with ``page_table`` a pool [P, PAGE, G] (G = Hq // Hkv: the c of the query
            heads of a kv head, for the keys of that page). Finite at every live key (a ValueError where values are
            checked: below); a dead key's may be anything.
        start: int [B, Hkv] first live key per (batch, kv head) (eviction); None (or a negative
            start) means 0. Every start must be <= seq_len - Tq (each query keeps at least its own key).
            The values (start, seq_len, the pages read, c) are checked (ValueError) for CPU tensors, and on a GPU,
            where checking costs a device sync, only with FOXFORMER_CHECK_VALUES=1: unchecked, a start past a
            query's position or a non-finite c gives NaN in that query's rows.
        page_table: int [B, Hkv, NP] or None (dense). Key j of (b, h) is row j % PAGE of page
            page_table[b, h, j // PAGE]; entries for keys before ``start`` are never read (their pages
            may belong to another head), so an evicting cache frees a head's dead pages on their own.
        seq_len: positions held (dead ones included; the queries are the last Tq of them): None (dense:
            Tk), an int, or a one-element integer tensor on q's device, read on the device (no host sync:
            a CUDA graph can replay the call as the cache grows). Keys past it are never read. One length for
            every row (not flash_attn's per-row cache_seqlens): rows of different lengths end at the same
            position, left-padded, with start[b] = row b's padding.
        softmax_scale: defaults to 1 / sqrt(D); else a finite number, as in forgetting_attention.
        backend: "auto" (triton for CUDA tensors, torch otherwise) | "triton" | "torch".
        num_splits: key splits per (batch, kv head) for the Triton kernel (None: enough to fill the GPU for
            the storage's capacity, whatever seq_len is, so that a cache decodes with one kernel and one
            split count from its first step to its last). At most one per key block of the kernel
            (ceil(capacity / DECODE_TILES.block_n) on a GPU, / 16 interpreted): a larger count is clamped to
            the largest power of two within that.

    Returns:
        out [B, Tq, Hq, D] in q's dtype.
    """
    capacity = check_decode(q, k, v, c, start, page_table, seq_len)
    scale = check_softmax_scale(softmax_scale, q.shape[-1])
    if num_splits is not None and (isinstance(num_splits, bool) or not isinstance(num_splits, int) or num_splits < 1):
        raise ValueError(f"num_splits must be None or an int >= 1, got {num_splits!r}")
    check_backend(backend, CACHE_BACKENDS)
    if backend == "auto":
        backend = "triton" if q.is_cuda else "torch"
    if backend == "triton":
        check_triton_device(q)
        if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v, c)):
            # a warning, not an error: a sampling loop without torch.no_grad() wants the values only
            warnings.warn("forgetting_attention_decode: the triton backend is forward only, so its output carries "
                          "no gradient to q, k, v or c; run it under torch.no_grad(), or use backend='torch' for "
                          "gradients", stacklevel=2)
        return triton_decode(q, k, v, c, start, scale, num_splits, page_table, capacity if seq_len is None
                             else seq_len, capacity)
    n = capacity if seq_len is None else int(seq_len)  # a device sync on a GPU: the torch path is no graph's
    if page_table is None:
        k, v, c, first = k[:, :n], v[:, :n], c[:, :n], 0
    else:
        if start is None:
            start = page_table.new_zeros(page_table.shape[:2], dtype=torch.int64)
        # From the first page any head still reads (torch_decode reads from start.min() anyway).
        first = int(start.clamp(min=0).min()) // k.shape[1] * k.shape[1] if start.numel() else 0
        k, v, c, _ = gather_live(k, v, c, page_table, first, n, start)
    return torch_decode(q, k, v, c, start if start is None else start - first, scale)


# --------------------------------------------------------------------------------------------
# PyTorch path (CPU, reference)
# --------------------------------------------------------------------------------------------

_TORCH_CHUNK_ELEMENTS = 1 << 24


def torch_decode(q, k, v, c, start, scale) -> torch.Tensor:
    """Masked dense attention over the live keys; queries chunked to bound memory."""
    B, Tq, Hq, D = q.shape
    Tk, Hkv = k.shape[1], k.shape[2]
    G = Hq // Hkv
    if q.numel() == 0:  # Tq == 0: no query chunks for torch.cat; B == 0: start.min() of nothing (as Triton)
        return torch.empty_like(q)
    first = 0 if start is None else max(0, int(start.min()))  # a negative start hides nothing
    calc = torch.float64 if q.dtype == torch.float64 else torch.float32
    kk = k[:, first:].to(calc)
    vv = v[:, first:].to(calc)
    ck = c[:, first:].double()                                            # [B, N, Hq]
    N = Tk - first
    keys = torch.arange(first, Tk, device=q.device)
    live = None if start is None else keys[None, None, :] >= start[:, :, None].to(keys.device)  # [B, Hkv, N]
    rows = max(1, _TORCH_CHUNK_ELEMENTS // max(1, B * Hq * N))
    outs = []
    for i0 in range(0, Tq, rows):
        i1 = min(Tq, i0 + rows)
        qq = q[:, i0:i1].to(calc).view(B, i1 - i0, Hkv, G, D)
        s = torch.einsum("bthgd,bnhd->bhgtn", qq, kk) * scale             # [B, Hkv, G, t, N]
        pos = torch.arange(Tk - Tq + i0, Tk - Tq + i1, device=q.device)
        cq = c[:, Tk - Tq + i0:Tk - Tq + i1].double()                       # [B, t, Hq]
        bias = cq.transpose(1, 2)[..., None] - ck.transpose(1, 2)[:, :, None, :]  # [B, Hq, t, N]
        s = s + bias.view(B, Hkv, G, i1 - i0, N).to(calc)
        visible = keys[None, :] <= pos[:, None]                           # [t, N]
        mask = visible[None, None, None]
        if live is not None:
            mask = mask & live[:, :, None, None, :]
        s = s.masked_fill(~mask, float("-inf"))
        p = torch.softmax(s, dim=-1)
        o = torch.einsum("bhgtn,bnhd->bthgd", p, vv)
        outs.append(o.reshape(B, i1 - i0, Hq, D))
    return torch.cat(outs, 1).to(q.dtype)


# --------------------------------------------------------------------------------------------
# Triton path
# --------------------------------------------------------------------------------------------


@triton.jit
def _decode_split_kernel(
    Q, K, V, C, START, TABLE, SEQ, PO, PM, PL,
    stride_qb, stride_qt, stride_qh,
    stride_kb, stride_kt, stride_kh,
    stride_vb, stride_vt, stride_vh,
    stride_cb, stride_ct, stride_ch,
    stride_sb, stride_sh,
    stride_tb, stride_th,
    Tq, Tk, Hkv, scale_log2,
    G: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr, NUM_SPLITS: tl.constexpr, HAS_START: tl.constexpr, UPCAST: tl.constexpr,
    PRECISION: tl.constexpr, PAGED: tl.constexpr, DYN_LEN: tl.constexpr, PAGE: tl.constexpr,
):
    """One (batch, kv head, key split): rows are (query t, group head g) pairs, row = t * G + g.

    PAGED: K, V are page pools [P, PAGE, D] and C [P, PAGE, G] (the stride_*b are page strides, the
    stride_*h unused, stride_ch steps along the group); TABLE[b, hkv, j // PAGE] is key j's page.
    DYN_LEN: the number of positions Tk is read from SEQ (a device tensor), not passed by the host.
    PAGE is a compile-time constant (one page size in use: kvcache.pages.PAGE_SIZE): every key's page and row
    are then a shift and a mask, where a runtime page size costs an integer division per key.
    """
    # One flat grid axis (see tiles.launch_grid); the splits of one (batch, kv head) are neighbours.
    pid_bh = tl.program_id(0) // NUM_SPLITS
    split = tl.program_id(0) % NUM_SPLITS
    # int64: b * stride_kb passes 2^31 elements once a layer's cache buffer does (batch 64 at a 64K
    # cache with 12 x 64 heads), and int32 offsets would then wrap silently.
    b = (pid_bh // Hkv).to(tl.int64)
    hkv = pid_bh % Hkv
    if DYN_LEN:
        Tk = tl.load(SEQ).to(tl.int32)

    first = 0
    if HAS_START:
        # a negative start hides nothing; unclamped, the loop would read before the cache
        first = tl.maximum(tl.load(START + b * stride_sb + hkv * stride_sh).to(tl.int32), 0)
    # Each head splits its own live range [first, Tk): ragged heads stay balanced, and the host never
    # has to read the starts (no device sync per layer and step).
    per_split = tl.cdiv(tl.cdiv(Tk - first, NUM_SPLITS), BLOCK_N) * BLOCK_N
    lo = first + split * per_split
    hi = tl.minimum(lo + per_split, Tk)

    rows = tl.arange(0, BLOCK_M)
    t = rows // G
    g = rows % G
    row_ok = t < Tq
    head = hkv * G + g
    pos = Tk - Tq + t
    d = tl.arange(0, BLOCK_D)
    d_ok = d < D

    q_ptrs = Q + b * stride_qb + t[:, None] * stride_qt + head[:, None] * stride_qh + d[None, :]
    q = tl.load(q_ptrs, mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
    if PAGED:
        table = TABLE + b * stride_tb + hkv * stride_th
        page_q = tl.load(table + pos // PAGE, mask=row_ok, other=0).to(tl.int64)
        c_q = tl.load(C + page_q * stride_cb + (pos % PAGE) * stride_ct + g * stride_ch, mask=row_ok, other=0.0)
    else:
        c_q = tl.load(C + b * stride_cb + pos * stride_ct + head * stride_ch, mask=row_ok, other=0.0)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    if PAGED:
        k_base = K
        v_base = V
        c_base = C + g * stride_ch
    else:
        k_base = K + b * stride_kb + hkv * stride_kh
        v_base = V + b * stride_vb + hkv * stride_vh
        c_base = C + b * stride_cb + head * stride_ch
    for n0 in range(lo, hi, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)
        n_ok = n < hi
        if PAGED:
            # One page lookup per key: the live range starts anywhere, so a block may straddle two pages.
            page = tl.load(table + n // PAGE, mask=n_ok, other=0).to(tl.int64)
            k_row = page * stride_kb + (n % PAGE) * stride_kt
            v_row = page * stride_vb + (n % PAGE) * stride_vt
            c_row = page * stride_cb + (n % PAGE) * stride_ct
        else:
            k_row = n * stride_kt
            v_row = n * stride_vt
            c_row = n * stride_ct
        kt = tl.load(k_base + k_row[None, :] + d[:, None], mask=n_ok[None, :] & d_ok[:, None], other=0.0)
        vt = tl.load(v_base + v_row[:, None] + d[None, :], mask=n_ok[:, None] & d_ok[None, :], other=0.0)
        if UPCAST:
            kt = kt.to(tl.float32)
        s = tl.dot(q, kt, input_precision=PRECISION) * scale_log2
        c_k = tl.load(c_base[:, None] + c_row[None, :], mask=row_ok[:, None] & n_ok[None, :], other=0.0)
        s += ((c_q[:, None] - c_k) * LOG2E).to(tl.float32)
        ok = n_ok[None, :] & (n[None, :] <= pos[:, None]) & row_ok[:, None]
        s = tl.where(ok, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        # Rows with nothing visible yet keep m = -inf: subtract 0 instead to avoid nan.
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_safe)
        p = tl.exp2(s - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        if UPCAST:
            acc = acc * alpha[:, None] + tl.dot(p, vt.to(tl.float32), input_precision=PRECISION)
        else:
            acc = acc * alpha[:, None] + tl.dot(p.to(vt.dtype), vt, input_precision=PRECISION)
        m_i = m_new

    part = (pid_bh * NUM_SPLITS + split) * BLOCK_M + rows
    tl.store(PM + part, m_i)
    tl.store(PL + part, l_i)
    tl.store(PO + part[:, None] * BLOCK_D + d[None, :], acc)


@triton.jit
def _decode_merge_kernel(
    PO, PM, PL, OUT,
    stride_ob, stride_ot, stride_oh,
    Tq, Hkv,
    G: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr,
    NUM_SPLITS: tl.constexpr, BLOCK_S: tl.constexpr,
):
    """One (batch, kv head, row): rescale the splits to a common max and normalise."""
    # One flat grid axis: G * Tq rows pass 65535, a second axis's limit, at a chunk of 8K queries with G = 8.
    pid_bh = tl.program_id(0) // (G * Tq)
    row = tl.program_id(0) % (G * Tq)
    b = (pid_bh // Hkv).to(tl.int64)  # as in the split kernel: out's batch offset may pass 2^31
    hkv = pid_bh % Hkv
    t = row // G
    g = row % G
    s = tl.arange(0, BLOCK_S)
    s_ok = s < NUM_SPLITS
    part = (pid_bh * NUM_SPLITS + s) * BLOCK_M + row
    m = tl.load(PM + part, mask=s_ok, other=float("-inf"))
    l = tl.load(PL + part, mask=s_ok, other=0.0)
    m_max = tl.max(m, 0)
    w = tl.where(m == float("-inf"), 0.0, tl.exp2(m - m_max))
    denom = tl.sum(l * w, 0)
    d = tl.arange(0, BLOCK_D)
    o = tl.load(PO + part[:, None] * BLOCK_D + d[None, :], mask=s_ok[:, None], other=0.0)
    o = tl.sum(o * w[:, None], 0) / denom
    head = hkv * G + g
    tl.store(OUT + b * stride_ob + t * stride_ot + head * stride_oh + d, o.to(OUT.dtype.element_ty), mask=d < D)


@dataclass(frozen=True)
class DecodeTiles:
    """Keys per loop step of the split kernel, its warps and software-pipeline depth (GPU only: the
    interpreter runs 16-key blocks on one warp)."""

    block_n: int = 128
    num_warps: int = 4
    num_stages: int = 2


# scripts/tune_decode.py on one H200 (twelfth session, docs/bench/decode_tune_e502ffc_h200.json; 12 heads of 64,
# bf16, 32K cache, inside CUDA graphs): 128-key steps with 4 warps and 2 stages at the default split counts,
# batch 1 32.5 us and batch 32 761 us, against 38.4 / 815 us for 64-key steps (SDPA 29.9 / 719 us). Single
# timings: deeper pipelines and other split counts scattered within ~15% at batch 1, none better at both. At the 760M
# head shape (24 heads of 64; docs/bench/decode_tune_760m_307870b_h200.json) the same tiles were the best of 48,
# 55.4 us at batch 1 (3.75 TB/s).
DECODE_TILES = DecodeTiles()


# The key blocks that fit shared memory, by (device, dtype, BLOCK_D, paged, tiles): DECODE_TILES suit D 64 / 128 in
# bf16, but fp32 at D 192-256 asked for 303 KB and bf16 above D 256 for 299 KB, against an H100's 227 KB (fifty-third
# session, scripts: OutOfResources at launch), and a GPU with less shared memory (99 KB on sm_86 / sm_89) runs out
# sooner. Halving the block on the first refusal is remembered, so each shape pays one failed compile per process.
_FITTING_BLOCK_N: dict[tuple, int] = {}
_SMALLEST_BLOCK_N = 16


def _block_n(interpreted: bool, tiles: DecodeTiles = DECODE_TILES) -> int:
    return _SMALLEST_BLOCK_N if interpreted else tiles.block_n


def _pick_splits(B: int, Hkv: int, keys: int, num_splits: Optional[int], interpreted: bool,
                 tiles: DecodeTiles = DECODE_TILES, block_n: Optional[int] = None) -> int:
    if num_splits is not None:
        if num_splits < 1:
            raise ValueError(f"num_splits must be >= 1, got {num_splits}")
        # A split past the last key block reads nothing yet costs a program and BLOCK_M scratch rows
        # (10**6 splits: GiBs). Clamped rather than refused: a fixed count is valid once the cache has
        # grown, and a short cache early in a generation should not fail on it. A power of two, as below,
        # so that a cache growing to num_splits blocks compiles a few kernels, not one per block.
        blocks = max(1, triton.cdiv(keys, block_n or _block_n(interpreted, tiles)))
        return num_splits if num_splits <= blocks else 1 << (blocks.bit_length() - 1)
    if interpreted:
        return max(1, min(4, triton.cdiv(keys, 32)))
    want = triton.cdiv(_DEFAULT_TARGET_PROGRAMS, B * Hkv)
    splits = max(1, min(want, triton.cdiv(keys, _MIN_KEYS_PER_SPLIT), 128))
    # A power of two: NUM_SPLITS is a compile-time constant, and a cache growing by one key per step
    # would otherwise compile a new kernel every 256 keys (mid-generation, ~1 s each).
    return 1 << (splits.bit_length() - 1)


@on_gpu_of_inputs
def triton_decode(q, k, v, c, start, scale, num_splits, table, seq_len, capacity,
                  tiles: DecodeTiles = DECODE_TILES) -> torch.Tensor:
    """The Triton path of forgetting_attention_decode, unchecked (tiles: for scripts/tune_decode.py).

    table: None (k, v [B, Tk, Hkv, D], c [B, Tk, Hq]) or [B, Hkv, NP] with k, v page pools [P, PAGE, D]
    and c [P, PAGE, G]; seq_len an int or a device tensor (read by the kernel); capacity sizes the splits."""
    D = q.shape[-1]
    if table is None:
        Hkv, page_size = k.shape[2], 1
        table = c  # a placeholder, never read (as st below)
        k_strides = (k.stride(0), k.stride(1), k.stride(2))
        v_strides = (v.stride(0), v.stride(1), v.stride(2))
    else:
        Hkv, page_size = table.shape[1], k.shape[1]
        # the kernel steps through a head's pages as TABLE + j // PAGE: a view with a last stride of 2 (a slice of a
        # wider table) read every other entry's page, silently
        table = table if table.stride(-1) == 1 else table.contiguous()
        k_strides = (k.stride(0), k.stride(1), 0)
        v_strides = (v.stride(0), v.stride(1), 0)
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.stride(-1) != 1 and t.shape[-1] != 1:  # D = 1: one element per row, any stride (fwd.py)
            raise ValueError(f"{name} must have a contiguous last dim for the triton backend (stride {t.stride(-1)} "
                             f"there); pass {name}.contiguous(), or use backend='torch'")
    if q.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise TypeError(f"the Triton decode kernel takes fp32, fp16 or bf16 q/k/v, got {q.dtype} "
                        f"(use backend='torch' for fp64)")
    interp = _interpreted(q)
    c = c if c.dtype == torch.float64 else c.double()
    block_d = max(16, triton.next_power_of_2(D))
    fit_key = (q.device, q.dtype, block_d, k.dim() == 3, tiles)
    block_n = _FITTING_BLOCK_N.get(fit_key, _block_n(interp, tiles))
    while True:
        try:
            return _launch(q, k, v, c, start, scale, num_splits, table, seq_len, capacity, tiles, block_n,
                           block_d, Hkv, page_size, k_strides, v_strides, interp)
        except triton.runtime.errors.OutOfResources as exc:
            if block_n <= _SMALLEST_BLOCK_N:
                raise ValueError(f"the Triton decode kernel does not fit head dim {D} in {q.dtype} into this GPU's "
                                 f"shared memory, even {block_n} keys at a time; use backend='torch'") from exc
            block_n //= 2
            _FITTING_BLOCK_N[fit_key] = block_n


def _launch(q, k, v, c, start, scale, num_splits, table, seq_len, capacity, tiles, block_n, block_d, Hkv, page_size,
            k_strides, v_strides, interp) -> torch.Tensor:
    """Both kernels of triton_decode with BLOCK_N = block_n (OutOfResources where its tiles do not fit)."""
    B, Tq, Hq, D = q.shape
    G = Hq // Hkv
    dyn_len = isinstance(seq_len, torch.Tensor)
    # Sized for the whole storage: reading the live lengths (or a device seq_len) would cost a device sync.
    splits = _pick_splits(B, Hkv, capacity, num_splits, interp, tiles, block_n)
    block_m = max(16, triton.next_power_of_2(G * Tq))
    # One scratch allocation for the partial outputs, maxima and sums, and no placeholder tensor for an
    # absent start (c stands in; never read): at batch 1 a decode call is launch-bound, not GPU-bound.
    rows = B * Hkv * splits * block_m
    scratch = torch.empty(rows * (block_d + 2), device=q.device, dtype=torch.float32)
    po = scratch[:rows * block_d].view(rows, block_d)
    pm, pl = scratch[rows * block_d:].view(2, rows).unbind(0)
    out = torch.empty_like(q)
    st = start if start is not None else c
    upcast = interp and q.dtype == torch.bfloat16  # the interpreter's bf16 dot is wrong; never on a GPU
    _decode_split_kernel[launch_grid(splits, B * Hkv, 1)](
        q, k, v, c, st, table, seq_len if dyn_len else st, po, pm, pl,
        q.stride(0), q.stride(1), q.stride(2),
        *k_strides, *v_strides,
        c.stride(0), c.stride(1), c.stride(2),
        st.stride(0), st.stride(1),
        table.stride(0), table.stride(1),
        Tq, 0 if dyn_len else seq_len, Hkv, scale * 1.4426950408889634,
        G=G, D=D, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d, NUM_SPLITS=splits,
        HAS_START=start is not None, UPCAST=upcast,
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32", PAGED=k.dim() == 3, DYN_LEN=dyn_len,
        PAGE=page_size,
        num_warps=1 if interp else tiles.num_warps, num_stages=1 if interp else tiles.num_stages, **LAUNCH_OPTIONS,
    )
    _decode_merge_kernel[launch_grid(G * Tq, B * Hkv, 1)](
        po, pm, pl, out,
        out.stride(0), out.stride(1), out.stride(2),
        Tq, Hkv,
        G=G, D=D, BLOCK_M=block_m, BLOCK_D=block_d, NUM_SPLITS=splits,
        BLOCK_S=max(2, triton.next_power_of_2(splits)),
        num_warps=1 if interp else 2, **LAUNCH_OPTIONS,
    )
    return out
