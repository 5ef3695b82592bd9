"""`foxformer bench <what>`: benchmarks that print a table and write JSON (also `foxformer bench-model` and
`foxformer bench-decode`)."""
from __future__ import annotations

from . import attention, decode, model, scaling


def add_commands(sub) -> None:
    bench = sub.add_parser("bench", help="benchmarks (tables + JSON)")
    inner = bench.add_subparsers(dest="bench_command", metavar="WHAT")
    attention.add_parser(inner)
    model.add_parser(inner)
    decode.add_parser(inner)
    scaling.add_parser(inner)
    model.configure(sub.add_parser("bench-model", help="training tokens/s and peak memory of whole models "
                                                       "(and transformers' LlamaForCausalLM as anchor)"))
    decode.add_parser(sub, name="bench-decode")
