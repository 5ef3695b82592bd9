"""Decoding cache for FoX: keys, values, the running gate cumsum c and the kv-shift states per layer.

c is extended with ``gate_cumsum(new_log_f, initial=last_c)``: a decode step costs O(1) in the
cache length for the gate, and c is never recomputed over the whole cache.
"""
from __future__ import annotations

from typing import Optional

import torch


class LayerCache:
    """One layer's state. k, v [B, T, Hkv, D]; c float64 [B, T, H]; k_last, v_last [B, Hkv, D] (kv shift)."""

    def __init__(self) -> None:
        self.k: Optional[torch.Tensor] = None
        self.v: Optional[torch.Tensor] = None
        self.c: Optional[torch.Tensor] = None
        self.k_last: Optional[torch.Tensor] = None
        self.v_last: Optional[torch.Tensor] = None

    def last_c(self) -> Optional[torch.Tensor]:
        """c of the newest cached token [B, H], or None for an empty cache."""
        return None if self.c is None else self.c[:, -1]

    def append(self, k: torch.Tensor, v: torch.Tensor, c: torch.Tensor):
        """Add a chunk and return the full (k, v, c)."""
        if self.k is None:
            self.k, self.v, self.c = k, v, c
        else:
            self.k = torch.cat((self.k, k), dim=1)
            self.v = torch.cat((self.v, v), dim=1)
            self.c = torch.cat((self.c, c), dim=1)
        return self.k, self.v, self.c

    def select(self, index: torch.Tensor) -> None:
        for name in ("k", "v", "c", "k_last", "v_last"):
            t = getattr(self, name)
            if t is not None:
                setattr(self, name, t.index_select(0, index.to(t.device)))


class FoxCache:
    """Per-layer caches plus the number of tokens seen. Pass it back as ``past_key_values`` (or
    ``cache``) to continue: prefill in chunks, decode token by token.

    Not a ``transformers.Cache`` subclass on purpose: its API differs between transformers 5.17
    and 5.24, and generate only needs ``get_seq_length`` and the model's own
    ``prepare_inputs_for_generation``.
    """

    is_compileable = False
    is_croppable = False

    def __init__(self, num_layers: int) -> None:
        self.layers = [LayerCache() for _ in range(num_layers)]
        self.seq_len = 0

    def __len__(self) -> int:
        return len(self.layers)

    def __getitem__(self, idx: int) -> LayerCache:
        return self.layers[idx]

    @property
    def is_linear(self) -> list[bool]:
        return [False] * len(self.layers)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.seq_len

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        """Keep rows ``beam_idx`` (beam search, batch selection)."""
        for layer in self.layers:
            layer.select(beam_idx)

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self.reorder_cache(indices)
