"""Where a trained model's attention rows put their log-sum-exp: the premise of the max-free forward.

    python scripts/lse_window.py RUN_OR_CHECKPOINT --data DATA_DIR [--seq-len 1024] [--num-seqs 4]

The Gluon forward without a row maximum (``FwdConfig.max_free``, docs/benchmarks.md "Where the rest is") sums exp of
the biased logits ``scale * q_i . k_j + c_i - c_j`` themselves, which is exact while each row's sum stays within
2^-64 to 2^64, i.e. its lse within WINDOW_NATS of 0; a row outside is computed again by a second launch. This prints,
per layer, the quantiles of the rows' lse over (sequence, head, row) and the share of rows outside the window: how
often that second launch would have work, on the model's own text.
"""
from __future__ import annotations

import argparse
import math

import torch

from foxformer.eval.gates import capture_attention
from foxformer.eval.sequences import dataset_sequences
from foxformer.models.calls import backbone, fox_blocks, model_device
from foxformer.ops import naive_forgetting_attention
from foxformer.train.loading import load_model

WINDOW_NATS = 64 * math.log(2)  # fwd.FREE_LO / FREE_HI: 2^-64 and 2^64


@torch.no_grad()
def row_lse(q: torch.Tensor, k: torch.Tensor, log_f: torch.Tensor | None, scale: float) -> torch.Tensor:
    """float64 [B, H, T]: each row's lse over keys j <= i of scale * q_i . k_j + c_i - c_j. q [B, T, H, D],
    k [B, T, Hkv, D], log_f [B, T, H] (None: no gate)."""
    if log_f is None:
        log_f = q.new_zeros(q.shape[:3])
    _, lse = naive_forgetting_attention(q.double(), k.double(), k.double(), log_f.double(), scale, None, None, True)
    return lse


@torch.no_grad()
def lse_window(model: torch.nn.Module, tokens: torch.Tensor) -> list[dict]:
    """Per layer: quantiles of the rows' lse over tokens int64 [N, T], and the share outside +-WINDOW_NATS."""
    attns = [block.attn for block in fox_blocks(model, "lse window")]
    out = []
    with capture_attention(model, qk_layers=range(len(attns))) as rec:
        backbone(model)(input_ids=tokens.to(model_device(model)))
    for layer, (attn, r) in enumerate(zip(attns, rec)):
        lse = row_lse(r["q"], r["k"], r.get("log_f"), 1.0 / math.sqrt(attn.head_dim)).flatten().cpu()
        q01, q50, q99 = torch.quantile(lse, torch.tensor([0.01, 0.5, 0.99], dtype=lse.dtype)).tolist()
        out.append({"layer": layer, "min": float(lse.min()), "p1": q01, "median": q50, "p99": q99,
                    "max": float(lse.max()), "outside": float((lse.abs() > WINDOW_NATS).double().mean())})
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model", help="a run dir, checkpoint dir or Hugging Face folder (foxformer's load_model)")
    p.add_argument("--data", required=True, help="a prepared dataset (its validation split)")
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--num-seqs", type=int, default=4)
    args = p.parse_args(argv)
    loaded = load_model(args.model, progress=False)
    tokens = dataset_sequences(args.data, args.seq_len, args.num_seqs)
    rows = lse_window(loaded.model, tokens)
    print(f"{loaded.name}: each attention row's lse (nats), {args.num_seqs} sequences of {args.seq_len} tokens\n")
    print(f"| layer | smallest | 1st percentile | median | 99th percentile | largest | rows beyond +-{WINDOW_NATS:.1f} |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['layer']} | {r['min']:.1f} | {r['p1']:.1f} | {r['median']:.1f} | {r['p99']:.1f} | "
              f"{r['max']:.1f} | {100 * r['outside']:.2f}% |")


if __name__ == "__main__":
    main()
