"""train and eval after the project moved: the dataset and the run recorded the tokenizer folder's old absolute
path, and the same tokenizer at its new path was refused by name."""
import shutil

import yaml

from foxformer.cli import main

from ..data.helpers import word_dataset, word_tokenizer


def _train(data, out, *more):
    return main(["train", "--data", data, "--out", out, "--preset", "fox-pro-tiny", "--context", "32",
                 "--batch-tokens", "64", "--max-steps", "1", "--eval-tokens", "64", "--no-progress",
                 "--set", "tensorboard=false", "--set", "export_hf=false", "--model", "attention_backend=torch",
                 *more])


def _last_line(err):
    lines = [line for line in err.splitlines() if line.strip()]
    assert "Traceback" not in err and lines[-1].startswith("error: "), err
    return lines[-1]


def test_train_and_eval_take_the_moved_tokenizer_folder_by_its_new_path(tmp_path, capsys):
    (tmp_path / "old").mkdir()
    _, old_tok = word_dataset(tmp_path / "old")
    assert _train(str(tmp_path / "old" / "words"), str(tmp_path / "old" / "run")) == 0
    shutil.move(tmp_path / "old", tmp_path / "new")
    data, tok, run = (str(tmp_path / "new" / n) for n in ("words", "tok", "run"))
    capsys.readouterr()

    assert _train(data, str(tmp_path / "a")) == 2  # the dataset's record would send eval to a folder not there
    assert f"the tokenizer folder {old_tok} is no longer there: if it moved, pass its new path with --tokenizer" \
           in _last_line(capsys.readouterr().err)
    assert _train(data, str(tmp_path / "a"), "--tokenizer", tok) == 0
    assert yaml.safe_load(open(tmp_path / "a" / "config.yaml"))["tokenizer"] == tok

    # the run trained before the move: its config names the old folder, and records the folder's content
    saved = yaml.safe_load(open(tmp_path / "new" / "run" / "config.yaml"))
    assert saved["tokenizer"] == f"hf:{old_tok}" and saved["derived"]["tokenizer_files"].startswith("sha256:")
    argv = ["eval", "loss", run, "--seq-len", "16", "--num-seqs", "1", "--n-boot", "10", "--device", "cpu",
            "--no-progress", "--out", str(tmp_path / "eval")]
    assert main(argv + ["--data", data]) == 0, capsys.readouterr().err
    argv += ["--source", str(tmp_path / "new" / "words.jsonl"), "--tokenizer", tok]  # text: the tokenizer reads it
    assert main(argv) == 0, capsys.readouterr().err

    word_tokenizer(tok, {"a": 2, "b": 1})  # another tokenizer in the moved folder
    capsys.readouterr()
    assert _train(data, str(tmp_path / "b"), "--tokenizer", tok) == 2
    assert f"but the run expects tokenizer {tok!r} (another tokenizer)" in _last_line(capsys.readouterr().err)
    assert main(argv) == 2
    line = _last_line(capsys.readouterr().err)
    assert f"--tokenizer: {tok!r} is not the tokenizer " in line and f" trained with ('hf:{old_tok}')" in line
