"""Evicting (paged) caches through the model: HF beam search and batch sampling (reorder / select of the
pages), left-padded batches, chunked prefills over ragged evicted heads with GQA, a long first prefill,
FoxCache.reserve and evict_max_len on evicting layers."""
import pytest
import torch

from foxformer.models.kvcache import PAGE_SIZE, EvictionPolicy
from foxformer.models.modeling import CACHE_FIELD

from .conftest import make_model, tokens

FAST = [-3.0, -3.0, 8.0, -3.0]  # heads 0, 1, 3 forget within a few tokens, head 2 keeps everything


def _evicted(cache) -> bool:
    return any(layer.start is not None and bool((layer.start > 0).any()) for layer in cache.layers)


GENERATE = {
    "beam2": dict(num_beams=2, do_sample=False),
    "beam3-return2": dict(num_beams=3, num_return_sequences=2, do_sample=False),
    "sample-batch": dict(do_sample=True, top_k=20, temperature=1.3),
}


@pytest.mark.parametrize("kind", list(GENERATE), ids=list(GENERATE))
def test_hf_generate_with_eviction_equals_without(kind):
    """Beam search reorders the cache every step (repeated rows): the evicting cache must carry each beam's
    own keys; with eps 1e-6 the tokens are those of the exact cache."""
    model = make_model("fox-pro-tiny", gate_bias=FAST, num_kv_heads=2)
    prompt = tokens(2, 12, seed=5)
    opts = dict(max_new_tokens=20, pad_token_id=0, return_dict_in_generate=True, **GENERATE[kind])
    torch.manual_seed(7)
    plain = model.generate(prompt, **opts)
    model.config.evict_eps = 1e-6
    torch.manual_seed(7)
    evicting = model.generate(prompt, **opts)
    assert torch.equal(evicting.sequences, plain.sequences)
    cache = evicting[CACHE_FIELD]
    assert all(layer.pages is not None for layer in cache.layers) and _evicted(cache)


def _left_pad(rows, pad=0):
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, r in enumerate(rows):
        ids[i, width - len(r):] = r
        mask[i, width - len(r):] = 1
    return ids, mask, width


@pytest.mark.parametrize("chunk", [None, 5, 20], ids=["one-prefill", "chunked-prefill-5", "chunked-prefill-20"])
def test_left_padded_batch_with_eviction_equals_unpadded_rows(chunk):
    """The padding keys die at each row's start (f = 0 there): they must be evicted and never weighed."""
    model = make_model("fox-pro-tiny", gate_bias=FAST, num_kv_heads=2)
    model.config.evict_eps = 1e-6
    rows = [tokens(1, 23, seed=3)[0], tokens(1, 4, seed=4)[0], tokens(1, 11, seed=5)[0]]
    ids, mask, width = _left_pad(rows)
    extra = {} if chunk is None else dict(prefill_chunk_size=chunk)
    out = model.generate(ids, attention_mask=mask, max_new_tokens=15, do_sample=False, pad_token_id=0,
                         return_dict_in_generate=True, **extra)
    assert _evicted(out[CACHE_FIELD])
    for i, r in enumerate(rows):
        single = model.generate(r[None], max_new_tokens=15, do_sample=False, pad_token_id=0)
        assert torch.equal(out.sequences[i, width:], single[0, len(r):]), f"row {i}"
    for layer in out[CACHE_FIELD].layers:  # every padding key of the short rows is gone
        assert torch.all(layer.start[1] >= width - len(rows[1])) and torch.all(layer.start[2] >= width - len(rows[2]))


CHUNKS = {  # preset overrides, gate biases, chunk schedule
    "gqa-ragged-chunks": (dict(num_kv_heads=2), [-3.0, -0.5, -2.0, -1.0], [17, 40, 1, 33, 20, 3, 26]),
    "mqa-long-chunks": (dict(num_kv_heads=1), [-3.0, -2.0, -2.5, -3.0], [30, 30, 30, 30]),
    "mha-page-crossing": (dict(), [-3.0, -2.0, -1.0, -3.0], [63, 2, 64, 1, 17, 5]),
}


@pytest.mark.parametrize("case", list(CHUNKS), ids=list(CHUNKS))
@torch.no_grad()
def test_chunks_on_an_evicted_cache_stay_within_tolerance(case):
    overrides, bias, schedule = CHUNKS[case]
    model = make_model("fox-pro-tiny", gate_bias=bias, **overrides)
    ids = tokens(2, sum(schedule), seed=4)
    full = model(ids).logits
    cache = model.model.new_cache(EvictionPolicy(1e-6))
    parts, s = [], 0
    for n in schedule:
        parts.append(model(ids[:, s:s + n], cache=cache, use_cache=True).logits)
        s += n
    assert _evicted(cache)
    if model.config.num_kv_heads > 1:
        for layer in cache.layers:
            assert int(layer.start.max()) > int(layer.start.min())  # ragged
    torch.testing.assert_close(torch.cat(parts, 1), full, rtol=0, atol=1e-4)


@torch.no_grad()
def test_a_long_first_prefill_then_decoding():
    """Many pages mapped by the first append; eviction after it frees most of them at once, and decoding
    through the page table goes on reusing them."""
    model = make_model("fox-pro-tiny", gate_bias=FAST, num_kv_heads=2)
    n = 5 * PAGE_SIZE + 7
    ids = tokens(1, n + 40, seed=6)
    full = model(ids).logits
    cache = model.model.new_cache(EvictionPolicy(1e-6))
    parts = [model(ids[:, :n], cache=cache, use_cache=True).logits]
    pools = [layer.pages.k_pages.shape[0] for layer in cache.layers]
    for t in range(n, n + 40):
        parts.append(model(ids[:, t:t + 1], cache=cache, use_cache=True).logits)
    torch.testing.assert_close(torch.cat(parts, 1), full, rtol=0, atol=1e-4)
    for layer, pool in zip(cache.layers, pools):
        assert int(layer.start[0, 0]) > n      # kv head 0 (heads 0, 1) forgot the prompt
        assert layer.pages.k_pages.shape[0] == pool  # no new pool page: freed pages were reused


def test_reserve_and_max_len_with_evicting_layers():
    """reserve (a total length hint) on an evicting layer and FoxCache(max_len): the pool and the page table never
    grow past every position of every head, and a capped pool still holds a sequence of that length."""
    model = make_model("fox-pro-tiny", gate_bias=[8.0, 8.0, 8.0, 8.0])  # nothing forgets: every page stays
    ids = tokens(2, 150, seed=2)
    want = model(ids).logits
    for make in ("reserve", "max_len"):
        cache = model.model.new_cache(EvictionPolicy(1e-3, max_len=150 if make == "max_len" else None))
        if make == "reserve":
            cache.reserve(150)
        got = [model(ids[:, :70], cache=cache, use_cache=True).logits]
        got += [model(ids[:, t:t + 1], cache=cache, use_cache=True).logits for t in range(70, 150)]
        torch.testing.assert_close(torch.cat(got, 1), want, rtol=0, atol=1e-9)
        for layer in cache.layers:
            assert layer.delta is not None
            assert layer.pages.k_pages.shape[0] == 2 * 4 * -(-150 // PAGE_SIZE), make
            assert layer.pages.table.shape[2] == -(-150 // PAGE_SIZE), make  # max_len: doubling stops at N
