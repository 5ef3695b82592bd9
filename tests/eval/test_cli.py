"""`foxformer eval loss|niah|harness`, `foxformer analyze gates`, `foxformer report` end to end on tiny models."""
import json
import os
import shutil

import pytest
import torch
import yaml

from foxformer.cli import main
from foxformer.data import PrepareConfig, prepare, read_manifest
from foxformer.eval import load_model
from foxformer.train.checkpoint import save_checkpoint

from .helpers import tiny_model

VOCAB = 50304  # GPT-2's 50257 rounded up to a multiple of 64, as training does


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    root = tmp_path_factory.mktemp("eval_cli")
    texts = root / "texts"
    texts.mkdir()
    for i in range(6):
        sentences = [f"Sentence {j} of document {i} tells the reader about topic {i * j % 7}." for j in range(80)]
        (texts / f"doc{i}.txt").write_text(" ".join(sentences) + "\n")
    data = root / "data"
    prepare(PrepareConfig(sources=[str(texts)], out_dir=str(data), val_fraction=0.5), progress=False)
    # an HF folder and a run dir (config.yaml + a verified checkpoint) of two different tiny models
    hf = root / "hf_model"
    tiny_model("fox-pro-tiny", vocab=VOCAB, seed=1).save_pretrained(str(hf))
    run = root / "run"
    run.mkdir()
    model = tiny_model("fox-llama-tiny", vocab=VOCAB, seed=2)
    with open(run / "config.yaml", "w") as f:
        yaml.safe_dump({"preset": "fox-llama-tiny", "model": {"attention_backend": "torch"}, "context": 32,
                        "tokenizer": "gpt2", "derived": {"vocab_size": VOCAB}}, f)
    save_checkpoint(str(run), 3, model.state_dict(), {}, {"tokens": 96}, keep_last=1)
    with open(run / "metrics.jsonl", "w") as f:
        for step in range(1, 4):
            f.write(json.dumps({"kind": "train", "step": step, "tokens": 32 * step, "loss": 10.0 - step}) + "\n")
        f.write(json.dumps({"kind": "eval", "step": 3, "tokens": 96, "val_loss": 7.5}) + "\n")
    return {"root": root, "texts": str(texts), "data": str(data), "hf": str(hf), "run": str(run), "model": model}


def _nonempty_png(path):
    assert os.path.exists(path), path
    with open(path, "rb") as f:
        head = f.read(8)
    assert head == b"\x89PNG\r\n\x1a\n" and os.path.getsize(path) > 2000


def test_load_model_from_run_dir_checkpoint_and_hf(workspace):
    run = load_model(workspace["run"], device="cpu")
    assert run.source == "run" and run.train_len == 32 and run.tokenizer == "gpt2" and run.step == 3
    for key, value in workspace["model"].state_dict().items():
        torch.testing.assert_close(run.model.state_dict()[key], value)
    step_dir = os.path.join(workspace["run"], "checkpoints", "step_00000003")
    ckpt = load_model(step_dir, device="cpu")
    assert ckpt.source == "checkpoint" and ckpt.name == "run@step_00000003" and ckpt.train_len == 32
    hf = load_model(workspace["hf"], device="cpu", train_len=64)
    assert hf.source == "hf" and hf.train_len == 64 and hf.model.config.num_layers == 2


def test_eval_loss_two_models_side_by_side(workspace, capsys):
    out = str(workspace["root"] / "loss_out")
    rc = main(["eval", "loss", workspace["run"], workspace["hf"], "--data", workspace["data"], "--seq-len", "64",
               "--num-seqs", "4", "--n-boot", "50", "--device", "cpu", "--out", out, "--no-progress",
               "--names", "fox-llama,fox-pro"])
    assert rc == 0
    printed = json.loads(capsys.readouterr().out)
    assert [m["name"] for m in printed["models"]] == ["fox-llama", "fox-pro"]
    data = json.load(open(os.path.join(out, "loss.json")))
    assert data["settings"]["seq_len"] == 64 and data["settings"]["num_seqs"] == 4
    first = data["models"][0]
    assert len(first["loss"]) == 63 and first["train_len"] == 32 and first["lengths"][-1] == 63
    assert first["summary"]["loss_beyond_train_len"] is not None
    for name in data["plots"]:
        _nonempty_png(os.path.join(out, name))


def test_eval_loss_within_documents_and_from_a_text_source(workspace, capsys):
    out = str(workspace["root"] / "loss_src")
    assert main(["eval", "loss", workspace["hf"], "--source", workspace["texts"], "--seq-len", "48", "--num-seqs",
                 "2", "--n-boot", "20", "--device", "cpu", "--out", out, "--no-progress"]) == 0
    assert json.load(open(os.path.join(out, "loss.json")))["models"][0]["n_sequences"] == 2
    assert "replacing" not in capsys.readouterr().err
    assert main(["eval", "loss", workspace["hf"], "--data", workspace["data"], "--within-docs", "--seq-len", "48",
                 "--num-seqs", "3", "--n-boot", "20", "--device", "cpu", "--out", out, "--no-progress"]) == 0
    # the second run's results take the first one's place, and the user is told
    assert f"note: replacing {os.path.join(out, 'loss.json')} (written " in capsys.readouterr().err


def test_eval_compare_of_models_of_different_tokenizers_says_their_losses_do_not_compare(workspace, tmp_path,
                                                                                          capsys):
    """A bytes model's evaluation and a GPT-2 model's were refused as different sequences, with the advice to run
    `eval loss` "with the same flags": no flags make losses per byte and per GPT-2 token comparable."""
    data = str(tmp_path / "bytes_data")
    prepare(PrepareConfig(sources=[workspace["texts"]], out_dir=data, tokenizer="bytes", val_fraction=0.5),
            progress=False)
    model = tmp_path / "bytes_model"
    tiny_model("fox-pro-tiny", vocab=257, tokenizer="bytes").save_pretrained(str(model))
    common = ["--seq-len", "48", "--num-seqs", "2", "--n-boot", "20", "--device", "cpu", "--no-progress"]
    gpt2, byte = str(tmp_path / "gpt2_eval"), str(tmp_path / "bytes_eval")
    assert main(["eval", "loss", workspace["hf"], "--data", workspace["data"], "--out", gpt2, *common]) == 0
    assert main(["eval", "loss", str(model), "--data", data, "--out", byte, *common]) == 0
    assert json.load(open(os.path.join(byte, "loss.json")))["settings"]["tokenizer"] == "bytes"
    capsys.readouterr()
    assert main(["eval", "compare", byte, gpt2, "--out", str(tmp_path / "compared")]) == 2
    err = capsys.readouterr().err
    tokenizer = read_manifest(workspace["data"])["tokenizer"]
    assert err.strip() == (f"error: {gpt2} and {byte} were evaluated on text tokenized by different tokenizers "
                           f"({tokenizer} against bytes): losses per token under different tokenizers cannot be "
                           f"compared (their tokens cover different amounts of text); compare only runs trained "
                           f"with the same tokenizer")
    assert "same flags" not in err and not (tmp_path / "compared").exists()


def test_analyze_gates_writes_stats_and_plots(workspace):
    out = str(workspace["root"] / "gates_out")
    assert main(["analyze", "gates", workspace["run"], "--data", workspace["data"], "--seq-len", "64", "--num-seqs",
                 "2", "--device", "cpu", "--out", out, "--no-progress", "--heads", "0:0,1:3"]) == 0
    data = json.load(open(os.path.join(out, "gates.json")))
    model = data["models"][0]
    assert model["heads_plotted"] == [[0, 0], [1, 3]]
    assert len(model["timescale"]) == 2 and len(model["timescale"][0]) == 4
    assert len(data["plots"]) == 5 and data["settings"]["attention_scale"] == "log"
    for name in data["plots"]:
        _nonempty_png(os.path.join(out, name))


def test_analyze_gates_says_the_units_of_its_summary(workspace, capsys):
    """The summary printed (and kept in gates.json) was numbers alone: "median_timescale": 1.05 did not say
    tokens, nor "heads_beyond_text" that it counts heads. A "units" entry beside the summaries says each."""
    out = str(workspace["root"] / "gates_units")
    capsys.readouterr()
    assert main(["analyze", "gates", workspace["run"], "--data", workspace["data"], "--seq-len", "32", "--num-seqs",
                 "1", "--device", "cpu", "--out", out, "--no-progress", "--heads", "0:0"]) == 0
    printed = json.loads(capsys.readouterr().out)
    (summary,) = printed["models"]
    numbers = {k for k, v in summary.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    assert numbers == set(printed["units"]) and printed["units"]["median_timescale"] == "tokens"
    assert printed["units"]["heads_beyond_text"].startswith("heads")
    saved = json.load(open(os.path.join(out, "gates.json")))
    assert saved["units"] == printed["units"] and saved["models"][0]["summary"] == summary


def test_analyze_gates_of_a_transformer_says_it_has_no_gates(workspace, capsys, tmp_path):
    """A Transformer's gates.json held a bare "has_gate": false beside one plot, with nothing said on the terminal."""
    hf = str(tmp_path / "transformer")
    tiny_model("transformer-llama-tiny", vocab=VOCAB, seed=3).save_pretrained(hf)
    out = str(tmp_path / "out")
    assert main(["analyze", "gates", hf, workspace["run"], "--data", workspace["data"], "--seq-len", "16",
                 "--num-seqs", "1", "--device", "cpu", "--out", out, "--no-progress", "--heads", "0:0"]) == 0
    notes = [line for line in capsys.readouterr().err.splitlines() if "forget gates" in line]
    assert notes == ["note: 'transformer' has no forget gates (a Transformer): gates.json records only has_gate "
                     "false, and its attention matrices are the one plot; the statistics are for FoX models"]
    data = json.load(open(os.path.join(out, "gates.json")))
    assert [m["summary"]["has_gate"] for m in data["models"]] == [False, True]
    assert [p for p in data["plots"] if "transformer" in p] == ["gates_transformer_attention.png"]


def test_eval_niah_and_report(workspace):
    out = os.path.join(workspace["run"], "eval")  # the default output folder of a run dir
    assert main(["eval", "niah", workspace["run"], "--haystack", workspace["texts"], "--lengths", "96,160",
                 "--depths", "0,1", "--needles", "1", "--device", "cpu", "--no-progress"]) == 0
    data = json.load(open(os.path.join(out, "niah.json")))
    model = data["models"][0]
    assert len(model["records"]) == 2 * 2 * 2 and model["train_len"] == 32
    assert set(model["grids"]) == {"standard", "easy"} and len(model["grids"]["easy"]["accuracy"]) == 2
    for name in data["plots"]:
        _nonempty_png(os.path.join(out, name))
    loss_dir = str(workspace["root"] / "loss_for_report")
    assert main(["eval", "loss", workspace["hf"], "--data", workspace["data"], "--seq-len", "40", "--num-seqs", "2",
                 "--n-boot", "20", "--device", "cpu", "--out", loss_dir, "--no-progress"]) == 0
    report_dir = str(workspace["root"] / "report")
    assert main(["report", workspace["run"], loss_dir, "--out", report_dir, "--format", "html"]) == 0
    page = open(os.path.join(report_dir, "report.html")).read()
    assert "Needle in a haystack" in page and "Per-position loss" in page and "Training" in page
    images = sorted(os.listdir(os.path.join(report_dir, "assets")))
    assert any(n.endswith("training.png") for n in images) and any("niah_heatmap" in n for n in images)
    for n in images:
        assert f"assets/{n}" in page
        _nonempty_png(os.path.join(report_dir, "assets", n))
    assert main(["report", workspace["run"], "--out", report_dir]) == 0
    assert "![" in open(os.path.join(report_dir, "report.md")).read()
    assert main(["report", workspace["run"]]) == 0  # one run dir, no --out: its report/ (not the current folder)
    assert "![" in open(os.path.join(workspace["run"], "report", "report.md")).read()


def _error(capsys) -> str:
    return capsys.readouterr().err


def _niah_on(run, haystack, lengths, out):
    return main(["eval", "niah", run, "--haystack", str(haystack), "--lengths", lengths, "--depths", "0", "--needles",
                 "1", "--modes", "standard", "--no-generate", "--device", "cpu", "--no-progress", "--out", str(out)])


def test_a_haystack_shorter_than_the_longest_context_is_refused_saying_what_it_holds(workspace, capsys, tmp_path):
    """The error said only that 8192 + 4096 tokens were needed, for a need of the longest context alone."""
    from foxformer.data import load_tokenizer

    text = "The tide came in over the flat grey sand. " * 20
    (tmp_path / "short.txt").write_text(text)
    held = len(load_tokenizer("gpt2").encode(text))
    assert _niah_on(workspace["run"], tmp_path / "short.txt", "96,512", tmp_path / "o") == 2
    assert _error(capsys).strip() == (f"error: --haystack: '{tmp_path / 'short.txt'}' holds {held} tokens, 512 are "
                                      f"needed; the longest of --lengths is 512 tokens: give a source with more text "
                                      f"or shorter --lengths")


def test_a_haystack_as_long_as_the_longest_context_serves_with_a_note(workspace, capsys, tmp_path):
    """It was refused unless it held 4096 tokens more than the longest context: room for the offsets only."""
    (tmp_path / "hay.txt").write_text("The tide came in over the flat grey sand. " * 30)
    assert _niah_on(workspace["run"], tmp_path / "hay.txt", "96,160", tmp_path / "o") == 0
    assert "note: --haystack holds" in _error(capsys)
    records = json.load(open(tmp_path / "o" / "niah.json"))["models"][0]["records"]
    assert sorted(r["length"] for r in records) == [96, 160]


def test_a_dataset_given_as_the_model_says_it_goes_to_data(workspace, capsys, tmp_path):
    """`eval loss DATA` said only that DATA has no config.json, config.yaml or model.pt."""
    data = workspace["data"]
    assert main(["eval", "loss", data, "--num-seqs", "2", "--device", "cpu", "--no-progress",
                 "--out", str(tmp_path)]) == 2
    line = _error(capsys).strip()
    assert line.startswith(f"error: model: {data!r} has no config.json") and line.endswith(
        "; it holds manifest.json: a prepared dataset, which commands that read one take as --data"), line


def test_bad_checkpoints_and_lengths_fail_clearly(workspace, capsys, tmp_path):
    data = workspace["data"]
    common = ["--data", data, "--num-seqs", "2", "--device", "cpu", "--no-progress", "--out", str(tmp_path)]
    assert main(["eval", "loss", str(tmp_path / "missing"), *common]) == 2
    assert "is not a directory" in _error(capsys)
    (tmp_path / "empty").mkdir()
    assert main(["eval", "loss", str(tmp_path / "empty"), *common]) == 2
    assert "no config.json" in _error(capsys)
    # a checkpoint whose weights were damaged after saving
    import shutil

    bad_run = tmp_path / "bad_run"
    shutil.copytree(workspace["run"], bad_run, ignore=shutil.ignore_patterns("eval"))
    with open(bad_run / "checkpoints" / "step_00000003" / "model.pt", "r+b") as f:
        f.seek(100)
        f.write(b"garbage")
    assert main(["eval", "loss", str(bad_run), *common]) == 2
    assert "corrupted" in _error(capsys)
    assert main(["eval", "loss", workspace["hf"], *common, "--seq-len", "100000"]) == 2
    size = read_manifest(data)["split"]["val"]["tokens"]
    assert _error(capsys).splitlines()[-1] == (f"error: --seq-len: split 'val' of {data!r} has {size} tokens, fewer "
                                               f"than one sequence of 100000; the largest workable --seq-len is {size}")
    assert main(["eval", "loss", workspace["hf"], *common, "--seq-len", str(size)]) == 0  # the largest does work
    capsys.readouterr()
    assert main(["eval", "loss", workspace["hf"], *common, "--seq-len", "1"]) == 2
    assert "--seq-len" in _error(capsys)
    assert main(["eval", "loss", workspace["hf"], "--device", "cpu", "--no-progress"]) == 2
    assert "--data" in _error(capsys)
    assert main(["eval", "niah", workspace["hf"], "--haystack", workspace["texts"], "--lengths", "8", "--device",
                 "cpu", "--no-progress", "--out", str(tmp_path)]) == 2
    assert "too short" in _error(capsys)


@pytest.mark.parametrize("argv, said", [
    pytest.param(["eval", "eviction", "{hf}", "--chunk", "0"], "--chunk: expected a positive integer, got 0",
                 id="eviction-chunk"),
    pytest.param(["eval", "eviction", "{hf}", "--prefill", "0"], "--prefill: expected a positive integer, got 0",
                 id="eviction-prefill"),
    pytest.param(["analyze", "gates", "{hf}", "--matrix-len", "0"],
                 "--matrix-len: expected a positive integer (tokens shown), got 0", id="gates-matrix-len"),
    pytest.param(["analyze", "gates", "{hf}", "--heads", "0:99"], "--heads: (0, 99) is outside 2 layers x 4 heads",
                 id="gates-heads-outside"),
    pytest.param(["analyze", "gates", "{hf}", "{hf}", "--names", "a b,a_b"],
                 "--names: models 'a b' and 'a_b' would get the same file names (gates_a_b_*.png); label them apart "
                 "in letters, digits, '.', '-' or '_'", id="gates-names"),
])
def test_errors_found_once_the_model_is_loaded_name_the_flag(workspace, capsys, tmp_path, argv, said):
    argv = [a.format(hf=workspace["hf"]) for a in argv]
    common = ["--data", workspace["data"], "--seq-len", "32", "--num-seqs", "1", "--device", "cpu", "--no-progress",
              "--out", str(tmp_path)]
    assert main([*argv, *common]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [f"error: {said}"]


def test_harness_command_without_lm_eval_says_how_to_install(workspace, capsys, tmp_path, monkeypatch):
    import sys

    for name in [m for m in sys.modules if m == "lm_eval" or m.startswith("lm_eval.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "lm_eval", None)  # imports fail as if it were not installed
    assert main(["eval", "harness", workspace["hf"], "--tasks", "lambada_openai", "--device", "cpu",
                 "--out", str(tmp_path), "--no-progress"]) == 2
    assert "pip install lm_eval" in _error(capsys)


@pytest.mark.parametrize("flags, said", [
    pytest.param([], "pip install lm_eval", id="no-lm-eval"),
    pytest.param(["--metadata", "{max_seq_lengths: [4096]}"], "--metadata: '{max_seq_lengths: [4096]}' is not JSON",
                 id="metadata-not-json"),
    pytest.param(["--metadata", "[4096]"], "--metadata: expected a JSON object", id="metadata-not-an-object")])
def test_harness_refuses_before_loading_any_model(capsys, tmp_path, monkeypatch, flags, said):
    """A missing lm_eval was found only after the models had loaded; a typo in --metadata too, in json's words
    naming no flag ("Expecting property name enclosed in double quotes")."""
    import sys

    if flags:
        pytest.importorskip("lm_eval")
    else:
        for name in [m for m in sys.modules if m == "lm_eval" or m.startswith("lm_eval.")]:
            monkeypatch.delitem(sys.modules, name)
        monkeypatch.setitem(sys.modules, "lm_eval", None)  # imports fail as if it were not installed
    missing = str(tmp_path / "not_loaded")  # loading it would be an error of its own
    assert main(["eval", "harness", missing, "--tasks", "lambada_openai", *flags, "--no-progress"]) == 2
    assert said in _error(capsys)


def _run_with_tokenizer(workspace, tmp_path, tokenizer: str) -> str:
    import shutil

    run = tmp_path / f"run_{tokenizer}"
    shutil.copytree(workspace["run"], run, ignore=shutil.ignore_patterns("eval"))
    cfg = yaml.safe_load(open(run / "config.yaml"))
    cfg["tokenizer"] = tokenizer
    yaml.safe_dump(cfg, open(run / "config.yaml", "w"))
    return str(run)


@pytest.mark.parametrize("command", [["eval", "loss"], ["analyze", "gates"]], ids=["eval-loss", "analyze-gates"])
def test_a_dataset_of_another_tokenizer_is_refused(workspace, capsys, tmp_path, command):
    # byte ids (< 257) are valid ids of a GPT-2 model too: the loss of a GPT-2 model on them was reported as is
    data = tmp_path / "bytes_data"
    prepare(PrepareConfig(sources=[workspace["texts"]], out_dir=str(data), tokenizer="bytes", val_fraction=0.5),
            progress=False)
    common = ["--data", str(data), "--seq-len", "32", "--num-seqs", "2", "--device", "cpu", "--no-progress",
              "--out", str(tmp_path / "out")]
    assert main([*command, workspace["run"], *common]) == 2
    err = _error(capsys)
    assert "tokenized with 'bytes'" in err and "'gpt2'" in err
    assert main([*command, _run_with_tokenizer(workspace, tmp_path, "bytes"), *common]) == 0
    capsys.readouterr()


def test_models_trained_with_different_tokenizers_are_not_fed_one_tokenization(workspace, capsys, tmp_path):
    # the first model's tokenizer was used for every model
    other = _run_with_tokenizer(workspace, tmp_path, "bytes")
    assert main(["eval", "niah", workspace["run"], other, "--haystack", workspace["texts"], "--lengths", "96",
                 "--depths", "0", "--needles", "1", "--modes", "standard", "--device", "cpu", "--no-progress",
                 "--out", str(tmp_path / "o")]) == 2
    err = _error(capsys)
    assert "different tokenizers" in err and "gpt2" in err and "bytes" in err
    assert main(["eval", "loss", workspace["run"], other, "--source", workspace["texts"], "--seq-len", "32",
                 "--num-seqs", "1", "--n-boot", "10", "--device", "cpu", "--no-progress",
                 "--out", str(tmp_path / "o")]) == 2
    assert "different tokenizers" in _error(capsys)


@pytest.mark.parametrize("command", [
    ["eval", "niah", "--lengths", "96", "--depths", "0", "--needles", "1", "--modes", "standard", "--haystack"],
    ["eval", "loss", "--seq-len", "32", "--num-seqs", "1", "--n-boot", "10", "--source"],
], ids=["eval-niah", "eval-loss-source"])
def test_a_tokenizer_other_than_the_runs_is_refused(workspace, capsys, tmp_path, command):
    # byte ids lie inside a GPT-2 model's vocabulary: --tokenizer bytes ran a GPT-2 run on bytes and reported it
    common = [*command, workspace["texts"], "--device", "cpu", "--no-progress", "--out", str(tmp_path / "o")]
    assert main([*common[:2], workspace["run"], *common[2:], "--tokenizer", "bytes"]) == 2
    err = _error(capsys)
    assert "--tokenizer" in err and "'bytes'" in err and "'gpt2'" in err
    assert main([*common[:2], workspace["run"], *common[2:], "--tokenizer", "tiktoken:gpt2"]) == 0  # same one
    capsys.readouterr()


def test_compare_tells_windows_inside_documents_from_plain_windows(workspace, capsys, tmp_path):
    # both evaluations recorded only data and split: compare put different sequences side by side
    common = ["--data", workspace["data"], "--seq-len", "48", "--num-seqs", "2", "--n-boot", "10", "--device", "cpu",
              "--no-progress"]
    assert main(["eval", "loss", workspace["hf"], *common, "--out", str(tmp_path / "plain")]) == 0
    assert main(["eval", "loss", workspace["hf"], *common, "--within-docs", "--out", str(tmp_path / "docs")]) == 0
    capsys.readouterr()
    assert main(["eval", "compare", str(tmp_path / "plain"), str(tmp_path / "docs"), "--out",
                 str(tmp_path / "cmp")]) == 2
    assert "same sequences" in _error(capsys)


def test_report_links_of_a_run_dir_with_spaces_resolve(workspace, tmp_path):
    # Markdown link targets end at a space: "![x](assets/0_my run_training.png)" showed no image
    import re
    import shutil

    run = tmp_path / "my run"
    shutil.copytree(workspace["run"], run, ignore=shutil.ignore_patterns("eval"))
    out = tmp_path / "the report"
    assert main(["report", str(run), "--out", str(out)]) == 0
    links = re.findall(r"!\[[^\]]*\]\(([^)]*)\)", (out / "report.md").read_text())
    assert links
    for link in links:
        assert " " not in link and (out / link).is_file(), link


def test_analyze_gates_refuses_labels_that_share_plot_files(workspace, capsys, tmp_path):
    # "a b" and "a_b" both became gates_a_b_*.png: the second model's plots overwrote the first one's
    out = tmp_path / "gates_out"
    assert main(["analyze", "gates", workspace["run"], workspace["hf"], "--names", "a b,a_b", "--data",
                 workspace["data"], "--seq-len", "32", "--num-seqs", "1", "--device", "cpu", "--out", str(out),
                 "--no-progress"]) == 2
    assert "'a b' and 'a_b' would get the same file names (gates_a_b_*.png)" in _error(capsys)
    assert not out.exists()


def test_report_of_a_missing_folder_is_an_error_that_leaves_nothing_behind(tmp_path, capsys):
    """A typo (runs/qiuck) wrote runs/qiuck/report/report.md saying "No results found", exit code 0."""
    missing = tmp_path / "qiuck"
    assert main(["report", str(missing)]) == 2
    assert "no run folder" in capsys.readouterr().err and not missing.exists()


def test_report_of_folders_without_results_is_an_error_that_leaves_nothing_behind(tmp_path, capsys):
    """A dataset, an export or a checkpoint given in place of its run got a report/ folder whose page said "No
    results found", exit code 0. Among folders with results, one without keeps its line on the page."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "manifest.json").write_text("{}")
    assert main(["report", str(data)]) == 2
    assert _error(capsys).startswith(f"error: report: no results in '{data}' (looked for metrics.jsonl and loss.json")
    assert os.listdir(data) == ["manifest.json"]
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text(json.dumps({"kind": "train", "step": 1, "tokens": 8, "loss": 3.0}) + "\n")
    assert main(["report", str(data), str(run), "--out", str(tmp_path / "both")]) == 0
    assert f"No results found in {data}" in (tmp_path / "both" / "report.md").read_text()


def test_eval_loss_refuses_context_lengths_beyond_seq_len_before_loading_a_model(tmp_path, capsys):
    missing = str(tmp_path / "not_loaded")  # loading it would be an error of its own
    assert main(["eval", "loss", missing, "--seq-len", "512", "--lengths", "256,1Ki", "--no-progress"]) == 2
    assert "--lengths: context lengths must lie in [1, 511] (--seq-len - 1), got [1024]" in _error(capsys)


def test_eval_loss_says_when_fewer_sequences_fit_than_asked(workspace, tmp_path, capsys):
    """The results held 4 sequences for --num-seqs 64 and only the JSON said so."""
    out = tmp_path / "few"
    assert main(["eval", "loss", workspace["hf"], "--data", workspace["data"], "--seq-len", "256", "--num-seqs", "64",
                 "--out", str(out), "--device", "cpu", "--no-progress"]) == 0
    n = json.loads((out / "loss.json").read_text())["models"][0]["summary"]["n_sequences"]
    assert n < 64 and f"note: only {n} sequences of 256 tokens" in capsys.readouterr().err


@pytest.mark.parametrize("where", [pytest.param("--source", id="text-source"),
                                   pytest.param("--within-docs", id="within-docs")])
def test_too_few_sequences_of_documents_are_not_blamed_on_seq_len_alone(workspace, tmp_path, capsys, where):
    """A text source and --within-docs take one window per document: "a shorter --seq-len gives more" sent the
    user to shorten sequences that every document already gave."""
    data = ["--source", workspace["texts"]] if where == "--source" else ["--data", workspace["data"], "--within-docs"]
    assert main(["eval", "loss", workspace["hf"], *data, "--seq-len", "48", "--num-seqs", "9", "--n-boot", "5",
                 "--out", str(tmp_path), "--device", "cpu", "--no-progress"]) == 0
    n = json.loads((tmp_path / "loss.json").read_text())["models"][0]["n_sequences"]
    assert f"note: only {n} sequences of 48 tokens" in (err := _error(capsys))
    assert "each document that long gives one; a shorter --seq-len lets more documents in" in err


def test_the_replace_note_names_every_file_a_command_replaces(tmp_path, capsys):
    from foxformer.eval.outputs import note_replacing

    # a second two-model `eval harness` replaces the second model's file too, not only the first's
    (tmp_path / "harness_b.json").write_text("{}")
    note_replacing(str(tmp_path / "harness_a.json"), str(tmp_path / "harness_b.json"))
    err = capsys.readouterr().err
    assert f"replacing {tmp_path / 'harness_b.json'}" in err and "harness_a.json" not in err


@pytest.mark.parametrize("command, flags", [
    ("loss", ["--source", "SOURCE", "--data", "DATA", "--n-boot", "20"]),
    ("gates", ["--source", "SOURCE", "--data", "DATA"]),
    ("eviction", ["--source", "SOURCE", "--data", "DATA"]),
    ("niah", ["--haystack", "SOURCE", "--lengths", "200000", "--depths", "0", "--needles", "1", "--no-generate"]),
], ids=["eval-loss", "analyze-gates", "eval-eviction", "eval-niah"])
def test_no_replace_note_when_a_check_fails_before_anything_is_written(workspace, tmp_path, capsys, command,
                                                                        flags):
    """The note came before the checks that follow loading the models: `eval loss --data D --source S` announced
    replacing loss.json, then failed and left it as it was."""
    name = {"gates": "gates.json"}.get(command, f"{command}.json")
    (tmp_path / name).write_text("{}")
    flags = [workspace["texts"] if f == "SOURCE" else workspace["data"] if f == "DATA" else f for f in flags]
    head = ["analyze", "gates"] if command == "gates" else ["eval", command]
    assert main([*head, workspace["hf"], *flags, "--device", "cpu", "--out", str(tmp_path), "--no-progress"]) != 0
    err = _error(capsys)
    assert "error:" in err and "replacing" not in err
    assert (tmp_path / name).read_text() == "{}"


def test_eval_loss_reads_a_jsonl_source_by_its_text_field(workspace, tmp_path, capsys):
    """`--source notes.jsonl` whose text is in "body" failed with "set text_field / --text-field", a flag these
    commands did not have."""
    notes = tmp_path / "notes.jsonl"
    notes.write_text("".join(json.dumps({"body": "words of a note, long enough for a window " * 4}) + "\n"
                             for _ in range(3)))
    out = str(tmp_path / "loss")
    argv = ["eval", "loss", workspace["hf"], "--source", str(notes), "--seq-len", "40", "--num-seqs", "2",
            "--n-boot", "10", "--device", "cpu", "--out", out, "--no-progress"]
    assert main(argv) == 2
    assert "has no field 'text'" in capsys.readouterr().err
    assert main(argv + ["--text-field", "body"]) == 0
    assert json.load(open(os.path.join(out, "loss.json")))["models"][0]["n_sequences"] == 2


def test_eval_loss_names_the_source_flag_of_a_bad_source(workspace, tmp_path, capsys):
    """The source's reader said `source: ...`, the Python API's name (source_sequences keeps it)."""
    from foxformer.data import load_tokenizer
    from foxformer.eval.sequences import source_sequences

    missing = str(tmp_path / "nope")
    assert main(["eval", "loss", workspace["hf"], "--source", missing, "--seq-len", "40", "--num-seqs", "1",
                 "--n-boot", "10", "--device", "cpu", "--out", str(tmp_path / "loss"), "--no-progress"]) == 2
    assert f"error: --source: '{missing}' does not exist" in _error(capsys)
    with pytest.raises(ValueError, match=f"^source: '{missing}' does not exist"):
        source_sequences(missing, load_tokenizer("bytes"), 8, 1)


def test_eval_loss_of_a_run_defaults_to_the_data_it_trained_on(workspace, tmp_path, capsys):
    """`eval loss RUN` without --data stopped; the run's config.yaml names its dataset."""
    run = tmp_path / "run"
    shutil.copytree(workspace["run"], run)
    saved = yaml.safe_load(open(run / "config.yaml"))
    yaml.safe_dump({**saved, "data_dir": workspace["data"]}, open(run / "config.yaml", "w"))
    out = str(tmp_path / "loss")
    assert main(["eval", "loss", str(run), "--seq-len", "48", "--num-seqs", "2", "--n-boot", "10", "--device",
                 "cpu", "--out", out, "--no-progress"]) == 0
    assert f"note: --data {workspace['data']} (the dataset the runs trained on" in capsys.readouterr().err
    assert json.load(open(os.path.join(out, "loss.json")))["settings"]["data"] == workspace["data"]


def test_eval_loss_says_why_the_runs_dataset_does_not_stand_in_for_data(workspace, tmp_path, capsys):
    """`eval loss A B` of runs trained on different datasets (or on one since removed) asked for --data or --source
    as if it had not looked at the runs' datasets."""
    runs = []
    for name, data in (("a", workspace["data"]), ("b", str(tmp_path / "other_data"))):
        runs.append(str(tmp_path / name))
        shutil.copytree(workspace["run"], runs[-1])
        saved = yaml.safe_load(open(os.path.join(runs[-1], "config.yaml")))
        yaml.safe_dump({**saved, "data_dir": data}, open(os.path.join(runs[-1], "config.yaml"), "w"))
    flags = ["--seq-len", "48", "--num-seqs", "2", "--device", "cpu", "--out", str(tmp_path / "loss"), "--no-progress"]
    asked = "error: pass --data DIR (a prepared dataset) or --source SPEC (text) to evaluate on"
    assert main(["eval", "loss", *runs, *flags]) == 2
    assert _error(capsys).splitlines()[-1] == (f"{asked} (the runs trained on different datasets: {workspace['data']}, "
                              f"{tmp_path / 'other_data'})")
    assert main(["eval", "loss", runs[1], *flags]) == 2
    assert _error(capsys).splitlines()[-1] == f"{asked} (the dataset the run trained on, {tmp_path / 'other_data'}, is not there)"
    assert main(["eval", "loss", workspace["hf"], *flags]) == 2
    assert _error(capsys).splitlines()[-1] == asked


def test_eval_loss_of_a_folder_says_what_it_left_out_as_data_prepare_does(workspace, tmp_path, capsys):
    """`eval loss --source FOLDER` passed over a folder's empty documents and its files of other kinds in silence,
    where `data prepare` of the same folder says so: both now give the same notes. eval loss stops reading once it
    has --num-seqs sequences, and its count of empty documents, of those read, read as the whole folder's: it says
    so, where data prepare, which reads them all, counts the one after that point too."""
    from foxformer.data.sources import kinds_said

    src = tmp_path / "project"
    src.mkdir()
    for i in range(4):
        (src / f"doc{i}.txt").write_text(f"document {i} of the project, long enough for a window " * 4)
    # read in name order: blank.txt before the three documents that give --num-seqs 3, empty.md after them
    (src / "blank.txt").write_text("  \n\t\n")
    (src / "empty.md").write_text("")
    for name in ("a.py", "b.py", "LICENSE"):
        (src / name).write_text("x = 1\n")

    def notes(err: str) -> list[str]:
        return [line for line in err.splitlines() if line.startswith(f"note: {src}:")]

    assert main(["eval", "loss", workspace["hf"], "--source", str(src), "--seq-len", "40", "--num-seqs", "3",
                 "--n-boot", "10", "--device", "cpu", "--out", str(tmp_path / "loss"), "--no-progress"]) == 0
    said = notes(capsys.readouterr().err)
    left_out = (f"note: {src}: 3 file(s) of kinds not read as documents left out (2 .py, 1 (no extension)); "
                f"read are {kinds_said()}")
    assert said == [f"note: {src}: 1 empty document(s) (or only whitespace) left out among the first 4 documents "
                    f"read (reading stopped there, with enough text), the first at {src / 'blank.txt'}",
                    left_out], said
    assert main(["data", "prepare", "--source", str(src), "--out", str(tmp_path / "data"), "--tokenizer", "bytes",
                 "--no-progress"]) == 0
    assert notes(capsys.readouterr().err) == [f"note: {src}: 2 empty document(s) (or only whitespace) left out, the "
                                              f"first at {src / 'blank.txt'}", left_out]
