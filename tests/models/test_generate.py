"""generate: greedy equals a hand-written greedy loop; left-padded batches equal unpadded rows."""
import re

import pytest
import torch
from transformers import GenerationConfig

from .conftest import VOCAB, make_model, tokens


def _greedy(model, ids, steps):
    for _ in range(steps):
        nxt = model(ids).logits[:, -1].argmax(-1, keepdim=True)
        ids = torch.cat([ids, nxt], 1)
    return ids


def test_greedy_matches_manual_loop(preset):
    model = make_model(preset)
    prompt = tokens(2, 6)
    out = model.generate(prompt, max_new_tokens=8, do_sample=False, pad_token_id=0)
    assert torch.equal(out, _greedy(model, prompt, 8))


def test_sampling_runs_and_is_seeded():
    model = make_model("fox-pro-tiny")
    prompt = tokens(2, 5)
    runs = []
    for _ in range(2):
        torch.manual_seed(123)
        runs.append(model.generate(prompt, max_new_tokens=6, do_sample=True, top_k=20, temperature=1.3,
                                   pad_token_id=0))
    assert runs[0].shape == (2, 11) and torch.equal(runs[0], runs[1])
    assert torch.equal(runs[0][:, :5], prompt)


def test_left_padded_batch_equals_unpadded_rows(preset):
    model = make_model(preset)
    rows = [tokens(1, 9, seed=3)[0], tokens(1, 4, seed=4)[0], tokens(1, 6, seed=5)[0]]
    width = max(len(r) for r in rows)
    pad = 0
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, r in enumerate(rows):
        ids[i, width - len(r):] = r
        mask[i, width - len(r):] = 1
    batch = model.generate(ids, attention_mask=mask, max_new_tokens=7, do_sample=False, pad_token_id=pad)
    for i, r in enumerate(rows):
        single = model.generate(r[None], max_new_tokens=7, do_sample=False, pad_token_id=pad)
        assert torch.equal(batch[i, width:], single[0, len(r):]), f"row {i}"


def test_left_padded_forward_logits_match(preset):
    model = make_model(preset)
    row = tokens(1, 5, seed=7)
    padded = torch.cat([torch.full((1, 3), 11), row], 1)
    mask = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 1]])
    got = model(padded, attention_mask=mask).logits[:, 3:]
    torch.testing.assert_close(got, model(row).logits, rtol=1e-9, atol=1e-9)


def test_generate_with_chunked_prefill_and_left_padding():
    from foxformer.models.modeling import CACHE_FIELD  # the name this transformers version's generate uses

    model = make_model("transformer-pro-tiny")
    prompt = tokens(2, 9)
    mask = torch.ones_like(prompt)
    mask[1, :3] = 0
    ref = model.generate(prompt, attention_mask=mask, max_new_tokens=5, do_sample=False, pad_token_id=0)
    for m in (mask, None):
        out = model.generate(prompt, attention_mask=m, max_new_tokens=5, do_sample=False, pad_token_id=0,
                             prefill_chunk_size=4, **{CACHE_FIELD: model.model.new_cache()})
        expected = ref if m is not None else model.generate(prompt, max_new_tokens=5, do_sample=False,
                                                            pad_token_id=0)
        assert torch.equal(out, expected)


def test_chunked_prefill_without_passing_a_cache():
    """generate(prefill_chunk_size=...) on its own ended in transformers' 'Cannot use prefill chunking
    without a cache' (the model builds its FoxCache in forward, too late for chunking): generate must set
    one up, and chunking must not change the output."""
    model = make_model("fox-pro-tiny")
    prompt = tokens(2, 11)
    mask = torch.ones_like(prompt)
    mask[1, :5] = 0  # row 1's first chunk is all padding
    for m in (mask, None):
        ref = model.generate(prompt, attention_mask=m, max_new_tokens=5, do_sample=False, pad_token_id=0)
        out = model.generate(prompt, attention_mask=m, max_new_tokens=5, do_sample=False, pad_token_id=0,
                             prefill_chunk_size=4)
        assert torch.equal(out, ref)


UNSUPPORTED = {"prompt-lookup": {"prompt_lookup_num_tokens": 3},
               "assistant-early-exit": {"assistant_early_exit": 1},
               "attentions": {"output_attentions": True, "return_dict_in_generate": True},
               "offloaded-static-cache": {"cache_implementation": "offloaded_static"},
               "quantized-cache": {"cache_implementation": "quantized"}}


@pytest.mark.parametrize("case", list(UNSUPPORTED), ids=list(UNSUPPORTED))
def test_hf_generate_options_foxformer_cannot_honour_are_refused(case):
    """They crashed inside transformers (AttributeError on FoxCache or on the output) or were ignored."""
    model = make_model("fox-pro-tiny")
    option = next(iter(UNSUPPORTED[case]))
    with pytest.raises(ValueError, match=f"generate: {option}="):
        model.generate(tokens(1, 6), max_new_tokens=3, do_sample=False, **UNSUPPORTED[case])


@pytest.mark.parametrize("passed", [{"max_cache_len": 4}, {"max_cache_len": 64, "cache_implementation": "static"},
                                    {"generation_config": GenerationConfig(max_cache_len=64, max_new_tokens=3)}],
                         ids=["keyword", "beside-static", "in-generation-config"])
def test_max_cache_len_is_refused_as_there_is_no_cache_to_size(passed):
    """max_cache_len pre-sizes transformers' static cache for later calls; FoxCache is built for each call, so it
    was ignored: in silence beside cache_implementation="static" (even a length smaller than the call's)."""
    model = make_model("fox-pro-tiny")
    size = passed.get("max_cache_len") or passed["generation_config"].max_cache_len
    said = (f"generate: max_cache_len={size} sizes transformers' static cache ahead of later, longer calls, which "
            f"foxformer models do not keep: each generate call builds its own FoxCache, with storage for that call's "
            f"prompt and new tokens (max_length), so there is nothing to size; leave it out")
    with pytest.raises(ValueError, match=f"^{re.escape(said)}$"):
        model.generate(tokens(1, 6), max_new_tokens=3, do_sample=False, pad_token_id=0, **passed)


def test_the_dynamic_cache_implementation_is_the_models_own_growing_cache():
    """cache_implementation="dynamic" (transformers' DynamicCache, its default: one that grows as tokens come) was
    refused as "another cache implementation"; FoxCache is such a cache, so it runs on that and decodes the same."""
    from foxformer.models.modeling import CACHE_FIELD

    model = make_model("fox-pro-tiny")
    prompt = tokens(2, 6)
    plain = model.generate(prompt, max_new_tokens=5, do_sample=False, pad_token_id=0)
    out = model.generate(prompt, max_new_tokens=5, do_sample=False, pad_token_id=0, cache_implementation="dynamic",
                         return_dict_in_generate=True)
    assert torch.equal(out.sequences, plain) and type(getattr(out, CACHE_FIELD)).__name__ == "FoxCache"
    assert model.generation_config.cache_implementation is None  # the request held for that call only
    with pytest.raises(ValueError, match=r"generate: cache_implementation='offloaded' asks for another cache "
                                         r"implementation .* leave it out or pass one of 'dynamic', 'static' "
                                         r"\(FoxCache: the default, or one-token steps replayed as CUDA graphs\)$"):
        model.generate(prompt, max_new_tokens=2, do_sample=False, cache_implementation="offloaded")


def test_the_static_cache_implementation_decodes_the_same_and_says_why_the_cpu_replays_no_graphs(preset):
    """cache_implementation="static" (transformers' StaticCache: storage for max_length up front, fixed-shape steps
    compiled into CUDA graphs) was refused; FoxCache is preallocated, so it runs on that with its steps asked to replay
    CUDA graphs ("graphs"). The CPU has none: the steps run eagerly, giving the default's tokens, and say why."""
    from foxformer.models.modeling import CACHE_FIELD

    model = make_model(preset)
    prompt = tokens(3, 7)
    mask = torch.ones_like(prompt)
    mask[1, :4] = 0  # left padding
    for m in (None, mask):
        plain = model.generate(prompt, attention_mask=m, max_new_tokens=6, do_sample=False, pad_token_id=0)
        with pytest.warns(UserWarning, match="^decoding eagerly: CUDA graphs need a CUDA device$"):
            out = model.generate(prompt, attention_mask=m, max_new_tokens=6, do_sample=False, pad_token_id=0,
                                 cache_implementation="static", return_dict_in_generate=True)
        cache = getattr(out, CACHE_FIELD)
        assert torch.equal(out.sequences, plain)
        assert cache.decode == "graphs" and cache.decode_note == "decoding eagerly: CUDA graphs need a CUDA device"
    assert model.generation_config.cache_implementation is None  # the request held for that call only


def test_the_static_cache_implementation_without_compiling_runs_the_fixed_shape_step_uncaptured(preset):
    """disable_compile=True leaves transformers' StaticCache steps fixed-shape but eager: FoxCache's "static" mode,
    the step graphs would replay, runs on the CPU too (no warning: nothing was asked that it cannot do)."""
    import warnings

    from foxformer.models.modeling import CACHE_FIELD

    model = make_model(preset)
    prompt = tokens(2, 7)
    plain = model.generate(prompt, max_new_tokens=6, do_sample=False, pad_token_id=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = model.generate(prompt, max_new_tokens=6, do_sample=False, pad_token_id=0, cache_implementation="static",
                             disable_compile=True, return_dict_in_generate=True)
    cache = getattr(out, CACHE_FIELD)
    assert torch.equal(out.sequences, plain)
    assert cache.decode == "static" and cache.decode_note is None and cache.graphs.steps == 5
    assert cache.graphs.captures == 0


def test_the_static_cache_implementation_beside_a_cache_or_a_compile_config_is_as_in_transformers():
    """As for transformers' own caches: beside a cache passed in, refused (transformers' message); with a
    compile_config, transformers says it skips its compile (FoxCache is no compileable Cache) and the tokens stay."""
    from transformers import CompileConfig

    from foxformer.models.modeling import CACHE_FIELD

    model = make_model("fox-pro-tiny")
    prompt = tokens(2, 6)
    with pytest.raises(ValueError, match="Passing both `cache_implementation`"):
        model.generate(prompt, max_new_tokens=3, do_sample=False, pad_token_id=0, cache_implementation="static",
                       **{CACHE_FIELD: model.model.new_cache()})
    plain = model.generate(prompt, max_new_tokens=4, do_sample=False, pad_token_id=0)
    with pytest.warns(UserWarning, match="CUDA graphs need a CUDA device"):
        out = model.generate(prompt, max_new_tokens=4, do_sample=False, pad_token_id=0, cache_implementation="static",
                             compile_config=CompileConfig())
    assert torch.equal(out, plain)


def test_an_assistant_model_is_refused_before_transformers_reaches_the_cache():
    """transformers 5.25 no longer hands assistant_model over in model_kwargs, where the refusal looked: assisted
    decoding ran into an AttributeError on FoxCache (activate_past_recording)."""
    model = make_model("fox-pro-tiny")
    with pytest.raises(ValueError, match="generate: an assistant_model asks for assisted decoding"):
        model.generate(tokens(1, 6), max_new_tokens=3, do_sample=False, assistant_model=make_model("fox-pro-tiny"))


def test_generate_past_the_training_length_warns_once_per_length_naming_it():
    """Hugging Face generate ran past the length a model was trained on without a word (foxformer's generate warns):
    it says so where config.train_len records that length, and not within it; once per model and length, again for
    a longer generation only."""
    import warnings

    model = make_model("fox-pro-tiny", train_len=8)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        model.generate(tokens(1, 4), max_new_tokens=4, do_sample=False)  # 8 tokens: within
        assert said == []
        model.generate(tokens(1, 6), max_new_tokens=4, do_sample=False)
        model.generate(tokens(1, 6), max_new_tokens=4, do_sample=False)
        model.generate(tokens(1, 6), max_new_tokens=9, do_sample=False)
        model.generate(tokens(1, 6), max_new_tokens=5, do_sample=False)
        make_model("fox-pro-tiny").generate(tokens(1, 6), max_new_tokens=40, do_sample=False)  # length unknown
    assert [str(w.message) for w in said] == [
        f"generate: the prompt and new tokens may reach {total} tokens, {total - 8} past the 8 this model was trained "
        f"on (train_len); it runs on, but quality may drop past the trained length (FoX, without position embeddings, "
        f"degrades gracefully; a Transformer with RoPE, badly)" for total in (10, 15)]


@pytest.mark.parametrize("masked", [False, True], ids=["no-mask", "mask"])
def test_generate_on_an_empty_prompt_says_so_as_the_forward_does(masked):
    """A [1, 0] prompt was told "the cache already holds 0 tokens and the whole input is 0" and to pass a new cache,
    with no cache passed at all."""
    model = make_model("fox-pro-tiny")
    empty = torch.zeros(1, 0, dtype=torch.long)
    with pytest.raises(ValueError, match=re.escape("input_ids must hold at least one token in each of at least one "
                                                   "row, got shape (1, 0)")):
        model.generate(empty, attention_mask=empty if masked else None, max_new_tokens=2, do_sample=False,
                       pad_token_id=0)


def test_a_cache_passed_to_generate_must_hold_the_start_of_its_input():
    """A cache filled by an earlier generate and passed again with another, no longer, prompt: transformers sliced
    the input from a negative count of new tokens (a 10-token prompt on a 14-token cache fed its last 6 tokens on
    top of the old ones, a 14-token one all of them) and returned a continuation of neither. Continuing it with the
    whole sequence still works."""
    from foxformer.models.modeling import CACHE_FIELD

    model = make_model("fox-pro-tiny")
    cache = model.model.new_cache()
    first = model.generate(tokens(1, 10), max_new_tokens=5, do_sample=False, pad_token_id=0, **{CACHE_FIELD: cache})
    for length in (4, 10, 14):
        with pytest.raises(ValueError, match=f"the cache already holds 14 tokens and the whole input is {length}"):
            model.generate(tokens(1, length, seed=9), max_new_tokens=3, do_sample=False, pad_token_id=0,
                           **{CACHE_FIELD: cache})
    longer = torch.cat([first, tokens(1, 3, seed=5)], 1)
    assert torch.equal(model.generate(longer, max_new_tokens=3, do_sample=False, pad_token_id=0,
                                      **{CACHE_FIELD: cache}),
                       model.generate(longer, max_new_tokens=3, do_sample=False, pad_token_id=0))


EXPANDED = {"num-beams": (1, dict(num_beams=4), "num_beams=4", 4),
            "num-return-sequences": (1, dict(do_sample=True, num_return_sequences=3), "num_return_sequences=3", 3),
            "beams-and-fewer-returned": (1, dict(num_beams=3, num_return_sequences=2), "num_beams=3", 3),
            "two-prompts-num-beams": (2, dict(num_beams=2), "num_beams=2", 2)}


@pytest.mark.parametrize("preset", ["fox-pro-tiny", "linear-pro-tiny"])
@pytest.mark.parametrize("case", list(EXPANDED), ids=list(EXPANDED))
def test_a_cache_passed_beside_beams_or_returned_sequences_must_hold_the_repeated_rows(case, preset):
    """generate repeats each input row per beam (or returned sequence), and not a cache passed to it (as for
    transformers' own caches): one filled for the prompt rows alone was refused by the cache's own check, which said
    only that the batch sizes differ. Filled with the rows repeated, it continues them as generate's own cache."""
    from foxformer.models.modeling import CACHE_FIELD

    batch, options, option, n = EXPANDED[case]
    model = make_model(preset)
    prefix = tokens(batch, 6)
    whole = torch.cat([prefix, tokens(batch, 3, seed=5)], 1)
    opts = dict(max_new_tokens=4, pad_token_id=0, **options)
    said = (f"generate: {option} repeats each of the input's {batch} row(s) {n} times, to {batch * n} rows, but the "
            f"cache passed holds {batch} (generate does not repeat a cache passed to it): fill the cache with each "
            f"prompt row repeated (prompt.repeat_interleave({n}, dim=0)), or leave the cache out and let generate "
            f"build its own")
    with pytest.raises(ValueError, match=f"^{re.escape(said)}$"):
        model.generate(whole, **opts, **{CACHE_FIELD: getattr(model(prefix, use_cache=True), CACHE_FIELD)})
    cache = getattr(model(prefix.repeat_interleave(n, dim=0), use_cache=True), CACHE_FIELD)
    torch.manual_seed(0)
    continued = model.generate(whole, **opts, **{CACHE_FIELD: cache})
    torch.manual_seed(0)
    assert torch.equal(continued, model.generate(whole, **opts))


def test_generate_hands_hidden_state_requests_and_position_ids_to_the_forward():
    """prepare_inputs_for_generation kept only the ids, mask and cache: return_dict_in_generate's hidden_states were a
    tuple of None, and position_ids (extended by generate as it goes) were dropped for the mask's positions."""
    model = make_model("fox-llama-tiny", rope=True)
    with torch.no_grad():
        for layer in model.model.layers:  # sharper attention: RoPE's positions move the logits clearly
            layer.attn.q_proj.weight.mul_(20)
            layer.attn.k_proj.weight.mul_(20)
    prompt = tokens(2, 7)
    mask = torch.ones_like(prompt)
    mask[1, :2] = 0
    out = model.generate(prompt, attention_mask=mask, max_new_tokens=3, do_sample=False, pad_token_id=0,
                         return_dict_in_generate=True, output_hidden_states=True)
    full = model(out.sequences[:, :-1], attention_mask=torch.cat([mask, torch.ones(2, 2, dtype=mask.dtype)], 1),
                 output_hidden_states=True).hidden_states
    assert len(out.hidden_states) == 3
    for step, states in enumerate(out.hidden_states):
        assert len(states) == model.config.num_layers + 1
        at = slice(0, 7) if step == 0 else slice(6 + step, 7 + step)
        for got, want in zip(states, full, strict=True):
            torch.testing.assert_close(got[1:], want[1:, at], rtol=1e-7, atol=1e-7)  # row 0's padding: row 1
    spread = (mask.cumsum(-1) - 1).clamp(min=0) * 3  # not a shift: RoPE sees only differences
    got = model.generate(prompt, attention_mask=mask, position_ids=spread, max_new_tokens=4, do_sample=False,
                         pad_token_id=0, return_dict_in_generate=True, output_logits=True).logits
    seq, pos = prompt, spread
    for step in range(4):
        full_mask = torch.cat([mask, torch.ones(2, step, dtype=mask.dtype)], 1)
        logits = model(seq, attention_mask=full_mask, position_ids=pos).logits[:, -1]
        torch.testing.assert_close(got[step], logits.float())  # generate hands logits out in fp32
        seq = torch.cat([seq, logits.argmax(-1, keepdim=True)], 1)
        pos = torch.cat([pos, pos[:, -1:] + 1], 1)  # generate's extension of the positions passed
    assert (got[0] - model(prompt, attention_mask=mask).logits[:, -1].float()).abs().max() > 1e-2


def _paged_refusal(asked):
    return (f"{asked} asks for transformers' paged cache, which foxformer models do not support: FoX keeps its gate "
            f"sums and shift states in its own FoxCache, and the paged cache has no place for them; use generate "
            f"(cache_implementation left out or one of 'dynamic', 'static'), or foxformer's own paged KV cache with "
            f"eviction (FoxModel.new_cache, `foxformer generate`)")


def _batching_manager(model):
    from transformers import ContinuousBatchingConfig
    from transformers.generation.continuous_batching.continuous_api import ContinuousBatchingManager

    return ContinuousBatchingManager(model, GenerationConfig(eos_token_id=-1), ContinuousBatchingConfig())


def _batching_context(model):
    with model.continuous_batching_context_manager():
        pass


_BATCHING = "continuous batching (generate_batch, continuous_batching_context_manager, init_continuous_batching)"
PAGED = {
    "generate-cache_implementation": (
        lambda m: m.generate(tokens(2, 6), max_new_tokens=3, do_sample=False, pad_token_id=0,
                             cache_implementation="paged"),
        "generate: cache_implementation='paged' (continuous batching)"),
    "generation_config": (
        lambda m: m.generate(tokens(2, 6), generation_config=GenerationConfig(
            cache_implementation="paged", max_new_tokens=3, do_sample=False, pad_token_id=0)),
        "generate: cache_implementation='paged' (continuous batching)"),
    "generate_batch": (lambda m: m.generate_batch(tokens(2, 6).tolist(), max_new_tokens=3), _BATCHING),
    "init_continuous_batching": (lambda m: m.init_continuous_batching(), _BATCHING),
    "continuous_batching_context_manager": (_batching_context, _BATCHING),
    "ContinuousBatchingManager": (_batching_manager,
                                  "attn_implementation='paged|eager' (continuous batching's attention)"),
    "set_attn_implementation-eager": (lambda m: m.set_attn_implementation("paged|eager"),
                                      "attn_implementation='paged|eager' (continuous batching's attention)"),
    "set_attn_implementation-sdpa": (lambda m: m.set_attn_implementation("paged|sdpa"),
                                     "attn_implementation='paged|sdpa' (continuous batching's attention)"),
}


@pytest.mark.parametrize("entry", list(PAGED), ids=list(PAGED))
def test_every_way_into_transformers_paged_cache_is_refused_and_leaves_the_model_as_it_was(entry):
    """generate(cache_implementation="paged") switched to continuous batching before any check of ours; there, as in
    generate_batch, the forward's refusal was only logged by the batching thread: generate returned the prompts alone,
    generate_batch requests without tokens. init_continuous_batching (and a manager built by hand) switched the model to
    "paged|eager", which transformers accepts from any model and foxformer's attention ran as if not asked."""
    model = make_model("fox-pro-tiny")
    prompt = tokens(2, 6)
    plain = model.generate(prompt, max_new_tokens=4, do_sample=False, pad_token_id=0)
    call, asked = PAGED[entry]
    with pytest.raises(ValueError, match=f"^{re.escape(_paged_refusal(asked))}$"):
        call(model)
    assert model.config._attn_implementation == "eager" and model.generation_config.cache_implementation is None
    assert torch.equal(model.generate(prompt, max_new_tokens=4, do_sample=False, pad_token_id=0), plain)
    for cache in ("dynamic", "static"):  # static uncompiled: no CUDA here for the graphs it would replay
        out = model.generate(prompt, max_new_tokens=4, do_sample=False, pad_token_id=0, cache_implementation=cache,
                             disable_compile=True)
        assert torch.equal(out, plain), cache


@pytest.mark.parametrize("implementation", ["paged|eager", "paged|sdpa"])
def test_loading_with_paged_attention_is_refused(tmp_path, implementation):
    """transformers accepts attn_implementation="paged|eager" from any model: foxformer's attention read none of it,
    and the model loaded for continuous batching failed only there. "paged|sdpa" said sdpa was not supported yet."""
    from foxformer.models import FoxForCausalLM

    make_model("fox-pro-tiny").save_pretrained(tmp_path)
    asked = f"attn_implementation={implementation!r} (continuous batching's attention)"
    with pytest.raises(ValueError, match=f"^{re.escape(_paged_refusal(asked))}$"):
        FoxForCausalLM.from_pretrained(tmp_path, attn_implementation=implementation)
    assert FoxForCausalLM.from_pretrained(tmp_path, attn_implementation="eager").config._attn_implementation == "eager"


@pytest.mark.parametrize("implementation", ["sdpa", "flash_attention_2", "flex_attention", "kernels-community/flash-attn"])
def test_transformers_attention_implementations_are_refused_naming_attention_backend(tmp_path, implementation):
    """attn_implementation="sdpa" (or flash_attention_2, ...) ended in transformers' "does not support ... yet: please
    request support", with a Hub discussion URL built from the local folder's path; foxformer's attention is its own,
    its kernels picked by attention_backend. Refused in loading and in set_attn_implementation, the model unchanged."""
    from foxformer.models import FoxForCausalLM
    from foxformer.ops.forgetting_attn.checks import BACKENDS

    model = make_model("fox-pro-tiny")
    model.save_pretrained(tmp_path)
    said = (f"attn_implementation={implementation!r} picks among transformers' attention functions, which foxformer "
            f"models do not call: their attention is their own (Forgetting Attention's kernels, SDPA for softmax "
            f"attention); choose its kernels with attention_backend (one of {BACKENDS}) and leave "
            f"attn_implementation out")
    with pytest.raises(ValueError, match=f"^{re.escape(said)}$"):
        FoxForCausalLM.from_pretrained(tmp_path, attn_implementation=implementation)
    with pytest.raises(ValueError, match=f"^{re.escape(said)}$"):
        model.set_attn_implementation(implementation)
    assert model.config._attn_implementation == "eager"
    assert FoxForCausalLM.from_pretrained(tmp_path).config._attn_implementation == "eager"


def _left_padded(rows: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r) for r in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, r in enumerate(rows):
        ids[i, width - len(r):], mask[i, width - len(r):] = r, 1
    return ids, mask


def _unpadded(seq: torch.Tensor, mask_row: torch.Tensor) -> tuple[torch.Tensor, int]:
    """The row without its left padding, and where its prompt ends."""
    pad = int((mask_row == 0).sum())
    return seq[pad:], len(mask_row) - pad


BEAMS = {"beam3": dict(num_beams=3),
         "beam3-return3": dict(num_beams=3, num_return_sequences=3),
         "beam3-return3-early-stopping": dict(num_beams=3, num_return_sequences=3, early_stopping=True),
         "beam3-return2-eos": dict(num_beams=3, num_return_sequences=2, eos_token_id=1)}


@pytest.mark.parametrize("beams", list(BEAMS), ids=list(BEAMS))
@pytest.mark.parametrize("name", ["fox-pro-tiny", "transformer-pro-tiny", "linear-pro-tiny"])
def test_beam_scores_are_the_log_probs_of_a_forward_without_cache(name, beams):
    """Each beam's cache rows must follow it when beams are reordered: a beam decoding over another beam's
    keys scores tokens the full forward over its own sequence does not. length_penalty=0: the score is the plain
    sum of the new tokens' log-probs (up to the eos a finished beam ends on)."""
    model = make_model(name).float()
    ids, mask = _left_padded([tokens(1, 7, seed=3)[0], tokens(1, 4, seed=4)[0]])
    out = model.generate(ids, attention_mask=mask, max_new_tokens=8, do_sample=False, pad_token_id=0,
                         length_penalty=0.0, output_scores=True, return_dict_in_generate=True, **BEAMS[beams])
    per_prompt = out.sequences.shape[0] // ids.shape[0]
    assert per_prompt == BEAMS[beams].get("num_return_sequences", 1)
    for i, seq in enumerate(out.sequences):
        row, start = _unpadded(seq, mask[i // per_prompt])
        ends = (row[start:] == 1).nonzero()
        if "eos_token_id" in BEAMS[beams] and len(ends):
            row = row[:start + int(ends[0]) + 1]
        with torch.no_grad():
            log_probs = torch.log_softmax(model(row[None]).logits[0].double(), -1)
        want = log_probs[torch.arange(start - 1, len(row) - 1), row[start:]].sum()
        torch.testing.assert_close(out.sequences_scores[i].double(), want, rtol=0, atol=1e-4)


def test_sequences_sampled_per_prompt_each_see_their_own_cache():
    """num_return_sequences expands the cache per sequence: each sampled row's logits must be those of a
    forward without cache over that row (temperature 1 and top_k 0 leave the scores as the logits)."""
    model = make_model("fox-pro-tiny")
    ids, mask = _left_padded([tokens(1, 7, seed=3)[0], tokens(1, 4, seed=4)[0]])
    torch.manual_seed(0)
    out = model.generate(ids, attention_mask=mask, max_new_tokens=5, do_sample=True, num_return_sequences=3,
                         temperature=1.0, top_k=0, pad_token_id=0, output_scores=True, output_logits=True,
                         return_dict_in_generate=True)
    assert out.sequences.shape[0] == 6 and len(set(map(tuple, out.sequences.tolist()))) > 2
    for i, seq in enumerate(out.sequences):
        row, start = _unpadded(seq, mask[i // 3])
        want = model(row[None, :-1]).logits[0, start - 1:].float()
        for step in range(5):
            torch.testing.assert_close(out.logits[step][i], want[step])
            torch.testing.assert_close(out.scores[step][i], want[step])


def test_greedy_without_a_cache_equals_greedy_with_one(preset):
    model = make_model(preset)
    ids, mask = _left_padded([tokens(1, 7, seed=3)[0], tokens(1, 4, seed=4)[0]])
    opts = dict(attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0)
    assert torch.equal(model.generate(ids, use_cache=False, **opts), model.generate(ids, **opts))


def _from_the_hub(model, **kwargs):
    """What the Hub's generate.py of a mode transformers moved there does: generate with its own loop."""
    from transformers import GenerationMixin

    def loop(*args, **kw):
        raise AssertionError("the mode must be refused before its decoding loop")

    return GenerationMixin.generate(model, custom_generate=loop, **kwargs)


HUB_ENTRIES = {"asked-plainly": lambda model, **kw: model.generate(**kw),
               "with-trust-remote-code": lambda model, **kw: model.generate(trust_remote_code=True, **kw),
               "through-custom-generate": _from_the_hub}
HUB_MODES = {"contrastive": (dict(penalty_alpha=0.6, top_k=4), "penalty_alpha with top_k > 1 asks for contrastive "
                             "search", "leave penalty_alpha out (greedy)"),
             "dola": (dict(dola_layers="low"), "dola_layers asks for DoLa decoding (contrasting early layers' logits "
                      "with the last's)", "leave dola_layers out (greedy, or sampling with do_sample=True)"),
             "dola-beside-beams": (dict(dola_layers="high", num_beams=2), "dola_layers asks for DoLa decoding "
                                   "(contrasting early layers' logits with the last's)", "leave dola_layers out"),
             "group-beams": (dict(num_beams=4, num_beam_groups=2, diversity_penalty=1.0),
                             "num_beam_groups with diversity_penalty asks for group (diverse) beam search",
                             "leave num_beam_groups and diversity_penalty out"),
             "groups-without-beams": (dict(num_beam_groups=2), "num_beam_groups asks for group (diverse) beam search",
                                      "leave num_beam_groups and diversity_penalty out"),
             "diversity-without-groups": (dict(num_beams=4, diversity_penalty=1.0), "diversity_penalty asks for group "
                                          "(diverse) beam search", "leave num_beam_groups and diversity_penalty out"),
             "diversity-beside-sampling": (dict(do_sample=True, diversity_penalty=0.5), "diversity_penalty asks for "
                                           "group (diverse) beam search", "leave num_beam_groups"),
             "force-words": (dict(num_beams=4, force_words_ids=[[5, 6]]),
                             "force_words_ids asks for constrained beam search", "leave them out; "
                             "bad_words_ids keeps tokens out, prefix_allowed_tokens_fn allows only some"),
             "constraints": (dict(num_beams=4, constraints=[[5, 6]]),
                             "constraints asks for constrained beam search", "leave them out"),
             "constraints-and-force-words": (dict(num_beams=4, constraints=[[5, 6]], force_words_ids=[[7]]),
                                             "constraints with force_words_ids asks for constrained beam search",
                                             "leave them out"),
             "constraints-before-dola": (dict(dola_layers="low", force_words_ids=[[7]]),
                                         "force_words_ids asks for constrained beam search", "leave them out")}


@pytest.mark.parametrize("entry", list(HUB_ENTRIES), ids=list(HUB_ENTRIES))
@pytest.mark.parametrize("mode", list(HUB_MODES), ids=list(HUB_MODES))
def test_modes_transformers_moved_to_the_hub_are_refused_naming_the_option(mode, entry):
    """transformers asked for trust_remote_code, then fetched and ran the Hub's code for the mode (offline: an
    OSError about a missing generate.py). Contrastive search's repeats the cache per candidate and crops it back,
    which FoxCache does not do; the others were never run against FoxCache. The refusal comes before anything is
    fetched, and again if the Hub's code calls generate with its own loop. Their options are refused in any form and
    named as given: beside num_beams > 1 transformers ran beam search for dola_layers (with a logged warning), and
    ignored num_beam_groups without num_beams > 1 and diversity_penalty without num_beam_groups > 1 in silence."""
    options, asked, fix = HUB_MODES[mode]
    model = make_model("fox-pro-tiny")
    said = f"generate: {asked}, which foxformer models do not support; {fix}"
    with pytest.raises(ValueError, match=f"^{re.escape(said)}"):
        HUB_ENTRIES[entry](model, input_ids=tokens(1, 6), max_new_tokens=3, pad_token_id=0, **options)


def test_penalty_alpha_beside_sampling_is_not_contrastive_search():
    model = make_model("fox-pro-tiny")
    assert model.generate(tokens(1, 6), penalty_alpha=0.6, top_k=4, do_sample=True, max_new_tokens=3,
                          pad_token_id=0).shape == (1, 9)


def test_the_hub_modes_options_at_their_defaults_ask_for_nothing():
    model = make_model("fox-pro-tiny")
    assert model.generate(tokens(1, 6), num_beams=2, num_beam_groups=1, diversity_penalty=0.0, max_new_tokens=3,
                          pad_token_id=0).shape == (1, 9)


def test_logits_processors_stopping_criteria_and_a_streamer_act_on_generate():
    """With a tokenizer (stop_strings needs one: transformers hands it to the forward too, which warned that it
    ignores it) and the processors that read the tokens so far."""
    import io
    import warnings
    from contextlib import redirect_stdout

    from transformers import TextStreamer

    from foxformer.data.hf_tokenizer import bytes_tokenizer

    tok = bytes_tokenizer()
    model = make_model("fox-pro-tiny")
    prompt = tokens(1, 6)
    not_letters = [[i] for i in range(VOCAB) if not chr(i).isalpha()]  # decodable text to stop on
    opts = dict(max_new_tokens=12, do_sample=False, pad_token_id=0, bad_words_ids=not_letters)
    full = model.generate(prompt, **opts)
    assert all(chr(t).isalpha() for t in full[0, 6:].tolist())
    stop = tok.decode(full[0, 9:11])
    text = tok.decode(full[0, 6:])
    ends = 6 + len(tok.encode(text[:text.index(stop) + len(stop)]))
    shown = io.StringIO()
    with warnings.catch_warnings(), redirect_stdout(shown):
        warnings.simplefilter("error")
        out = model.generate(prompt, stop_strings=[stop], tokenizer=tok, streamer=TextStreamer(tok, skip_prompt=True),
                             **opts)
    assert torch.equal(out, full[:, :ends]) and shown.getvalue() == tok.decode(full[0, 6:ends]) + "\n"
    plain = model.generate(prompt, max_new_tokens=12, do_sample=False, pad_token_id=0)
    for option in (dict(no_repeat_ngram_size=2), dict(repetition_penalty=5.0)):
        out = model.generate(prompt, max_new_tokens=12, do_sample=False, pad_token_id=0, **option)
        pairs = list(zip(out[0, :-1].tolist(), out[0, 1:].tolist()))
        if "no_repeat_ngram_size" in option:
            assert len(set(pairs)) == len(pairs)
        assert not torch.equal(out, plain), option  # plain greedy repeats itself
    assert model.generate(prompt, max_time=30.0, max_new_tokens=12, do_sample=False, pad_token_id=0).shape == (1, 18)
