"""A source folder's files that cannot be read as text failed `data prepare` one file a run: a user with a big folder
fixed them one at a time. The refusal now names them all, and --skip-bad-files prepares without them, saying so and
listing them in the manifest."""
import gzip
import json
import os
import pickle
import re
from dataclasses import replace

import pytest

from foxformer.argtypes import SettingError
from foxformer.cli import main
from foxformer.data import unreadable
from foxformer.data.preparation import PrepareConfig, prepare, read_manifest
from foxformer.data.sources import describe_source
from foxformer.data.unreadable import UnreadableFile


def _corpus(folder, link: bool = True) -> dict[str, str]:
    """Good documents and bad files in ``folder``; the bad ones' paths -> the problem a prepare should give."""
    folder.mkdir()
    (folder / "a.txt").write_text("a good document\n")
    (folder / "f.txt").write_text("another good document\n")
    (folder / "g.jsonl").write_text(json.dumps({"text": "a good row"}) + "\n")
    (folder / "b.txt").write_bytes(b"caf\xe9 in latin-1\n")
    (folder / "c.txt").write_bytes("written by a Windows editor".encode("utf-16"))
    # its first row reads: none of a file skipped is kept, also the rows before the bad one
    (folder / "e.jsonl").write_bytes(b'{"text": "row one"}\n{"text": "bad \xff row"}\n')
    (folder / "h.jsonl.gz").write_bytes(gzip.compress(b'{"text": "cut short"}\n' * 50)[:30])
    bad = {
        str(folder / "b.txt"): "line 1, column 4 is not UTF-8 (byte 0xe9), at byte offset 3",
        str(folder / "c.txt"): "UTF-16LE text (it starts with a UTF-16LE byte-order mark), not UTF-8",
        str(folder / "e.jsonl"): "line 2, column 15 is not UTF-8 (byte 0xff), at byte offset 34",
        str(folder / "h.jsonl.gz"): "not a complete .gz file (Compressed file ended before the end-of-stream "
                                    "marker was reached)",
    }
    if link:
        os.symlink(folder.parent / "gone.txt", folder / "d.txt")
        bad[str(folder / "d.txt")] = f"a symbolic link to '{folder.parent / 'gone.txt'}', which does not exist"
    return bad


def _config(tmp_path, **kw) -> PrepareConfig:
    return PrepareConfig(sources=[str(tmp_path / "docs")], out_dir=str(tmp_path / "data"), tokenizer="bytes",
                         **{"val_fraction": 0.3, **kw})


def _listed(bad: dict[str, str]) -> str:
    return "; ".join(f"{path}: {problem}" for path, problem in sorted(bad.items()))


def _doc_ids(manifest: dict, out_dir) -> list[str]:
    with open(os.path.join(out_dir, manifest["sources"][0]["shard"], "ids.json")) as f:
        return json.load(f)


# with a link to nothing, the walk finds one before any file is read; without, reading finds the first bad file
@pytest.mark.parametrize("link", [True, False], ids=["found-by-the-walk", "found-by-reading"])
def test_the_refusal_names_every_bad_file_of_the_source(tmp_path, link):
    bad = _corpus(tmp_path / "docs", link)
    cfg = _config(tmp_path)
    with pytest.raises(SettingError) as e:
        prepare(cfg, progress=False)
    assert e.value.field == "source"
    assert str(e.value) == (
        f"source: {len(bad)} file(s) of {cfg.sources[0]!r} cannot be read as text: {_listed(bad)}. Convert each to "
        f"UTF-8 (iconv -f ITS_ENCODING -t utf-8), fetch a damaged one again, restore or remove a broken link, or "
        f"move them out of {cfg.sources[0]!r}; or pass skip_bad_files to prepare the dataset without them (they "
        f"are printed, and listed in its manifest)")
    assert read_manifest(cfg.out_dir) is None


def test_the_command_names_them_all_and_its_flag(tmp_path, capsys):
    bad = _corpus(tmp_path / "docs")
    args = ["data", "prepare", "--source", str(tmp_path / "docs"), "--out", str(tmp_path / "data"), "--tokenizer",
            "bytes", "--no-progress"]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(f"error: --source: {len(bad)} file(s) of "), err
    assert _listed(bad) in err and "or pass --skip-bad-files to prepare the dataset without them" in err

    assert main(args + ["--skip-bad-files"]) == 0
    notes = [line for line in capsys.readouterr().err.splitlines() if "cannot be read as text" in line]
    assert notes == [f"note: {tmp_path / 'docs'}: {len(bad)} file(s) that cannot be read as text skipped "
                     f"(--skip-bad-files; the manifest lists them under skipped_files): {_listed(bad)}"]


def test_skip_bad_files_prepares_the_rest_and_lists_them_in_the_manifest(tmp_path):
    bad = _corpus(tmp_path / "docs")
    cfg = _config(tmp_path, skip_bad_files=True)
    manifest = prepare(cfg, progress=False)
    assert manifest["sources"][0]["skipped_files"] == bad
    assert read_manifest(cfg.out_dir)["sources"][0]["skipped_files"] == bad
    docs = tmp_path / "docs"
    assert _doc_ids(manifest, cfg.out_dir) == [str(docs / "a.txt"), str(docs / "f.txt"), f"{docs / 'g.jsonl'}:1"]
    assert manifest["docs"] == 3


def test_a_prepare_without_the_flag_refuses_a_dataset_made_with_it(tmp_path, monkeypatch):
    """The same request (the same files) has the same bad files: the dataset's record names them, none read again."""
    bad = _corpus(tmp_path / "docs", link=False)
    made = prepare(_config(tmp_path, skip_bad_files=True), progress=False)
    checked = []  # a source read through for its bad files: a refusal from reading would name none of them
    monkeypatch.setattr("foxformer.data.preparation.unreadable_files", lambda *a, **k: checked.append(a) or {})
    said = re.escape(f"{len(bad)} file(s) of {str(tmp_path / 'docs')!r} cannot be read as text: {_listed(bad)}.")
    with pytest.raises(SettingError, match=said):
        prepare(_config(tmp_path), progress=False)
    assert checked == [] and read_manifest(str(tmp_path / "data")) == made  # nothing replaced

    os.remove(tmp_path / "data" / "manifest.json")  # its shard keeps the record too
    with pytest.raises(SettingError, match=said):
        prepare(_config(tmp_path), progress=False)
    assert checked == []


def test_a_prepare_with_the_flag_takes_up_a_dataset_made_without_it(tmp_path):
    """None of its files was bad (it was made): with the flag, the same files give the same dataset."""
    (tmp_path / "docs").mkdir()
    for i in range(3):
        (tmp_path / "docs" / f"{i}.txt").write_text(f"document {i}\n")
    made = prepare(_config(tmp_path), progress=False)
    assert prepare(_config(tmp_path, skip_bad_files=True), progress=False) == made


def test_a_skipped_file_counts_in_the_sources_fingerprint(tmp_path):
    """Fixed or gone, it makes another request than the one that skipped it: its documents are in the folder now."""
    _corpus(tmp_path / "docs")
    before = describe_source(str(tmp_path / "docs")).fingerprint
    os.remove(tmp_path / "docs" / "d.txt")
    assert describe_source(str(tmp_path / "docs")).fingerprint != before


def test_a_file_without_read_permission_is_one(tmp_path, monkeypatch):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.txt").write_text("a document\n")
    (tmp_path / "docs" / "locked.txt").write_text("another\n")
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode, **kw: not str(path).endswith("locked.txt") and
                        real_access(path, mode, **kw))
    with pytest.raises(SettingError, match=re.escape(f": {tmp_path / 'docs' / 'locked.txt'}: cannot be read "
                                                     f"(permission denied). ")):
        prepare(_config(tmp_path), progress=False)
    manifest = prepare(_config(tmp_path, skip_bad_files=True, val_fraction=0.0), progress=False)
    assert manifest["sources"][0]["skipped_files"] == {
        str(tmp_path / "docs" / "locked.txt"): "cannot be read (permission denied)"}


def test_a_source_of_bad_files_only_says_they_were_skipped(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "c.txt").write_bytes("UTF-16".encode("utf-16"))
    with pytest.raises(SettingError, match="yielded no non-empty documents \\(0 empty or only whitespace; 1 "
                                           "file\\(s\\) that cannot be read as text skipped\\)"):
        prepare(_config(tmp_path, skip_bad_files=True), progress=False)


def test_a_long_list_is_cut_with_a_count(tmp_path, monkeypatch):
    monkeypatch.setattr(unreadable, "SHOWN", 2)
    bad = {f"/docs/{i}.txt": "a problem" for i in range(5)}
    assert unreadable.listed(bad) == "/docs/0.txt: a problem; /docs/1.txt: a problem; and 3 more"


def test_the_setting_takes_true_or_false_only(tmp_path):
    (tmp_path / "docs").mkdir()
    with pytest.raises(SettingError, match="skip_bad_files: expected True or False, got 'false'"):
        prepare(_config(tmp_path, skip_bad_files="false"), progress=False)


def test_an_unreadable_file_error_keeps_its_file_through_pickling():
    e = pickle.loads(pickle.dumps(UnreadableFile("/a.txt", "the problem", "/a.txt: the problem: the fix")))
    assert isinstance(e, UnreadableFile) and (e.path, e.problem, str(e)) == (
        "/a.txt", "the problem", "source: /a.txt: the problem: the fix")


def test_a_file_reached_through_links_is_read_and_listed_once(tmp_path, monkeypatch):
    """Through a link beside it (or two), a file without read permission was listed once a name; a good or a bad
    file is read once, under its own name, and each link to nothing is named, each being one to remove."""
    docs, elsewhere = tmp_path / "docs", tmp_path / "elsewhere"
    docs.mkdir()
    elsewhere.mkdir()
    (docs / "good.txt").write_text("a good document\n")
    (docs / "latin.txt").write_bytes(b"caf\xe9\n")
    (docs / "locked.txt").write_text("no permission\n")
    (elsewhere / "locked.txt").write_text("no permission, outside the folder\n")
    for name, target in (("good-1.txt", docs / "good.txt"), ("good-2.txt", docs / "good.txt"),
                         ("latin-1.txt", docs / "latin.txt"), ("locked-1.txt", docs / "locked.txt"),
                         ("outside-1.txt", elsewhere / "locked.txt"), ("outside-2.txt", elsewhere / "locked.txt"),
                         ("gone-1.txt", tmp_path / "gone.txt"), ("gone-2.txt", tmp_path / "gone.txt")):
        os.symlink(target, docs / name)
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode, **kw: "locked" not in os.path.realpath(path) and
                        real_access(path, mode, **kw))
    gone = f"a symbolic link to '{tmp_path / 'gone.txt'}', which does not exist"
    locked = "cannot be read (permission denied)"
    bad = {str(docs / "gone-1.txt"): gone, str(docs / "gone-2.txt"): gone,
           str(docs / "latin.txt"): "line 1, column 4 is not UTF-8 (byte 0xe9), at byte offset 3",
           str(docs / "locked.txt"): locked, str(docs / "outside-1.txt"): locked}
    with pytest.raises(SettingError, match=re.escape(f"{len(bad)} file(s) of {str(docs)!r} cannot be read as text: "
                                                     f"{_listed(bad)}.")):
        prepare(_config(tmp_path), progress=False)
    manifest = prepare(_config(tmp_path, skip_bad_files=True, val_fraction=0.0), progress=False)
    assert manifest["sources"][0]["skipped_files"] == bad
    assert _doc_ids(manifest, tmp_path / "data") == [str(docs / "good.txt")]


@pytest.mark.parametrize("link", [True, False], ids=["found-by-the-walk", "found-by-reading"])
def test_a_refusal_of_more_files_than_it_shows_writes_them_all_to_a_file(tmp_path, monkeypatch, link):
    """It named the first SHOWN and counted the rest, which nothing listed: a folder of a thousand bad files was
    fixed a hundred at a time. The list goes to a file of the output folder, which a prepare that goes on removes."""
    monkeypatch.setattr(unreadable, "SHOWN", 2)
    bad = _corpus(tmp_path / "docs", link)
    listing = tmp_path / "data" / unreadable.LIST_FILE
    with pytest.raises(SettingError) as e:
        prepare(_config(tmp_path), progress=False)
    assert f"; and {len(bad) - 2} more (all of them in {listing}). Convert each" in str(e.value)
    assert listing.read_text() == "".join(f"{path}\t{problem}\n" for path, problem in sorted(bad.items()))
    # the manifest of a prepare that skips them lists them all, as its note says
    assert prepare(_config(tmp_path, skip_bad_files=True), progress=False)["sources"][0]["skipped_files"] == bad
    assert not listing.exists()


def test_a_refusal_that_shows_every_file_writes_no_list(tmp_path):
    _corpus(tmp_path / "docs")
    with pytest.raises(SettingError):
        prepare(_config(tmp_path), progress=False)
    assert not (tmp_path / "data" / unreadable.LIST_FILE).exists()


@pytest.mark.parametrize("others", [False, True], ids=["the-only-source", "beside-another-source"])
@pytest.mark.parametrize("link", [True, False], ids=["found-by-the-walk", "found-by-reading"])
def test_skip_bad_files_is_offered_where_it_leaves_a_file_to_read(tmp_path, others, link):
    """A prepare of one source whose every file is bad was offered skip_bad_files, and then refused for holding no
    documents; beside another source, the dataset is made of that one's."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "latin.txt").write_bytes(b"caf\xe9\n")
    bad = {str(tmp_path / "docs" / "latin.txt"): "line 1, column 4 is not UTF-8 (byte 0xe9), at byte offset 3"}
    if link:
        os.symlink(tmp_path / "gone.txt", tmp_path / "docs" / "link.txt")
        bad[str(tmp_path / "docs" / "link.txt")] = f"a symbolic link to '{tmp_path / 'gone.txt'}', which does not exist"
    sources = [str(tmp_path / "docs")]
    if others:
        (tmp_path / "more.txt").write_text("a good document\n")
        sources.append(str(tmp_path / "more.txt"))
    cfg = PrepareConfig(sources=sources, out_dir=str(tmp_path / "data"), tokenizer="bytes", val_fraction=0.0)
    with pytest.raises(SettingError) as e:
        prepare(cfg, progress=False)
    fix = (f"restore or remove a broken link, or move them out of {sources[0]!r}; or pass skip_bad_files to prepare "
           f"the dataset without them" if others else
           "restore a broken link, or give another source; skip_bad_files would leave no file of it to read")
    assert str(e.value).startswith(f"source: {len(bad)} file(s) of {sources[0]!r} cannot be read as text: "
                                   f"{_listed(bad)}. Convert each to UTF-8 (iconv -f ITS_ENCODING -t utf-8), fetch a "
                                   f"damaged one again, {fix}"), e.value
    if others:
        assert prepare(replace(cfg, skip_bad_files=True), progress=False)["docs"] == 1
