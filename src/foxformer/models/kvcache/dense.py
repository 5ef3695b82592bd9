"""Keys of a layer that keeps them all, in one preallocated buffer per tensor.

c is extended with ``gate_cumsum(new_log_f, initial=last_c)``: a decode step costs O(1) in the cache length
for the gate, and c is never recomputed over the whole cache. Storage is sized for the announced length
(FoxCache.reserve) or grows by doubling, so a step writes one row instead of concatenating the whole cache.
"""
from __future__ import annotations

from typing import Optional

import torch

from foxformer.ops.forgetting_attn.decode import forgetting_attention_decode

from .base import KeyCache

_MIN_CAPACITY = 16


def _capacity_for(n: int) -> int:
    cap = _MIN_CAPACITY
    while cap < n:
        cap *= 2
    return cap


class DenseKV(KeyCache):
    """k_buf, v_buf [B, capacity, Hkv, D]; c_buf float64 [B, H, capacity] (heads first: the decode kernel
    reads it along the keys)."""

    def __init__(self, capacity_hint: int = 0) -> None:
        super().__init__(capacity_hint)
        self.k_buf: Optional[torch.Tensor] = None
        self.v_buf: Optional[torch.Tensor] = None
        self.c_buf: Optional[torch.Tensor] = None

    @property
    def capacity(self) -> int:
        return 0 if self.k_buf is None else self.k_buf.shape[1]

    def shape(self, num_kv_heads: int) -> Optional[tuple[int, int, int]]:
        if self.k_buf is None:
            return None
        B, _, Hkv, D = self.k_buf.shape
        return B, Hkv, D

    def keys_from(self, first: int) -> tuple:
        if self.k_buf is None:
            return None, None, None
        return (self.k_buf[:, first:self.length], self.v_buf[:, first:self.length],
                self.c_buf[:, :, first:self.length].transpose(1, 2))

    def _resize(self, capacity: int) -> None:
        old = (self.k_buf, self.v_buf, self.c_buf)
        self.k_buf = old[0].new_empty(old[0].shape[0], capacity, *old[0].shape[2:])
        self.v_buf = old[1].new_empty(old[1].shape[0], capacity, *old[1].shape[2:])
        self.c_buf = old[2].new_empty(old[2].shape[0], old[2].shape[1], capacity)
        self.k_buf[:, :self.length] = old[0][:, :self.length]
        self.v_buf[:, :self.length] = old[1][:, :self.length]
        self.c_buf[:, :, :self.length] = old[2][:, :, :self.length]

    def _reserve(self, extra: int) -> None:
        """Room for ``extra`` more entries: regrow by doubling (never beyond the announced total length)."""
        need = self.length + extra
        if need <= self.capacity:
            return
        capacity = _capacity_for(max(need, 2 * self.length))
        if self.capacity_hint >= need:
            capacity = min(capacity, self.capacity_hint)
        self._resize(capacity)

    def _append(self, k: torch.Tensor, v: torch.Tensor, c: torch.Tensor) -> None:
        T = k.shape[1]
        if self.k_buf is None:
            B, _, Hkv, D = k.shape
            capacity = max(_capacity_for(T), self.capacity_hint)  # a known total length at once
            self.k_buf = k.new_empty(B, capacity, Hkv, D)
            self.v_buf = k.new_empty(B, capacity, Hkv, D)
            self.c_buf = c.new_empty(B, c.shape[2], capacity, dtype=torch.float64)
        else:
            self._reserve(T)
        end = self.length + T
        self.k_buf[:, self.length:end] = k
        self.v_buf[:, self.length:end] = v
        self.c_buf[:, :, self.length:end] = c.transpose(1, 2)
        self.length = end

    def prepare_step(self) -> None:
        self._reserve(1)

    def _token_storage(self) -> tuple:
        return self.k_buf, self.v_buf, self.c_buf, None

    def decode(self, q: torch.Tensor, backend: str, seq_len) -> torch.Tensor:
        # The whole buffers and the length: the kernel's key splits follow the capacity, so eager steps and
        # replayed static steps of one cache run the same kernel (and give the same bits).
        return forgetting_attention_decode(q, self.k_buf, self.v_buf, self.c_buf.transpose(1, 2), None,
                                           seq_len=seq_len, backend=backend)

    def select(self, index: torch.Tensor) -> None:
        super().select(index)
        for name in ("k_buf", "v_buf", "c_buf"):
            t = getattr(self, name)
            if t is None:
                continue
            picked = t.index_select(0, index.to(t.device))
            if picked.shape == t.shape:
                t.copy_(picked)
            else:
                setattr(self, name, picked)

    def storage(self) -> list:
        return super().storage() + [self.k_buf, self.v_buf, self.c_buf]

    def memory(self) -> dict:
        if self.k_buf is None:
            return self._memory(0, 0, 0, 0, 0, 0, 0)
        B, _, Hkv, D = self.k_buf.shape
        elem = self.k_buf.element_size()
        allocated = (self.k_buf.numel() + self.v_buf.numel()) * elem + self.c_buf.numel() * 8
        keys = self.length * B * Hkv  # a dense layer never evicts: every key it holds is live (and no sync)
        return self._memory(allocated, keys, keys, B * Hkv, D, self.c_buf.shape[1] // Hkv, elem)
