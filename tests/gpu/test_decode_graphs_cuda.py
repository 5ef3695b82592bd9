"""CUDA-graph decoding (models.kvcache.graphs) against the eager path on the GPU: the same greedy tokens for
FoX with and without eviction, the Transformer baselines and the recurrent baseline, at batch 1 and in a
left-padded Hugging Face batch; a fixed number of captures however many steps; seeded sampling.
Skipped without CUDA: `python -m pytest -q tests/gpu/test_decode_graphs_cuda.py`."""
import dataclasses

import pytest
import torch

from foxformer.infer import GenerationConfig, stream_tokens
from foxformer.infer.generation import _new_cache
from foxformer.models.calls import cache_of
from foxformer.models import FoxForCausalLM, get_preset
from foxformer.models.kvcache import PAGE_SIZE, EvictionPolicy
from foxformer.models.modeling import CACHE_FIELD

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

CASES = {  # preset, overrides, evict_eps
    "fox-pro": ("fox-pro-tiny", dict(num_kv_heads=2), None),
    "fox-pro-evicting": ("fox-pro-tiny", dict(num_kv_heads=2), 1e-4),
    "transformer-llama": ("transformer-llama-tiny", {}, None),
    "transformer-pro": ("transformer-pro-tiny", {}, None),
    "linear-pro": ("linear-pro-tiny", {}, None),
}


def _model(name):
    preset, overrides, eps = CASES[name]
    torch.manual_seed(0)
    model = FoxForCausalLM(get_preset(preset, vocab_size=512, **overrides)).cuda().bfloat16().eval()
    for layer in model.model.layers:  # heads that forget within tokens next to ones that keep everything
        gate = layer.attn.fgate
        if gate is not None and gate.kind == "data_dependent":
            gate.proj.bias.data.copy_(torch.tensor([-2.0, -3.0, -1.0, 6.0]))
    return model, eps


def _stream(model, prompt, decode, **options):
    state = {}
    tokens = torch.stack(list(stream_tokens(model, prompt, GenerationConfig(decode=decode, **options), state)), 1)
    return tokens, state["cache"]


@pytest.mark.parametrize("name", list(CASES), ids=list(CASES))
@pytest.mark.parametrize("batch", [1, 4])
def test_graphs_give_the_eager_greedy_tokens_with_few_captures(name, batch):
    model, eps = _model(name)
    prompt = torch.randint(0, 512, (batch, 700), device="cuda", generator=torch.Generator("cuda").manual_seed(batch))
    opts = dict(max_new_tokens=120, temperature=0, evict_eps=eps)
    eager, _ = _stream(model, prompt, "eager", **opts)
    graphs, cache = _stream(model, prompt, "graphs", **opts)
    assert torch.equal(graphs, eager)
    assert cache.decode_note is None
    # one graph; an evicting cache has a second for the steps that scan for dead keys, and captures both anew
    # when its page pool grows
    assert cache.graphs.captures == 1 if eps is None else 2 <= cache.graphs.captures <= 8, cache.graphs.captures


@pytest.mark.parametrize("name", ["fox-pro", "fox-pro-evicting"])
def test_the_stream_hands_out_host_tokens_of_a_synced_token_by_token_loop(name):
    """stream_tokens queues step t + 1 before it copies token t out (one pinned copy and an event a token): the
    tokens it yields are host tensors, equal to a loop that waits for each token before the next step."""
    model, eps = _model(name)
    prompt = torch.randint(0, 512, (2, 300), device="cuda", generator=torch.Generator("cuda").manual_seed(5))
    cfg = GenerationConfig(max_new_tokens=60, temperature=0, evict_eps=eps)
    got = list(stream_tokens(model, prompt, cfg))
    assert all(t.device.type == "cpu" for t in got)
    cache = _new_cache(model, dataclasses.replace(cfg, decode="eager"), 300 + 59)   # the stream's cache, eager
    out = model(input_ids=prompt, use_cache=True, logits_to_keep=1, **{CACHE_FIELD: cache})
    ref = []
    for _ in range(60):
        nxt = out.logits[:, -1].float().argmax(-1)
        ref.append(nxt.cpu())
        out = model(input_ids=nxt[:, None], use_cache=True, logits_to_keep=1, **{CACHE_FIELD: cache_of(out)})
    assert torch.equal(torch.stack(got, 1), torch.stack(ref, 1))


def test_seeded_sampling_is_the_same_through_graphs():
    model, _ = _model("fox-pro")
    prompt = torch.randint(0, 512, (3, 100), device="cuda")
    opts = dict(max_new_tokens=50, temperature=1.2, top_k=50, top_p=0.9, seed=3)
    assert torch.equal(_stream(model, prompt, "graphs", **opts)[0], _stream(model, prompt, "eager", **opts)[0])


@pytest.mark.parametrize("name", ["fox-pro", "fox-pro-evicting", "transformer-llama"])
def test_hf_generate_left_padded_batch_through_graphs(name):
    model, eps = _model(name)
    model.config.evict_eps = eps
    lengths = [300, 40, 170]
    ids = torch.zeros(3, 300, dtype=torch.long, device="cuda")
    mask = torch.zeros_like(ids)
    for i, n in enumerate(lengths):
        ids[i, 300 - n:] = torch.randint(0, 512, (n,), device="cuda")
        mask[i, 300 - n:] = 1
    seqs = {}
    for decode in ("eager", "graphs"):
        cache = model.model.new_cache("config", total_len=300 + 63, decode=decode)
        seqs[decode] = model.generate(ids, attention_mask=mask, max_new_tokens=64, do_sample=False, pad_token_id=0,
                                      **{CACHE_FIELD: cache})
    assert torch.equal(seqs["graphs"], seqs["eager"])


def test_hf_generate_builds_a_cache_that_replays_graphs():
    model, _ = _model("fox-pro")
    out = model.generate(torch.randint(0, 512, (1, 50), device="cuda"), max_new_tokens=40, do_sample=False,
                         pad_token_id=0, return_dict_in_generate=True)
    cache = out[CACHE_FIELD]
    assert cache.graphs is not None and cache.graphs.captures >= 1 and cache.decode_note is None


def test_hf_generate_with_the_static_cache_implementation_replays_graphs_giving_the_eager_tokens():
    """cache_implementation="static" asks for what transformers' StaticCache is for: fixed-shape steps replayed as
    CUDA graphs ("graphs"); no note (and so no warning) where they can."""
    model, _ = _model("fox-pro")
    ids = torch.randint(0, 512, (2, 50), device="cuda")
    eager = model.generate(ids, max_new_tokens=40, do_sample=False, pad_token_id=0,
                           **{CACHE_FIELD: model.model.new_cache(total_len=50 + 39, decode="eager")})
    out = model.generate(ids, max_new_tokens=40, do_sample=False, pad_token_id=0, cache_implementation="static",
                         return_dict_in_generate=True)
    cache = out[CACHE_FIELD]
    assert torch.equal(out.sequences, eager)
    assert cache.decode == "graphs" and cache.graphs.captures >= 1 and cache.decode_note is None


@torch.no_grad()
def test_a_cache_that_grows_while_decoding_is_captured_again():
    """A cache built without a length hint doubles its buffers at 512 entries: the step is captured again, in a
    fresh memory pool (reusing the pool of the dropped graphs tripped the allocator), and replays what eager
    decoding computes."""
    model, _ = _model("fox-pro")
    ids = torch.randint(0, 512, (2, 530), device="cuda", generator=torch.Generator("cuda").manual_seed(5))
    logits = {}
    for decode in ("eager", "static", "graphs"):
        cache = model.model.new_cache(decode=decode)
        parts = [model(ids[:, :500], cache=cache, use_cache=True).logits[:, -1:]]
        parts += [model(ids[:, t:t + 1], cache=cache, use_cache=True).logits for t in range(500, 530)]
        logits[decode] = torch.cat(parts, 1).float()
    assert cache.graphs.captures == 2, cache.graphs.captures
    assert torch.equal(logits["graphs"], logits["static"])  # the same step, replayed
    torch.testing.assert_close(logits["graphs"], logits["eager"], atol=3e-2, rtol=0)


@torch.no_grad()
def test_a_huge_explicit_n_without_a_hint_grows_the_page_tables_and_is_captured_again():
    """evict_max_len=10**11 sized each page table for N (GBs); without a length hint the tables now double as pages
    are mapped (at 128 and 256 positions here): each growth moves the storage, so the step is captured again and
    replays what the static step computes."""
    model, eps = _model("fox-pro-evicting")
    ids = torch.randint(0, 512, (2, 300), device="cuda", generator=torch.Generator("cuda").manual_seed(6))
    logits = {}
    for decode in ("eager", "static", "graphs"):
        cache = model.model.new_cache(EvictionPolicy(eps, max_len=10**11), decode=decode)
        parts = [model(ids[:, :100], cache=cache, use_cache=True).logits[:, -1:]]
        parts += [model(ids[:, t:t + 1], cache=cache, use_cache=True).logits for t in range(100, 300)]
        logits[decode] = torch.cat(parts, 1).float()
        assert all(layer.pages.table.shape[2] <= 2 * -(-300 // PAGE_SIZE) for layer in cache.layers)
    assert cache.decode_note is None and cache.graphs.captures >= 4, cache.graphs.captures
    assert torch.equal(logits["graphs"], logits["static"])
    torch.testing.assert_close(logits["graphs"], logits["eager"], atol=3e-2, rtol=0)


@pytest.mark.parametrize("name", ["fox-pro", "transformer-pro", "linear-pro"])
def test_the_fused_input_projections_match_the_separate_ones_in_bf16(name):
    """A one-token step's input projections run as one bf16 product (models/fused_linear.py): each output
    within bf16 rounding of its own layer's, and the step's logits within that of a step that runs them one by
    one (the same cache, refilled)."""
    model, _ = _model(name)
    attn = model.model.layers[0].attn
    linears = list(attn._input_linears().values())
    x = torch.randn(2, 1, model.config.hidden_size, device="cuda", dtype=torch.bfloat16)
    cache = model.model.new_cache(None)
    with torch.no_grad():
        for got, lin in zip(cache[0].fused_inputs(x, linears), linears):
            torch.testing.assert_close(got, lin(x), rtol=2e-2, atol=2e-2)
        prompt = torch.randint(0, 512, (2, 40), device="cuda")
        model(prompt[:, :39], cache=cache)
        fused = model(prompt[:, 39:], cache=cache).logits
        with torch.enable_grad():  # the fused path is for steps without gradients: this one runs them apart
            cache = model.model.new_cache(None)
            model(prompt[:, :39], cache=cache)
            apart = model(prompt[:, 39:], cache=cache).logits
    torch.testing.assert_close(fused, apart.detach(), rtol=3e-2, atol=3e-2)


def test_streams_with_different_gate_shifts_alternate_through_graphs():
    """A stream holds its fgate_bias_shift only during its own forwards and puts the same shift tensors back each
    time, so the graphs it captured read its shift on every replay: a plain and a shifted stream consumed side by
    side (zip) each give their own eager tokens, and the model keeps no shift afterwards."""
    model, _ = _model("fox-pro")
    prompt = torch.randint(0, 512, (2, 400), device="cuda", generator=torch.Generator("cuda").manual_seed(11))
    opts = dict(max_new_tokens=80, temperature=0)
    plain_ref, _ = _stream(model, prompt, "eager", **opts)
    shifted_ref, _ = _stream(model, prompt, "eager", fgate_bias_shift=4.0, **opts)
    assert not torch.equal(plain_ref, shifted_ref)  # the shift moves these heads' memory enough to change tokens
    plain = stream_tokens(model, prompt, GenerationConfig(decode="graphs", **opts))
    shifted = stream_tokens(model, prompt, GenerationConfig(decode="graphs", fgate_bias_shift=4.0, **opts))
    both = [(a, b) for a, b in zip(plain, shifted)]
    assert torch.equal(torch.stack([a for a, _ in both], 1), plain_ref)
    assert torch.equal(torch.stack([b for _, b in both], 1), shifted_ref)
    assert all(layer.attn.fgate.bias_shift is None for layer in model.model.layers)
