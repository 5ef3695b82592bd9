"""Evaluation commands as a user meets them: a damaged checkpoint gets evaluation advice, not training's, and
--no-progress is quiet."""
import json
import os
import signal
import subprocess
import sys

import yaml

from foxformer.cli import main
from foxformer.train.checkpoint import latest_checkpoint, save_checkpoint

from .helpers import tiny_model

SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "src")


def _run(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(yaml.safe_dump({"preset": "fox-pro-tiny", "model": {"attention_backend": "torch"},
                                                     "context": 32, "tokenizer": "bytes"}))
    save_checkpoint(str(run), 2, tiny_model("fox-pro-tiny", vocab=320).state_dict(), {}, {"tokens": 64}, keep_last=1)
    src = tmp_path / "doc.txt"
    src.write_text("a few words of text to read " * 20)
    return str(run), str(src)


def test_a_corrupted_checkpoint_met_by_eval_or_generate_gets_their_advice(tmp_path, capsys):
    """It said 'resume from another checkpoint with resume=<dir> or start a new run in another out_dir'."""
    run, src = _run(tmp_path)
    weights = os.path.join(latest_checkpoint(run), "model.pt")
    data = bytearray(open(weights, "rb").read())
    data[len(data) // 2] ^= 0xFF
    open(weights, "wb").write(bytes(data))
    for argv in (["eval", "loss", run, "--source", src, "--seq-len", "32", "--num-seqs", "1", "--device", "cpu",
                  "--no-progress"],
                 ["generate", "--model", run, "--prompt", "a", "--device", "cpu"]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert "Traceback" not in err and "model.pt is corrupted" in err, err
        assert "load another checkpoint (RUN/checkpoints/step_N)" in err and "resume" not in err, err


def test_no_progress_also_silences_the_weight_loading_bars(tmp_path, capsys):
    hf = tmp_path / "hf"
    tiny_model("fox-pro-tiny", vocab=320).save_pretrained(str(hf))
    src = tmp_path / "doc.txt"
    src.write_text("a few words of text to read " * 20)
    capsys.readouterr()
    assert main(["eval", "loss", str(hf), "--source", str(src), "--tokenizer", "bytes", "--seq-len", "32",
                 "--num-seqs", "1", "--n-boot", "10", "--device", "cpu", "--out", str(tmp_path / "out"),
                 "--no-progress"]) == 0
    assert "Loading weights" not in capsys.readouterr().err


def test_eval_data_checks_a_tokenizer_folder_by_content_not_by_name(tmp_path, capsys):
    """--data compared the model's tokenizer with the dataset's by name only: a dataset prepared after another
    tokenizer was saved in the folder (or before, and evaluated after) was read as the model's ids."""
    from foxformer.data.preparation import PrepareConfig, prepare

    from ..data.helpers import word_dataset, word_tokenizer

    data, tok = word_dataset(tmp_path)
    run = tmp_path / "run"
    tiny_model("fox-pro-tiny", vocab=320).save_pretrained(str(run / "hf"))
    (run / "config.yaml").write_text(yaml.safe_dump({"preset": "fox-pro-tiny", "context": 32,
                                                     "tokenizer": f"hf:{tok}", "data_dir": data}))
    argv = ["eval", "loss", str(run), "--seq-len", "32", "--num-seqs", "1", "--n-boot", "10", "--device", "cpu",
            "--no-progress", "--out", str(tmp_path / "eval")]
    other = str(tmp_path / "other")
    prepare(PrepareConfig(sources=[str(tmp_path / "words.jsonl")], out_dir=other, tokenizer=tok, val_fraction=0.5),
            progress=False)
    assert main(argv + ["--data", other]) == 0  # the same tokenizer: accepted
    capsys.readouterr()
    word_tokenizer(tok, {"b": 1, "a": 2})
    assert main(argv + ["--data", other]) == 2
    err = capsys.readouterr().err
    assert f"--data: {other!r}: the files of the tokenizer 'hf:{tok}' changed since the data was prepared" in err
    newer = str(tmp_path / "newer")  # the folder's new tokenizer made it: the model's training data had the old one
    prepare(PrepareConfig(sources=[str(tmp_path / "words.jsonl")], out_dir=newer, tokenizer=tok, val_fraction=0.5),
            progress=False)
    assert main(argv + ["--data", newer]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and f"run was trained on {data!r}, and the files of the tokenizer 'hf:{tok}' " \
                                      f"changed since" in err, err


def test_a_tokenizer_other_than_the_datasets_is_refused_not_dropped(tmp_path, capsys):
    """--tokenizer with --data was dropped in silence: the loss was the dataset's ids', not the named tokenizer's."""
    run, src = _run(tmp_path)
    data = str(tmp_path / "data")
    assert main(["data", "prepare", "--source", src, "--out", data, "--tokenizer", "bytes", "--no-progress"]) == 0
    argv = ["eval", "loss", run, "--data", data, "--split", "train", "--seq-len", "32", "--num-seqs", "1",
            "--n-boot", "10", "--device", "cpu", "--out", str(tmp_path / "out"), "--no-progress"]
    capsys.readouterr()
    assert main(argv + ["--tokenizer", "gpt2"]) == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"error: --tokenizer: 'gpt2' tokenizes --source text, and --data '{data}' holds tokens already (made with "
        f"'bytes'); leave --tokenizer out, or give the text as --source")
    assert main(argv + ["--tokenizer", "bytes"]) == 0  # the dataset's own: scripts that pass it still run


def test_a_jsonl_haystack_is_refused_after_its_flag_and_read_by_text_field(tmp_path, capsys):
    """The refusal said `source: ...; set text_field / --text-field`: a name the user never typed, and advice to use
    a flag niah did not have."""
    run, _ = _run(tmp_path)
    hay = tmp_path / "hay.jsonl"
    hay.write_text("".join(json.dumps({"body": f"Line {i} of a long record about the tide and the sand. " * 8}) + "\n"
                           for i in range(20)))
    argv = ["eval", "niah", run, "--haystack", str(hay), "--lengths", "256", "--depths", "0", "--needles", "1",
            "--modes", "standard", "--no-generate", "--device", "cpu", "--no-progress", "--out", str(tmp_path / "o")]
    capsys.readouterr()
    assert main(argv) == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"error: --haystack: {hay}:1 has no field 'text' (its fields: 'body'); set text_field / --text-field")
    assert main(argv + ["--text-field", "body"]) == 0


def test_eval_names_its_flags_not_the_apis_keywords(tmp_path, capsys):
    """--train-len 0 was refused as "train_len:", --data-source without --within-docs as "data source:", and a
    --data that is no dataset as "data:"."""
    run, src = _run(tmp_path)
    data = str(tmp_path / "data")
    assert main(["data", "prepare", "--source", src, "--out", data, "--tokenizer", "bytes", "--val-fraction", "0",
                 "--no-progress"]) == 0
    argv = ["eval", "loss", run, "--split", "train", "--seq-len", "32", "--num-seqs", "1", "--n-boot", "10",
            "--device", "cpu", "--out", str(tmp_path / "out"), "--no-progress"]
    for extra, said in (
            (["--data", data, "--train-len", "0"],
             "--train-len: expected the training context, a positive number of tokens, got 0"),
            (["--data", data, "--data-source", "doc"],
             "--data-source: choosing a source's documents needs --within-docs (windows of the concatenated split "
             "cross documents of every source)"),
            (["--data", data, "--within-docs", "--data-source", "prose"],
             f"--data-source: 'prose' names no source of this dataset; its sources are [{src!r}]"),
            (["--data", src], f"--data: {src!r} is a file, not a prepared dataset; tokenize it first with `foxformer "
                              f"data prepare --source {src} --out data_cache/doc` and pass --data data_cache/doc")):
        capsys.readouterr()
        assert main(argv + extra) == 2
        assert capsys.readouterr().err.splitlines()[-1] == f"error: {said}"


def test_a_flag_the_text_given_leaves_no_say_is_refused_naming_both(tmp_path, capsys):
    """--text-field beside --data, --split or --within-docs beside --source, a --smooth wider than the curve and a
    --matrix-len past --seq-len were taken without a word: dropped, the curve flattened, or 1000 recorded in
    gates.json while the plots showed 256 tokens."""
    run, src = _run(tmp_path)
    data = str(tmp_path / "data")
    assert main(["data", "prepare", "--source", src, "--out", data, "--tokenizer", "bytes", "--val-fraction", "0",
                 "--no-progress"]) == 0
    common = ["--seq-len", "32", "--num-seqs", "1", "--device", "cpu", "--out", str(tmp_path / "out"),
              "--no-progress"]
    for argv, said in (
            (["eval", "loss", run, "--data", data, "--split", "train", "--text-field", "body"],
             f"--text-field: reads --source text, and --data {data!r} holds tokens already; leave --text-field out"),
            (["eval", "loss", run, "--source", src, "--split", "train"],
             f"--split: reads a --data dataset, and --source {src!r} is text; leave --split out"),
            (["analyze", "gates", run, "--source", src, "--within-docs"],
             f"--within-docs: reads a --data dataset, and --source {src!r} is text; leave --within-docs out"),
            (["eval", "loss", run, "--source", src, "--smooth", "40"],
             "--smooth: a window of 40 is wider than the 31 positions of L(i) (--seq-len 32 gives 31) and flattens "
             "it; give at most 31"),
            (["analyze", "gates", run, "--source", src, "--matrix-len", "1000"],
             "--matrix-len: 1000 tokens are more than a sequence holds (--seq-len 32); give at most 32, or a longer "
             "--seq-len")):
        capsys.readouterr()
        assert main(argv + common) == 2
        assert capsys.readouterr().err.splitlines()[-1] == f"error: {said}"
    assert main(["analyze", "gates", run, "--source", src] + common) == 0  # the default 256, as many as there are
    with open(tmp_path / "out" / "gates.json") as f:
        assert json.load(f)["settings"]["matrix_len"] == 32


def test_a_flag_the_text_leaves_no_say_is_refused_before_any_model_loads(tmp_path, capsys):
    """The eval commands refused these only after loading their models (minutes for large ones), as bias-shift
    did not: a model that is not there shows which comes first."""
    src = tmp_path / "doc.txt"
    src.write_text("a few words of text to read " * 20)
    src, data, missing = str(src), str(tmp_path / "data"), str(tmp_path / "no-such-run")
    for command in (["eval", "loss"], ["analyze", "gates"], ["eval", "eviction"]):
        for extra, said in (
                (["--source", src, "--split", "train"],
                 f"--split: reads a --data dataset, and --source {src!r} is text; leave --split out"),
                (["--data", data, "--text-field", "body"],
                 f"--text-field: reads --source text, and --data {data!r} holds tokens already; leave --text-field "
                 f"out"),
                (["--data", data, "--data-source", "doc"],
                 "--data-source: choosing a source's documents needs --within-docs (windows of the concatenated "
                 "split cross documents of every source)")):
            capsys.readouterr()
            assert main(command + [missing, "--device", "cpu", "--no-progress"] + extra) == 2
            assert capsys.readouterr().err.splitlines()[-1] == f"error: {said}", command


def test_eval_eviction_refuses_a_sequence_length_before_its_model_loads(tmp_path, capsys):
    """eval eviction checked --seq-len and --num-seqs only after loading its model, as eval loss did not."""
    missing = str(tmp_path / "no-such-run")
    for extra, said in ((["--seq-len", "1"], "--seq-len: expected an integer >= 2"),
                        (["--num-seqs", "0"], "--num-seqs: expected a positive integer, got 0")):
        capsys.readouterr()
        assert main(["eval", "eviction", missing, "--device", "cpu", "--no-progress", "--source", "builtin:pydoc"]
                    + extra) == 2
        assert capsys.readouterr().err.splitlines()[-1].startswith(f"error: {said}")


def test_ctrl_c_during_eval_loss_is_one_line_exit_130_and_writes_nothing(tmp_path):
    """Ctrl-C while `eval loss` measures, as a user presses it: one `interrupted` line, exit status 130 (as
    train's), no traceback, and no results folder that would read as finished."""
    model = str(tmp_path / "model")
    tiny_model("fox-pro-tiny", vocab=300).save_pretrained(model)
    out = tmp_path / "eval"
    # --num-seqs past what the text holds: its note, printed once the sequences are cut, says the work has begun
    command = [sys.executable, "-m", "foxformer.cli", "eval", "loss", model, "--source", "builtin:pydoc",
               "--tokenizer", "bytes", "--seq-len", "1Ki", "--num-seqs", "100000", "--device", "cpu", "--out",
               str(out)]
    # SIGINT's default disposition, as under a terminal (a background `pytest &` ignores it, and children inherit)
    proc = subprocess.Popen(command, env={**os.environ, "PYTHONPATH": SRC}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    first = proc.stderr.readline()
    assert first.startswith("note: only "), first
    proc.send_signal(signal.SIGINT)
    stdout, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    assert err == "interrupted\n" and stdout == ""
    assert not out.exists()


def test_a_file_where_the_default_out_goes_is_refused_by_the_flag_before_the_work(tmp_path, capsys):
    """RUN/eval, the default --out of a run dir, is known once the model loads; a file there was found after the
    evaluation, as 'file exists (...)'."""
    run, src = _run(tmp_path)
    open(os.path.join(run, "eval"), "w").close()
    assert main(["eval", "loss", run, "--source", src, "--seq-len", "32", "--num-seqs", "1", "--device", "cpu",
                 "--no-progress"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"error: --out: {os.path.join(run, 'eval')!r} is a file, not a folder: choose another location")


def test_a_train_len_other_than_the_runs_is_said_to_stand_in_for_it(tmp_path, capsys):
    """The override was reported as the model's own training length without a word."""
    run, src = _run(tmp_path)
    argv = ["eval", "loss", run, "--source", src, "--seq-len", "64", "--num-seqs", "1", "--device", "cpu",
            "--no-progress", "--out", str(tmp_path / "out")]
    assert main([*argv, "--train-len", "48"]) == 0
    out = capsys.readouterr()
    assert (f"note: --train-len 48 stands in for the 32 tokens {run!r} was trained on: positions past 48 count as "
            f"beyond it") in out.err
    assert json.loads(out.out)["models"][0]["train_len"] == 48
    assert main([*argv, "--train-len", "32"]) == 0
    assert "stands in" not in capsys.readouterr().err
