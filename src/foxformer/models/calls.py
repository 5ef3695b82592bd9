"""Calling any causal LM the same way (foxformer's own, and transformers 5.17 / 5.24 ones): its device,
the keyword its forward takes the cache by, and the cache in its output."""
from __future__ import annotations

import inspect

import torch


def model_device(model: torch.nn.Module) -> torch.device:
    for p in model.parameters():
        return p.device
    return torch.device("cpu")


def cache_keyword(model) -> str:
    """transformers 5.24 models take `cache=` (and warn on past_key_values); 5.17 ones only past_key_values.
    foxformer models take both."""
    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return "past_key_values"
    return "cache" if "cache" in params else "past_key_values"


def cache_of(out):
    # transformers 5.24 names it `cache` (and warns on `past_key_values`); 5.17 only has `past_key_values`.
    cache = getattr(out, "cache", None)
    return cache if cache is not None else getattr(out, "past_key_values", None)
