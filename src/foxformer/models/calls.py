"""Calling any causal LM the same way (foxformer's own, and transformers 5.17 / 5.24 ones): its device,
its stack under the LM head, the keyword its forward takes the cache by, the cache in its output, and transformers'
progress bars."""
from __future__ import annotations

import contextlib
import inspect
from typing import Optional

import torch

from ..progress import bars_shown


def model_device(model: torch.nn.Module) -> torch.device:
    for p in model.parameters():
        return p.device
    return torch.device("cpu")


def vocab_size_of(model: torch.nn.Module) -> Optional[int]:
    size = getattr(getattr(model, "config", None), "vocab_size", None)
    return int(size) if size else None


def backbone(model):
    """The stack under a causal LM's head (FoxModel of a FoxForCausalLM, LlamaModel of a LlamaForCausalLM);
    the model itself when it is one (or has no head): transformers' ``base_model``."""
    return getattr(model, "base_model", model)


def fox_blocks(model, purpose: str) -> list:
    """The Blocks of a foxformer model (FoxForCausalLM or FoxModel); TypeError saying what ``purpose`` needs
    otherwise (other Hugging Face models have `layers` too, but LLaMA's decoder layers hold `self_attn`)."""
    layers = getattr(backbone(model), "layers", None)
    if layers is None or not all(hasattr(getattr(block, "attn", None), "fgate") for block in layers):
        raise TypeError(f"model: {purpose} needs a foxformer model (FoxForCausalLM or FoxModel), "
                        f"got {type(model).__name__}")
    return list(layers)


def fresh_cache(model, total_len: int, eviction="config", decode: str = "auto", label: str = "{}"):
    """An empty cache for a model that will be fed ``total_len`` tokens (prompt and every token fed back):
    foxformer models' FoxCache (``FoxModel.new_cache``), sized and its eviction bound derived for the whole length
    at once; None for other models, which build their own. A cache a forward builds for itself covers that
    forward's input only: decoding past max_position_embeddings then warned that the config's evict_eps no longer
    held. eviction, decode, label: as ``FoxModel.new_cache`` takes them."""
    body = backbone(model)
    if not hasattr(body, "new_cache"):
        return None
    return body.new_cache(eviction, total_len=total_len, decode=decode, label=label)


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


@contextlib.contextmanager
def hf_progress(enabled: bool):
    """transformers' own progress bars (loading and writing weights) on or off for the block, as before after:
    `--no-progress` left them on, and off a terminal they wrote their frames into the log (see bars_shown)."""
    from transformers.utils import logging

    was = logging.is_progress_bar_enabled()
    (logging.enable_progress_bar if bars_shown(enabled) else logging.disable_progress_bar)()
    try:
        yield
    finally:
        (logging.enable_progress_bar if was else logging.disable_progress_bar)()
