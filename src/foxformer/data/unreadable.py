"""A source's files that cannot be read as text: bytes that are not UTF-8 (UTF-16, Latin-1, binary), a damaged
compression, a link to nothing, a file without read permission.

`data prepare` refuses a source for them all in one error, not the first of them (a folder of a thousand files was
fixed one file a run), or with ``skip_bad_files`` passes them over, says so and lists them in the manifest: nothing
is left out in silence.
"""

from __future__ import annotations

import os

from ..argtypes import SettingError

# A refusal or a note names this many files, and counts the rest
SHOWN = 100


class UnreadableFile(SettingError):
    """One file of a source that cannot be read as text: ``path``, and ``problem``, what and where without the
    fix (``line 3, column 7 is not UTF-8 (byte 0xe9), at byte offset 40``), for a list of such files."""

    def __init__(self, path: str, problem: str, message: str):
        super().__init__("source", message)
        self.path, self.problem = path, problem

    def __reduce__(self):  # SettingError's would make it one of those, without the file
        return UnreadableFile, (self.path, self.problem, self.reason)


def listed(bad: dict[str, str]) -> str:
    """``bad`` (path -> problem) as one line: ``a.txt: problem; b.txt: problem; and 3 more``."""
    items = sorted(bad.items())
    said = "; ".join(f"{path}: {problem}" for path, problem in items[:SHOWN])
    return said + (f"; and {len(items) - SHOWN} more" if len(items) > SHOWN else "")


def refusal(spec: str, bad: dict[str, str]) -> SettingError:
    """The error that refuses the source ``spec`` for its files ``bad`` (path -> problem), all of them, with the
    fixes and the option that prepares without them."""
    without = f"move them out of {spec!r}" if os.path.isdir(spec) else "leave the source out"
    return SettingError("source", lambda name: (
        f"{len(bad)} file(s) of {spec!r} cannot be read as text: {listed(bad)}. Convert each to UTF-8 (iconv -f "
        f"ITS_ENCODING -t utf-8), fetch a damaged one again, restore or remove a broken link, or {without}; or pass "
        f"{name('skip_bad_files')} to prepare the dataset without them (they are printed, and listed in its "
        f"manifest)"))


def skipped_note(spec: str, bad: dict[str, str]) -> str:
    """What a prepare with skip_bad_files says of the files ``bad`` of ``spec`` it passed over."""
    return f"{spec}: {len(bad)} file(s) that cannot be read as text skipped (--skip-bad-files; the manifest lists " \
           f"them under skipped_files): {listed(bad)}"
