"""argparse types for the comma-separated lists the CLI commands take (--lengths 1024,2048 ...), and the
"did you mean" hint of every check that refuses an unknown name."""
from __future__ import annotations

import argparse
import difflib


def ints(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from e


def floats(text: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from e


def words(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def did_you_mean(word, choices) -> str:
    """`` (did you mean 'x'?)`` with the choice closest to ``word``, or "" when none is close."""
    close = difflib.get_close_matches(str(word), list(choices), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""
