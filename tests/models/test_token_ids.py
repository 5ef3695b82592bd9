"""bos / eos / pad of a model's config, as its tokenizer uses them: exports said pad_token_id null although their
tokenizer padded with its end-of-document token."""
import json
import logging
import types

import pytest
import torch
from transformers import AutoModelForCausalLM

from foxformer.data.hf_tokenizer import hf_tokenizer
from foxformer.models import FoxConfig, FoxForCausalLM

TINY = dict(hidden_size=32, num_layers=1, num_heads=2, attention_backend="torch")


@pytest.mark.parametrize("spec, vocab", [("bytes", 257), ("gpt2", 50304), ("gpt2-json", 50304),
                                         ("tiktoken:gpt2", 50304)])
def test_a_built_in_tokenizers_config_pads_as_the_tokenizer_does(spec, vocab):
    cfg = FoxConfig(vocab_size=vocab, tokenizer=spec, **TINY)
    tok = hf_tokenizer(spec)
    assert (cfg.bos_token_id, cfg.eos_token_id, cfg.pad_token_id) == (tok.eos_token_id,) * 3
    assert tok.pad_token_id == cfg.pad_token_id


def test_pad_follows_the_tokenizer_given_ids_stay():
    # a tokenizer known only by loading it: training records eos from its data, and pad follows it
    assert FoxConfig(vocab_size=64, tokenizer="hf:some/tok", eos_token_id=7, **TINY).pad_token_id == 7
    # a built-in tokenizer pads with its end of document whatever eos says
    cfg = FoxConfig(vocab_size=257, tokenizer="bytes", eos_token_id=10, **TINY)
    assert (cfg.eos_token_id, cfg.pad_token_id) == (10, 256)
    assert FoxConfig(vocab_size=257, tokenizer="bytes", pad_token_id=3, **TINY).pad_token_id == 3
    # no tokenizer, nothing known: nothing made up
    assert FoxConfig(vocab_size=64, eos_token_id=7, **TINY).pad_token_id is None
    assert FoxConfig(vocab_size=64, tokenizer="hf:some/tok", eos_token_id=[7, 8], **TINY).pad_token_id is None


def _model(tmp_path, name="model"):
    torch.manual_seed(0)
    model = FoxForCausalLM(FoxConfig(vocab_size=257, tokenizer="bytes", **TINY)).eval()
    model.save_pretrained(tmp_path / name)
    return tmp_path / name


def _read(path):
    with open(path) as f:
        return json.load(f)


def _as_an_older_export(folder):
    """The folder as foxformer wrote it before the config filled pad: null in config.json, none in
    generation_config.json."""
    for name, edit in (("config.json", lambda d: d.update(pad_token_id=None)),
                       ("generation_config.json", lambda d: d.pop("pad_token_id"))):
        data = _read(folder / name)
        edit(data)
        (folder / name).write_text(json.dumps(data))


def test_an_export_names_its_pad_and_an_older_one_loads_with_it(tmp_path):
    folder = _model(tmp_path)
    assert _read(folder / "config.json")["pad_token_id"] == 256
    assert _read(folder / "generation_config.json")["pad_token_id"] == 256
    _as_an_older_export(folder)
    model = AutoModelForCausalLM.from_pretrained(folder)
    assert (model.config.pad_token_id, model.generation_config.pad_token_id) == (256, 256)
    model.save_pretrained(tmp_path / "again")  # saved again, it says so
    assert _read(tmp_path / "again" / "generation_config.json")["pad_token_id"] == 256


class _Said(logging.Handler):
    def __init__(self):
        super().__init__()
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


@pytest.mark.parametrize("older", [False, True], ids=["export", "older-export"])
def test_batched_generate_takes_the_pad_from_the_export(tmp_path, older):
    """transformers' generate, with a batch of left-padded prompts and no attention mask, logged that neither it nor
    the pad token id was set. The mask stays the caller's to pass (the pad is the end of document, which prompts
    may hold): with it, the padded row generates what it does alone."""
    folder = _model(tmp_path)
    if older:
        _as_an_older_export(folder)
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    tok = hf_tokenizer("bytes")
    batch = tok(["a longer prompt", "hi"], return_tensors="pt", padding=True)
    said = _Said()
    logger = logging.getLogger("transformers")
    logger.addHandler(said)
    try:
        model.generate(batch["input_ids"], max_new_tokens=2, do_sample=False)
    finally:
        logger.removeHandler(said)
    assert not [line for line in said.lines if "pad token id were not set" in line], said.lines
    padded = model.generate(**batch, max_new_tokens=4, do_sample=False)[1, -4:]
    alone = model.generate(**tok(["hi"], return_tensors="pt"), max_new_tokens=4, do_sample=False)[0, -4:]
    assert padded.tolist() == alone.tolist()


def _Tok(pad_token_id):
    """A Hugging Face tokenizer as the config reads it: its pad id (None: it has no pad token)."""
    return types.SimpleNamespace(pad_token_id=pad_token_id, eos_token_id=7)


def test_an_export_pads_as_its_hf_tokenizer_does():
    """An hf: tokenizer padding with a token of its own ("<pad>") got pad = eos in the config: the export records
    the tokenizer's pad, and eos only where the tokenizer has none (or one the vocabulary cannot hold)."""
    cfg = FoxConfig(vocab_size=64, tokenizer="hf:some/tok", eos_token_id=7, **TINY)
    assert cfg.pad_token_id == 7  # known only by loading the tokenizer
    assert cfg.pad_token_id_beside(_Tok(0)) == 0
    assert cfg.pad_token_id_beside(_Tok(None)) == 7
    assert cfg.pad_token_id_beside(_Tok(64)) == 7
    # a pad given apart from eos stays; a built-in tokenizer pads with its end of document, as the config says
    assert FoxConfig(vocab_size=64, tokenizer="hf:some/tok", eos_token_id=7, pad_token_id=3,
                     **TINY).pad_token_id_beside(_Tok(0)) == 3
    assert FoxConfig(vocab_size=257, tokenizer="bytes", **TINY).pad_token_id_beside(_Tok(0)) == 256


def _hf_tokenizer_folder(folder, pad: bool):
    """A word-level Hugging Face tokenizer: <pad> 0 (where ``pad``), </s> 1, then words."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["<pad>", "</s>", "the", "fox", "runs", "[UNK]"]
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="</s>", unk_token="[UNK]",
                                  **({"pad_token": "<pad>"} if pad else {}))
    tok.save_pretrained(folder)
    return str(folder)


@pytest.mark.parametrize("pad", [True, False], ids=["own-pad", "no-pad"])
def test_an_hf_tokenizers_export_names_the_pad_it_pads_with(tmp_path, pad):
    from transformers import AutoTokenizer

    folder = _hf_tokenizer_folder(tmp_path / "tok", pad)
    cfg = FoxConfig(vocab_size=64, tokenizer=f"hf:{folder}", bos_token_id=1, eos_token_id=1, **TINY)
    FoxForCausalLM(cfg).save_pretrained(tmp_path / "model")
    want = 0 if pad else 1
    assert AutoTokenizer.from_pretrained(tmp_path / "model").pad_token_id == (0 if pad else None)
    assert _read(tmp_path / "model" / "config.json")["pad_token_id"] == want
    assert _read(tmp_path / "model" / "generation_config.json")["pad_token_id"] == want
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "model")
    assert (model.config.pad_token_id, model.generation_config.pad_token_id, model.config.eos_token_id) == (want,
                                                                                                          want, 1)
