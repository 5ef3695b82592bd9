"""Evicting cached keys for good during decoding (FoX only; the bound of DESIGN.md "Pruning bound").

After a step at position t with cumsum c_t, key j can never again carry more than eps / N of any
later query's attention once

    c_t - c_j <= delta = log(eps) - 2U - log(N)

because c never increases (later queries only push c_i - c_j lower), the query's own key keeps
its largest logit >= -U, and every logit is <= U. N is the longest sequence allowed (so the
evicted keys of one row carry at most eps in total), U a bound on |scale * q . k|:

* with QK-norm: U = scale * max|w_q| * max|w_k| * head_dim, read from the norm weights (RMS-normalised
  vectors have norm sqrt(D) before the weight; RoPE is a rotation and keeps norms), plus 1% for rounding;
* without it: ``qk_bound`` given by the user. That is the user's contract: the bound, and so the
  tolerance, holds only if no query/key pair ever exceeds it. Without either, the layer keeps every key.

Consequence for each attention output row: |out - out_evicted| <= 2 * eps * max_j |v_j| per
coordinate (the dropped mass is at most eps, and renormalising the kept mass moves it by as much).
"""
from __future__ import annotations

import math
from typing import Optional

import torch

from foxformer.models.layers import qk_norm_bound


def eviction_delta(eps: float, qk_bound: float, max_len: int) -> float:
    """delta = log(eps) - 2U - log(N): evict key j once c_now - c_j <= delta."""
    if not (0 < eps < 1):
        raise ValueError(f"evict_eps must be in (0, 1), got {eps!r}")
    if qk_bound < 0 or not math.isfinite(qk_bound):
        raise ValueError(f"qk_bound must be finite and >= 0, got {qk_bound!r}")
    if int(max_len) < 1:
        raise ValueError(f"max_len must be a positive int, got {max_len!r}")
    return math.log(eps) - 2.0 * qk_bound - math.log(int(max_len))


def qk_bound_from_norms(q_weight: torch.Tensor, k_weight: torch.Tensor, head_dim: int,
                        softmax_scale: Optional[float] = None) -> float:
    """U = scale * max|w_q| * max|w_k| * head_dim (plus 1% for bf16 rounding) for RMS-normalised q, k with
    weights w [D] (or [H, D]): the pruning bound of the models (models.layers.qk_norm_bound)."""
    return float(qk_norm_bound(q_weight, k_weight, head_dim, softmax_scale))


def _blocks(model):
    inner = getattr(model, "model", model)
    layers = getattr(inner, "layers", None)
    if layers is None:
        raise TypeError(f"model: expected a FoxForCausalLM or FoxModel, got {type(model).__name__}")
    return layers


def layer_qk_bounds(model, qk_bound: Optional[float] = None) -> list[Optional[float]]:
    """Per layer: U from the QK-norm weights, else ``qk_bound`` (user's contract), else None (no eviction).
    Layers without a forget gate get None: softmax attention never forgets."""
    out = []
    for block in _blocks(model):
        attn = block.attn
        if attn.fgate is None:
            out.append(None)
        elif attn.q_norm is not None:
            out.append(qk_bound_from_norms(attn.q_norm.weight, attn.k_norm.weight, attn.head_dim))
        else:
            out.append(qk_bound)
    return out


def eviction_deltas(model, eps: Optional[float], qk_bound: Optional[float] = None,
                    max_len: Optional[int] = None) -> Optional[list[Optional[float]]]:
    """One eviction threshold per layer for ``FoxCache(num_layers, evict_deltas=...)``.

    eps None: no eviction (returns None). max_len None: the model's max_position_embeddings.
    """
    if eps is None:
        return None
    cfg = model.config
    n = int(max_len if max_len is not None else (cfg.evict_max_len or cfg.max_position_embeddings))
    return [None if u is None else eviction_delta(eps, u, n) for u in layer_qk_bounds(model, qk_bound)]


def output_tolerance(eps: float, v_max: float) -> float:
    """Largest change of one attention output coordinate that eviction may cause: 2 * eps * max|v|."""
    return 2.0 * eps * v_max


def cache_report(cache) -> dict:
    """Memory of a FoxCache: allocated / live / no-eviction bytes, and kept fraction of keys (None for the
    recurrent state of gated linear attention: no keys were ever cached, so none were kept or evicted)."""
    mem = cache.memory_bytes()
    recurrent = any(getattr(layer, "state", None) is not None for layer in getattr(cache, "layers", ()))
    kept = None if recurrent else mem["live_keys"] / mem["total_keys"] if mem.get("total_keys") else 1.0
    return {"allocated_bytes": mem.get("allocated", 0), "live_bytes": mem.get("live", 0),
            "no_eviction_bytes": mem.get("no_eviction", 0), "kept_fraction": kept,
            "live_keys": mem.get("live_keys", 0), "total_keys": mem.get("total_keys", 0)}
