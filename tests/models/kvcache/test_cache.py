"""Token-by-token decoding and chunked prefill reproduce the logits of one full forward pass."""
import re

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


@pytest.mark.parametrize("bad", ["100", 1.5, -5, float("nan"), True], ids=["str", "float", "negative", "nan", "bool"])
def test_a_total_len_that_is_no_length_is_refused_by_name(bad):
    """new_cache took '100' and 1.5 as 100 and 1 and -5 as a length, and failed on NaN inside int()."""
    model = make_model("fox-llama-tiny")
    cache = model.model.new_cache()
    for build in (lambda: model.model.new_cache(total_len=bad), lambda: cache.reserve(bad)):
        with pytest.raises(ValueError, match=r"total_len: expected the number of tokens the cache will be fed, an "
                                             r"integer >= 0 \(None or -1 where it is not known\), got "):
            build()


def test_a_total_len_not_known_sizes_nothing_and_a_known_one_sizes_storage():
    """-1 is Hugging Face's max_length - 1 of a generation without max_length, and reads as None; 0 is a length
    (nothing fed back)."""
    import numpy as np

    from foxformer.models.kvcache.cache import check_total_len

    model = make_model("fox-llama-tiny")
    hints = {repr(n): {layer.capacity_hint for layer in model.model.new_cache(total_len=n).layers}
             for n in (None, -1, 0, 12, np.int64(12))}
    assert hints == {"None": {0}, "-1": {0}, "0": {0}, "12": {12}, repr(np.int64(12)): {12}}
    assert check_total_len(-1) is None and type(check_total_len(np.int64(5))) is int
    cache = model.model.new_cache()
    cache.reserve(-1)  # not known: left as it was
    assert {layer.capacity_hint for layer in cache.layers} == {0}
    out = model.generate(inputs_embeds=model.get_input_embeddings()(tokens(1, 3)), max_new_tokens=1,
                         do_sample=False, pad_token_id=0)
    assert out.shape == (1, 1)


def test_generate_from_inputs_embeds_sizes_the_cache_for_the_embedded_prompt_too(monkeypatch):
    """transformers' max_length counts no prompt given as inputs_embeds alone; the cache is fed that prompt and
    the new tokens but the last (it was sized for the new tokens only, and the eviction bound's N with it)."""
    model = make_model("fox-llama-tiny")
    asked = []
    new_cache = model.model.new_cache
    monkeypatch.setattr(model.model, "new_cache", lambda **kw: asked.append(kw["total_len"]) or new_cache(**kw))
    for new in (1, 4):
        model.generate(inputs_embeds=model.get_input_embeddings()(tokens(1, 7)), max_new_tokens=new,
                       do_sample=False, pad_token_id=0)
    model.generate(tokens(1, 7), max_new_tokens=4, do_sample=False, pad_token_id=0)
    assert asked == [7, 10, 10]


def _three_rows():
    model = make_model("fox-llama-tiny")
    ids = tokens(3, 6)
    return model, ids, model(ids[:, :5], use_cache=True).cache


@pytest.mark.parametrize("index,error,said", [
    (torch.tensor([0.0, 1.0]), TypeError, "must be a tensor of int64 (or int32) row indices, got dtype torch.float32"),
    (torch.tensor([True, False, True]), TypeError, "got dtype torch.bool"),
    ([0, 1], TypeError, "got list"),
    (torch.tensor([[0, 1]]), ValueError, "must be 1-D (one row index per row kept), got shape (1, 2)"),
    (torch.tensor([0, 3]), ValueError, "holds 3, and the cache holds 3 row(s): each index must be in [0, 3)"),
    (torch.tensor([-1, 0]), ValueError, "holds -1, and the cache holds 3 row(s)"),
], ids=["float", "bool", "list", "2-D", "past-the-batch", "negative"])
def test_reorder_cache_refuses_indices_that_are_no_rows_by_name(index, error, said):
    """torch's own errors ("index out of range in self", on CUDA a device-side assert) said nothing of beam_idx."""
    _, _, cache = _three_rows()
    with pytest.raises(error, match=f"^reorder_cache: beam_idx .*{re.escape(said)}"):
        cache.reorder_cache(index)
    assert cache.batch_size == 3  # untouched


def test_reorder_cache_keeps_the_rows_asked_for():
    model, ids, cache = _three_rows()
    cache.reorder_cache(torch.tensor([2, 2, 0], dtype=torch.int32))
    rows = ids[[2, 2, 0]]
    step = model(rows[:, 5:6], past_key_values=cache).logits[:, -1]
    torch.testing.assert_close(step, model(rows).logits[:, -1], rtol=1e-9, atol=1e-9)


def test_reorder_cache_reads_the_indices_only_where_the_ops_read_values(monkeypatch):
    """Every beam-search step reorders: on CUDA the range check would be a device sync a step, so it follows the
    ops' value checks (FOXFORMER_CHECK_VALUES=1); unchecked, torch's own error is what remains."""
    import foxformer.models.kvcache.cache as cache_module

    _, _, cache = _three_rows()
    read = []
    monkeypatch.setattr(cache_module, "values_checked", lambda x: read.append(x) or False)
    with pytest.raises(IndexError):
        cache.reorder_cache(torch.tensor([0, 3]))
    assert len(read) == 1
