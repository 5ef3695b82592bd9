"""Seeded random walks through an evicting (paged) layer cache: ragged chunks across page boundaries,
heads that forget fast next to heads that never forget, full and windowed evictions, beam-style row
selections. After every step the live keys read back exactly as appended, every pool page has one
owner, the memory report adds up, and the paged decode op (torch and interpreted Triton) equals a dense
reference over the same live keys."""
import math
import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported (conftest.py does it too)

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from foxformer.models.kvcache import PagedKV  # noqa: E402
from foxformer.ops.forgetting_attn.cumsum import LOG_FGATE_FLOOR  # noqa: E402
from foxformer.ops.forgetting_attn.decode import forgetting_attention_decode  # noqa: E402


def dense_reference(q, k, v, c, start, scale):
    """float64 attention of the last Tq positions over keys [start, Tk) of each (b, kv head)."""
    B, Tq, Hq, D = q.shape
    Tk, Hkv = k.shape[1], k.shape[2]
    G = Hq // Hkv
    s = torch.einsum("bihd,bjhd->bhij", q.double(), k.double().repeat_interleave(G, 2)) * scale
    pos, keys = torch.arange(Tk - Tq, Tk), torch.arange(Tk)
    s = s + c.transpose(1, 2)[:, :, pos, None] - c.transpose(1, 2)[:, :, None, :]
    mask = (keys[None, :] <= pos[:, None])[None, None] & \
        (keys[None, None, None, :] >= start.repeat_interleave(G, 1)[:, :, None, None])
    s = s.masked_fill(~mask, float("-inf"))
    return torch.einsum("bhij,bjhd->bihd", torch.softmax(s, -1), v.double().repeat_interleave(G, 2))


def new_cache(delta, page):
    """An evicting layer cache whose pages hold ``page`` tokens (PAGE_SIZE is 64: small pages stress the
    boundaries)."""
    return PagedKV(delta, page_size=page)


def check_pages(cache):
    """Every pool page is free or owned by exactly one (b, h), as one of its pages not yet released; no
    page at or after a head's start is released."""
    p = cache.pages
    B, Hkv, _ = p.shape
    n = -(-p.length // p.page)
    owned = [int(x) for b in range(B) for h in range(Hkv) for x in p.table_host[b, h, p.released[b, h]:n]]
    assert len(owned) == len(set(owned)), "a pool page is owned twice"
    assert len(p.free) == len(set(p.free)), "a page is free twice"
    assert not set(owned) & set(p.free), "a live page is on the free list"
    assert set(owned) | set(p.free) == set(range(p.k_pages.shape[0])), "a page is lost"
    assert np.all(p.released <= cache.start.numpy() // p.page), "a page holding live keys was released"
    assert torch.equal(p.table[:, :, :n].cpu(), torch.from_numpy(p.table_host[:, :, :n]))


def check_contents(cache, rec_k, rec_v, rec_c):
    L = rec_k.shape[1]
    assert cache.length == L
    k, v, c = cache.k, cache.v, cache.c
    G = rec_c.shape[2] // rec_k.shape[2]
    for b in range(rec_k.shape[0]):
        for h in range(rec_k.shape[2]):
            s = int(cache.start[b, h])
            assert 0 <= s < L
            assert torch.equal(k[b, s:, h], rec_k[b, s:, h]), (b, h, s)
            assert torch.equal(v[b, s:, h], rec_v[b, s:, h]), (b, h, s)
            assert torch.equal(c[b, s:, h * G:(h + 1) * G], rec_c[b, s:, h * G:(h + 1) * G]), (b, h, s)
            # dense copies: dead keys zeroed, their c far above every live c (no weight)
            assert not k[b, :s, h].any() and not v[b, :s, h].any()
            if s:
                assert torch.all(c[b, :s, h * G:(h + 1) * G] >= rec_c[b, s, h * G:(h + 1) * G] + 1e3)


def check_start(cache, rec_c, delta, exact):
    """No live key was evicted (each key before start is dead for every head of its group); after a full
    scan, every dead key is gone."""
    Hkv = cache.start.shape[1]
    G = rec_c.shape[2] // Hkv
    last = rec_c[:, -1]                                                     # [B, H]
    dead = (rec_c - last[:, None, :] >= -delta).view(*rec_c.shape[:2], Hkv, G).all(-1)   # [B, L, Hkv]
    n_dead = dead.long().cumprod(1).sum(1)                                  # dead prefix per (b, kv head)
    assert torch.all(cache.start <= n_dead), (cache.start, n_dead)
    if exact:
        assert torch.equal(cache.start, n_dead), (cache.start, n_dead)


def check_memory(cache, peak):
    """peak: the most pages any earlier step held (the pool doubles: at most twice that)."""
    m = cache.memory()
    p = cache.pages
    B, Hkv, D = p.shape
    assert p.k_pages.shape[0] <= 2 * peak, (p.k_pages.shape[0], peak)
    assert m["total_keys"] == cache.length * B * Hkv
    assert m["live_keys"] == int((cache.length - cache.start).sum())
    assert m["live"] <= m["held"] <= m["no_eviction"] + B * Hkv * p.page * 2 * D * 8 + B * Hkv * p.page * p.group * 8
    assert m["held"] <= m["allocated"]


def check_decode(cache, rec_k, rec_v, rec_c, Tq, gen):
    B, L, Hkv, D = rec_k.shape
    H = rec_c.shape[2]
    q = torch.randn(B, Tq, H, D, generator=gen)
    scale = 1 / math.sqrt(D)
    want = dense_reference(q, rec_k, rec_v, rec_c, cache.start, scale)
    p = cache.pages
    for backend in ("torch", "triton"):
        got = forgetting_attention_decode(q, p.k_pages, p.v_pages, p.c_pages, cache.start, page_table=p.table,
                                          seq_len=p.length, softmax_scale=scale, backend=backend)
        torch.testing.assert_close(got.double(), want, rtol=0, atol=3e-5, msg=lambda m: f"{backend}: {m}")


WALKS = {  # seed, B, Hkv, G, D, page, steps, max chunk
    "mha-page4": (0, 2, 3, 1, 4, 4, 30, 9),
    "gqa-page5": (1, 1, 2, 3, 8, 5, 30, 12),
    "mqa-page64-long-chunks": (2, 2, 1, 4, 4, 64, 16, 70),
    "gqa-page1": (3, 3, 2, 2, 4, 1, 25, 5),
    "batch3-page7": (4, 3, 4, 1, 6, 7, 30, 20),
}


@pytest.mark.parametrize("walk", list(WALKS), ids=list(WALKS))
def test_random_walk_keeps_the_live_keys_and_owns_each_page_once(walk):
    seed, B, Hkv, G, D, page, steps, max_chunk = WALKS[walk]
    rng = np.random.default_rng(seed)
    gen = torch.Generator().manual_seed(seed)
    H = Hkv * G
    delta = -4.0
    # per query head: some forget within a few tokens, some slowly, some never
    rates = torch.from_numpy(rng.choice([0.0, -0.05, -0.7, -2.5], size=(B, H))).double()
    rates[:, :G] = -2.5  # kv head 0 forgets fast in every row
    cache = new_cache(delta, page)
    rec_k = torch.empty(B, 0, Hkv, D)
    rec_v = torch.empty(B, 0, Hkv, D)
    rec_c = torch.empty(B, 0, H, dtype=torch.float64)
    peak = 0
    for step in range(steps):
        T = int(rng.integers(1, max_chunk + 1)) if rng.random() < 0.5 else 1
        k = torch.randn(B, T, Hkv, D, generator=gen)
        v = torch.randn(B, T, Hkv, D, generator=gen)
        log_f = rates[:, None, :] * torch.rand(B, T, H, generator=gen, dtype=torch.float64) * 2
        if rng.random() < 0.1:  # a sequence start (left padding, packing): f = 0, c falls by the floor
            log_f[int(rng.integers(B)), int(rng.integers(T)), :] = LOG_FGATE_FLOOR
        last = rec_c[:, -1] if rec_c.shape[1] else torch.zeros(B, H, dtype=torch.float64)
        c = last[:, None, :] + log_f.cumsum(1)
        cache.append(k, v, c)
        peak = max(peak, cache.pages.pages_in_use)
        rec_k, rec_v, rec_c = torch.cat([rec_k, k], 1), torch.cat([rec_v, v], 1), torch.cat([rec_c, c], 1)
        check_pages(cache)
        check_contents(cache, rec_k, rec_v, rec_c)
        if step % 3 == 0:
            check_decode(cache, rec_k, rec_v, rec_c, min(T, 16), gen)
        kind = rng.choice(["full", "window", "window-small"])
        if kind == "full":
            cache.evict()
        else:
            cache.evict(window=64 if kind == "window" else 3)
        check_start(cache, rec_c, delta, exact=kind == "full")
        check_pages(cache)
        check_contents(cache, rec_k, rec_v, rec_c)
        check_memory(cache, peak)
        if rng.random() < 0.2:
            index = torch.from_numpy(rng.integers(0, B, size=B))
            cache.select(index)
            rec_k, rec_v, rec_c = rec_k[index], rec_v[index], rec_c[index]
            check_pages(cache)
            check_contents(cache, rec_k, rec_v, rec_c)
            check_memory(cache, peak)
    assert bool((cache.start > 0).any()), "nothing was evicted: the walk tests nothing"
