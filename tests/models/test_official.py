"""Converting checkpoints of the FoX paper's code: logits against an fp64 forward written from their code's maths
(official_reference.py), for each supported variant, and clear refusals of what has no exact equivalent."""
import io
import json
import math
import os

import pytest
import torch

from foxformer.cli import main
from foxformer.train.loading import load_model
from foxformer.models import FoxConfig, FoxForCausalLM
from foxformer.models.official import load_official, resolve_source
from tests.bars import BARS_BY_PLACE, Terminal

from .official_reference import VARIANTS, official_config, official_logits, random_state, save_official


def _official(tmp_path, variant, fmt="safetensors", state_edit=None, config_edit=None, **overrides):
    """An official folder of ``variant``; ``config_edit`` changes its config.json after the weights were made."""
    cfg = official_config(variant, **overrides)
    state = random_state(cfg)
    if state_edit is not None:
        state_edit(state)
    cfg.update(config_edit or {})
    return str(save_official(str(tmp_path / f"official-{variant}"), cfg, state, fmt)), cfg, state


def _ids(cfg, seed=1):
    return torch.randint(0, cfg["vocab_size"], (2, 11), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_converted_logits_equal_the_official_forward(tmp_path, variant):
    src, cfg, state = _official(tmp_path, variant, fmt="bin" if variant == "fox-v-shift-norm-only" else "safetensors")
    model = load_official(src)
    ids = _ids(cfg)
    ref = official_logits(cfg, state, ids)
    with torch.no_grad():
        fp32 = model(ids).logits.double()
        fp64 = model.double()(ids).logits
    assert (fp64 - ref).abs().max() < 1e-5
    # fp32 rounding only: a few units of 2^-24 of the largest logit, accumulated over two layers
    assert (fp32 - ref).abs().max() < 1e-5 * ref.abs().max()


def test_released_fox_pro_config(tmp_path):
    # bos / eos as their config class defaults them: the gpt2-json tokenizer's ids win
    src, cfg, _ = _official(tmp_path, "fox-pro-released", config_edit=dict(bos_token_id=1, eos_token_id=2))
    c = load_official(src).config
    assert (c.vocab_size, c.tokenizer, c.bos_token_id, c.eos_token_id) == (50257, "gpt2-json", 50256, 50256)
    assert (c.qk_norm, c.qk_norm_per_head, c.qk_norm_eps, c.rms_norm_eps) == (True, False, 1e-5, 1e-6)
    assert (c.k_shift, c.v_shift, c.output_gate, c.output_norm, c.rope) == (True, True, True, True, False)
    assert (c.intermediate_size, c.max_position_embeddings, c.prune_eps) == (40, 16384, None)


@pytest.mark.parametrize("variant,want", [
    ("fox-pro-per-head", dict(qk_norm_per_head=True, tokenizer=None, attention="forgetting")),
    ("transformer-pro", dict(attention="softmax", fgate="none", rope=True, qk_norm_per_head=False)),
    ("transformer-llama-gqa", dict(attention="softmax", num_kv_heads=2, rope=True, rope_theta=1e4, qk_norm=False)),
    ("fox-k-shift-gate-only", dict(k_shift=True, v_shift=False, output_gate=True, output_norm=False,
                                   fgate="data_independent", tie_embeddings=True)),
    ("fox-v-shift-norm-only", dict(k_shift=False, v_shift=True, output_norm=True, fgate="fixed", fgate_tmin=2.0,
                                   fgate_tmax=64.0, qk_norm_per_head=True, prune_eps=math.exp(-10.0))),
], ids=lambda x: x if isinstance(x, str) else "")
def test_variant_configs(tmp_path, variant, want):
    src, _, _ = _official(tmp_path, variant)
    c = load_official(src).config
    assert {k: getattr(c, k) for k in want} == pytest.approx(want)


@pytest.mark.parametrize("field,value", [("qk_norm_eps", 1e-6), ("rms_norm_eps", 1e-5), ("qk_norm_per_head", True)])
def test_the_comparison_sees_a_wrong_setting(tmp_path, field, value):
    """The tolerance of the logits test is tight enough to catch the eps mistakes the issue names."""
    src, cfg, state = _official(tmp_path, "fox-pro-released")
    model = load_official(src).double()
    wrong = FoxForCausalLM(FoxConfig.from_dict({**model.config.to_dict(), field: value})).double().eval()
    sd = model.state_dict()
    if field == "qk_norm_per_head":  # the shared weight repeated per head: the same model, another layout
        sd = {k: v.expand(cfg["num_heads"], -1) if k.endswith(("q_norm.weight", "k_norm.weight")) else v
              for k, v in sd.items()}
    wrong.load_state_dict(sd)
    ids = _ids(cfg)
    with torch.no_grad():
        diff = (wrong(ids).logits - official_logits(cfg, state, ids)).abs().max()
    if field == "qk_norm_per_head":
        assert diff < 1e-10
    else:
        assert diff > 1e-4


def _drop(key):
    return lambda state: state.pop(key)


def _add(key, shape):
    return lambda state: state.__setitem__(key, torch.zeros(shape))


REFUSALS = [
    pytest.param(dict(model_type="mamba2-project_fox"), None, "Mamba-2", id="mamba2-baseline"),
    pytest.param(dict(model_type="delta_net-project_fox"), None, "DeltaNet", id="deltanet-baseline"),
    pytest.param(dict(model_type="llama"), None, "not a checkpoint of the FoX paper", id="other-model-type"),
    pytest.param(dict(hidden_act="sigmoid"), None, "SwiGLU", id="glu-mlp"),
    pytest.param(dict(window_size=64), None, "sliding-window", id="sliding-window"),
    pytest.param(dict(num_kv_heads=2), None, "GQA", id="gqa-in-their-fox-class"),
    pytest.param(dict(use_output_norm=False, ogate_act="silu"), None, "sigmoid", id="silu-output-gate"),
    pytest.param(dict(num_heads=5), None, "must divide", id="heads-not-dividing-hidden"),
    pytest.param(dict(num_hidden_layers=3), None, "3 layers", id="layer-count"),
    pytest.param(dict(intermediate_size=48), None, "intermediate_size", id="mlp-width"),
    pytest.param(dict(qk_norm_share_param_across_head=False), None, "qk_norm_share_param_across_head",
                 id="qk-norm-flag-against-weights"),
    pytest.param({}, _add("model.layers.0.attn.q_proj.bias", (32,)), "q_proj.bias", id="unexpected-weight"),
    pytest.param({}, _drop("model.layers.1.attn.o_proj.weight"), "missing", id="missing-weight"),
    pytest.param({}, _add("model.layers.0.attn.o_proj.weight", (32, 16)), "wrong shape", id="wrong-shape"),
]


@pytest.mark.parametrize("overrides,state_edit,match", REFUSALS)
def test_refuses_what_it_cannot_convert_exactly(tmp_path, overrides, state_edit, match):
    src, _, _ = _official(tmp_path, "fox-pro-released", state_edit=state_edit, config_edit=overrides)
    with pytest.raises(ValueError, match=match):
        load_official(src)


def test_refuses_folders_without_config_or_weights(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="config.json"):
        load_official(str(tmp_path / "empty"))
    (tmp_path / "empty" / "config.json").write_text(json.dumps(official_config("fox-llama")))
    with pytest.raises(ValueError, match="model.safetensors"):
        load_official(str(tmp_path / "empty"))


def test_hub_id_without_network_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ValueError, match="Hub download of .* failed"):
        resolve_source("zhixuan-lin/no-such-model-here")
    with pytest.raises(ValueError, match="no such folder"):
        resolve_source("/no/such/folder")


def test_cli_converts_and_eval_reads_the_result(tmp_path, capsys):
    src, cfg, state = _official(tmp_path, "fox-pro-released")
    out = str(tmp_path / "converted")
    assert main(["convert", "official", src, "--out", out]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["tokenizer"] == "gpt2-json" and summary["qk_norm"] == "shared"
    loaded = load_model(out, device="cpu", dtype="fp64")
    assert loaded.tokenizer == "gpt2-json"
    ids = _ids(cfg)
    with torch.no_grad():
        assert (loaded.model(ids).logits - official_logits(cfg, state, ids)).abs().max() < 1e-5
    assert os.path.exists(os.path.join(out, "tokenization_gpt2_json.py"))


def test_a_foxformer_export_given_to_convert_is_said_to_load_as_is(tmp_path, capsys):
    """`convert official` of its own output (or any foxformer export) only said it was no checkpoint of the paper's
    code, as if the folder were no model at all."""
    src, _, _ = _official(tmp_path, "fox-llama")
    converted = str(tmp_path / "converted")
    assert main(["convert", "official", src, "--out", converted]) == 0
    capsys.readouterr()
    assert main(["convert", "official", converted, "--out", str(tmp_path / "again")]) == 2
    assert capsys.readouterr().err == (
        f"error: convert official: {converted}: model_type 'foxformer': the folder already loads as a foxformer "
        f"model as is, with nothing to convert; pass it as the model (foxformer generate / eval MODEL, bench --model) "
        f"or load it with FoxForCausalLM.from_pretrained\n")
    assert not os.path.exists(tmp_path / "again")


@pytest.mark.parametrize("src, said", [
    ("run", "a foxformer training run's folder: already a foxformer model, with nothing to convert; pass it as is as "
            "the model (foxformer generate / eval MODEL, bench --model), or write a Hugging Face folder of it with "
            "`foxformer export-hf run`"),
    ("run/checkpoints", "the checkpoints folder of the foxformer training run 'run': already a foxformer model, with "
                        "nothing to convert; pass the run folder run as the model (foxformer generate / eval MODEL, "
                        "bench --model), or write a Hugging Face folder of it with `foxformer export-hf run`"),
    ("run/checkpoints/step_00000005", "a checkpoint of the foxformer training run 'run': already a foxformer model, "
                                      "with nothing to convert; pass it as is as the model (foxformer generate / eval "
                                      "MODEL, bench --model), or write a Hugging Face folder of it with `foxformer "
                                      "export-hf run --checkpoint step_00000005`"),
], ids=["run", "checkpoints", "checkpoint"])
def test_a_foxformer_run_given_to_convert_is_said_to_be_a_foxformer_model(tmp_path, monkeypatch, capsys, src, said):
    """A run's folder (or its checkpoints) was refused as one that "has no config.json"."""
    checkpoint = tmp_path / "run" / "checkpoints" / "step_00000005"
    checkpoint.mkdir(parents=True)
    (checkpoint / "model.pt").write_bytes(b"")
    (tmp_path / "run" / "config.yaml").write_text("preset: fox-pro-tiny\n")
    monkeypatch.chdir(tmp_path)
    assert main(["convert", "official", src, "--out", "out"]) == 2
    assert capsys.readouterr().err == f"error: convert official: {src}: {said}\n"
    assert not os.path.exists(tmp_path / "out")


def test_a_prepared_dataset_given_to_convert_is_said_to_be_a_dataset(tmp_path, monkeypatch, capsys):
    """`convert official DATA` said only that DATA "has no config.json", as of a checkpoint missing a file; a
    folder with a manifest.json of its own is no dataset and keeps that line."""
    (tmp_path / "docs").mkdir()
    for i in range(3):
        (tmp_path / "docs" / f"{i}.txt").write_text(f"Document {i}, a few words long. " * 5)
    monkeypatch.chdir(tmp_path)
    assert main(["data", "prepare", "--source", "docs", "--out", "data", "--tokenizer", "bytes", "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["convert", "official", "data", "--out", "out"]) == 2
    assert capsys.readouterr().err == (
        "error: convert official: data: a prepared dataset (it holds the manifest.json or lock that `foxformer data "
        "prepare` writes), not a model checkpoint: convert official reads a Hugging Face folder saved by the FoX "
        "paper's code (config.json and model.safetensors or pytorch_model.bin) or a Hub id such as "
        "zhixuan-lin/fox-pro-760m-longcrawl64-48b; a dataset goes to --data (foxformer train, eval)\n")
    assert not os.path.exists(tmp_path / "out")
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "manifest.json").write_text('{"files": []}')
    assert main(["convert", "official", "mine", "--out", "out"]) == 2
    assert capsys.readouterr().err == "error: convert official: mine: has no config.json\n"


def test_cli_out_that_is_no_export_is_refused_before_the_conversion(tmp_path, capsys):
    """`--out` was written into whatever it named: a run's folder, a user's files, the checkpoint being read."""
    src, _, _ = _official(tmp_path, "fox-llama")
    mine, run = tmp_path / "mine", tmp_path / "run"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    run.mkdir()
    (run / "config.yaml").write_text("preset: fox-pro-tiny\n")
    for out, said in ((str(mine), "holds other files (notes.txt), and an export replaces its folder"),
                      (str(run), "is a training run's folder (it holds config.yaml)"),
                      (src, "is the checkpoint being converted (SRC): name a new folder")):
        before = sorted(os.listdir(out))
        assert main(["convert", "official", src, "--out", out]) == 2
        assert capsys.readouterr().err.startswith(f"error: --out: {out!r} {said}")
        assert sorted(os.listdir(out)) == before
    out = str(tmp_path / "converted")  # an earlier conversion is replaced whole
    for _ in range(2):
        assert main(["convert", "official", src, "--out", out]) == 0
    assert "note: replacing the earlier export" in capsys.readouterr().err
    assert sorted(os.listdir(tmp_path)) == ["converted", "mine", "official-fox-llama", "run"]


def test_cli_error_and_eval_of_an_official_folder(tmp_path, capsys):
    src, _, _ = _official(tmp_path, "fox-llama", model_type="mamba2-project_fox")
    assert main(["convert", "official", src, "--out", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err.startswith("error: convert official:")
    with pytest.raises(ValueError, match="model: .*Mamba-2 baseline"):
        load_model(src, device="cpu")
    src, cfg, state = _official(tmp_path, "fox-llama")  # loading converts in memory: eval reads it as is
    loaded = load_model(src, device="cpu", dtype="fp64")
    ids = _ids(cfg)
    with torch.no_grad():
        assert (loaded.model(ids).logits - official_logits(cfg, state, ids)).abs().max() < 1e-5
    # loaded as a FoxForCausalLM, it has the attention backends another library's model is refused for
    assert load_model(src, device="cpu", attention_backend="naive").model.config.attention_backend == "naive"


def test_a_hub_id_loads_through_the_hub_cache(tmp_path, monkeypatch):
    """`load_model("owner/name")` (eval, generate, train --init-from): the id goes to the Hub download, its folder
    loads as a local one (an official one converted), the model keeps the id as its path and the repo as its name;
    without the Hub the error says what to do."""
    import foxformer.train.loading as loading

    src, cfg, state = _official(tmp_path, "fox-pro-released")
    asked = []
    monkeypatch.setattr(loading, "download", lambda repo: asked.append(repo) or src)
    monkeypatch.chdir(tmp_path)
    loaded = load_model("zhixuan-lin/fox-pro-760m-longcrawl64-48b", device="cpu", dtype="fp64")
    assert asked == ["zhixuan-lin/fox-pro-760m-longcrawl64-48b"]
    assert (loaded.path, loaded.name) == ("zhixuan-lin/fox-pro-760m-longcrawl64-48b", "fox-pro-760m-longcrawl64-48b")
    ids = _ids(cfg)
    with torch.no_grad():
        assert (loaded.model(ids).logits - official_logits(cfg, state, ids)).abs().max() < 1e-5


def test_a_hub_id_without_the_hub_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)  # "runs/nowhere" names no local folder here, so it is taken for a Hub id
    with pytest.raises(ValueError, match="'runs/nowhere' is no local folder, and the Hub download of runs/nowhere"):
        load_model("runs/nowhere", device="cpu")
    (tmp_path / "runs").mkdir()  # now a mistyped path: not sent to the Hub
    with pytest.raises(ValueError, match="'runs/nowhere' is not a directory"):
        load_model("runs/nowhere", device="cpu")


def test_a_converted_model_trains_on_from_its_own_weights(tmp_path):
    """Fine-tuning the paper's released models: `train --init-from CONVERTED` starts from the converted weights and
    config (shared QK-norm weight, eps 1e-5: no preset has them) on gpt2-json data; at lr 0 the weights stay."""
    from foxformer.data.preparation import PrepareConfig, prepare
    from foxformer.train import checkpoint as ckpt

    src, _, _ = _official(tmp_path, "fox-pro-released", vocab_size=50257)
    converted, docs, data, run = (str(tmp_path / name) for name in ("converted", "docs", "data", "run"))
    assert main(["convert", "official", src, "--out", converted]) == 0
    os.makedirs(docs)
    for i in range(4):
        with open(os.path.join(docs, f"{i}.txt"), "w") as f:
            f.write(f'Document {i}: "quoted" text, escaped as JSON by gpt2-json. ' * 30)
    prepare(PrepareConfig(sources=[docs], out_dir=data, tokenizer="gpt2-json", val_fraction=0.5), progress=False)
    assert main(["train", "--init-from", converted, "--data", data, "--out", run, "--context", "64",
                 "--batch-tokens", "128", "--max-steps", "1", "--lr", "0", "--eval-tokens", "128", "--no-progress",
                 "--set", "tensorboard=false", "--set", "export_hf=false"]) == 0
    want = load_model(converted, device="cpu", dtype="fp32", progress=False).model.state_dict()
    got = ckpt.load_checkpoint(ckpt.latest_checkpoint(run))[0]
    assert all(torch.equal(got[k], want[k]) for k in want)
    with open(os.path.join(run, "model_config.json")) as f:
        fields = json.load(f)
    assert (fields["qk_norm_per_head"], fields["qk_norm_eps"], fields["tokenizer"]) == (False, 1e-5, "gpt2-json")


@BARS_BY_PLACE
def test_cli_conversion_bars_follow_no_progress_and_the_terminal(tmp_path, monkeypatch, terminal, flag, shown):
    """convert official had no --no-progress, and the Hub's and transformers' bars (download, loading and writing
    the weights) wrote their frames into a log off a terminal."""
    import sys

    import foxformer.models.official as official
    from huggingface_hub.utils import are_progress_bars_disabled
    from transformers.utils import logging

    seen = []
    monkeypatch.setattr(official, "convert_official", lambda *a, **kw: (
        seen.append((logging.is_progress_bar_enabled(), not are_progress_bars_disabled())), {})[1])
    monkeypatch.setattr(sys, "stderr", Terminal() if terminal else io.StringIO())
    assert main(["convert", "official", str(tmp_path / "src"), "--out", str(tmp_path / "out"), *flag]) == 0
    assert seen == [(shown, shown)]
