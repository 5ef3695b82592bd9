"""`foxformer <command>`: one entry point; each area registers its own subcommands."""
from __future__ import annotations

import argparse
import importlib
import sys

# Each module defines add_commands(subparsers); a command's handler is stored as `func`.
_AREAS = (
    "foxformer.bench.cli",
    "foxformer.models.cli",
    "foxformer.data.cli",
    "foxformer.train.cli",
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


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
