"""Inference: streaming generation, gate-bias shift; KV eviction lives with the caches (models.kvcache)."""
from foxformer.models.kvcache import EvictionPolicy, output_tolerance

from .bias_shift import bias_shift_sweep, fgate_bias_shift, set_fgate_bias_shift
from .generate import GenerationConfig, generate, sample_next, stream_tokens

__all__ = [
    "EvictionPolicy", "GenerationConfig", "bias_shift_sweep", "fgate_bias_shift", "generate", "output_tolerance",
    "sample_next", "set_fgate_bias_shift", "stream_tokens",
]
