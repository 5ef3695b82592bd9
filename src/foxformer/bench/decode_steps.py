"""Timing decode steps for `foxformer bench decode`: one row per (model, decode path, context, batch), with
the memory-bandwidth floor of each step beside it.

Decode paths: a foxformer model's FoxCache mode ("eager", "graphs", "compiled", "static", "auto"), and for
transformers' models "sdpa" (their eager forward with a DynamicCache) or "static-compiled" (a StaticCache and
``torch.compile(mode="reduce-overhead")``, transformers' own recipe for fast decoding: the fair anchor).

The floor: a decode step must read every weight once (the LM head included, the embedding only for the new
tokens) and every live cached byte once (a recurrent state is read and written); at the device's copy
bandwidth that takes ``floor_ms``. ``x_floor`` = measured / floor.
"""
from __future__ import annotations

import inspect
import math
import statistics
import time
from typing import Optional

import torch

from foxformer.infer.generation import to_host_async
from foxformer.models.calls import backbone, cache_keyword, cache_of
from foxformer.models.kvcache import EvictionPolicy

from .common import write_profile

HF_PATHS = ("sdpa", "static-compiled")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def copy_bandwidth(device: torch.device, nbytes: int = 1 << 31) -> Optional[float]:
    """Bytes per second a device-to-device copy moves (read + write), the practical peak of a step that only
    reads: None off CUDA."""
    if device.type != "cuda":
        return None
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        dst.copy_(src)
    end.record()
    end.synchronize()
    return 2 * nbytes * 10 / (start.elapsed_time(end) / 1e3)


def weight_bytes(model) -> int:
    """Bytes of the weights a step reads: every parameter but an input embedding that is not also the LM
    head (a lookup reads only the new tokens' rows)."""
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    embed, head = model.get_input_embeddings(), model.get_output_embeddings()
    if head is None or embed.weight is not head.weight:
        total -= embed.weight.numel() * embed.weight.element_size()
    return total


def cache_bytes(model, cache, batch: int, length: int) -> int:
    """Cache bytes a step reads: a FoxCache's live bytes (a recurrent state twice: read and written), else the
    keys and values of ``length`` positions of a transformers model."""
    if hasattr(cache, "memory_report"):
        report = cache.memory_report()
        return report["live_bytes"] * (2 if report["kept_fraction"] is None else 1)
    cfg = model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    elem = next(model.parameters()).element_size()
    return 2 * cfg.num_hidden_layers * batch * cfg.num_key_value_heads * length * head_dim * elem


def _decoder(model, decode: str, policy: Optional[EvictionPolicy], total: int, device: torch.device):
    """(cache, step forward, extra forward arguments for positions [s, e)) of a decode path."""
    body = backbone(model)
    if hasattr(body, "new_cache"):
        return body.new_cache(policy, total_len=total, decode=decode), model, lambda s, e: {}
    if policy is not None:
        raise ValueError("evict_eps: eviction needs a FoX model")
    if decode == "sdpa":
        return None, model, lambda s, e: {}
    if decode != "static-compiled":
        raise ValueError(f"decode: a transformers model decodes with one of {', '.join(HF_PATHS)}, got {decode!r}")
    from transformers import StaticCache

    cache = StaticCache(config=model.config, max_cache_len=total)
    step = torch.compile(model.forward, mode="reduce-overhead", fullgraph=True)
    # transformers 5.17 takes the positions as cache_position (else it reads them back from the cache: a sync
    # that breaks the graph); 5.24 keeps them in the cache itself.
    if "cache_position" in inspect.signature(body.forward).parameters:
        return cache, step, lambda s, e: {"cache_position": torch.arange(s, e, device=device)}
    return cache, step, lambda s, e: {}


def decode_path(cache, decode: str) -> str:
    """What the timed steps ran: "graphs" / "compiled" (replayed CUDA graphs), "static", "eager (why)", or the
    transformers path."""
    if not hasattr(cache, "memory_report") or decode in HF_PATHS:
        return decode
    if cache.decode_note is not None:
        return f"eager ({cache.decode_note.removeprefix('decoding eagerly: ')})"
    if cache.graphs is not None and cache.graphs.captures:
        return "compiled" if cache.graphs.compile else "graphs"
    return "static" if cache.graphs is not None else "eager"


def _p90_ms(seconds: list) -> Optional[float]:
    """The 90th percentile of ``seconds`` in milliseconds (None for none), interpolated between the two nearest
    ranks as numpy.percentile does: the rank rounded down read the minimum of two steps, below their median."""
    if not seconds:
        return None
    ranked = sorted(seconds)
    at = 0.9 * (len(ranked) - 1)
    low = math.floor(at)
    high = min(low + 1, len(ranked) - 1)
    return 1e3 * (ranked[low] + (at - low) * (ranked[high] - ranked[low]))


@torch.no_grad()
def measure_decode(model, *, vocab: int, context: int, batch: int, steps: int, warmup: int,
                   evict_eps: Optional[float], prefill_chunk: int, device: torch.device, seed: int = 0,
                   keep_logprobs: int = 8, evict_qk_bound: Optional[float] = None, decode: str = "auto",
                   bandwidth: Optional[float] = None, profile_path: Optional[str] = None,
                   profile_steps: int = 8) -> dict:
    """Prefill ``context`` random tokens, run ``warmup`` then ``steps`` timed decode steps along ``decode``, then
    ``steps`` streamed ones (and, given ``profile_path``, ``profile_steps`` more under torch.profiler: its operator
    and kernel table written there, for where a step's time goes).

    Returns a row with tokens_per_s and ms_per_step (from the median step, each step waited for before the next
    is queued; the mean and the 90th percentile beside them), ms_host_per_step (the host's part of it: until the
    step is queued, the median), ms_per_token_streamed (the median interval between
    tokens reaching the host while the next step is already queued, as generation streams them; its p90),
    prefill_s, peak_mem_gib, cache_gib, kept_fraction, the bytes a step reads and, given the
    device's ``bandwidth`` (bytes/s), the floor they set; and "logprobs" (fp32 [min(steps, keep_logprobs), V]
    of row 0, for comparing runs on one token stream).
    """
    g = torch.Generator().manual_seed(seed)
    extra = profile_steps if profile_path else 0
    total = context + warmup + 2 * steps + extra       # the synced steps, then as many streamed ones
    ids = torch.randint(0, vocab, (batch, total), generator=g).to(device)
    kw = cache_keyword(model)
    # None, not "config": the no-eviction row must keep every key whatever the model config says. N of the bound
    # is the length decoded here, not the model's max_position_embeddings / evict_max_len: a --model with a
    # shorter one would evict outside the eps tolerance (or refuse).
    policy = None if evict_eps is None else EvictionPolicy(evict_eps, evict_qk_bound, total)
    cache, step, where = _decoder(model, decode, policy, total, device)
    if device.type == "cuda":
        torch.cuda.empty_cache()
    # prefill_chunk is per sequence at batch <= 4; larger batches take proportionally shorter chunks so
    # that a chunk's attention mask / score tiles (transformers materialises [B, 1, chunk, keys]) stay small.
    chunk = max(128, prefill_chunk * 4 // max(batch, 4))
    t0 = time.perf_counter()
    for s in range(0, context, chunk):
        e = min(s + chunk, context)
        out = model(input_ids=ids[:, s:e], use_cache=True, logits_to_keep=1, **{kw: cache}, **where(s, e))
        cache = cache_of(out)
    _sync(device)
    prefill_s = time.perf_counter() - t0
    def one_step(t: int):
        """Decode token t (its cache the last step's); returns the model output."""
        nonlocal cache
        out = step(input_ids=ids[:, t:t + 1], use_cache=True, logits_to_keep=1, **{kw: cache}, **where(t, t + 1))
        cache = cache_of(out)
        return out

    for t in range(context, context + warmup):
        one_step(t)
    _sync(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    logprobs = []
    # Each step is timed to its end (a sync per step, as in generation, where the next token must reach the
    # host): batch-1 steps are host-bound, and a mean over 16 unsynced steps varied 12 to 72 ms between rows
    # of one run (sixth session, H200); the median of per-step times resists such spikes.
    times, host = [], []   # host: until the step is queued (on a GPU the device may still be running it)
    for i in range(steps):
        t = context + warmup + i
        t0 = time.perf_counter()
        out = one_step(t)
        queued = time.perf_counter()
        _sync(device)
        times.append(time.perf_counter() - t0)
        host.append(queued - t0)
        if i < keep_logprobs:
            logprobs.append(out.logits[0, -1].float().clone())
    # Streamed, as generation runs (infer.generation.stream_tokens): step t + 1 is queued before token t is copied
    # out and awaited, so the host's share of a step overlaps the device's; a token's time is the interval
    # between two tokens reaching the host (argmax standing in for the sampler).
    streamed, waiting, last = [], None, None
    for t in range(context + warmup + steps, context + warmup + 2 * steps):
        out = one_step(t)
        if waiting is not None:
            waiting()
            now = time.perf_counter()
            if last is not None:
                streamed.append(now - last)
            last = now
        waiting = to_host_async(out.logits[:, -1].argmax(-1))
    if waiting is not None:
        waiting()
    if profile_path:
        with torch.profiler.profile() as prof:
            for t in range(context + warmup + 2 * steps, total):
                one_step(t)
            _sync(device)
        write_profile(prof, profile_path, device, steps=extra)
    median = statistics.median(times) if times else None
    row = {"context": context, "batch": batch, "steps": steps, "decode": decode_path(cache, decode),
           "ms_per_step": None if median is None else 1e3 * median,
           "ms_per_step_mean": 1e3 * sum(times) / max(steps, 1),
           "ms_per_step_p90": _p90_ms(times),
           "tokens_per_s": batch / median if median else None, "prefill_s": prefill_s,
           "ms_host_per_step": 1e3 * statistics.median(host) if host else None,
           "ms_per_token_streamed": 1e3 * statistics.median(streamed) if streamed else None,
           "ms_per_token_streamed_p90": _p90_ms(streamed)}
    if evict_eps is not None:
        row["evict_max_len"] = total
    if device.type == "cuda":
        row["peak_mem_gib"] = torch.cuda.max_memory_allocated() / 2**30
    if hasattr(cache, "memory_report"):
        rep = cache.memory_report()
        row["cache_gib"] = rep["allocated_bytes"] / 2**30
        row["live_gib"] = rep["live_bytes"] / 2**30
        row["kept_fraction"] = rep["kept_fraction"]
    row["bytes_per_step"] = weight_bytes(model) + cache_bytes(model, cache, batch, total)
    if bandwidth and median:
        row["floor_ms"] = 1e3 * row["bytes_per_step"] / bandwidth
        row["x_floor"] = row["ms_per_step"] / row["floor_ms"]
        if streamed:
            row["x_floor_streamed"] = row["ms_per_token_streamed"] / row["floor_ms"]
        row["gb_s"] = row["bytes_per_step"] / median / 1e9
    row["logprobs"] = torch.log_softmax(torch.stack(logprobs), -1).cpu() if logprobs else None
    return row
