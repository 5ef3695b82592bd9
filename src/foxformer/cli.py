"""`foxformer <command>`: one entry point; each area registers its own subcommands."""
from __future__ import annotations

import argparse
import importlib
import os
import select
import sys

# Each module defines add_commands(subparsers); a command's handler is stored as `func`.
_AREAS = (
    "foxformer.bench.cli",
    "foxformer.models.cli",
    "foxformer.data.cli",
    "foxformer.train.cli",
    "foxformer.demo",
    "foxformer.eval.cli",
    "foxformer.infer.cli",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="foxformer", description=__doc__)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in _AREAS:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name and name.startswith(exc.name):  # area not built: its commands are absent
                continue
            raise
        module.add_commands(sub)
    return parser


# What a shell reports for a program killed by SIGPIPE (128 + 13); Python ignores the signal instead.
BROKEN_PIPE_EXIT = 141


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        rc = int(args.func(args) or 0)
        sys.stdout.flush()  # inside the try: a reader gone by now fails this flush, not the one at exit
    except BrokenPipeError:
        if not _stdout_reader_gone():
            raise  # another pipe (a data-loader worker, a socket): a real error
        _silence_stdout()
        return BROKEN_PIPE_EXIT
    return rc


def _stdout_reader_gone() -> bool:
    """Whether stdout is a pipe whose reader has closed it (poll reports POLLERR on such a write end)."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        return False
    if not hasattr(select, "poll"):  # no way to tell (Windows): the standard pattern assumes stdout
        return True
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    return any(events & select.POLLERR for _, events in poller.poll(0))


def _silence_stdout() -> None:
    """The reader (`| head`) is gone: point stdout at devnull so that the interpreter's final flush of
    what is still buffered does not print 'Exception ignored ... BrokenPipeError'."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # stdout is no file descriptor (captured in-process)
        pass


if __name__ == "__main__":
    sys.exit(main())
