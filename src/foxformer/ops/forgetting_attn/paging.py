"""Cache layouts shared by the decode ops and the caches (no Triton import: the caches must work on CPU-only
installs without it): the paged key/value layout, and the torch references of the two cache kernels (one
token's write, dense or paged; the dead-key scan of a paged cache)."""
from __future__ import annotations

import torch

from .cumsum import gate_step


def append_token_torch(k_buf, v_buf, c_buf, c_last, at, k, v, log_f, k_shift=None, v_shift=None,
                       page_table=None) -> None:
    """The reference of append.append_token_ (same arguments): the same writes as separate torch ops."""
    c = gate_step(log_f, c_last)                                                    # [B, 1, Hq]
    if page_table is None:
        k_buf.index_copy_(1, at, k.to(k_buf.dtype))
        v_buf.index_copy_(1, at, v.to(v_buf.dtype))
        c_buf.index_copy_(2, at, c.transpose(1, 2))
    else:
        B, _, Hkv, D = k.shape
        page = page_table.index_select(2, at // k_buf.shape[1]).long().flatten()   # [B * Hkv]
        row = (at % k_buf.shape[1]).expand(page.shape[0])
        k_buf.index_put_((page, row), k.reshape(B * Hkv, D).to(k_buf.dtype))
        v_buf.index_put_((page, row), v.reshape(B * Hkv, D).to(v_buf.dtype))
        c_buf.index_put_((page, row), c.reshape(B * Hkv, c_buf.shape[2]))
    c_last.copy_(c[:, -1])
    for pair in (k_shift, v_shift):
        if pair is not None:
            pair[0].copy_(pair[1])


def page_c(c_pages: torch.Tensor, table: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """c at positions pos int64 [B, H, W] of each query head -> float64 [B, H, W], from a page pool [P, PAGE, G]
    and its table [B, Hkv, pages] (positions whose pages are mapped only)."""
    B, H, _ = pos.shape
    page, G = c_pages.shape[1], c_pages.shape[2]
    heads = torch.arange(H, device=pos.device)
    b = torch.arange(B, device=pos.device)[:, None, None]
    pages = table[b, (heads // G)[None, :, None], pos // page].long()
    return c_pages[pages, pos % page, (heads % G)[None, :, None]]


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


def evict_scan_torch(start, c_pages, table, c_last, delta, window, last) -> None:
    """The reference of evict_scan.evict_scan_ (same arguments): the window's dead keys as separate torch ops."""
    B, Hkv = start.shape
    G = c_pages.shape[2]
    threshold = c_last[:, :, None] - delta                                          # [B, H, 1]
    first = start.repeat_interleave(G, dim=1)                                       # [B, H]
    idx = torch.clamp(first[:, :, None] + torch.arange(window, device=first.device), max=last)
    dead = first + (page_c(c_pages, table, idx) >= threshold).sum(-1)
    start.copy_(torch.maximum(start, dead.view(B, Hkv, G).amin(-1)))
