"""Paged key/value layout shared by the paged decode op and the evicting cache (no Triton import: the
cache must work on CPU-only installs without it)."""
from __future__ import annotations

import torch


def gather_pages(pool: torch.Tensor, table: torch.Tensor, length: int) -> torch.Tensor:
    """Dense [B, length, Hkv, X] from a page pool [P, PAGE, X] and a page table int [B, Hkv, NP]
    (NP * PAGE >= length): row j of (b, h) is pool[table[b, h, j // PAGE], j % PAGE]."""
    B, Hkv = table.shape[:2]
    page = pool.shape[1]
    n = -(-length // page)
    dense = pool[table[:, :, :n].long()]                                  # [B, Hkv, n, PAGE, X]
    return dense.reshape(B, Hkv, n * page, pool.shape[2])[:, :, :length].transpose(1, 2)


def gather_live(k_pages: torch.Tensor, v_pages: torch.Tensor, c_pages: torch.Tensor, table: torch.Tensor,
                first: int, length: int, start: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Dense copies of positions [first, length) of a paged cache: k, v [B, L, Hkv, D] with each head's dead
    rows (before its start [B, Hkv]) zeroed, c float64 [B, L, Hkv * G] (dead rows as stored), and the dead
    mask [B, L, Hkv]. Table entries of pages wholly before a head's start are read as page 0: released pages
    may be anything (another head's, or past a rebuilt pool's end)."""
    page = k_pages.shape[1]
    B, Hkv = table.shape[:2]
    live = start.clamp(min=0)
    cols = torch.arange(first // page, table.shape[2], device=table.device)
    sub = table[:, :, first // page:].masked_fill(cols < (live // page)[:, :, None], 0)
    shift, n = first % page, length - first
    k = gather_pages(k_pages, sub, shift + n)[:, shift:]
    v = gather_pages(v_pages, sub, shift + n)[:, shift:]
    c = gather_pages(c_pages, sub, shift + n)[:, shift:].reshape(B, n, Hkv * c_pages.shape[2])
    # In place: the gathers are already copies.
    dead = torch.arange(first, length, device=table.device)[None, :, None] < start[:, None, :]
    k.masked_fill_(dead[..., None], 0)
    v.masked_fill_(dead[..., None], 0)
    return k, v, c, dead
