import json
import lzma
import gzip

import pytest


def _docs(n: int) -> list[dict]:
    # Distinct, multi-sentence documents so that every document tokenizes to a different array.
    return [{"id": f"doc{i}", "source": "synthetic",
             "text": f"Document {i} begins. " + " ".join(f"word{i}_{j}" for j in range(20 + 3 * i)) + " The end."}
            for i in range(n)]


def _write_jsonl(path, opener, n: int) -> str:
    with opener(path, "wt", encoding="utf-8") as f:
        for d in _docs(n):
            f.write(json.dumps(d) + "\n")
    return str(path)


@pytest.fixture
def jsonl_xz(tmp_path):
    return _write_jsonl(tmp_path / "corpus.jsonl.xz", lzma.open, 20)


@pytest.fixture
def jsonl_gz(tmp_path):
    return _write_jsonl(tmp_path / "corpus.jsonl.gz", gzip.open, 6)


@pytest.fixture
def docs():
    return _docs(20)
