"""SM clock and power through each model's timed training steps, from the samples `gpu_bench.sh power` takes.

The GPU runs at its power cap through a 125M step at 16K (700 W on the H100), where the driver lowers the SM
clock; a model that draws more power per unit of work runs at a lower clock, and the bench's step ratio carries
that. This reads nvidia-smi's samples (``--query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu
--format=csv,nounits -lms 100`` under TZ=UTC) and the phases file (``<name> start|end <unix seconds>`` lines),
keeps each phase's samples above --busy-watts (its timed steps and profiled step: compilation draws far less) and
prints their clock and power.

    python scripts/power_clocks.py OUT/smi.csv OUT/phases.txt [--busy-watts 300] [--json OUT/power.json]
"""
from __future__ import annotations

import argparse
import csv
import datetime
import json
import statistics


def samples(path: str) -> list[tuple[float, int, float, int]]:
    """(unix seconds, SM MHz, watts, degrees C) of each sample line; lines that are not samples are passed over."""
    rows = []
    with open(path, newline="") as f:
        for r in csv.reader(f):
            try:
                when = datetime.datetime.strptime(r[0].strip(), "%Y/%m/%d %H:%M:%S.%f")
                rows.append((when.replace(tzinfo=datetime.timezone.utc).timestamp(), int(r[1]), float(r[2]),
                             int(r[3])))
            except (ValueError, IndexError):  # the header, a "[N/A]", a cut last line
                continue
    return rows


def phases(path: str) -> dict[str, tuple[float, float]]:
    """{name: (start, end)} of the phases file, in the order written."""
    seen: dict[str, dict[str, float]] = {}
    with open(path) as f:
        for line in f:
            name, what, when = line.split()
            seen.setdefault(name, {})[what] = float(when)
    return {name: (p["start"], p["end"]) for name, p in seen.items() if {"start", "end"} <= p.keys()}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("smi")
    p.add_argument("phases")
    p.add_argument("--busy-watts", type=float, default=300.0,
                   help="samples above this draw count as training steps (compilation draws ~100-250 W on an H100)")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    rows, result = samples(args.smi), {}
    print("phase | busy samples | seconds | SM MHz median (min-max) | W median (max) | max C")
    for name, (start, end) in phases(args.phases).items():
        busy = [r for r in rows if start <= r[0] <= end and r[2] > args.busy_watts]
        if not busy:
            print(f"{name} | 0 | - | - | - | -")
            continue
        mhz, watts = [r[1] for r in busy], [r[2] for r in busy]
        result[name] = {"samples": len(busy), "seconds": round(busy[-1][0] - busy[0][0], 2),
                        "mhz_median": statistics.median(mhz), "mhz_min": min(mhz), "mhz_max": max(mhz),
                        "watts_median": statistics.median(watts), "watts_max": max(watts),
                        "celsius_max": max(r[3] for r in busy)}
        s = result[name]
        print(f"{name} | {s['samples']} | {s['seconds']} | {s['mhz_median']:g} ({s['mhz_min']}-{s['mhz_max']}) | "
              f"{s['watts_median']:.0f} ({s['watts_max']:.0f}) | {s['celsius_max']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"busy_watts": args.busy_watts, "phases": result}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
