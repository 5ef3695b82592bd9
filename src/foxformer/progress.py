"""Whether a progress bar is drawn: the one decision every command's bars (tqdm's and transformers') follow.

Standard library and tqdm only, so that every layer may import it.
"""
from __future__ import annotations

import sys
import threading
import time
from contextlib import contextmanager, nullcontext

import tqdm.auto
import tqdm.autonotebook
import tqdm.std

# seconds between the plain lines that stand in for a bar: a log gets a few lines per hour of work, a short loop none
LINE_EVERY_S = 60.0


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


def progress_bar(iterable=None, *, total: int | None = None, desc: str, unit: str, wanted: bool,
                 unit_scale: bool = False, leave: bool = True, delay: float = 0.0):
    """A tqdm bar where bars_shown(wanted), else a plain line on stderr at most every LINE_EVERY_S seconds
    (``niah run: trial 3/20 done, 04:10 elapsed``): off a terminal, or with --no-progress, a long evaluation (100K-token
    needle trials on a CPU) said nothing for ten minutes and more. Iterate it, or call update() and close(), or use
    it in a ``with``. ``unit_scale``: counts as 1.23M in both; ``leave`` and ``delay`` are the bar's (a plain line
    already waits LINE_EVERY_S, and leaves nothing to clear)."""
    if bars_shown(wanted):
        return tqdm.auto.tqdm(iterable, total=total, desc=desc, unit=unit, unit_scale=unit_scale, leave=leave,
                              delay=delay)
    if total is None and hasattr(iterable, "__len__"):
        total = len(iterable)
    return _Lines(iterable, total, desc, unit, unit_scale)


def working(bar, what: str, size: int = 1):
    """A ``with`` around one item of ``bar``'s loop, ``what`` saying what it computes and how big it is ("a
    65,536-token context"): where no bar is drawn, a line at most every LINE_EVERY_S while the item runs. The plain
    lines come as items end, so a single long item (one 100K-token needle trial on a CPU, one big loss batch) said
    nothing until it ended; a single forward pass gives no place to say more, hence a thread. ``size``: the units
    the item adds to the bar (a prompt chunk's tokens). A drawn bar is left as it is."""
    return bar.working(what, size) if isinstance(bar, _Lines) else nullcontext()


class _Lines:
    """The plain lines behind progress_bar, with the few tqdm methods the commands' loops call."""

    def __init__(self, iterable, total: int | None, desc: str, unit: str, unit_scale: bool = False):
        self.iterable, self.total, self.desc, self.unit, self.unit_scale = iterable, total, desc, unit, unit_scale
        self.n = 0
        self.start = self.said = time.monotonic()

    def __iter__(self):
        for item in self.iterable:
            yield item
            self.update(1)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _count(self, n: int) -> str:
        # below 1000 tqdm's scaling writes 0 as "0.00", a count of units as if a fraction of one
        return tqdm.std.tqdm.format_sizeof(n) if self.unit_scale and n >= 1000 else f"{n:,}"

    def _say(self, n: int, state: str) -> None:
        self.said = now = time.monotonic()
        of = f"/{self._count(self.total)}" if self.total is not None else ""
        sys.stderr.write(f"{self.desc}: {self.unit} {self._count(n)}{of} {state}, "
                         f"{tqdm.std.tqdm.format_interval(now - self.start)} elapsed\n")
        sys.stderr.flush()

    def update(self, n: int = 1) -> None:
        self.n += n
        if time.monotonic() - self.said < LINE_EVERY_S or (self.total is not None and self.n >= self.total):
            return  # the command's own output follows the last one
        self._say(self.n, "done")

    @contextmanager
    def working(self, what: str, size: int = 1):
        if LINE_EVERY_S <= 0:  # tests' "a line after every item": a beat would write lines without pause
            yield
            return
        stop = threading.Event()

        def beat() -> None:
            # the time left to the next line, counted from the last one (an item's end said its own); an item of
            # one unit is named by its number ("trial 3/20 running"), one of many by the units done before it: a
            # 21,229-token prompt read in one forward said "tok 1.00/21.2k running"
            while not stop.wait(max(0.0, self.said + LINE_EVERY_S - time.monotonic())):
                if size == 1:
                    self._say(self.n + 1, f"running ({what})")
                else:
                    self._say(self.n, f"done, running ({what})")

        thread = threading.Thread(target=beat, daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()

    def set_postfix(self, *args, **kwargs) -> None:
        pass  # a bar's live figures (mqar's loss): a loop that logs them says them in its own lines and results

    def close(self) -> None:
        pass
