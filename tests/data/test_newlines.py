"""A .txt file's Windows line breaks were read as "\n", and the same text in a JSONL row or a Parquet cell kept its
"\r\n": one document gave other tokens by the format of the file it came in."""
import gzip
import json

import pytest

from foxformer.data.preparation import PrepareConfig, prepare
from foxformer.data.sources import iter_documents

WINDOWS = "line one\r\nline two\r\n\r\nold Mac\rend"
UNIX = "line one\nline two\n\nold Mac\nend"


def _write(path, kind: str, text: str) -> None:
    if kind == "parquet":
        pa = pytest.importorskip("pyarrow")
        import pyarrow.parquet as pq

        pq.write_table(pa.table({"text": [text]}), path)
    elif kind == "jsonl.gz":
        path.write_bytes(gzip.compress((json.dumps({"text": text}) + "\n").encode()))
    elif kind == "jsonl":
        path.write_text(json.dumps({"text": text}) + "\n")
    else:
        path.write_bytes(text.encode())


@pytest.mark.parametrize("kind", ["txt", "jsonl", "jsonl.gz", "parquet"])
def test_every_kind_of_file_reads_line_breaks_as_newlines(tmp_path, kind):
    path = tmp_path / f"doc.{kind}"
    _write(path, kind, WINDOWS)
    assert [d.text for d in iter_documents(str(path))] == [UNIX]


def test_one_text_gives_the_same_tokens_from_a_text_file_and_from_a_jsonl_row(tmp_path):
    made = {}
    for kind in ("txt", "jsonl"):
        folder = tmp_path / kind
        folder.mkdir()
        for i in range(2):  # two documents: the split keeps one for training
            _write(folder / f"doc{i}.{kind}", kind, f"document {i}\r\n" + WINDOWS)
        out = tmp_path / f"out-{kind}"
        prepare(PrepareConfig(sources=[str(folder)], out_dir=str(out), tokenizer="bytes", val_fraction=0.5),
                progress=False)
        made[kind] = [(out / f"{split}.bin").read_bytes() for split in ("train", "val")]
    assert made["txt"] == made["jsonl"]
    assert b"\r" not in b"".join(made["txt"])


def _before_the_rule(monkeypatch) -> None:
    """Reading and recording as foxformer did before every source's line breaks were made "\\n"."""
    from foxformer.data import sources

    monkeypatch.setattr(sources, "unix_newlines", lambda text: text)
    monkeypatch.setattr(sources, "NEWLINES", None)


def _two_documents(folder, kind: str) -> PrepareConfig:
    folder.mkdir()
    for i in range(2):
        _write(folder / f"doc{i}.{kind}", kind, f"document {i}\r\n" + WINDOWS)
    return PrepareConfig(sources=[str(folder)], out_dir=str(folder.parent / "out"), tokenizer="bytes",
                         val_fraction=0.5)


def test_a_jsonl_dataset_prepared_before_the_rule_is_rebuilt_by_the_same_command(tmp_path, monkeypatch):
    """Its request read the same as today's, so its "\\r" tokens were reused: the request records the rule for the
    sources whose texts it changed, and a dataset without it is rebuilt, its shard too, without --force."""
    cfg = _two_documents(tmp_path / "docs", "jsonl")
    with monkeypatch.context() as before:
        _before_the_rule(before)
        old = prepare(cfg, progress=False)
    assert "newlines" not in old["request"]["sources"][0]
    assert b"\r" in (tmp_path / "out" / "train.bin").read_bytes() + (tmp_path / "out" / "val.bin").read_bytes()
    new = prepare(cfg, progress=False)
    assert new["request"]["sources"][0]["newlines"] == "unix"
    assert new["sources"][0]["shard"] != old["sources"][0]["shard"]
    assert b"\r" not in (tmp_path / "out" / "train.bin").read_bytes() + (tmp_path / "out" / "val.bin").read_bytes()
    assert prepare(cfg, progress=False) == new  # then reused as any dataset is


def test_a_text_file_source_records_no_rule_so_its_older_dataset_is_kept(tmp_path):
    """A .txt file's line breaks were "\\n" all along: a dataset prepared before the rule holds the tokens of today,
    and its request, which records no rule, is today's."""
    cfg = _two_documents(tmp_path / "docs", "txt")
    made = prepare(cfg, progress=False)
    assert made["request"]["sources"] == [{"spec": cfg.sources[0], "fingerprint": made["sources"][0]["fingerprint"]}]


def test_the_command_says_why_it_rebuilds_a_dataset_of_before_the_rule(tmp_path, monkeypatch, capsys):
    """The same `foxformer data prepare` rebuilt such a dataset without a word of why it tokenized everything again."""
    from foxformer.cli import main

    cfg = _two_documents(tmp_path / "docs", "jsonl")
    with monkeypatch.context() as before:
        _before_the_rule(before)
        prepare(cfg, progress=False)
    command = ["data", "prepare", "--source", cfg.sources[0], "--out", cfg.out_dir, "--tokenizer", "bytes",
               "--val-fraction", "0.5", "--no-progress"]
    assert main(command) == 0
    said = [line for line in capsys.readouterr().err.splitlines() if line.startswith("note:")]
    assert said == [f"note: {cfg.out_dir!r} holds a dataset prepared by an older foxformer (before line breaks in "
                    f"JSONL, Parquet and hf: texts were read as \\n): rebuilding it"]
    assert main(command) == 0  # reused: nothing to say
    assert "note:" not in capsys.readouterr().err
