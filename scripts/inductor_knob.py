"""Run a foxformer command with Inductor config fields or the Pro block's kernel tiles changed, to time a setting in
the model's step before it gets a flag or a default:

    python scripts/inductor_knob.py realize_reads_threshold=8 tile:shift_bwd.gather_next=0 -- bench model ...

FIELD=VALUE sets torch._inductor.config.FIELD (an integer); tile:KERNEL.FIELD=VALUE replaces a field of
ops.pro_block.tiles.TILES[KERNEL]. Everything after ``--`` is the foxformer command line. The bench's JSON does not
record these settings: say them beside its numbers.
"""
from __future__ import annotations

import dataclasses
import runpy
import sys

import torch._inductor.config as inductor_config

from foxformer.ops.pro_block import tiles


def apply(item: str) -> str:
    """Set one FIELD=VALUE or tile:KERNEL.FIELD=VALUE; returns what is now set, in words."""
    name, value = item.split("=", 1)
    if name.startswith("tile:"):
        kernel, field = name[len("tile:"):].split(".")
        old = getattr(tiles.TILES[kernel], field)
        tiles.TILES[kernel] = dataclasses.replace(tiles.TILES[kernel], **{field: type(old)(int(value))})
        return f"tiles: {kernel} = {tiles.TILES[kernel]}"
    if not hasattr(inductor_config, name):
        raise SystemExit(f"inductor_knob: torch._inductor.config has no field {name!r}")
    setattr(inductor_config, name, int(value))
    return f"inductor: {name} = {getattr(inductor_config, name)!r}"


def main() -> None:
    if "--" not in sys.argv:
        raise SystemExit(__doc__)
    split = sys.argv.index("--")
    for item in sys.argv[1:split]:
        print(apply(item), flush=True)
    sys.argv = ["foxformer", *sys.argv[split + 1:]]
    runpy.run_module("foxformer.cli", run_name="__main__")


if __name__ == "__main__":
    main()
