"""Document sources: built-in corpora from installed packages, user files, Hugging Face datasets.

Source spec strings (see :func:`parse_source`):
  ``builtin:sympy``          SymPy's source: the ``.py`` files of each package folder joined into one document
                             (SymPy is always installed with torch); long, real code documents.
  ``builtin:pydoc``          Python's own reference text (``pydoc_data.topics``, part of the standard library),
                             one document per topic; English technical prose.
  ``builtin:stdlib``         The Python standard library's ``.py`` files, one document per module file.
  ``<path>``                 ``.txt``/``.md`` (whole file = one document), ``.jsonl`` (one document a line, field
                             ``text``), ``.parquet`` (column ``text``, needs pyarrow), each optionally ``.gz``/``.xz``;
                             a directory means every such file inside it (sorted, recursive).
  ``hf:<name>[:<config>][@<split>]``  a Hugging Face dataset (needs ``datasets`` and a reachable hub), column ``text``.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import io
import json
import lzma
import os
import re
import shlex
import sysconfig
import zlib
from dataclasses import dataclass, replace
from functools import partial
from typing import Iterator

from ..argtypes import SettingError
from ..paths import BINARY_HEAD, NotText, decode_utf8
from ..progress import progress_bar
from . import jsonl
from .digests import read_digests
from .layout import (EVAL_MARK, MANIFEST, eval_output_folder, eval_results_file, eval_results_in, model_folder,
                     prepared_dataset, saved_hf_dataset)
from .unreadable import PREPARE_WITHOUT, UnreadableFile, refusal, skipped_note

TEXT_SUFFIXES = (".txt", ".md", ".rst", ".text")
JSONL_SUFFIXES = (".jsonl", ".json", ".ndjson")
PARQUET_SUFFIXES = (".parquet",)
BUILTINS = ("sympy", "pydoc", "stdlib")


@dataclass(frozen=True)
class Document:
    """One document: ``id`` unique within its source, ``text`` its full text; ``where`` the file and line it was
    read from, where ``id`` does not say it (a JSONL row's own id field), for a note that points at it."""

    id: str
    source: str
    text: str
    where: str = ""


@dataclass
class Blanks:
    """The documents of no text (empty or only whitespace) a reading of a source passed over, for reading_notes;
    ``read``: all the documents it was shown, empty or not."""

    count: int = 0
    first: str | None = None
    read: int = 0

    def skip(self, doc: Document) -> bool:
        """Whether ``doc`` is one, counted."""
        self.read += 1
        if doc.text and not doc.text.isspace():  # isspace: no copy of a long text, unlike strip()
            return False
        self.count += 1
        self.first = self.first or doc.where or doc.id
        return True

    def fields(self, stopped: bool = False) -> dict:
        """As a manifest's source records them. ``stopped``: the reading ended before the source did (it had
        enough), so the count is of the documents read, recorded as ``docs_read``: the note said it of the whole
        source, whose later documents were never looked at."""
        if not self.count:
            return {"empty_docs": 0}
        return {"empty_docs": self.count, "first_empty": self.first, **({"docs_read": self.read} if stopped else {})}


@dataclass(frozen=True)
class SourceInfo:
    """What a source spec resolves to; ``fingerprint`` changes when the underlying data changes."""

    spec: str
    kind: str  # "builtin" | "file" | "hf"
    fingerprint: str
    # a folder's files of kinds not read as documents, by extension: (".py", 120), ... (most first)
    left_out: tuple[tuple[str, int], ...] = ()
    # a folder's prepared datasets, passed over: its walk read their manifests and shards as JSONL documents
    skipped: tuple[str, ...] = ()
    # a folder's eval output folders (layout.eval_output_folder), passed over: their results' JSON was read as JSONL
    outputs: tuple[str, ...] = ()
    # those of them told by their files (layout.eval_results_in), written before eval marked its folders: (folder,
    # its files of results)
    outputs_by_files: tuple[tuple[str, tuple[str, ...]], ...] = ()
    # files: the real paths of the files read, in order, and the sha256 of each one's bytes
    files: tuple[str, ...] = ()
    digests: tuple[bytes, ...] = ()
    # files: the fingerprints that datasets prepared before content ones recorded, by the files' paths, sizes and
    # nanosecond mtimes, and before those whole-second ones (an edit of the same size within the second kept it)
    older_fingerprints: tuple[str, ...] = ()
    # a folder's files that its walk found cannot be read (a link to nothing, no read permission): (path, problem)
    unreadable: tuple[tuple[str, str], ...] = ()
    # NEWLINES where the source's texts are of the kinds whose line breaks that rule changed, else None
    newlines: str | None = None


# The compressions read, by how they end a name, each with the command that writes a file's bytes decompressed (in
# the fixes messages give): `gzip -dc` rather than zcat, which on macOS looks for NAME.Z
COMPRESSIONS = {".gz": "gzip -dc", ".xz": "xz -dc"}


def _strip_compression(path: str) -> tuple[str, str | None]:
    for ext in COMPRESSIONS:
        if path.endswith(ext):
            return path[: -len(ext)], ext
    return path, None


def _open_binary(path: str) -> io.BufferedIOBase:
    """The file's bytes, decompressed (.gz, .xz); text is decoded by the caller, which knows the line of a byte
    that is not UTF-8."""
    _, comp = _strip_compression(path)
    if comp == ".gz":
        return gzip.open(path, "rb")
    if comp == ".xz":
        return lzma.open(path, "rb")
    return open(path, "rb")


def kinds_said(text_field: str = "text") -> str:
    """What a source folder's files may be, as messages say it, with the field a JSON Lines file's text is read
    from (the note of a prepare given --text-field body said "field 'text'")."""
    return (f"{'/'.join(TEXT_SUFFIXES)} (one document a file), {'/'.join(JSONL_SUFFIXES)} (JSON Lines: one document a "
            f"line, field {text_field!r}) or {'/'.join(PARQUET_SUFFIXES)}, each optionally .gz or .xz")


# Compressions not read, by how they end a name: a .jsonl.bz2 was "not a supported file", and a folder's note
# counted it as a ".bz2" beside the .png files, neither saying that its documents were what was left out
OTHER_COMPRESSIONS = (".bz2", ".zst", ".lz4", ".zip", ".7z", ".br")


def _other_compression(path: str) -> str | None:
    """The compression ``path``'s name says (".bz2", ...) where it is one not read around a document file."""
    base, ext = os.path.splitext(path.lower())
    return ext if ext in OTHER_COMPRESSIONS and _file_kind(base) else None


def _file_kind(path: str) -> str | None:
    base, _ = _strip_compression(path.lower())
    if base.endswith(TEXT_SUFFIXES):
        return "text"
    if base.endswith(JSONL_SUFFIXES):
        return "jsonl"
    if base.endswith(PARQUET_SUFFIXES):
        return "parquet"
    return None


def _scan(path: str, out_dir: str | None = None) -> tuple[list[str], dict[str, int], list[str],
                                                         dict[str, list[str]], list[UnreadableFile]]:
    """The document files of ``path``, the number of a folder's other files by extension, the prepared datasets in
    the folder that were passed over (``out_dir``, the one a command writes, among them), its eval output folders
    passed over (each with the files that told it, [] where its mark did), and the document files of the folder
    that cannot be read at all."""
    if os.path.isfile(path):
        if compression := _other_compression(path):
            raise SettingError("source", f"{path!r} is {compression} compressed, which is not read: "
                                         f"decompress it, or compress it again as .gz or .xz")
        if _file_kind(path) is None:
            raise SettingError("source", f"{path!r} is not a supported file; expected {kinds_said()}")
        return [path], {}, [], {}, []
    if os.path.isdir(path):
        return _walk_folder(path, out_dir)
    if os.path.islink(path):
        raise SettingError("source", f"{path!r} is a symbolic link to {os.readlink(path)!r}, which does not exist")
    if os.path.exists(path):  # /dev/null, a FIFO, a socket, a shell's <(...): "does not exist" was untrue
        raise SettingError("source", f"{path!r} is not a regular file or folder (a device, pipe or socket); give a "
                                     f"file or a folder of documents")
    home = os.path.expanduser(path)
    if home != path and os.path.exists(home):  # --source=~/x and a quoted "~/x" reach us as typed
        raise SettingError("source", f"{path!r} does not exist: the shell leaves '~' as typed after '=' and in quotes; "
                                     f"give {home!r}")
    if re.search(r"[*?[]", path):  # the shell passes a pattern that matches nothing on as typed
        raise SettingError("source", f"{path!r} matches no file: check the pattern, or give the folder (every "
                                     f"document file in it is read)")
    raise SettingError("source", f"{path!r} does not exist (expected a file, a directory, 'builtin:<name>' with "
                                 f"name in {BUILTINS}, or {HF_FORM!r})")


def holds_documents(path: str) -> bool:
    """Whether ``path`` is a file or folder that `data prepare --source` would read documents from."""
    try:
        return bool(_scan(path)[0])
    except ValueError:
        return False


def _walk_folder(path: str, out_dir: str | None) -> tuple[list[str], dict[str, int], list[str],
                                                         dict[str, list[str]], list[UnreadableFile]]:
    """The document files under ``path``, sorted, recursive, and those of them that cannot be read (a link to
    nothing, no read permission), each a refusal for the reader to raise or to pass over. Linked folders are the
    user's documents too (they were left out without a word); a folder or file reached twice through links is
    read once (under its own name rather than a link's), since each copy of a document would be split on its own
    (one in train, one in validation), and a link to a folder above is not walked forever. A folder that cannot be
    read is an error, not fewer documents. A prepared dataset inside it is passed over, as is ``out_dir`` before
    its manifest is written: their manifest.json and ids.json were read as JSONL documents; so is an eval output
    folder, whose loss.json was: marked as one, or told by its files where an eval wrote it before the mark
    existed (layout.eval_results_in)."""
    if prepared_dataset(path):
        raise SettingError("source", f"{path!r} is a prepared dataset (it holds the {MANIFEST} or lock that `data "
                                     f"prepare` writes), whose files are tokens, not documents: give the folder of "
                                     f"the documents, and keep the dataset in a folder of its own")
    # its metrics.jsonl was read as documents and refused for a missing 'text' field, which sent users to
    # --text-field (a model folder's config.json, as JSON over several lines)
    if what := model_folder(path):
        raise SettingError("source", f"{path!r} is {what}, not text: give the documents to read (a file, a folder "
                                     f"of them, or a built-in corpus such as builtin:pydoc)")

    _check_not_saved_hf(path)

    def unreadable(e: OSError):
        raise SettingError("source", f"the folder {e.filename!r} in {path!r} cannot be read ({e.strerror})") from None

    walked, chosen, seen_dirs, other, skipped, outputs, unread = [], {}, {os.path.realpath(path)}, {}, [], {}, []
    out = None if out_dir is None else os.path.realpath(out_dir)
    # not yet there, written after this walk and passed over by the next one: said by both
    if passes_over(path, out_dir) and not os.path.exists(out):
        skipped.append(out_dir)
    for root, dirs, files in os.walk(path, onerror=unreadable, followlinks=True):
        # hidden entries (.git, an editor's swap files, macOS's ._ resource forks) are not the user's documents
        kept = []
        for d in sorted(d for d in dirs if not d.startswith(".")):
            real = os.path.realpath(os.path.join(root, d))
            if real in seen_dirs:
                continue
            seen_dirs.add(real)
            if real == out or prepared_dataset(real):
                skipped.append(os.path.join(root, d))
            elif eval_output_folder(real):
                outputs[os.path.join(root, d)] = []
            elif told := eval_results_in(real, lambda name: _file_kind(name) is not None):
                outputs[os.path.join(root, d)] = told
            else:
                _check_not_saved_hf(os.path.join(root, d), within=path)
                kept.append(d)
        dirs[:] = kept
        for f in sorted(files):
            full = os.path.join(root, f)
            if f.startswith("."):
                continue
            if _file_kind(f) is None:
                # by the kind inside a compression too: ".jsonl.bz2", documents in a compression not read, and
                # ".csv.gz", counted as ".gz" on a line that says .gz is read
                inner, comp = os.path.splitext(f.lower())
                if comp not in COMPRESSIONS and not _other_compression(f):
                    inner, comp = f.lower(), ""
                ext = (os.path.splitext(inner)[1] or "(no extension)") + comp
                other[ext] = other.get(ext, 0) + 1
                continue
            if not os.path.exists(full):  # each link to nothing by its own name: each is one to remove
                problem = f"a symbolic link to {os.readlink(full)!r}, which does not exist"
                walked.append((full, None, UnreadableFile(full, problem, f"{full!r} is {problem}: remove the link or "
                                                                         f"restore its file")))
                continue
            real = os.path.realpath(full)
            walked.append((full, real, None))
            if real not in chosen or os.path.islink(chosen[real]) and not os.path.islink(full):
                chosen[real] = full
    if not walked:
        passed = " and ".join(f"the {what} in it ({', '.join(map(repr, folders))})"
                              for what, folders in (("prepared datasets", skipped), ("eval output folders", outputs))
                              if folders)
        passed = f" outside {passed}" if passed else ""
        raise SettingError("source", f"directory {path!r} holds no file of a kind read as documents{passed}: "
                                     f"{kinds_said()} (source code: gather the files into a .jsonl, one "
                                     f"{{\"text\": ...}} a line)")
    # a file without read permission once too, under the name it would be read by: through a link beside it, a
    # refusal listed it twice
    files = []
    for full, real, broken in walked:
        if broken is not None:
            unread.append(broken)
        elif chosen[real] == full and os.access(full, os.R_OK):
            files.append(full)
        elif chosen[real] == full:
            problem = "cannot be read (permission denied)"
            unread.append(UnreadableFile(full, problem, f"{full} {problem}: make it readable (chmod a+r) or "
                                                        f"{_leave_out(path)}"))
    # a.txt beside a.txt.gz (gzip -k keeps the original): the same documents twice, one copy may land in validation
    by_base: dict[str, str] = {}
    for full in files:
        other_form = by_base.setdefault(_strip_compression(full)[0], full)
        if other_form != full:
            raise SettingError("source", f"{other_form!r} and {full!r} are one file with and without compression: its "
                                         f"documents would be read twice (a copy could land in train and another in "
                                         f"validation); move one out of {path!r}")
    return files, other, sorted(skipped), dict(sorted(outputs.items())), unread


def passes_over(spec: str, out_dir: str | None) -> bool:
    """Whether the walk of the source folder ``spec`` passes over ``out_dir``, the folder a command writes (a
    prepare's dataset, an eval's results), as one of its own: one below it and not hidden (".." is outside, and a
    hidden folder is passed over in silence). What is written there was read back as documents by the next run."""
    if out_dir is None or not os.path.isdir(spec):
        return False
    inside = os.path.relpath(os.path.realpath(out_dir), os.path.realpath(spec))
    return inside != os.curdir and not any(part.startswith(".") for part in inside.split(os.sep))


def _check_not_saved_hf(folder: str, spec: str | None = None, within: str | None = None) -> None:
    """ValueError where ``folder`` is a Hugging Face dataset written by `save_to_disk`, with the command that writes
    its rows as Parquet, which is read: its walk read dataset_info.json as JSON Lines and sent the user to jq. ``spec``:
    the hf: source that named it (hf: streams from the hub, which said it cannot be reached); ``within``: the source
    folder it lies in."""
    splits = saved_hf_dataset(folder)
    if splits is None:
        return
    named = f"{spec!r} names {folder!r}, a folder here, where hf: streams from the Hugging Face hub; the folder" \
        if spec else repr(folder)
    base, load = folder.rstrip(os.sep) or folder, f"datasets.load_from_disk({json.dumps(folder, ensure_ascii=False)})"
    each = ""
    if splits or os.path.isfile(os.path.join(folder, "dataset_dict.json")):
        split = splits[0] if splits else "train"
        load, base = f"{load}[{json.dumps(split, ensure_ascii=False)}]", f"{base}-{split}"
        each = f", one split a file (its splits: {', '.join(splits)}; in one source, test rows would be trained on)"
    program = f"import datasets; {load}.to_parquet({json.dumps(base + '.parquet', ensure_ascii=False)})"
    move = f", and move the folder out of {within!r}" if within else ""
    raise SettingError("source", f"{named} is a Hugging Face dataset saved with save_to_disk, whose .arrow files are "
                                 f"not read: write its rows as Parquet (`python -c {shlex.quote(program)}`){each}, and "
                                 f"give that file{move}")


def _package_dir(name: str) -> str:
    import importlib.util

    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise SettingError("source", f"built-in corpus needs the package {name!r}, which is not installed")
    return list(spec.submodule_search_locations)[0]


def _package_version(name: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return "unknown"


def _iter_sympy() -> Iterator[Document]:
    root = _package_dir("sympy")
    parent = os.path.dirname(root)
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        py = sorted(f for f in files if f.endswith(".py"))
        if not py:
            continue
        parts = []
        for f in py:
            rel = os.path.relpath(os.path.join(folder, f), parent)
            with open(os.path.join(folder, f), encoding="utf-8", errors="replace") as fh:
                parts.append(f"# file: {rel}\n{fh.read()}")
        text = "\n".join(parts)
        if text.strip():
            yield Document(id=os.path.relpath(folder, parent).replace(os.sep, "."), source="builtin:sympy", text=text)


def _iter_pydoc() -> Iterator[Document]:
    from pydoc_data.topics import topics

    for key in sorted(topics):
        if topics[key].strip():
            yield Document(id=key, source="builtin:pydoc", text=topics[key])


def _iter_stdlib() -> Iterator[Document]:
    root = sysconfig.get_paths()["stdlib"]
    skip = {"site-packages", "dist-packages", "test", "tests", "idlelib", "__pycache__", "lib2to3"}
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in skip)
        for f in sorted(files):
            if f.endswith(".py"):
                path = os.path.join(folder, f)
                with open(path, encoding="utf-8", errors="replace") as fh:
                    text = fh.read()
                if text.strip():
                    yield Document(id=os.path.relpath(path, root), source="builtin:stdlib", text=text)


# What the decompressors raise for a file cut short or not compressed as its name says
DAMAGED_COMPRESSION = (EOFError, lzma.LZMAError, zlib.error, gzip.BadGzipFile)


def _leave_out(spec: str) -> str:
    """How a fix says to do without one of ``spec``'s files: a folder's is moved out of it ("leave it out" sent the
    user to --leave-out, which takes whole sources and refused the file)."""
    return f"move it out of {spec!r}" if os.path.isdir(spec) else "leave it out"


def _eval_results_said(path: str, spec: str) -> str:
    """The refusal of ``path``, a JSON file of eval results (layout.eval_results_file), as a document file of
    ``spec``: an eval's loss.json written among the documents, before eval marked its folders, was refused as a
    pretty-printed JSON value with jq commands to make documents of it."""
    said = (f"{path} is the results of one of foxformer's eval commands (one JSON value, as they write it), not "
            f"documents")
    if not os.path.isdir(spec):
        return f"{said}: give the documents to read (a file, a folder of them, or a built-in corpus such as " \
               f"builtin:pydoc)"
    return (f"{said}: move it out of {spec!r}, or keep eval's results in a folder of their own (--out): a folder "
            f"inside a source holding nothing but eval's results, or an empty file named {EVAL_MARK}, is passed "
            f"over by every foxformer command")


def _iter_file(path: str, spec: str, text_field: str) -> Iterator[Document]:
    try:
        yield from _read_file(path, spec, text_field)
    except NotText as e:
        raise UnreadableFile(path, e.problem, str(e)) from None
    except DAMAGED_COMPRESSION as e:
        problem = f"not a complete {_strip_compression(path)[1]} file ({e})"
        raise UnreadableFile(path, problem, f"{path} is {problem}: cut short (an interrupted download or copy?) or "
                                            f"not compressed as its name says; fetch it again, or "
                                            f"{_leave_out(spec)}") from None


def _problem(path: str, spec: str, text_field: str) -> str | None:
    """Why the file ``path`` cannot be read as text (an UnreadableFile's problem), None where it can; it is read
    through."""
    try:
        for _ in _iter_file(path, spec, text_field):
            pass
    except UnreadableFile as e:
        return e.problem
    except ValueError:  # another fault (a JSONL row of another shape): reading the file for its documents names it
        return None
    return None


def unreadable_files(spec: str, text_field: str = "text", out_dir: str | None = None,
                     progress: bool = False) -> dict[str, str]:
    """Every file of the source ``spec`` that cannot be read as text, path -> problem, each file read through
    (with a progress bar); {} for a built-in or hf: source. ``out_dir`` as describe_source takes it."""
    if source_kind(spec) != "file":
        return {}
    files, _, _, _, unreadable = _scan(spec, out_dir)
    bad = {e.path: e.problem for e in unreadable}
    for path in progress_bar(files, desc=f"check {spec}", unit="file", wanted=progress, delay=2.0):
        if problem := _problem(path, spec, text_field):
            bad[path] = problem
    return bad


def _head(path: str) -> bytes:
    """The first bytes of ``path``, decompressed, that tell a binary file from text (decode_utf8's ``head``)."""
    with _open_binary(path) as fh:
        return fh.read(BINARY_HEAD)


def _read_file(path: str, spec: str, text_field: str) -> Iterator[Document]:
    kind = _file_kind(path)
    if kind == "text":
        with _open_binary(path) as fh:
            data = fh.read()
        text = decode_utf8(data, path, leave_out=_leave_out(spec))
        del data  # a long document's bytes beside its text: twice the memory while it is tokenized
        yield Document(id=path, source=spec, text=text)
    elif kind == "jsonl":
        try:
            with _open_binary(path) as fh:
                comp = _strip_compression(path)[1]
                for doc_id, where, text in jsonl.rows(fh, path, text_field, comp and COMPRESSIONS[comp],
                                                       _leave_out(spec), in_folder=os.path.isdir(spec),
                                                       head=partial(_head, path)):
                    yield Document(id=doc_id, source=spec, text=text, where=where)
        except UnreadableFile:
            raise
        except SettingError:
            if path.endswith(".json") and eval_results_file(path):
                raise SettingError("source", _eval_results_said(path, spec)) from None
            raise
    elif kind == "parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError as e:
            raise ImportError("source: Parquet files need the package pyarrow (pip install pyarrow)") from e
        base, comp = _strip_compression(path)
        stream = _open_binary(path) if comp else path
        table = pq.ParquetFile(stream)
        if text_field not in table.schema_arrow.names:
            raise SettingError("source", f"{path} has no column {text_field!r} (columns: {table.schema_arrow.names})")
        row_no = 0
        for batch in table.iter_batches(columns=[text_field]):
            for text in batch.column(0).to_pylist():
                yield Document(id=f"{path}:{row_no}", source=spec,
                               text=jsonl.text_value(text, f"{path} row {row_no}", text_field))
                row_no += 1


HF_FORM = "hf:<dataset>[:<config>][@<split>]"


def _parse_hf(spec: str) -> tuple[str, str | None, str]:
    rest = spec[3:]
    rest, _, split = rest.partition("@")
    name, _, config = rest.partition(":")
    if not name.strip():  # else `datasets` was asked for no dataset, over the network, and failed after a wait
        raise SettingError("source", f"{spec!r} names no dataset; expected {HF_FORM}, e.g. 'hf:roneneldan/TinyStories'")
    return name, config or None, split or "train"


def hub_unreachable(timeout: float = 3.0) -> str | None:
    """Why the Hugging Face hub cannot be reached ("host:port cannot be reached from here (error)"), None when it
    can or when that cannot be told. Without a route to it, `datasets` retried for ~15 s and transformers for
    ~65 s before their errors; one TCP connection (HF_ENDPOINT's host) says so at once. Behind a proxy it proves
    nothing: None."""
    import socket
    import urllib.parse

    if any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return None
    url = urllib.parse.urlsplit(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    host, port = url.hostname or "huggingface.co", url.port or (80 if url.scheme == "http" else 443)
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as e:
        return f"{host}:{port} cannot be reached from here ({e})"
    return None


def _iter_hf(spec: str, text_field: str) -> Iterator[Document]:
    try:
        import datasets
    except ImportError as e:
        raise ImportError("source: Hugging Face datasets need the package datasets (pip install datasets)") from e
    name, config, split = _parse_hf(spec)
    unreachable = hub_unreachable()
    if unreachable:  # streaming needs the hub
        raise SettingError("source", f"{spec!r} streams from the Hugging Face hub, and {unreachable}; save the dataset "
                                     f"as .jsonl / .parquet where it can be reached and give that file as the source")
    try:
        ds = datasets.load_dataset(name, config, split=split, streaming=True)
    except Exception as e:
        raise SettingError("source", f"Hugging Face dataset {spec!r} could not be loaded ({e})") from e
    for i, row in enumerate(ds):
        if text_field not in row:
            raise SettingError("source", f"{spec} rows have no field {text_field!r} (fields: {sorted(row)})")
        yield Document(id=str(row.get("id", i)), source=spec,
                       text=jsonl.text_value(row[text_field], f"{spec} row {i}", text_field))


def source_kind(spec: str) -> str:
    """"builtin", "hf" or "file" for a spec of that form; TypeError or ValueError for a bad one."""
    if not isinstance(spec, str) or not spec:
        raise TypeError(f"source: expected a non-empty spec string, got {spec!r}")
    if spec.startswith("builtin:"):
        if spec.split(":", 1)[1] not in BUILTINS:
            raise SettingError("source", f"unknown built-in corpus {spec.split(':', 1)[1]!r}; expected one of "
                                         f"{BUILTINS}")
        return "builtin"
    if spec.startswith("hf:"):
        name = _parse_hf(spec)[0]
        # `datasets` reads a folder of that name before the hub's; hf: here streams from the hub, and said that it
        # cannot be reached
        if os.path.exists(name):
            _check_not_saved_hf(name, spec)
            raise SettingError("source", f"{spec!r} names {name!r}, a {'folder' if os.path.isdir(name) else 'file'} "
                                         f"here, where hf: streams from the Hugging Face hub: give it without 'hf:' "
                                         f"(read are {kinds_said()})")
        return "hf"
    return "file"


def describe_source(spec: str, digests=read_digests, out_dir: str | None = None) -> SourceInfo:
    """Resolve a spec without parsing documents (a file source's files are read for their fingerprint, through
    ``digests``: see content_fingerprint); raises ValueError for a bad spec. ``out_dir``: the folder a prepare
    writes, passed over where it lies inside a source folder."""
    kind = source_kind(spec)
    if kind == "builtin":
        import sys

        name = spec.split(":", 1)[1]
        version = _package_version("sympy") if name == "sympy" else sys.version.split()[0]
        return SourceInfo(spec=spec, kind=kind, fingerprint=f"{name}-{version}")
    if kind == "hf":
        name, config, split = _parse_hf(spec)
        return SourceInfo(spec=spec, kind=kind, fingerprint=f"{name}:{config}@{split}", newlines=NEWLINES)
    files, other, skipped, outputs, unreadable = _scan(spec, out_dir)
    # by content and names within the source: a copied, moved or touched source is the same; its paths and mtimes
    # made it another request
    root = spec if os.path.isdir(spec) else os.path.dirname(spec)
    stats = [(os.path.abspath(f), os.stat(f)) for f in files]
    # a file that cannot be read counts by its name and problem: a prepare that skipped it is another request
    # than one of the folder once it is fixed or gone
    named = [(os.path.relpath(f, root), f) for f in files] + [(os.path.relpath(e.path, root), e.path)
                                                              for e in unreadable]
    marks = [hashlib.sha256(f"unreadable\0{e.problem}".encode()).digest() for e in unreadable]
    try:
        file_digests = digests(files)
        fingerprint = content_fingerprint("source", named, lambda _: file_digests + marks)
    except PermissionError as e:  # said "choose a location you may write to", the advice for an output
        raise SettingError("source", f"{e.filename} cannot be read (permission denied): make it readable (chmod a+r) "
                                     f"or {_leave_out(spec)}") from None
    return SourceInfo(spec=spec, kind=kind, fingerprint=fingerprint,
                      left_out=_most_first(other),
                      skipped=tuple(skipped), outputs=tuple(outputs),
                      outputs_by_files=tuple((folder, tuple(told)) for folder, told in outputs.items() if told),
                      files=tuple(os.path.realpath(f) for f in files), digests=tuple(file_digests),
                      older_fingerprints=(files_fingerprint(stats, lambda st: st.st_mtime_ns),
                                          files_fingerprint(stats, lambda st: int(st.st_mtime))),
                      unreadable=tuple((e.path, e.problem) for e in unreadable),
                      newlines=NEWLINES if any(_file_kind(f) in ("jsonl", "parquet") for f in files) else None)


def _most_first(other: dict[str, int]) -> tuple[tuple[str, int], ...]:
    return tuple(sorted(other.items(), key=lambda item: (-item[1], item[0])))


def left_out_of(spec: str, out_dir: str | None = None) -> dict:
    """What reading a folder source passes over, in the fields of a manifest's source (reading_notes says them):
    ``left_out_files``, its files of kinds not read as documents by extension, ``skipped_datasets``, the prepared
    datasets in it, ``skipped_outputs``, its eval output folders, and ``outputs_by_files``, those of them told by
    their files (folder -> its files of results); {} for any other source. ``out_dir``: a command's output folder,
    passed over (see passes_over) and not counted among them: the caller says it."""
    if source_kind(spec) != "file" or not os.path.isdir(spec):
        return {}
    _, other, skipped, outputs, _ = _scan(spec, out_dir)
    if out_dir is not None:
        skipped = [folder for folder in skipped if os.path.realpath(folder) != os.path.realpath(out_dir)]
    by_files = {folder: told for folder, told in outputs.items() if told}
    return {**({"left_out_files": dict(_most_first(other))} if other else {}),
            **({"skipped_datasets": skipped} if skipped else {}),
            **({"skipped_outputs": list(outputs)} if outputs else {}),
            **({"outputs_by_files": by_files} if by_files else {})}


def reading_notes(source: dict, text_field: str = "text", record: str = "the manifest") -> list[str]:
    """What reading a source left out, one line each, from its record in a manifest's form: ``spec``, and where
    any, ``empty_docs`` (with ``first_empty`` and, where the reading stopped before the source's end,
    ``docs_read``), ``left_out_files``, ``skipped_datasets``, ``skipped_outputs`` (with ``outputs_by_files``) and
    ``skipped_files`` (``record``: what lists them).
    Left out in silence, a folder's .py files read as a dataset of its READMEs."""
    notes = []
    if source.get("empty_docs"):
        # none where the source is that one file, or its shard was tokenized before the first was recorded
        first = source.get("first_empty")
        first = f", the first at {first}" if first not in (None, source["spec"]) else ""
        read = source.get("docs_read")
        among = f" among the first {read} documents read (reading stopped there, with enough text)" if read else ""
        notes.append(f"{source['spec']}: {source['empty_docs']} empty document(s) (or only whitespace) left "
                     f"out{among}{first}")
    if source.get("left_out_files"):
        kinds = ", ".join(f"{n} {ext}" for ext, n in source["left_out_files"].items())
        notes.append(f"{source['spec']}: {sum(source['left_out_files'].values())} file(s) of kinds not read as "
                     f"documents left out ({kinds}); read are {kinds_said(text_field)}")
    if source.get("skipped_datasets"):
        notes.append(f"{source['spec']}: {len(source['skipped_datasets'])} prepared dataset folder(s) in it not "
                     f"read as documents ({', '.join(source['skipped_datasets'])})")
    if source.get("skipped_outputs"):
        # a folder without the mark is passed over by what its files hold, which the user may want to check
        by_files = source.get("outputs_by_files") or {}
        told = " and ".join(f"{folder} ({', '.join(files)})" for folder, files in by_files.items())
        told = (f"; {told} recognised by {'its' if len(by_files) == 1 else 'their'} files of eval results, written "
                f"before eval marked its output folders") if by_files else ""
        notes.append(f"{source['spec']}: {len(source['skipped_outputs'])} eval output folder(s) in it not read as "
                     f"documents ({', '.join(source['skipped_outputs'])}){told}")
    if source.get("skipped_files"):
        notes.append(skipped_note(source["spec"], source["skipped_files"], record))
    return notes


# content_fingerprint's form; fingerprints without it are files_fingerprint's, of paths, sizes and times
CONTENT_PREFIX = "sha256:"


def content_fingerprint(kind: str, files: list[tuple[str, str]], digests=read_digests) -> str:
    """The names and content of ``files``, (name, path) each in order, hashed: ``"sha256:<16 hex digits>"``. It
    stays when the files are saved again, moved or copied, and changes with a name or a byte; ``kind`` tells one
    kind of files' fingerprints from another's. ``digests``: the sha256 of each path's bytes (read_digests, or a
    digests.DigestCache that spares reading unchanged files again)."""
    h = hashlib.sha256(kind.encode())
    for (name, _), digest in zip(files, digests([path for _, path in files])):
        h.update(f"\0{name}\0".encode() + digest)
    return CONTENT_PREFIX + h.hexdigest()[:16]


def files_fingerprint(stats: list[tuple[str, os.stat_result]], mtime) -> str:
    """Files' paths, sizes and ``mtime`` of their stats (os.stat of each), hashed: it changes when a file is saved
    again. The fingerprint older datasets recorded (content_fingerprint has replaced it)."""
    stamp = ";".join(f"{path}|{st.st_size}|{mtime(st)}" for path, st in stats)
    return hashlib.sha256(stamp.encode()).hexdigest()[:16]


def by_file_times(fingerprint: str) -> bool:
    """Whether a source fingerprint a dataset recorded is files_fingerprint's, of paths, sizes and times."""
    return re.fullmatch(r"[0-9a-f]{16}", fingerprint) is not None


# iter_documents' line-break rule, as a prepare's request records it for the sources it changed: the texts of JSONL
# rows, Parquet cells and hub datasets kept their "\r\n" before it (a .txt file's and the built-ins' were "\n" all
# along), so a dataset prepared then holds "\r" tokens under a request that read the same as today's
NEWLINES = "unix"


def unix_newlines(text: str) -> str:
    """``text`` with every line break as "\\n": Windows' "\\r\\n" and old Macs' lone "\\r" too, as Python's text
    mode reads a file (universal newlines)."""
    return text.replace("\r\n", "\n").replace("\r", "\n")


@contextlib.contextmanager
def refused_whole(spec: str, text_field: str = "text", out_dir: str | None = None, progress: bool = False,
                  without: str = PREPARE_WITHOUT, folder: str | None = None, others: bool = False):
    """Where a reading of ``spec`` inside meets a file that cannot be read as text (iter_documents' UnreadableFile),
    the refusal of the source for every such file (unreadable.refusal, with ``without`` and ``folder``): the rest of
    it is read through for them (``progress``: with a progress bar). ``text_field`` and ``out_dir``: the reading's;
    ``others``: it reads other sources too, which passing these files over leaves to read."""
    try:
        yield
    except UnreadableFile:
        bad = unreadable_files(spec, text_field, out_dir, progress)
        raise refusal(spec, bad, without, folder, others or readable_left(spec, bad, out_dir)) from None


def readable_left(spec: str, bad: dict[str, str], out_dir: str | None = None) -> bool:
    """Whether the source ``spec`` holds a document file that is not among ``bad`` (its files that cannot be read
    as text): what passing those over leaves to read. ``out_dir`` as describe_source takes it."""
    return source_kind(spec) != "file" or any(path not in bad for path in _scan(spec, out_dir)[0])


def iter_documents(spec: str, text_field: str = "text", out_dir: str | None = None,
                   skipped: dict[str, str] | None = None) -> Iterator[Document]:
    """Yield the documents of one source spec in a fixed order, each text with unix_newlines; ``out_dir`` as
    describe_source takes it. A file that cannot be read as text is an UnreadableFile; where ``skipped`` is given,
    it is passed over and put in it (path -> problem) instead, each file read through once before its documents
    are taken (none of a file read halfway is kept)."""
    # here, for every kind of source: a .txt file's line breaks were made "\n" and the same text in a JSONL row, a
    # Parquet cell or a hub dataset's column kept its "\r\n", so a document's tokens hung on the file it came in
    for doc in _documents(spec, text_field, out_dir, skipped):
        yield replace(doc, text=unix_newlines(doc.text)) if "\r" in doc.text else doc


def _documents(spec: str, text_field: str, out_dir: str | None, skipped: dict[str, str] | None) -> Iterator[Document]:
    kind = source_kind(spec)
    if kind == "builtin":
        name = spec.split(":", 1)[1]
        yield from {"sympy": _iter_sympy, "pydoc": _iter_pydoc, "stdlib": _iter_stdlib}[name]()
    elif kind == "hf":
        yield from _iter_hf(spec, text_field)
    else:
        files, _, _, _, unreadable = _scan(spec, out_dir)
        for error in unreadable:
            if skipped is None:
                raise error
            skipped[error.path] = error.problem
        for path in files:
            if skipped is not None and (problem := _problem(path, spec, text_field)):
                skipped[path] = problem
                continue
            yield from _iter_file(path, spec, text_field)
