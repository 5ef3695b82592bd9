"""Inference: streaming generation, KV-cache eviction, gate-bias shift, the decode kernel.

Nothing here imports foxformer.models at import time (the models use infer.eviction).
"""
from .bias_shift import bias_shift_sweep, fgate_bias_shift, set_fgate_bias_shift
from .eviction import cache_report, eviction_delta, eviction_deltas, output_tolerance, qk_bound_from_norms
from .generate import GenerationConfig, generate, sample_next, stream_tokens


def forgetting_attention_decode(*args, **kwargs):
    """See foxformer.ops.forgetting_attention.decode.forgetting_attention_decode (imported on use: triton)."""
    from foxformer.ops.forgetting_attention.decode import forgetting_attention_decode as decode
    return decode(*args, **kwargs)


__all__ = [
    "GenerationConfig", "bias_shift_sweep", "cache_report", "eviction_delta", "eviction_deltas",
    "fgate_bias_shift", "forgetting_attention_decode", "generate", "output_tolerance", "qk_bound_from_norms",
    "sample_next", "set_fgate_bias_shift", "stream_tokens",
]
