"""One training step's kernel time by category, one bar per model row, from the operator tables that
`foxformer bench model --profile DIR` writes (DIR/<row>.txt).

    python scripts/step_breakdown.py docs/bench/profile_model_joint_b4e0df1_h100 \
        --out docs/bench/step_breakdown_b4e0df1_h100.png [--rows fox-pro-125m,transformer-llama-125m]

Only kernel rows count: an operator row (aten::mm, foxformer::forgetting_attention_bwd) carries the same self
device time as the kernels it launches, and Inductor's launcher rows repeat their kernel's name and time. The
tables list their top rows only, so "other" also holds what the table's own "Self CUDA time total" has beyond the
listed kernels (memsets among them): the bars sum to that total.
"""
import argparse
import os
import re

import matplotlib

matplotlib.use("Agg")  # files only: no display on a GPU machine or in CI
import matplotlib.pyplot as plt  # noqa: E402

# First match wins. The anchors keep Inductor's kernels named after a Pro op they fused around
# (triton_poi_fused_shift_norm_...) as Inductor's, and the Pro ops as the Triton kernels foxformer wrote.
CATEGORIES = {
    "attention fwd": r"^fwd_kernel|_fprop_",
    "attention bwd": r"^dkdv_kernel|^dq_kernel|_bprop_|compute_dot_do_o|convert_dq",  # cuDNN's helpers too
    "matrix products": r"^nvjet|cutlass|sm90_xmma|cublasLt::splitKreduce",
    "Pro ops": r"^_shift_norm_|^_gate_norm_",
    "Inductor": r"^triton_",
}
OTHER = "other / unlisted"
COLORS = ["#d62728", "#ff9896", "#1f77b4", "#2ca02c", "#9467bd", "#bbbbbb"]
UNIT = {"s": 1e3, "ms": 1.0, "us": 1e-3, "ns": 1e-6}


def ms(text: str) -> float:
    num, unit = re.fullmatch(r"([\d.]+)(s|ms|us|ns)", text).groups()
    return float(num) * UNIT[unit]


def parse(path: str) -> dict:
    """{category: ms a step} for one table, plus "total" (the table's own, a step)."""
    lines = open(path).read().splitlines()
    width = len(lines[0].split()[0])  # the Name column's dashes: names may hold spaces
    rule = [i for i, line in enumerate(lines) if line.startswith("-" * width)]
    cols = lines[rule[0] + 1][width:].split("  ")
    cols = [c.strip() for c in cols if c.strip()]
    out = dict.fromkeys([*CATEGORIES, OTHER], 0.0)
    for line in lines[rule[1] + 1:rule[2]]:
        name, row = line[:width].strip(), dict(zip(cols, line[width:].split()))
        # Kernels run no host time; a device-side user annotation (Optimizer.step#AdamW.step) doesn't either,
        # but spans kernels already counted, and the table's total leaves it out too.
        if ms(row["Self CPU"]) or ms(row["CPU total"]) or "#" in name:
            continue
        cat = next((c for c, p in CATEGORIES.items() if re.search(p, name)), OTHER)
        out[cat] += ms(row["Self CUDA"])
    total = ms(re.search(r"^Self CUDA time total: (\S+)$", "\n".join(lines), re.M).group(1))
    listed = sum(out.values())
    assert listed <= total + 1e-3, f"{path}: listed kernels {listed:.3f} ms over the table's total {total:.3f}"
    out[OTHER] += total - listed
    out["total"] = total
    steps = re.search(r"^timeline over (\d+) step", "\n".join(lines), re.M)
    n = int(steps.group(1)) if steps else 1
    return {k: v / n for k, v in out.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dirs", nargs="+")
    ap.add_argument("--out", required=True, help="PNG path")
    ap.add_argument("--rows", help="comma-separated row names (file names without .txt), in this order")
    args = ap.parse_args()
    wanted = args.rows.split(",") if args.rows else None
    bars = []
    for d in args.dirs:
        names = sorted(f[:-4] for f in os.listdir(d) if f.endswith(".txt"))
        for name in (wanted if wanted else names):
            if name in names:
                label = name if len(args.dirs) == 1 else f"{os.path.basename(os.path.normpath(d))}: {name}"
                bars.append((label, parse(os.path.join(d, name + ".txt"))))
    if not bars:
        raise SystemExit("no tables matched")
    keys = [*CATEGORIES, OTHER]
    w = max(len(label) for label, _ in bars)
    print(f"{'ms a step':<{w}}  " + "  ".join(f"{k:>{max(len(k), 7)}}" for k in [*keys, "total"]))
    for label, r in bars:
        print(f"{label:<{w}}  " + "  ".join(f"{r[k]:>{max(len(k), 7)}.1f}" for k in [*keys, "total"]))

    fig, ax = plt.subplots(figsize=(10, 1.2 + 0.7 * len(bars)))
    y = range(len(bars))[::-1]  # first row on top
    left = [0.0] * len(bars)
    for k, c in zip(keys, COLORS):
        vals = [r[k] for _, r in bars]
        ax.barh(y, vals, left=left, color=c, label=k, edgecolor="white", linewidth=0.5)
        left = [start + v for start, v in zip(left, vals)]
    for yi, (_, r) in zip(y, bars):
        ax.text(r["total"] * 1.005, yi, f"{r['total']:.1f} ms", va="center", fontsize=9)
    ax.set_yticks(list(y), [label for label, _ in bars])
    ax.set_xlim(0, max(r["total"] for _, r in bars) * 1.12)
    ax.set_xlabel("kernel time of one training step, ms (Self CUDA; bars sum to the table's total)")
    ax.set_title(", ".join(os.path.basename(os.path.normpath(d)) for d in args.dirs), fontsize=10)
    ax.legend(ncol=len(keys), fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.12 - 0.3 / len(bars)),
              frameon=False)
    fig.savefig(args.out, dpi=110, bbox_inches="tight")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
