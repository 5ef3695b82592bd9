import codecs
import gzip
import json
import lzma
import os
import random
import re

import pytest

from foxformer.data.sources import describe_source, iter_documents


def test_jsonl_xz_and_gz_read_transparently(jsonl_xz, jsonl_gz, docs):
    assert [d.text for d in iter_documents(jsonl_xz)] == [d["text"] for d in docs]
    assert [d.id for d in iter_documents(jsonl_gz)] == [d["id"] for d in docs[:6]]


def test_text_files_and_directories(tmp_path):
    (tmp_path / "b.txt").write_text("second")
    (tmp_path / "a.md").write_text("first")
    (tmp_path / "ignored.bin").write_bytes(b"\x00")
    got = [d.text for d in iter_documents(str(tmp_path))]
    assert got == ["first", "second"]


def test_missing_text_field_names_the_field(tmp_path):
    p = tmp_path / "x.jsonl"
    p.write_text(json.dumps({"body": "hi"}) + "\n")
    with pytest.raises(ValueError, match="'text'"):
        list(iter_documents(str(p)))
    assert [d.text for d in iter_documents(str(p), text_field="body")] == ["hi"]


def test_null_text_is_an_empty_document_not_the_word_none(tmp_path):
    # str(None) made a document "None" (Parquet nulls were already read as empty)
    p = tmp_path / "x.jsonl"
    p.write_text("\n".join(json.dumps(r) for r in [{"text": "a"}, {"text": None}, {"text": "b"}]) + "\n")
    assert [d.text for d in iter_documents(str(p))] == ["a", "", "b"]


def test_half_a_surrogate_pair_names_the_line_and_a_whole_pair_is_its_character(tmp_path):
    """JSON's \\ud800 without its other half: gpt2 read it as U+FFFD in silence, the bytes tokenizer stopped with
    "'utf-8' codec can't encode character" and Hugging Face ones with a TypeError, neither naming a file."""
    p = tmp_path / "x.jsonl"
    p.write_text('{"text": "a smile \\ud83d\\ude00"}\n{"text": "cut \\uD83D here"}\n')
    with pytest.raises(ValueError, match=r"x.jsonl:2 holds \\ud83d in field 'text', half of a UTF-16 surrogate "
                                         r"pair without its other half"):
        list(iter_documents(str(p)))
    p.write_text('{"text": "a smile \\ud83d\\ude00"}\n')
    assert [d.text for d in iter_documents(str(p))] == ["a smile \N{GRINNING FACE}"]


@pytest.mark.parametrize("spec,match", [("builtin:nothing", "built-in"), ("/no/such/file.jsonl", "does not exist")],
                         ids=["unknown-builtin", "missing-file"])
def test_bad_specs(spec, match):
    with pytest.raises(ValueError, match=match):
        describe_source(spec)


@pytest.mark.parametrize("spec, said", [
    ("~/{rel}", "does not exist: the shell leaves '~' as typed after '=' and in quotes; give '{home}/{rel}'"),
    ("{tmp}/*.nomatch", "matches no file: check the pattern, or give the folder"),
], ids=["tilde-left-by-the-shell", "glob-matching-nothing"])
def test_a_path_the_shell_left_as_typed_says_so(tmp_path, monkeypatch, spec, said):
    """Both read "does not exist", of a file the user could see (~/x) or never named (a pattern)."""
    (tmp_path / "a.txt").write_text("a document")
    monkeypatch.setenv("HOME", str(tmp_path.parent))
    values = {"rel": f"{tmp_path.name}/a.txt", "home": str(tmp_path.parent), "tmp": str(tmp_path)}
    with pytest.raises(ValueError, match=re.escape(said.format(**values))):
        describe_source(spec.format(**values))


@pytest.mark.parametrize("name", ["docs.jsonl.bz2", "docs.txt.zst"], ids=["bz2", "zstd"])
def test_a_compression_not_read_is_named(tmp_path, name):
    """A lone file was "not a supported file", and a folder's note counted it among the .png files by its .bz2."""
    (tmp_path / name).write_bytes(b"compressed bytes")
    (tmp_path / "other.txt").write_text("a document")
    with pytest.raises(ValueError, match=re.escape(f"{str(tmp_path / name)!r} is {os.path.splitext(name)[1]} "
                                                   f"compressed, which is not read: decompress it, or compress it "
                                                   f"again as .gz or .xz")):
        describe_source(str(tmp_path / name))
    assert dict(describe_source(str(tmp_path)).left_out) == {name[name.index("."):]: 1}


def test_a_folder_counts_a_compressed_file_left_out_by_the_kind_inside(tmp_path):
    """A .csv.gz was counted as ".gz" on the note's line that says .gz files are read."""
    import gzip

    for name in ("table.csv.gz", "more.CSV.gz", "logs.gz", "logs.xz", "image.png", "Makefile"):
        (tmp_path / name).write_bytes(gzip.compress(b"a,b\n"))
    (tmp_path / "notes.txt.gz").write_bytes(gzip.compress(b"a document"))
    assert dict(describe_source(str(tmp_path)).left_out) == {".csv.gz": 2, "(no extension)": 1, ".png": 1,
                                                             "(no extension).gz": 1, "(no extension).xz": 1}
    assert [d.text for d in iter_documents(str(tmp_path))] == ["a document"]


@pytest.mark.parametrize("source", ["folder", "file"], ids=["in-a-folder", "given-alone"])
def test_an_unreadable_source_file_is_named_with_its_fix(tmp_path, source):
    """The `error:` line gave an output's advice: "choose a location you may write to"."""
    (tmp_path / "a.txt").write_text("a document")
    spec = str(tmp_path if source == "folder" else tmp_path / "a.txt")

    def refused(paths):
        raise PermissionError(13, "Permission denied", paths[0])

    fix = f"move it out of {spec!r}" if source == "folder" else "leave it out"
    with pytest.raises(ValueError, match=re.escape(f"{tmp_path / 'a.txt'} cannot be read (permission denied): make "
                                                   f"it readable (chmod a+r) or {fix}")):
        describe_source(spec, refused)


def test_builtins_yield_documents():
    sympy_docs = iter_documents("builtin:sympy")
    first = next(sympy_docs)
    assert first.id.startswith("sympy") and "# file: sympy/" in first.text
    pydoc = list(iter_documents("builtin:pydoc"))
    assert len(pydoc) > 20 and all(d.text for d in pydoc)


def test_parquet_source_reads_text_column_or_names_missing_pyarrow(tmp_path):
    path = tmp_path / "d.parquet"
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        path.write_bytes(b"PAR1")
        with pytest.raises(ImportError, match="pyarrow"):
            list(iter_documents(str(path)))
        return
    pq.write_table(pa.table({"text": ["alpha", "beta"], "n": [1, 2]}), path)
    assert [d.text for d in iter_documents(str(path))] == ["alpha", "beta"]
    with pytest.raises(ValueError, match="no column 'body'"):
        list(iter_documents(str(path), text_field="body"))
    # a column of numbers or bytes ended in AttributeError / TypeError deep in prepare
    with pytest.raises(ValueError, match=re.escape(f"source: {path} row 0 has 1 (a number) in field 'n', not text")):
        list(iter_documents(str(path), text_field="n"))
    pq.write_table(pa.table({"text": [b"raw bytes"]}), path)
    with pytest.raises(ValueError, match=re.escape(f"source: {path} row 0 has a value of type bytes in field 'text', not text")):
        list(iter_documents(str(path)))


def test_hf_source_without_datasets_or_hub_is_a_clear_error():
    with pytest.raises((ImportError, ValueError), match="datasets|could not be loaded|cannot be reached"):
        list(iter_documents("hf:nobody/nothing@train"))


def test_hf_source_without_a_route_to_the_hub_fails_at_once(monkeypatch):
    """Offline, `datasets` retried for ~15 s before its error; one connection attempt now says why."""
    import socket

    pytest.importorskip("datasets")
    tried = []

    def no_route(address, timeout=None):
        tried.append((address, timeout))
        raise OSError("Network is unreachable")

    for var in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "https://hub.example.org:8443")
    monkeypatch.setattr(socket, "create_connection", no_route)
    with pytest.raises(ValueError, match=r"'hf:nobody/nothing@train' streams from the Hugging Face hub, and "
                                         r"hub.example.org:8443 cannot be reached from here \(Network is unreachable\)"):
        list(iter_documents("hf:nobody/nothing@train"))
    assert tried == [(("hub.example.org", 8443), 3.0)]


def test_a_folder_source_leaves_hidden_files_and_folders_out(tmp_path):
    """macOS's ._notes.txt resource forks are not UTF-8 and failed the whole folder; .git held no documents."""
    (tmp_path / "notes.txt").write_text("the user's text")
    (tmp_path / "._notes.txt").write_bytes(b"\x00\x05\x16\x07\xff\xfe")
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "description.txt").write_text("not a document")
    assert [d.text for d in iter_documents(str(tmp_path))] == ["the user's text"]


@pytest.mark.parametrize("kind", ["txt", "jsonl"])
def test_a_utf8_byte_order_mark_is_not_part_of_the_text(tmp_path, kind):
    """Windows editors start files with one: it was the document's first character, and a .jsonl file's first
    line was refused as not JSON."""
    path = tmp_path / f"notes.{kind}"
    body = "hello\r\nworld\r\n" if kind == "txt" else '{"text": "hello"}\r\n{"text": "world"}\r\n'
    path.write_bytes(codecs.BOM_UTF8 + body.encode())
    want = ["hello\nworld\n"] if kind == "txt" else ["hello", "world"]
    assert [d.text for d in iter_documents(str(path))] == want


@pytest.mark.parametrize("data, said", [
    ("hello wörld".encode("utf-16"), "is UTF-16LE text (it starts with a UTF-16LE byte-order mark), not UTF-8: "
                                     "convert it (iconv -f UTF-16 -t utf-8"),
    ("hello wörld".encode("utf-32"), "is UTF-32LE text"),
    ("hello world\n".encode("utf-16-le"), "is UTF-16LE text without a byte-order mark (NUL bytes beside its "
                                          "letters), not UTF-8: convert it (iconv -f UTF-16LE -t utf-8) or move it"),
    ("hello wörld\n".encode("utf-16-be"), "is UTF-16BE text without a byte-order mark (NUL bytes beside its "
                                          "letters), not UTF-8: convert it (iconv -f UTF-16BE -t utf-8) or move it"),
    (b"PK\x03\x04\x00\x00binary", "looks like a binary file, not text (4 of its first 12 bytes are NUL or other "
                                  "control bytes): move it out of"),
], ids=["utf16-bom", "utf32-bom", "utf16le-no-bom", "utf16be-no-bom", "binary"])
def test_utf16_and_binary_files_are_refused_by_name(tmp_path, data, said):
    """The advice was to convert from Latin-1 (which turns UTF-16 into letters and NULs); without a byte-order
    mark, ASCII in UTF-16, or a binary file that happens to be valid UTF-8, was tokenized with its NULs, and then
    both were said to be "UTF-16 without a byte-order mark, or not text", with the advice to convert from
    UTF-16LE."""
    path = tmp_path / "docs" / "notes.txt"
    path.parent.mkdir()
    path.write_bytes(data)
    with pytest.raises(ValueError, match=re.escape(f"{path} {said}")):
        list(iter_documents(str(path.parent)))


# a PNG's signature and header chunk, then bytes as random as its compressed pixels
PNG = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x01\x00\x00\x00\x01\x00\x08\x06\x00\x00\x00" + \
    random.Random(0).randbytes(4000)


@pytest.mark.parametrize("name, data, compress", [
    ("random.txt", random.Random(1).randbytes(3000), None),
    ("random-short.txt", random.Random(2).randbytes(200), None),
    ("image.txt", PNG, None),
    ("image.jsonl", PNG, None),
    ("image.jsonl.gz", PNG, gzip.compress),
    ("image.md.xz", PNG, lzma.compress),
], ids=["random-bytes", "few-random-bytes", "png-as-txt", "png-as-jsonl", "png-as-jsonl-gz", "png-as-md-xz"])
@pytest.mark.parametrize("source", ["folder", "file"], ids=["in-a-folder", "given-alone"])
def test_a_binary_file_is_said_to_be_one_without_advice_to_convert_it(tmp_path, name, data, compress, source):
    """Random bytes named .txt were "line 2, column 118 is not UTF-8 (byte 0x80)", with the advice to convert the
    file from Latin-1; a JSON Lines file is decoded a line at a time, and is told by its first bytes (decompressed),
    not by its first line's (a PNG's is six bytes)."""
    (tmp_path / "good.txt").write_text("a document")
    bad = tmp_path / name
    bad.write_bytes(compress(data) if compress else data)
    spec = str(tmp_path if source == "folder" else bad)
    with pytest.raises(ValueError) as e:
        list(iter_documents(spec))
    fix = f"move it out of {spec!r}" if source == "folder" else "leave it out"
    assert re.fullmatch(rf"source: {re.escape(str(bad))} looks like a binary file, not text \(\d+ of its first "
                        rf"{min(len(data), 8000)} bytes are NUL or other control bytes\): {re.escape(fix)}",
                        str(e.value)), e.value


@pytest.mark.parametrize("encoding", ["latin-1", "cp1251", "shift_jis", "gbk"])
def test_text_in_another_encoding_is_told_to_be_converted(tmp_path, encoding):
    """Text in a legacy encoding holds no control bytes: it is not taken for a binary file."""
    path = tmp_path / "notes.txt"
    text = {"latin-1": "Café crème, naïve - ", "cp1251": "Привет, как дела?\n"}.get(encoding, "日本語の文章です。\n")
    path.write_bytes(text.encode(encoding) * 40)
    with pytest.raises(ValueError, match=r" is not UTF-8 \(byte 0x[0-9a-f]{2}\), at byte offset \d+: convert the "
                                         r"file to UTF-8 \(e\.g\. iconv -f latin1 -t utf-8\) or leave it out$"):
        list(iter_documents(str(path)))


@pytest.mark.parametrize("kind", ["txt", "jsonl"])
@pytest.mark.parametrize("source", ["folder", "file"], ids=["in-a-folder", "given-alone"])
def test_a_stray_nul_byte_in_text_is_named_and_left_out_as_its_source_allows(tmp_path, kind, source):
    """A folder's file said "or leave it out", and `--leave-out FILE` was refused: it takes a whole --source. A NUL
    in a file of text is neither UTF-16 nor a binary file's: the advice to convert it from UTF-16LE was false."""
    (tmp_path / "good.txt").write_text("a document")
    bad = tmp_path / f"bad.{kind}"
    text = "".join(json.dumps({"text": f"row {i} of the file"}) + "\n" for i in range(20)) if kind == "jsonl" else \
        "a line of the document\n" * 20
    bad.write_bytes(text.encode() + b"x\x00y\n")
    spec = str(tmp_path if source == "folder" else bad)
    fix = f"move it out of {spec!r}" if source == "folder" else "leave it out"
    with pytest.raises(ValueError, match=re.escape(f"{bad}: line 21, column 2 is a NUL byte, at byte offset "
                                                   f"{len(text) + 1}, which text does not hold")) as e:
        list(iter_documents(spec))
    assert str(e.value).endswith(f"remove the NUL bytes (tr -d '\\000' < FILE > NEW) or {fix}"), e.value


@pytest.mark.parametrize("name", ["cut.jsonl.xz", "cut.jsonl.gz", "plain.txt.gz"],
                         ids=["truncated-xz", "truncated-gz", "not-gzip"])
def test_a_damaged_compressed_file_is_named(tmp_path, name):
    """A download cut short ended in a traceback of EOFError: 'Compressed file ended before the end-of-stream
    marker was reached', naming no file; a .gz that was not gzip in BadGzipFile."""
    import gzip
    import lzma

    rows = "".join(json.dumps({"text": f"document {i} " * 20}) + "\n" for i in range(300)).encode()
    path = tmp_path / name
    if name == "plain.txt.gz":
        path.write_bytes(b"just text")
    else:
        packed = (lzma if name.endswith(".xz") else gzip).compress(rows)
        path.write_bytes(packed[:len(packed) // 2])
    ext = name.rsplit(".", 1)[1]
    with pytest.raises(ValueError, match=re.escape(f"source: {path} is not a complete .{ext} file (")):
        list(iter_documents(str(path)))


def test_a_folder_source_follows_links_once_and_names_broken_ones(tmp_path, monkeypatch):
    """A linked folder was left out without a word, a file linked beside itself was read twice (a copy in train,
    one in validation), a link to nothing ended in FileNotFoundError and an unreadable folder was skipped."""
    import os

    shared, corpus = tmp_path / "shared", tmp_path / "corpus"
    shared.mkdir()
    (shared / "linked.txt").write_text("from a linked folder")
    (corpus / "sub").mkdir(parents=True)
    (corpus / "b.txt").write_text("a document")
    (corpus / "sub" / "c.txt").write_text("in a subfolder")
    os.symlink(shared, corpus / "more")
    os.symlink(corpus / "b.txt", corpus / "a.txt")  # sorts before the file it links to
    os.symlink(corpus, corpus / "sub" / "loop")  # a link to a folder above
    os.symlink(shared, corpus / "sub" / "again")
    docs = list(iter_documents(str(corpus)))
    assert [(os.path.relpath(d.id, corpus), d.text) for d in docs] == [
        ("b.txt", "a document"), ("more/linked.txt", "from a linked folder"), ("sub/c.txt", "in a subfolder")]

    os.symlink(tmp_path / "gone.txt", corpus / "z.txt")
    with pytest.raises(ValueError, match=re.escape(f"'{corpus / 'z.txt'}' is a symbolic link to "
                                                   f"'{tmp_path / 'gone.txt'}', which does not exist")):
        list(iter_documents(str(corpus)))
    # for `data prepare` to refuse with the source's other unreadable files, or to skip (test_unreadable_files.py)
    assert describe_source(str(corpus)).unreadable == (
        (str(corpus / "z.txt"), f"a symbolic link to '{tmp_path / 'gone.txt'}', which does not exist"),)
    os.remove(corpus / "z.txt")

    real_scandir = os.scandir

    def refused(folder):
        if str(folder).endswith("sub"):
            raise PermissionError(13, "Permission denied", str(folder))
        return real_scandir(folder)

    monkeypatch.setattr(os, "scandir", refused)
    with pytest.raises(ValueError, match=re.escape(f"the folder '{corpus / 'sub'}' in '{corpus}' cannot be read "
                                                   f"(Permission denied)")):
        describe_source(str(corpus))


@pytest.mark.parametrize("twin", ["a.txt.gz", "a.txt.xz"])
def test_a_file_beside_its_compressed_copy_is_refused(tmp_path, twin):
    """`gzip -k` keeps a.txt beside a.txt.gz: the folder's documents held each of its documents twice."""
    import gzip
    import lzma

    (tmp_path / "a.txt").write_text("one document")
    (tmp_path / "b.txt").write_text("another")
    with (gzip.open if twin.endswith(".gz") else lzma.open)(tmp_path / twin, "wt") as f:
        f.write("one document")
    with pytest.raises(ValueError, match=f"'{tmp_path}/a.txt' and '{tmp_path}/{twin}' are one file with and without "
                                         f"compression"):
        describe_source(str(tmp_path))
    os.remove(tmp_path / "a.txt")
    assert [d.text for d in iter_documents(str(tmp_path))] == ["one document", "another"]


@pytest.mark.parametrize("files, said", [
    (["config.yaml", "metrics.jsonl", "checkpoints/"], "a training run's folder (it holds config.yaml, "
                                                       "metrics.jsonl, checkpoints)"),
    (["config.json", "model.safetensors", "tokenizer.json"], "a Hugging Face model folder (it holds config.json, "
                                                             "model.safetensors)"),
], ids=["run", "hf-model"])
def test_a_run_or_model_folder_given_as_text_is_refused_by_what_it_is(tmp_path, files, said):
    """`eval loss RUN --source RUN` read the run's metrics.jsonl as documents and sent the user to --text-field; a
    model folder's config.json was refused as JSON over several lines."""
    folder = tmp_path / "model"
    folder.mkdir()
    for name in files:
        if name.endswith("/"):
            (folder / name).mkdir()
        else:
            (folder / name).write_text(json.dumps({"kind": "train", "step": 1}) + "\n")
    with pytest.raises(ValueError) as e:
        list(iter_documents(str(folder)))
    assert str(e.value) == (f"source: {str(folder)!r} is {said}, not text: give the documents to read (a file, a "
                            f"folder of them, or a built-in corpus such as builtin:pydoc)")


def test_a_folder_of_documents_with_a_config_file_of_its_own_is_read(tmp_path):
    (tmp_path / "config.yaml").write_text("site: docs\n")
    (tmp_path / "guide.md").write_text("how to")
    (tmp_path / "notes.jsonl").write_text(json.dumps({"text": "metrics"}) + "\n")
    assert [d.text for d in iter_documents(str(tmp_path))] == ["how to", "metrics"]


def _saved_hf(folder, splits=None):
    """The files `datasets`' save_to_disk writes: a Dataset's state.json, dataset_info.json and .arrow rows, or with
    ``splits`` a DatasetDict's dataset_dict.json and one such folder a split."""
    folder.mkdir(parents=True)
    if splits:
        (folder / "dataset_dict.json").write_text(json.dumps({"splits": splits}))
        for split in splits:
            _saved_hf(folder / split)
        return
    (folder / "state.json").write_text(json.dumps({"_data_files": [{"filename": "data-00000-of-00001.arrow"}]},
                                                  indent=2))
    (folder / "dataset_info.json").write_text(json.dumps({"features": {"text": {"dtype": "string"}}}, indent=2))
    (folder / "data-00000-of-00001.arrow").write_bytes(b"\xff\xff\xff\xff arrow stream")


def test_a_hugging_face_save_to_disk_folder_is_refused_with_the_command_that_makes_it_parquet(tmp_path):
    """Its dataset_info.json was read as JSON Lines and refused as JSON over several lines, with jq commands that
    rewrite it: its .arrow rows are what the user meant, and Parquet is read."""
    _saved_hf(tmp_path / "ds")
    command = (f"python -c 'import datasets; datasets.load_from_disk(\"{tmp_path}/ds\").to_parquet(\"{tmp_path}/"
               f"ds.parquet\")'")
    with pytest.raises(ValueError) as e:
        describe_source(str(tmp_path / "ds"))
    assert str(e.value) == (f"source: '{tmp_path}/ds' is a Hugging Face dataset saved with save_to_disk, whose "
                            f".arrow files are not read: write its rows as Parquet (`{command}`), and give that file")
    # a DatasetDict inside a folder of documents: one split a file, and the folder moved out of the source
    (tmp_path / "ds").rename(tmp_path / "elsewhere")
    (tmp_path / "notes.txt").write_text("a document")
    _saved_hf(tmp_path / "dd", ["train", "test"])
    command = (f"python -c 'import datasets; datasets.load_from_disk(\"{tmp_path}/dd\")[\"train\"].to_parquet(\""
               f"{tmp_path}/dd-train.parquet\")'")
    with pytest.raises(ValueError) as e:
        list(iter_documents(str(tmp_path)))
    assert str(e.value) == (f"source: '{tmp_path}/dd' is a Hugging Face dataset saved with save_to_disk, whose "
                            f".arrow files are not read: write its rows as Parquet (`{command}`), one split a file "
                            f"(its splits: train, test; in one source, test rows would be trained on), and give that "
                            f"file, and move the folder out of '{tmp_path}'")


def test_an_hf_source_naming_a_local_folder_or_file_says_to_give_it_as_one(tmp_path, monkeypatch):
    """hf: streams from the hub, so `hf:./my_data` (which `datasets` reads from the folder) said the hub cannot be
    reached, after a try."""
    import socket

    def no_hub(*args, **kwargs):
        raise AssertionError("the hub was tried")

    monkeypatch.setattr(socket, "create_connection", no_hub)
    (tmp_path / "data").mkdir()
    (tmp_path / "rows.jsonl").write_text(json.dumps({"text": "hi"}) + "\n")
    for name, what in (("data", "folder"), ("rows.jsonl", "file")):
        with pytest.raises(ValueError, match=re.escape(f"source: 'hf:{tmp_path}/{name}' names '{tmp_path}/{name}', a "
                                                       f"{what} here, where hf: streams from the Hugging Face hub: "
                                                       f"give it without 'hf:' (read are .txt/")):
            describe_source(f"hf:{tmp_path}/{name}")
    _saved_hf(tmp_path / "saved")
    with pytest.raises(ValueError, match=re.escape(f"source: 'hf:{tmp_path}/saved' names '{tmp_path}/saved', a "
                                                   f"folder here, where hf: streams from the Hugging Face hub; the "
                                                   f"folder is a Hugging Face dataset saved with save_to_disk")):
        list(iter_documents(f"hf:{tmp_path}/saved"))
