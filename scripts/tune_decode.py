"""Time the decode op's Triton tiles on one GPU: keys per loop step, warps, pipeline depth and key splits.

    python scripts/tune_decode.py --out decode_tune.json

Each row is one split + merge call at the 125M head shape (12 heads of 64, bf16) against a 32K cache, batch 1
and 32, timed inside a CUDA graph (the host's launch cost out of the figure, as in graph-captured decoding)
next to SDPA on the same q, k, v. The winner becomes decode.DECODE_TILES (its comment cites the run).
"""
from __future__ import annotations

import argparse
import itertools
import json
import sys

import torch
import torch.nn.functional as F

from foxformer.bench.common import environment
from foxformer.ops import gate_cumsum
from foxformer.ops.forgetting_attn import decode

CALLS = 20  # per graph replay


def graph_us(fn) -> float:
    """Median microseconds per call of fn, replayed CALLS at a time in a CUDA graph."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(CALLS):
            fn()
    times = []
    for _ in range(30):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / CALLS)
    return sorted(times)[len(times) // 2]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--context", type=int, default=32768)
    p.add_argument("--batches", default="1,32")
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--out", default="decode_tune.json")
    args = p.parse_args(argv)
    rows = []
    T, H, D = args.context, args.heads, args.head_dim
    for B in map(int, args.batches.split(",")):
        q = torch.randn(B, 1, H, D, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(B, T, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        c = gate_cumsum(torch.full((B, T, H), -1e-3, device="cuda"))
        kv_mb = 2 * k.numel() * k.element_size() / 1e6
        mbytes = kv_mb + c.numel() * 8 / 1e6  # the op also reads c (float64)
        ref = decode.triton_decode(q, k, v, c, None, D ** -0.5, None, None, T, T)
        qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        us = graph_us(lambda: F.scaled_dot_product_attention(qt, kt, vt))
        rows.append(dict(batch=B, tiles="sdpa", us=us, gb_s=kv_mb / us * 1e3))
        print(rows[-1], flush=True)
        auto = decode._pick_splits(B, H, T, None, False)
        for bn, warps, stages, mult in itertools.product((64, 128), (4, 8), (2, 3, 4), (0.5, 1, 2)):
            tiles = decode.DecodeTiles(bn, warps, stages)
            splits = max(1, int(auto * mult))
            try:
                out = decode.triton_decode(q, k, v, c, None, D ** -0.5, splits, None, T, T, tiles)
                err = float((out.float() - ref.float()).abs().max())
                us = graph_us(lambda: decode.triton_decode(q, k, v, c, None, D ** -0.5, splits, None, T, T, tiles))
            except Exception as exc:  # a tile that does not fit shared memory
                print(bn, warps, stages, splits, "failed", str(exc)[:200], flush=True)
                continue
            rows.append(dict(batch=B, block_n=bn, num_warps=warps, num_stages=stages, splits=splits, us=us,
                             gb_s=mbytes / us * 1e3, max_diff=err,
                             default=tiles == decode.DECODE_TILES and splits == auto))
            print(rows[-1], flush=True)
        q = k = v = c = None
        torch.cuda.empty_cache()
    with open(args.out, "w") as f:
        json.dump({"env": environment(), "context": T, "heads": H, "head_dim": D, "rows": rows}, f, indent=1)
    for B in sorted({r["batch"] for r in rows}):
        best = sorted((r for r in rows if r["batch"] == B and "block_n" in r), key=lambda r: r["us"])[:5]
        print(f"batch {B}: best", *best, sep="\n  ")
    return 0


if __name__ == "__main__":
    sys.exit(main())
