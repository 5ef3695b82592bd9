"""Smoke-check and time the Gluon Hopper kernels' tile configs on one GPU (H100 / H200).

    python scripts/hopper_tune.py smoke                 # small shapes against the float64 reference
    python scripts/hopper_tune.py fwd bwd --out tune.json   # config sweep at T = 16K, B * T = 32K, bf16

Each config is timed alone (triton.testing.do_bench, median) next to SDPA FLASH / cuDNN on the same
shapes; the JSON keeps every row. The configs that win become FWD_CONFIGS / BWD_CONFIGS in
src/foxformer/ops/forgetting_attn/hopper/launch.py (their comments cite the run).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time

import torch
import torch.nn.functional as F
import triton

from foxformer.bench.attention import realistic_log_fgate
from foxformer.bench.common import environment
from foxformer.ops.forgetting_attn import naive_forgetting_attention
from foxformer.ops.forgetting_attn.cumsum import gate_cumsum_heads_first
from foxformer.ops.forgetting_attn.hopper import launch as L

DEV = "cuda"


def _inputs(B, T, Hq, Hkv, D, dtype=torch.bfloat16, seed=0):
    g = torch.Generator(device=DEV).manual_seed(seed)
    q = torch.randn(B, T, Hq, D, device=DEV, dtype=dtype, generator=g)
    k = torch.randn(B, T, Hkv, D, device=DEV, dtype=dtype, generator=g)
    v = torch.randn(B, T, Hkv, D, device=DEV, dtype=dtype, generator=g)
    return q, k, v, realistic_log_fgate(B, T, Hq, DEV, generator=g)


def _errors(B, T, Hq, Hkv, D, fwd_cfg=None, bwd_cfg=None, seed=0) -> dict:
    """Relative errors of out, lse and every gradient (forward and backward kernels called directly) against
    naive fp64."""
    q, k, v, log_f = _inputs(B, T, Hq, Hkv, D, seed=seed)
    scale = 1 / math.sqrt(D)
    c = gate_cumsum_heads_first(log_f)
    out, lse = L.gluon_forward(q, k, v, c, scale, cfg=fwd_cfg)
    leaves = [x.double().requires_grad_() for x in (q, k, v, log_f)]
    ref, ref_lse = naive_forgetting_attention(*leaves, scale, None, None, True)
    do = torch.randn_like(out)
    ref.backward(do.double())
    dq, dk, dv, dc = L.gluon_backward(do, q, k, v, c, out, lse, scale, cfg=bwd_cfg)
    torch.cuda.synchronize()
    # dlog_f = reverse cumsum of dc along T (as autograd does through gate_cumsum)
    dlf = dc.double().flip(-1).cumsum(-1).flip(-1).transpose(1, 2)
    err = {}
    for name, a, b in (("out", out, ref), ("lse", lse, ref_lse), ("dq", dq, leaves[0].grad),
                       ("dk", dk, leaves[1].grad), ("dv", dv, leaves[2].grad), ("dlog_f", dlf, leaves[3].grad)):
        a = a.double()
        # relative, or absolute RMS where the reference is ~0 (dlog_f of a one-token sequence is exactly 0)
        floor = 1e-3 * b.numel() ** 0.5
        err[name] = float("nan") if not torch.isfinite(a).all() else \
            float((a - b).norm() / b.norm().clamp_min(floor))
    return err


def smoke(rows):
    """Small shapes, forward and backward kernels called directly, against naive fp64."""
    for D in (64, 128):
        for (B, T, Hq, Hkv) in ((1, 128, 2, 2), (2, 300, 4, 2), (1, 1000, 2, 1)):
            t0 = time.time()
            err = _errors(B, T, Hq, Hkv, D)
            row = dict(section="smoke", D=D, B=B, T=T, Hq=Hq, Hkv=Hkv, seconds=round(time.time() - t0, 2),
                       **{k: round(v, 5) for k, v in err.items()})
            row["ok"] = all(e < 2e-2 for e in err.values())
            rows.append(row)
            print(row, flush=True)


def _time(fn, grad_to_none=None):
    return triton.testing.do_bench(fn, warmup=25, rep=100, grad_to_none=grad_to_none, return_mode="median")


def _sdpa_rows(rows, D, H, T, B):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    flops = 2.0 * B * H * T * T * D
    q, k, v, _ = _inputs(B, T, H, H, D)
    qh, kh, vh = (x.transpose(1, 2).contiguous().requires_grad_() for x in (q, k, v))
    do = torch.randn_like(qh)
    for name, kind in (("sdpa_flash", SDPBackend.FLASH_ATTENTION), ("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION)):
        def fwd():
            with sdpa_kernel([kind]):
                return F.scaled_dot_product_attention(qh, kh, vh, is_causal=True)
        try:
            with torch.no_grad():
                ms_f = _time(fwd)
            ms_fb = _time(lambda: fwd().backward(do), grad_to_none=[qh, kh, vh])  # as bench attention times it
        except Exception as exc:
            print(name, "failed", exc)
            continue
        row = dict(section="baseline", provider=name, D=D, H=H, T=T, B=B, fwd_ms=ms_f,
                   fwd_tflops=flops / ms_f / 1e9, fwd_bwd_ms=ms_fb, fwd_bwd_tflops=3.5 * flops / ms_fb / 1e9)
        rows.append(row)
        print(row, flush=True)


# The forward with and without a row maximum (FwdConfig.max_free, its redo launch included in the time), alternating
# (drift): the one variant still worth a row. Earlier rows and what lost, with their JSONs: the launch order one head
# at a time (head_group 1; won two of four sweeps at D 128, hopper_tune_243d2a9_h200.json), the split loops at D 64
# (FwdConfig.split_loops, 4.10 / 4.13 against 3.99-4.01); docs/benchmarks.md, "Hopper kernel variants tried and removed".
_FREE, _MAX = dict(max_free=True), dict(max_free=False)
FWD_SWEEP = {64: [_MAX, _FREE, _MAX, _FREE, _MAX, _FREE], 128: [_MAX, _FREE, _MAX, _FREE, _MAX, _FREE]}


# awkward lengths: one partial tile, a single whole tile plus a row, GQA, T past a multiple of the tile
ERROR_SHAPES = ((1, 1, 2, 1), (1, 17, 2, 2), (1, 130, 2, 1), (1, 1000, 2, 1), (2, 4097, 2, 2))


def _worst_error(D, fwd_cfg=None, bwd_cfg=None) -> float:
    """Largest relative error of out, lse and (given bwd_cfg) every gradient over ERROR_SHAPES."""
    worst = 0.0
    for shape in ERROR_SHAPES:
        err = _errors(*shape, D, fwd_cfg=fwd_cfg, bwd_cfg=bwd_cfg, seed=1)
        keys = ("out", "lse") if bwd_cfg is None else tuple(err)
        worst = max([worst] + [float("inf") if math.isnan(err[k]) else err[k] for k in keys])
    return worst


# The defaults first and last (drift); between them the other schedule (persistent kernels flipped: one CTA a tile at
# D 64, persistent at D 128; twenty-seventh session, the default's comment in launch.py), twice: options within 1% of
# each other differ by about a sweep's drift between its first and last rows (hopper_tune_7b0a783_h200.json).
def _other_schedule(D: int) -> dict:
    cfg = L.BWD_CONFIGS[D]
    return dict(dkdv_persistent=not cfg.dkdv_persistent, dq_persistent=not cfg.dq_persistent)


# Then the code options (BwdConfig.dkdv_equal_len, dkdv_split_loops, dq_split_loops; the split loops defaults since
# the thirty-second session's sweeps, launch.py, BWD_CONFIGS), turned off or on in turn between defaults: none (the
# earlier default), at D 64 the dq kernel's off, and equal lengths compiled in. Their sm_90a SASS (CPU, Triton 3.6;
# local-memory accesses / instructions a tile of the unmasked path, first and second consumer; thirty-first session
# unless said): none D 64 3 / 547 and 7 / 549, masked 71 and 53; split loops D 64 14 / 533 and 8 / 524, masked 61-85
# (thirty-second session, `scripts/sass_blocks.py dkdv-D64-bfloat16`: fewer instructions, more spills, level in
# time); none D 128 3 / 383 and 3 / 386, split loops 0 / 354. The dq kernel's split loops, D 64: an unmasked tile
# three basic blocks instead of five split around the masked branch (464 instructions against 469; at D 128 they
# spill, 4 local accesses a tile). The dP product started from -delta (dkdv_delta_acc) had no local memory at D 64
# and dk/dv 6.03-6.08 ms against 6.09-6.16 (hopper_tune_243d2a9_h200.json) but lost the gate gradient's
# cancellation (removed; bwd._dkdv_tile).
_OPTIONS_OFF = dict(dkdv_equal_len=False, dkdv_split_loops=False, dq_split_loops=False)
_BWD_VARIANTS = {64: [_OPTIONS_OFF, dict(dq_split_loops=False), dict(dkdv_equal_len=True), _other_schedule(64),
                      _OPTIONS_OFF],
                 128: [_OPTIONS_OFF, dict(dkdv_equal_len=True), _OPTIONS_OFF]}
BWD_SWEEP = {D: [dict()] + [row for over in _BWD_VARIANTS[D] for row in (over, dict())] for D in (64, 128)}


def _bwd_parts(q, k, v, c, do, out, lse, scale, cfg):
    """Milliseconds of the dk/dv and dq kernels alone (the launcher's steps, timed one by one)."""
    B, T, Hq, D = q.shape
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    colsum, rowsum, delta = (torch.empty(B, Hq, T, device=DEV) for _ in range(3))
    L.row_deltas(out, do, None, delta)
    # Launches built for each run: a persistent kernel's task counter starts at zero.
    def lk():
        L.dkdv_launch(q, k, v, c, do, lse, delta, dk, dv, colsum, lse, lse, scale, triton.cdiv(T, L.BLOCK_M), B, False,
                      False, cfg).run()

    def lq():
        L.dq_launch(q, k, v, c, do, lse, delta, dq, rowsum, lse, lse, scale, triton.cdiv(T, L.dq_block_m(cfg)), B,
                    False, False, cfg, out).run()
    return [_time(fn) for fn in (lk, lq)]


def sweep(rows, fwd: bool, bwd: bool, T: int, tokens: int):
    for D, H in ((64, 24), (128, 12)):
        B = max(1, tokens // T)
        flops = 2.0 * B * H * T * T * D
        _sdpa_rows(rows, D, H, T, B)
        q, k, v, log_f = _inputs(B, T, H, H, D)
        scale = 1 / math.sqrt(D)
        c = gate_cumsum_heads_first(log_f)
        if fwd:
            for over in FWD_SWEEP[D]:
                cfg = dataclasses.replace(L.FWD_CONFIGS[D], **over)
                try:
                    err = _worst_error(D, fwd_cfg=cfg)
                    ms = _time(lambda: L.gluon_forward(q, k, v, c, scale, cfg=cfg))
                except Exception as exc:
                    print("fwd", over, "failed", str(exc)[:300], flush=True)
                    continue
                row = dict(section="fwd", D=D, H=H, T=T, B=B, **over, fwd_ms=ms, fwd_tflops=flops / ms / 1e9,
                           rel_err=err)
                rows.append(row)
                print(row, flush=True)
        if bwd:
            out, lse = L.gluon_forward(q, k, v, c, scale)
            do = torch.randn_like(out)
            for over in BWD_SWEEP[D]:
                cfg = dataclasses.replace(L.BWD_CONFIGS[D], **over)
                try:
                    ms = _time(lambda: L.gluon_backward(do, q, k, v, c, out, lse, scale, cfg=cfg))
                except Exception as exc:
                    print("bwd", over, "failed", str(exc)[:300], flush=True)
                    continue
                dkdv_ms, dq_ms = _bwd_parts(q, k, v, c, do, out, lse, scale, cfg)
                err = _worst_error(D, bwd_cfg=cfg)
                row = dict(section="bwd", D=D, H=H, T=T, B=B, **over, bwd_ms=ms, bwd_tflops=2.5 * flops / ms / 1e9,
                           dkdv_ms=dkdv_ms, dq_ms=dq_ms, rel_err=err)
                rows.append(row)
                print(row, flush=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("sections", nargs="+", choices=["smoke", "fwd", "bwd"])
    p.add_argument("--seqlen", type=int, default=16384)
    p.add_argument("--tokens", type=int, default=32768)
    p.add_argument("--out", default="hopper_tune.json")
    args = p.parse_args(argv)
    rows = []
    try:
        if "smoke" in args.sections:
            smoke(rows)
        if "fwd" in args.sections or "bwd" in args.sections:
            sweep(rows, "fwd" in args.sections, "bwd" in args.sections, args.seqlen, args.tokens)
    finally:
        with open(args.out, "w") as f:
            json.dump({"env": environment(), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
