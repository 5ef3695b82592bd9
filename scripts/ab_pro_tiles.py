"""Time FoX (Pro) 125M's training step at 16K under several Pro-op tile settings, on one compiled model.

    python scripts/ab_pro_tiles.py --tiles shift_fwd=2048x2h,shift_bwd=1024x2h --rounds 3 --out ab.json

tune_pro_ops.py times each kernel alone, where one launch's time moves by up to 30% from one row to the next (H100,
47th session); a step's 48 launches average that out. The settings (the tiles in use first, then each --tiles) are
timed in turn each round on the same compiled model (the kernels read tiles.TILES at every launch), so drift in
the machine falls on every setting; Transformer (LLaMA) 125M is timed once after, for the ratio.
Each --tiles item is KERNEL=ELEMENTSxWARPS, with a trailing 'h' for Tile.heads_inner; kernels not named keep TILES.
"""
from __future__ import annotations

import argparse
import json
import sys

import torch

from foxformer.bench.common import environment
from foxformer.bench.model import measure
from foxformer.models import FoxForCausalLM, get_preset
from foxformer.ops.pro_block import tiles

CONTEXT, BATCH = 16384, 4


def parse_tiles(text: str) -> dict:
    """'shift_fwd=2048x2h,gate_bwd=1024x4' -> {kernel: Tile}."""
    out = {}
    for item in text.split(","):
        kernel, _, spec = item.partition("=")
        if kernel not in tiles.TILES:
            raise argparse.ArgumentTypeError(f"{kernel!r}: expected one of {sorted(tiles.TILES)}")
        inner = spec.endswith("h")
        elements, _, warps = spec.rstrip("h").partition("x")
        out[kernel] = tiles.Tile(int(elements), int(warps), inner)
    return out


def label(setting: dict) -> str:
    return ",".join(f"{k}={t.elements}x{t.num_warps}{'h' if t.heads_inner else ''}" for k, t in setting.items())


def timed(preset: str, settings: list[dict], rounds: int, steps: int) -> list[dict]:
    """One row per setting: the median step over every round's steps."""
    torch.manual_seed(0)
    cfg = get_preset(preset)
    model = torch.compile(FoxForCausalLM(cfg))
    default = dict(tiles.TILES)
    times: list[list[float]] = [[] for _ in settings]
    for r in range(rounds):
        for i, setting in enumerate(settings):
            tiles.TILES.update({**default, **setting})
            res = measure(model, cfg.vocab_size, CONTEXT, BATCH, steps, 2, torch.bfloat16, torch.device("cuda"),
                          f"{preset} [{label(setting) or 'TILES'}] round {r}")
            times[i] += res["step_times"]
            print(f"round {r} {preset} [{label(setting) or 'TILES'}]: {res['step_s']:.4f} s", flush=True)
    tiles.TILES.update(default)
    return [dict(preset=preset, tiles=label(s) or "TILES", step_s=sorted(t)[len(t) // 2], step_times=t)
            for s, t in zip(settings, times)]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tiles", type=parse_tiles, action="append", default=[])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--no-transformer", action="store_true")
    p.add_argument("--out", default="ab_pro_tiles.json")
    args = p.parse_args(argv)
    rows = timed("fox-pro-125m", [{}] + args.tiles, args.rounds, args.steps)
    if not args.no_transformer:
        rows += timed("transformer-llama-125m", [{}], 1, args.steps)
    base = rows[-1]["step_s"] if not args.no_transformer else None
    print("\npreset | tiles | step s | tokens/s | / Transformer (LLaMA)")
    for r in rows:
        ratio = "-" if base is None else f"{base / r['step_s']:.3f}x"
        print(f"{r['preset']} | {r['tiles']} | {r['step_s']:.4f} | {BATCH * CONTEXT / r['step_s'] / 1e3:.1f}K | "
              f"{ratio}")
    with open(args.out, "w") as fh:
        json.dump(dict(environment=environment(), context=CONTEXT, batch=BATCH, rounds=args.rounds, rows=rows),
                  fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
