"""Forgetting Attention: exact references and fused Triton kernels (see README.md here)."""
from .cumsum import LOG_FGATE_FLOOR, gate_cumsum
from .interface import forgetting_attention, forgetting_attention_cumsum
from .reference import naive_forgetting_attention

__all__ = [
    "LOG_FGATE_FLOOR",
    "forgetting_attention",
    "forgetting_attention_cumsum",
    "gate_cumsum",
    "naive_forgetting_attention",
]
