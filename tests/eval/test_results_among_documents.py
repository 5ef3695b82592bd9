"""An eval's results JSON among a folder's documents (written there before eval marked its output folders): the
folder is the user's and is read whole, and that file, one pretty-printed JSON value, was refused as JSON Lines with
jq commands to make documents of it. The refusal says what it is and how to keep it out of the documents."""
import json
import os
import shutil

import pytest

from foxformer.cli import main

# its tiny model, and a document's text
from .test_out_in_source import TEXT, model  # noqa: F401


def _eval_loss(model: str, source: str, out: str, *extra: str) -> int:
    return main(["eval", "loss", model, "--source", source, "--seq-len", "24", "--num-seqs", "8", "--n-boot", "10",
                 "--out", out, "--device", "cpu", "--no-progress", *extra])


@pytest.fixture(scope="module")
def results(model, tmp_path_factory) -> str:
    """A loss.json as `eval loss` writes it."""
    folder = tmp_path_factory.mktemp("results")
    with open(folder / "doc.txt", "w") as f:
        f.write(TEXT)
    assert _eval_loss(model, str(folder / "doc.txt"), str(folder / "ev")) == 0
    return str(folder / "ev" / "loss.json")


@pytest.fixture
def d2(tmp_path, monkeypatch) -> str:
    """A folder of one document; the tests run from its parent folder."""
    monkeypatch.chdir(tmp_path)
    os.mkdir("d2")
    with open(os.path.join("d2", "doc.txt"), "w") as f:
        f.write(TEXT)
    return "d2"


def _prepare(source: str, *extra: str) -> int:
    return main(["data", "prepare", "--source", source, "--out", "tokens", "--tokenizer", "bytes", "--no-progress",
                 *extra])


# --skip-bad-files passes over files that cannot be read as text: this one can, and is refused all the same
@pytest.mark.parametrize("skip", [[], ["--skip-bad-files"]], ids=["", "skip-bad-files"])
@pytest.mark.parametrize("command", ["data-prepare", "eval-loss"])
def test_eval_results_among_documents_are_refused_as_such(model, results, d2, capsys, command, skip):
    shutil.copyfile(results, os.path.join(d2, "loss.json"))
    rc = _prepare(d2, *skip) if command == "data-prepare" else _eval_loss(model, d2, "ev", *skip)
    assert rc == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "error: --source: d2/loss.json is the results of one of foxformer's eval commands (one JSON value, as they "
        "write it), not documents: move it out of 'd2', or keep eval's results in a folder of their own (--out): a "
        "folder inside a source holding nothing but eval's results, or an empty file named .foxformer-eval, is "
        "passed over by every foxformer command")
    # the fix said: in a folder of its own inside the source, it is passed over
    os.mkdir(os.path.join(d2, "old"))
    os.replace(os.path.join(d2, "loss.json"), os.path.join(d2, "old", "loss.json"))
    rc = _prepare(d2, *skip) if command == "data-prepare" else _eval_loss(model, d2, "ev", *skip)
    assert rc == 0


def test_eval_results_given_as_the_source_are_refused_as_such(results, d2, capsys):
    assert _prepare(results) == 2
    assert capsys.readouterr().err.strip() == (
        f"error: --source: {results} is the results of one of foxformer's eval commands (one JSON value, as they "
        f"write it), not documents: give the documents to read (a file, a folder of them, or a built-in corpus "
        f"such as builtin:pydoc)")


@pytest.mark.parametrize("content", [
    {"text": TEXT},
    {"command": "eval loss", "models": []},  # not every key of eval's results
], ids=["a-document", "some-of-eval's-keys"])
def test_a_pretty_printed_json_document_keeps_its_json_lines_refusal(d2, capsys, content):
    with open(os.path.join(d2, "notes.json"), "w") as f:
        json.dump(content, f, indent=2)
    assert _prepare(d2) == 2
    assert capsys.readouterr().err.strip() == (
        "error: --source: d2/notes.json:1 ends inside a JSON value (the line starts '{'): JSONL takes one whole "
        "object per line, and a .json file of one value over several lines (an array, pretty-printed) is not read: "
        "write it one object a line (`jq -c '.[]' d2/notes.json > fixed.jsonl` does that for an array, "
        "`jq -c . d2/notes.json > fixed.jsonl` for objects one after another); if the file holds no documents, move "
        "it out of 'd2'")
