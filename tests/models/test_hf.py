"""Auto classes, save_pretrained / from_pretrained (safetensors), torch.compile."""
import os

import pytest
import torch
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

from foxformer.models import FoxConfig, FoxForCausalLM, FoxModel  # importing foxformer.models registers them

from .conftest import make_model, tokens


def _assert_identical(loaded, model, ids):
    """Bitwise-equal weights give bitwise-equal logits once the weights sit in fresh allocations
    (loaded tensors can be unaligned views of one buffer, and BLAS rounds by alignment)."""
    sd_a, sd_b = loaded.state_dict(), model.state_dict()
    assert sd_a.keys() == sd_b.keys()
    assert all(torch.equal(sd_a[k], sd_b[k]) for k in sd_a)
    torch.testing.assert_close(loaded(ids).logits, model(ids).logits, rtol=1e-12, atol=1e-12)
    with torch.no_grad():
        for p in loaded.parameters():
            p.data = p.data.clone()
    assert torch.equal(loaded(ids).logits, model(ids).logits)


def test_auto_classes_registered():
    cfg = AutoConfig.for_model("foxformer", hidden_size=32, num_heads=2, num_layers=1, vocab_size=50)
    assert isinstance(cfg, FoxConfig)
    assert isinstance(AutoModelForCausalLM.from_config(cfg), FoxForCausalLM)
    assert isinstance(AutoModel.from_config(cfg), FoxModel)


def test_save_load_round_trip(tmp_path, preset):
    model = make_model(preset, fgate="fixed") if preset.startswith("fox") else make_model(preset)
    ids = tokens(2, 10)
    before = model(ids).logits
    model.save_pretrained(tmp_path)
    assert os.path.exists(tmp_path / "model.safetensors")
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float64).eval()
    assert isinstance(loaded, FoxForCausalLM)
    skip = {"_name_or_path", "dtype", "auto_map"}  # auto_map: written by save_pretrained (standalone loading)
    assert ({k: v for k, v in loaded.config.to_dict().items() if k not in skip}
            == {k: v for k, v in model.config.to_dict().items() if k not in skip})
    _assert_identical(loaded, model, ids)
    assert torch.equal(model(ids).logits, before)


def test_tied_embeddings_round_trip(tmp_path):
    model = make_model("fox-llama-tiny", tie_embeddings=True)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    model.save_pretrained(tmp_path)
    loaded = FoxForCausalLM.from_pretrained(tmp_path, dtype=torch.float64)
    assert loaded.lm_head.weight.data_ptr() == loaded.model.embed_tokens.weight.data_ptr()
    ids = tokens(1, 6)
    _assert_identical(loaded.eval(), model, ids)


@pytest.mark.parametrize("loader", [FoxForCausalLM, AutoModelForCausalLM], ids=["fox-class", "auto-class"])
def test_tying_an_untied_checkpoint_leaves_its_config_saying_untied(tmp_path, loader):
    """transformers keeps a checkpoint's two different matrices apart under tie_word_embeddings=True; the config
    said tied all the same, and the model saved again wrote that into its config.json."""
    model = make_model("fox-llama-tiny")
    model.save_pretrained(tmp_path / "untied")
    loaded = loader.from_pretrained(tmp_path / "untied", tie_word_embeddings=True, dtype=torch.float64)
    assert loaded.lm_head.weight is not loaded.model.embed_tokens.weight
    assert loaded.config.tie_embeddings is False and loaded.config.tie_word_embeddings is False
    _assert_identical(loaded.eval(), model, tokens(1, 6))
    loaded.save_pretrained(tmp_path / "again")
    assert AutoConfig.from_pretrained(tmp_path / "again").tie_embeddings is False


@pytest.mark.parametrize("loader", [FoxForCausalLM, AutoModelForCausalLM], ids=["fox-class", "auto-class"])
def test_untying_a_tied_checkpoint_starts_the_head_as_the_embedding(tmp_path, loader):
    """A tied checkpoint holds no lm_head.weight: loaded with tie_word_embeddings=False the head was randomly
    initialised (transformers reported it missing) and the model computed other logits than the one saved."""
    model = make_model("fox-llama-tiny", tie_embeddings=True)
    model.save_pretrained(tmp_path)
    loaded, info = loader.from_pretrained(tmp_path, tie_word_embeddings=False, dtype=torch.float64,
                                          output_loading_info=True)
    assert info["missing_keys"] == set() and loaded.config.tie_embeddings is False
    assert loaded.lm_head.weight is not loaded.model.embed_tokens.weight
    assert torch.equal(loaded.lm_head.weight, model.model.embed_tokens.weight)
    ids = tokens(2, 7)
    torch.testing.assert_close(loaded.eval()(ids).logits, model(ids).logits, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("loader", [FoxForCausalLM, AutoModelForCausalLM], ids=["fox-class", "auto-class"])
def test_a_misspelled_override_at_loading_is_one_error_naming_the_field(tmp_path, loader):
    """transformers hands the model the keywords the config has no attribute for: the config warned that it ignored
    num_hiden_layers, then __init__ raised a bare TypeError (as for transformers' own models)."""
    import warnings

    make_model("fox-llama-tiny").save_pretrained(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "the override is ignored" before the error
        with pytest.raises(TypeError, match=r"^FoxForCausalLM: unknown keyword argument 'num_hiden_layers' \(did you "
                                            r"mean 'num_hidden_layers'\?\): from_pretrained takes FoxConfig's "
                                            r"fields and transformers' loading options; fix the name or leave it "
                                            r"out$"):
            loader.from_pretrained(tmp_path, num_hiden_layers=1)
    with pytest.raises(TypeError, match=r"^FoxModel: unknown keyword argument 'colour': from_pretrained"):
        FoxModel.from_pretrained(tmp_path, colour="red")
    assert loader.from_pretrained(tmp_path, attention_backend="naive").config.attention_backend == "naive"


def test_resizing_the_vocabulary_keeps_the_token_ids_inside_it(tmp_path):
    """transformers' resize set vocab_size alone: a vocabulary shrunk below eos kept an eos the model can never emit
    (generate ran on to its limit) without a word."""
    model = make_model("fox-llama-tiny", eos_token_id=90, bos_token_id=3)
    with pytest.raises(ValueError, match=r"^resize_token_embeddings\(80\): FoxConfig.eos_token_id must be a token id "
                                         r"in \[0, vocab_size=80\).*got 90; set it inside the new vocabulary first"):
        model.resize_token_embeddings(80)
    assert model.config.vocab_size == 97 and model.lm_head.weight.shape[0] == 97  # untouched
    model.resize_token_embeddings(70, pad_to_multiple_of=64)  # eos 90 lies past 70, inside the 128 it pads to
    assert model.config.vocab_size == 128
    model.resize_token_embeddings(120)
    model.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float64)
    assert loaded.config.vocab_size == 120 and loaded(tokens(1, 5)).logits.shape[-1] == 120


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
@pytest.mark.parametrize("preset", ["fox-pro-tiny", "linear-pro-tiny"])
def test_torch_compile_fullgraph_train_step(preset, dynamic):
    """Static shapes, and dynamic ones over lengths below and above a linear-attention chunk (64 tokens)."""
    model = make_model(preset).float().train()
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True, dynamic=dynamic)
    for T in (16, 24, 100) if dynamic else (16,):
        ids = tokens(2, T)
        ref = model(ids, labels=ids).loss
        model.zero_grad()
        loss = compiled(ids, labels=ids).loss
        loss.backward()
        torch.testing.assert_close(loss, ref)
        assert model.lm_head.weight.grad is not None


def test_return_dict_false_gives_the_fields_as_a_tuple():
    """`loss, logits = model(..., return_dict=False)` unpacked a ModelOutput's keys: the strings 'loss' and 'logits'."""
    model = make_model("fox-pro-tiny")
    ids = tokens(2, 8)
    ref = model(ids, labels=ids)
    loss, logits = model(ids, labels=ids, return_dict=False)
    assert torch.equal(loss, ref.loss) and torch.equal(logits, ref.logits)
    logits, cache = model(ids, use_cache=True, return_dict=False)
    torch.testing.assert_close(logits, ref.logits)  # the cache-writing path rounds apart
    assert cache.get_seq_length() == 8
    (hidden,) = model.model(ids, return_dict=False)
    assert torch.equal(hidden, model.model(ids).last_hidden_state)
    model.config.return_dict = False
    assert isinstance(model(ids), tuple) and isinstance(model.model(ids), tuple)
    assert torch.equal(model(ids, return_dict=True).logits, ref.logits)


def test_output_hidden_states_defaults_to_the_config():
    """config.output_hidden_states=True (transformers' default for the argument) was ignored."""
    model = make_model("fox-pro-tiny")
    ids = tokens(2, 8)
    assert model(ids).hidden_states is None
    asked = model(ids, output_hidden_states=True).hidden_states
    assert len(asked) == model.config.num_layers + 1
    model.config.output_hidden_states = True
    for a, b in zip(model(ids).hidden_states, asked, strict=True):
        assert torch.equal(a, b)
    assert model(ids, output_hidden_states=False).hidden_states is None


def _unknown_kwarg_warnings(caught) -> list[str]:
    return [str(w.message) for w in caught if "unknown keyword argument" in str(w.message)]


def test_a_misspelled_forward_argument_warns_once_naming_it():
    """forward's **kwargs (which Trainer needs to pass num_items_in_batch) swallowed `attention_maks=` without a
    word, and the batch ran unmasked."""
    import warnings

    model, ids = make_model("fox-pro-tiny"), tokens(2, 8)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model(ids, attention_maks=torch.ones_like(ids))
        model(ids, attention_maks=torch.ones_like(ids))  # once per model: training calls forward every step
        model.model(ids, use_cach=False)
        # what transformers, its collators, tokenizers and PEFT pass: ignored in silence
        model(ids, token_type_ids=torch.zeros_like(ids), cache_position=torch.arange(8), position_ids=None,
              cu_seq_lens_q=None, max_length_q=None, seq_idx=None, num_items_in_batch=None, task_ids=None)
    assert _unknown_kwarg_warnings(caught) == [
        "FoxForCausalLM.forward: unknown keyword argument 'attention_maks' is ignored (did you mean 'attention_mask'?)",
        "FoxModel.forward: unknown keyword argument 'use_cach' is ignored (did you mean 'use_cache'?)"]
    assert all(w.filename == __file__ for w in caught if "unknown keyword" in str(w.message))


def test_a_bidirectional_request_is_refused():
    """is_causal=False (a name transformers' typed kwargs carry) ran causal attention without a word."""
    model, ids = make_model("fox-pro-tiny"), tokens(1, 6)
    for forward in (model, model.model):
        with pytest.raises(ValueError, match="is_causal=False, but foxformer's attention is causal"):
            forward(ids, is_causal=False)
    torch.testing.assert_close(model(ids, is_causal=True).logits, model(ids).logits)


def test_generate_trainer_and_peft_pass_nothing_the_warning_names(tmp_path):
    """The warning must not fire for what transformers itself passes: generate (greedy, sampling, beams, a
    left-padded batch, chunked prefill), Trainer with gradient accumulation (num_items_in_batch) and a PEFT
    adapter's forward and generate."""
    import warnings

    from transformers import Trainer, TrainingArguments

    model, ids = make_model("fox-pro-tiny"), tokens(2, 10)
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.generate(ids, attention_mask=mask, max_new_tokens=4, do_sample=False, pad_token_id=0)
        model.generate(ids, attention_mask=mask, max_new_tokens=4, do_sample=True, top_k=5, pad_token_id=0)
        model.generate(ids, max_new_tokens=4, num_beams=2, do_sample=False, pad_token_id=0)
        model.generate(ids, attention_mask=mask, max_new_tokens=4, do_sample=False, pad_token_id=0,
                       prefill_chunk_size=4, return_dict_in_generate=True, output_scores=True)
        model.float().train()
        rows = [{"input_ids": r, "labels": r} for r in tokens(4, 12)]
        args = TrainingArguments(output_dir=str(tmp_path), max_steps=1, per_device_train_batch_size=2,
                                 gradient_accumulation_steps=2, report_to=[], use_cpu=True, save_strategy="no")
        Trainer(model=model, args=args, train_dataset=rows).train()
        peft = pytest.importorskip("peft")
        adapted = peft.get_peft_model(model, peft.LoraConfig(r=2, target_modules=["q_proj"], task_type="CAUSAL_LM"))
        adapted(input_ids=ids, attention_mask=mask, labels=ids).loss.backward()
        adapted.eval().generate(input_ids=ids, attention_mask=mask, max_new_tokens=3, do_sample=False,
                                pad_token_id=0)
    assert _unknown_kwarg_warnings(caught) == []


def test_from_pretrained_overrides_are_checked_as_the_constructor_checks_them(tmp_path):
    """transformers sets from_pretrained's keyword overrides on the built config, past its checks: evict_eps on a
    Transformer was kept and never read, a backend's typo was kept, a per-layer shift of the wrong length failed in
    the forward with an IndexError, "1e-5" with a TypeError."""
    make_model("transformer-llama-tiny").save_pretrained(tmp_path)
    refused = {"evict_eps": (0.05, "must be None for a model with no forget gate"),
               "attention_backend": ("tritn", r"FoxConfig\.attention_backend: expected one of auto, gluon, triton, "
                                              r"torch, naive, got 'tritn' \(did you mean 'triton'\?\)"),
               "fgate_bias_shift": ([1.0], "one entry per layer"),
               "num_hidden_layers": ("3", "num_layers must be a positive int")}
    for name, (value, message) in refused.items():
        with pytest.raises(ValueError, match=message):
            AutoModelForCausalLM.from_pretrained(tmp_path, **{name: value})
        with pytest.raises(ValueError, match=message):
            AutoConfig.from_pretrained(tmp_path, **{name: value})
    loaded = FoxForCausalLM.from_pretrained(tmp_path, rms_norm_eps="1e-5", attention_backend="naive")
    assert (loaded.config.rms_norm_eps, loaded.config.attention_backend) == (1e-5, "naive")
    assert AutoConfig.from_pretrained(tmp_path, tie_word_embeddings=True).tie_embeddings is True
    config, unused = AutoConfig.from_pretrained(tmp_path, attention_backend="torch", not_a_field=1,
                                                return_unused_kwargs=True)
    assert config.attention_backend == "torch" and unused == {"not_a_field": 1}


@pytest.mark.parametrize("flash_attn_kwargs", [False, True])
def test_trainer_takes_the_flattening_collator(tmp_path, flash_attn_kwargs):
    """transformers' padding-free collator (documents packed into one row, marked by restarting position_ids or
    by cu_seq_lens_q / cu_seq_lens_k / max_length_q / max_length_k) through Trainer: a step runs, nothing warns."""
    import warnings

    from transformers import DataCollatorWithFlattening, Trainer, TrainingArguments

    model = make_model("transformer-llama-tiny").float().train()
    rows = [{"input_ids": tokens(1, n, seed=i)[0].tolist()} for i, n in enumerate([6, 11, 3, 8])]
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=2, per_device_train_batch_size=2, report_to=[],
                             use_cpu=True, save_strategy="no", logging_steps=1)
    collator = DataCollatorWithFlattening(return_flash_attn_kwargs=flash_attn_kwargs)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = Trainer(model=model, args=args, train_dataset=rows, data_collator=collator).train()
    assert _unknown_kwarg_warnings(caught) == []
    assert result.global_step == 2 and torch.isfinite(torch.tensor(result.training_loss))
