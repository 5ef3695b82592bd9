"""The eval commands that read a text source (--source, --haystack, bias-shift's --source) stopped at its first file
that cannot be read as text, with that file's error alone, where `data prepare` names them all: they now refuse the
source for all of them in one error, and --skip-bad-files passes them over, says so and lists them in the results."""
import json
import os
import re

import pytest

from foxformer.cli import main
from foxformer.data import load_tokenizer
from foxformer.eval.sequences import document_token_stream, source_sequences

from .helpers import tiny_model

TEXT = "The tide came in over the flat grey sand, and the gulls rose from it. " * 12


@pytest.fixture
def docs(tmp_path) -> tuple[str, dict[str, str]]:
    """A folder of good documents, read first, and of bad files after them; (its path, bad path -> problem)."""
    folder = tmp_path / "docs"
    folder.mkdir()
    for i in range(3):
        (folder / f"a{i}.txt").write_text(f"Document {i}. {TEXT}")
    (folder / "b.txt").write_bytes(b"caf\xe9 in latin-1\n")
    (folder / "c.jsonl").write_bytes(b'{"text": "row one"}\n{"text": "bad \xff row"}\n')
    os.symlink(tmp_path / "gone.txt", folder / "d.txt")
    return str(folder), {
        str(folder / "b.txt"): "line 1, column 4 is not UTF-8 (byte 0xe9), at byte offset 3",
        str(folder / "c.jsonl"): "line 2, column 15 is not UTF-8 (byte 0xff), at byte offset 34",
        str(folder / "d.txt"): f"a symbolic link to '{tmp_path / 'gone.txt'}', which does not exist"}


def _listed(bad: dict[str, str]) -> str:
    return "; ".join(f"{path}: {problem}" for path, problem in sorted(bad.items()))


def _refusal(name: str, folder: str, bad: dict[str, str], option: str, kept: str) -> str:
    return (f"{name}: {len(bad)} file(s) of {folder!r} cannot be read as text: {_listed(bad)}. Convert each to UTF-8 "
            f"(iconv -f ITS_ENCODING -t utf-8), fetch a damaged one again, restore or remove a broken link, or move "
            f"them out of {folder!r}; or pass {option} to evaluate without them (they are printed, and {kept})")


def _read_by_name_order_without_the_link(folder: str) -> None:
    """The link to nothing is found by the walk, before any document: without it, the first bad file is met by
    reading, after the good ones, and the refusal must read on for the rest."""
    os.remove(os.path.join(folder, "d.txt"))


@pytest.mark.parametrize("link", [True, False], ids=["found-by-the-walk", "found-by-reading"])
def test_source_sequences_refuses_the_source_for_all_its_bad_files(docs, link):
    folder, bad = docs
    if not link:
        _read_by_name_order_without_the_link(folder)
        del bad[os.path.join(folder, "d.txt")]
    with pytest.raises(ValueError) as e:
        source_sequences(folder, load_tokenizer("bytes"), 16, 8)
    assert str(e.value) == _refusal("source", folder, bad, "skipped", "put in it")


def test_the_files_passed_over_are_said_and_put_in_skipped(docs, capsys):
    folder, bad = docs
    skipped = {}
    rows = source_sequences(folder, load_tokenizer("bytes"), 16, 8, skipped=skipped)
    assert skipped == bad and len(rows) == 3
    assert f"note: {folder}: 3 file(s) that cannot be read as text skipped (--skip-bad-files; the results' JSON " \
           f"lists them under skipped_files): {_listed(bad)}" in capsys.readouterr().err.splitlines()


def test_a_haystack_is_refused_for_all_its_bad_files_or_read_without_them(docs, capsys):
    folder, bad = docs
    tok = load_tokenizer("bytes")
    with pytest.raises(ValueError) as e:
        document_token_stream(folder, tok, min_tokens=100, what="--haystack", label="--{}")
    assert str(e.value) == _refusal("--haystack", folder, bad, "--skip-bad-files", "listed in the results")
    skipped = {}
    ids = document_token_stream(folder, tok, min_tokens=100, enough=10 ** 6, what="--haystack", skipped=skipped)
    assert skipped == bad and len(ids) == sum(len(f"Document {i}. {TEXT}".encode()) for i in range(3))
    assert f"note: {folder}: 3 file(s) that cannot be read as text skipped" in capsys.readouterr().err


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    folder = tmp_path_factory.mktemp("model") / "hf"
    tiny_model("fox-pro-tiny", vocab=50304, seed=1).save_pretrained(str(folder))
    return str(folder)


def test_eval_loss_names_them_all_and_its_flag_then_lists_them_in_its_results(model, docs, tmp_path, capsys):
    folder, bad = docs
    # more sequences than the folder gives: it is read to its end (reading stops at --num-seqs, and lists the bad
    # files it met)
    argv = ["eval", "loss", model, "--source", folder, "--seq-len", "24", "--num-seqs", "4", "--n-boot", "10",
            "--device", "cpu", "--out", str(tmp_path / "loss"), "--no-progress"]
    assert main(argv) == 2
    assert capsys.readouterr().err.strip() == "error: " + _refusal("--source", folder, bad, "--skip-bad-files",
                                                                   "listed in the results")
    assert main(argv + ["--skip-bad-files"]) == 0
    assert f"note: {folder}: 3 file(s) that cannot be read as text skipped" in capsys.readouterr().err
    settings = json.load(open(tmp_path / "loss" / "loss.json"))["settings"]
    assert settings["skipped_files"] == bad and settings["num_seqs"] == 3


def test_eval_niah_lists_the_files_its_haystack_passed_over(model, docs, tmp_path, capsys):
    folder, bad = docs
    argv = ["eval", "niah", model, "--haystack", folder, "--lengths", "96", "--depths", "0", "--needles", "1",
            "--modes", "standard", "--no-generate", "--device", "cpu", "--no-progress", "--out", str(tmp_path / "o")]
    assert main(argv) == 2
    assert f"error: --haystack: 3 file(s) of {folder!r} cannot be read as text" in capsys.readouterr().err
    assert main(argv + ["--skip-bad-files"]) == 0
    assert json.load(open(tmp_path / "o" / "niah.json"))["settings"]["skipped_files"] == bad


def test_skip_bad_files_without_a_source_is_refused(model, tmp_path, capsys):
    """It reads --source text; with --data (tokens) it was taken and did nothing."""
    assert main(["eval", "loss", model, "--data", str(tmp_path / "data"), "--skip-bad-files", "--device", "cpu",
                 "--out", str(tmp_path / "loss")]) == 2
    assert capsys.readouterr().err.strip() == (f"error: --skip-bad-files: reads --source text, and --data "
                                               f"{str(tmp_path / 'data')!r} holds tokens already; leave "
                                               f"--skip-bad-files out")


def test_bias_shift_takes_the_flag_its_refusal_names(model, docs, tmp_path, capsys):
    folder, bad = docs
    argv = ["bias-shift", model, "--source", folder, "--shifts", "0", "--seq-len", "24", "--num-seqs", "4",
            "--device", "cpu", "--no-progress", "--out", str(tmp_path / "shift.json")]
    assert main(argv) == 2
    assert re.search(r"or pass --skip-bad-files to evaluate without them", capsys.readouterr().err)
    assert main(argv + ["--skip-bad-files"]) == 0
    assert json.load(open(tmp_path / "shift.json"))["skipped_files"] == bad
