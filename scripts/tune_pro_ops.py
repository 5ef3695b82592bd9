"""Time the Pro block's fused ops (ops/pro_block) on one GPU over tile sizes and warps, beside Inductor.

    python scripts/tune_pro_ops.py --out pro_ops_tune.json
    python scripts/tune_pro_ops.py --layout separate --no-inductor --out pro_ops_separate.json

Each case is one of FoX (Pro) 125M's calls at 16K (B 4, 12 heads of 64, bf16): q's norm, k's shift + norm, v's
shift, the output norm + gate. --layout joint (the default): q, k, v and the output gate are views of one joint
product, as with joint_input_projections; separate: each is a contiguous [B, T, H, D] tensor, as in the model's
default config (the shift logits stay views of the gates' joint product either way). Every (elements, warps,
programs numbered head-fastest or not: Tile.heads_inner) row times each kernel's forward and backward launcher
alone (median of CUDA-event timings), and its effective bandwidth from the bytes the pass must move; the shift
cases' backward is timed again with Tile.gather_next (rows with variant "gather", over --gather-elements x
--gather-warps). The last row per case is the reference compiled by Inductor, forward and forward + backward
through autograd, as the model runs without fused_pro_ops. The winners become tiles.TILES (its comment cites the
run). The separate layout sweeps fewer tiles by default (rows-inner only), to finish in about a minute.
"""
from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import sys

import torch

from foxformer.bench.common import environment
from foxformer.ops.pro_block import gate, gate_norm_reference, shift, shift_norm_reference, tiles

B, T, H, D = 4, 16384, 12, 64
REPS = 30
# 8K and 16K elements lost every case on the H100 (fbff5a5), up to 20x slower with few warps
ELEMENTS = (1024, 2048, 4096)
WARPS = (1, 2, 4, 8)
HEADS_INNER = (False, True)
# the default sweep of each layout: (elements, warps, heads_inner); separate's only compares the two backwards
SWEEPS = {"joint": (ELEMENTS, WARPS, HEADS_INNER), "separate": (ELEMENTS, (4, 8), (False,))}
# the gather kernel's tiles: k's backward 0.248-0.448 ms over them on an H100, 2K x 4 and 4K x 8 the fastest
# (docs/bench/pro_ops_tune_separate_d8f1741_h100.json)
GATHER_ELEMENTS = (1024, 2048, 4096)
GATHER_WARPS = (4, 8)
SHIFTED = ("k shift+norm", "v shift")  # the cases whose backward has a gather variant


def ms(fn) -> float:
    """Median milliseconds of fn over REPS timed calls, after three untimed."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(REPS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def inputs(layout: str) -> dict:
    """The model's tensors: q, k, v, g views into a joint product [B, T, 4 H D] or each contiguous (layout), the
    shift logits views into the gates' [B, T, 40], the output contiguous."""
    torch.manual_seed(0)
    small = torch.randn(B, T, 40, device="cuda", dtype=torch.bfloat16)
    if layout == "joint":
        wide = torch.randn(B, T, 4 * H * D, device="cuda", dtype=torch.bfloat16)
        qkvg = [wide[..., i * H * D:(i + 1) * H * D].unflatten(-1, (H, D)) for i in range(4)]
    else:
        qkvg = [torch.randn(B, T, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(4)]
    return dict(q=qkvg[0], k=qkvg[1], v=qkvg[2], g=qkvg[3].flatten(-2), ks=small[..., 12:24], vs=small[..., 24:36],
                o=torch.randn(B, T, H, D, device="cuda", dtype=torch.bfloat16),
                w_d=1 + 0.1 * torch.randn(D, device="cuda"), w_hd=1 + 0.1 * torch.randn(H, D, device="cuda"),
                dy=torch.randn(B, T, H, D, device="cuda", dtype=torch.bfloat16))


def cases(x: dict) -> dict:
    """name -> (kernel prefix, fused forward, fused backward, reference (differentiable args), bytes fwd, bwd)."""
    act = B * T * H * D * 2  # one [B, T, H, D] bf16 tensor
    gate_b = B * T * H * 2
    dy = x["dy"]
    return {
        "q norm": ("shift", lambda: shift.shift_norm_forward(x["q"], None, None, None, x["w_d"], 1e-6),
                   lambda: shift.shift_norm_backward(dy, x["q"], None, None, None, x["w_d"], 1e-6),
                   (shift_norm_reference, dict(x=x["q"], weight=x["w_d"])), 2 * act, 3 * act),
        "k shift+norm": ("shift", lambda: shift.shift_norm_forward(x["k"], x["ks"], None, None, x["w_d"], 1e-6),
                         lambda: shift.shift_norm_backward(dy, x["k"], x["ks"], None, None, x["w_d"], 1e-6),
                         (shift_norm_reference, dict(x=x["k"], logits=x["ks"], weight=x["w_d"])),
                         2 * act + gate_b, 3 * act + 2 * gate_b),
        "v shift": ("shift", lambda: shift.shift_norm_forward(x["v"], x["vs"], None, None, None, 1e-6),
                    lambda: shift.shift_norm_backward(dy, x["v"], x["vs"], None, None, None, 1e-6),
                    (shift_norm_reference, dict(x=x["v"], logits=x["vs"])), 2 * act + gate_b, 3 * act + 2 * gate_b),
        "gate+norm": ("gate", lambda: gate.gate_norm_forward(x["o"], x["g"], x["w_hd"], 1e-6),
                      lambda: gate.gate_norm_backward(dy, x["o"], x["g"], x["w_hd"], 1e-6),
                      (gate_norm_reference, dict(o=x["o"], g=x["g"], weight=x["w_hd"])), 3 * act, 5 * act),
    }


def inductor_ms(ref, args: dict, dy: torch.Tensor) -> tuple[float, float]:
    """(forward, forward + backward) of the reference compiled by Inductor, the inputs' leaves as in training."""
    fn = torch.compile(ref)
    leaves = {k: v.detach().clone().requires_grad_() if v.is_floating_point() else v for k, v in args.items()}
    fwd = ms(lambda: fn(**leaves))
    return fwd, ms(lambda: fn(**leaves).backward(dy))


def fused_row(name: str, kernel: str, fwd, bwd, bytes_f: int, bytes_b: int, tile: tiles.Tile) -> dict:
    """One tile's row: the forward (skipped for the gather variant: the same kernel) and the backward."""
    gather = tile.gather_next
    tiles.TILES.update({f"{kernel}_fwd": dataclasses.replace(tile, gather_next=False), f"{kernel}_bwd": tile})
    f, b = (None if gather else ms(fwd)), ms(bwd)
    order = "heads-inner" if tile.heads_inner else "rows-inner"
    fwd_text = "" if f is None else f"fwd {f:.4f} ms ({bytes_f / f / 1e6:6.0f} GB/s)  "
    print(f"{name:14s} {'gather' if gather else 'base':6s} {tile.elements:6d} x{tile.num_warps} {order:11s}  "
          f"{fwd_text}bwd {b:.4f} ms ({bytes_b / b / 1e6:6.0f} GB/s)", flush=True)
    return dict(case=name, provider="fused", variant="gather" if gather else "base", elements=tile.elements,
                warps=tile.num_warps, heads_inner=tile.heads_inner, fwd_ms=f, bwd_ms=b,
                fwd_gbs=None if f is None else bytes_f / f / 1e6, bwd_gbs=bytes_b / b / 1e6)


def print_best(rows: list, timed: dict, default: dict) -> None:
    """Each (case, pass, backward variant)'s fastest tile, beside the current TILES' entry (base)."""
    best = {}
    for r in rows:
        for pass_ in ("fwd", "bwd"):
            key = (r["case"], pass_, r.get("variant"))
            if r["provider"] == "fused" and r[f"{pass_}_ms"] is not None and (
                    key not in best or r[f"{pass_}_ms"] < best[key][f"{pass_}_ms"]):
                best[key] = r
    print("\ncase | pass | variant | best elements x warps, order | ms | GB/s | TILES' ms")
    for (case, pass_, variant), r in best.items():
        now = default[f"{timed[case][0]}_{pass_}"]
        d = next((q for q in rows if q["case"] == case and q.get("variant") == "base"
                  and q.get("elements") == now.elements and q.get("warps") == now.num_warps
                  and q.get("heads_inner") == now.heads_inner), None)
        order = "heads-inner" if r["heads_inner"] else "rows-inner"
        print(f"{case} | {pass_} | {variant} | {r['elements']} x {r['warps']}, {order} | {r[f'{pass_}_ms']:.4f} | "
              f"{r[f'{pass_}_gbs']:.0f} | {'-' if d is None else format(d[f'{pass_}_ms'], '.4f')}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default="pro_ops_tune.json")
    p.add_argument("--layout", choices=sorted(SWEEPS), default="joint",
                   help="q, k, v, g as views of one joint product (joint) or contiguous tensors (separate)")
    p.add_argument("--elements", type=int, nargs="+", help="default: the layout's sweep (SWEEPS)")
    p.add_argument("--warps", type=int, nargs="+", help="default: the layout's sweep (SWEEPS)")
    p.add_argument("--gather-elements", type=int, nargs="+", default=GATHER_ELEMENTS)
    p.add_argument("--gather-warps", type=int, nargs="+", default=GATHER_WARPS)
    p.add_argument("--no-inductor", action="store_true", help="skip the compiled reference's rows")
    args = p.parse_args(argv)
    sweep_elements, sweep_warps, orders = SWEEPS[args.layout]
    x = inputs(args.layout)
    rows = []
    default = dict(tiles.TILES)
    timed = cases(x)
    for name, (kernel, fwd, bwd, (ref, ref_args), bytes_f, bytes_b) in timed.items():
        sweep = [tiles.Tile(e, w, inner) for e, w, inner in
                 itertools.product(args.elements or sweep_elements, args.warps or sweep_warps, orders)]
        if name in SHIFTED:
            sweep += [tiles.Tile(e, w, inner, gather_next=True) for e, w, inner in
                      itertools.product(args.gather_elements, args.gather_warps, orders)]
        rows += [fused_row(name, kernel, fwd, bwd, bytes_f, bytes_b, tile) for tile in sweep]
        tiles.TILES.update(default)
        if args.no_inductor:
            continue
        f, fb = inductor_ms(ref, ref_args, x["dy"])
        rows.append(dict(case=name, provider="inductor", fwd_ms=f, bwd_ms=fb - f, fwd_bwd_ms=fb))
        print(f"{name:14s} inductor  fwd {f:.4f} ms  fwd+bwd {fb:.4f} ms", flush=True)
    print_best(rows, timed, default)
    with open(args.out, "w") as fh:
        json.dump(dict(environment=environment(), layout=args.layout, shape=dict(B=B, T=T, H=H, D=D), rows=rows),
                  fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
