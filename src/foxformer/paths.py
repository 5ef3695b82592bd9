"""Checks on the files and folders a user names, so that a bad path fails with one line naming it.

Standard library only: the data, training and inference commands all use these.
"""
from __future__ import annotations

import codecs
import contextlib
import fcntl
import os
import shutil
import stat
import sys
from collections.abc import Callable

from .argtypes import SettingError
from .json_text import json_text

LOCK_FILE = ".lock"
# UTF-32 first: its little-endian mark starts with UTF-16's
_FOREIGN_BOMS = ((codecs.BOM_UTF32_LE, "UTF-32LE"), (codecs.BOM_UTF32_BE, "UTF-32BE"),
                 (codecs.BOM_UTF16_LE, "UTF-16LE"), (codecs.BOM_UTF16_BE, "UTF-16BE"))


def check_output_dir(path: str, what: str) -> None:
    """ValueError unless ``path`` is a folder that can be written into, or one that can be created; nothing is
    created. ``what`` names the setting (``out_dir``, ``--out``) in the message."""
    full = os.path.abspath(os.fspath(path))
    if os.path.exists(full) and not os.path.isdir(full):
        raise SettingError(what, f"{path!r} is a file, not a folder: choose another location")
    existing = full
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise SettingError(what, f"{path!r} cannot be created ({existing} is a file): choose another location")
    # access() also reports a read-only mount (EROFS), for root as well
    if not os.access(existing, os.W_OK | os.X_OK):
        raise SettingError(what, f"{path!r} is not writable ({existing} is read-only or not yours): choose "
                                 f"another location")


def check_output_file(path: str, what: str) -> None:
    """ValueError unless ``path`` names a file that can be written (its folder existing or creatable); checked
    before the work, which `generate --out /no/such/dir/x.json` lost after it finished."""
    if os.path.isdir(path):
        raise SettingError(what, f"{path!r} is a folder: name a file, e.g. {os.path.join(path, 'out.json')!r}")
    check_output_dir(os.path.dirname(os.path.abspath(os.fspath(path))), what)


# What a training run's folder holds (train/loop.py, train/checkpoint.py): an export never replaces such a folder.
RUN_FOLDER_FILES = ("config.yaml", "checkpoints", "metrics.jsonl")


def check_export_dir(path: str, what: str) -> bool:
    """An export replaces its folder whole: ValueError unless ``path`` is absent, empty, or an earlier export (a
    config.json and nothing of a run folder's); never the current folder or one that holds it. True when an
    earlier export is there (the caller says it replaces it). ``export-hf --out DIR`` removed DIR whatever it held:
    a user's files, the run folder itself, the current folder."""
    full = os.path.abspath(os.fspath(path))
    if not os.path.exists(full):
        return False
    if not os.path.isdir(full):
        raise SettingError(what, f"{path!r} is a file, not a folder: choose another location")
    here = os.getcwd()
    if here == full or here.startswith(full + os.sep):
        raise SettingError(what, f"{path!r} is the current folder or holds it, and an export replaces its folder: "
                                 f"name a new one, e.g. {os.path.join(path, 'hf')!r}")
    entries = sorted(os.listdir(full))
    if not entries:
        return False
    run_files = [e for e in entries if e in RUN_FOLDER_FILES]
    if run_files:
        raise SettingError(what, f"{path!r} is a training run's folder (it holds {', '.join(run_files)}), and an "
                                 f"export replaces its folder: name a new one, e.g. {os.path.join(path, 'hf')!r}")
    if "config.json" not in entries:
        shown = ", ".join(entries[:3]) + (", ..." if len(entries) > 3 else "")
        raise SettingError(what, f"{path!r} holds other files ({shown}), and an export replaces its folder: name an "
                                 f"empty or new one")
    return True


@contextlib.contextmanager
def export_writer(out: str, earlier: bool):
    """A temporary folder beside ``out`` to write an export into (``out`` passed check_export_dir before the work):
    finished, it replaces ``out`` (with a note when ``earlier``, an earlier export, goes); on any failure it is
    removed, so no half-written export is left beside the output and an earlier one stays whole."""
    tmp = f"{os.path.normpath(out)}.tmp-{os.getpid()}"
    # a process killed mid-export (kill -9 skips the cleanup) whose pid came round again left its files here
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _open_as_umask_allows(tmp)
    if earlier:
        print(f"note: replacing the earlier export in {out}", file=sys.stderr)
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)


def _open_as_umask_allows(folder: str) -> None:
    """Give each file in ``folder`` the permission bits the umask allows, as open() does: safetensors (0.8.1 on)
    writes through a temporary file made 0600 and renamed into place, so an export whose config.json anyone could
    read held a model.safetensors only its owner could (another user, a container's, failed to load it). The umask
    is read off the folder, which save_pretrained made with os.makedirs under it; bits are only ever added."""
    allowed = os.stat(folder).st_mode & 0o666
    for root, _, names in os.walk(folder):
        for name in names:
            path = os.path.join(root, name)
            mode = os.lstat(path).st_mode
            if stat.S_ISREG(mode) and mode & allowed != allowed:
                os.chmod(path, stat.S_IMODE(mode) | allowed)


class NotText(ValueError):
    """Bytes of ``path`` that are not UTF-8 text (see decode_utf8); ``problem``: what and where, without the fix,
    for a list of such files."""

    def __init__(self, path: str, problem: str, message: str):
        super().__init__(message)
        self.path, self.problem = path, problem


# How much of a file's start tells a binary file from text (git's own test reads as much)
BINARY_HEAD = 8000
# A file whose start looks binary is said to be one, the start of its problem (unreadable.refusal offers no
# conversion for such files)
BINARY = "looks like a binary file, not text"
# Bytes that no text holds in an encoding that keeps ASCII's (Latin-1, cp1252, KOI8-R, Shift-JIS, GBK, ...): the C0
# controls and DEL, but for tab, line breaks, form feed and ESC (terminal colours in a log)
_CONTROL = frozenset(range(32)) - set(b"\t\n\x0b\x0c\r\x1b") | {0x7F}


def _utf16_order(head: bytes) -> str | None:
    """"LE" or "BE" where ``head``, a file's start, is UTF-16 text without a byte-order mark: a quarter of its bytes
    or more are NUL, most of them where that byte order puts an ASCII character's high byte (Latin-script text in
    UTF-16 is about half NULs, all there), and in that order it reads as characters none of which is a control one
    (binary data read so meets one, or half a surrogate pair, within a few hundred bytes). UTF-16 of a script
    without ASCII letters has too few NULs to be told so, and is said to look binary."""
    nuls = head.count(0)
    if nuls * 4 < len(head):
        return None
    order = "LE" if head[1::2].count(0) * 2 > nuls else "BE"
    try:
        text = codecs.getincrementaldecoder(f"utf-16-{order.lower()}")().decode(head, final=False)
    except UnicodeDecodeError:
        return None
    return None if any(ord(ch) in _CONTROL for ch in text) else order


def _binary_sign(head: bytes) -> str | None:
    """Why ``head``, a file's start, looks like a binary file's rather than text's, None where it does not: more
    than 1 in 20 of its bytes are NUL or other control bytes (_CONTROL). Random and compressed bytes hold about
    1 in 10; text, in any of the encodings iconv would be told to convert from, next to none. Asked only of a file
    that fails as UTF-8: it decides what the refusal calls the file, not whether it is refused."""
    controls = sum(b in _CONTROL for b in head)
    if controls * 20 <= len(head):
        return None
    return f"{BINARY} ({controls} of its first {len(head)} bytes are NUL or other control bytes)"


def decode_utf8(data: bytes, path: str, first_line: int = 1, leave_out: str = "leave it out",
                first_byte: int = 0, head: Callable[[], bytes] | None = None) -> str:
    """``data`` (the bytes of ``path`` from line ``first_line`` on, byte ``first_byte`` of the file) as text; bytes
    that are not UTF-8 are a NotText naming the file, the line, the column and the byte offset (Python's own message
    names neither file nor line). ``leave_out``: how the fix says to do without the file (a folder's file is moved
    out of it). ``head``: the file's first BINARY_HEAD bytes, asked for where its bytes fail, where ``data`` is not
    the whole file (a JSON Lines file is decoded a line at a time); else ``data``'s own start stands for them.

    At the file's start (``first_line`` 1) a UTF-8 byte-order mark is no text: Windows editors write one, and it
    became a document's first character (a .jsonl file's first line was not JSON). A UTF-16 or UTF-32 one names
    its encoding: the advice to convert from Latin-1 made such a file decode into NULs between its letters. A
    NUL byte is no text either, though it is valid UTF-8. Where the bytes fail, the file's start tells what it is:
    UTF-16 without a byte-order mark, a binary file (an image or an archive named .txt, where the advice to
    convert it from Latin-1 was false), or text in another encoding."""
    start = 0
    if first_line == 1:
        for bom, encoding in _FOREIGN_BOMS:
            if data.startswith(bom):
                problem = f"{encoding} text (it starts with a {encoding} byte-order mark), not UTF-8"
                raise NotText(path, problem, f"{path} is {problem}: convert it (iconv -f {encoding[:6]} -t utf-8, "
                                             f"which drops the mark) or {leave_out}")
        if data.startswith(codecs.BOM_UTF8):
            start = len(codecs.BOM_UTF8)
    try:
        text = str(memoryview(data)[start:], "utf-8")
    except UnicodeDecodeError as e:
        pos, nul = start + e.start, False
    else:
        if "\x00" not in text:
            return text
        pos, nul = data.index(b"\x00", start), True
    first = data[:BINARY_HEAD] if head is None else head()
    if order := _utf16_order(first):
        problem = f"UTF-16{order} text without a byte-order mark (NUL bytes beside its letters), not UTF-8"
        raise NotText(path, problem, f"{path} is {problem}: convert it (iconv -f UTF-16{order} -t utf-8) or "
                                     f"{leave_out}")
    if binary := _binary_sign(first):
        raise NotText(path, binary, f"{path} {binary}: {leave_out}")
    where = _line_column(data, pos, first_line)
    if nul:
        problem = f"{where} is a NUL byte, at byte offset {first_byte + pos}, which text does not hold"
        raise NotText(path, problem, f"{path}: {problem}: remove the NUL bytes (tr -d '\\000' < FILE > NEW) or "
                                     f"{leave_out}")
    problem = f"{where} is not UTF-8 (byte 0x{data[pos]:02x}), at byte offset {first_byte + pos}"
    raise NotText(path, problem, f"{path}: {problem}: convert the file to UTF-8 (e.g. iconv -f latin1 -t utf-8) "
                                 f"or {leave_out}")


def _line_column(data: bytes, pos: int, first_line: int) -> str:
    line = first_line + data.count(b"\n", 0, pos)
    column = pos - (data.rfind(b"\n", 0, pos) + 1) + 1
    return f"line {line}, column {column}"


def read_text(path: str, what: str | None = None) -> str:
    """The UTF-8 text of ``path`` (see decode_utf8). ``what``: the setting that named the file, said first where it
    cannot be read (the error line named the path alone, not the flag it came from)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        if what is None:
            raise
        raise ValueError(f"{what}: {path!r}: {(e.strerror or str(e)).lower()}") from None
    return decode_utf8(data, path, leave_out="give another file")


@contextlib.contextmanager
def folder_lock(folder: str, what: str):
    """Hold an exclusive lock on ``folder`` (an flock on ``folder/.lock``, created with the folder) while the
    block runs; ValueError at once when another process holds it. The kernel drops the lock when the holder
    exits, also on kill -9, so a crash never leaves the folder locked."""
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, LOCK_FILE), "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise SettingError(what, f"another process is writing into {folder!r} (it holds "
                                     f"{os.path.join(folder, LOCK_FILE)}): wait for it to end, or choose another "
                                     f"location") from None
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


@contextlib.contextmanager
def replaced_atomically(path: str | os.PathLike):
    """Yields a temporary path beside ``path`` (its folder created) to write; once written, it replaces ``path``
    (os.replace). A write that fails or is interrupted (Ctrl-C, a full disk) removes it: what stays at ``path`` is
    the previous complete file or none, never a truncated one under the final name, nor a stray temporary."""
    path = os.fspath(path)
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)
        raise


def write_text(path: str | os.PathLike, text: str) -> None:
    """``text`` as UTF-8 (what read_text reads), through replaced_atomically (the folder is created) and on disk
    before it replaces ``path``: a Ctrl-C or a full disk mid-write leaves the previous complete file or none, never
    a truncated report, table, config or model card under the final name."""
    with replaced_atomically(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def write_json(path: str | os.PathLike, obj, *, sort_keys: bool = False) -> None:
    """``obj`` as indented JSON (json_text: non-ASCII characters as themselves, in UTF-8), through write_text: a kill
    mid-write leaves the previous complete file, never a truncated one (manifests, model configs, benchmark rows
    rewritten after each one)."""
    write_text(path, json_text(obj, indent=2, sort_keys=sort_keys) + "\n")
