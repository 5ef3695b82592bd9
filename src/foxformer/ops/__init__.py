"""Attention operators."""
from .forgetting_attention import (
    LOG_FGATE_FLOOR,
    forgetting_attention,
    forgetting_attention_cumsum,
    gate_cumsum,
    naive_forgetting_attention,
)

__all__ = [
    "LOG_FGATE_FLOOR",
    "forgetting_attention",
    "forgetting_attention_cumsum",
    "gate_cumsum",
    "naive_forgetting_attention",
]
