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
