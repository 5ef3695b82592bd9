"""Where the time of an FSDP2 training step goes at 8 and 64 H200s, on paper (docs/architecture.md, "Scale-out").

Compute comes from a measured one-GPU step (the 760M row of docs/bench/scaling_760m_16k_h200x2.json, or
--tok-s for a new measurement; 1.3B is scaled by training FLOPs per token unless --tok-s-1p3b gives a
measurement), communication from FSDP2's bytes per step over NVLink (one node) or InfiniBand (8 nodes).

    PYTHONPATH=src python scripts/scaleout_estimate.py [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import os

from foxformer.models import get_preset
from foxformer.models.presets import count_embedding, count_non_embedding, training_flops_per_token

CONTEXT = 16384
SEQS_PER_STEP = 64             # 1Mi tokens a step: one 16K sequence per GPU at 64 GPUs
NVLINK = 450e9                 # bytes/s per GPU per direction, H200 NVLink 4 (900 GB/s both ways)
INFINIBAND = 50e9              # bytes/s per GPU: one 400 Gb/s NDR adapter per GPU
GPUS_PER_NODE = 8
PARAM_BYTES, GRAD_BYTES = 2, 4  # FSDP2 gathers bf16 parameters and reduces fp32 gradients (MixedPrecisionPolicy)
STATE_BYTES = 12               # a checkpoint's fp32 weights and two Adam moments per parameter
TOKENS_48B = 48e9              # the paper's training budget
MEASURED = os.path.join(os.path.dirname(__file__), "..", "docs", "bench", "scaling_760m_16k_h200x2.json")


def one_gpu_tok_s(path: str) -> float:
    with open(path, encoding="utf-8") as f:
        rows = json.load(f)["rows"]
    return next(r["tok_s"] for r in rows if r["gpus"] == 1)


def estimate(preset: str, tok_s: float, gpus: int) -> dict:
    cfg = get_preset(preset, vocab_size=50304)
    n = count_non_embedding(cfg) + count_embedding(cfg)  # FSDP2 shards the embeddings too
    accum = SEQS_PER_STEP // gpus                         # micro-batches of one sequence per GPU and step
    t_compute = accum * CONTEXT / tok_s
    share = (gpus - 1) / gpus                             # what a ring collective moves per GPU
    gathered = accum * 2 * PARAM_BYTES * n * share        # all-gather before forward and again before backward
    reduced = GRAD_BYTES * n * share                      # one reduce-scatter (earlier micro-batches skip it)
    bandwidth = NVLINK if gpus <= GPUS_PER_NODE else INFINIBAND
    t_comm = (gathered + reduced) / bandwidth
    # FSDP2 prefetches block k+1's gather during block k: only one block's share is not overlapped
    t_step = max(t_compute, t_comm) + t_comm / cfg.num_layers
    tokens_per_s = SEQS_PER_STEP * CONTEXT / t_step
    return {"model": preset, "params": n, "gpus": gpus, "link": "NVLink" if bandwidth == NVLINK else "InfiniBand",
            "micro_batches": accum, "compute_s": t_compute, "bytes_per_gpu": gathered + reduced, "comm_s": t_comm,
            "comm_over_compute": t_comm / t_compute, "break_even_bandwidth": (gathered + reduced) / t_compute,
            "step_s": t_step, "efficiency": t_compute / t_step,
            "tokens_per_s": tokens_per_s, "hours_48b": TOKENS_48B / tokens_per_s / 3600,
            "checkpoint_bytes_per_gpu": STATE_BYTES * n / gpus}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--measured", default=MEASURED, help="bench scaling JSON with a one-GPU 760M row")
    parser.add_argument("--tok-s", type=float, help="one-GPU tokens/s of fox-pro-760m at 16K (overrides --measured)")
    parser.add_argument("--tok-s-1p3b", type=float, help="one-GPU tokens/s of fox-pro-1.3b at 16K (else FLOPs-scaled)")
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args()
    tok_s = args.tok_s or one_gpu_tok_s(args.measured)
    flops = {p: training_flops_per_token(get_preset(p, vocab_size=50304), CONTEXT)
             for p in ("fox-pro-760m", "fox-pro-1.3b")}
    rates = {"fox-pro-760m": tok_s,
             "fox-pro-1.3b": args.tok_s_1p3b or tok_s * flops["fox-pro-760m"] / flops["fox-pro-1.3b"]}
    rows = [estimate(p, rates[p], g) for p in rates for g in (8, 64)]
    print(f"one-GPU tokens/s at 16K: 760M {rates['fox-pro-760m']:,.0f} (measured), 1.3B {rates['fox-pro-1.3b']:,.0f} "
          f"({'measured' if args.tok_s_1p3b else 'scaled by FLOPs/token'})")
    print("| model | GPUs | link | micro-batches / GPU | compute s | GB moved / GPU | comm s | comm / compute "
          "| hidden down to GB/s | step s | efficiency | tokens/s | hours for 48B | checkpoint GB / GPU |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['gpus']} | {r['link']} | {r['micro_batches']} | {r['compute_s']:.2f} "
              f"| {r['bytes_per_gpu'] / 1e9:.1f} | {r['comm_s']:.3f} | {r['comm_over_compute']:.1%} "
              f"| {r['break_even_bandwidth'] / 1e9:.1f} | {r['step_s']:.2f} "
              f"| {r['efficiency']:.3f} | {r['tokens_per_s'] / 1e6:.2f}M | {r['hours_48b']:.0f} "
              f"| {r['checkpoint_bytes_per_gpu'] / 1e9:.2f} |")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"tok_s_one_gpu": rates, "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
