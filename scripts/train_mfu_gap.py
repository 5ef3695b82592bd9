"""The training loop's MFU against `foxformer bench model`'s for the same preset (issue 17: within 2 points).

    python scripts/train_mfu_gap.py RUN/metrics.jsonl model_125m_compiled_h200.json [--preset fox-pro-125m]

The loop's figure is the median over its steady steps (the first --skip steps compile); both count FLOPs by the
paper's formula (models.presets.training_flops_per_token) against the same peak.
"""

from __future__ import annotations

import argparse
import json
import statistics


def loop_mfu(metrics_path: str, skip: int) -> tuple[float, int]:
    """Median MFU of the train records after the first `skip` steps, and how many steps that median covers."""
    with open(metrics_path, encoding="utf-8") as f:
        recs = [json.loads(line) for line in f if line.strip()]
    steady = [r["mfu"] for r in recs if r.get("kind") == "train" and r["step"] > skip and r.get("mfu") is not None]
    if not steady:
        raise SystemExit(f"{metrics_path}: no train steps with an MFU after step {skip}")
    return statistics.median(steady), len(steady)


def bench_mfu(bench_path: str, preset: str) -> float:
    with open(bench_path, encoding="utf-8") as f:
        rows = json.load(f)["results"]
    for row in rows:
        if row.get("preset") == preset and row.get("mfu") is not None:
            return row["mfu"]
    raise SystemExit(f"{bench_path}: no row with an MFU for {preset} (rows: {[r.get('preset') for r in rows]})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("metrics", help="the training run's metrics.jsonl")
    ap.add_argument("bench", help="`foxformer bench model --out` JSON of the same setting")
    ap.add_argument("--preset", default="fox-pro-125m")
    ap.add_argument("--skip", type=int, default=3, help="steps left out at the start (compilation)")
    ap.add_argument("--points", type=float, default=2.0, help="the largest gap that passes, in MFU points")
    args = ap.parse_args()
    loop, n = loop_mfu(args.metrics, args.skip)
    bench = bench_mfu(args.bench, args.preset)
    gap = 100 * (bench - loop)
    verdict = "within" if abs(gap) <= args.points else "outside"
    print(f"{args.preset}: training loop {100 * loop:.1f}% MFU (median of {n} steps), bench {100 * bench:.1f}%: "
          f"gap {gap:+.1f} points, {verdict} {args.points:g}")


if __name__ == "__main__":
    main()
