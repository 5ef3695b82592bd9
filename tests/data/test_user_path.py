"""`foxformer data prepare` and a dataset met by `foxformer train`, as a user meets them: a bad path or byte
is one `error:` line naming it, and the advice given works."""
import json
import os
import pickle

import pytest

from foxformer.cli import main


def _error(capsys) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert "Traceback" not in err and lines and lines[-1].startswith("error: "), err
    return lines[-1]


def test_prepare_out_naming_a_file_is_one_error_line(tmp_path, capsys):
    src = tmp_path / "a.txt"
    src.write_text("hello " * 50)
    assert main(["data", "prepare", "--source", str(src), "--out", str(src), "--tokenizer", "bytes",
                 "--no-progress"]) == 2
    assert f"--out: '{src}' is a file, not a folder" in _error(capsys)
    assert src.read_text() == "hello " * 50


@pytest.mark.parametrize("name, what", [("config.yaml", "a training run's folder"),
                                        ("config.json", "a Hugging Face model folder")])
def test_prepare_out_naming_a_run_or_a_model_folder_is_refused(tmp_path, capsys, name, what):
    """`--out RUN` wrote the dataset's shards and splits among the run's checkpoints (or a model's files)."""
    out = tmp_path / "taken"
    out.mkdir()
    (out / name).write_text("{}\n")
    assert main(["data", "prepare", "--source", "builtin:pydoc", "--out", str(out), "--tokenizer", "bytes",
                 "--no-progress"]) == 2
    assert _error(capsys) == (f"error: --out: '{out}' is {what} (it holds {name}), not a dataset folder: name a "
                              f"new folder for the dataset, e.g. data_cache/NAME")
    assert os.listdir(out) == [name]


@pytest.mark.parametrize("kind", ["txt", "jsonl"])
def test_a_source_that_is_not_utf8_names_the_file_and_line(tmp_path, capsys, kind):
    """It was `'utf-8' codec can't decode byte 0xff in position 13`: no file, no line."""
    good = tmp_path / "docs" / f"good.{kind}"
    bad = tmp_path / "docs" / f"bad.{kind}"
    good.parent.mkdir()
    if kind == "txt":
        good.write_text("fine text\n")
        bad.write_bytes(b"line one\nline two\nab\xffcd\n")
    else:
        good.write_text(json.dumps({"text": "fine"}) + "\n")
        bad.write_bytes(b'{"text": "a"}\n{"text": "b"}\n{"text": "ab\xffcd"}\n')
    assert main(["data", "prepare", "--source", str(good.parent), "--out", str(tmp_path / "out"), "--tokenizer",
                 "bytes", "--no-progress"]) == 2
    line = _error(capsys)
    column, offset = (3, 20) if kind == "txt" else (13, 40)
    assert f"{bad}: line 3, column {column} is not UTF-8 (byte 0xff), at byte offset {offset}" in line, line
    # "or leave it out" sent the user to --leave-out, which takes whole sources and refused the file
    assert f"or move them out of {str(good.parent)!r}; or pass --skip-bad-files" in line, line


def test_one_document_explains_its_empty_validation_split(tmp_path, capsys):
    """A single .txt document has no validation split: the advice was '--val-fraction above 0' (it was 0.05)."""
    src = tmp_path / "book.txt"
    src.write_text("a line of a long book\n" * 200)
    data = str(tmp_path / "book")
    assert main(["data", "prepare", "--source", str(src), "--out", data, "--tokenizer", "bytes",
                 "--no-progress"]) == 0
    assert "has no validation documents" in capsys.readouterr().err
    assert main(["train", "--data", data, "--out", str(tmp_path / "run"), "--context", "32", "--batch-tokens", "64",
                 "--max-steps", "1", "--no-progress"]) == 2
    line = _error(capsys)
    assert "the dataset is one document" in line and "--val-fraction" not in line


@pytest.mark.parametrize("given, what, stem", [("notes.txt", "a file", "notes"),
                                                ("notes", "a folder of documents", "notes")],
                         ids=["text-file", "folder-of-text-files"])
def test_text_as_data_suggests_a_prepare_command_that_works(tmp_path, capsys, given, what, stem):
    """`--data file.txt` suggested `foxformer data prepare --out file.txt`, which then failed; `--data folder` of
    .txt files suggested the same, which prepared SymPy's source (the default) into the user's folder."""
    (tmp_path / "notes").mkdir()
    for i in range(3):
        (tmp_path / "notes" / f"n{i}.txt").write_text(f"some notes {i}\n" * 20)
    (tmp_path / "notes.txt").write_text("some notes\n" * 20)
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        assert main(["train", "--data", given, "--out", "run", "--max-steps", "1", "--no-progress"]) == 2
        line = _error(capsys)
        assert f"'{given}' is {what}, not a prepared dataset" in line
        suggested = line.split("`foxformer ")[1].split("`")[0].split()
        assert main(suggested + ["--tokenizer", "bytes", "--no-progress"]) == 0
        manifest = json.load(open(os.path.join("data_cache", stem, "manifest.json")))
        assert [s["spec"] for s in manifest["sources"]] == [given]
        assert sorted(os.listdir("notes")) == ["n0.txt", "n1.txt", "n2.txt"]
    finally:
        os.chdir(cwd)


@pytest.mark.parametrize("files, said", [
    (("config.yaml", "metrics.jsonl"), "a training run's folder (it holds config.yaml)"),
    (("config.json", "README.md"), "a Hugging Face model folder (it holds config.json)")], ids=["run", "export"])
def test_a_run_or_model_folder_as_data_is_named_as_such(tmp_path, capsys, files, said):
    """A run's metrics.jsonl made `--data RUN` "a folder of documents", with the advice to tokenize the run."""
    folder = tmp_path / "run"
    folder.mkdir()
    for name in files:
        (folder / name).write_text("{}\n")
    for argv, named in ((["train", "--data", str(folder), "--out", str(tmp_path / "new"), "--max-steps", "1",
                          "--no-progress"], "--data (data_dir)"), (["data", "info", str(folder)], "data")):
        assert main(argv) == 2
        line = _error(capsys)
        assert line.startswith(f"error: {named}: '{folder}' is {said}, not a prepared dataset: give the folder "
                               f"`foxformer data prepare --out` wrote"), line
        assert "--source" not in line


def test_the_folder_above_a_dataset_as_data_names_the_datasets_in_it(tmp_path, capsys, monkeypatch):
    """`--data data_cache` (the parent of the dataset meant) was told to run `data prepare --out data_cache`."""
    monkeypatch.chdir(tmp_path)
    assert main(["data", "prepare", "--source", "builtin:pydoc", "--out", "data_cache/pydoc", "--tokenizer", "bytes",
                 "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["train", "--data", "data_cache", "--out", "run", "--max-steps", "1", "--no-progress"]) == 2
    said = "'data_cache' holds prepared datasets (data_cache/pydoc) rather than being one; give one of them"
    assert _error(capsys) == f"error: --data (data_dir): {said}: --data data_cache/pydoc"
    assert main(["data", "info", "data_cache"]) == 2
    assert _error(capsys) == f"error: data: {said}"
    assert sorted(os.listdir("data_cache")) == ["pydoc"] and not os.path.exists("run")


def test_a_mistyped_tokenizer_on_train_is_named_not_the_dataset(tmp_path, capsys, monkeypatch):
    """`train --tokenizer byte` on a bytes dataset blamed --data, advising to prepare it again with 'byte'."""
    monkeypatch.chdir(tmp_path)
    assert main(["data", "prepare", "--source", "builtin:pydoc", "--out", "d", "--tokenizer", "bytes",
                 "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["train", "--data", "d", "--out", "run", "--tokenizer", "byte", "--max-steps", "1",
                 "--no-progress"]) == 2
    assert _error(capsys).startswith("error: --tokenizer (tokenizer): unknown spec 'byte' (did you mean 'bytes'?); "
                                     "expected 'gpt2'")
    assert main(["train", "--data", "d", "--out", "run", "--tokenizer", "gpt2", "--max-steps", "1",
                 "--no-progress"]) == 2
    assert "'d' was tokenized with 'bytes' but the run expects tokenizer 'gpt2'" in _error(capsys)


@pytest.mark.parametrize("source, said", [
    ("/dev/null", "error: --source: '/dev/null' is not a regular file or folder (a device, pipe or socket); give a "
                  "file or a folder of documents"),
    ("hf:", "error: --source: 'hf:' names no dataset; expected hf:<dataset>[:<config>][@<split>], e.g. "
            "'hf:roneneldan/TinyStories'"),
    ("hf::wikitext-2-raw-v1@test", "error: --source: 'hf::wikitext-2-raw-v1@test' names no dataset; expected "
                                   "hf:<dataset>[:<config>][@<split>], e.g. 'hf:roneneldan/TinyStories'"),
], ids=["device-file", "hf-without-a-name", "hf-config-without-a-name"])
def test_a_source_that_names_no_documents_is_refused_at_once(tmp_path, capsys, monkeypatch, source, said):
    """/dev/null was said not to exist; `hf:` went to the network (a hub check, then `datasets`) for no dataset."""
    def no_network(*args, **kwargs):
        raise AssertionError("the hub was asked")

    monkeypatch.setattr("foxformer.data.sources.hub_unreachable", no_network)
    out = tmp_path / "out"
    assert main(["data", "prepare", "--source", source, "--out", str(out), "--tokenizer", "bytes",
                 "--no-progress"]) == 2
    assert _error(capsys) == said
    assert not out.exists()


def test_info_on_a_folder_of_text_suggests_the_prepare_command(tmp_path, capsys, monkeypatch):
    """`data info notes` (a folder of .txt files) said "no manifest.json", as for an interrupted prepare."""
    (tmp_path / "notes").mkdir()
    for i in range(3):
        (tmp_path / "notes" / f"n{i}.txt").write_text(f"some notes {i}\n" * 20)
    monkeypatch.chdir(tmp_path)
    assert main(["data", "info", "notes"]) == 2
    assert _error(capsys) == ("error: data: 'notes' is a folder of documents, not a prepared dataset; tokenize it "
                              "first with `foxformer data prepare --source notes --out data_cache/notes`")
    assert main(["data", "prepare", "--source", "notes", "--out", "data_cache/notes", "--tokenizer", "bytes",
                 "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["data", "info", "data_cache/notes"]) == 0
    assert json.loads(capsys.readouterr().out)["docs"] == 3


def test_prepare_names_the_flag_of_an_error_raised_past_the_checks(tmp_path, capsys):
    """A bad --tokenizer, --source or --out found while preparing said `tokenizer:`, `source:`, `out_dir:` (the
    Python API's names, which it keeps): the command names the flag its user typed."""
    from foxformer.data.preparation import PrepareConfig, prepare

    src = tmp_path / "a.txt"
    src.write_text("hello " * 50)
    out = tmp_path / "d"
    base = ["data", "prepare", "--source", str(src), "--out", str(out), "--no-progress"]
    assert main([*base, "--tokenizer", "byte"]) == 2
    assert _error(capsys).startswith("error: --tokenizer: unknown spec 'byte' (did you mean 'bytes'?); expected "
                                     "'gpt2'")
    assert main(["data", "prepare", "--source", str(tmp_path / "nope"), "--out", str(out), "--no-progress"]) == 2
    assert _error(capsys).startswith(f"error: --source: '{tmp_path / 'nope'}' does not exist")
    assert main([*base, "--tokenizer", "bytes"]) == 0
    capsys.readouterr()
    assert main([*base, "--tokenizer", "bytes", "--seed", "3"]) == 2
    assert _error(capsys) == (f"error: --out: '{out}' already holds a dataset prepared from a different request "
                              f"(--seed 0 then, 3 now); use another directory, or pass --force to replace it")
    for cfg, said in [(PrepareConfig(sources=[str(src)], out_dir=str(tmp_path / "e"), tokenizer="byte"),
                       "tokenizer: unknown spec 'byte'"),
                      (PrepareConfig(sources=[str(tmp_path / "nope")], out_dir=str(tmp_path / "e")),
                       f"source: '{tmp_path / 'nope'}' does not exist"),
                      (PrepareConfig(sources=[str(src)], out_dir=str(out), tokenizer="bytes", seed=3),
                       f"out_dir: '{out}' already holds a dataset prepared from a different request (seed 0 then, "
                       f"3 now); use another directory, or pass force to replace it")]:
        with pytest.raises(ValueError) as refused:
            prepare(cfg, progress=False)
        assert str(refused.value).startswith(said)


@pytest.mark.parametrize("flags, kwargs, cli_said, api_said", [
    (["--val-fraction", "0.5"], {"val_fraction": 0.5}, "--val-fraction 0.05 then, 0.5 now",
     "val_fraction 0.05 then, 0.5 now"),
    (["--max-tokens-per-source", "100"], {"max_tokens_per_source": 100}, "--max-tokens-per-source unset then, 100 now",
     "max_tokens_per_source unset then, 100 now"),
    (["--text-field", "body", "--seed", "3"], {"text_field": "body", "seed": 3},
     "--seed 0 then, 3 now; --text-field 'text' then, 'body' now", "seed 0 then, 3 now; text_field 'text' then, "
                                                                   "'body' now"),
], ids=["val-fraction", "max-tokens-per-source-from-unset", "text-field-and-seed"])
def test_a_different_request_names_the_flags_on_the_command_line_and_the_fields_in_python(
        tmp_path, capsys, flags, kwargs, cli_said, api_said):
    from foxformer.data.preparation import PrepareConfig, prepare

    src, out = tmp_path / "a.txt", tmp_path / "d"
    src.write_text("hello " * 50)
    base = ["data", "prepare", "--source", str(src), "--out", str(out), "--tokenizer", "bytes", "--no-progress"]
    assert main(base) == 0
    capsys.readouterr()
    assert main([*base, *flags]) == 2
    assert _error(capsys) == (f"error: --out: '{out}' already holds a dataset prepared from a different request "
                              f"({cli_said}); use another directory, or pass --force to replace it")
    with pytest.raises(ValueError) as refused:
        prepare(PrepareConfig(sources=[str(src)], out_dir=str(out), tokenizer="bytes", **kwargs), progress=False)
    assert str(refused.value) == (f"out_dir: '{out}' already holds a dataset prepared from a different request "
                                  f"({api_said}); use another directory, or pass force to replace it")


def test_a_left_out_source_that_is_not_a_source_names_the_flag_or_the_field(tmp_path, capsys):
    from foxformer.data.preparation import PrepareConfig

    src = str(tmp_path / "a.txt")
    assert main(["data", "prepare", "--source", src, "--leave-out", "a.txt", "--out", str(tmp_path / "d"),
                 "--no-progress"]) == 2
    assert _error(capsys) == (f"error: --leave-out: ['a.txt'] are not among the sources ['{src}']; give a source "
                              f"exactly as passed to --source")
    with pytest.raises(ValueError) as refused:
        PrepareConfig(sources=[src], leave_out=["a.txt"]).validate()
    assert str(refused.value) == (f"leave_out: ['a.txt'] are not among the sources ['{src}']; give a source exactly "
                                  f"as passed to sources")
    # a worker's error reaches its parent pickled: in the API's words, as the naming function does not pickle
    assert str(pickle.loads(pickle.dumps(refused.value))) == str(refused.value)


def _export(folder, tokenizer) -> str:
    from foxformer.models import FoxForCausalLM, get_preset

    vocab = 257 if tokenizer == "bytes" else 50304
    FoxForCausalLM(get_preset("fox-llama-tiny", vocab_size=vocab, tokenizer=tokenizer)).save_pretrained(folder)
    return str(folder)


@pytest.mark.parametrize("spec, form", [("bytes", "{}"), ("gpt2-json", "{}"), ("gpt2-json", "hf:{}")],
                         ids=["bytes-export", "gpt2-json-export", "gpt2-json-export-as-hf"])
def test_a_model_export_as_tokenizer_is_the_tokenizer_it_records(tmp_path, capsys, monkeypatch, spec, form):
    """`--tokenizer EXPORT` read the export as a Hugging Face tokenizer: a gpt2-json one asked whether to run its
    remote code (refused here, with no one at the terminal), a bytes one was recorded as `hf:EXPORT`."""
    import io

    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    export = _export(tmp_path / "export", spec)
    src = tmp_path / "a.txt"
    src.write_text("hello naïve world\n" * 20)
    for name, given in (("by-export", form.format(export)), ("by-name", spec)):
        assert main(["data", "prepare", "--source", str(src), "--out", str(tmp_path / name), "--tokenizer", given,
                     "--no-progress"]) == 0
    capsys.readouterr()
    made = [json.loads((tmp_path / name / "manifest.json").read_text()) for name in ("by-export", "by-name")]
    assert made[0]["tokenizer"] == spec
    assert (tmp_path / "by-export" / "train.bin").read_bytes() == (tmp_path / "by-name" / "train.bin").read_bytes()


def test_a_model_export_that_records_no_tokenizer_is_refused(tmp_path, capsys):
    export = _export(tmp_path / "export", None)
    assert main(["data", "prepare", "--source", "builtin:pydoc", "--out", str(tmp_path / "d"), "--tokenizer",
                 export, "--no-progress"]) == 2
    assert _error(capsys) == (f"error: --tokenizer: {export} is a foxformer model export that records no tokenizer; "
                              f"give the tokenizer its model was trained with ('gpt2', 'bytes', ...) instead")
    assert not (tmp_path / "d").exists()


@pytest.mark.parametrize("out, said", [("docs", "'docs' is the source folder"), (".", "'.' holds the source 'docs'")],
                         ids=["the-source-folder", "a-folder-above-it"])
def test_an_out_folder_that_holds_the_source_names_no_config_field(tmp_path, capsys, monkeypatch, out, said):
    """`--out: ... choose an out_dir outside it`: the flag's user typed no out_dir."""
    monkeypatch.chdir(tmp_path)
    os.mkdir("docs")
    (tmp_path / "docs" / "a.txt").write_text("a document")
    assert main(["data", "prepare", "--source", "docs", "--out", out, "--tokenizer", "bytes", "--no-progress"]) == 2
    assert _error(capsys) == (f"error: --out: {said}: the dataset's files (manifest.json, shards/, train.bin, ...) "
                              f"would be written among the documents; give the dataset a folder of its own, e.g. "
                              f"'docs/prepared'")
