"""Decoding cache for FoX: keys, values, the running gate cumsum c and the kv-shift states per layer
(gated linear attention layers: the recurrent state and the kv-shift states).

c is extended with ``gate_cumsum(new_log_f, initial=last_c)``: a decode step costs O(1) in the
cache length for the gate, and c is never recomputed over the whole cache.

Storage is preallocated and grows by doubling, so a decode step writes one row instead of
concatenating the whole cache. With eviction (see ``foxformer.infer.eviction``) each (batch, kv head)
keeps a start index: c never increases, so the keys that can be dropped are always the oldest and
the live keys of a head are the suffix ``[start, length)`` (ragged across heads). An evicting layer
keeps its keys in pages (``paged_cache.PagedKV``), one list per (batch, kv head), so each head's dead
pages are freed on their own; a non-evicting layer keeps one dense buffer.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch

from .paged_cache import PagedKV

_MIN_CAPACITY = 16
# Decode steps scan for dead keys every 8th step: on the H200 eviction added 2.4 ms to a 13.9 ms
# decode step of the 125M model at 64K (bench decode, 2026-11-29), almost all of it kernel launches.
EVICT_EVERY = 8


def _capacity_for(n: int) -> int:
    cap = _MIN_CAPACITY
    while cap < n:
        cap *= 2
    return cap


class LayerCache:
    """One layer's state.

    Views: k, v [B, T, Hkv, D]; c float64 [B, T, H] (T = positions seen, evicted ones included).
    Storage: k_buf, v_buf [B, capacity, Hkv, D]; c_buf float64 [B, H, capacity] (heads first: the decode
    kernel reads it along the keys).
    start: int64 [B, Hkv], first live entry of each (batch, kv head); entries before it are evicted.
    k_last, v_last [B, Hkv, D]: raw candidates of the last token (kv shift).
    delta: eviction threshold (log-space, < 0) or None for no eviction in this layer.
    state [B, H, Dk, Dv]: a gated linear attention layer's recurrent state (fp32), held instead of k, v, c.
    paged: an evicting layer's storage (PagedKV) instead of the dense buffers; c_last [B, H] float64 its
    newest c. Its k, v, c views are then copies, with dead keys masked (see PagedKV.dense).
    """

    def __init__(self, delta: Optional[float] = None) -> None:
        self.k_buf: Optional[torch.Tensor] = None
        self.v_buf: Optional[torch.Tensor] = None
        self.c_buf: Optional[torch.Tensor] = None
        self.start: Optional[torch.Tensor] = None
        self.length = 0
        self.k_last: Optional[torch.Tensor] = None
        self.v_last: Optional[torch.Tensor] = None
        self.delta = delta
        self.capacity_hint = 0  # expected total length (FoxCache.reserve): avoids a last doubling
        self.steps_since_evict = 0
        self.state: Optional[torch.Tensor] = None
        self.paged: Optional[PagedKV] = None
        self.c_last: Optional[torch.Tensor] = None

    # -- views -------------------------------------------------------------------------------
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
        """k, v [B, L, Hkv, D] and c [B, L, H] of positions [first, length): views of the dense buffers, or
        masked copies of an evicting layer's pages; (None, None, None) for an empty cache."""
        if self.paged is not None:
            return self.paged.dense(first, self.start)
        if self.k_buf is None:
            return None, None, None
        return (self.k_buf[:, first:self.length], self.v_buf[:, first:self.length],
                self.c_buf[:, :, first:self.length].transpose(1, 2))

    @property
    def filled(self) -> bool:
        return self.k_buf is not None or self.paged is not None

    @property
    def capacity(self) -> int:
        """Positions the storage holds: buffer rows, or pool pages x page size (all heads together)."""
        if self.paged is not None:
            return self.paged.k_pages.shape[0] * self.paged.page
        return 0 if self.k_buf is None else self.k_buf.shape[1]

    def last_c(self) -> Optional[torch.Tensor]:
        """c of the newest cached token [B, H], or None for an empty cache."""
        if self.paged is not None:
            return self.c_last
        return None if self.c_buf is None or self.length == 0 else self.c_buf[:, :, self.length - 1]

    def live_lengths(self) -> Optional[torch.Tensor]:
        """int64 [B, Hkv]: keys still held per (batch, kv head)."""
        return None if self.start is None else self.length - self.start

    # -- storage -----------------------------------------------------------------------------
    def _allocate(self, k: torch.Tensor, c: torch.Tensor, capacity: int) -> None:
        B, _, Hkv, D = k.shape
        self.k_buf = k.new_empty(B, capacity, Hkv, D)
        self.v_buf = k.new_empty(B, capacity, Hkv, D)
        self.c_buf = c.new_empty(B, c.shape[2], capacity, dtype=torch.float64)
        self.start = torch.zeros(B, Hkv, dtype=torch.int64, device=k.device)

    def _reserve(self, extra: int) -> None:
        """Room for ``extra`` more entries: regrow by doubling (never beyond the announced total length)."""
        need = self.length + extra
        if need <= self.capacity:
            return
        capacity = _capacity_for(max(need, 2 * self.length))
        if self.capacity_hint >= need:
            capacity = min(capacity, self.capacity_hint)
        k_buf, v_buf, c_buf = self.k_buf, self.v_buf, self.c_buf
        self.k_buf = k_buf.new_empty(k_buf.shape[0], capacity, *k_buf.shape[2:])
        self.v_buf = v_buf.new_empty(v_buf.shape[0], capacity, *v_buf.shape[2:])
        self.c_buf = c_buf.new_empty(c_buf.shape[0], c_buf.shape[1], capacity)
        self.k_buf[:, :self.length] = k_buf[:, :self.length]
        self.v_buf[:, :self.length] = v_buf[:, :self.length]
        self.c_buf[:, :, :self.length] = c_buf[:, :, :self.length]

    def append(self, k: torch.Tensor, v: torch.Tensor, c: torch.Tensor) -> None:
        """Add a chunk: k, v [B, T, Hkv, D]; c float64 [B, T, H]."""
        T = k.shape[1]
        if self.delta is not None:
            if self.paged is None:
                self.paged = PagedKV(k, c, max_len=self.capacity_hint)
                self.start = torch.zeros(k.shape[0], k.shape[2], dtype=torch.int64, device=k.device)
            self.paged.append(k, v, c, self.start)
            self.length = self.paged.length
            self.c_last = c[:, -1].to(torch.float64)
            return
        if self.k_buf is None:
            self._allocate(k, c, max(_capacity_for(T), self.capacity_hint))  # a known total length at once
        else:
            self._reserve(T)
        end = self.length + T
        self.k_buf[:, self.length:end] = k
        self.v_buf[:, self.length:end] = v
        self.c_buf[:, :, self.length:end] = c.transpose(1, 2)
        self.length = end

    # -- eviction ----------------------------------------------------------------------------
    @property
    def evicting(self) -> bool:
        """Whether this layer evicts at all (then ``start`` must be honoured by attention)."""
        return self.delta is not None

    def min_start(self) -> int:
        """Smallest start over (batch, kv head): the prefix every head has dropped (a device sync)."""
        return 0 if self.start is None or not self.evicting else int(self.start.min())

    def evict(self, window: Optional[int] = None) -> None:
        """Advance ``start`` past every key that no later query can weigh above the bound.

        A key j is dead for query head h once c_now - c_j <= delta (c only decreases afterwards);
        a kv entry is dropped only when every query head of its GQA group allows it.
        window: examine only the ``window`` oldest live keys of each head (a decode step then reads
        O(window) values of c instead of the whole cache; keys left over are caught in later steps,
        and keeping a key longer is always safe), and only on every EVICT_EVERY-th such call.
        None scans everything, now. No host sync either way.
        """
        if self.delta is None or self.length == 0:
            return
        if window is not None:
            # Windowed (decode-step) scans run every EVICT_EVERY calls: keeping keys a few steps longer is
            # always safe, and each scan is ~10 small kernels per layer.
            self.steps_since_evict += 1
            if self.steps_since_evict < EVICT_EVERY:
                return
            self.steps_since_evict = 0
        B, Hkv = self.start.shape
        H = self.c_last.shape[1]
        threshold = self.c_last[:, :, None] - self.delta                            # [B, H, 1]
        first = self.start.repeat_interleave(H // Hkv, dim=1)                       # [B, H]
        if window is None or window >= self.length:
            # Every position, those before a head's start read at its start: freed pages hold other
            # heads' keys now. c is non-increasing, so the dead keys are a prefix and counting them
            # gives the new start (a start never moves back: see the maximum below).
            idx = torch.maximum(torch.arange(self.length, device=first.device)[None, None, :], first[:, :, None])
            dead = (self.paged.c_at(idx) >= threshold).sum(-1)
        else:
            idx = (first[:, :, None] + torch.arange(window, device=first.device)).clamp(max=self.length - 1)
            dead = first + (self.paged.c_at(idx) >= threshold).sum(-1)
        dead = dead.view(B, Hkv, -1).amin(-1)
        self.start = torch.maximum(self.start, dead)

    def select(self, index: torch.Tensor) -> None:
        if self.paged is not None:
            self.start = self.paged.select(index, self.start)
            self.c_last = self.c_last.index_select(0, index.to(self.c_last.device))
        names = ("k_buf", "v_buf", "c_buf", "k_last", "v_last", "state") + (("start",) if self.paged is None else ())
        for name in names:
            t = getattr(self, name)
            if t is not None:
                setattr(self, name, t.index_select(0, index.to(t.device)))

    def memory_bytes(self) -> dict:
        """Allocated bytes of k, v and c; the bytes the live entries need, those not yet compacted
        (held) and those every key seen would need without eviction; live and seen key counts
        (per (batch, kv head) entry). An evicting layer costs one device sync (the live lengths)."""
        if self.state is not None:  # a recurrent state: fixed size, no keys
            n = self.state.numel() * self.state.element_size()
            return {"allocated": n, "live": n, "held": n, "no_eviction": n, "live_keys": 0, "total_keys": 0}
        if self.k_buf is None and self.paged is None:
            return {"allocated": 0, "live": 0, "held": 0, "no_eviction": 0, "live_keys": 0, "total_keys": 0}
        total_keys = self.length * self.start.numel()
        if self.paged is not None:
            p = self.paged
            group, d, k_size = p.group, p.k_pages.shape[2], p.k_pages.element_size()
            allocated, held_keys = p.memory_bytes(), p.pages_in_use * p.page
            live_keys = int(self.live_lengths().sum())
        else:  # a dense layer never evicts: every key it holds is live (and no device sync to count them)
            group, d = self.c_buf.shape[1] // self.k_buf.shape[2], self.k_buf.shape[-1]
            k_size = self.k_buf.element_size()
            allocated = (self.k_buf.numel() + self.v_buf.numel()) * k_size + self.c_buf.numel() * 8
            held_keys = live_keys = total_keys
        # k and v of one kv head, plus the float64 c of its query heads
        per_entry = 2 * d * k_size + group * 8
        return {"allocated": allocated, "live": live_keys * per_entry, "held": held_keys * per_entry,
                "no_eviction": total_keys * per_entry, "live_keys": live_keys, "total_keys": total_keys}


class FoxCache:
    """Per-layer caches plus the number of tokens seen. Pass it back as ``past_key_values`` (or
    ``cache``) to continue: prefill in chunks, decode token by token.

    ``evict_deltas``: one eviction threshold per layer (None entries: that layer keeps every key);
    build them with ``foxformer.infer.eviction.eviction_deltas``. ``max_len``: the N those thresholds were
    derived for, when it was given explicitly (evict_max_len): the model refuses to grow the cache past it,
    where the eviction bound would no longer hold (None: no limit).

    Not a ``transformers.Cache`` subclass on purpose: its API differs between transformers 5.17
    and 5.24, and generate only needs ``get_seq_length`` and the model's own
    ``prepare_inputs_for_generation``.
    """

    is_compileable = False
    is_croppable = False

    def __init__(self, num_layers: int, evict_deltas: Optional[Sequence[Optional[float]]] = None,
                 max_len: Optional[int] = None) -> None:
        if evict_deltas is not None and len(evict_deltas) != num_layers:
            raise ValueError(f"evict_deltas: expected {num_layers} entries (one per layer), got {len(evict_deltas)}")
        deltas = list(evict_deltas) if evict_deltas is not None else [None] * num_layers
        self.layers = [LayerCache(d) for d in deltas]
        self.seq_len = 0
        self.max_len = None if max_len is None else int(max_len)
        if self.max_len is not None:  # the longest sequence: an evicting layer's pool stops growing there
            for layer in self.layers:
                if layer.delta is not None:
                    layer.capacity_hint = self.max_len

    def __len__(self) -> int:
        return len(self.layers)

    def __getitem__(self, idx: int) -> LayerCache:
        return self.layers[idx]

    @property
    def is_linear(self) -> list[bool]:
        return [False] * len(self.layers)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.seq_len

    def check_fits(self, num_layers: int, batch: int, num_kv_heads: int, head_dim: int,
                   recurrent: bool = False) -> None:
        """ValueError unless this cache can continue a forward of ``batch`` rows through a model of these
        shapes (a cache reused from another model or batch would fail deep inside a layer, or, across
        attention kinds, be ignored). ``recurrent``: the model's layers keep a state, not keys."""
        hint = "; a cache only continues the model and the batch that filled it"
        if len(self.layers) != num_layers:
            raise ValueError(f"past_key_values: the FoxCache has {len(self.layers)} layer(s), the model "
                             f"{num_layers}{hint}")
        filled = next((layer for layer in self.layers if layer.filled or layer.state is not None), None)
        if filled is None:
            return
        if (filled.state is not None) != recurrent:
            held, wanted = ("a recurrent state", "keys") if filled.state is not None else ("keys", "a recurrent state")
            raise ValueError(f"past_key_values: the FoxCache holds {held}, the model's layers need {wanted}{hint}")
        if filled.paged is not None:
            B, Hkv, D = filled.paged.shape
        elif filled.state is None:
            B, _, Hkv, D = filled.k_buf.shape
        else:
            # The state is [B, H, Dk, Dv] whatever the GQA grouping; the kv-shift states carry the kv heads.
            B, D = filled.state.shape[0], filled.state.shape[2]
            Hkv = num_kv_heads if filled.k_last is None else filled.k_last.shape[1]
        if B != batch:
            raise ValueError(f"past_key_values: the FoxCache holds batch size {B}, the input has batch size "
                             f"{batch}{hint}")
        if (Hkv, D) != (num_kv_heads, head_dim):
            raise ValueError(f"past_key_values: the FoxCache holds {Hkv} kv heads of size {D}, the model has "
                             f"{num_kv_heads} kv heads of size {head_dim}{hint}")

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        """Keep rows ``beam_idx`` (beam search, batch selection)."""
        for layer in self.layers:
            layer.select(beam_idx)

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self.reorder_cache(indices)

    def reserve(self, total_len: int) -> None:
        """Hint the total sequence length (prompt + new tokens) before the first forward: non-evicting
        layers then allocate it at once instead of doubling past it."""
        for layer in self.layers:
            layer.capacity_hint = int(total_len)

    def memory_bytes(self) -> dict:
        """LayerCache.memory_bytes summed over layers."""
        total: dict = {}
        for layer in self.layers:
            for key, value in layer.memory_bytes().items():
                total[key] = total.get(key, 0) + value
        return total
