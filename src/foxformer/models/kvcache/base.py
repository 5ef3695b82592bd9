"""The decoding state of one layer, as the attention layer sees it.

A layer hands its state the chunk's projections and gets the attention output back (``attend``); it never
touches storage. Implementations: ``DenseKV`` (keys in one preallocated buffer), ``PagedKV`` (an evicting
layer's keys in per-head pages), ``RecurrentState`` (gated linear attention's fixed-size state).

Two ways to run a step:

* eager (``at=None``): any chunk; the host knows the length, storage grows as needed;
* static (``at``: int64 [2] on the device, the new token's position and the positions held after it): one
  token, no host sync, no allocation that outlives the step and every write in place, so that a CUDA graph
  can replay it (``graphs.py``). The host makes room for the token first (``prepare_step``) and counts it
  afterwards (``advance``).

Each state also reorders its batch rows (``select``: beam search), reports its memory (``memory``) and
lists its storage (``storage``: a captured graph holds their addresses, so a reallocation means a new capture).
It also holds the layer's input projections fused for one-token steps (``fused_inputs``: a concatenated copy of
their weights, made by the first decode step and dropped with the cache; not counted by ``memory``).
"""
from __future__ import annotations

from typing import Optional

import torch

from foxformer.ops import forgetting_attention_cumsum, gate_cumsum, resolve_backend
from foxformer.ops.forgetting_attn.cumsum import gate_step
from foxformer.ops.forgetting_attn.append import append_token_

from ..fused_linear import FusedLinears
from .policy import EVICT_WINDOW

# Chunks of at most this many new tokens on top of a cache take the decode kernel (split along keys).
DECODE_MAX_QUERIES = 16


def decode_backend(backend: str, q: torch.Tensor) -> str:
    """The model's attention backend mapped onto the decode op's ("triton" only for CUDA half types under
    "auto", as for prefill)."""
    if backend == "auto":
        return "triton" if q.is_cuda and q.dtype in (torch.float16, torch.bfloat16) else "torch"
    if backend == "gluon" and not q.is_cuda:
        # Refused as the prefill refuses it, naming the backend the user chose: mapped onto triton below, a short
        # prompt on a CPU was refused for triton instead. (A standalone copy's ops run anywhere: they pass it.)
        resolve_backend(backend, q)
    # The decode op has no Gluon kernel: a model on the Gluon backend decodes with the Triton one.
    return "triton" if backend in ("triton", "gluon") and q.dtype != torch.float64 else "torch"


def _store(old: Optional[torch.Tensor], new: torch.Tensor) -> torch.Tensor:
    """``new``'s values in ``old``'s storage when the shapes allow (a captured graph keeps reading the same
    address), else a copy of ``new`` (never a view: it would pin the chunk's whole projection)."""
    if old is not None and old.shape == new.shape and old.dtype == new.dtype and old.device == new.device:
        return old.copy_(new)
    return new.clone()


class LayerState:
    """Protocol and shared part: the kv-shift state (raw k / v candidates of the last token, [B, Hkv, D])."""

    kind = "keys"  # or "state": what check_fits compares with the model's attention

    def __init__(self) -> None:
        self.k_last: Optional[torch.Tensor] = None
        self.v_last: Optional[torch.Tensor] = None
        self.fused_inputs = FusedLinears()

    # -- kv shift ------------------------------------------------------------------------------
    def shift_state(self) -> tuple[Optional[torch.Tensor], Optional[torch.Tensor]]:
        return self.k_last, self.v_last

    def set_shift_state(self, k_last: Optional[torch.Tensor], v_last: Optional[torch.Tensor]) -> None:
        """Keep the chunk's last raw k / v candidates (None: that shift is off)."""
        if k_last is not None:
            self.k_last = _store(self.k_last, k_last)
        if v_last is not None:
            self.v_last = _store(self.v_last, v_last)

    # -- protocol ------------------------------------------------------------------------------
    @property
    def filled(self) -> bool:
        raise NotImplementedError

    def shape(self, num_kv_heads: int) -> Optional[tuple[int, int, int]]:
        """(batch, kv heads, head dim) of what is held, or None while empty."""
        raise NotImplementedError

    def attend(self, q, k, v, log_f, *, backend: str, pruning, at: Optional[torch.Tensor] = None,
               scan: bool = True, shift: tuple = (None, None)) -> torch.Tensor:
        """Append the chunk (k, v [B, T, Hkv, D]; log f fp32 [B, T, H]) and return q's attention [B, T, H, D]
        over everything held. ``pruning``: a callable giving the prefill op's pruning arguments (only long
        chunks call it). ``at``: static step (see the module docstring). ``scan``: whether a one-token step
        looks for newly dead keys (longer chunks always do). ``shift``: the chunk's last raw k / v candidates
        [B, Hkv, D] (None where that shift is off), kept for the next chunk's token shift."""
        raise NotImplementedError

    def select(self, index: torch.Tensor) -> None:
        """Keep batch rows ``index`` (repeats allowed: beam search); in place when the batch size stays."""
        for name in ("k_last", "v_last"):
            t = getattr(self, name)
            if t is not None:
                setattr(self, name, _store(t, t.index_select(0, index.to(t.device))))

    def memory(self) -> dict:
        """Bytes allocated, live (what the live entries need), held (not yet handed back), no_eviction
        (every key seen), and live / total key counts per (batch, kv head) entry."""
        raise NotImplementedError

    def prepare_step(self) -> None:
        """Room for one more token before a static step (eager; may reallocate storage)."""

    def advance(self, n: int) -> None:
        """Count ``n`` tokens written by static steps (the host's mirror of the device length)."""

    def storage(self) -> list:
        """Every tensor a static step reads or writes in place (None entries allowed)."""
        return [self.k_last, self.v_last]


class KeyCache(LayerState):
    """Shared part of the key caches: c (the running gate cumsum, float64) and the attend logic.

    length: positions seen (evicted ones included). c_last [B, H]: c of the newest position.
    capacity_hint: the longest sequence announced (FoxCache.reserve): storage is sized for it at once.
    """

    def __init__(self, capacity_hint: int = 0) -> None:
        super().__init__()
        self.length = 0
        self.c_last: Optional[torch.Tensor] = None
        self.capacity_hint = int(capacity_hint)
        self.delta: Optional[float] = None

    @property
    def filled(self) -> bool:
        return self.c_last is not None

    def last_c(self) -> Optional[torch.Tensor]:
        """c of the newest cached token [B, H], or None for an empty cache."""
        return self.c_last if self.length else None

    # -- views (copies for paged storage) -------------------------------------------------------
    @property
    def k(self) -> Optional[torch.Tensor]:
        return self.keys_from(0)[0]

    @property
    def v(self) -> Optional[torch.Tensor]:
        return self.keys_from(0)[1]

    @property
    def c(self) -> Optional[torch.Tensor]:
        return self.keys_from(0)[2]

    def keys_from(self, first: int) -> tuple:
        """k, v [B, L, Hkv, D] and c [B, L, H] of positions [first, length); (None, None, None) if empty."""
        raise NotImplementedError

    # -- storage --------------------------------------------------------------------------------
    def append(self, k: torch.Tensor, v: torch.Tensor, c: torch.Tensor) -> None:
        """Write positions [length, length + T): k, v [B, T, Hkv, D]; c float64 [B, T, H]."""
        self._append(k, v, c)
        self.c_last = _store(self.c_last, c[:, -1].to(torch.float64))

    def write_token(self, at: torch.Tensor, k: torch.Tensor, v: torch.Tensor, log_f: torch.Tensor,
                    shift: tuple = (None, None)) -> None:
        """Static step: write one token at position ``at`` (device int64 [1]) in place, its c extended from
        c_last (gate_cumsum's arithmetic for one token: the same bits), and its shift state (see attend):
        one kernel on a GPU for up to nine torch ops (ops/forgetting_attn/append.py). The shift states
        are written in place where the prefill left them in this shape (it always does; else _store)."""
        pairs = [None if raw is None or state is None or state.shape != raw.shape or state.dtype != raw.dtype
                 else (state, raw) for state, raw in zip(self.shift_state(), shift)]
        k_store, v_store, c_store, table = self._token_storage()
        append_token_(k_store, v_store, c_store, self.c_last, at, k, v, log_f, *pairs, page_table=table)
        self.set_shift_state(*(raw if pair is None else None for raw, pair in zip(shift, pairs)))

    def _append(self, k: torch.Tensor, v: torch.Tensor, c: torch.Tensor) -> None:
        raise NotImplementedError

    def _token_storage(self) -> tuple:
        """(k, v, c storage, page table or None) in append_token_'s layouts, for write_token."""
        raise NotImplementedError

    def decode(self, q: torch.Tensor, backend: str, seq_len) -> torch.Tensor:
        """The decode op over the stored keys, ``seq_len`` (int or device tensor) positions held."""
        raise NotImplementedError

    def min_start(self) -> int:
        """Smallest live start over (batch, kv head): the prefix every head has dropped."""
        return 0

    def evict(self, window: Optional[int] = None, last=None) -> None:
        """Drop keys no later query can weigh above the bound (evicting caches only)."""

    # -- the step --------------------------------------------------------------------------------
    def attend(self, q, k, v, log_f, *, backend: str, pruning, at: Optional[torch.Tensor] = None,
               scan: bool = True, shift: tuple = (None, None)) -> torch.Tensor:
        T = q.shape[1]
        if at is not None:
            self.write_token(at[:1], k, v, log_f, shift)
            out = self.decode(q, decode_backend(backend, q), at[1:])
            if scan:
                self.evict(window=EVICT_WINDOW, last=at[:1])
            return out
        if T == 1 and self.length:
            c = gate_step(log_f, self.c_last)
        else:
            c = gate_cumsum(log_f, initial=self.last_c())
        self.append(k, v, c)
        self.set_shift_state(*shift)
        if T <= DECODE_MAX_QUERIES:
            # Few queries: the split-K decode op, which honours each head's eviction start.
            out = self.decode(q, decode_backend(backend, q), self.length)
        else:
            # Long chunk (prefill): the prefill op over the keys no head has evicted yet; the dead keys of
            # heads that evicted further are masked in that copy (PagePool.dense). The cumsum op has no
            # "naive" backend (it needs the gates, the cache holds only c); the torch backend is exact as well.
            k_all, v_all, c_all = self.keys_from(self.min_start())
            out = forgetting_attention_cumsum(q, k_all, v_all, c_all,
                                              backend="torch" if backend == "naive" else backend, **pruning())
        if T > 1 or scan:
            self.evict(window=EVICT_WINDOW if T == 1 else None)
        return out

    def advance(self, n: int) -> None:
        self.length += n

    def storage(self) -> list:
        return super().storage() + [self.c_last]

    def select(self, index: torch.Tensor) -> None:
        super().select(index)
        if self.c_last is not None:
            self.c_last = _store(self.c_last, self.c_last.index_select(0, index.to(self.c_last.device)))

    def _memory(self, allocated: int, live_keys: int, held_keys: int, entries: int, d: int, group: int,
                elem: int) -> dict:
        """The report from key counts: an entry is k and v of one kv head plus the float64 c of its query heads."""
        per_entry = 2 * d * elem + group * 8
        total_keys = self.length * entries
        return {"allocated": allocated, "live": live_keys * per_entry, "held": held_keys * per_entry,
                "no_eviction": total_keys * per_entry, "live_keys": live_keys, "total_keys": total_keys}
