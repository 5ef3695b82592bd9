"""Input validation of the decode op (forgetting_attention_decode, and the portable op of a standalone export): the
one place its arguments are checked, whichever path then runs."""
from __future__ import annotations

from typing import Optional

import torch

from .checks import (NonFiniteValueError, _first_bad, check_c_dtype, check_layout, check_one_device, per_kv_head_hint,
                     values_checked)

# flash_attn_with_kvcache takes a length per row (cache_seqlens [B]); here every row holds as many positions
_ONE_LENGTH = ("seq_len is the one length of every row (the queries are the last Tq of its positions); for rows of "
               "different lengths, end every row's keys at the same position (left padding) and pass start[b] = row "
               "b's padding, so that no query reads a pad")


def check_decode(q, k, v, c, start, page_table, seq_len) -> int:
    """forgetting_attention_decode's arguments (the portable op's alike): ValueError / TypeError naming the argument;
    returns the storage's key capacity (dense Tk, or the page table's pages times the page size), which sizes the key
    splits."""
    for name, t in (("q", q), ("k", k), ("v", v), ("c", c)) + ((("page_table", page_table),) if page_table is not None
                                                                else ()):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a tensor, got {type(t).__name__}")
    if q.dim() != 4:
        raise ValueError(f"q must be a 4-D tensor [B, Tq, Hq, D], got {tuple(q.shape)}")
    B, Tq, Hq, D = q.shape
    if page_table is None:
        for name, t in (("k", k), ("v", v)):
            if t.dim() != 4:
                raise ValueError(f"{name} must be a 4-D tensor [B, Tk, Hkv, D] (or, with page_table, a page pool "
                                 f"[P, PAGE, D]), got shape {tuple(t.shape)}")
        if v.shape == k.shape and c.dim() == 3:
            check_layout(q, k, c, "c")
        Tk, Hkv = k.shape[1], k.shape[2]
        if k.shape != (B, Tk, Hkv, D) or v.shape != k.shape:
            raise ValueError(f"k and v must be [B, Tk, Hkv, D] = [{B}, Tk, Hkv, {D}], got {tuple(k.shape)}, "
                             f"{tuple(v.shape)}")
        capacity = Tk
    else:
        if page_table.dim() != 3 or page_table.shape[0] != B or page_table.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"page_table must be an int32/int64 tensor [B, Hkv, pages] with B = {B}, got "
                             f"{page_table.dtype} {tuple(page_table.shape)}")
        Hkv = page_table.shape[1]
        if k.dim() != 3 or k.shape[2] != D or v.shape != k.shape:
            raise ValueError(f"with a page_table, k and v must be page pools [P, PAGE, D] with D = {D}, got "
                             f"{tuple(k.shape)}, {tuple(v.shape)}")
        capacity = page_table.shape[2] * k.shape[1]
    # with a page_table its rows are the kv heads: a table with one row per query head gave G = 1
    whose = "" if page_table is None else "; Hkv is page_table's dim 1, one row of pages per kv head"
    if Hkv == 0 or Hq % Hkv:
        raise ValueError(f"q heads ({Hq}) must be a multiple of k/v heads ({Hkv}){whose}")
    # The Triton kernel multiplies q by k and p by v as loaded: mixed dtypes failed inside Triton.
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k and v must share one dtype, got q {q.dtype}, k {k.dtype}, v {v.dtype}; cast them "
                        f"with .to(q.dtype)")
    if not q.is_floating_point():  # the torch path would return a truncated integer result
        raise TypeError(f"q, k and v must be floating tensors, got {q.dtype}")
    want = (B, capacity, Hq) if page_table is None else (*k.shape[:2], Hq // Hkv)
    if tuple(c.shape) != want:
        what = "[B, Tk, Hq]" if page_table is None else f"a page pool [P, PAGE, G] (G = Hq // Hkv = {Hq} // {Hkv})"
        hint = per_kv_head_hint(c, "c", B, capacity, Hq, Hkv) if page_table is None else ""
        raise ValueError(f"c must be {what} = {want}, got {tuple(c.shape)}{whose}{hint}")
    check_c_dtype(c)
    if start is not None and (not isinstance(start, torch.Tensor) or start.shape != (B, Hkv)):
        raise ValueError(f"start must be an integer tensor [B, Hkv] = {(B, Hkv)}, got {getattr(start, 'shape', start)}")
    # A float start was truncated by the Triton kernel but rounded up by the torch path's j >= start.
    if start is not None and (start.is_floating_point() or start.is_complex() or start.dtype == torch.bool):
        raise TypeError(f"start must be an integer tensor, got {start.dtype}")
    check_one_device(q=q, k=k, v=v, c=c, start=start, page_table=page_table, seq_len=seq_len)
    _check_seq_len_type(seq_len, B)
    if page_table is not None and seq_len is None:
        raise ValueError("seq_len: a paged cache needs the number of positions it holds")
    # Values: read as the other ops read theirs (checks.values_checked: the CPU, or CUDA with FOXFORMER_CHECK_VALUES=1);
    # unchecked, a seq_len past the storage reads garbage, and a start past a query's position or a non-finite c at a
    # live key gives NaN.
    if not values_checked(q):
        return capacity
    n = capacity if seq_len is None else int(seq_len)
    if not Tq <= n <= capacity:
        raise ValueError(f"seq_len {n} must be >= Tq ({Tq}) and fit the cache's storage ({capacity} positions)")
    # A start past a query's own position leaves its row no key: softmax of nothing, NaN on both paths.
    if start is not None and Tq and start.numel() and int(start.max()) > n - Tq:
        raise ValueError(f"start: {int(start.max())} is past the first query's position Tk - Tq = {n - Tq}, "
                         f"which would then attend to no key; every start must be <= Tk - Tq")
    if page_table is not None:
        _check_pages(page_table, k.shape[0], k.shape[1], start, n)
    _check_live_c(c, page_table, k.shape[1] if page_table is not None else 1, start, n, B, Hkv)
    return capacity


def _check_seq_len_type(seq_len, B: int) -> None:
    if isinstance(seq_len, torch.Tensor):
        if seq_len.numel() != 1 or seq_len.is_floating_point() or seq_len.dtype == torch.bool:
            one = f"; {_ONE_LENGTH}" if seq_len.numel() == B > 1 else ""
            raise ValueError(f"seq_len must be an int or a one-element integer tensor, got {seq_len.dtype} "
                             f"{tuple(seq_len.shape)}{one}")
    elif isinstance(seq_len, (list, tuple)):
        raise TypeError(f"seq_len must be None, an int or a one-element integer tensor, got a {type(seq_len).__name__}"
                        f" of {len(seq_len)}; {_ONE_LENGTH}")
    elif seq_len is not None and (isinstance(seq_len, bool) or not isinstance(seq_len, int)):
        kind = type(seq_len)
        name = kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
        # a NumPy integer (a length read from an array) is an int to everything but isinstance
        fix = "; pass int(seq_len)" if hasattr(seq_len, "__index__") and not isinstance(seq_len, bool) else ""
        raise TypeError(f"seq_len must be None, an int or a one-element integer tensor, got {name}{fix}")


def _check_pages(page_table: torch.Tensor, pool_pages: int, page: int, start: Optional[torch.Tensor], n: int) -> None:
    """Every page the call reads (those holding a live key of positions [start, n)) must be in [0, P): a negative
    entry would wrap around to another page (Python indexing), silently."""
    first = (start.clamp(min=0) if start is not None else page_table.new_zeros(page_table.shape[:2])) // page
    cols = torch.arange(page_table.shape[2], device=page_table.device)
    read = (cols >= first[..., None]) & (cols < -(-n // page))
    bad = read & ((page_table < 0) | (page_table >= pool_pages))
    if bool(bad.any()):
        b, h, j = (int(i) for i in bad.nonzero()[0])
        raise ValueError(f"page_table[{b}, {h}, {j}] = {int(page_table[b, h, j])} is not a page of the pool "
                         f"(pages 0 to {pool_pages - 1}); every page a live key sits on must be mapped")


def _check_live_c(c: torch.Tensor, page_table: Optional[torch.Tensor], page: int, start: Optional[torch.Tensor],
                  n: int, B: int, Hkv: int) -> None:
    """c must be finite at every live key of positions [start, n) (an evicted key's may be anything): one NaN or
    infinity there is NaN in the output (c_i - c_j), on every path. Checked here for all of them: the torch path alone
    refused it, the Triton kernel and the portable op returned the NaN."""
    pos = torch.arange(n, device=c.device)
    first = start.clamp(min=0) if start is not None else torch.zeros(B, Hkv, dtype=torch.int64, device=c.device)
    live = pos >= first[..., None]                                                     # [B, Hkv, n]
    if not bool(live.any()):  # no key read (n = 0, or B = 0): nothing to index an empty pool with
        return
    if page_table is None:
        held = c[:, :n].unflatten(2, (Hkv, -1)).transpose(1, 2)                       # [B, Hkv, n, G]
    else:
        # a dead key's page may be anything (released, or past the pool): read page 0 there instead
        pages = page_table[:, :, pos // page].long().masked_fill(~live, 0)
        held = c[pages, pos % page]                                                    # [B, Hkv, n, G]
    bad = ~torch.isfinite(held) & live[..., None]
    if bool(bad.any()):
        value = float(held[bad][0])
        raise NonFiniteValueError("c must be finite at every live key", f"(gate_cumsum floors -inf gates), got "
                                  f"{value} ({_first_bad(bad.transpose(1, 2).flatten(2))})")
