"""`foxformer bench <what>`: benchmarks that print a table and write JSON."""
from __future__ import annotations

from . import attention, decode, model, scaling


def add_commands(sub) -> None:
    bench = sub.add_parser("bench", help="benchmarks (tables + JSON)")
    inner = bench.add_subparsers(dest="bench_command", metavar="WHAT")
    attention.add_parser(inner)
    model.add_parser(inner)
    decode.add_parser(inner)
    scaling.add_parser(inner)
