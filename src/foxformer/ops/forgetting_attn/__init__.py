"""Forgetting Attention: exact references and fused Triton kernels (see README.md here)."""
from .checks import resolve_backend
from .cumsum import LOG_FGATE_FLOOR, gate_cumsum
from .decode import forgetting_attention_decode
from .interface import forgetting_attention, forgetting_attention_cumsum
from .pruning import auto_qk_bound, pruning_stats
from .reference import naive_forgetting_attention

__all__ = [
    "LOG_FGATE_FLOOR",
    "auto_qk_bound",
    "forgetting_attention",
    "forgetting_attention_cumsum",
    "forgetting_attention_decode",
    "gate_cumsum",
    "naive_forgetting_attention",
    "pruning_stats",
    "resolve_backend",
]
