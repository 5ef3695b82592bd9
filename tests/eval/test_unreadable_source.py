"""The eval commands that read a text source (--source, --haystack, bias-shift's --source) stopped at its first file
that cannot be read as text, with that file's error alone, where `data prepare` names them all: they now refuse the
source for all of them in one error (past the files it shows, the whole list in the output folder, as a prepare's),
and --skip-bad-files passes them over, says so and lists them in the results, saying whether the reading, which stops
once it has enough text, met every file of the source."""
import json
import os
import re

import pytest

from foxformer.cli import main
from foxformer.data import load_tokenizer, unreadable
from foxformer.eval.sequences import SkippedFiles, document_token_stream, source_sequences

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


EVERY = {"skipped_files_among": "every file of the source"}
SOME = {"skipped_files_among": "the files read before the reading stopped with enough text (the rest were not "
                               "checked)"}


def test_the_files_passed_over_are_said_and_put_in_skipped(docs, capsys):
    folder, bad = docs
    skipped = SkippedFiles()
    rows = source_sequences(folder, load_tokenizer("bytes"), 16, 8, skipped=skipped)
    assert skipped == bad and len(rows) == 3
    assert skipped.fields() == {"skipped_files": bad, **EVERY}
    assert f"note: {folder}: 3 file(s) that cannot be read as text skipped (--skip-bad-files; the results' JSON " \
           f"lists them under skipped_files): {_listed(bad)}" in capsys.readouterr().err.splitlines()


def test_a_reading_that_stops_with_enough_text_says_its_skipped_files_are_those_it_met(docs, capsys):
    """One sequence is read from the first good file: the bad files read after it were never looked at, but for the
    link to nothing, which the folder's walk finds. skipped_files held those met, and was read as every bad file."""
    folder, bad = docs
    skipped = SkippedFiles()
    assert len(source_sequences(folder, load_tokenizer("bytes"), 16, 1, skipped=skipped)) == 1
    link = {path: problem for path, problem in bad.items() if path.endswith("d.txt")}
    assert skipped.fields() == {"skipped_files": link, **SOME}
    assert f"note: {folder}: 1 file(s) that cannot be read as text skipped (--skip-bad-files; the results' JSON lists " \
           f"them under skipped_files), of the files read before the reading stopped with enough text (the rest were " \
           f"not checked): {_listed(link)}" in capsys.readouterr().err.splitlines()
    haystack = SkippedFiles()
    document_token_stream(folder, load_tokenizer("bytes"), min_tokens=100, what="--haystack", skipped=haystack)
    assert haystack.fields() == {"skipped_files": link, **SOME}


def test_a_haystack_is_refused_for_all_its_bad_files_or_read_without_them(docs, capsys):
    folder, bad = docs
    tok = load_tokenizer("bytes")
    with pytest.raises(ValueError) as e:
        document_token_stream(folder, tok, min_tokens=100, what="--haystack", label="--{}")
    assert str(e.value) == _refusal("--haystack", folder, bad, "--skip-bad-files", "listed in the results")
    skipped = SkippedFiles()
    ids = document_token_stream(folder, tok, min_tokens=100, enough=10 ** 6, what="--haystack", skipped=skipped)
    assert skipped.fields() == {"skipped_files": bad, **EVERY}
    assert len(ids) == sum(len(f"Document {i}. {TEXT}".encode()) for i in range(3))
    assert f"note: {folder}: 3 file(s) that cannot be read as text skipped" in capsys.readouterr().err


@pytest.mark.parametrize("reader", ["source_sequences", "document_token_stream"])
def test_a_source_whose_every_file_was_skipped_is_refused_for_that(docs, reader, capsys):
    """With every file passed over, the refusal of too little text that followed sent the user to a shorter
    --seq-len (or --lengths) for a source that holds none."""
    folder, bad = docs
    for i in range(3):
        os.remove(os.path.join(folder, f"a{i}.txt"))
    with pytest.raises(ValueError) as e:
        if reader == "source_sequences":
            source_sequences(folder, load_tokenizer("bytes"), 16, 1, label="--{}", skipped=SkippedFiles())
        else:
            document_token_stream(folder, load_tokenizer("bytes"), min_tokens=100, what="--source", label="--{}",
                                  skipped=SkippedFiles())
    assert str(e.value) == (f"--source: no document of {folder!r} is left: its 3 file(s) that cannot be read as text "
                            f"were passed over (--skip-bad-files) and its other files hold none; convert them to "
                            f"UTF-8 (iconv -f ITS_ENCODING -t utf-8) or give another source. Passed over: "
                            f"{_listed(bad)}")
    assert "note:" not in capsys.readouterr().err


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
    assert {key: settings[key] for key in ("skipped_files", *EVERY)} == {"skipped_files": bad, **EVERY}
    assert settings["num_seqs"] == 3
    # one sequence: the reading stops in the first file, and says its list is of the files it met
    assert main(argv + ["--num-seqs", "1", "--skip-bad-files"]) == 0
    settings = json.load(open(tmp_path / "loss" / "loss.json"))["settings"]
    assert {key: settings[key] for key in ("skipped_files", *SOME)} == {
        "skipped_files": {path: problem for path, problem in bad.items() if path.endswith("d.txt")}, **SOME}


def test_eval_niah_lists_the_files_its_haystack_passed_over(model, docs, tmp_path, capsys):
    folder, bad = docs
    argv = ["eval", "niah", model, "--haystack", folder, "--lengths", "96", "--depths", "0", "--needles", "1",
            "--modes", "standard", "--no-generate", "--device", "cpu", "--no-progress", "--out", str(tmp_path / "o")]
    assert main(argv) == 2
    assert f"error: --haystack: 3 file(s) of {folder!r} cannot be read as text" in capsys.readouterr().err
    assert main(argv + ["--skip-bad-files"]) == 0
    settings = json.load(open(tmp_path / "o" / "niah.json"))["settings"]
    assert {key: settings[key] for key in ("skipped_files", *EVERY)} == {"skipped_files": bad, **EVERY}


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
    result = json.load(open(tmp_path / "shift.json"))
    assert {key: result[key] for key in ("skipped_files", *EVERY)} == {"skipped_files": bad, **EVERY}


@pytest.fixture
def many(tmp_path, monkeypatch) -> tuple[str, dict[str, str]]:
    """A folder of a good document and more bad files than a refusal shows (SHOWN made 2): Latin-1, binary,
    UTF-16, a link to nothing, and one without read permission, which root is given anyway (os.access says no)."""
    monkeypatch.setattr(unreadable, "SHOWN", 2)
    folder = tmp_path / "many"
    folder.mkdir()
    (folder / "a.txt").write_text(TEXT)
    (folder / "latin.txt").write_bytes(b"caf\xe9\n")
    (folder / "image.txt").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00")
    (folder / "windows.txt").write_bytes("notes".encode("utf-16"))
    (folder / "locked.txt").write_text(TEXT)
    os.symlink(tmp_path / "gone.txt", folder / "link.txt")
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode, **kw: not str(path).endswith("locked.txt") and
                        real_access(path, mode, **kw))
    return str(folder), {
        str(folder / "image.txt"): "looks like a binary file, not text (3 of its first 10 bytes are NUL or other "
                                   "control bytes)",
        str(folder / "latin.txt"): "line 1, column 4 is not UTF-8 (byte 0xe9), at byte offset 3",
        str(folder / "link.txt"): f"a symbolic link to '{tmp_path / 'gone.txt'}', which does not exist",
        str(folder / "locked.txt"): "cannot be read (permission denied)",
        str(folder / "windows.txt"): "UTF-16LE text (it starts with a UTF-16LE byte-order mark), not UTF-8"}


# each command's arguments before the model, and after it with the source and output folder (bias-shift's --out is
# its JSON file, written in that folder)
COMMANDS = {
    "eval-loss": (["eval", "loss"], lambda source, out: ["--source", source, "--seq-len", "24", "--n-boot", "10",
                                                         "--out", out]),
    "eval-niah": (["eval", "niah"], lambda source, out: ["--haystack", source, "--lengths", "96", "--depths", "0",
                                                         "--needles", "1", "--modes", "standard", "--no-generate",
                                                         "--out", out]),
    "bias-shift": (["bias-shift"], lambda source, out: ["--source", source, "--shifts", "0", "--seq-len", "24",
                                                        "--num-seqs", "1", "--out", os.path.join(out, "shift.json")]),
}


@pytest.mark.parametrize("command", COMMANDS)
def test_a_refusal_of_more_files_than_it_shows_lists_them_all_in_the_output_folder(model, many, tmp_path, capsys,
                                                                                    command):
    """The first SHOWN were named and the rest counted, listed nowhere (the reader did not know the command's
    output folder); `data prepare` wrote them all to OUT/unreadable_files.tsv. A reading that goes on removes it."""
    folder, bad = many
    out = str(tmp_path / "out")
    before, after = COMMANDS[command]
    argv = before + [model] + after(folder, out) + ["--device", "cpu", "--no-progress"]
    listing = os.path.join(out, unreadable.LIST_FILE)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    flag = "--haystack" if command == "eval-niah" else "--source"
    assert "\n" not in err and err.startswith(
        f"error: {flag}: {len(bad)} file(s) of {folder!r} cannot be read as text: "
        f"{_listed(dict(sorted(bad.items())[:2]))}; and {len(bad) - 2} more (all of them in {listing}). Convert each")
    with open(listing) as f:
        assert f.read() == "".join(f"{path}\t{problem}\n" for path, problem in sorted(bad.items()))
    assert main(argv + ["--skip-bad-files"]) == 0
    assert not os.path.exists(listing)


def _only_bad_files(folder: str, bad: dict[str, str]) -> None:
    for i in range(3):
        os.remove(os.path.join(folder, f"a{i}.txt"))


@pytest.mark.parametrize("source", ["folder", "file"], ids=["a-folder-of-bad-files", "one-bad-file"])
def test_skip_bad_files_is_offered_only_where_a_file_would_be_left(docs, source):
    """A source of one file that cannot be read was refused with "pass --skip-bad-files to evaluate without them",
    and then refused for holding no text."""
    folder, bad = docs
    _only_bad_files(folder, bad)
    if source == "file":
        spec = os.path.join(folder, "b.txt")
        bad = {spec: bad[spec]}
    else:
        spec = folder
    with pytest.raises(ValueError) as e:
        document_token_stream(spec, load_tokenizer("bytes"), min_tokens=100, what="--haystack", label="--{}")
    assert str(e.value) == (f"--haystack: {len(bad)} file(s) of {spec!r} cannot be read as text: {_listed(bad)}. "
                            f"Convert each to UTF-8 (iconv -f ITS_ENCODING -t utf-8), fetch a damaged one again, "
                            f"restore a broken link, or give another source; --skip-bad-files would leave no file of "
                            f"it to read")


# a PNG's start: a binary file, which no conversion makes text
IMAGE = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x01\x00\x00\x00\x01\x00\x08\x06\x00\x00\x00"
IMAGE_SAID = "looks like a binary file, not text (17 of its first 29 bytes are NUL or other control bytes)"


@pytest.mark.parametrize("good", [True, False], ids=["beside-good-files", "alone"])
def test_binary_files_are_refused_without_advice_to_convert_them(tmp_path, good):
    folder = tmp_path / "docs"
    folder.mkdir()
    if good:
        (folder / "a.txt").write_text(TEXT)
    (folder / "image.txt").write_bytes(IMAGE)
    (folder / "photo.md").write_bytes(IMAGE)
    bad = {str(folder / "image.txt"): IMAGE_SAID, str(folder / "photo.md"): IMAGE_SAID}
    with pytest.raises(ValueError) as e:
        source_sequences(str(folder), load_tokenizer("bytes"), 16, 8, label="--{}")
    fix = (f"Move them out of {str(folder)!r}; or pass --skip-bad-files to evaluate without them (they are printed, "
           f"and listed in the results)" if good else
           "Give another source; --skip-bad-files would leave no file of it to read")
    assert str(e.value) == f"--source: 2 file(s) of {str(folder)!r} cannot be read as text: {_listed(bad)}. {fix}"
    if not good:  # passed over, they leave nothing: no conversion offered either
        with pytest.raises(ValueError) as e:
            source_sequences(str(folder), load_tokenizer("bytes"), 16, 1, label="--{}", skipped=SkippedFiles())
        assert str(e.value) == (f"--source: no document of {str(folder)!r} is left: its 2 file(s) that cannot be "
                                f"read as text were passed over (--skip-bad-files) and its other files hold none; "
                                f"give another source. Passed over: {_listed(bad)}")


def test_eval_loss_of_one_bad_file_does_not_offer_to_skip_it(model, tmp_path, capsys):
    bad = tmp_path / "notes.txt"
    bad.write_bytes(b"caf\xe9\n")
    assert main(["eval", "loss", model, "--source", str(bad), "--seq-len", "24", "--device", "cpu", "--no-progress",
                 "--out", str(tmp_path / "loss")]) == 2
    assert capsys.readouterr().err.strip() == (
        f"error: --source: 1 file(s) of {str(bad)!r} cannot be read as text: {bad}: line 1, column 4 is not UTF-8 "
        f"(byte 0xe9), at byte offset 3. Convert each to UTF-8 (iconv -f ITS_ENCODING -t utf-8), fetch a damaged one "
        f"again, restore a broken link, or give another source; --skip-bad-files would leave no file of it to read")
