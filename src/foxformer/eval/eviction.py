"""`foxformer eval eviction`: what KV-cache eviction costs in loss and saves in memory, on real text.

The same sequences are read twice through the model's cache, ``chunk`` tokens per step (the decode
path: eviction runs after every step): once keeping every key, once with ``evict_eps``. Both passes
take the same code path but for eviction, so the per-token loss difference is eviction's alone. The
memory figures are the cache's own: bytes allocated (buffers grow by doubling; an evicting cache
compacts its dead prefix) and bytes live, at their peak over the sequence.
"""
from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from foxformer.argtypes import setting_name
from foxformer.models.calls import backbone, cache_of, model_device
from foxformer.models.kvcache import EvictionPolicy
from foxformer.progress import progress_bar

from .loss import check_finite, check_tokens, fp32_head, head_losses


@torch.no_grad()
def _cached_pass(model, tokens: torch.Tensor, chunk: int, prefill: int, policy: Optional[EvictionPolicy],
                 progress: bool, desc: str) -> tuple[torch.Tensor, dict]:
    """fp32 [N, T-1] next-token losses through the cache (``policy`` None: every key kept, whatever the
    model config says), and the cache's peak memory."""
    body = backbone(model)
    # N of the bound: the sequence read here (the model's max_position_embeddings may be shorter).
    cache = body.new_cache(policy if policy is None else EvictionPolicy(policy.eps, policy.qk_bound, tokens.shape[1]))
    head = fp32_head(model.lm_head)
    losses, peak_alloc, peak_live, report = [], 0, 0, {}
    bounds = [0, min(prefill, tokens.shape[1])]
    while bounds[-1] < tokens.shape[1]:
        bounds.append(min(bounds[-1] + chunk, tokens.shape[1]))
    for a, b in progress_bar(list(zip(bounds[:-1], bounds[1:])), desc=desc, unit="chunk", wanted=progress,
                             leave=False):
        out = body(input_ids=tokens[:, a:b], cache=cache, use_cache=True)
        cache = cache_of(out)
        hidden = out.last_hidden_state[:, : max(0, min(b, tokens.shape[1] - 1) - a)]
        if hidden.shape[1]:
            losses.append(head_losses(hidden, tokens[:, a + 1:a + 1 + hidden.shape[1]], *head))
        report = cache.memory_report()
        peak_alloc = max(peak_alloc, report["allocated_bytes"])
        peak_live = max(peak_live, report["live_bytes"])
    mem = {"peak_allocated_bytes": peak_alloc, "peak_live_bytes": peak_live,
           "kept_fraction": report.get("kept_fraction", 1.0)}
    return torch.cat(losses, dim=1), mem


def eviction_loss(model, tokens, *, evict_eps: float, chunk: int = 16, prefill: int = 16,
                  qk_bound: Optional[float] = None, progress: bool = True, label: str = "{}") -> dict:
    """Loss and cache memory with and without eviction on ``tokens`` (int64 [N, T]).

    chunk: tokens per step after the first ``prefill`` tokens (<= 16 takes the decode kernel on a GPU).
    Returns mean losses, the per-token difference (mean, mean absolute, max absolute, fp64 means of
    fp32 losses; and by position, in log-spaced bins), the memory ratios and the fraction of keys still
    cached at the end. ``label`` names chunk, prefill and qk_bound in errors as argtypes.setting_name does
    ("--{}": the flags of `eval eviction`).
    """
    if not hasattr(backbone(model), "new_cache"):
        raise ValueError("model: eviction needs a foxformer FoX model (FoxForCausalLM)")
    if not model.config.has_fgate:
        raise ValueError("model: eviction needs a forget gate (a FoX model); this one has none")
    if model.config.attention == "linear":
        # Here, not at new_cache: that comes after the whole no-eviction pass, the longest part of the run.
        raise ValueError("model: eviction needs cached keys; a gated linear attention model (attention='linear') "
                         "has no keys to evict, only a fixed-size recurrent state")
    policy = EvictionPolicy(evict_eps, qk_bound)
    # new_cache takes the config's evict_qk_bound when qk_bound is None
    if qk_bound is None and model.config.evict_qk_bound is None and not model.config.qk_norm:
        raise ValueError(f"{setting_name(label, 'qk_bound')}: this model has no QK-norm, so eviction needs your "
                         f"bound on |q.k| * scale (or evict_qk_bound in its config); without one it would evict "
                         f"nothing")
    for field, value in (("chunk", chunk), ("prefill", prefill)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{setting_name(label, field)}: expected a positive integer, got {value!r}")
    tokens = check_tokens(tokens, model).to(model_device(model))
    was_training = model.training
    model.eval()
    try:
        base, base_mem = _cached_pass(model, tokens, chunk, prefill, None, progress, "no eviction")
        check_finite(base, "eviction")  # before the second pass, which would take as long for nothing
        ev, ev_mem = _cached_pass(model, tokens, chunk, prefill, policy, progress, "eviction")
        check_finite(ev, "eviction")
    finally:
        model.train(was_training)
    diff = (ev.double() - base.double()).cpu().numpy()
    # ~64 log-spaced bins of positions (a 64K sequence would be 64K numbers): what the plot draws
    n = diff.shape[1]
    edges = np.unique(np.geomspace(1, n + 1, num=min(n, 64) + 1).astype(int))
    by_position = {"position": [float(np.sqrt(a * (b - 1))) for a, b in zip(edges[:-1], edges[1:])],
                   "mean_diff": [float(diff[:, a - 1:b - 1].mean()) for a, b in zip(edges[:-1], edges[1:])],
                   "max_abs_diff": [float(np.abs(diff[:, a - 1:b - 1]).max()) for a, b in zip(edges[:-1], edges[1:])]}
    return {"evict_eps": evict_eps, "seq_len": int(tokens.shape[1]), "n_sequences": int(tokens.shape[0]),
            "chunk": chunk, "prefill": prefill,
            "loss": float(base.double().mean()), "loss_evicted": float(ev.double().mean()),
            "mean_diff": float(diff.mean()), "mean_abs_diff": float(np.abs(diff).mean()),
            "max_abs_diff": float(np.abs(diff).max()),
            "kept_fraction": ev_mem["kept_fraction"],
            "peak_allocated_bytes": base_mem["peak_allocated_bytes"],
            "peak_allocated_bytes_evicted": ev_mem["peak_allocated_bytes"],
            "allocated_ratio": ev_mem["peak_allocated_bytes"] / max(base_mem["peak_allocated_bytes"], 1),
            "live_ratio": ev_mem["peak_live_bytes"] / max(base_mem["peak_live_bytes"], 1),
            "by_position": by_position}
