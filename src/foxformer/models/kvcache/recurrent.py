"""The state of a gated linear attention layer: S [B, H, Dk, Dv] (fp32; fp64 for fp64 models), a fixed
size whatever the length, and nothing to evict."""
from __future__ import annotations

from typing import Optional

import torch

from foxformer.ops import gated_linear_attention, naive_gated_linear_attention

from .base import LayerState, _store


class RecurrentState(LayerState):
    kind = "state"

    def __init__(self) -> None:
        super().__init__()
        self.state: Optional[torch.Tensor] = None

    @property
    def filled(self) -> bool:
        return self.state is not None

    def shape(self, num_kv_heads: int) -> Optional[tuple[int, int, int]]:
        if self.state is None:
            return None
        # The state is [B, H, Dk, Dv] whatever the GQA grouping; the kv-shift states carry the kv heads.
        Hkv = num_kv_heads if self.k_last is None else self.k_last.shape[1]
        return self.state.shape[0], Hkv, self.state.shape[2]

    def attend(self, q, k, v, log_f, *, backend: str, pruning, at: Optional[torch.Tensor] = None,
               scan: bool = True, shift: tuple = (None, None)) -> torch.Tensor:
        """Sequence starts (left padding, packed sequences) come with f = 0, which clears the state there."""
        op = naive_gated_linear_attention if backend == "naive" else gated_linear_attention
        out, state = op(q, k, v, log_f, initial_state=self.state, return_final_state=True)
        self.state = _store(self.state, state)
        self.set_shift_state(*shift)
        return out

    def select(self, index: torch.Tensor) -> None:
        super().select(index)
        if self.state is not None:
            self.state = _store(self.state, self.state.index_select(0, index.to(self.state.device)))

    def storage(self) -> list:
        return super().storage() + [self.state]

    def memory(self) -> dict:
        n = 0 if self.state is None else self.state.numel() * self.state.element_size()
        return {"allocated": n, "live": n, "held": n, "no_eviction": n, "live_keys": 0, "total_keys": 0}
