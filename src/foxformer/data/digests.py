"""sha256 digests of source files, remembered between runs of `data prepare`.

A source's fingerprint is the content of its files (sources.content_fingerprint): on a corpus of gigabytes,
reading it all again took seconds to minutes on every prepare, also of a dataset already up to date. The cache
keeps each file's digest under its real path with the size and nanosecond mtime it had when it was read, in a
JSON file of the dataset's folder (sources may be read-only). It is a shortcut only: an entry whose file's size
or mtime differ is read again, and a missing or unreadable cache is rebuilt.
"""

from __future__ import annotations

import hashlib
import json
import os

from ..paths import write_json
from ..progress import progress_bar

CACHE_FILE = "source_digests.json"
_FORMAT = 1


def file_digest(path: str, bar=None) -> bytes:
    """The sha256 of the file's bytes, read in 1 MiB blocks (a corpus file of gigabytes is not read whole);
    ``bar``, a :func:`~foxformer.progress.progress_bar`, goes on by the bytes read."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
            if bar is not None:
                bar.update(len(block))
    return digest.digest()


def read_digests(paths: list[str]) -> list[bytes]:
    """:func:`file_digest` of each path, without a cache."""
    return [file_digest(p) for p in paths]


def _valid(entry) -> bool:
    return isinstance(entry, dict) and isinstance(entry.get("size"), int) and \
        isinstance(entry.get("mtime_ns"), int) and isinstance(entry.get("sha256"), str) and \
        len(entry["sha256"]) == 64 and all(c in "0123456789abcdef" for c in entry["sha256"])


def _load(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):  # missing, unreadable or not JSON: every file is read again
        return {}
    if not isinstance(data, dict) or data.get("format") != _FORMAT or not isinstance(data.get("files"), dict):
        return {}
    return {real: entry for real, entry in data["files"].items() if _valid(entry)}


class DigestCache:
    """:func:`read_digests` that reads only the files whose (real path, size, mtime_ns) it has no digest for, in
    ``path`` (written by :meth:`save`); a progress bar shows where reading takes more than a moment."""

    def __init__(self, path: str, progress: bool = True):
        self.path, self.progress = path, progress
        self._known = _load(path)
        self._used: dict[str, dict] = {}

    def __call__(self, paths: list[str]) -> list[bytes]:
        # stat before reading: a file written meanwhile gets a newer mtime than the one recorded, and is read again
        stats = [(os.path.realpath(p), os.stat(p)) for p in paths]
        for real, st in stats:
            entry = self._known.get(real)
            if entry and entry["size"] == st.st_size and entry["mtime_ns"] == st.st_mtime_ns:
                self._used[real] = entry
        todo = [(real, st) for real, st in stats if real not in self._used]
        with progress_bar(total=sum(st.st_size for _, st in todo), desc="fingerprint sources", unit="B",
                          unit_scale=True, delay=2.0, wanted=bool(todo) and self.progress) as bar:
            for real, st in todo:
                self._used[real] = {"size": st.st_size, "mtime_ns": st.st_mtime_ns,
                                    "sha256": file_digest(real, bar).hex()}
        return [bytes.fromhex(self._used[real]["sha256"]) for real, _ in stats]

    def save(self) -> None:
        """Write the digests of the files read through this cache, where the folder exists (a prepare refused
        before it made its dataset's folder leaves nothing behind) and they differ from what it holds."""
        if self._used == self._known or not os.path.isdir(os.path.dirname(self.path) or "."):
            return
        try:
            write_json(self.path, {"format": _FORMAT, "files": self._used}, sort_keys=True)
        except OSError:  # a read-only dataset: the next prepare reads the files again, as without a cache
            pass
