"""Gated linear attention (FoX's forget gate without the softmax): chunked torch op and references."""
from .interface import gated_linear_attention
from .reference import naive_gated_linear_attention, recurrent_gated_linear_attention

__all__ = ["gated_linear_attention", "naive_gated_linear_attention", "recurrent_gated_linear_attention"]
