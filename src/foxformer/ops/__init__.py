"""Attention operators."""
from .forgetting_attn import (
    LOG_FGATE_FLOOR,
    auto_qk_bound,
    forgetting_attention,
    forgetting_attention_cumsum,
    forgetting_attention_decode,
    gate_cumsum,
    naive_forgetting_attention,
    pruning_stats,
    resolve_backend,
)
from .gated_linear_attn import (
    gated_linear_attention,
    naive_gated_linear_attention,
    recurrent_gated_linear_attention,
)
from .pro_block import gate_norm, shift_norm

__all__ = [
    "LOG_FGATE_FLOOR",
    "auto_qk_bound",
    "forgetting_attention",
    "forgetting_attention_cumsum",
    "forgetting_attention_decode",
    "gate_cumsum",
    "gate_norm",
    "gated_linear_attention",
    "naive_forgetting_attention",
    "naive_gated_linear_attention",
    "pruning_stats",
    "recurrent_gated_linear_attention",
    "resolve_backend",
    "shift_norm",
]
