"""The recurrent baseline (attention="linear"): what the shared preset tests in conftest do not cover."""
import pytest
import torch

from foxformer.infer.bias_shift import set_fgate_bias_shift
from foxformer.models import EvictionPolicy
from foxformer.models.kvcache import RecurrentState
from foxformer.models.modeling import CACHE_FIELD

from .conftest import make_model, tokens


def test_cache_holds_a_fixed_size_state_not_keys():
    model = make_model("linear-pro-tiny")
    cfg = model.config
    for length in (5, 60):
        cache = model(tokens(2, length), use_cache=True).cache
        for layer in cache.layers:
            assert isinstance(layer, RecurrentState)
            assert layer.state.shape == (2, cfg.num_heads, cfg.head_dim, cfg.head_dim)
            assert layer.k_last.shape == (2, cfg.num_kv_heads, cfg.head_dim)  # the kv-shift state
        mem = cache.memory_bytes()
        assert mem["allocated"] == cfg.num_layers * 2 * cfg.num_heads * cfg.head_dim ** 2 * 8
        assert mem["total_keys"] == 0


@pytest.mark.parametrize("filled_by,used_by,match", [("fox-pro-tiny", "linear-pro-tiny", "holds keys"),
                                                     ("linear-pro-tiny", "fox-pro-tiny", "holds a recurrent state")])
def test_a_cache_of_the_other_attention_kind_is_a_named_error(filled_by, used_by, match):
    cache = make_model(filled_by)(tokens(2, 4), use_cache=True).cache
    with pytest.raises(ValueError, match=f"past_key_values: the FoxCache {match}"):
        make_model(used_by)(tokens(2, 3), past_key_values=cache, use_cache=True)


def test_eviction_is_refused():
    model = make_model("linear-pro-tiny")
    with pytest.raises(ValueError, match="evict_eps: KV eviction needs keys"):
        model.model.new_cache(EvictionPolicy(1e-3))


def test_padding_tokens_do_not_reach_the_state():
    """Whatever the left padding holds, the real tokens' logits and the state after them are the same."""
    model = make_model("linear-pro-tiny")
    ids = tokens(2, 10)
    mask = torch.ones_like(ids)
    mask[:, :4] = 0
    other = ids.clone()
    other[:, :4] = tokens(2, 4, seed=9)
    a, b = (model(x, attention_mask=mask, use_cache=True) for x in (ids, other))
    torch.testing.assert_close(a.logits[:, 4:], b.logits[:, 4:], rtol=1e-12, atol=1e-12)
    for la, lb in zip(a.cache.layers, b.cache.layers):
        torch.testing.assert_close(la.state, lb.state, rtol=1e-12, atol=1e-12)


def test_generate_with_chunked_prefill_and_left_padding():
    model = make_model("linear-pro-tiny")
    prompt = tokens(2, 9)
    mask = torch.ones_like(prompt)
    mask[1, :5] = 0  # row 1's first chunk is all padding
    ref = model.generate(prompt, attention_mask=mask, max_new_tokens=5, do_sample=False, pad_token_id=0)
    out = model.generate(prompt, attention_mask=mask, max_new_tokens=5, do_sample=False, pad_token_id=0,
                         prefill_chunk_size=4, **{CACHE_FIELD: model.model.new_cache()})
    assert torch.equal(out, ref)
    alone = model.generate(prompt[1:, 5:], max_new_tokens=5, do_sample=False, pad_token_id=0)
    assert torch.equal(out[1:, 5:], alone)


def test_bias_shift_changes_the_model_and_decoding_still_matches():
    model = make_model("linear-pro-tiny")
    ids = tokens(1, 10)
    before = model(ids).logits
    set_fgate_bias_shift(model, 2.0)
    full = model(ids).logits
    assert not torch.allclose(full, before)
    out = model(ids[:, :3], use_cache=True)
    parts = [out.logits] + [model(ids[:, t:t + 1], past_key_values=out.cache).logits for t in range(3, 10)]
    torch.testing.assert_close(torch.cat(parts, 1), full, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("field", ["prune_eps", "evict_eps"])
def test_pruning_or_eviction_set_on_a_built_model_is_refused_not_ignored(field):
    """FoxConfig refuses them for attention='linear', but a config edited after the model was built is not
    validated again: the forward must not run as if pruning or eviction were in effect."""
    model = make_model("linear-pro-tiny")
    setattr(model.config, field, 1e-3)
    with pytest.raises(ValueError, match=f"{field}: .*attention='linear'"):
        model(tokens(1, 8))
    setattr(model.config, field, None)
    model(tokens(1, 8))


# Relative logit error allowed under CPU autocast (measured: 1.6e-2 bf16, 1.7e-3 fp16; FoX Pro: 8e-3, 9e-4).
AUTOCAST_TOL = {torch.bfloat16: 3e-2, torch.float16: 4e-3}


@pytest.mark.parametrize("dtype", list(AUTOCAST_TOL), ids=str)
def test_autocast_matches_the_fp64_model(dtype):
    """T = 200 spans several of the op's chunks; the op's matmuls run in ``dtype`` under autocast."""
    model = make_model("linear-pro-tiny")
    ids = tokens(2, 200)
    ref = model(ids).logits
    model = model.float().train()
    with torch.autocast("cpu", dtype=dtype):
        out = model(ids, labels=ids)
    assert torch.isfinite(out.logits).all()
    # Logits are compared up to their mean over the vocabulary, which the softmax ignores.
    got, ref = (x.double() - x.double().mean(-1, keepdim=True) for x in (out.logits, ref))
    assert ((got - ref).norm() / ref.norm()).item() < AUTOCAST_TOL[dtype]
    out.loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())


def _cuda_autocast_normalize(normalize):
    """F.normalize as CUDA autocast runs it: ``norm`` is on CUDA autocast's fp32 list (not on the CPU's),
    so x / ||x|| comes out fp32 for a bf16 / fp16 x (seen on an H200, torch 2.11, where F.rms_norm stays
    bf16): the linear layer handed the op fp32 q, k next to a bf16 v."""
    def patched(x, p=2.0, dim=1, eps=1e-12, out=None):
        if torch.is_autocast_enabled("cpu") and x.dtype in (torch.float16, torch.bfloat16):
            return x / x.float().norm(p, dim, keepdim=True).clamp_min(eps)
        return normalize(x, p, dim, eps, out)
    return patched


@pytest.mark.parametrize("dtype", list(AUTOCAST_TOL), ids=str)
@pytest.mark.parametrize("preset", ["linear-pro-tiny", "fox-pro-tiny"])
def test_autocast_with_cuda_fp32_norm_runs_training_and_cached_decoding(monkeypatch, preset, dtype):
    """Under CUDA autocast the linear layer's q, k normalisation returns fp32 while v stays in the autocast
    dtype: the layer must hand the op one dtype (as the FoX path, which the patch leaves untouched, does),
    for training and for prefill + decoding with a cache (the recurrent state)."""
    monkeypatch.setattr(torch.nn.functional, "normalize", _cuda_autocast_normalize(torch.nn.functional.normalize))
    model = make_model(preset).float()
    ids = tokens(2, 70)
    ref = model(ids).logits
    with torch.autocast("cpu", dtype=dtype):
        out = model.train()(ids, labels=ids)
        out.loss.backward()
        assert all(torch.isfinite(p.grad).all() for p in model.parameters())
        model.eval()
        with torch.no_grad():
            pre = model(ids[:, :60], use_cache=True)
            steps = [pre.logits] + [model(ids[:, t:t + 1], past_key_values=pre.cache).logits for t in range(60, 70)]
    got = torch.cat(steps, 1).double()
    got, ref = (x - x.mean(-1, keepdim=True) for x in (got, ref.double()))
    assert ((got - ref).norm() / ref.norm()).item() < AUTOCAST_TOL[dtype]
