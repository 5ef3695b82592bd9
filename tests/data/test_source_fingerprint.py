"""A source's fingerprint in a prepared dataset's request is its files' names and content: the same corpus copied,
moved or touched is the same request; datasets that recorded paths and mtimes keep working while untouched."""
import json
import os
import shutil

import pytest

from foxformer.data.preparation import PrepareConfig, prepare
from foxformer.data.sources import describe_source
from foxformer.paths import write_json

CFG = PrepareConfig(sources=["corpus"], out_dir="data", tokenizer="bytes", val_fraction=0)


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A project folder, the working directory, with a source folder "corpus" of two files (one in a subfolder)
    and its dataset "data"; returns (the folder, the dataset's manifest)."""
    root = tmp_path / "home" / "project"
    os.makedirs(root / "corpus" / "sub")
    (root / "corpus" / "a.txt").write_text("the first document")
    (root / "corpus" / "sub" / "b.jsonl").write_text(json.dumps({"text": "the second one"}) + "\n")
    monkeypatch.chdir(root)
    return root, prepare(CFG, progress=False)


def _touch(folder) -> None:
    for dirpath, _, files in os.walk(folder):
        for name in files:
            os.utime(os.path.join(dirpath, name), ns=(1_800_000_000 * 10**9,) * 2)


def test_a_copied_moved_or_touched_source_is_the_same_request(project, tmp_path, monkeypatch):
    root, first = project
    _touch("corpus")
    assert prepare(CFG, progress=False) == first  # reused as it was, not rebuilt
    # a copy with new mtimes and a move: other absolute paths and times, the same names and content
    shutil.copytree(tmp_path / "home", tmp_path / "copy", copy_function=shutil.copy)
    shutil.move(tmp_path / "home", tmp_path / "moved")
    for where in ("copy", "moved"):
        monkeypatch.chdir(tmp_path / where / "project")
        assert prepare(CFG, progress=False) == first


def test_a_copy_of_a_source_given_beside_it_is_refused(project):
    shutil.copytree("corpus", "corpus2")
    with pytest.raises(ValueError, match=r"sources: 'corpus2' is 'corpus' again \(or a copy: the same files and "
                                         r"content\)"):
        prepare(PrepareConfig(sources=["corpus", "corpus2"], out_dir="both", tokenizer="bytes"), progress=False)


EDITS = {
    "a byte": lambda: open("corpus/a.txt", "w").write("the first documenT"),
    "a file added": lambda: open("corpus/sub/c.txt", "w").write("a third"),
    "a file renamed": lambda: os.rename("corpus/a.txt", "corpus/z.txt"),
}


@pytest.mark.parametrize("edit", EDITS.values(), ids=EDITS.keys())
def test_a_changed_source_is_refused_in_one_line(project, edit):
    edit()
    with pytest.raises(ValueError) as refused:
        prepare(CFG, progress=False)
    assert str(refused.value) == "out_dir: 'data' already holds a dataset prepared from a different request (the " \
                                 "files of 'corpus' changed since (their content, or which files there are)); use " \
                                 "another directory, or pass force to replace it"
    assert prepare(CFG, force=True, progress=False)["request"]["sources"][0]["fingerprint"] == \
        describe_source("corpus").fingerprint


@pytest.mark.parametrize("form", [0, 1], ids=["nanosecond-mtimes", "whole-second-mtimes"])
def test_a_dataset_that_recorded_its_source_by_file_times_works_while_untouched(project, form):
    """Manifests written before content fingerprints hold the files' paths, sizes and mtimes: untouched, the same
    command rebuilds the dataset in the new form (the same tokens) without --force; touched, nothing can tell the
    same files from others, so it is refused, saying why and what to do."""
    _, first = project
    older = describe_source("corpus").older_fingerprints[form]
    first["request"]["sources"][0] = {"spec": "corpus", "fingerprint": older}  # and no line-break rule, as then
    write_json(os.path.join("data", "manifest.json"), first)
    rebuilt = prepare(CFG, progress=False)
    assert rebuilt["request"]["sources"][0]["fingerprint"] == describe_source("corpus").fingerprint != older
    assert rebuilt["tokens"] == first["tokens"] and rebuilt["split"]["train"] == first["split"]["train"]
    assert prepare(CFG, progress=False) == rebuilt
    write_json(os.path.join("data", "manifest.json"), first)
    _touch("corpus")
    with pytest.raises(ValueError) as refused:
        prepare(CFG, progress=False)
    assert str(refused.value) == "out_dir: 'data' already holds a dataset prepared from a different request (the " \
                                 "files of 'corpus' changed since, or their times or place did: that dataset records " \
                                 "its sources by their files' paths and times (an older foxformer), which cannot " \
                                 "tell files touched, moved or copied from changed ones); use another directory, or " \
                                 "pass force to replace it"
