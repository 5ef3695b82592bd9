"""Decoding state: the one home of KV caches, recurrent states and eviction.

``FoxModel.new_cache`` builds a ``FoxCache`` (one ``LayerState`` per layer: ``DenseKV``, ``PagedKV`` for
evicting layers, ``RecurrentState`` for gated linear attention) from an ``EvictionPolicy``; ``graphs``
replays its one-token steps as CUDA graphs.
"""
from .base import DECODE_MAX_QUERIES, LayerState
from .cache import FoxCache
from .dense import DenseKV
from .pages import PAGE_SIZE, PagePool
from .paged import PagedKV
from .policy import EVICT_EVERY, EVICT_WINDOW, EvictionPolicy, check_eviction, output_tolerance
from .recurrent import RecurrentState

__all__ = [
    "DECODE_MAX_QUERIES", "DenseKV", "EVICT_EVERY", "EVICT_WINDOW", "EvictionPolicy", "FoxCache", "LayerState",
    "PAGE_SIZE", "PagePool", "PagedKV", "RecurrentState", "check_eviction", "output_tolerance",
]
