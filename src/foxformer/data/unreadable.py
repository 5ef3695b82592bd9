"""A source's files that cannot be read as text: bytes that are not UTF-8 (UTF-16, Latin-1, binary), a damaged
compression, a link to nothing, a file without read permission.

`data prepare` and the eval commands that read a source refuse it for them all in one error, not the first of them
(a folder of a thousand files was fixed one file a run), or with ``skip_bad_files`` pass them over, say so and
record them: nothing is left out in silence.
"""

from __future__ import annotations

import contextlib
import os

from ..argtypes import SettingError
from ..paths import BINARY, write_text

# A refusal or a note names this many files, and counts the rest
SHOWN = 100
# Where a refusal whose list is cut writes it whole, in the folder it is given (a prepare's out_dir, an eval
# command's output folder): of no kind read as documents, since that folder may lie in a source folder and be walked
# before it holds a dataset
LIST_FILE = "unreadable_files.tsv"
# What passing the files over does, as a prepare's refusal offers it
PREPARE_WITHOUT = "prepare the dataset without them (they are printed, and listed in its manifest)"


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


def refusal(spec: str, bad: dict[str, str], without: str = PREPARE_WITHOUT,
            folder: str | None = None, rest: bool = True) -> SettingError:
    """The error that refuses the source ``spec`` for its files ``bad`` (path -> problem), all of them, with the
    fixes and, where ``rest`` (a readable file would be left to read: of this source, or of another the reading
    takes), the option that goes on ``without`` them; where none would be, it sends the user to another source (the
    option was offered for a source of one file, and then refused as holding no text). ``folder``: where a list
    longer than the error shows is written whole (LIST_FILE, one file and its problem a line, tab between), and
    named; a terminal's scrollback held the first SHOWN of a thousand, and nothing held the rest. A binary file has
    no fix but to go: the advice to convert files is left out where all are."""
    whole = ""
    if len(bad) > SHOWN and folder is not None:
        path = os.path.join(folder, LIST_FILE)
        write_text(path, "".join(f"{file}\t{problem}\n" for file, problem in sorted(bad.items())))
        whole = f" (all of them in {path})"
    fixes = [] if all(problem.startswith(BINARY) for problem in bad.values()) else [
        "convert each to UTF-8 (iconv -f ITS_ENCODING -t utf-8)", "fetch a damaged one again",
        "restore or remove a broken link" if rest else "restore a broken link"]
    if rest:
        fixes.append(f"move them out of {spec!r}" if os.path.isdir(spec) else "leave the source out")
    else:
        fixes.append("give another source")
    said = ", ".join(fixes[:-1]) + (", or " if len(fixes) > 1 else "") + fixes[-1]
    said = said[0].upper() + said[1:]
    return SettingError("source", lambda name: (
        f"{len(bad)} file(s) of {spec!r} cannot be read as text: {listed(bad)}{whole}. {said}; "
        + (f"or pass {name('skip_bad_files')} to {without}" if rest else
           f"{name('skip_bad_files')} would leave no file of it to read")))


def drop_list(folder: str) -> None:
    """Remove an earlier refusal's LIST_FILE from ``folder``, where a reading into it has gone on (the files read
    now, or passed over): it would lie beside results it does not describe."""
    with contextlib.suppress(FileNotFoundError):
        os.remove(os.path.join(folder, LIST_FILE))


# Which files those passed over are of where the reading stopped before the source's end (an eval's, once it has
# the text it needs): its later files were never read, so the bad ones among them are not known
READ_BEFORE_STOP = "the files read before the reading stopped with enough text (the rest were not checked)"


def skipped_note(spec: str, bad: dict[str, str], record: str = "the manifest", stopped: bool = False) -> str:
    """What a reading with skip_bad_files says of the files ``bad`` of ``spec`` it passed over; ``record``: what
    lists them all. ``stopped``: the reading ended before the source did, and ``bad`` are those it met."""
    among = f", of {READ_BEFORE_STOP}" if stopped else ""
    return f"{spec}: {len(bad)} file(s) that cannot be read as text skipped (--skip-bad-files; {record} lists them " \
           f"under skipped_files){among}: {listed(bad)}"
