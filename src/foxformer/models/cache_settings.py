"""generate's cache settings: the values of transformers' cache_implementation (and max_cache_len) that
foxformer models take, the FoxCache decode mode each grants, and the one refusal of transformers' paged cache.
FoxForCausalLM (modeling.py) checks them before generate builds its FoxCache.
"""
from __future__ import annotations

from typing import Optional

# The values of transformers' cache_implementation that FoxCache, the one cache generate runs foxformer models on,
# grants, each with the decode mode of its one-token steps (FoxCache.DECODE_MODES). DynamicCache, transformers'
# default, grows as tokens come, as FoxCache does (storage for max_length at once, doubling past it): the default mode.
# StaticCache is storage for max_length allocated up front and steps of fixed shapes, which transformers compiles (on
# CUDA, by default with mode "reduce-overhead") to replay them as CUDA graphs: the speed asked for is the graphs.
# "graphs" is FoxCache's fixed-shape step (storage preallocated, the position on the device, writes in place) captured
# and replayed, the same tokens as eager; unlike "auto" it says why where it cannot capture (the CPU, where
# transformers compiles nothing either: the step runs eagerly). Not its namesake "static": the same step uncaptured,
# slower than the default on CUDA. Not "compiled": a torch.compile per storage shape for a few percent a step
# (docs/benchmarks.md), and transformers compiles no FoxCache (not a compileable Cache: it skips a compile_config).
DYNAMIC_CACHE, STATIC_CACHE = "dynamic", "static"
CACHE_DECODE_MODES = {DYNAMIC_CACHE: "auto", STATIC_CACHE: "graphs"}
_ACCEPTED_SAID = ", ".join(map(repr, CACHE_DECODE_MODES))  # in the refusals' advice
# disable_compile=True leaves transformers' StaticCache steps fixed-shape and eager: FoxCache's step uncaptured.
UNCOMPILED_STATIC_DECODE = "static"
# transformers' continuous batching (generate_batch and its kin, and generate's cache_implementation="paged", which
# never reaches _prepare_cache_for_generation) runs the forward on its PagedAttentionCache through "paged|..."
# attention. The forward refused the call, but the batching thread only logs a failed request: generate returned the
# prompts without a new token, and without an error.
PAGED_CACHE, PAGED_ATTENTION = "paged", "paged|"


def paged_refusal(asked: str) -> ValueError:
    """The one message for every way into transformers' paged cache, ``asked`` saying which."""
    return ValueError(f"{asked} asks for transformers' paged cache, which foxformer models do not support: FoX keeps "
                      f"its gate sums and shift states in its own FoxCache, and the paged cache has no place for them; "
                      f"use generate (cache_implementation left out or one of {_ACCEPTED_SAID}), or foxformer's own "
                      f"paged KV cache with eviction (FoxModel.new_cache, `foxformer generate`)")


def check_cache_settings(value: Optional[str], max_cache_len: Optional[int] = None) -> None:
    """ValueError for a cache_implementation FoxCache does not grant: another cache failed deep inside transformers
    (an AttributeError on the cache) or, for a static cache, was ignored. Likewise for any max_cache_len, which
    was ignored in silence beside "static" (and said as ignored only beside other caches)."""
    if max_cache_len is not None:
        raise ValueError(f"generate: max_cache_len={max_cache_len!r} sizes transformers' static cache ahead of "
                         f"later, longer calls, which foxformer models do not keep: each generate call builds its "
                         f"own FoxCache, with storage for that call's prompt and new tokens (max_length), so there is "
                         f"nothing to size; leave it out")
    if not value or value in CACHE_DECODE_MODES:
        return
    if value == PAGED_CACHE:
        raise paged_refusal(f"generate: cache_implementation={value!r} (continuous batching)")
    raise ValueError(f"generate: cache_implementation={value!r} asks for another cache implementation (FoX keeps its "
                     f"gate sums in FoxCache), which foxformer models do not support; leave it out or pass one of "
                     f"{_ACCEPTED_SAID} (FoxCache: the default, or one-token steps replayed as CUDA graphs)")
