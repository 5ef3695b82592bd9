"""foxformer: the Forgetting Transformer (FoX) — kernels, models, training and evaluation.

The names below are imported on first use, so that the command line starts without torch
(``import foxformer.models`` registers the Hugging Face Auto classes).
"""
from ._lazy import lazy_exports

__version__ = "0.1.0"

_EXPORTS = {"forgetting_attention": ".ops", "forgetting_attention_cumsum": ".ops", "gate_cumsum": ".ops",
           "ForgettingAttention": ".models", "generate": ".infer"}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, submodules=("models", "ops", "data", "train", "eval", "infer"))

__all__ = ["ForgettingAttention", "forgetting_attention", "forgetting_attention_cumsum", "gate_cumsum", "generate",
           "__version__"]
