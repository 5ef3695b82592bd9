"""Sweep the Triton tile configs of the Forgetting Attention kernels on the local GPU.

    PYTHONPATH=src python scripts/tune_attention.py --out tune.json [--dims 64,128] [--T 16384]

For each head dim: times the forward for every candidate config, then the backward for every
dk/dv candidate (dq fixed at its default) and every dq candidate (dk/dv at the best found).
Every candidate's outputs are checked against the default config's (a config that miscompiles
must not win). Prints the best config per kernel and writes all timings as JSON; the winners are
what fwd.py / bwd.py's tables should hold.
"""
from __future__ import annotations

import argparse
import itertools
import json
import time

import torch

from foxformer.bench.attention import realistic_log_fgate
from foxformer.ops.forgetting_attn import bwd, fwd
from foxformer.ops.forgetting_attn.cumsum import gate_cumsum

KC = fwd.KernelConfig
FWD_CANDIDATES = [KC(m, n, w, s) for (m, n), w, s in itertools.product(
    [(128, 64), (128, 128), (64, 64), (128, 32), (64, 128)], [4, 8], [2, 3, 4])]
DKDV_CANDIDATES = [KC(m, n, w, s) for (m, n), w, s in itertools.product(
    [(32, 128), (64, 128), (64, 64), (32, 64), (16, 128)], [4, 8], [2, 3])]
DQ_CANDIDATES = [KC(m, n, w, s) for (m, n), w, s in itertools.product(
    [(128, 32), (128, 64), (64, 64), (64, 32), (128, 128)], [4, 8], [2, 3])]


def _time(fn):
    import triton.testing
    return float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"))


def _rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-6)).item()


def sweep(D, H, T, tokens, deadline):
    B = max(1, tokens // T)
    key = fwd.block_d_for(D)
    q = torch.randn(B, T, H, D, device="cuda", dtype=torch.bfloat16)
    k, v = torch.randn_like(q), torch.randn_like(q)
    c = gate_cumsum(realistic_log_fgate(B, T, H, "cuda")).transpose(1, 2).contiguous()
    scale = D ** -0.5
    flops = 2.0 * B * H * T * T * D
    out_ref, lse = fwd.triton_forward(q, k, v, c, scale)
    do = torch.randn_like(q)
    grads_ref = bwd.triton_backward(do, q, k, v, c, out_ref, lse, scale)
    results = {"D": D, "H": H, "T": T, "B": B, "fwd": [], "dkdv": [], "dq": []}

    def run_sweep(name, table, candidates, fn, check):
        default = table[key]
        best = (float("inf"), default)
        for cand in candidates:
            if time.time() > deadline:
                break
            table[key] = cand
            try:
                ok = check(fn())
                ms = _time(fn) if ok else None
            except Exception as exc:  # out of resources etc.: record and move on
                ok, ms = False, None
                print(name, cand, "failed:", type(exc).__name__, str(exc)[:80])
            results[name].append({"cfg": cand.__dict__, "ms": ms, "ok": ok})
            if ms is not None and ms < best[0]:
                best = (ms, cand)
        table[key] = best[1]
        print(f"D={D} {name}: best {best[1]} {best[0]:.3f} ms (default {default})", flush=True)
        return best

    fwd_best = run_sweep("fwd", fwd.FWD_CONFIGS, FWD_CANDIDATES,
                         lambda: fwd.triton_forward(q, k, v, c, scale)[0],
                         lambda o: _rel(o, out_ref) < 1e-2)
    bwd_fn = lambda: bwd.triton_backward(do, q, k, v, c, out_ref, lse, scale)  # noqa: E731
    bwd_ok = lambda g: all(_rel(a, b) < 1e-2 for a, b in zip(g, grads_ref))  # noqa: E731
    run_sweep("dkdv", bwd.DKDV_CONFIGS, DKDV_CANDIDATES, bwd_fn, bwd_ok)
    bwd_best = run_sweep("dq", bwd.DQ_CONFIGS, DQ_CANDIDATES, bwd_fn, bwd_ok)
    results["best"] = {
        "fwd": fwd.FWD_CONFIGS[key].__dict__, "dkdv": bwd.DKDV_CONFIGS[key].__dict__,
        "dq": bwd.DQ_CONFIGS[key].__dict__,
        "fwd_tflops": flops / fwd_best[0] / 1e9,
        "fwd_bwd_tflops": 3.5 * flops / (fwd_best[0] + bwd_best[0]) / 1e9,
    }
    print(json.dumps(results["best"]), flush=True)
    return results


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dims", default="64,128")
    ap.add_argument("--heads", default="24,12")
    ap.add_argument("--T", type=int, default=16384)
    ap.add_argument("--tokens", type=int, default=32768)
    ap.add_argument("--minutes", type=float, default=5.0, help="stop sweeping after this long")
    ap.add_argument("--out", default="tune.json")
    args = ap.parse_args()
    deadline = time.time() + 60 * args.minutes
    dims = [int(x) for x in args.dims.split(",")]
    heads = [int(x) for x in args.heads.split(",")]
    per_dim = []
    for i, (D, H) in enumerate(zip(dims, heads)):
        # share the time budget evenly between the head dims
        share = time.time() + (deadline - time.time()) / (len(dims) - i)
        per_dim.append(sweep(D, H, args.T, args.tokens, share))
        with open(args.out, "w") as f:
            json.dump(per_dim, f, indent=1)


if __name__ == "__main__":
    main()
