"""FoxCache: the per-layer decoding states of a model plus the number of tokens seen.

Pass it back as ``past_key_values`` (or ``cache``) to continue: prefill in chunks, decode token by token.
Built by ``FoxModel.new_cache`` (the one constructor: generate, eval, bench and Hugging Face generate call
it). Not a ``transformers.Cache`` subclass on purpose: its API differs between transformers 5.17 and 5.24,
and generate only needs ``get_seq_length``, ``reorder_cache`` and the model's own
``prepare_inputs_for_generation``.
"""
from __future__ import annotations

import numbers
import warnings
from typing import Optional, Sequence

import torch

from foxformer.ops.forgetting_attn.checks import values_checked

from ...argtypes import setting_name
from .base import LayerState
from .policy import EVICT_EVERY, EvictionPolicy


def check_total_len(total_len) -> Optional[int]:
    """``total_len`` as new_cache and reserve take it: the tokens the cache will be fed, an integer >= 0, with None
    or -1 where that is not known (Hugging Face's max_length - 1 of a generation without max_length: None then).
    0 is a length too: a cache fed nothing.
    ValueError naming total_len otherwise: int() took '100' and 1.5 as 100 and 1, and -5 as a length."""
    if total_len is None:
        return None
    # a traced forward's input length is a SymInt, which int() took before as it does now
    if isinstance(total_len, bool) or not isinstance(total_len, (numbers.Integral, torch.SymInt)) or total_len < -1:
        raise ValueError(f"total_len: expected the number of tokens the cache will be fed, an integer >= 0 (None "
                         f"or -1 where it is not known), got {total_len!r}")
    return None if total_len == -1 else int(total_len)


class FoxCache:
    """layers: one LayerState per model layer. max_len: the N an eviction policy was derived for when it was
    given explicitly (evict_max_len): the model refuses to grow the cache past it, where the bound would
    no longer hold (None: no limit). policy: the EvictionPolicy (None: every key kept).
    decode: "auto" (one-token steps replay CUDA graphs where they can, else run eagerly), "graphs" (the
    same, saying why when they cannot), "compiled" (graphs of the torch.compile'd step), "static" (the
    graph-safe step without capture: what graphs replay, runnable on the CPU), "eager". ``decode_note``
    says why steps ran eagerly, if they did. bound_len: the N the eviction bound was derived for when the cache
    chose it (max_position_embeddings, or the length announced to ``new_cache``); past it the model warns once."""

    is_compileable = False
    is_croppable = False
    DECODE_MODES = ("auto", "graphs", "compiled", "static", "eager")
    GRAPH_MODES = ("graphs", "compiled")  # asked for by name: CUDA graphs, which "auto" only takes where they run

    @classmethod
    def check_decode(cls, decode: str, device: Optional[torch.device | str] = None, label: str = "{}") -> None:
        """ValueError for a decode mode that is none of DECODE_MODES, or, given the ``device`` the steps will run
        on, one of GRAPH_MODES off CUDA: it ran eagerly there, said only in a note after the whole generation.
        A cache itself takes them anywhere (transformers' cache_implementation="static" asks for graphs on any
        device, and falls back with a warning, as transformers compiles nothing on a CPU either). ``label``: how
        the setting is named (argtypes.setting_name)."""
        name = setting_name(label, "decode")
        if decode not in cls.DECODE_MODES:
            raise ValueError(f"{name}: expected one of {', '.join(cls.DECODE_MODES)}, got {decode!r}")
        if device is not None and decode in cls.GRAPH_MODES and torch.device(device).type != "cuda":
            raise ValueError(f"{name}: {decode!r} replays CUDA graphs, which need a CUDA device, and the model runs "
                             f"on {device}; use 'auto' (graphs where they can run, eager here), 'static' or 'eager'")

    def __init__(self, layers: Sequence[LayerState], max_len: Optional[int] = None,
                 policy: Optional[EvictionPolicy] = None, decode: str = "auto",
                 bound_len: Optional[int] = None) -> None:
        self.check_decode(decode)
        self.layers = list(layers)
        self.seq_len = 0
        self.max_len = None if max_len is None else int(max_len)
        self.bound_len = None if bound_len is None else int(bound_len)
        self.said_past_bound = False
        self.policy = policy
        self.decode = decode
        self.decode_steps = 0        # one-token steps: every EVICT_EVERY-th scans for dead keys
        self.step_at: Optional[torch.Tensor] = None      # a static step's position, on the device
        self.graphs = None           # graphs.DecodeGraphs, built on the first static step
        self.decode_note: Optional[str] = None

    def __len__(self) -> int:
        return len(self.layers)

    def __getitem__(self, idx: int) -> LayerState:
        return self.layers[idx]

    @property
    def is_linear(self) -> list[bool]:
        return [False] * len(self.layers)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.seq_len

    @property
    def batch_size(self) -> Optional[int]:
        """Rows held, None while empty."""
        layer = next((layer for layer in self.layers if layer.filled), None)
        shape = layer.shape(0) if layer is not None else None  # the rows come first whatever the kv heads
        return shape[0] if shape is not None else None

    @property
    def version(self) -> tuple:
        """The addresses and shapes of every layer's storage: a captured graph is valid while this stays."""
        return tuple((t.data_ptr(), tuple(t.shape)) if t is not None else None
                     for layer in self.layers for t in layer.storage())

    def next_scan(self, new_tokens: int) -> bool:
        """Whether this step looks for dead keys: chunks always, one-token steps every EVICT_EVERY-th (keeping
        keys a few steps longer is always safe, and each scan is ~10 small kernels per layer)."""
        if new_tokens != 1:
            return True
        self.decode_steps += 1
        return self.decode_steps % EVICT_EVERY == 0

    def check_length(self, total: int) -> None:
        """Before a forward takes the cache to ``total`` tokens: past an explicit max_len a ValueError, past the
        bound_len the cache chose a warning (once): the eps tolerance of eviction holds for N tokens only."""
        if self.max_len is not None and total > self.max_len:
            raise ValueError(f"evict_max_len: the cache evicts for sequences of at most N = {self.max_len} "
                             f"tokens, this input takes it to {total}, where its eps tolerance no longer "
                             "holds; build the cache with an evict_max_len that covers the whole sequence")
        if self.bound_len is not None and total > self.bound_len and not self.said_past_bound:
            # A cache a forward built for itself, continued past max_position_embeddings, evicted for N =
            # max_position_embeddings without a word. Not an error: FoX may go there, and the keys kept are exact.
            self.said_past_bound = True
            warnings.warn(f"eviction: the cache now holds {total} tokens, more than the N = {self.bound_len} its "
                          f"bound was derived for, so the keys it evicts may carry more than eps of a row's "
                          f"attention; announce the whole length (new_cache(total_len=...), or evict_max_len)",
                          stacklevel=3)

    def check_fits(self, num_layers: int, batch: int, num_kv_heads: int, head_dim: int,
                   recurrent: bool = False) -> None:
        """ValueError unless this cache can continue a forward of ``batch`` rows through a model of these
        shapes (a cache reused from another model or batch would fail deep inside a layer, or, across
        attention kinds, be ignored). ``recurrent``: the model's layers keep a state, not keys."""
        hint = "; a cache only continues the model and the batch that filled it"
        if len(self.layers) != num_layers:
            raise ValueError(f"past_key_values: the FoxCache has {len(self.layers)} layer(s), the model "
                             f"{num_layers}{hint}")
        layer = next((layer for layer in self.layers if layer.filled), self.layers[0] if self.layers else None)
        if layer is None:
            return
        if (layer.kind == "state") != recurrent:
            held, wanted = ("a recurrent state", "keys") if layer.kind == "state" else ("keys", "a recurrent state")
            raise ValueError(f"past_key_values: the FoxCache holds {held}, the model's layers need {wanted}{hint}")
        shape = layer.shape(num_kv_heads)
        if shape is None:
            return
        B, Hkv, D = shape
        if B != batch:
            raise ValueError(f"past_key_values: the FoxCache holds batch size {B}, the input has batch size "
                             f"{batch}{hint}")
        if (Hkv, D) != (num_kv_heads, head_dim):
            raise ValueError(f"past_key_values: the FoxCache holds {Hkv} kv heads of size {D}, the model has "
                             f"{num_kv_heads} kv heads of size {head_dim}{hint}")

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        """Keep rows ``beam_idx`` (beam search, batch selection): a 1-D tensor of int64 (or int32) row indices in
        [0, batch), repeats allowed. Their range is checked where reading them costs no device sync (the ops'
        values_checked: on the CPU, on CUDA with FOXFORMER_CHECK_VALUES=1), as this runs every beam-search step."""
        if not isinstance(beam_idx, torch.Tensor) or beam_idx.dtype not in (torch.int64, torch.int32):
            got = f"dtype {beam_idx.dtype}" if isinstance(beam_idx, torch.Tensor) else type(beam_idx).__name__
            raise TypeError(f"reorder_cache: beam_idx must be a tensor of int64 (or int32) row indices, got {got}")
        if beam_idx.dim() != 1:
            raise ValueError(f"reorder_cache: beam_idx must be 1-D (one row index per row kept), got shape "
                             f"{tuple(beam_idx.shape)}")
        rows = self.batch_size
        if rows is not None and beam_idx.numel() and values_checked(beam_idx):
            low, high = (int(x) for x in beam_idx.aminmax())
            if low < 0 or high >= rows:
                raise ValueError(f"reorder_cache: beam_idx holds {low if low < 0 else high}, and the cache holds "
                                 f"{rows} row(s): each index must be in [0, {rows})")
        for layer in self.layers:
            layer.select(beam_idx)

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self.reorder_cache(indices)

    def reserve(self, total_len: int) -> None:
        """Hint the total sequence length before the first forward: storage is then sized for it at once
        instead of doubling past it (never past max_len: the model refuses to go there). None or -1: not known,
        nothing to size."""
        total_len = check_total_len(total_len)
        if total_len is None:
            return
        total_len = total_len if self.max_len is None else min(total_len, self.max_len)
        for layer in self.layers:
            if hasattr(layer, "capacity_hint"):
                layer.capacity_hint = total_len

    # -- static steps ----------------------------------------------------------------------------
    def sync_step_at(self, device: torch.device) -> torch.Tensor:
        """int64 [2] on the device, set from the host's count: the new token's position and the positions held
        after it (what a static step writes at and attends over; base.py)."""
        if self.step_at is None or self.step_at.device != device:
            self.step_at = torch.zeros(2, dtype=torch.int64, device=device)
        self.step_at[0].fill_(self.seq_len)
        self.step_at[1].fill_(self.seq_len + 1)
        return self.step_at

    def prepare_step(self) -> None:
        for layer in self.layers:
            layer.prepare_step()

    def advance(self, n: int = 1) -> None:
        """Count ``n`` tokens written by static steps (the device length moved inside the step)."""
        for layer in self.layers:
            layer.advance(n)
        self.seq_len += n

    # -- memory ----------------------------------------------------------------------------------
    def memory_bytes(self) -> dict:
        """LayerState.memory summed over layers (an evicting layer costs one device sync)."""
        total: dict = {}
        for layer in self.layers:
            for key, value in layer.memory().items():
                total[key] = total.get(key, 0) + value
        return total

    def memory_report(self) -> dict:
        """allocated / live / no-eviction bytes, key counts, and the fraction of keys kept (None for recurrent
        states: no keys were ever cached, so none were kept or evicted); fused_weights_bytes: the layers'
        concatenated input-projection weights that one-token steps made (LayerState.fused_inputs), held beside
        the cache for its lifetime and not in allocated_bytes."""
        mem = self.memory_bytes()
        mem["fused_weights"] = sum(layer.fused_inputs.nbytes() for layer in self.layers)
        recurrent = any(layer.kind == "state" for layer in self.layers)
        kept = None if recurrent else mem["live_keys"] / mem["total_keys"] if mem.get("total_keys") else 1.0
        return {"allocated_bytes": mem.get("allocated", 0), "live_bytes": mem.get("live", 0),
                "no_eviction_bytes": mem.get("no_eviction", 0), "kept_fraction": kept,
                "live_keys": mem.get("live_keys", 0), "total_keys": mem.get("total_keys", 0),
                "fused_weights_bytes": mem["fused_weights"]}
