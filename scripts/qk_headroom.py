"""How far below QK-norm's logit bound U each attention row's largest logit lies, on a trained model's text.

    python scripts/qk_headroom.py RUN_OR_CHECKPOINT --data DATA_DIR [--seq-len 1024] [--num-seqs 4]

A forward kernel could take U (``qk_norm_bound``: |scale * q . k| <= U for QK-normed q, k, free from the norm
weights) as every row's softmax maximum instead of computing the maximum (c never increases, so no logit
scale * q_i . k_j + c_i - c_j exceeds U): no row maxima, no rescaling of the accumulator (docs/benchmarks.md,
"Where the rest is"). That is exact only where a row's true maximum m_i lies within ~80 nats of U: below that
every exp(logit - U) of the row underflows in fp32. This prints, per layer, U and the headroom U - m_i over every
(sequence, head, row): its median, 99th percentile and largest, and the share of rows past 80 nats. Models
without QK-norm have no free U and are refused.
"""
from __future__ import annotations

import argparse
import math

import torch

from foxformer.eval.gates import capture_attention
from foxformer.eval.sequences import dataset_sequences
from foxformer.models.calls import backbone, fox_blocks, model_device
from foxformer.models.layers import qk_norm_bound
from foxformer.train.loading import load_model

UNDERFLOW_NATS = 80.0  # exp(-87) is fp32's smallest normal; 80 leaves the row's largest term some bits


@torch.no_grad()
def row_maxima(q: torch.Tensor, k: torch.Tensor, log_f: torch.Tensor | None, scale: float) -> torch.Tensor:
    """float64 [B, H, T]: max over j <= i of scale * q_i . k_j + c_i - c_j. q [B, T, H, D], k [B, T, Hkv, D],
    log_f [B, T, H] (None: no gate)."""
    B, T, H, _ = q.shape
    k = k.double().repeat_interleave(H // k.shape[2], dim=2)
    s = torch.einsum("bihd,bjhd->bhij", q.double(), k) * scale
    if log_f is not None:
        c = torch.cumsum(log_f.double().clamp(min=-1e4), dim=1).transpose(1, 2)  # [B, H, T]
        s = s + (c[..., :, None] - c[..., None, :])
    hidden = torch.ones(T, T, dtype=torch.bool, device=s.device).triu_(1)
    return s.masked_fill_(hidden, float("-inf")).amax(dim=-1)


@torch.no_grad()
def headroom(model: torch.nn.Module, tokens: torch.Tensor) -> list[dict]:
    """Per layer: U and the quantiles of U - (each row's largest logit) over tokens int64 [N, T]."""
    attns = [block.attn for block in fox_blocks(model, "QK headroom")]
    if any(a.q_norm is None for a in attns):
        raise ValueError("qk headroom: the model has no QK-norm, so no free bound U on its logits")
    out = []
    with capture_attention(model, qk_layers=range(len(attns))) as rec:
        backbone(model)(input_ids=tokens.to(model_device(model)))
    for layer, (attn, r) in enumerate(zip(attns, rec)):
        bound = float(qk_norm_bound(attn.q_norm.weight, attn.k_norm.weight, attn.head_dim))
        maxima = row_maxima(r["q"], r["k"], r.get("log_f"), 1.0 / math.sqrt(attn.head_dim))
        gap = (bound - maxima).flatten().cpu()
        q50, q99 = torch.quantile(gap, torch.tensor([0.5, 0.99], dtype=gap.dtype)).tolist()
        out.append({"layer": layer, "U": bound, "median": q50, "p99": q99, "max": float(gap.max()),
                    "min": float(gap.min()), "beyond": float((gap > UNDERFLOW_NATS).double().mean())})
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
    rows = headroom(loaded.model, tokens)
    print(f"{loaded.name}: U - row maximum (nats), {args.num_seqs} sequences of {args.seq_len} tokens\n")
    print(f"| layer | U | median | 99th percentile | largest | smallest | rows past {UNDERFLOW_NATS:g} |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['layer']} | {r['U']:.1f} | {r['median']:.1f} | {r['p99']:.1f} | {r['max']:.1f} | "
              f"{r['min']:.2f} | {100 * r['beyond']:.2f}% |")


if __name__ == "__main__":
    main()
