"""argparse types for the comma-separated lists the CLI commands take (--lengths 1024,2048 ...)."""
from __future__ import annotations

import argparse


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
