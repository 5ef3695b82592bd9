"""Attention operators."""
from .forgetting_attention import (
    LOG_FGATE_FLOOR,
    auto_qk_bound,
    forgetting_attention,
    forgetting_attention_cumsum,
    gate_cumsum,
    naive_forgetting_attention,
    pruning_stats,
)

__all__ = [
    "LOG_FGATE_FLOOR",
    "auto_qk_bound",
    "forgetting_attention",
    "forgetting_attention_cumsum",
    "gate_cumsum",
    "naive_forgetting_attention",
    "pruning_stats",
]
