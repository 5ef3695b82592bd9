"""Keys of an evicting layer: per-head pages (``pages.PagePool``) and a start per (batch, kv head).

c never increases, so the keys a head can drop are always its oldest and its live keys are the suffix
``[start, length)`` (ragged across heads). Each (batch, kv head) keeps its keys in its own pages, so a head
that forgets fast hands its dead pages back whatever the others keep (one dense buffer can only drop the
prefix that *every* head has dropped: on a trained 125M FoX one long-memory head per layer kept 60% of the
buffer allocated while 5% of the keys were live; fifth-session `eval eviction`, 64K tokens).
"""
from __future__ import annotations

from typing import Optional

import torch

from foxformer.ops.forgetting_attn.decode import forgetting_attention_decode
from foxformer.ops.forgetting_attn.evict_scan import evict_scan_

from .base import KeyCache
from .pages import PAGE_SIZE, PagePool


class PagedKV(KeyCache):
    """delta: the eviction threshold (log space, < 0) of this layer. start int64 [B, Hkv]: first live
    position of each (batch, kv head). Views (k, v, c) are copies with the dead keys masked. max_len: N, the
    most positions the cache will hold (the bound's; None: unknown): it caps storage, capacity_hint sizes it."""

    def __init__(self, delta: float, capacity_hint: int = 0, page_size: int = PAGE_SIZE,
                 max_len: Optional[int] = None) -> None:
        super().__init__(capacity_hint)
        self.delta = float(delta)
        self.page_size = page_size
        self.max_len = max_len
        self.pages: Optional[PagePool] = None
        self.start: Optional[torch.Tensor] = None

    def shape(self, num_kv_heads: int) -> Optional[tuple[int, int, int]]:
        return None if self.pages is None else self.pages.shape

    @property
    def capacity(self) -> int:
        """Positions the pool holds (all heads together)."""
        return 0 if self.pages is None else self.pages.k_pages.shape[0] * self.pages.page

    def live_lengths(self) -> Optional[torch.Tensor]:
        """int64 [B, Hkv]: keys still held per (batch, kv head)."""
        return None if self.start is None else self.length - self.start

    def keys_from(self, first: int) -> tuple:
        if self.pages is None:
            return None, None, None
        return self.pages.dense(first, self.start)

    def _append(self, k: torch.Tensor, v: torch.Tensor, c: torch.Tensor) -> None:
        if self.pages is None:
            self.pages = PagePool(k, c, self.page_size, self.capacity_hint, self.max_len)
            self.start = torch.zeros(k.shape[0], k.shape[2], dtype=torch.int64, device=k.device)
        self.pages.append(k, v, c, self.start)
        self.length = self.pages.length

    def prepare_step(self) -> None:
        self.pages.prepare_step(self.start)

    def _token_storage(self) -> tuple:
        p = self.pages
        return p.k_pages, p.v_pages, p.c_pages, p.table

    def advance(self, n: int) -> None:
        self.pages.length += n
        self.length = self.pages.length

    def decode(self, q: torch.Tensor, backend: str, seq_len) -> torch.Tensor:
        p = self.pages
        return forgetting_attention_decode(q, p.k_pages, p.v_pages, p.c_pages, self.start, page_table=p.table,
                                           seq_len=seq_len, backend=backend)

    def min_start(self) -> int:
        """The prefix every head has dropped (a device sync)."""
        return 0 if self.start is None else int(self.start.min())

    def evict(self, window: Optional[int] = None, last=None) -> None:
        """Advance ``start`` past every key that no later query can weigh above the bound.

        A key j is dead for query head h once c_now - c_j <= delta (c only decreases afterwards); a kv
        entry is dropped only when every query head of its GQA group allows it. window: examine only the
        ``window`` oldest live keys of each head (a decode step then reads O(window) values of c; keys left
        over are caught by later scans, and keeping a key longer is always safe); None scans everything.
        last: the newest position (default length - 1; a device tensor in a static step). No host sync,
        and ``start`` is updated in place.
        """
        if self.length == 0 and last is None:
            return
        p = self.pages
        last = self.length - 1 if last is None else last
        if window is not None:  # one kernel on a GPU (ops/forgetting_attn/evict_scan.py)
            evict_scan_(self.start, p.c_pages, p.table, self.c_last, self.delta, window, last)
        else:
            # Every live position: the same count in torch, whose memory follows the length (the kernel holds
            # its window in one program). c is non-increasing, so the dead keys are a prefix from each start.
            evict_scan_(self.start, p.c_pages, p.table, self.c_last, self.delta, self.length, last, backend="torch")

    def select(self, index: torch.Tensor) -> None:
        super().select(index)
        if self.pages is not None:
            self.start = self.pages.select(index, self.start)

    def storage(self) -> list:
        p = self.pages
        return super().storage() + [self.start] + ([] if p is None else [p.k_pages, p.v_pages, p.c_pages, p.table])

    def memory(self) -> dict:
        """One device sync (the live lengths)."""
        p = self.pages
        if p is None:
            return self._memory(0, 0, 0, 0, 0, 0, 0)
        B, Hkv, D = p.shape
        return self._memory(p.memory_bytes(), int(self.live_lengths().sum()), p.pages_in_use * p.page, B * Hkv, D,
                            p.group, p.k_pages.element_size())
