"""Eviction: the output stays within 2 * eps * max|v| of exact attention, the cache shrinks on
strongly forgetting heads and keeps long heads whole, buffers grow by doubling and compact rarely."""
import math
import warnings

import pytest
import torch

from foxformer.infer.generation import GenerationConfig, stream_tokens
from foxformer.models.kvcache import PAGE_SIZE, DenseKV, EvictionPolicy, FoxCache, PagedKV, output_tolerance
from foxformer.models.modeling import CACHE_FIELD
from foxformer.ops.forgetting_attn.threshold import pruning_threshold
from foxformer.ops import gate_cumsum
from foxformer.ops.forgetting_attn.decode import forgetting_attention_decode

from .conftest import make_model, tokens


def _exact(q, k, v, c, scale):
    return forgetting_attention_decode(q, k, v, c, None, softmax_scale=scale, backend="torch")


@pytest.mark.parametrize("eps", [1e-2, 1e-4])
def test_layer_cache_output_within_tolerance(eps):
    """Token-by-token decoding with eviction against exact attention over the whole history, with
    q, k scaled so that |scale * q . k| <= U holds (the bound's premise)."""
    torch.manual_seed(0)
    B, T, Hq, Hkv, D, U, n_max = 2, 160, 4, 2, 8, 2.0, 256
    scale = 1 / math.sqrt(D)
    unit = lambda x: x / x.norm(dim=-1, keepdim=True)  # noqa: E731
    q = unit(torch.randn(B, T, Hq, D, dtype=torch.float64)) * math.sqrt(U / scale)
    k = unit(torch.randn(B, T, Hkv, D, dtype=torch.float64)) * math.sqrt(U / scale)
    v = torch.randn(B, T, Hkv, D, dtype=torch.float64)
    # Heads 0, 1 (kv head 0) forget fast; head 2 fast, head 3 slow (kv head 1 must keep everything).
    noise = 0.3 * torch.randn(B, T, Hq, dtype=torch.float64)
    logit = torch.tensor([-2.0, -1.5, -2.0, 6.0], dtype=torch.float64) + noise
    c = gate_cumsum(torch.nn.functional.logsigmoid(logit))
    cache = PagedKV(EvictionPolicy(eps).deltas([U], n_max)[0])
    worst = 0.0
    for t in range(T):
        cache.append(k[:, t:t + 1], v[:, t:t + 1], c[:, t:t + 1])
        got = forgetting_attention_decode(q[:, t:t + 1], cache.k, cache.v, cache.c, cache.start, softmax_scale=scale,
                                          backend="torch")
        want = _exact(q[:, t:t + 1], k[:, :t + 1], v[:, :t + 1], c[:, :t + 1], scale)
        worst = max(worst, float((got - want).abs().max()))
        cache.evict()
    assert worst <= output_tolerance(eps, float(v.abs().max()))
    live = cache.live_lengths()
    assert torch.all(live[:, 0] < 40), live          # strongly forgetting group: a short window
    assert torch.all(cache.start[:, 1] == 0)          # one slow head keeps its whole group


def test_model_decoding_with_eviction_matches_and_shrinks():
    bias = [-3.0, -3.0, 8.0, -3.0]  # kv heads = heads here: heads 0, 1, 3 forget within a few tokens
    model = make_model("fox-pro-tiny", gate_bias=bias)
    prompt = tokens(2, 30)
    ref_state, ev_state = {}, {}
    cfg = dict(max_new_tokens=60, temperature=0.0)
    ref = torch.stack(list(stream_tokens(model, prompt, GenerationConfig(**cfg), ref_state)), 1)
    got = torch.stack(list(stream_tokens(model, prompt, GenerationConfig(**cfg, evict_eps=1e-6), ev_state)), 1)
    assert torch.equal(got, ref)
    cache = ev_state["cache"]
    for layer in cache.layers:
        assert layer.delta is not None
        assert torch.all(layer.start[:, [0, 1, 3]] > 30) and torch.all(layer.start[:, 2] == 0)
    rep = cache.memory_report()
    assert rep["kept_fraction"] < 0.5 and rep["live_bytes"] < rep["no_eviction_bytes"] / 2


@torch.no_grad()
def test_model_logits_close_to_full_forward():
    model = make_model("fox-pro-tiny", gate_bias=[-2.0, -2.5, 5.0, -2.0])
    ids = tokens(1, 70, seed=3)
    full = model(ids).logits
    eps = 1e-3
    cache = model.model.new_cache(EvictionPolicy(eps))
    out = model(ids[:, :10], cache=cache, use_cache=True)
    parts = [out.logits]
    for t in range(10, 70):
        parts.append(model(ids[:, t:t + 1], cache=cache, use_cache=True).logits)
    diff = float((torch.cat(parts, 1) - full).abs().max())
    assert any(bool((layer.start > 0).any()) for layer in cache.layers)
    assert diff < 1e-2, diff   # errors pass through 2 layers and the LM head: loose, but far below noise
    assert diff > 0            # something was really evicted


def test_gqa_group_is_kept_while_any_head_needs_it():
    model = make_model("fox-pro-tiny", gate_bias=[-3.0, 8.0, -3.0, -3.0], num_kv_heads=2)
    state = {}
    list(stream_tokens(model, tokens(1, 20), GenerationConfig(max_new_tokens=30, temperature=0, evict_eps=1e-4),
                       state))
    for layer in state["cache"].layers:
        assert int(layer.start[0, 0]) == 0 and int(layer.start[0, 1]) > 20


def _deltas(model, policy, total_len=None):
    return [layer.delta for layer in model.model.new_cache(policy, total_len=total_len).layers]


def test_deltas_from_qk_norm_or_the_users_bound():
    """One threshold per layer, from the pruning bound's own function: U from the QK-norm weights, else the
    user's bound, else no eviction."""
    pro = make_model("fox-pro-tiny")
    attn = pro.model.layers[0].attn
    with torch.no_grad():
        attn.q_norm.weight.fill_(0.5)
        attn.k_norm.weight[3] = 2.0
    u = attn.eviction_bound(None)
    assert u == pytest.approx(attn.head_dim ** 0.5 * 0.5 * 2.0 * 1.01)  # 1%: bf16 rounding of q, k
    deltas = _deltas(pro, EvictionPolicy(1e-3, max_len=1000))
    assert deltas[0] == pruning_threshold(1e-3, u, 1000) == pytest.approx(math.log(1e-3) - 2 * u - math.log(1000))
    llama = make_model("fox-llama-tiny")  # no QK-norm: no eviction unless the user gives U
    with pytest.warns(UserWarning, match="no layer can evict"):
        assert _deltas(llama, EvictionPolicy(1e-3)) == [None, None]
    user = _deltas(llama, EvictionPolicy(1e-3, qk_bound=4.0, max_len=100))
    assert user[1] == pytest.approx(math.log(1e-3) - 8 - math.log(100))
    transformer = make_model("transformer-pro-tiny")
    assert [b.attn.eviction_bound(4.0) for b in transformer.model.layers] == [None, None]
    with pytest.raises(ValueError, match="forget gate"):
        transformer.model.new_cache(EvictionPolicy(1e-3))
    assert _deltas(pro, None) == [None, None]
    for bad, name in ((dict(eps=0.0, qk_bound=1.0, max_len=10), "evict_eps"),
                      (dict(eps=0.1, qk_bound=-1.0, max_len=10), "evict_qk_bound"),
                      (dict(eps=0.1, qk_bound=1.0, max_len=0), "evict_max_len"),
                      (dict(eps=None), "evict_eps")):
        with pytest.raises(ValueError, match=name):
            EvictionPolicy(**bad)


def test_pages_are_reused_and_the_pool_stays_bounded():
    """Keys older than ~5 tokens die: the pool stops growing after a few pages, dead pages go back and are
    reused, and the live suffix always reads back in order."""
    from foxformer.models.kvcache import PAGE_SIZE

    cache = PagedKV(-5.0)
    B, H, D = 1, 2, 4
    for t in range(20 * PAGE_SIZE):
        k = torch.full((B, 1, H, D), float(t))
        cache.append(k, -k, torch.full((B, 1, H), -1.0 * t, dtype=torch.float64))  # log f = -1 per token
        cache.evict()
        s = int(cache.start[0, 1])
        live = cache.k[0, s:, 1, 0]
        assert torch.equal(live, torch.arange(s, t + 1, dtype=live.dtype))
        assert torch.equal(cache.v[0, s:, 1, 0], -live)
    assert int(cache.live_lengths().max()) <= 6          # c_t - c_j <= -5 is evicted
    assert cache.pages.k_pages.shape[0] <= 2 * B * H * 2  # two pages per head at most, doubled once
    full = DenseKV()
    full_caps = []
    for t in range(100):
        full.append(torch.zeros(1, 1, 1, 2), torch.zeros(1, 1, 1, 2), torch.zeros(1, 1, 1, dtype=torch.float64))
        full_caps.append(full.capacity)
    assert sorted(set(full_caps)) == [16, 32, 64, 128]
    hinted = FoxCache([DenseKV()])
    hinted.reserve(100)
    hinted[0].append(torch.zeros(1, 5, 1, 2), torch.zeros(1, 5, 1, 2), torch.zeros(1, 5, 1, dtype=torch.float64))
    assert hinted[0].capacity == 100


def _feed_one_long_head(cache, batch: int, tokens: int, chunk: int, heads: int = 8, dim: int = 16) -> None:
    """Append `tokens` random keys in chunks, evicting after each: every head forgets (log f = -1) but head 0,
    which keeps every key."""
    for _ in range(0, tokens, chunk):
        k = torch.randn(batch, chunk, heads, dim)
        log_f = torch.full((batch, chunk, heads), -1.0, dtype=torch.float64)
        log_f[..., 0] = 0.0
        cache.append(k, k, gate_cumsum(log_f, initial=cache.last_c()))
        cache.evict()


def test_one_long_head_does_not_pin_the_others_memory():
    """The fifth-session failure: one head that never forgets kept a dense buffer whole for every head (60%
    of the no-eviction memory allocated with 5% of the keys live). With pages per head the allocation
    follows the live keys."""
    T = 40 * 64
    cache = PagedKV(-5.0)
    _feed_one_long_head(cache, batch=1, tokens=T, chunk=16)
    mem = cache.memory()
    assert mem["live"] < 0.15 * mem["no_eviction"]           # 1 head of 8 live, plus a few keys
    assert mem["allocated"] < 0.3 * mem["no_eviction"]       # pages follow: the pool is 1/8 and slack
    assert int(cache.start[0, 0]) == 0 and torch.all(cache.start[0, 1:] > T - 10)


def test_config_evict_eps_reaches_hf_generate():
    model = make_model("fox-pro-tiny", gate_bias=[-3.0, -3.0, 8.0, -3.0])
    prompt = tokens(1, 12)
    plain = model.generate(prompt, max_new_tokens=20, do_sample=False, pad_token_id=0)
    model.config.evict_eps = 1e-6
    cache = model.model.new_cache()
    assert all(layer.delta is not None for layer in cache.layers)
    evicting = model.generate(prompt, max_new_tokens=20, do_sample=False, pad_token_id=0)
    assert torch.equal(evicting, plain)
    with pytest.raises(ValueError, match="evict_eps"):
        model.config.__class__(**{**model.config.to_dict(), "evict_eps": 2.0})


@torch.no_grad()
def test_long_chunks_after_eviction_stay_within_tolerance():
    """A chunked prefill on top of an evicted cache takes the prefill op from the common start."""
    model = make_model("fox-pro-tiny", gate_bias=[-3.0, -2.0, -1.0, -3.0])
    ids = tokens(1, 90, seed=4)
    full = model(ids).logits
    cache = model.model.new_cache(EvictionPolicy(1e-6))
    parts = [model(ids[:, s:s + 30], cache=cache, use_cache=True).logits for s in range(0, 90, 30)]
    for layer in cache.layers:  # ragged, and no head kept everything
        assert int(layer.start.min()) > 0 and int(layer.start.max()) > int(layer.start.min())
    torch.testing.assert_close(torch.cat(parts, 1), full, rtol=0, atol=1e-4)


def test_beam_reorder_of_a_paged_cache_keeps_each_rows_keys():
    """select with repeated rows (beam search) rebuilds the pages: no page is owned twice."""
    cache = PagedKV(-3.0)
    H, D = 2, 4
    for t in range(150):
        k = torch.stack([torch.full((1, H, D), float(t)), torch.full((1, H, D), -float(t))])   # rows 0, 1
        c = torch.full((2, 1, H), -0.5 * t, dtype=torch.float64)
        c[:, :, 1] = 0.0                                      # head 1 keeps everything
        cache.append(k, k, c)
        cache.evict()
    cache.select(torch.tensor([1, 1, 0]))
    assert cache.start.shape == (3, H) and int(cache.start[2, 0]) > 100 and int(cache.start[0, 1]) == 0
    pages = cache.pages.table_host
    owned = [p for b in range(3) for h in range(H) for p in pages[b, h, cache.pages.released[b, h]:3]]
    assert len(owned) == len(set(owned))
    assert torch.equal(cache.k[1, :, 1, 0], -torch.arange(150.0))
    assert torch.equal(cache.k[2, :, 1, 0], torch.arange(150.0))
    cache.append(torch.ones(3, 1, H, D), torch.ones(3, 1, H, D), torch.zeros(3, 1, H, dtype=torch.float64))
    assert torch.equal(cache.k[0, -2:, 1, 0], torch.tensor([-149.0, 1.0]))


def test_decode_steps_scan_every_few_steps_and_chunks_at_once():
    from foxformer.models.kvcache import EVICT_EVERY

    layer = PagedKV(-2.0)
    cache = FoxCache([layer])
    k = torch.zeros(1, 1, 1, 2)
    for t in range(40):  # log f = -1 per token: keys older than 2 tokens are dead
        layer.append(k, k, torch.full((1, 1, 1), -1.0 * t, dtype=torch.float64))
    # one-token steps scan every EVICT_EVERY-th time (the cache decides, for every layer at once)
    assert [cache.next_scan(1) for _ in range(2 * EVICT_EVERY)] == ([False] * (EVICT_EVERY - 1) + [True]) * 2
    assert cache.next_scan(5)                           # a chunk always scans
    layer.evict(window=64)
    assert int(layer.start[0, 0]) == 38                 # a scan drops every dead key (c_39 - c_j <= -2)
    layer.append(k, k, torch.full((1, 1, 1), -40.0, dtype=torch.float64))
    layer.evict()
    assert int(layer.start[0, 0]) == 39


GROW_PAST_N = {
    "generation-config": lambda model: dict(evict_max_len=12),
    "model-config": lambda model: setattr(model.config, "evict_max_len", 12) or {},
}


@pytest.mark.parametrize("source", list(GROW_PAST_N), ids=list(GROW_PAST_N))
def test_growing_past_an_explicit_evict_max_len_is_a_clear_error(source):
    """The bound holds for at most N keys: with N given (e.g. --evict-max-len 2) a longer sequence evicted on
    as if it were N long and the eps tolerance was silently void."""
    model = make_model("fox-pro-tiny", gate_bias=[-3.0, -3.0, 8.0, -3.0])
    options = GROW_PAST_N[source](model)
    prompt = tokens(1, 10)
    # 10 prompt tokens and 2 fed back (the third new token is never fed): 12 keys, exactly N
    assert len(list(stream_tokens(model, prompt, GenerationConfig(max_new_tokens=3, evict_eps=1e-3, **options)))) == 3
    with pytest.raises(ValueError, match="evict_max_len.*12"):
        next(stream_tokens(model, prompt, GenerationConfig(max_new_tokens=4, evict_eps=1e-3, **options)))
    # the cache itself refuses a chunk that takes it past N (HF generate, direct use)
    cache = model.model.new_cache(EvictionPolicy(1e-3, max_len=options.get("evict_max_len")))
    out = model(prompt, past_key_values=cache, use_cache=True)
    model(prompt[:, :2], past_key_values=out.cache)
    with pytest.raises(ValueError, match="evict_max_len.*12"):
        model(prompt[:, :1], past_key_values=out.cache)
    assert out.cache.get_seq_length() == 12


HUGE_N = 10**11


def _pages(n: int) -> int:
    return -(-n // PAGE_SIZE)


def _assert_sized_for(cache, fed: int, batch: int, slack: float = 1.0) -> None:
    """Every evicting layer's page table has no column past the pages of ``fed`` positions (``slack``: a table that
    doubled on demand), and its pool no more pages than every head holding all of them (x1.25: quarter growth)."""
    for layer in cache.layers:
        pool = layer.pages
        assert pool.table.shape[2] <= slack * _pages(fed) and pool.table_host.shape == tuple(pool.table.shape)
        assert pool.k_pages.shape[0] <= 1.25 * batch * pool.shape[1] * _pages(fed)


GENERATE_HUGE_N = {
    "stream_tokens": lambda model, prompt, n: stream_tokens(
        model, prompt, GenerationConfig(max_new_tokens=n, evict_eps=1e-3, evict_max_len=HUGE_N), _CACHE),
    "hf-generate": lambda model, prompt, n: _hf_generate(model, prompt, n),
}
_CACHE: dict = {}


def _hf_generate(model, prompt, n):
    model.config.evict_eps, model.config.evict_max_len = 1e-3, HUGE_N
    out = model.generate(prompt, max_new_tokens=n, do_sample=False, pad_token_id=0, return_dict_in_generate=True)
    _CACHE["cache"] = out[CACHE_FIELD]
    return out.sequences[0, prompt.shape[1]:]


@pytest.mark.parametrize("how", list(GENERATE_HUGE_N), ids=list(GENERATE_HUGE_N))
def test_a_huge_explicit_n_sizes_storage_for_the_tokens_fed(how):
    """--evict-max-len 99999999999 sized each evicting layer's page table for N (a column per 64 positions of
    every head, on the device and the host): 6 GB per kv head and layer, until the process was killed. Storage now
    follows the tokens the generation feeds; N stays the bound eviction is derived for."""
    model = make_model("fox-pro-tiny", gate_bias=[-3.0, -3.0, 8.0, -3.0])
    prompt, n = tokens(1, 70), 80
    _CACHE.clear()
    assert len(list(GENERATE_HUGE_N[how](model, prompt, n))) == n
    cache = _CACHE["cache"]
    fed = 70 + n - 1
    _assert_sized_for(cache, fed, batch=1)
    assert cache.max_len == HUGE_N
    want = EvictionPolicy(1e-3).deltas([block.attn.eviction_bound(None) for block in model.model.layers], HUGE_N)
    assert [layer.delta for layer in cache.layers] == pytest.approx(want)


@pytest.mark.parametrize("decode", ["static", "eager"])
def test_a_huge_explicit_n_without_a_length_grows_storage_on_demand(decode):
    """A cache built without the length it will be fed (new_cache(policy), then forwards): its page tables grow
    with the tokens (static steps map each new page before writing) instead of covering N at once."""
    model = make_model("fox-pro-tiny", gate_bias=[8.0, 8.0, 8.0, 8.0])  # nothing forgets: every page stays
    ids = tokens(2, 150, seed=2)
    want = model(ids).logits
    cache = model.model.new_cache(EvictionPolicy(1e-3, max_len=HUGE_N), decode=decode)
    got = [model(ids[:, :70], cache=cache, use_cache=True).logits]
    got += [model(ids[:, t:t + 1], cache=cache, use_cache=True).logits for t in range(70, 150)]
    torch.testing.assert_close(torch.cat(got, 1), want, rtol=0, atol=1e-9)
    assert cache.decode_note is None and (cache.graphs is not None) == (decode == "static")
    _assert_sized_for(cache, 150, batch=2, slack=2)
    capped = model.model.new_cache(EvictionPolicy(1e-3, max_len=150))  # a length announced past N is capped at N
    capped.reserve(HUGE_N)
    assert all(layer.capacity_hint == 150 for layer in capped.layers)


def test_config_evict_max_len_is_enforced_in_hf_generate():
    model = make_model("fox-pro-tiny", gate_bias=[-3.0, -3.0, 8.0, -3.0])
    model.config.evict_eps, model.config.evict_max_len = 1e-3, 12
    with pytest.raises(ValueError, match="evict_max_len"):
        model.generate(tokens(1, 10), max_new_tokens=8, do_sample=False, pad_token_id=0)


def test_generation_past_max_position_embeddings_still_evicts_without_an_explicit_n():
    """N defaults to max_position_embeddings; FoX generates past it (no learned positions), so that stays allowed."""
    model = make_model("fox-pro-tiny", gate_bias=[-3.0, -3.0, 8.0, -3.0], max_position_embeddings=16)
    state = {}
    out = list(stream_tokens(model, tokens(1, 10), GenerationConfig(max_new_tokens=30, evict_eps=1e-3), state))
    assert len(out) == 30 and state["cache"].memory_report()["kept_fraction"] < 1


NO_EXPLICIT_N = {
    # 10 prompt tokens + 29 fed back = 39 keys, past max_position_embeddings = 16: N must cover all 39
    "past-max-position-embeddings": (30, 39),
    # within it, N stays max_position_embeddings (as before)
    "within-max-position-embeddings": (4, 16),
}


@pytest.mark.parametrize("max_new_tokens,n", list(NO_EXPLICIT_N.values()), ids=list(NO_EXPLICIT_N))
def test_without_an_explicit_n_the_bound_covers_the_whole_generation(max_new_tokens, n):
    """Without evict_max_len N was max_position_embeddings even when the generation went past it: keys were
    evicted as if no sequence could be longer than 16, and the eps tolerance was void for the rest."""
    model = make_model("fox-pro-tiny", gate_bias=[-3.0, -3.0, 8.0, -3.0], max_position_embeddings=16)
    state = {}
    cfg = GenerationConfig(max_new_tokens=max_new_tokens, evict_eps=1e-3)
    assert len(list(stream_tokens(model, tokens(1, 10), cfg, state))) == max_new_tokens
    want = EvictionPolicy(1e-3).deltas([block.attn.eviction_bound(None) for block in model.model.layers], n)
    assert [layer.delta for layer in state["cache"].layers] == pytest.approx(want)


@pytest.mark.parametrize("max_new_tokens,n", list(NO_EXPLICIT_N.values()), ids=list(NO_EXPLICIT_N))
def test_hf_generate_bound_covers_the_whole_generation(max_new_tokens, n):
    """transformers' generate built its cache with N = max_position_embeddings, whatever it went on to feed."""
    model = make_model("fox-pro-tiny", gate_bias=[-3.0, -3.0, 8.0, -3.0], max_position_embeddings=16)
    model.config.evict_eps = 1e-3
    out = model.generate(tokens(1, 10), max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=0,
                         return_dict_in_generate=True)
    assert out.sequences.shape[1] == 10 + max_new_tokens
    want = EvictionPolicy(1e-3).deltas([block.attn.eviction_bound(None) for block in model.model.layers], n)
    assert [layer.delta for layer in out[CACHE_FIELD].layers] == pytest.approx(want)


def test_a_cache_the_forward_builds_covers_its_input_and_warns_once_past_its_n():
    """model(ids, use_cache=True) with the config's evict_eps built its cache with N = max_position_embeddings: a
    40-token prompt on a 16-position model, and every token after it, evicted as if no sequence were longer than 16
    (the eps tolerance void) without a word. N now covers the input, and a continuation past it warns once."""
    model = make_model("fox-pro-tiny", gate_bias=[-3.0, -3.0, 8.0, -3.0], max_position_embeddings=16)
    model.config.evict_eps = 1e-3
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        out = model(tokens(1, 40), use_cache=True)
        assert not said
        for _ in range(3):
            model(tokens(1, 1), past_key_values=out.cache, use_cache=True)
    want = EvictionPolicy(1e-3).deltas([block.attn.eviction_bound(None) for block in model.model.layers], 40)
    assert [layer.delta for layer in out.cache.layers] == pytest.approx(want)
    assert [str(w.message).split(",")[0] for w in said] == [
        "eviction: the cache now holds 41 tokens"], [str(w.message) for w in said]
    assert "more than the N = 40 its bound was derived for" in str(said[0].message)


def test_beam_reorder_copies_only_the_live_pages():
    """select rebuilt the pool from dense copies of every position, dead ones included: after one beam
    reorder an evicting cache allocated as much as no eviction at all (and copied all of it each step)."""
    cache = PagedKV(-5.0)
    _feed_one_long_head(cache, batch=2, tokens=20 * 64, chunk=64)
    before = cache.memory()
    want = cache.k[[1, 1, 0]][:, :, 0]
    cache.select(torch.tensor([1, 1, 0]))
    mem = cache.memory()
    assert mem["live_keys"] == before["live_keys"] * 3 // 2
    assert mem["allocated"] < 0.3 * mem["no_eviction"], mem
    assert torch.equal(cache.k[:, :, 0], want)


def test_chunked_prefill_pool_follows_the_live_keys():
    """Half the heads keep every key, half forget at once; 32 chunks of 64 tokens. A pool that doubled
    when short ended at every position of every head (the sixth session's 32K / 64K batch-1 bench rows:
    100% allocated with 44-50% of keys live); growing by a quarter keeps it near the live keys."""
    Hkv, D, chunk, n = 8, 4, 64, 32
    cache = FoxCache([PagedKV(-5.0, capacity_hint=chunk * n)], max_len=chunk * n)
    layer = cache[0]
    for i in range(n):
        log_f = torch.zeros(1, chunk, Hkv, dtype=torch.float64)
        log_f[..., Hkv // 2:] = -10.0                      # these heads keep only their newest key
        c = gate_cumsum(log_f, initial=layer.last_c())
        layer.append(torch.randn(1, chunk, Hkv, D), torch.randn(1, chunk, Hkv, D), c)
        layer.evict()
    mem = layer.memory()
    assert mem["live"] == pytest.approx(0.5 * mem["no_eviction"], rel=0.05)
    assert layer.pages.k_pages.shape[0] <= 0.65 * Hkv * n     # pages: live half plus one chunk and growth slack
