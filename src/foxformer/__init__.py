"""foxformer: the Forgetting Transformer (FoX) — kernels, models, training and evaluation."""
from .ops import forgetting_attention, forgetting_attention_cumsum, gate_cumsum

__version__ = "0.1.0"

try:  # registers the Hugging Face Auto classes; absent only while the models package is built
    from . import models  # noqa: F401
except ImportError as exc:  # pragma: no cover
    if "foxformer.models" not in str(exc) and "models" not in str(exc):
        raise

__all__ = ["forgetting_attention", "forgetting_attention_cumsum", "gate_cumsum", "__version__"]
