"""Run each Gluon kernel of one forward + backward once, for Nsight Compute to read its hardware counters.

    ncu --clock-control none --kernel-name regex:'^(fwd|dkdv|dq)_kernel' --launch-skip 3 --launch-count 3 \
        --section SpeedOfLight --section WarpStateStats --section ComputeWorkloadAnalysis -o prof \
        python scripts/ncu_kernels.py --dim 64
    ncu --import prof.ncu-rep --page details

The benchmark's shape (bf16, T = 16K, B * T = 32K, realistic gates, the default configs); one untimed pass first
compiles the kernels, so `--launch-skip 3` leaves the compile pass's three launches out. Where the time of a kernel
goes is what the counters say (tensor pipe busy, stall reasons); its speed comes from scripts/hopper_tune.py.
"""
from __future__ import annotations

import argparse
import math

import torch

from foxformer.bench.attention import realistic_log_fgate
from foxformer.ops.forgetting_attn.cumsum import gate_cumsum_heads_first
from foxformer.ops.forgetting_attn.hopper import launch as L


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dim", type=int, default=64, choices=(64, 128))
    p.add_argument("--seqlen", type=int, default=16384)
    p.add_argument("--tokens", type=int, default=32768)
    args = p.parse_args(argv)
    D, T = args.dim, args.seqlen
    H, B = 1536 // D, max(1, args.tokens // T)
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(B, T, H, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
    c = gate_cumsum_heads_first(realistic_log_fgate(B, T, H, "cuda", generator=g))
    scale = 1 / math.sqrt(D)
    for _ in range(2):
        out, lse = L.gluon_forward(q, k, v, c, scale)
        L.gluon_backward(torch.randn_like(out), q, k, v, c, out, lse, scale)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
