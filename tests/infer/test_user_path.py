"""Generation at its edges, as a user meets them: a huge --max-new-tokens, an empty input, a prompt past the
training context, a prompt file that is not UTF-8, a damaged export."""
import itertools
import os

import pytest
import torch
import yaml

from foxformer.cli import main
from foxformer.infer import GenerationConfig, stream_tokens

from .conftest import make_model, tokens


def _error(capsys) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert "Traceback" not in err and lines and lines[-1].startswith("error: "), err
    return lines[-1]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A run folder as training leaves it for generation: config.yaml (context 16, byte tokens) and hf/."""
    run = tmp_path_factory.mktemp("run")
    make_model("fox-pro-tiny", dtype=torch.float32).save_pretrained(run / "hf")
    (run / "config.yaml").write_text(yaml.safe_dump({"preset": "fox-pro-tiny", "context": 16, "tokenizer": "bytes"}))
    return run


def test_a_huge_max_new_tokens_grows_the_cache_instead_of_allocating_it():
    """--max-new-tokens 1000000000 sized the cache for a billion tokens before the first one (256 GB on the
    125M model): it now starts at the model's context and grows as tokens come."""
    model = make_model("fox-pro-tiny")
    state: dict = {}
    stream = stream_tokens(model, tokens(1, 5), GenerationConfig(max_new_tokens=10**9, temperature=0), state)
    assert len(list(itertools.islice(stream, 3))) == 3
    held = max(layer.capacity for layer in state["cache"].layers)
    assert 0 < held <= model.config.max_position_embeddings


def test_an_empty_input_is_a_clear_error():
    """model(ids of shape [1, 0]) was an IndexError inside a layer."""
    model = make_model("fox-pro-tiny")
    for shape in ((1, 0), (0, 4)):
        with pytest.raises(ValueError, match="at least one token"):
            model(torch.zeros(shape, dtype=torch.long))


def test_an_empty_prompt_is_one_error_line(run_dir, capsys):
    assert main(["generate", "--model", str(run_dir / "hf"), "--prompt", "", "--device", "cpu"]) == 2
    assert _error(capsys) == "error: --prompt: encodes to no tokens; give at least one character"


def test_a_prompt_file_that_cannot_be_read_is_named_by_its_flag(run_dir, tmp_path, capsys):
    """The line named the path alone ("no such file or directory (/nonexistent): check the path")."""
    missing = str(tmp_path / "nonexistent")
    assert main(["generate", str(run_dir), "--prompt-file", missing, "--device", "cpu"]) == 2
    assert _error(capsys) == f"error: --prompt-file: {missing!r}: no such file or directory"


def test_a_prompt_past_the_training_context_warns_once(run_dir, capsys):
    """The command warns in the library's words (foxformer.generate's), once: the export records no train_len, so
    the length is the run's config.yaml's. A prompt within it whose new tokens run past warns too (the command
    counted the prompt alone)."""
    for prompt, new, past in (("x" * 40, 2, "may reach 42 tokens, 26 past"),
                              ("x" * 8, 20, "may reach 28 tokens, 12 past")):
        assert main(["generate", "--model", str(run_dir / "hf"), "--prompt", prompt, "--max-new-tokens", str(new),
                     "--temperature", "0", "--device", "cpu"]) == 0
        err = capsys.readouterr().err
        said = [line for line in err.splitlines() if line.startswith("warning: ")]
        assert said == [f"warning: generate: the prompt and new tokens {past} the 16 this model was trained on "
                        f"(train_len); it runs on, but quality may drop past the trained length (FoX, without "
                        f"position embeddings, degrades gracefully; a Transformer with RoPE, badly)"], err
    assert main(["generate", "--model", str(run_dir / "hf"), "--prompt", "x" * 8, "--max-new-tokens", "2",
                 "--device", "cpu"]) == 0
    assert "warning" not in capsys.readouterr().err


def test_a_prompt_file_that_is_not_utf8_names_the_file_and_line(run_dir, tmp_path, capsys):
    prompt = tmp_path / "prompt.txt"
    prompt.write_bytes(b"first line\nsecond \xe9t\xe9\n")  # Latin-1
    assert main(["generate", "--model", str(run_dir / "hf"), "--prompt-file", str(prompt), "--device", "cpu"]) == 2
    assert f"{prompt}: line 2, column 8 is not UTF-8 (byte 0xe9)" in _error(capsys)


def test_a_prompt_file_that_is_binary_is_said_to_be_one(run_dir, tmp_path, capsys):
    """An image given as the prompt was told to be converted from Latin-1, and to be left out."""
    prompt = tmp_path / "prompt.png"
    prompt.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x01\x00\x00\x00\x01\x00\x08\x06\x00\x00\x00")
    assert main(["generate", "--model", str(run_dir / "hf"), "--prompt-file", str(prompt), "--device", "cpu"]) == 2
    assert _error(capsys) == (f"error: {prompt} looks like a binary file, not text (17 of its first 29 bytes are "
                              f"NUL or other control bytes): give another file")


def test_a_truncated_safetensors_file_is_one_error_line(run_dir, tmp_path, capsys):
    """A cut-short model.safetensors ended in a SafetensorError traceback."""
    import shutil

    hf = tmp_path / "hf"
    shutil.copytree(run_dir / "hf", hf)
    weights = hf / "model.safetensors"
    os.truncate(weights, os.path.getsize(weights) // 2)
    assert main(["generate", "--model", str(hf), "--prompt", "x", "--tokenizer", "bytes", "--device", "cpu"]) == 2
    line = _error(capsys)
    assert f"could not load Hugging Face folder '{hf}'" in line and "export it again" in line


@pytest.mark.parametrize("inside", ["checkpoints", "checkpoints/latest", "checkpoints/step_00000099"],
                         ids=["checkpoints-folder", "latest-pointer-file", "missing-step"])
def test_a_path_inside_a_run_that_is_no_model_names_the_run_dir(run_dir, tmp_path, capsys, inside):
    """RUN/checkpoints (or its `latest` pointer, or a step that is not there) said only what it is not; the run dir is
    what loads the latest checkpoint."""
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.yaml").write_text((run_dir / "config.yaml").read_text())
    (run / "checkpoints" / "latest").write_text("step_00000008\n")
    assert main(["generate", str(run / inside), "--prompt", "x", "--device", "cpu"]) == 2
    assert _error(capsys).endswith(f"; for the run's latest checkpoint pass the run dir {run}")


def test_a_checkpoint_whose_weights_are_gone_names_the_missing_file(run_dir, tmp_path, capsys):
    """Given itself, a checkpoint without its model.pt (a partial copy) was "not a Hugging Face folder, a run dir or a
    checkpoint; for the run's latest checkpoint pass the run dir", which is this very checkpoint: the run dir then
    said what is wrong, and so does the checkpoint now."""
    from foxformer.train.checkpoint import save_checkpoint

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text((run_dir / "config.yaml").read_text())
    step = save_checkpoint(str(run), 8, make_model("fox-pro-tiny").state_dict(), {}, {"tokens": 64}, keep_last=1)
    os.remove(os.path.join(step, "model.pt"))
    for given in (step, str(run)):
        assert main(["generate", given, "--prompt", "x", "--device", "cpu"]) == 2
        assert _error(capsys).startswith(f"error: model: checkpoint: {step!r} is missing model.pt; load another")


@pytest.mark.parametrize("command", [
    ["generate", "RUN", "--prompt", "a b", "--max-new-tokens", "2"],
    ["bias-shift", "RUN", "--source", "TEXT", "--seq-len", "8", "--num-seqs", "1", "--shifts", "0"],
    ["eval", "loss", "RUN", "--source", "TEXT", "--seq-len", "8", "--num-seqs", "1", "--n-boot", "10"],
], ids=["generate", "bias-shift", "eval-loss"])
def test_a_tokenizer_folder_saved_again_since_the_runs_data_is_one_error_line(tmp_path, capsys, command):
    """A run names its tokenizer by its folder: another tokenizer saved there since its data was prepared
    tokenized prompts and text into ids that stood for other tokens in the model's training, without a word."""
    from ..data.helpers import word_dataset, word_tokenizer

    data, tok = word_dataset(tmp_path)
    run = tmp_path / "run"
    make_model("fox-pro-tiny", dtype=torch.float32).save_pretrained(run / "hf")
    (run / "config.yaml").write_text(yaml.safe_dump({"preset": "fox-pro-tiny", "context": 16,
                                                     "tokenizer": f"hf:{tok}", "data_dir": data}))
    text = tmp_path / "text.txt"
    text.write_text(" ".join(["a", "b"] * 20))
    argv = [{"RUN": str(run), "TEXT": str(text)}.get(a, a) for a in command] + ["--device", "cpu"]
    assert main(argv) == 0  # the tokenizer the data was made with
    word_tokenizer(tok, {"b": 1, "a": 2})
    assert main(argv) == 2
    line = _error(capsys)
    assert f"run was trained on {data!r}, and the files of the tokenizer 'hf:{tok}' changed since" in line
    assert line.endswith("save the tokenizer the data was made with back in its folder, or train on data prepared "
                         "again with the new one")


def test_bias_shift_refuses_a_dataset_of_another_tokenizer_as_eval_loss_does(run_dir, tmp_path, capsys):
    """--data was read bare: a dataset another tokenizer made, its ids within the model's vocabulary, gave losses
    of garbage that looked valid, and a --tokenizer beside --data was dropped in silence."""
    from ..data.helpers import word_dataset

    words, tok = word_dataset(tmp_path)
    argv = ["bias-shift", str(run_dir), "--seq-len", "8", "--num-seqs", "1", "--shifts", "0", "--bins", "2",
            "--device", "cpu", "--no-progress", "--out", str(tmp_path / "shift.json")]
    assert main(argv + ["--data", words]) == 2
    assert _error(capsys) == (f"error: --data: {words!r} was tokenized with 'hf:{tok}', but {run_dir.name} was "
                              f"trained with 'bytes'; prepare the data with --tokenizer bytes")
    text = tmp_path / "text.txt"
    text.write_text("the quick brown fox jumps over the lazy dog " * 4)
    data = str(tmp_path / "bytes")
    assert main(["data", "prepare", "--source", str(text), "--out", data, "--tokenizer", "bytes", "--val-fraction",
                 "0", "--no-progress"]) == 0
    assert main(argv + ["--data", data, "--split", "train", "--tokenizer", "gpt2"]) == 2
    assert _error(capsys) == (f"error: --tokenizer: 'gpt2' tokenizes --source text, and --data {data!r} holds "
                              f"tokens already (made with 'bytes'); leave --tokenizer out, or give the text as "
                              f"--source")
    assert main(argv + ["--data", data, "--split", "train"]) == 0


def test_bias_shift_refuses_a_flag_of_the_other_kind_of_text(run_dir, tmp_path, capsys):
    """--text-field beside --data, and --split beside --source, were dropped without a word."""
    text = tmp_path / "text.txt"
    text.write_text("the quick brown fox jumps over the lazy dog " * 4)
    data = str(tmp_path / "bytes")
    assert main(["data", "prepare", "--source", str(text), "--out", data, "--tokenizer", "bytes", "--no-progress"]) == 0
    argv = ["bias-shift", str(run_dir), "--seq-len", "8", "--num-seqs", "1", "--shifts", "0", "--device", "cpu",
            "--no-progress", "--out", str(tmp_path / "shift.json")]
    assert main(argv + ["--data", data, "--text-field", "body"]) == 2
    assert _error(capsys) == (f"error: --text-field: reads --source text, and --data {data!r} holds tokens already; "
                              f"leave --text-field out")
    assert main(argv + ["--source", str(text), "--split", "train"]) == 2
    assert _error(capsys) == (f"error: --split: reads a --data dataset, and --source {str(text)!r} is text; leave "
                              f"--split out")
    assert not (tmp_path / "shift.json").exists()


def test_bias_shift_names_its_flags_and_advises_only_what_it_takes(run_dir, tmp_path, capsys):
    """--source text too short for --seq-len was refused as "seq_len:", a missing source as "source:", and a dataset
    without a document of --seq-len tokens was told to drop --within-docs, a flag bias-shift does not have (it
    always reads within documents)."""
    text = tmp_path / "text.txt"
    text.write_text("the quick brown fox jumps over the lazy dog " * 4)
    data = str(tmp_path / "bytes")
    assert main(["data", "prepare", "--source", str(text), "--out", data, "--tokenizer", "bytes", "--val-fraction",
                 "0", "--no-progress"]) == 0
    argv = ["bias-shift", str(run_dir), "--seq-len", "1000", "--num-seqs", "1", "--shifts", "0", "--device", "cpu",
            "--no-progress", "--out", str(tmp_path / "shift.json")]
    assert main(argv + ["--source", str(text)]) == 2
    assert _error(capsys) == (f"error: --seq-len: no document of {str(text)!r} has 1000 tokens; lower --seq-len or "
                              f"use a source with longer documents")
    assert main(argv + ["--source", str(tmp_path / "missing.txt")]) == 2
    assert _error(capsys).startswith(f"error: --source: {str(tmp_path / 'missing.txt')!r} does not exist")
    assert main(argv + ["--data", data, "--split", "train"]) == 2
    said = _error(capsys)
    assert said.startswith("error: --seq-len: no document of split 'train'") and "within" not in said
    assert said.endswith("lower --seq-len or give a dataset with longer documents")


def test_bias_shift_refuses_a_sequence_length_before_its_model_loads(run_dir, tmp_path, capsys, monkeypatch):
    """--seq-len 1 and --num-seqs 0 were refused only after the model had loaded."""
    import foxformer.train.loading as loading

    def no_load(*args, **kwargs):
        raise AssertionError("the model loaded before the flags were checked")

    monkeypatch.setattr(loading, "load_model", no_load)
    argv = ["bias-shift", str(run_dir), "--source", "builtin:pydoc", "--shifts", "0", "--device", "cpu",
            "--no-progress", "--out", str(tmp_path / "shift.json")]
    for extra, said in ((["--seq-len", "1"], "--seq-len: expected an integer >= 2"),
                        (["--num-seqs", "0"], "--num-seqs: expected a positive integer, got 0")):
        assert main(argv + extra) == 2
        assert _error(capsys).startswith(f"error: {said}")
