"""Launches of the Gluon Hopper kernels: tile configs, TMA descriptors and grids.

Each ``*_launch`` function builds a ``aot.Launch`` from the op's tensors, so the GPU path and the
off-GPU compile tests share every argument, constexpr and option.
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
import os
from dataclasses import dataclass

import torch
import triton

from ..bwd import row_deltas
from ..tiles import LAUNCH_OPTIONS, launch_grid, tile_bounds
from .aot import Launch
from .bwd import dkdv_kernel, dq_kernel
from .compat import TensorDescriptor, gl
from .common import WG_ROWS
from .fwd import fwd_kernel

BLOCK_M = 2 * WG_ROWS.value
# Compile options of every Gluon launch: one warpgroup runs the default partition (the loader's setup).
OPTIONS = dict(num_warps=4, **LAUNCH_OPTIONS)


@dataclass(frozen=True)
class FwdConfig:
    """block_n: keys per stage; num_stages: depth of the K/V/c ring; num_wg: consumer warpgroups, 64 query
    rows each (the CTA's tile is 64 * num_wg rows); consumer_regs: their setmaxnreg (the loader warpgroup
    gets what is left of the 64K registers); fold_row: unmasked tiles leave the query's c out of the
    scores and into the row maximum (fwd._tile_softmax), one ALU operation per score fewer; overlap: QK^T of
    tile i is issued beside PV of tile i - 1 and the softmax runs while PV does (fwd._fwd_loop_overlap; P stays in
    registers meanwhile, so a config that spills may compute garbage); head_group: how many (sequence, head)
    pairs share the heaviest-first launch order (common.heaviest_first; 1: each head in turn); split_loops: without
    overlap, the unmasked and the masked tiles run in loops of their own (fwd._fwd_loop); max_free: bf16 calls take
    no row maximum and never rescale O (fwd.fwd_kernel's MAX_FREE), summing each row's P twice: in fp32 registers
    for the lse and by one more wgmma a tile (P times ones) for O's divisor; then a second launch of the same kernel
    without it computes again the tiles where a row's sum left the window (none, unless a row's log-sum-exp is beyond
    ~44 nats)."""

    block_n: int
    num_stages: int
    num_wg: int = 2
    consumer_regs: int = 240
    fold_row: bool = True
    overlap: bool = False
    head_group: int = 4
    split_loops: bool = False
    max_free: bool = False


# Chosen by `scripts/hopper_tune.py fwd` on one H200 (torch 2.11, Triton 3.6, bf16, B * T = 32K, T = 16K), JSONs in
# docs/bench/: D 64 three consumer warpgroups (4.53 against 4.90 ms for two: hopper_tune_h200.json), a ring three
# 128-key stages deep (two / four: 4.91 / 4.82 against 4.09: hopper_tune_5de7330_h200.json; 256-key stages, two
# warpgroups, on an H100: 4.44-4.63 against 3.85-3.97: hopper_tune_bn256_c8fbaa6_h100.json), the query's c folded into
# the row maximum (4.04-4.10 against 4.58-4.61: hopper_tune_fold_h200.json), no overlap (4.41-5.3 against 4.03, and
# wrong output where it spilled: hopper_tune_overlap_h200.json); D 128 the overlap with the fold (3.00-3.06 against
# 3.53-3.57: hopper_tune_overlap*_h200.json); both, tiles started heaviest first in groups of 4 (sequence, head) pairs
# (D 64 3.98-4.05 against 4.35 one head at a time: hopper_tune_787a5d3_h200.json); D 128 without a row maximum
# (2.70 against 3.00-3.04 ms with its sums by wgmma alone: hopper_tune_max_free_h200.json, thirty-sixth session; at
# D 64 level, 3.95 against 3.94-3.96). What else was tried and removed: docs/benchmarks.md, "Hopper kernel variants
# tried and removed".
FWD_CONFIGS = {64: FwdConfig(block_n=128, num_stages=3, num_wg=3, consumer_regs=160),
               128: FwdConfig(block_n=128, num_stages=2, overlap=True, max_free=True)}

@contextlib.contextmanager
def fwd_options(changes: dict):
    """FWD_CONFIGS with fields replaced while the block runs, to time an option before it becomes a default
    (``foxformer bench model --gluon-fwd``). changes: {head dim or None (every head dim): {field: value}}; every
    change is checked (a head dim with a config, a field FwdConfig has) before any applies."""
    new = {}
    for dim, fields in changes.items():
        for D in (FWD_CONFIGS if dim is None else [dim]):
            if D not in FWD_CONFIGS:
                raise ValueError(f"gluon forward options: no config for head dim {D} (have {sorted(FWD_CONFIGS)})")
            unknown = sorted(set(fields) - {f.name for f in dataclasses.fields(FwdConfig)})
            if unknown:
                raise ValueError(f"gluon forward options: FwdConfig has no field {', '.join(unknown)}")
            new[D] = dataclasses.replace(new.get(D, FWD_CONFIGS[D]), **fields)
    old = dict(FWD_CONFIGS)
    FWD_CONFIGS.update(new)
    try:
        yield
    finally:
        FWD_CONFIGS.clear()
        FWD_CONFIGS.update(old)


_GL_DTYPES = {torch.bfloat16: "bfloat16", torch.float16: "float16"}


def _gl_dtype(t: torch.dtype):
    return getattr(gl, _GL_DTYPES[t])


def _outputs(*shapes_dtypes, device) -> list[torch.Tensor]:
    """Output buffers. Every element is written by the kernels (varlen segments cover all tokens), so they
    start uninitialised; FOXFORMER_POISON_OUTPUTS=1 fills them with NaN instead, for tests that catch an
    element no kernel wrote."""
    if os.environ.get("FOXFORMER_POISON_OUTPUTS", "0") == "1":
        return [torch.full(shape, float("nan"), dtype=dtype, device=device) for shape, dtype in shapes_dtypes]
    return [torch.empty(shape, dtype=dtype, device=device) for shape, dtype in shapes_dtypes]


def rows_descriptor(x: torch.Tensor, block_rows: int) -> TensorDescriptor:
    """TMA descriptor of x [B, T, H, D] as [B, T, H * D] (heads packed), one [1, block_rows, D] tile per
    copy: rows past T are zero-filled per batch entry, never read from the next one."""
    B, T, H, D = x.shape
    block = [1, block_rows, D]
    layout = gl.NVMMASharedLayout.get_default_for(block, _gl_dtype(x.dtype))
    return TensorDescriptor(x, [B, T, H * D], [x.stride(0), x.stride(1), 1], block, layout)


def packed_strides(x: torch.Tensor) -> tuple[int, int, int]:
    """(batch, token, head) strides of a [B, T, H, D] tensor the kernels read or write 16 bytes at a time
    (outputs, and O / dO beside dQ): ``common.row_starts`` rounds each row's offset down to a multiple of 8
    elements, so each stride must be one. Every such tensor is allocated or made contiguous here, D in {64, 128}."""
    if x.stride(3) != 1 or any(s % 8 for s in x.stride()[:3]):
        raise ValueError(f"the Gluon kernels need [B, T, H, D] strides in multiples of 8 elements and a unit last "
                         f"stride, got {tuple(x.stride())}")
    return x.stride(0), x.stride(1), x.stride(2)


def fwd_block_m(cfg: FwdConfig) -> int:
    return cfg.num_wg * WG_ROWS.value


def forward_launch(q, k, v, c, out, lse, cu, bound, scale: float, n_blocks: int, n_z: int,
                   varlen: bool, prune: bool, cfg: FwdConfig, redo: bool = False) -> Launch:
    """redo: the launch after a max_free one, which computes only the tiles whose lse that one left NaN."""
    B, Tq, Hq, D = q.shape
    Tk, Hkv = k.shape[1], k.shape[2]
    args = (rows_descriptor(q, WG_ROWS.value), rows_descriptor(k, cfg.block_n), rows_descriptor(v, cfg.block_n),
            c, out, lse, cu, bound,
            *packed_strides(out), c.stride(0), c.stride(1), lse.stride(0), lse.stride(1),
            Tq, Tk, float(scale) * math.log2(math.e), n_blocks, Hq, Hq // Hkv)
    constexprs = dict(HEAD_DIM=D, BLOCK_N=cfg.block_n, NUM_WG=cfg.num_wg, NUM_STAGES=cfg.num_stages,
                      IS_VARLEN=varlen, PRUNE=prune, CONSUMER_REGS=cfg.consumer_regs, FOLD_ROW=cfg.fold_row,
                      OVERLAP=cfg.overlap, SPLIT_LOOPS=cfg.split_loops, HEAD_GROUP=cfg.head_group,
                      MAX_FREE=cfg.max_free, REDO=redo)
    return Launch(fwd_kernel, launch_grid(n_blocks, Hq, n_z), args, constexprs, OPTIONS)


# Local memory a forward kernel may use: a few scalars. Beyond it P (kept in registers across a wgmma) may have gone
# to local memory and come back wrong: a D 64 config spilling 24 bytes gave wrong output on the H200. The max-free
# forward at D 128 spills 88 bytes with Triton 3.9 (ptxas 13) and none with 3.6: where it does, gluon_forward runs
# the call again with the row maximum and stops trying that kernel (_MAX_FREE_SPILLS: head dim, varlen, prune).
FWD_LOCAL_BYTES = 16
_MAX_FREE_SPILLS: set[tuple[int, bool, bool]] = set()


def gluon_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, c: torch.Tensor, scale: float,
                  cu_seqlens: torch.Tensor | None = None, max_seqlen: int | None = None,
                  *, prune_delta: torch.Tensor | None = None, cfg: FwdConfig | None = None,
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Forgetting Attention forward on Hopper; the contract of ``fwd.triton_forward`` (the caller has
    checked coverage with ``dispatch.unsupported``).

    q [B, Tq, Hq, D]; k, v [B, Tk, Hkv, D] (heads packed: stride(2) == D); c float64 [B, Hq, Tk];
    prune_delta optional float64 [B, Hq]. Returns out [B, Tq, Hq, D] and lse float32 [B, Hq, Tq].
    """
    B, Tq, Hq, D = q.shape
    Tk = k.shape[1]
    cfg = cfg or FWD_CONFIGS[D]
    # the launch that redoes a max_free one's out-of-window tiles
    regular = dataclasses.replace(cfg, max_free=False) if cfg.max_free else cfg
    varlen, prune = cu_seqlens is not None, prune_delta is not None
    if q.dtype != torch.bfloat16 or (D, varlen, prune) in _MAX_FREE_SPILLS:
        # fp16's range (2^-24 to 2^16) cannot hold P without its row maximum taken out
        cfg = regular
    c = c.contiguous()
    out, lse = _outputs(((B, Tq, Hq, D), q.dtype), ((B, Hq, Tq), torch.float32), device=q.device)
    block_m = fwd_block_m(cfg)
    if varlen:
        n_blocks, n_z, cu = triton.cdiv(int(max_seqlen), block_m), cu_seqlens.numel() - 1, cu_seqlens.contiguous()
    else:
        n_blocks, n_z, cu = triton.cdiv(Tq, block_m), B, lse  # lse: a placeholder pointer, never read
    bound = (tile_bounds(c, prune_delta, cu, varlen, n_z, Tq, Tk, n_blocks, block_m, cfg.block_n, False)
             if prune else lse)
    compiled = forward_launch(q, k, v, c, out, lse, cu, bound, scale, n_blocks, n_z, varlen, prune, cfg).run()
    if cfg.max_free and 4 * compiled.n_spills > FWD_LOCAL_BYTES:  # Triton's n_spills: local bytes / 4
        _MAX_FREE_SPILLS.add((D, varlen, prune))
        forward_launch(q, k, v, c, out, lse, cu, bound, scale, n_blocks, n_z, varlen, prune, regular).run()
    elif cfg.max_free:
        forward_launch(q, k, v, c, out, lse, cu, bound, scale, n_blocks, n_z, varlen, prune, regular, redo=True).run()
    return out, lse


@dataclass(frozen=True)
class BwdConfig:
    """dkdv_block_m: query rows per stage of the key-stationary dk/dv kernel (its CTA holds 128 keys);
    dq_block_n: keys per stage of the dq kernel, whose CTA holds dq_num_wg consumer warpgroups of 64 query
    rows; *_stages: ring depths; *_regs: the consumers' setmaxnreg; head_group: as FwdConfig's, for both
    kernels; fused_delta: the dq kernel computes the row deltas (do_i . o_i) itself and runs first, so the backward
    launches no row-delta kernel (bwd._row_deltas); mma_sums: both kernels sum dS (for dc) by one more wgmma a tile,
    with a matrix of ones, instead of across registers (bwd's docstring); *_persistent: that kernel runs one CTA an SM,
    each taking its tiles in the launch order from an atomic counter, and loads a tile's operands while the last
    tile's results are stored (dq: two warpgroups only); dkdv_equal_len: the dk/dv kernel is compiled apart for
    dense calls with as many queries as keys, where the queries' offset into the keys is 0 at compile time;
    dkdv_split_loops: the dk/dv kernel runs its masked query tiles (the diagonal, the end of the sequence) and the
    unmasked ones in separate loops; dq_split_loops: the dq kernel runs its unmasked and masked key tiles in
    separate loops."""

    dkdv_block_m: int
    dkdv_stages: int
    dq_block_n: int
    dq_stages: int
    dq_num_wg: int = 2
    consumer_regs: int = 240
    dq_consumer_regs: int = 240
    head_group: int = 4
    fused_delta: bool = False
    mma_sums: bool = False
    dkdv_persistent: bool = False
    dq_persistent: bool = False
    dkdv_equal_len: bool = False
    dkdv_split_loops: bool = False
    dq_split_loops: bool = False


# Chosen by `scripts/hopper_tune.py bwd` (same setting): dk/dv with 128-row query tiles at D 64 (6.59 against 7.25 ms
# for 64) and 64-row ones at D 128 (5.49 against 6.36 for 32; hopper_tune_h200.json), two stages (a third: no gain,
# hopper_tune_73a4f5b_h200.json); dq with two warpgroups and 128-key stages (3.73 against 4.32 ms for three at 64
# keys), three stages at D 64 (dq 4.98 against 5.04 / 5.16 ms, backward 11.67 against 11.75 / 11.86:
# hopper_tune_bwd_decd3ad_h200.json); the forward's launch order (head_group 4). One head at a time (head_group 1)
# beat it in 8 of 10 sweep comparisons over five sessions
# (hopper_tune_{787a5d3,f165756,bwd_decd3ad,f68f11b,092222e}_h200.json) but lost as the default: through the op at
# 16K, forward+backward 0.834x / 0.843x CUDNN at D 64 / 128 against 0.841x / 0.847x the same day, and the sweep
# alternating the two was split (hopper_tune_7b0a783_h200.json). What else was tried and removed: docs/benchmarks.md,
# "Hopper kernel variants tried and removed".
# The row deltas from the dq kernel (fused_delta) at D 64 only: two sweeps alternating it with the row-delta kernel had
# it ahead at D 64 (backward 11.53 / 11.72 against 11.58 / 11.81 ms, then 11.63 / 11.84 against 11.76) and behind at D
# 128 (9.33 / 9.31 against 9.23 / 9.26, then 9.46 / 9.39 against 9.47): hopper_tune_{e2cd9ca,57431e1}_h200.json. The
# op's profile shows why the saving is small: the fused dq kernel is 0.05 (D 64) and 0.14 ms (D 128) slower a step,
# against 0.054 ms for the row-delta kernel (profile_attention_e2cd9ca/). The dS sums by wgmma (mma_sums) at D 64 only:
# ahead in both sweeps that alternated it with the register sums (backward 11.44 / 11.55 against 11.53-11.79 ms, then
# 11.54 / 11.52 / 11.55 against 11.62 / 11.74; dk/dv 0.2-0.25 ms faster, dq 0.1-0.15 slower), behind at D 128 (9.42 /
# 9.47 against 9.37, then 9.38 / 9.45 against 9.19-9.47): hopper_tune_{715b73a,6730da0}_h200.json.
# Persistent kernels (one CTA an SM taking tiles from a counter) at D 64 only, twenty-seventh session, the backward
# alternated with the one-CTA-a-tile kernels: dk/dv alone 11.18 / 11.29 ms against 11.43-11.50
# (hopper_tune_persistent_dkdv_h200.json), both kernels 11.24 / 11.25 against 11.51-11.56, dk/dv 6.23 / 6.26 against
# 6.40-6.48 (hopper_tune_persistent_h200.json); at D 128 9.54 / 9.38 against 9.28-9.36 (both) and 9.34 / 9.28 against
# 9.30-9.41 (dk/dv alone): no gain, and the persistent dk/dv kernel spills more there (144 against 56 bytes,
# sm_90a with Triton 3.9's ptxas).
# The code options, thirty-second session (hopper_tune_243d2a9_h200.json; every default row of a head dim within 1%):
# the dk/dv kernel's split loops at both head dims (D 128: dk/dv 5.08 ms against 5.35-5.40 for the six default rows;
# D 64: 6.07 against 6.09-6.16) and the dq kernel's at D 64 (dq 4.64 against 4.69-5.04, backward 10.69 against
# 10.73-10.89). Then alternated with the options off (hopper_tune_{9917aa4,7f71b0f}_h200.json): backward D 64
# 10.67-10.79 against 10.82-10.93 (the dq kernel's alone off: 10.86 / 10.89), D 128 8.84-8.92 against 9.03-9.17.
# Equal lengths compiled in (dkdv_equal_len) stay off: on top of the split loops D 64 dk/dv 6.07 against 6.05-6.17,
# D 128 5.21 against 5.09-5.10 (hopper_tune_7f71b0f_h200.json); again on an H100 (fifty-sixth session,
# hopper_tune_bwd_105d717_h100.json): backward D 64 10.44 against 10.40-10.71 for the six default rows, D 128 8.73
# against 8.48-8.86, where the options off read 10.60 / 10.64 and 8.95 / 9.26 and the dq kernel's split loops off
# at D 64 10.80.
BWD_CONFIGS = {64: BwdConfig(dkdv_block_m=128, dkdv_stages=2, dq_block_n=128, dq_stages=3, fused_delta=True,
                             mma_sums=True, dkdv_persistent=True, dq_persistent=True, dkdv_split_loops=True,
                             dq_split_loops=True),
               128: BwdConfig(dkdv_block_m=64, dkdv_stages=2, dq_block_n=128, dq_stages=2, dkdv_split_loops=True)}


def dq_block_m(cfg: BwdConfig) -> int:
    return cfg.dq_num_wg * WG_ROWS.value


def _sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device (132 off the GPU: an H100 / H200, for compile tests)."""
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 132


def _task_counter(n_tasks: int, persistent: bool, device: torch.device, placeholder: torch.Tensor):
    """(counter, grid) of a launch of n_tasks: persistent, one CTA an SM (at most) and a zeroed int32 counter
    from which they take every task, their first too; otherwise a CTA a task and a placeholder pointer."""
    if persistent:
        return torch.zeros(1, dtype=torch.int32, device=device), (min(n_tasks, _sm_count(device)),)
    return placeholder, (n_tasks,)


def dkdv_launch(q, k, v, c, do, lse, delta, dk, dv, colsum, cu, bound, scale: float, n_blocks: int, n_z: int,
                varlen: bool, prune: bool, cfg: BwdConfig) -> Launch:
    B, Tq, Hq, D = q.shape
    Tk, Hkv = k.shape[1], k.shape[2]
    (n_tasks,) = launch_grid(n_blocks, Hkv, n_z)
    counter, grid = _task_counter(n_tasks, cfg.dkdv_persistent, q.device, bound)
    args = (rows_descriptor(q, cfg.dkdv_block_m), rows_descriptor(do, cfg.dkdv_block_m),
            rows_descriptor(k, BLOCK_M), rows_descriptor(v, BLOCK_M),
            c, lse, delta, dk, dv, colsum, cu, bound, counter,
            *packed_strides(dk), *packed_strides(dv),
            c.stride(0), c.stride(1), lse.stride(0), lse.stride(1),
            Tq, Tk, float(scale), float(scale) * math.log2(math.e), n_blocks, Hkv, Hq // Hkv, n_tasks)
    constexprs = dict(HEAD_DIM=D, BLOCK_M=cfg.dkdv_block_m, NUM_STAGES=cfg.dkdv_stages,
                      IS_VARLEN=varlen, PRUNE=prune, CONSUMER_REGS=cfg.consumer_regs, HEAD_GROUP=cfg.head_group,
                      MMA_SUMS=cfg.mma_sums, PERSISTENT=cfg.dkdv_persistent,
                      EQUAL_LEN=cfg.dkdv_equal_len and not varlen and Tq == Tk, SPLIT_LOOPS=cfg.dkdv_split_loops)
    return Launch(dkdv_kernel, grid, args, constexprs, OPTIONS)


def dq_launch(q, k, v, c, do, lse, delta, dq, rowsum, cu, bound, scale: float, n_blocks: int, n_z: int,
              varlen: bool, prune: bool, cfg: BwdConfig, out=None, dlse=None) -> Launch:
    """With cfg.fused_delta, out (and dlse, if any) are read and delta is written; out and do must be packed as dq
    (the kernel reads them with dq's strides)."""
    B, Tq, Hq, D = q.shape
    Tk, Hkv = k.shape[1], k.shape[2]
    if cfg.fused_delta and not (out.stride() == do.stride() == dq.stride()):
        raise ValueError(f"fused_delta reads out and do with dq's strides {dq.stride()}, got {out.stride()} and "
                         f"{do.stride()}")
    if cfg.dq_persistent and cfg.dq_num_wg != 2:
        raise ValueError(f"the persistent dq kernel has two consumer warpgroups, not {cfg.dq_num_wg}")
    (n_tasks,) = launch_grid(n_blocks, Hq, n_z)
    counter, grid = _task_counter(n_tasks, cfg.dq_persistent, q.device, bound)
    args = (rows_descriptor(q, WG_ROWS.value), rows_descriptor(do, WG_ROWS.value),
            rows_descriptor(k, cfg.dq_block_n), rows_descriptor(v, cfg.dq_block_n),
            c, lse, delta, dq, rowsum, out if cfg.fused_delta else dq, do,
            dlse if dlse is not None else delta, cu, bound, counter,
            *packed_strides(dq), c.stride(0), c.stride(1), lse.stride(0), lse.stride(1),
            Tq, Tk, float(scale), float(scale) * math.log2(math.e), n_blocks, Hq, Hq // Hkv, n_tasks)
    constexprs = dict(HEAD_DIM=D, BLOCK_N=cfg.dq_block_n, NUM_WG=cfg.dq_num_wg, NUM_STAGES=cfg.dq_stages,
                      IS_VARLEN=varlen, PRUNE=prune, CONSUMER_REGS=cfg.dq_consumer_regs,
                      HEAD_GROUP=cfg.head_group, FUSED_DELTA=cfg.fused_delta,
                      HAS_DLSE=cfg.fused_delta and dlse is not None, MMA_SUMS=cfg.mma_sums,
                      SPLIT_LOOPS=cfg.dq_split_loops, PERSISTENT=cfg.dq_persistent)
    return Launch(dq_kernel, grid, args, constexprs, OPTIONS)


def gluon_backward(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, c: torch.Tensor,
                   out: torch.Tensor, lse: torch.Tensor, scale: float,
                   cu_seqlens: torch.Tensor | None = None, max_seqlen: int | None = None,
                   *, dlse: torch.Tensor | None = None, prune_delta: torch.Tensor | None = None,
                   cfg: BwdConfig | None = None,
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Forgetting Attention backward on Hopper; the contract of ``bwd.triton_backward``.

    Returns dq [B, Tq, Hq, D], dk, dv [B, Tk, Hkv, D] (input dtypes) and dc float32 [B, Hq, Tk].
    """
    B, Tq, Hq, D = q.shape
    Tk, Hkv = k.shape[1], k.shape[2]
    cfg = cfg or BWD_CONFIGS[D]
    if dlse is not None:
        dlse = dlse.to(torch.float32).contiguous()
    do = do.to(q.dtype)
    c, lse = c.contiguous(), lse.contiguous()
    varlen = cu_seqlens is not None
    dq, dk, dv, colsum, rowsum, delta = _outputs(
        ((B, Tq, Hq, D), q.dtype), ((B, Tk, Hkv, D), k.dtype), ((B, Tk, Hkv, D), v.dtype),
        ((B, Hq, Tk), torch.float32), ((B, Hq, Tq), torch.float32), ((B, Hq, Tq), torch.float32), device=q.device)
    if cfg.fused_delta:
        out, do = out.contiguous(), do.contiguous()
    else:
        row_deltas(out, do, dlse, delta)
    prune = prune_delta is not None
    if varlen:
        n_z, cu, longest = cu_seqlens.numel() - 1, cu_seqlens.contiguous(), int(max_seqlen)
    else:
        n_z, cu, longest = B, lse, None  # lse: a placeholder pointer, never read

    n_kblocks = triton.cdiv(longest or Tk, BLOCK_M)
    bound = (tile_bounds(c, prune_delta, cu, varlen, n_z, Tq, Tk, n_kblocks, cfg.dkdv_block_m, BLOCK_M, True)
             if prune else lse)
    dkdv_step = dkdv_launch(q, k, v, c, do, lse, delta, dk, dv, colsum, cu, bound, scale, n_kblocks, n_z, varlen, prune,
                            cfg)

    n_qblocks = triton.cdiv(longest or Tq, dq_block_m(cfg))
    bound = (tile_bounds(c, prune_delta, cu, varlen, n_z, Tq, Tk, n_qblocks, dq_block_m(cfg), cfg.dq_block_n, False)
             if prune else lse)
    dq_step = dq_launch(q, k, v, c, do, lse, delta, dq, rowsum, cu, bound, scale, n_qblocks, n_z, varlen, prune,
                        cfg, out, dlse)
    # The fused dq kernel writes the deltas the dk/dv kernel reads; otherwise the order measured within 1%.
    for launch in ((dq_step, dkdv_step) if cfg.fused_delta else (dkdv_step, dq_step)):
        launch.run()

    # dc_t = (row sum of dS at the query sitting on position t) - (column sum of dS at key t).
    dc = colsum.neg_()
    dc[:, :, Tk - Tq:] += rowsum
    return dq, dk, dv, dc


_VARIANT_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}


def dq_tails(D: int, fused: bool | None = None) -> tuple[str, ...]:
    """Name tails of the dq kernel's code variants at head dim D: with the row deltas from the dq kernel
    (BwdConfig.fused_delta; the default config's unless given) the code differs with and without a gradient
    on lse ("-fused", "-fused-dlse"); from their own kernel there is one ("")."""
    fused = BWD_CONFIGS[D].fused_delta if fused is None else fused
    return ("-fused", "-fused-dlse") if fused else ("",)


# The dk/dv kernel's code options (BwdConfig.dkdv_*) by variant-name part, and the combinations compiled where they
# are not a head dim's default: none ("-plain") and each alone and both. A name lists exactly the options that are on.
_DKDV_OPTIONS = {"dkdv_equal_len": "-equal-len", "dkdv_split_loops": "-split-loops"}
_DKDV_OPTION_SETS = ((), ("dkdv_equal_len",), ("dkdv_split_loops",), ("dkdv_equal_len", "dkdv_split_loops"))


def _dkdv_option_set(cfg: BwdConfig) -> tuple[str, ...]:
    return tuple(f for f in _DKDV_OPTIONS if getattr(cfg, f))


def variant_names() -> list[str]:
    """Every kernel variant the dispatcher can pick: kernel x head dim x dtype x dense / packed x pruned
    or not (the constexprs that change the code; dq_tails for the dq kernel); then, as options, the dq kernel with
    BwdConfig.fused_delta flipped from the default, bf16, dense and packed, both backward kernels with
    BwdConfig.mma_sums flipped ("-mma-sums" / "-reg-sums"), both with the other schedule, dense and packed
    ("-persistent" / "-one-a-tile": *_persistent flipped), the dk/dv kernel's code options, alone and in the
    combinations of _DKDV_OPTION_SETS ("-equal-len", "-split-loops": BwdConfig.dkdv_*; "-plain": none),
    the forward without overlap with its loops split ("-split-loops": FwdConfig.split_loops), the D 64 dq kernel
    with BwdConfig.dq_split_loops flipped ("-split-loops" / "-one-loop"), dense and packed, and the forward without a
    row maximum (FwdConfig.max_free: "-max-free") with the launch that computes its out-of-window tiles again
    ("-redo")."""
    picked = [f"{kernel}-D{D}-{dtype}{'-varlen' if varlen else ''}{'-prune' if prune else ''}{tail}"
              for D in (64, 128) for dtype in _VARIANT_DTYPES for varlen in (False, True) for prune in (False, True)
              for kernel in ("fwd", "dkdv", "dq") for tail in (dq_tails(D) if kernel == "dq" else ("",))]
    flipped = [f"dq-D{D}-bfloat16{varlen}{tail}" for D in (64, 128)
               for varlen, tail in zip(("", "-varlen"), dq_tails(D, not BWD_CONFIGS[D].fused_delta) * 2)]
    sums = [f"{kernel}-D{D}-bfloat16{'-reg-sums' if BWD_CONFIGS[D].mma_sums else '-mma-sums'}"
            for D in (64, 128) for kernel in ("dkdv", "dq")]
    schedule = [f"{kernel}-D{D}-bfloat16{varlen}{dq_tails(D)[0] if kernel == 'dq' else ''}"
                f"{'-one-a-tile' if getattr(BWD_CONFIGS[D], f'{kernel}_persistent') else '-persistent'}"
                for kernel in ("dkdv", "dq") for D in (64, 128) for varlen in ("", "-varlen")]
    options = [f"dkdv-D{D}-bfloat16" + ("".join(_DKDV_OPTIONS[f] for f in fields) or "-plain") for D in (64, 128)
               for fields in _DKDV_OPTION_SETS if fields != _dkdv_option_set(BWD_CONFIGS[D])]
    fwd_split = [f"fwd-D{D}-bfloat16{varlen}-split-loops" for D in (64, 128) for varlen in ("", "-varlen")
                 if not (FWD_CONFIGS[D].overlap or FWD_CONFIGS[D].split_loops)]
    # The dq kernel's split loops at D 64 only: at D 128 they spill (144 bytes, Triton 3.9; 4 accesses a tile, 3.6).
    dq_flip = "-one-loop" if BWD_CONFIGS[64].dq_split_loops else "-split-loops"
    dq_split = [f"dq-D64-bfloat16{varlen}{dq_tails(64)[0]}{dq_flip}" for varlen in ("", "-varlen")]
    max_free = [f"fwd-D{D}-bfloat16{tail}" for D in (64, 128) for tail in ("-max-free", "-varlen-prune-max-free", "-redo")]
    return picked + flipped + sums + schedule + options + fwd_split + dq_split + max_free


def variant_launches(tokens: int = 300):
    """(name, Launch) of every variant_names() entry, built on small CPU tensors (aot.compile_launch)."""
    for name in variant_names():
        kernel, dim, dtype = name.split("-")[:3]
        D, varlen, prune = int(dim[1:]), "-varlen" in name, "-prune" in name
        bwd_cfg = dataclasses.replace(BWD_CONFIGS[D], fused_delta="-fused" in name)
        if name.endswith("-sums"):
            bwd_cfg = dataclasses.replace(bwd_cfg, mma_sums=name.endswith("-mma-sums"))
        if name.endswith(("-persistent", "-one-a-tile")):
            bwd_cfg = dataclasses.replace(bwd_cfg, dkdv_persistent=name.endswith("-persistent"),
                                          dq_persistent=name.endswith("-persistent"))
        if kernel == "dkdv" and (name.endswith("-plain") or any(part in name for part in _DKDV_OPTIONS.values())):
            bwd_cfg = dataclasses.replace(bwd_cfg, **{f: part in name for f, part in _DKDV_OPTIONS.items()})
        if kernel == "dq" and name.endswith(("-split-loops", "-one-loop")):
            bwd_cfg = dataclasses.replace(bwd_cfg, dq_split_loops=name.endswith("-split-loops"))
        B, Hq, Hkv = (1, 4, 2) if varlen else (2, 4, 2)
        q = torch.zeros(B, tokens, Hq, D, dtype=_VARIANT_DTYPES[dtype])
        k = torch.zeros(B, tokens, Hkv, D, dtype=_VARIANT_DTYPES[dtype])
        c = torch.zeros(B, Hq, tokens, dtype=torch.float64)
        vec = torch.zeros(B, Hq, tokens)
        cu = torch.tensor([0, tokens], dtype=torch.int32) if varlen else vec
        bound = torch.zeros(B, Hq, 8, dtype=torch.int32) if prune else vec
        n_z = 1 if varlen else B
        if kernel == "fwd":
            fwd_cfg = FWD_CONFIGS[D]
            if name.endswith("-split-loops"):
                fwd_cfg = dataclasses.replace(fwd_cfg, split_loops=True)
            if "-max-free" in name:
                fwd_cfg = dataclasses.replace(fwd_cfg, max_free=True)
            yield name, forward_launch(q, k, k, c, q, vec, cu, bound, 0.1, 3, n_z, varlen, prune, fwd_cfg,
                                       redo=name.endswith("-redo"))
        elif kernel == "dkdv":
            yield name, dkdv_launch(q, k, k, c, q, vec, vec, k, k, vec, cu, bound, 0.1, 3, n_z, varlen, prune,
                                    bwd_cfg)
        else:
            yield name, dq_launch(q, k, k, c, q, vec, vec, q, vec, cu, bound, 0.1, 3, n_z, varlen, prune,
                                  bwd_cfg, q, vec if "-dlse" in name else None)
