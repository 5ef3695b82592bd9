"""Paged key/value storage of an evicting layer (``paged.PagedKV``): each (batch row, kv head) keeps its keys in its
own pages of a shared pool, so a head that forgets fast hands its dead pages back whatever the other
heads keep. (One dense [B, T, Hkv, D] buffer can only drop the prefix that *every* head has dropped:
on a trained 125M FoX one long-memory head per layer kept 60% of the buffer allocated while 5% of the
keys were live; fifth-session `eval eviction`, 64K tokens.)

Layout: k, v pools [P, PAGE, D]; c pool float64 [P, PAGE, G] (the running cumsum of the G query heads
of a kv head); a page table int32 [B, Hkv, pages] maps logical page j // PAGE of (b, h) to a pool page.
All rows and heads advance together, so new pages are needed by all of them at the same positions.
Pages wholly before a head's start are returned to a free list, lazily: only when an append finds the
list too short, which costs one device sync (reading start) per PAGE tokens at most. The pool grows by
a quarter when the free pages do not suffice and never shrinks, so it holds at most 1.25x the pages ever
in use at once. The page table has a column for every page of the length announced (it doubles past that):
a static decode step finds its page there without the host. N (the eviction bound's max_len) only caps
the growth of both: it may be far beyond any length fed (evict_max_len=10**11 sized 6 GB of table per kv head).
"""
from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from foxformer.ops.forgetting_attn.paging import gather_live, page_c

# Tokens per page: small next to the windows that trained fast-forgetting heads keep (hundreds of keys at e^-10
# in the fifth-session 125M run). The decode kernel looks up each key's page, so its 128-key blocks
# (decode.DECODE_TILES) read two pages each: two contiguous 64-row runs.
PAGE_SIZE = 64
# Added to the c of dead keys in dense copies: exp(-1e4) is 0 in every float format, so attention over
# the copy (the prefill op, which has no per-head start) gives them no weight, exactly.
_DEAD_C_OFFSET = 1e4


class PagePool:
    """The pages of one layer. ``length`` positions are held per (b, h); ``start`` [B, Hkv] (owned by
    the caller's PagedKV) marks the first live one."""

    def __init__(self, k: torch.Tensor, c: torch.Tensor, page_size: int = PAGE_SIZE, capacity: int = 0,
                 max_len: Optional[int] = None) -> None:
        """capacity: the length announced (the table's columns at once); max_len: the most positions of a head
        ever held (N of the bound; None: unknown)."""
        B, _, Hkv, D = k.shape
        self.page = page_size
        self.group = c.shape[2] // Hkv
        self.k_pages = k.new_empty(0, page_size, D)
        self.v_pages = k.new_empty(0, page_size, D)
        self.c_pages = c.new_empty(0, page_size, self.group, dtype=torch.float64)
        cols = -(-capacity // page_size)
        # N caps the table (the model refuses to go past it); without N a sequence may run past the length announced.
        self.max_cols = None if max_len is None else -(-max_len // page_size)
        if self.max_cols is not None:
            cols = min(cols, self.max_cols)
        self.table = torch.zeros(B, Hkv, cols, dtype=torch.int32, device=k.device)
        self.table_host = np.zeros((B, Hkv, cols), dtype=np.int32)
        self.released = np.zeros((B, Hkv), dtype=np.int64)  # logical pages handed back, per (b, h)
        self.free: list[int] = []
        self.length = 0
        self.mapped = 0  # logical pages of every (b, h) with a pool page
        # The pool never needs more pages than every position of every head (N, else the length announced;
        # 0 if neither is known), so growth stops there.
        self.max_pages = k.shape[0] * Hkv * (cols if self.max_cols is None else self.max_cols)

    @property
    def shape(self) -> tuple[int, int, int]:
        """(B, Hkv, D)."""
        return self.table.shape[0], self.table.shape[1], self.k_pages.shape[2]

    @property
    def pages_in_use(self) -> int:
        return self.k_pages.shape[0] - len(self.free)

    # -- pages ---------------------------------------------------------------------------------
    def release(self, start: torch.Tensor) -> None:
        """Hand back every page wholly before ``start`` [B, Hkv] (one device sync)."""
        # Only pages already written: a rebuilt cache (select) maps its pages after its starts are known.
        dead = np.minimum(start.clamp(min=0).cpu().numpy() // self.page, -(-self.length // self.page))
        for (b, h), upto in np.ndenumerate(dead):
            if upto > self.released[b, h]:
                self.free.extend(self.table_host[b, h, self.released[b, h]:upto].tolist())
                self.released[b, h] = upto

    def _take(self, n: int, start: torch.Tensor) -> np.ndarray:
        if len(self.free) < n:
            self.release(start)
        if len(self.free) < n:
            old = self.k_pages.shape[0]
            need = old + n - len(self.free)
            # A quarter more, not double: a chunked prefill grows the pool in big steps, and doubling ended at
            # every position of every head with half of them dead (sixth-session bench, 32K and 64K at batch 1).
            # The copies stay amortised O(1) per page (4x the final pool in total).
            size = max(need, old + old // 4)
            if self.max_pages >= need:
                size = min(size, self.max_pages)
            for name in ("k_pages", "v_pages", "c_pages"):
                pool = getattr(self, name)
                grown = pool.new_empty(size, *pool.shape[1:])
                grown[:old] = pool
                setattr(self, name, grown)
            self.free.extend(range(old, size))
        ids, self.free = self.free[-n:], self.free[:-n]
        return np.asarray(ids, dtype=np.int32)

    def _map(self, first: int, last: int, start: torch.Tensor) -> None:
        """Give logical pages [first, last) of every (b, h) a pool page."""
        B, Hkv, _ = self.shape
        if last > self.table.shape[2]:
            cols = max(last, 2 * self.table.shape[2])
            if self.max_cols is not None:
                cols = max(last, min(cols, self.max_cols))
            host = np.zeros((B, Hkv, cols), dtype=np.int32)
            host[:, :, :self.table_host.shape[2]] = self.table_host
            self.table_host = host
            self.table = torch.from_numpy(host).to(self.table.device)
        ids = self._take(B * Hkv * (last - first), start).reshape(B, Hkv, last - first)
        self.table_host[:, :, first:last] = ids
        self.table[:, :, first:last] = torch.from_numpy(ids).to(self.table.device, non_blocking=True)
        self.mapped = last

    def append(self, k: torch.Tensor, v: torch.Tensor, c: torch.Tensor, start: torch.Tensor) -> None:
        """Write positions [length, length + T): k, v [B, T, Hkv, D]; c float64 [B, T, H]."""
        B, T, Hkv, _ = k.shape
        last = -(-(self.length + T) // self.page)
        if last > self.mapped:
            self._map(self.mapped, last, start)
        pos = torch.arange(self.length, self.length + T, device=k.device)
        page = self.table[:, :, pos // self.page].long().transpose(1, 2)   # [B, T, Hkv]
        row = (pos % self.page)[None, :, None]
        self.k_pages[page, row] = k.to(self.k_pages.dtype)
        self.v_pages[page, row] = v.to(self.v_pages.dtype)
        self.c_pages[page, row] = c.view(B, T, Hkv, self.group).to(torch.float64)
        self.length += T

    def prepare_step(self, start: torch.Tensor) -> None:
        """Map the page of position ``length`` if it starts a new one (before a static step writes there)."""
        if self.length // self.page + 1 > self.mapped:
            self._map(self.mapped, self.length // self.page + 1, start)

    # -- reads ---------------------------------------------------------------------------------
    def c_at(self, pos: torch.Tensor) -> torch.Tensor:
        """c at positions pos int64 [B, H, W] of each query head -> float64 [B, H, W] (live positions only)."""
        return page_c(self.c_pages, self.table, pos)

    def dense(self, first: int, start: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Copies of positions [first, length): k, v [B, L, Hkv, D] and c float64 [B, L, H], with the dead
        keys of each head (before its start) zeroed and their c raised so that no query weighs them."""
        k, v, c, dead = gather_live(self.k_pages, self.v_pages, self.c_pages, self.table, first, self.length, start)
        live_c = self.c_at(start.clamp(min=0).repeat_interleave(self.group, 1)[:, :, None])[..., 0]  # [B, H]
        dead_h = dead.repeat_interleave(self.group, 2)
        c.masked_scatter_(dead_h, (live_c + _DEAD_C_OFFSET)[:, None, :].expand_as(c)[dead_h])
        return k, v, c

    def select(self, index: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
        """Keep batch rows ``index`` (repeats allowed: beam search); returns their start. The live pages
        (from each head's start on) are copied into a fresh pool, since rows sharing pages would free them
        twice; dead pages are not copied (one device sync: reading start)."""
        index = index.to(self.table.device)
        start = start.index_select(0, index)
        self.max_pages = self.max_pages // max(1, self.shape[0]) * index.numel()
        n_pages = -(-self.length // self.page)
        rows = index.cpu().numpy()
        first = np.minimum(start.clamp(min=0).cpu().numpy() // self.page, n_pages)   # [n, Hkv]
        keep = np.arange(n_pages)[None, None, :] >= first[..., None]                  # [n, Hkv, pages]
        old_ids = self.table_host[rows][:, :, :n_pages][keep]
        table_host = np.zeros((len(rows), self.table_host.shape[1], max(n_pages, self.table_host.shape[2])),
                              dtype=np.int32)
        table_host[:, :, :n_pages][keep] = np.arange(old_ids.size, dtype=np.int32)
        src = torch.from_numpy(old_ids.astype(np.int64)).to(self.k_pages.device)
        self.k_pages, self.v_pages, self.c_pages = self.k_pages[src], self.v_pages[src], self.c_pages[src]
        self.table_host = table_host
        self.table = torch.from_numpy(table_host).to(self.table.device)
        self.released = first.astype(np.int64)
        self.mapped = n_pages
        self.free = []
        return start

    def memory_bytes(self) -> int:
        """Allocated bytes: the three pools and the page table."""
        return sum(t.numel() * t.element_size() for t in (self.k_pages, self.v_pages, self.c_pages, self.table))
