"""Inference: streaming generation, gate-bias shift; KV eviction lives with the caches (models.kvcache).

Names are imported on first use (see foxformer._lazy): `foxformer generate --help` needs none of them.
"""
from .._lazy import lazy_exports

_EXPORTS = {"EvictionPolicy": "foxformer.models.kvcache", "output_tolerance": "foxformer.models.kvcache",
            "bias_shift_sweep": ".bias_shift", "fgate_bias_shift": ".bias_shift", "set_fgate_bias_shift": ".bias_shift",
            "GenerationConfig": ".generation", "GreedyNote": ".generation", "generate": ".generation",
            "PastTrainLen": "foxformer.models.trained_length",
            "sample_next": ".generation", "stream_tokens": ".generation"}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)
