"""`data prepare` read every byte of its sources for their fingerprint, also when the dataset was up to date: the
digests of unchanged files (same real path, size and mtime) now come from a cache in the dataset's folder."""
import builtins
import json
import os

import pytest

from foxformer.data.digests import CACHE_FILE
from foxformer.data.preparation import PrepareConfig, prepare


@pytest.fixture
def corpus(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for name in ("a", "b"):
        (src / f"{name}.txt").write_text(f"document {name} " * 50)
    return src, PrepareConfig(sources=[str(src)], out_dir=str(tmp_path / "data"), tokenizer="bytes",
                              val_fraction=0.5)


@pytest.fixture
def opened(monkeypatch, corpus):
    """The names of the corpus files opened from now on, one per open."""
    src, names = str(corpus[0]), []
    real_open = builtins.open

    def counting(file, *args, **kw):
        if isinstance(file, (str, os.PathLike)) and os.path.dirname(os.path.realpath(file)) == os.path.realpath(src):
            names.append(os.path.basename(file))
        return real_open(file, *args, **kw)

    monkeypatch.setattr(builtins, "open", counting)
    return names


def test_a_second_prepare_of_unchanged_sources_reads_none_of_them(corpus, opened):
    src, cfg = corpus
    first = prepare(cfg, progress=False)
    assert sorted(opened) == ["a.txt", "a.txt", "b.txt", "b.txt"]  # fingerprinted, then tokenized
    cache = json.loads(open(os.path.join(cfg.out_dir, CACHE_FILE)).read())
    assert sorted(os.path.basename(p) for p in cache["files"]) == ["a.txt", "b.txt"]
    opened.clear()
    assert prepare(cfg, progress=False) == first
    assert opened == []


def test_a_touched_file_is_read_again_and_the_other_is_not(corpus, opened):
    src, cfg = corpus
    first = prepare(cfg, progress=False)
    opened.clear()
    st = os.stat(src / "a.txt")
    os.utime(src / "a.txt", ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert prepare(cfg, progress=False) == first  # the same content: the same request, nothing rebuilt
    assert opened == ["a.txt"]


def test_an_edit_of_the_same_size_is_seen_whatever_the_cache_holds(corpus):
    src, cfg = corpus
    prepare(cfg, progress=False)
    (src / "b.txt").write_text("document B " * 50)  # same size, new mtime: the cached digest is not trusted
    with pytest.raises(ValueError, match="already holds a dataset prepared from a different request"):
        prepare(cfg, progress=False)


@pytest.mark.parametrize("garbage", ["not json", '{"format": 1, "files": {"x": 3}}', "[]", ""],
                         ids=["not-json", "bad-entry", "not-a-mapping", "empty"])
def test_a_corrupt_cache_is_ignored_and_rebuilt(corpus, opened, garbage):
    src, cfg = corpus
    first = prepare(cfg, progress=False)
    path = os.path.join(cfg.out_dir, CACHE_FILE)
    open(path, "w").write(garbage)
    opened.clear()
    assert prepare(cfg, progress=False) == first
    assert sorted(opened) == ["a.txt", "b.txt"]  # read again, once each
    assert len(json.loads(open(path).read())["files"]) == 2
