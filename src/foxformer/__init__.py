"""foxformer: the Forgetting Transformer (FoX) — kernels, models, training and evaluation."""
from . import models  # noqa: F401  (registers the Hugging Face Auto classes)
from .infer import generate
from .ops import forgetting_attention, forgetting_attention_cumsum, gate_cumsum

__version__ = "0.1.0"

__all__ = ["forgetting_attention", "forgetting_attention_cumsum", "gate_cumsum", "generate", "__version__"]
