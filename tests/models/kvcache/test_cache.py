"""Token-by-token decoding and chunked prefill reproduce the logits of one full forward pass."""
import pytest
import torch

from foxformer.models import FoxCache
from foxformer.models.kvcache import DenseKV

from ..conftest import VARIANTS, make_model, tokens

SCHEDULES = {"token-by-token": [6] + [1] * 14, "chunked-prefill": [5, 1, 7, 3, 4]}


@pytest.mark.parametrize("schedule", list(SCHEDULES), ids=list(SCHEDULES))
def test_incremental_equals_full(preset, schedule):
    model = make_model(preset)
    ids = tokens(2, 20)
    full = model(ids).logits
    cache, start, parts = None, 0, []
    for n in SCHEDULES[schedule]:
        out = model(ids[:, start:start + n], past_key_values=cache, use_cache=True)
        cache = out.cache
        parts.append(out.logits)
        start += n
    assert isinstance(cache, FoxCache) and cache.get_seq_length() == 20
    torch.testing.assert_close(torch.cat(parts, 1), full, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("preset,variant", [("fox-pro-tiny", "fgate-fixed"), ("fox-pro-tiny", "fgate-data_independent"),
                                            ("fox-pro-tiny", "gqa"), ("linear-pro-tiny", "gqa")])
def test_incremental_equals_full_variants(preset, variant):
    model = make_model(preset, **VARIANTS[variant])
    ids = tokens(2, 12)
    full = model(ids).logits
    out = model(ids[:, :4], use_cache=True)
    parts = [out.logits]
    for t in range(4, 12):
        parts.append(model(ids[:, t:t + 1], past_key_values=out.cache).logits)
    torch.testing.assert_close(torch.cat(parts, 1), full, rtol=1e-9, atol=1e-9)


def test_cache_extends_c_incrementally():
    model = make_model("fox-llama-tiny")
    ids = tokens(1, 10)
    out = model(ids[:, :9], use_cache=True)
    c_before = out.cache[0].c.clone()
    model(ids[:, 9:], past_key_values=out.cache)
    c_after = out.cache[0].c
    assert c_after.shape == (1, 10, 4) and c_after.dtype == torch.float64
    assert torch.equal(c_after[:, :9], c_before)  # old entries untouched, one new entry appended
    assert torch.all(c_after[:, 9] <= c_after[:, 8])


def test_plain_forward_builds_no_cache():
    model = make_model("fox-llama-tiny")
    assert model(tokens(1, 5)).cache is None


@pytest.mark.parametrize("preset_name", ["fox-pro-tiny", "transformer-pro-tiny", "linear-pro-tiny"])
@pytest.mark.parametrize("schedule", [[20, 3, 17], [40]], ids=["long-chunk-on-a-cache", "one-long-prefill"])
def test_naive_backend_runs_long_cached_chunks(preset_name, schedule):
    """attention_backend="naive" is a valid config value: chunks longer than the decode path's
    (DECODE_MAX_QUERIES) still have to run on a cache and give the full pass's logits."""
    model = make_model(preset_name)
    model.config.attention_backend = "naive"
    ids = tokens(2, 40)
    full = model(ids).logits
    cache, start, parts = None, 0, []
    for n in schedule:
        out = model(ids[:, start:start + n], past_key_values=cache, use_cache=True)
        cache, start = out.cache, start + n
        parts.append(out.logits)
    torch.testing.assert_close(torch.cat(parts, 1), full, rtol=1e-9, atol=1e-9)


def test_a_passed_cache_is_used_with_use_cache_false(preset):
    """As in transformers' models, use_cache only decides whether a new cache is built: a cache that is
    passed in holds the context and must not be dropped (the logits would lose the whole prefix)."""
    model = make_model(preset)
    ids = tokens(2, 10)
    full = model(ids).logits
    cache = model(ids[:, :7], use_cache=True).cache
    got = model(ids[:, 7:], past_key_values=cache, use_cache=False).logits
    torch.testing.assert_close(got, full[:, 7:], rtol=1e-9, atol=1e-9)
    assert cache.get_seq_length() == 10


@pytest.mark.parametrize("preset_name", ["fox-pro-tiny", "transformer-pro-tiny", "linear-pro-tiny"])
def test_kv_shift_state_holds_only_the_last_token(preset_name):
    """k_last / v_last must not be views of the chunk's whole k / v projections: after a long prefill
    those would keep a second copy of the prompt's keys and values alive in every layer."""
    model = make_model(preset_name)
    cache = model(tokens(1, 300), use_cache=True).cache
    for layer in cache.layers:
        for state in (layer.k_last, layer.v_last):
            assert state.untyped_storage().nbytes() == state.numel() * state.element_size()


CACHE_MISMATCHES = {
    # a cache filled by the same model at batch 2, reused at batch 3: shape RuntimeError deep in a layer
    "other-batch-size": dict(cache_model={}, cache_batch=2, batch=3, match="batch size 2"),
    # a cache from a model with fewer layers: IndexError from cache[i]
    "fewer-layers": dict(cache_model=dict(num_layers=1), cache_batch=2, batch=2, match="has 1 layer"),
    # a cache from a model with more layers: used without a word, its extra layers ignored
    "more-layers": dict(cache_model=dict(num_layers=3), cache_batch=2, batch=2, match="has 3 layer"),
    # a cache from a model with other kv heads
    "other-kv-heads": dict(cache_model=dict(num_kv_heads=1), cache_batch=2, batch=2, match="holds 1 kv heads"),
    # an empty cache built for another layer count
    "empty-cache-other-layers": dict(cache_model=None, cache_batch=None, batch=2, match="has 5 layer"),
}


@pytest.mark.parametrize("preset_name", ["fox-pro-tiny", "transformer-pro-tiny", "linear-pro-tiny"])
@pytest.mark.parametrize("case", list(CACHE_MISMATCHES), ids=list(CACHE_MISMATCHES))
def test_a_cache_that_does_not_fit_the_model_or_batch_is_a_named_error(preset_name, case):
    spec = CACHE_MISMATCHES[case]
    model = make_model(preset_name)
    if spec["cache_model"] is None:
        cache = FoxCache([DenseKV() for _ in range(5)])
    else:
        other = make_model(preset_name, **spec["cache_model"])
        cache = other(tokens(spec["cache_batch"], 4), use_cache=True).cache
    seen = cache.get_seq_length()
    with pytest.raises(ValueError, match=f"past_key_values.*{spec['match']}"):
        model(tokens(spec["batch"], 3), past_key_values=cache, use_cache=True)
    assert cache.get_seq_length() == seen  # refused before touching it
