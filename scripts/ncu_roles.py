"""Split a Gluon kernel's stall samples by warp role, from Nsight Compute's SASS page as CSV.

    python scripts/ncu_roles.py docs/bench/ncu_sass_53434a6_h200/ncu_sass_*.csv.xz

Input: `ncu --import REPORT --page source --csv --print-source sass` of a report with the SourceCounters section
(`bash scripts/gpu_bench.sh ncusass` writes one per D 64 kernel), plain or xz-compressed. Gluon's warp_specialize
compiles each partition into its own stretch of SASS, each opened by a `USETMAXREG` (the register count it asks
for), so the stretches are the roles: one holding wgmma (`HGMMA`) is a consumer warpgroup, one holding TMA loads
(`UTMALDG`) and no wgmma the loader, the rest set-up. The out-of-line mbarrier wait loops that ptxas places after
`EXIT` count for the stretch their closing branch returns to. Within each role the samples are classed by what the
warps were on: waiting for their wgmma (`WARPGROUP.DEPBAR` / `ARRIVE`), issuing it, waiting on an mbarrier (the
`SYNCS.PHASECHK` poll and its branch), a named barrier between warps (`BAR.SYNC`), the exponential (`MUFU`), shared
/ global / local memory, or other arithmetic. Prints one markdown table per kernel.
"""
from __future__ import annotations

import argparse
import csv
import lzma
import re
from collections import defaultdict

CLASSES = ("wgmma wait", "wgmma issue", "mbarrier wait", "named barrier", "MUFU", "memory", "other")
_MEMORY = re.compile(r"^(LDS|STS|LDSM|STSM|LDG|STG|LDL|STL|LD|ST|ATOM|RED|LDGSTS)\b")


def opcode(source: str) -> str:
    """The instruction's opcode with its modifiers, without a guard predicate (@P0, @!UP1)."""
    parts = source.split()
    if parts and parts[0].startswith("@"):
        parts = parts[1:]
    return parts[0] if parts else ""


def instruction_class(source: str, wait_loops: set[int]) -> str:
    """One of CLASSES. ``wait_loops``: addresses of the out-of-line mbarrier wait loops; a branch into one is the
    poll failing."""
    op = opcode(source)
    if op.startswith("WARPGROUP"):
        return "wgmma wait"
    if op.startswith("HGMMA"):
        return "wgmma issue"
    target = source.split()[-1]
    if op.startswith("SYNCS.PHASECHK") or (op == "BRA" and target.startswith("0x") and int(target, 16) in wait_loops):
        return "mbarrier wait"
    if op.startswith("BAR."):
        return "named barrier"
    if op.startswith("MUFU"):
        return "MUFU"
    if _MEMORY.match(op):
        return "memory"
    return "other"


def read(path: str) -> tuple[list[dict], list[str]]:
    """Rows (address, source, samples, stall reasons) of one kernel's SASS page, and the stall reason names."""
    with (lzma.open if path.endswith(".xz") else open)(path, "rt", newline="") as f:
        rows = list(csv.reader(f))
    header = next(i for i, r in enumerate(rows) if r and r[0] == "Address")
    names = rows[header]
    reasons = [n for n in names if n.startswith("stall_") and "(Not Issued)" not in n]
    col = {n: names.index(n) for n in names}
    out = []
    for r in rows[header + 1:]:
        if len(r) < len(names) or not r[col["Address"]].startswith("0x"):
            continue

        def num(name):
            value = r[col[name]].replace(",", "")
            return float(value) if value else 0.0

        out.append({"address": int(r[col["Address"]], 16), "source": r[col["Source"]].strip(),
                    "samples": num("Warp Stall Sampling (All Samples)"),
                    "reasons": {n: num(n) for n in reasons}})
    return out, reasons


def exit_index(rows: list[dict]) -> int:
    """Index of the kernel's last EXIT: the out-of-line wait loops follow it."""
    return max((i for i, r in enumerate(rows) if opcode(r["source"]) == "EXIT"), default=len(rows) - 1)


def roles(rows: list[dict]) -> list[str]:
    """The role of each instruction: "consumer N", "loader" or "set-up"."""
    starts = [i for i, r in enumerate(rows) if "USETMAXREG" in r["source"]] + [len(rows)]
    exit_at = exit_index(rows)
    stretch = [0] * len(rows)  # index of the stretch each instruction lies in (0: before the first USETMAXREG)
    for n, (a, b) in enumerate(zip(starts, starts[1:]), start=1):
        for i in range(a, min(b, exit_at + 1)):
            stretch[i] = n
    # wait loops after EXIT: each ends in a branch back into the stretch it was taken from
    by_address = {r["address"]: i for i, r in enumerate(rows)}
    i = exit_at + 1
    while i < len(rows):
        j = i
        while j < len(rows) and not (opcode(rows[j]["source"]) == "BRA" and not rows[j]["source"].startswith("@")):
            j += 1
        target = rows[j]["source"].split()[-1] if j < len(rows) else ""
        home = stretch[by_address[int(target, 16)]] if target.startswith("0x") and int(target, 16) in by_address else 0
        for k in range(i, min(j + 1, len(rows))):
            stretch[k] = home
        i = j + 1
    ops = defaultdict(set)
    for r, s in zip(rows, stretch):
        ops[s].add(opcode(r["source"]).split(".")[0])
    names, consumers = {}, 0
    for s in sorted(ops):
        if "HGMMA" in ops[s]:
            consumers += 1
            names[s] = f"consumer {consumers}"
        elif "UTMALDG" in ops[s]:
            names[s] = "loader"
        else:
            names[s] = "set-up"
    return [names[s] for s in stretch]


def table(path: str) -> str:
    rows, reasons = read(path)
    role_of = roles(rows)
    total = sum(r["samples"] for r in rows) or 1.0
    by_role = defaultdict(lambda: defaultdict(float))
    reason_by_role = defaultdict(lambda: defaultdict(float))
    wait_loops = {r["address"] for r in rows[exit_index(rows) + 1:]
                  if opcode(r["source"]).startswith("SYNCS.PHASECHK")}
    for r, role in zip(rows, role_of):
        by_role[role][instruction_class(r["source"], wait_loops)] += r["samples"]
        for n, v in r["reasons"].items():
            reason_by_role[role][n] += v
    kernel = path.rsplit("/", 1)[-1].removeprefix("ncu_sass_").split(".csv")[0]
    lines = [f"{kernel}: {int(total)} samples", "",
             "| role | share | " + " | ".join(CLASSES) + " | top stall reasons |",
             "|---|---|" + "---|" * len(CLASSES) + "---|"]
    for role in sorted(by_role, key=lambda x: (x == "set-up", x == "loader", x)):
        n = sum(by_role[role].values())
        if n == 0:
            continue
        top = sorted(reason_by_role[role].items(), key=lambda kv: -kv[1])[:3]
        reason_total = sum(reason_by_role[role].values()) or 1.0
        lines.append(f"| {role} | {100 * n / total:.1f}% | "
                     + " | ".join(f"{100 * by_role[role][c] / n:.0f}%" for c in CLASSES)
                     + " | " + ", ".join(f"{k.removeprefix('stall_')} {100 * v / reason_total:.0f}%" for k, v in top)
                     + " |")
    consumer_ops = defaultdict(float)
    for r, role in zip(rows, role_of):
        if role.startswith("consumer"):
            consumer_ops[opcode(r["source"]).split(".")[0]] += r["samples"]
    n = sum(consumer_ops.values()) or 1.0
    top = sorted(consumer_ops.items(), key=lambda kv: -kv[1])[:8]
    lines += ["", "consumers' samples by opcode: " + ", ".join(f"{op} {100 * v / n:.1f}%" for op, v in top)]
    return "\n".join(lines)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("csv", nargs="+", help="SASS pages as CSV (ncu --page source --csv --print-source sass)")
    for path in p.parse_args(argv).csv:
        print(table(path), end="\n\n")


if __name__ == "__main__":
    main()
