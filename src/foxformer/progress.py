"""Whether a progress bar is drawn: the one decision every command's bars (tqdm's and transformers') follow.

Standard library and tqdm only, so that every layer may import it.
"""
from __future__ import annotations

import sys

import tqdm.autonotebook
import tqdm.std


def bars_shown(wanted: bool) -> bool:
    """True where a bar the user wants (``wanted``: False for --no-progress or ``progress: false``) is drawn: on
    a terminal or as a notebook widget. Where stderr is no terminal (`2> run.log`, nohup, a pipe) a bar wrote a
    carriage-return frame at every update, all on one endless line of the log; there the commands' own lines
    and summaries are the progress."""
    if not wanted:
        return False
    if tqdm.autonotebook.tqdm is not tqdm.std.tqdm:
        return True  # a notebook widget writes no frames into a text stream, and the kernel's stderr is no tty
    isatty = getattr(sys.stderr, "isatty", None)
    return bool(isatty is not None and isatty())
