"""A prepared dataset inside a source folder, and an --out folder that holds a source: the walk of corpus/ read
corpus/prepared/manifest.json and its shards' ids.json as JSONL documents (and refused them), and an --out above
the documents wrote the dataset's files among them."""
import json
import os
from pathlib import Path

import pytest

from foxformer.cli import main
from foxformer.data.preparation import read_manifest

DOCS = ["d0.txt", "d1.txt", "sub/d2.txt"]


@pytest.fixture
def corpus(tmp_path, monkeypatch):
    """docs/, three documents; the tests run from its parent folder."""
    monkeypatch.chdir(tmp_path)
    for name in DOCS:
        os.makedirs(os.path.dirname(os.path.join("docs", name)), exist_ok=True)
        with open(os.path.join("docs", name), "w") as f:
            f.write(f"the document {name}")
    return tmp_path / "docs"


def _prepare(source: str, out: str) -> int:
    return main(["data", "prepare", "--source", source, "--out", out, "--tokenizer", "bytes", "--no-progress"])


def _notes(err: str) -> list[str]:
    return [line for line in err.splitlines() if "prepared dataset" in line]


def _texts(names) -> dict[str, str]:
    """The content of docs/NAME by name."""
    return {name: Path("docs", name).read_text() for name in names}


@pytest.mark.parametrize("second", ["docs/prepared", "docs/other"], ids=["the-same-command-again",
                                                                           "another-out-beside-it"])
def test_a_dataset_inside_the_source_folder_is_passed_over_and_said(corpus, capsys, second):
    assert _prepare("docs", "docs/prepared") == 0
    # said also the first time, before the folder is there to be passed over
    assert _notes(capsys.readouterr().err) == ["note: docs: 1 prepared dataset folder(s) in it not read as documents "
                                               "(docs/prepared)"]
    first = read_manifest("docs/prepared")
    assert _prepare("docs", second) == 0
    passed = ", ".join(sorted({"docs/prepared", second}))
    assert _notes(capsys.readouterr().err) == [f"note: docs: {len({'docs/prepared', second})} prepared dataset "
                                               f"folder(s) in it not read as documents ({passed})"]
    again = read_manifest(second)
    ids = json.loads(Path(second, again["sources"][0]["shard"], "ids.json").read_text())
    assert sorted(os.path.relpath(i, "docs") for i in ids) == DOCS
    if second == "docs/prepared":  # the walk's files, and so the request, are the first run's: reused as it was
        assert again["created_unix"] == first["created_unix"]
    assert _texts(DOCS) == {name: f"the document {name}" for name in DOCS}


@pytest.mark.parametrize("leftover", ["an-interrupted-prepare", "a-dataset-moved-in"])
def test_a_dataset_the_run_did_not_write_is_told_by_its_files_not_its_name(corpus, capsys, leftover):
    """Recognised by the lock and shards a prepare writes before its manifest, or a manifest of the format; a
    user's manifest.json of documents beside them is read."""
    if leftover == "an-interrupted-prepare":
        os.makedirs("docs/tokens/shards/0123456789abcdef.tmp-99999")
        open("docs/tokens/.lock", "w").close()
        with open("docs/tokens/shards/0123456789abcdef.tmp-99999/ids.json", "w") as f:
            f.write('["docs/d0.txt", ')  # cut short
    else:
        assert _prepare("docs", "elsewhere") == 0
        os.rename("elsewhere", "docs/tokens")
    os.mkdir("docs/notes")
    with open("docs/notes/manifest.json", "w") as f:
        f.write(json.dumps({"text": "a document named manifest"}) + "\n")
    capsys.readouterr()
    assert _prepare("docs", "out") == 0
    assert _notes(capsys.readouterr().err) == ["note: docs: 1 prepared dataset folder(s) in it not read as documents "
                                               "(docs/tokens)"]
    assert read_manifest("out")["docs"] == 4


@pytest.mark.parametrize("source, said, instead", [
    ("docs", "is the source folder", "docs/prepared"),
    ("docs/sub", "holds the source 'docs/sub'", "docs/sub/prepared"),
    ("docs/manifest.json", "holds the source 'docs/manifest.json'", "data_cache/NAME"),
], ids=["the-source-folder", "a-folder-above-the-source", "the-folder-of-a-file-source"])
def test_an_out_that_holds_a_source_is_refused_and_the_source_kept(corpus, capsys, source, said, instead):
    """A folder above the documents took the dataset's files among them, a manifest.json of documents written
    over by the dataset's own."""
    with open("docs/manifest.json", "w") as f:
        f.write(json.dumps({"text": "a document named manifest"}) + "\n")
    before = _texts([*DOCS, "manifest.json"])
    assert _prepare(source, "docs") == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"error: --out: 'docs' {said}: the dataset's files (manifest.json, shards/, train.bin, ...) would be written "
        f"among the documents; give the dataset a folder of its own, e.g. '{instead}'")
    assert sorted(os.listdir("docs")) == ["d0.txt", "d1.txt", "manifest.json", "sub"]
    assert _texts(before) == before


def _symlink(target: str, link: str) -> None:
    try:
        os.symlink(target, link, target_is_directory=True)
    except (OSError, NotImplementedError) as e:  # Windows without the privilege to make one
        pytest.skip(f"no symlinks here ({e})")


@pytest.mark.parametrize("source, out", [("out/corpus", "out"), ("out/corpus/sub", "out"), ("out/corpus/sub", "docs")],
                         ids=["the-link", "a-folder-under-the-link", "a-link-into-out"])
def test_an_out_that_holds_a_source_through_a_symlink_is_refused(corpus, capsys, source, out):
    """out/corpus links to docs/. The check compared resolved paths alone: out/corpus resolved outside out/, and
    the dataset was written into out/ beside the link (a source whose link leads into --out was refused)."""
    os.mkdir("out")
    _symlink(os.path.abspath("docs"), os.path.join("out", "corpus"))
    before = sorted(os.listdir(out))
    assert _prepare(source, out) == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"error: --out: {out!r} holds the source {source!r}: the dataset's files (manifest.json, shards/, train.bin, "
        f"...) would be written among the documents; give the dataset a folder of its own, e.g. '{source}/prepared'")
    assert sorted(os.listdir(out)) == before
    assert _prepare(source, f"{source}/prepared") == 0  # the way out the message gives


def test_a_dataset_given_as_the_source_is_refused(corpus, capsys):
    assert _prepare("docs", "tokens") == 0
    assert _prepare("tokens", "again") == 2
    assert "error: --source: 'tokens' is a prepared dataset (it holds the manifest.json or lock that `data prepare` " \
           "writes), whose files are tokens, not documents: give the folder of the documents" \
           in capsys.readouterr().err
    assert not os.path.exists("again")
