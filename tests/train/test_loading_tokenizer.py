"""The tokenizer a model names, one rule for load_model (LoadedModel.tokenizer) and for what `eval niah` reads from
config files before the weights load (named_tokenizer_spec): eval restated the rule once and could drift from it."""
import os

import pytest
import yaml

import foxformer.train.loading as loading
from foxformer.train.checkpoint import save_checkpoint
from foxformer.train.loading import load_model, named_tokenizer_spec

from ..eval.helpers import tiny_model
from ..models.official_reference import official_config, random_state, save_official

VOCAB = 257  # the byte tokenizer's


def _run(folder, tokenizer=None, checkpoint=True, export=None):
    """A run folder: config.yaml naming ``tokenizer``, a checkpoint, and an hf/ export whose config names
    ``export``."""
    os.makedirs(folder)
    cfg = {"preset": "fox-pro-tiny", "model": {"attention_backend": "torch"}, "context": 32,
           "derived": {"vocab_size": VOCAB}, **({"tokenizer": tokenizer} if tokenizer else {})}
    with open(os.path.join(folder, "config.yaml"), "w") as f:
        yaml.safe_dump(cfg, f)
    if checkpoint:
        save_checkpoint(folder, 3, tiny_model(vocab=VOCAB).state_dict(), {}, {"tokens": 96}, keep_last=1)
    if export is not None:
        _hf(os.path.join(folder, "hf"), export)
    return folder


def _hf(folder, tokenizer=None, files=False):
    """A Hugging Face folder whose config.json names ``tokenizer``, with tokenizer files beside it if ``files``."""
    tiny_model(vocab=VOCAB, **({"tokenizer": tokenizer} if tokenizer else {})).save_pretrained(folder)
    if files:
        with open(os.path.join(folder, "tokenizer.json"), "w") as f:
            f.write("{}")
    return folder


# each case: the folder (made under tmp_path) and the tokenizer load_model records; "hf:" ends with the folder
CASES = {
    "run-config": (lambda t: _run(t / "run", "bytes"), "bytes"),
    "checkpoint": (lambda t: os.path.join(_run(t / "run", "bytes"), "checkpoints", "step_00000003"), "bytes"),
    "run-naming-none": (lambda t: _run(t / "run"), None),
    "run-without-checkpoint-reads-its-export": (lambda t: _run(t / "run", checkpoint=False, export="bytes"),
                                                "bytes"),
    "run-config-over-its-export": (lambda t: _run(t / "run", "gpt2", checkpoint=False, export="bytes"), "gpt2"),
    "hf-export-folder": (lambda t: os.path.join(_run(t / "run", checkpoint=False, export="bytes"), "hf"), "bytes"),
    "hf-config": (lambda t: _hf(t / "hf", "bytes", files=True), "bytes"),
    "hf-tokenizer-files": (lambda t: _hf(t / "hf", files=True), "hf:"),
    "hf-naming-none": (lambda t: _hf(t / "hf"), None),
}


@pytest.mark.parametrize("case", CASES)
def test_load_model_and_the_early_spec_name_one_tokenizer(case, tmp_path):
    make, want = CASES[case]
    path = str(make(tmp_path))
    want = f"hf:{path}" if want == "hf:" else want
    assert load_model(path, device="cpu").tokenizer == want
    assert named_tokenizer_spec([path]) == (want or "gpt2")  # tokenizer_spec's default for a model naming none
    assert named_tokenizer_spec([path], given=want or "bytes") == (want or "bytes")


def test_the_early_spec_combines_models_and_the_given_one(tmp_path):
    run, hf = str(_run(tmp_path / "run", "bytes")), str(_hf(tmp_path / "hf", files=True))
    bare = str(_hf(tmp_path / "bare"))
    assert named_tokenizer_spec([run, bare]) == "bytes"  # a model naming none leaves the others'
    assert named_tokenizer_spec([run, hf]) is None  # tokenizer_spec refuses them once loaded
    assert named_tokenizer_spec([run], given="gpt2") is None  # refused as another than the run's
    assert named_tokenizer_spec([str(tmp_path / "no-such-run")], given="gpt2") == "gpt2"  # its load fails


def test_what_only_loading_tells_is_left_to_load_model(tmp_path, monkeypatch):
    """An official checkpoint's tokenizer follows from its weights (models.official); a Hub id is not downloaded
    for the early answer."""
    cfg = official_config("fox-pro-released")
    official = str(save_official(str(tmp_path / "official"), cfg, random_state(cfg), "safetensors"))
    assert load_model(official, device="cpu").tokenizer == "gpt2-json"
    assert named_tokenizer_spec([official]) is None
    monkeypatch.setattr(loading, "download", lambda *a: pytest.fail("downloaded"))
    monkeypatch.chdir(tmp_path)
    assert named_tokenizer_spec(["owner/model"], given="gpt2") is None
