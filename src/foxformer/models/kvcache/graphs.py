"""CUDA graphs of one-token decode steps.

A one-token step on a FoxCache can run as the model's *static step* (``FoxModel.static_step``): the new
token's position is a device tensor, every cache write is in place, and nothing reads back to the host
(see ``base.py``). ``DecodeGraphs`` runs that step once eagerly (compiling kernels, initialising libraries),
then captures it in a ``torch.cuda.CUDAGraph`` and replays it for every later step with the same shape:
one graph launch instead of ~40 kernel launches per layer from Python, which is what a batch-1 step cost
(12.2 ms per token for the 125M FoX at 32K on the H200, 30x its memory-bandwidth floor; issue 18).

A graph holds the addresses of the cache's storage. A reallocation (a dense buffer doubling, the page pool
growing, a beam reorder that changes the batch) changes ``FoxCache.version`` and the step is captured again;
windowed eviction scans (every EVICT_EVERY-th step) are a second graph. Host-side work that graphs cannot
hold runs before each replay: mapping the next page of an evicting cache, copying the inputs in.

"compiled" also runs the step through ``torch.compile`` before capture, so that the elementwise work around
the projections is fused; the cache updates stay eager code inside it (``torch.compiler.disable``).
"""
from __future__ import annotations

import os
import warnings
from typing import Callable, Optional

import torch

from foxformer.ops.forgetting_attn.decode import READS_LENGTH_ON_DEVICE

from .base import decode_backend
from .cache import FoxCache
from .policy import EVICT_EVERY

# A cache whose storage moves every few steps (a beam search reordering an evicting cache, which rebuilds its
# page pool) would be captured anew each time, which costs more than it saves: after this many captures in a
# row, each within EVICT_EVERY steps of the last, the cache decodes eagerly.
MAX_RECAPTURES = 3


def graph_blocker(config, x: torch.Tensor, mode: str) -> Optional[str]:
    """Why a one-token step of this model cannot be captured (None: it can); ``mode`` "static" needs no
    capture, only a step that does not read back to the host."""
    if mode == "static":
        keys_on_torch = config.attention != "linear" and decode_backend(config.attention_backend, x) == "torch"
        return "the torch decode path reads the length on the host" if keys_on_torch and x.is_cuda else None
    if not x.is_cuda:
        return "CUDA graphs need a CUDA device"
    if torch.is_grad_enabled():
        return "gradients are enabled (generation runs under torch.no_grad)"
    if os.environ.get("FOXFORMER_CHECK_VALUES", "0") == "1":
        return "FOXFORMER_CHECK_VALUES=1 checks values on the host"
    if config.attention != "linear" and not READS_LENGTH_ON_DEVICE:
        return "this copy of the decode op (a standalone export's) reads the cache length on the host"
    if config.attention != "linear" and decode_backend(config.attention_backend, x) != "triton":
        return (f"attention_backend={config.attention_backend!r} with {x.dtype} decodes through the torch path, "
                "which reads the cache length on the host")
    return None


class _Captured:
    def __init__(self, graph: torch.cuda.CUDAGraph, x: torch.Tensor, positions: torch.Tensor,
                 out: torch.Tensor) -> None:
        self.graph, self.x, self.positions, self.out = graph, x, positions, out


class DecodeGraphs:
    """The captured steps of one FoxCache. ``captures`` counts captures (a test checks that decoding does not
    capture per step); ``compile``: torch.compile the step first."""

    def __init__(self, compile: bool = False) -> None:
        self.compile = compile
        self.captures = 0
        self.steps = 0
        self.last_capture = None  # self.steps at the last capture
        self.recaptures = 0       # captures in a row, each soon after the last
        self.graphs: dict = {}
        self.version = None
        self.warm: set = set()
        self.pool = None
        self.failed: Optional[str] = None  # why a capture failed: every later step runs eagerly
        self._compiled: Optional[Callable] = None

    def _step_fn(self, step: Callable) -> Callable:
        if not self.compile:
            return step
        if self._compiled is None:
            self._compiled = torch.compile(step, dynamic=False)
        return self._compiled

    def run(self, step: Callable, cache, x: torch.Tensor, positions: torch.Tensor, scan: bool,
            capture: bool) -> torch.Tensor:
        """One step: ``step(x, positions, cache, scan)`` (x [B, 1, d] the embedded token, positions int64 [B, 1])
        returns the final hidden state [B, 1, d]; replayed from a graph when ``capture``."""
        cache.prepare_step()
        cache.sync_step_at(x.device)
        self.steps += 1
        if cache.policy is None:
            scan = False  # nothing to evict: one graph serves every step
        fn = self._step_fn(step) if capture else step
        if not capture:
            out = fn(x, positions, cache, scan)
            cache.advance(1)
            return out
        if cache.version != self.version:  # storage moved: the graphs of the old addresses are of no use
            self.graphs.clear()
            # and neither is their memory pool: capturing into a pool whose graphs are all gone trips the
            # caching allocator (an internal assert in torch 2.11, which leaves the CUDA RNG mid-capture)
            self.pool = None
            self.version = cache.version
        key = (scan, tuple(x.shape), x.dtype)
        entry = self.graphs.get(key)
        if entry is None:
            if key not in self.warm:
                # The first step of this kind runs eagerly: kernels compile (and torch.compile traces) outside
                # the capture, which may launch only what it records.
                self.warm.add(key)
                out = fn(x, positions, cache, scan)
                cache.advance(1)
                return out
            try:
                entry = self._capture(fn, cache, x, positions, scan)
            except RuntimeError as e:  # the capture ran nothing: the step runs eagerly, now and from here on
                self.failed = f"capturing the step in a CUDA graph failed ({str(e).splitlines()[0][:200]})"
                note_eager(cache, self.failed, True)
                out = step(x, positions, cache, scan)
                cache.advance(1)
                return out
            self.graphs[key] = entry
        entry.x.copy_(x)
        entry.positions.copy_(positions)
        entry.graph.replay()
        cache.advance(1)
        return entry.out.clone()  # the next replay overwrites the graph's output

    def _capture(self, fn: Callable, cache, x: torch.Tensor, positions: torch.Tensor, scan: bool) -> _Captured:
        """Record the step without running it (the caller replays it): no host state may change inside."""
        self.captures += 1
        soon = self.last_capture is not None and self.steps - self.last_capture < EVICT_EVERY
        self.recaptures = self.recaptures + 1 if soon else 0
        self.last_capture = self.steps
        graph = torch.cuda.CUDAGraph()
        xs, ps = x.clone(), positions.clone()
        with torch.cuda.graph(graph, pool=self.pool):
            out = fn(xs, ps, cache, scan)
        self.pool = graph.pool()  # the variants of one cache share a pool: they never run at once
        return _Captured(graph, xs, ps, out)


def step_kind(cache, config, x: torch.Tensor) -> Optional[str]:
    """How a one-token step on ``cache`` runs: "graphs" (captured, replayed), "static" (the graph-safe step,
    eagerly) or None (the eager forward), by the cache's decode mode and what this model and input allow."""
    # Inside a user's torch.compile of the model, the step is traced like any other forward.
    if cache.decode == "eager" or torch.compiler.is_compiling():
        return None
    static = cache.decode == "static"
    reason = graph_blocker(config, x, "static" if static else "graphs")
    if reason is None and cache.graphs is not None and cache.graphs.failed is not None:
        reason = cache.graphs.failed
    if reason is None and cache.graphs is not None and cache.graphs.recaptures >= MAX_RECAPTURES:
        reason = "the cache's storage moves every few steps (beam search over an evicting cache?): each move " \
                 "needs a new capture"
    if reason is not None:
        note_eager(cache, reason, x.is_cuda)
        return None
    return "static" if static else "graphs"


def note_eager(cache, reason: str, cuda: bool) -> None:
    """Record why this cache decodes eagerly; say it once (a warning) where graphs were asked for or expected
    (mode "graphs" / "compiled", or "auto" on a CUDA device)."""
    if cache.decode_note is not None:
        return
    cache.decode_note = f"decoding eagerly: {reason}"
    if cache.decode in FoxCache.GRAPH_MODES or (cache.decode == "auto" and cuda):
        warnings.warn(cache.decode_note, stacklevel=4)
