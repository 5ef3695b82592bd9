import importlib
import json
import os
import re

import numpy as np
import pytest

from foxformer.data.preparation import PrepareConfig, prepare, read_manifest
from foxformer.paths import write_json
from foxformer.data.tokenizer import load_tokenizer, older_tokenizer_files, tokenizer_files

from .helpers import word_tokenizer

prep_mod = importlib.import_module("foxformer.data.preparation")


def _cfg(tmp_path, sources, **kw):
    return PrepareConfig(sources=sources, out_dir=str(tmp_path / "out"), **kw)


def _split_docs(out_dir, split, manifest):
    toks = np.fromfile(os.path.join(out_dir, f"{split}.bin"), dtype=manifest["dtype"])
    idx = np.load(os.path.join(out_dir, f"{split}.idx.npy"))
    return [toks[a:b].tolist() for a, b in zip(idx[:-1], idx[1:])]


def test_split_is_by_whole_document(tmp_path, jsonl_xz, docs):
    m = prepare(_cfg(tmp_path, [jsonl_xz], val_fraction=0.25), progress=False)
    out = str(tmp_path / "out")
    tok = load_tokenizer("gpt2")
    expected = {tuple(tok.encode(d["text"]) + [tok.eot_id]) for d in docs}
    train = [tuple(d) for d in _split_docs(out, "train", m)]
    val = [tuple(d) for d in _split_docs(out, "val", m)]
    # Every document lands whole in exactly one split, each followed by the end-of-document token.
    assert set(train) | set(val) == expected
    assert not set(train) & set(val)
    assert len(train) + len(val) == len(docs)
    assert len(val) == 5 and m["split"]["val"]["docs"] == 5
    assert all(d[-1] == tok.eot_id and tok.eot_id not in d[:-1] for d in train + val)


@pytest.mark.parametrize("second", ["same", "dot-path", "builtin"], ids=["same-spec", "same-file-other-path",
                                                                           "same-builtin"])
def test_a_source_given_twice_is_refused(tmp_path, jsonl_xz, second, monkeypatch):
    # each copy of a document was split on its own: one copy in train, the other in validation
    if second == "builtin":
        sources = ["builtin:pydoc", "builtin:pydoc"]
    else:
        monkeypatch.chdir(os.path.dirname(jsonl_xz))
        sources = [jsonl_xz, jsonl_xz if second == "same" else os.path.join(".", os.path.basename(jsonl_xz))]
    with pytest.raises(ValueError, match="twice"):
        prepare(_cfg(tmp_path, sources), progress=False)
    assert not (tmp_path / "out" / "shards").exists()


def test_manifest_records_tokenizer_sources_counts_split(tmp_path, jsonl_xz, jsonl_gz):
    m = prepare(_cfg(tmp_path, [jsonl_xz, jsonl_gz], val_fraction=0.1, seed=3), progress=False)
    assert m == read_manifest(str(tmp_path / "out"))
    assert m["tokenizer"] == "gpt2" and m["vocab_size"] == 50257 and m["eot_id"] == 50256
    assert m["dtype"] == "uint16"
    assert [s["spec"] for s in m["sources"]] == [jsonl_xz, jsonl_gz]
    assert [s["docs"] for s in m["sources"]] == [20, 6]
    assert m["docs"] == 26
    assert m["split"]["by"] == "document" and m["split"]["seed"] == 3
    assert m["split"]["train"]["tokens"] + m["split"]["val"]["tokens"] == m["tokens"] == \
        sum(s["tokens"] for s in m["sources"])
    for split in ("train", "val"):
        size = os.path.getsize(tmp_path / "out" / f"{split}.bin")
        assert size == 2 * m["split"][split]["tokens"]


def test_rerun_skips_finished_work(tmp_path, jsonl_xz, monkeypatch):
    cfg = _cfg(tmp_path, [jsonl_xz])
    first = prepare(cfg, progress=False)
    mtime = os.path.getmtime(tmp_path / "out" / "train.bin")

    def boom(*a, **k):
        raise AssertionError("a finished dataset must not be read or tokenized again")

    monkeypatch.setattr(prep_mod, "iter_documents", boom)
    assert prepare(cfg, progress=False) == first
    assert os.path.getmtime(tmp_path / "out" / "train.bin") == mtime


def test_finished_sources_are_reused_after_a_request_change(tmp_path, jsonl_xz, jsonl_gz, monkeypatch):
    prepare(_cfg(tmp_path, [jsonl_xz]), progress=False)
    seen = []
    real = prep_mod.iter_documents
    monkeypatch.setattr(prep_mod, "iter_documents", lambda spec, *rest: seen.append(spec) or real(spec, *rest))
    m = prepare(_cfg(tmp_path, [jsonl_xz, jsonl_gz], val_fraction=0.2), force=True, progress=False)
    assert seen == [jsonl_gz]  # the .xz shard was already tokenized
    assert m["docs"] == 26


def test_interrupted_run_leaves_nothing_trusted_and_rerun_completes(tmp_path, jsonl_xz, jsonl_gz, monkeypatch):
    cfg = _cfg(tmp_path, [jsonl_xz, jsonl_gz])
    real = prep_mod.iter_documents

    def dies_on_second_source(spec, *rest):
        if spec == jsonl_gz:
            yield from list(real(spec, *rest))[:2]
            raise KeyboardInterrupt("simulated interruption")
        yield from real(spec, *rest)

    monkeypatch.setattr(prep_mod, "iter_documents", dies_on_second_source)
    out = tmp_path / "out"
    # a bare "interrupted" left it unsaid whether the rerun starts over
    with pytest.raises(KeyboardInterrupt, match=re.escape(f"the sources tokenized in full are kept in "
                                                          f"{out / 'shards'}: the same `foxformer data prepare` "
                                                          f"command goes on from them")):
        prepare(cfg, progress=False)
    assert read_manifest(str(out)) is None
    assert not (out / "train.bin").exists()
    # The finished source's shard stays, the half-tokenized one left nothing: its temporary (the tokens so far,
    # up to a source's size) stayed until the next prepare into the folder
    assert len(os.listdir(out / "shards")) == 1 and ".tmp-" not in os.listdir(out / "shards")[0]
    monkeypatch.setattr(prep_mod, "iter_documents", real)
    m = prepare(cfg, progress=False)
    clean = prepare(_cfg(tmp_path / "clean", [jsonl_xz, jsonl_gz]), progress=False)
    assert m["split"] == clean["split"]
    for split in ("train", "val"):
        assert (out / f"{split}.bin").read_bytes() == (tmp_path / "clean" / "out" / f"{split}.bin").read_bytes()


def test_different_request_in_same_dir_is_refused_without_force(tmp_path, jsonl_xz, jsonl_gz):
    prepare(_cfg(tmp_path, [jsonl_xz]), progress=False)
    before = (tmp_path / "out" / "train.bin").read_bytes()
    with pytest.raises(ValueError, match="different request"):
        prepare(_cfg(tmp_path, [jsonl_gz]), progress=False)
    assert (tmp_path / "out" / "train.bin").read_bytes() == before
    m = prepare(_cfg(tmp_path, [jsonl_gz]), force=True, progress=False)
    assert m["docs"] == 6


def test_max_tokens_per_source_keeps_whole_documents(tmp_path, jsonl_xz):
    m = prepare(_cfg(tmp_path, [jsonl_xz], max_tokens_per_source=100, val_fraction=0.0), progress=False)
    assert 100 <= m["tokens"] < 100 + 200
    assert m["split"]["val"]["docs"] == 0


@pytest.mark.parametrize("val_fraction", [0.05, 0.5, 0.9], ids=["default", "half", "most"])
def test_a_single_document_stays_in_train(tmp_path, val_fraction):
    # one document and val_fraction >= 0.5 rounded to one validation document: train was left empty
    (tmp_path / "book.txt").write_text("A whole book in one file. " * 40)
    m = prepare(_cfg(tmp_path, [str(tmp_path / "book.txt")], val_fraction=val_fraction), progress=False)
    assert m["split"]["train"]["docs"] == 1 and m["split"]["val"]["docs"] == 0


def test_builtin_corpus_works_offline(tmp_path):
    m = prepare(_cfg(tmp_path, ["builtin:sympy"], max_tokens_per_source=20_000), progress=False)
    assert m["sources"][0]["fingerprint"].startswith("sympy-")
    assert m["split"]["train"]["docs"] >= 1 and m["split"]["val"]["docs"] >= 1
    train = np.fromfile(tmp_path / "out" / "train.bin", dtype=np.uint16)
    text = load_tokenizer("gpt2").decode(train[:2000].tolist())
    assert "# file: sympy/" in text


@pytest.mark.parametrize("kw,match", [({"val_fraction": 1.5}, "val_fraction"), ({"sources": []}, "sources"),
                                      ({"max_tokens_per_source": 0}, "max_tokens_per_source"),
                                      ({"sources": [f"{i}.txt" for i in range(32769)]},
                                       "sources: 32769 sources, more than the 32768 a dataset records")],
                         ids=["val-fraction", "no-sources", "zero-cap", "more-sources-than-int16-indexes"])
def test_bad_config_is_a_clear_error(tmp_path, kw, match):
    cfg = PrepareConfig(out_dir=str(tmp_path / "o"), **kw)
    with pytest.raises(ValueError, match=match):
        prepare(cfg, progress=False)


@pytest.mark.parametrize("seed", [-1, 1.5, "3"], ids=["negative", "fractional", "string"])
def test_bad_seed_is_refused_before_tokenizing(tmp_path, jsonl_xz, seed):
    # numpy refuses a negative seed only when the split is drawn, after every source was tokenized
    out = tmp_path / "o"
    with pytest.raises(ValueError, match="seed"):
        prepare(PrepareConfig(sources=[jsonl_xz], out_dir=str(out), seed=seed), progress=False)
    assert not (out / "shards").exists()


def test_cli_prepare_and_info(tmp_path, jsonl_xz, capsys):
    from foxformer.cli import main

    out = str(tmp_path / "cli")
    assert main(["data", "prepare", "--source", jsonl_xz, "--out", out, "--no-progress"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["docs"] == 20 and summary["tokenizer"] == "gpt2"
    assert main(["data", "info", out]) == 0
    assert json.loads(capsys.readouterr().out) == summary
    assert main(["data", "info", str(tmp_path / "missing")]) == 2
    # a cut-short token file: info printed the summary of a sound dataset, which training then refused
    with open(os.path.join(out, "val.bin"), "r+b") as f:
        f.truncate(10)
    capsys.readouterr()
    assert main(["data", "info", out]) == 2
    assert f"error: {os.path.join(out, 'val.bin')} has 10 bytes, the manifest expects" in capsys.readouterr().err


@pytest.mark.parametrize("existing", [False, True], ids=["new-dir", "forced-over-a-dataset"])
def test_a_bad_tokenizer_leaves_the_output_dir_as_it_was(tmp_path, jsonl_xz, jsonl_gz, existing):
    # the output folder was created (and with --force the old manifest removed) before the tokenizer spec
    # was checked: a typo left an empty folder behind, or a dataset without its manifest
    out = tmp_path / "out"
    if existing:
        prepare(_cfg(tmp_path, [jsonl_xz]), progress=False)
    before = sorted(os.listdir(out)) if existing else None
    with pytest.raises(ValueError, match="tokenizer"):
        prepare(_cfg(tmp_path, [jsonl_gz], tokenizer="no-such-tokenizer"), force=True, progress=False)
    assert (sorted(os.listdir(out)) if out.exists() else None) == before


def test_temporaries_of_dead_runs_are_cleaned_up(tmp_path, jsonl_xz):
    # shards/<key>.tmp-PID folders of killed runs stayed forever (each a partial copy of a tokenized source)
    import subprocess
    import sys

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    shards = tmp_path / "out" / "shards"
    for name in (f"0123456789abcdef.tmp-{dead.pid}", f"fedcba9876543210.tmp-{os.getppid()}"):
        (shards / name).mkdir(parents=True)
        (shards / name / "tokens.bin").write_bytes(b"partial")
    # and those of the splits (a split's size each): a run killed while it wrote them left them for good
    out = tmp_path / "out"
    for name in (f"train.bin.tmp-{dead.pid}", f"val.idx.npy.tmp-{dead.pid}.npy", f"manifest.json.tmp-{dead.pid}",
                 f"val.bin.tmp-{os.getppid()}", f"notes.txt.tmp-{dead.pid}"):
        (out / name).write_bytes(b"partial")
    prepare(_cfg(tmp_path, [jsonl_xz]), progress=False)
    left = sorted(n for n in os.listdir(shards) if ".tmp-" in n)
    assert left == [f"fedcba9876543210.tmp-{os.getppid()}"]  # a live PID may be a prepare running right now
    # the user's own files are not a prepare's to remove
    assert sorted(n for n in os.listdir(out) if ".tmp-" in n) == [f"notes.txt.tmp-{dead.pid}",
                                                                   f"val.bin.tmp-{os.getppid()}"]


def test_gpt2_json_documents_start_with_their_bos(tmp_path, jsonl_xz, docs):
    """LongCrawl64's layout: each document is BOS + the tokens of its JSON-escaped text; the BOS (GPT-2's end of
    text) of the next document ends it, so no two separators meet."""
    m = prepare(_cfg(tmp_path, [jsonl_xz], val_fraction=0.25, tokenizer="gpt2-json"), progress=False)
    tok = load_tokenizer("gpt2-json")
    assert m["tokenizer"] == "gpt2-json"
    got = {tuple(d) for split in ("train", "val") for d in _split_docs(str(tmp_path / "out"), split, m)}
    assert got == {tuple([50256] + tok.encode(d["text"])) for d in docs}


def test_leave_out_drops_a_source_from_training_and_keeps_the_full_mix_validation(tmp_path, jsonl_xz, jsonl_gz):
    from foxformer.data import TokenDataset
    from foxformer.eval.sequences import dataset_sequences

    full = prepare(PrepareConfig(sources=[jsonl_xz, jsonl_gz], out_dir=str(tmp_path / "full"), val_fraction=0.3,
                                 tokenizer="bytes"), progress=False)
    lodo = prepare(PrepareConfig(sources=[jsonl_xz, jsonl_gz], out_dir=str(tmp_path / "lodo"), val_fraction=0.3,
                                 tokenizer="bytes", leave_out=[jsonl_gz]), progress=False)
    read = lambda d, f: (tmp_path / d / f).read_bytes()  # noqa: E731
    assert read("full", "val.bin") == read("lodo", "val.bin") and read("full", "val.src.npy") == read("lodo", "val.src.npy")
    full_train, lodo_train = (np.load(tmp_path / d / "train.src.npy") for d in ("full", "lodo"))
    assert (full_train == 1).any() and not (lodo_train == 1).any()
    assert lodo["split"]["train"]["docs"] == (full_train == 0).sum() and lodo["request"]["leave_out"] == [jsonl_gz]
    # evaluation on the left-out source's held-out documents only, by a part of its spec
    val = TokenDataset(str(tmp_path / "lodo"), "val", 8)
    rows = dataset_sequences(str(tmp_path / "lodo"), 8, 10, within_docs=True, source="corpus.jsonl.gz")
    starts = {int(o) for o, s in zip(val.doc_offsets[:-1], val.doc_sources) if s == 1}
    assert 0 < len(rows) == len(starts)
    with pytest.raises(ValueError, match="more than one source"):
        dataset_sequences(str(tmp_path / "lodo"), 8, 10, within_docs=True, source="corpus")
    with pytest.raises(ValueError, match="leave_out"):
        PrepareConfig(sources=[jsonl_xz], leave_out=["other"]).validate()


def test_a_refused_request_says_what_changed(tmp_path):
    """A folder source that gained a file was refused as "a different request (tokenizer 'bytes', sources
    ['mydata'])", exactly what the user had typed."""
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.txt").write_text("first document " * 40)
    (docs / "b.txt").write_text("second document " * 40)
    prepare(_cfg(tmp_path, [str(docs)]), progress=False)
    (docs / "c.txt").write_text("a third document " * 40)
    with pytest.raises(ValueError, match=f"the files of {str(docs)!r} changed since"):
        prepare(_cfg(tmp_path, [str(docs)]), progress=False)
    with pytest.raises(ValueError, match=r"val_fraction 0\.05 then, 0\.25 now"):
        prepare(_cfg(tmp_path, [str(docs)], val_fraction=0.25), force=False, progress=False)



def _same_size_edit_within_the_second(path, before: str, after: str, prepare_it):
    """``prepare_it()`` on ``path`` holding ``before``, then ``after`` (the same size) written later in the same
    second of mtime."""
    second = 1_700_000_000 * 10**9
    path.write_text(before)
    os.utime(path, ns=(second + 100_000_000,) * 2)
    first = prepare_it()
    path.write_text(after)
    os.utime(path, ns=(second + 900_000_000,) * 2)
    return first


def test_an_edit_of_the_same_size_within_the_second_is_seen(tmp_path):
    """Fingerprints held whole-second mtimes: an edit that kept the size within the second was the same request
    (the dataset came back as it was), and --force reused the shard of the text before it."""
    src = tmp_path / "a.txt"
    cfg = _cfg(tmp_path, [str(src)], tokenizer="bytes", val_fraction=0)
    _same_size_edit_within_the_second(src, "first words " * 50, "other words " * 50,
                                      lambda: prepare(cfg, progress=False))
    with pytest.raises(ValueError, match=f"the files of {re.escape(repr(str(src)))} changed since"):
        prepare(cfg, progress=False)
    m = prepare(cfg, force=True, progress=False)
    assert [bytes(d[:-1]).decode() for d in _split_docs(cfg.out_dir, "train", m)] == ["other words " * 50]


def test_a_dataset_recorded_with_whole_second_fingerprints_is_rebuilt_by_the_same_command(tmp_path):
    """A dataset prepared before nanosecond mtimes holds the whole-second fingerprint in its request: the same
    command rebuilds it (its tokens may be those of an earlier edit) rather than refusing it as another request."""
    from foxformer.data.sources import describe_source

    src = tmp_path / "a.txt"
    cfg = _cfg(tmp_path, [str(src)], tokenizer="bytes", val_fraction=0)

    def prepare_as_before():
        m = prepare(cfg, progress=False)
        m["request"]["sources"][0]["fingerprint"] = describe_source(str(src)).older_fingerprints[1]
        write_json(os.path.join(cfg.out_dir, "manifest.json"), m)

    _same_size_edit_within_the_second(src, "first words " * 50, "other words " * 50, prepare_as_before)
    m = prepare(cfg, progress=False)
    assert m["request"]["sources"][0]["fingerprint"] == describe_source(str(src)).fingerprint
    assert [bytes(d[:-1]).decode() for d in _split_docs(cfg.out_dir, "train", m)] == ["other words " * 50]
    assert prepare(cfg, progress=False) == m  # and then reused as any dataset is


def _hf_tokenizer_with_ids_past_65535(folder) -> None:
    """A word-level Hugging Face tokenizer whose word "big" has the id 70000 (its len() is 4) and whose eos
    token is "</s>"."""
    pytest.importorskip("tokenizers")
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.WordLevel(vocab={"[UNK]": 0, "a": 1, "big": 70000}, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.add_special_tokens([AddedToken("</s>", special=True)])
    PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="</s>", unk_token="[UNK]").save_pretrained(folder)


def test_hf_tokenizer_ids_past_its_len_and_special_token_text_in_documents(tmp_path):
    """The token dtype came from len(tokenizer): an id past it (70000 with 4 entries) ended in numpy's
    OverflowError (older numpy wrapped it around in silence); and a document quoting "</s>" held the
    end-of-document id in its middle."""
    _hf_tokenizer_with_ids_past_65535(tmp_path / "tok")
    src = tmp_path / "docs.jsonl"
    src.write_text("".join(json.dumps({"text": f"a big {'a ' * i}</s> a"}) + "\n" for i in range(6)))
    m = prepare(_cfg(tmp_path, [str(src)], tokenizer=f"hf:{tmp_path / 'tok'}", val_fraction=0.3), progress=False)
    assert (m["vocab_size"], m["dtype"], m["eot_id"]) == (70001, "uint32", 3)
    docs = _split_docs(str(tmp_path / "out"), "train", m) + _split_docs(str(tmp_path / "out"), "val", m)
    assert len(docs) == 6
    for doc in docs:
        assert doc[:2] == [1, 70000] and doc[-2:] == [1, 3] and 3 not in doc[:-1]


def test_ids_outside_the_vocabulary_are_refused(tmp_path, jsonl_gz, monkeypatch):
    from foxformer.data.tokenizer import Tokenizer

    liar = Tokenizer(name="liar", vocab_size=300, eot_id=299, _encode_batch=lambda texts: [[5, 70000] for _ in texts],
                     _decode=lambda ids: "")
    monkeypatch.setattr(prep_mod, "load_tokenizer", lambda spec: liar)
    with pytest.raises(ValueError, match=r"tokenizer: liar gave the id 70000 for the document 'doc0' of .*, outside "
                                         r"its vocabulary of 300 ids; the token arrays \(uint16\) cannot hold it"):
        prepare(_cfg(tmp_path, [jsonl_gz]), progress=False)


@pytest.mark.parametrize("spec", ["gpt2", "gpt2-json", "bytes"])
def test_long_documents_are_tokenized_in_parts_with_the_same_ids(tmp_path, monkeypatch, spec):
    """A document was encoded whole: a 190 MB text file took 2.3 GB with gpt2 (its ids as Python ints), and its
    tokens were copied whole again when the split was written."""
    import dataclasses

    from pydoc_data.topics import topics

    src = tmp_path / "books"
    src.mkdir()
    keys = sorted(topics)
    for i in range(4):
        (src / f"book{i}.txt").write_text("".join(topics[k] for k in keys[10 * i:10 * i + 10]))
    (src / "note.txt").write_text("a short one")
    whole = prepare(PrepareConfig(sources=[str(src)], out_dir=str(tmp_path / "whole"), tokenizer=spec,
                                  val_fraction=0.2), progress=False)
    tok = load_tokenizer(spec)
    seen = []
    spy = dataclasses.replace(tok, _encode_batch=lambda texts: seen.extend(map(len, texts)) or tok.encode_batch(texts))
    monkeypatch.setattr(prep_mod, "load_tokenizer", lambda name: spy)
    monkeypatch.setattr(prep_mod, "PIECE_CHARS", 1000)
    parts = prepare(PrepareConfig(sources=[str(src)], out_dir=str(tmp_path / "parts"), tokenizer=spec,
                                  val_fraction=0.2), progress=False)
    longest = max(os.path.getsize(f) for f in src.iterdir())
    assert longest > 20_000 and max(seen) < 5000  # a part ends at the first place to cut after 1000 characters
    assert parts["split"] == whole["split"]
    for name in ("train.bin", "val.bin", "train.idx.npy", "val.idx.npy"):
        assert (tmp_path / "parts" / name).read_bytes() == (tmp_path / "whole" / name).read_bytes()


def test_prepare_says_what_it_left_out(tmp_path, capsys):
    """A folder's .py files beside its README.md were left out in silence (a dataset of the READMEs), and so were
    empty documents; a document of only whitespace was tokenized as one."""
    from foxformer.cli import main

    src = tmp_path / "project"
    (src / "pkg").mkdir(parents=True)
    (src / "README.md").write_text("the project's readme " * 10)
    (src / "NOTES.txt").write_text("notes on the project " * 10)
    (src / "blank.txt").write_text("  \n\t\n")
    (src / "empty.md").write_text("")
    for name in ("a.py", "pkg/b.py", "pkg/c.py", "LICENSE"):
        (src / name).write_text("x = 1\n")
    assert main(["data", "prepare", "--source", str(src), "--out", str(tmp_path / "out"), "--tokenizer", "bytes",
                 "--no-progress"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["docs"] == 2
    assert f"note: {src}: 2 empty document(s) (or only whitespace) left out, the first at {src / 'blank.txt'}\n" \
        in captured.err
    assert f"note: {src}: 4 file(s) of kinds not read as documents left out (3 .py, 1 (no extension)); read are " \
           f".txt/.md" in captured.err
    m = read_manifest(str(tmp_path / "out"))
    assert m["sources"][0]["empty_docs"] == 2 and m["sources"][0]["left_out_files"] == {".py": 3, "(no extension)": 1}
    (src / "README.md").write_text(" ")
    (src / "NOTES.txt").write_text("\n")
    with pytest.raises(ValueError, match=r"yielded no non-empty documents \(4 empty or only whitespace\)"):
        prepare(_cfg(tmp_path, [str(src)], tokenizer="bytes"), force=True, progress=False)


def test_a_capped_source_counts_the_empty_documents_it_read(tmp_path):
    """--max-tokens-per-source stops reading a source once it has enough: its empty documents after that point
    were never read, and the note said its count of those before it as if of the whole source."""
    from foxformer.data.sources import reading_notes

    src = tmp_path / "project"
    src.mkdir()
    (src / "a_blank.txt").write_text(" \n")
    for i in range(40):
        (src / f"doc{i:02}.txt").write_text(f"document {i} " * 20)
    (src / "z_empty.txt").write_text("")
    m = prepare(_cfg(tmp_path, [str(src)], tokenizer="bytes", max_tokens_per_source=100, val_fraction=0.0),
                progress=False)
    # documents are tokenized 32 at a time: the cap, reached in the first batch, stops the reading after it
    assert m["sources"][0]["docs"] == 1
    assert reading_notes(m["sources"][0]) == [
        f"{src}: 1 empty document(s) (or only whitespace) left out among the first 33 documents read (reading "
        f"stopped there, with enough text), the first at {src / 'a_blank.txt'}"]
    whole = prepare(_cfg(tmp_path, [str(src)], tokenizer="bytes", val_fraction=0.0), force=True, progress=False)
    assert reading_notes(whole["sources"][0]) == [f"{src}: 2 empty document(s) (or only whitespace) left out, the "
                                                  f"first at {src / 'a_blank.txt'}"]


def test_the_left_out_note_names_the_text_field_given(tmp_path, capsys):
    """With --text-field body the note said the .jsonl files were read from "field 'text'"."""
    from foxformer.cli import main

    src = tmp_path / "mine"
    src.mkdir()
    (src / "rows.jsonl").write_text("".join(json.dumps({"body": f"row {i} " * 10}) + "\n" for i in range(3)))
    (src / "figure.png").write_bytes(b"\x89PNG")
    assert main(["data", "prepare", "--source", str(src), "--out", str(tmp_path / "out"), "--tokenizer", "bytes",
                 "--text-field", "body", "--no-progress"]) == 0
    err = capsys.readouterr().err
    assert "(JSON Lines: one document a line, field 'body')" in err and "field 'text'" not in err, err


def test_leave_out_that_empties_the_training_split_is_refused(tmp_path):
    """With the only document of the kept source drawn for validation, prepare wrote a dataset whose training
    split was empty, and training failed on it with 'split train has 0 tokens'."""
    for name, n in (("kept", 1), ("other", 5)):
        (tmp_path / name).mkdir()
        for i in range(n):
            (tmp_path / name / f"{i}.txt").write_text(f"document {i} of {name} " * 5)
    sources = [str(tmp_path / "kept"), str(tmp_path / "other")]
    seed = next(s for s in range(100) if 0 in prep_mod._split_documents(6, 0.05, s)[1])
    with pytest.raises(ValueError, match=re.escape(f"leave_out: the training split would be empty: the 1 document(s) "
                                                   f"of {sources[:1]} all fell in the validation split "
                                                   f"(a fraction of 0.05, seed {seed})")):
        prepare(_cfg(tmp_path, sources, leave_out=sources[1:], seed=seed, tokenizer="bytes"), progress=False)
    assert read_manifest(str(tmp_path / "out")) is None


@pytest.mark.parametrize("n_docs, noted", [(2, "1 of 2 documents (50%)"), (9, "1 of 9 documents (11%)"),
                                           (20, None)])
def test_a_validation_share_far_above_the_request_is_noted(tmp_path, capsys, n_docs, noted):
    """Two documents with --val-fraction 0.05 held one out (half the data) without a word."""
    from foxformer.cli import main

    src = tmp_path / "docs"
    src.mkdir()
    for i in range(n_docs):
        (src / f"{i}.txt").write_text(f"document {i} " * 10)
    assert main(["data", "prepare", "--source", str(src), "--out", str(tmp_path / "d"), "--tokenizer", "bytes",
                 "--no-progress"]) == 0
    err = capsys.readouterr().err
    if noted is None:
        assert "held out" not in err
    else:
        assert f"note: {noted} held out for validation, more than the 5% asked" in err


def test_prepare_help_names_what_it_reads_and_every_option():
    """The help named .txt/.jsonl/.parquet only (.md, .rst, .text, .json and .ndjson are read as well), said
    nothing of --seed (the validation draw) or --no-progress, and not that a tokenizer folder works."""
    import argparse

    from foxformer.cli import build_parser
    from foxformer.data import sources

    parser = build_parser()
    prepare_parser = parser.parse_args(["data", "prepare"])._parser
    text = " ".join(prepare_parser.format_help().split())
    named = set(re.findall(r"\.[a-z]+", prepare_parser.description)) - {".gz", ".xz"}
    assert named == set(sources.TEXT_SUFFIXES + sources.JSONL_SUFFIXES + sources.PARQUET_SUFFIXES)
    assert "--seed SEED seed of the document shuffle that draws the validation split" in text
    assert "| a tokenizer folder" in text
    for action in prepare_parser._actions:
        if not isinstance(action, argparse._HelpAction):
            assert action.help and not action.help.startswith("default:"), action.option_strings


def test_every_argument_of_the_data_commands_says_what_it_is():
    """`foxformer data info --help` listed its positional as a bare "dir"."""
    import argparse

    from foxformer.cli import build_parser

    parser = build_parser()
    for command in ("prepare", "info", "fetch-corpus"):
        sub = parser.parse_args(["data", command, *(["x"] if command != "prepare" else [])])._parser
        for action in sub._actions:
            assert isinstance(action, argparse._HelpAction) or action.help, (command, action.dest)
    info = " ".join(parser.parse_args(["data", "info", "x"])._parser.format_help().split())
    assert "DIR a prepared dataset's folder (what `data prepare --out` wrote)" in info


def test_many_tiny_documents_are_kept_in_arrays_not_python_objects(tmp_path, monkeypatch):
    """Each document's id and offset were Python objects while a source was tokenized, and the split held a table
    of tuples and a list of offsets: ~180 bytes a document at the peak, gigabytes at ~10M tiny documents."""
    import tracemalloc

    n = 20_000
    corpus = tmp_path / "tiny.jsonl"
    corpus.write_text("".join(json.dumps({"id": f"n{i}", "text": f"d{i}"}) + "\n" for i in range(n)))
    other = tmp_path / "other.jsonl"
    other.write_text("".join(json.dumps({"text": f"o{i}"}) + "\n" for i in range(50)))
    monkeypatch.setattr(prep_mod, "WRITE_CHUNK_DOCS", 3000)  # the split files written over several chunks
    load_tokenizer("bytes")  # its own allocations are no document's
    tracemalloc.start()
    try:
        m = prepare(_cfg(tmp_path, [str(corpus), str(other)], tokenizer="bytes", val_fraction=0.1), progress=False)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak / n < 140  # ~90 now (a third fixed costs), ~215 before
    out = str(tmp_path / "out")
    texts = {f"d{i}" for i in range(n)} | {f"o{i}" for i in range(50)}
    seen = []
    for split in ("train", "val"):
        docs = _split_docs(out, split, m)
        sources = np.load(os.path.join(out, f"{split}.src.npy"))
        seen += [bytes(d[:-1]).decode() for d in docs]
        assert all(d[-1] == 256 for d in docs)
        assert [("o" if s else "d") for s in sources] == [bytes(d[:1]).decode() for d in docs]
    assert sorted(seen) == sorted(texts) and m["split"]["val"]["docs"] == round(0.1 * (n + 50))
    shard = os.path.join(out, m["sources"][0]["shard"])
    with open(os.path.join(shard, "ids.json")) as f:
        assert json.load(f) == [f"n{i}" for i in range(n)]


def test_a_prepare_into_a_folder_another_one_is_writing_is_refused(tmp_path, jsonl_xz, jsonl_gz, monkeypatch):
    """Two prepares at once into one folder both said they were done, and left one's train.bin under the other's
    index and manifest."""
    from foxformer.paths import folder_lock

    cfg = _cfg(tmp_path, [jsonl_xz])
    with folder_lock(cfg.out_dir, "out_dir"):  # as a prepare in another process holds it
        with pytest.raises(ValueError, match="another process is writing into"):
            prepare(cfg, progress=False)
    assert read_manifest(cfg.out_dir) is None and not (tmp_path / "out" / "shards").exists()
    # one that finished while this one loaded its tokenizer: seen under the lock, not written over
    real = prep_mod.load_tokenizer

    def another_prepare_finishes_first(spec):
        monkeypatch.setattr(prep_mod, "load_tokenizer", real)
        prepare(_cfg(tmp_path, [jsonl_gz]), progress=False)
        return real(spec)

    monkeypatch.setattr(prep_mod, "load_tokenizer", another_prepare_finishes_first)
    with pytest.raises(ValueError, match="different request"):
        prepare(cfg, progress=False)
    assert [s["spec"] for s in read_manifest(cfg.out_dir)["sources"]] == [jsonl_gz]
    assert prepare(cfg, force=True, progress=False)["docs"] == 20


@pytest.mark.parametrize("drop", ["tokenizer", "split.val"], ids=["no-tokenizer", "no-val-split"])
def test_a_manifest_without_what_the_commands_read_is_one_line(tmp_path, jsonl_gz, capsys, drop):
    """Another tool's manifest.json, or an edited one, ended `data info` and training in a KeyError traceback."""
    from foxformer.cli import main

    m = prepare(_cfg(tmp_path, [jsonl_gz]), progress=False)
    del (m["split"] if drop == "split.val" else m)[drop.split(".")[-1]]
    write_json(tmp_path / "out" / "manifest.json", m)
    lacks = "split.val.file, split.val.tokens, split.val.docs" if drop == "split.val" else "tokenizer"
    assert main(["data", "info", str(tmp_path / "out")]) == 2
    assert f"is not a complete prepared dataset's manifest (it lacks {lacks}); prepare the dataset again " \
           f"(with --force)" in capsys.readouterr().err
    assert prepare(_cfg(tmp_path, [jsonl_gz]), force=True, progress=False)["docs"] == 6


@pytest.mark.parametrize("second", ["docs/b.txt", "docs/more", "link"], ids=["a-file-in-the-folder",
                                                                           "a-folder-in-the-folder", "a-link-to-it"])
def test_sources_that_read_the_same_file_are_refused(tmp_path, monkeypatch, second):
    """A folder and a file in it (or a folder in it, or a link to it) read their documents twice, in silence: one
    copy could land in train and the other in validation."""
    monkeypatch.chdir(tmp_path)
    os.makedirs("docs/more")
    for name in ("a.txt", "b.txt", "more/c.txt"):
        (tmp_path / "docs" / name).write_text(f"the document {name}")
    os.symlink("docs", "link")
    here = re.escape(os.path.realpath(tmp_path))
    with pytest.raises(ValueError, match=f"sources: 'docs' and '{second}' both read {here}/docs/(b|more/c|a).txt; a "
                                         f"file read twice would put copies of its documents in both train and "
                                         f"validation"):
        prepare(PrepareConfig(sources=["docs", second], out_dir="out", tokenizer="bytes"), progress=False)
    assert not os.path.exists("out")


def test_a_source_file_copied_under_another_name_is_refused(tmp_path, monkeypatch):
    """A copy under another name has another fingerprint: its documents were read twice, in silence. Folders that
    share a file (two repositories' licence) are read as they are."""
    monkeypatch.chdir(tmp_path)
    os.makedirs("folder")
    for name in ("notes.jsonl", "notes (1).jsonl", "folder/kept.jsonl"):
        (tmp_path / name).write_text('{"text": "one"}\n{"text": "two"}\n')
    (tmp_path / "folder" / "other.txt").write_text("another document")
    here = os.path.realpath(tmp_path)
    with pytest.raises(ValueError, match=re.escape(f"sources: {here}/notes (1).jsonl (of 'notes (1).jsonl') holds the "
                                                   f"same bytes as {here}/notes.jsonl (of 'notes.jsonl'): its "
                                                   f"documents would be read twice")):
        prepare(PrepareConfig(sources=["notes.jsonl", "notes (1).jsonl"], out_dir="out", tokenizer="bytes"),
                progress=False)
    assert prepare(PrepareConfig(sources=["notes.jsonl", "folder"], out_dir="out", tokenizer="bytes"),
                   progress=False)["docs"] == 5
    (tmp_path / "notes (1).jsonl").write_text('{"text": "three"}\n')
    assert prepare(PrepareConfig(sources=["notes.jsonl", "notes (1).jsonl"], out_dir="out2", tokenizer="bytes"),
                   progress=False)["docs"] == 3


def test_a_forced_request_whose_source_fails_leaves_the_dataset_there(tmp_path, jsonl_xz):
    """--force removed the manifest first: a new source with a bad line deleted the dataset it was to replace."""
    from foxformer.data.dataset import TokenDataset

    cfg = _cfg(tmp_path, [jsonl_xz])
    first = prepare(cfg, progress=False)
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"text": "fine"}) + "\n{not json\n")
    with pytest.raises(ValueError, match="bad.jsonl:2 is not valid JSON"):
        prepare(_cfg(tmp_path, [jsonl_xz, str(bad)]), force=True, progress=False)
    assert read_manifest(cfg.out_dir) == first
    # nor the failed source's tokens so far, which stayed in a temporary until the next prepare into the folder
    assert not [n for n in os.listdir(os.path.join(cfg.out_dir, "shards")) if ".tmp-" in n]
    assert len(TokenDataset(cfg.out_dir, "train", 16)) == first["split"]["train"]["tokens"] // 16
    assert prepare(cfg, progress=False) == first  # still the same request's, reused


def _word_dataset(tmp_path):
    """(config, manifest, tokenizer folder, source): two documents "a b a" and "b b" prepared with the word
    tokenizer {"a": 1, "b": 2} in its folder, all of them training documents."""
    src = tmp_path / "docs.jsonl"
    src.write_text("".join(json.dumps({"text": t}) + "\n" for t in ("a b a", "b b")))
    tok = tmp_path / "tok"
    cfg = _cfg(tmp_path, [str(src)], tokenizer=str(tok), val_fraction=0)
    word_tokenizer(tok, {"a": 1, "b": 2})
    return cfg, prepare(cfg, progress=False), tok, src


def test_a_tokenizer_saved_again_in_its_folder_is_a_changed_request(tmp_path):
    """A tokenizer folder's spec stayed the same when another tokenizer was saved there: the same command returned
    the dataset in the old ids, and --force reused its shards, so training read ids the tokenizer no longer had."""
    from foxformer.data.sources import describe_source

    cfg, m, tok, src = _word_dataset(tmp_path)
    assert _split_docs(cfg.out_dir, "train", m) == [[1, 2, 1, 3], [2, 2, 3]]
    word_tokenizer(tok, {"b": 1, "a": 2})  # loaded again, not the process's cached first load
    with pytest.raises(ValueError, match=f"the files of the tokenizer {re.escape(repr(str(tok)))} changed since"):
        prepare(cfg, progress=False)
    m = prepare(cfg, force=True, progress=False)
    assert _split_docs(cfg.out_dir, "train", m) == [[2, 1, 2, 3], [1, 1, 3]]
    # a dataset prepared before the tokenizer folder was fingerprinted: rebuilt by the same command, then reused
    del m["request"]["tokenizer_files"]
    # and before the sources' line-break rule was recorded
    m["request"]["sources"][0] = {"spec": str(src), "fingerprint": describe_source(str(src)).older_fingerprints[1]}
    write_json(os.path.join(cfg.out_dir, "manifest.json"), m)
    notes = []
    rebuilt = prepare(cfg, progress=False, note=notes.append)
    assert "tokenizer_files" in rebuilt["request"] and prepare(cfg, progress=False, note=notes.append) == rebuilt
    # why the same command ran again, once (the reuse after it says nothing)
    assert notes == [f"{cfg.out_dir!r} holds a dataset prepared by an older foxformer (its sources recorded by their "
                     f"files' paths and times; before line breaks in JSONL, Parquet and hf: texts were read as \\n; "
                     f"no record of its tokenizer folder's files): rebuilding it"]


def test_a_rebuild_removes_the_shards_its_manifest_no_longer_names(tmp_path, jsonl_xz, jsonl_gz):
    """Each rebuild (a source edited or dropped, another tokenizer) left the shards of what it no longer read in
    shards/, a copy of their tokens each, for good. They go once the new manifest is written, not before."""
    shards = tmp_path / "out" / "shards"
    both = prepare(_cfg(tmp_path, [jsonl_xz, jsonl_gz]), progress=False)
    keys = [os.path.basename(s["shard"]) for s in both["sources"]]
    (shards / "notes.txt").write_text("not a shard: left alone")
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{not json\n")
    with pytest.raises(ValueError, match="bad.jsonl:1 is not valid JSON"):
        prepare(_cfg(tmp_path, [jsonl_xz, str(bad)]), force=True, progress=False)
    assert set(keys) <= set(os.listdir(shards))  # the old dataset is still there, and a rerun reuses them
    one = prepare(_cfg(tmp_path, [jsonl_xz]), force=True, progress=False)
    assert one["sources"][0]["shard"] == both["sources"][0]["shard"]  # reused, and kept
    assert sorted(os.listdir(shards)) == sorted([keys[0], "notes.txt"])
    assert prepare(_cfg(tmp_path, [jsonl_xz]), progress=False) == one  # complete without them: reused


def test_a_dataset_that_recorded_its_tokenizer_folder_by_file_times_is_rebuilt_while_they_hold(tmp_path):
    """The same command on a dataset of the file-times fingerprint: while the folder is untouched it is rebuilt
    (no --force) and records the content; once it was saved again, it is a changed request, as it cannot be told."""
    cfg, m, tok, src = _word_dataset(tmp_path)
    assert m["request"]["tokenizer_files"] == tokenizer_files(str(tok)) and prepare(cfg, progress=False) == m
    word_tokenizer(tok, {"a": 1, "b": 2})  # the same content saved again: reused
    assert prepare(cfg, progress=False) == m
    older = {**m, "request": {**m["request"], "tokenizer_files": older_tokenizer_files(str(tok))}}
    write_json(os.path.join(cfg.out_dir, "manifest.json"), older)
    notes = []
    rebuilt = prepare(cfg, progress=False, note=notes.append)
    assert notes == [f"{cfg.out_dir!r} holds a dataset prepared by an older foxformer (its tokenizer folder recorded "
                     f"by its files' paths and times): rebuilding it"]
    assert rebuilt["request"] == m["request"] and rebuilt["created_unix"] > m["created_unix"]
    assert _split_docs(cfg.out_dir, "train", rebuilt) == [[1, 2, 1, 3], [2, 2, 3]]
    write_json(os.path.join(cfg.out_dir, "manifest.json"), older)
    word_tokenizer(tok, {"a": 1, "b": 2})
    with pytest.raises(ValueError, match=f"the files of the tokenizer {re.escape(repr(str(tok)))} changed since"):
        prepare(cfg, progress=False)
    assert prepare(cfg, force=True, progress=False)["request"] == m["request"]


@pytest.mark.parametrize("flag,value,said", [
    ("--val-fraction", "1.5", "--val-fraction: expected a number in [0, 1), got 1.5"),
    ("--max-tokens-per-source", "0",
     "--max-tokens-per-source: expected a positive integer (or leave the flag out), got 0"),
], ids=["val-fraction", "max-tokens-per-source"])
def test_prepare_names_the_flag_of_a_bad_setting(tmp_path, capsys, flag, value, said):
    """PrepareConfig's errors named its field (`val_fraction: ...`, `... or None`): the command names the flag."""
    from foxformer.cli import main

    out = tmp_path / "d"
    assert main(["data", "prepare", "--source", "builtin:pydoc", "--out", str(out), flag, value, "--no-progress"]) == 2
    assert capsys.readouterr().err.splitlines()[-1] == f"error: {said}"
    assert not out.exists()
