"""Instruction counts of the Gluon kernels' inner loops, from the sm_90a SASS (no GPU needed).

    PYTHONPATH=src python scripts/sass_blocks.py dkdv-D64-bfloat16 dq-D64-bfloat16-fused   # names: aot's variants

Compiles each variant as aot.py does, disassembles it (cuobjdump -sass, shipped with Triton), and prints the basic
blocks of every innermost loop that issues wgmma (the consumers' tile loops): instructions and the opcodes that
bound these kernels. A tile that takes one branch of the loop runs the blocks on that path; docs/bench/history.md sums
the first consumer's blocks of the unmasked path. Needs a Triton with Gluon's Hopper API (3.6 for the H200's code).
"""
from __future__ import annotations

import collections
import re
import sys

OPS = ("HGMMA", "MUFU", "FFMA", "FADD", "FMUL", "FSEL", "F2FP", "LDL", "STL", "LDS", "BAR")


def sass(name: str) -> list[tuple[int, str]]:
    """(address, instruction) of the variant's SASS."""
    from foxformer.ops.forgetting_attn.hopper.aot import compile_launch, cuobjdump
    from foxformer.ops.forgetting_attn.hopper.launch import variant_launches

    text = cuobjdump(compile_launch(dict(variant_launches())[name]), "-sass")
    return [(int(m.group(1), 16), m.group(2).strip())
            for m in re.finditer(r"^\s*/\*([0-9a-f]{4,})\*/\s+(.*?);", text, re.M)]


def _target(ins: str) -> int | None:
    if "BRA" not in ins and "EXIT" not in ins:
        return None
    m = re.search(r"0x([0-9a-f]+)\s*$", ins)
    return int(m.group(1), 16) if m else -1


def _opcode(ins: str) -> str:
    return re.sub(r"^@!?U?P\w+\s+", "", ins).split()[0].split(".")[0]


def inner_loops(code: list[tuple[int, str]]) -> list[list[list[tuple[int, str]]]]:
    """The basic blocks of each innermost loop (a backward branch with no other loop inside) that issues wgmma."""
    leaders, loops = {code[0][0]}, []
    for i, (addr, ins) in enumerate(code):
        tgt = _target(ins)
        if tgt is None:
            continue
        if tgt >= 0:
            leaders.add(tgt)
            if tgt < addr:
                loops.append((tgt, addr))
        if i + 1 < len(code):
            leaders.add(code[i + 1][0])
    innermost = [(a, b) for a, b in loops if not any(a <= c and d <= b and (c, d) != (a, b) for c, d in loops)]
    out = []
    for lo, hi in sorted(innermost):
        body = [(a, ins) for a, ins in code if lo <= a <= hi]
        if not any(_opcode(ins) == "HGMMA" for _, ins in body):
            continue
        blocks, cur = [], []
        for a, ins in body:
            if a in leaders and cur:
                blocks.append(cur)
                cur = []
            cur.append((a, ins))
        out.append(blocks + [cur])
    return out


def main(names: list[str]) -> int:
    if not names or names[0] in ("-h", "--help"):
        print(__doc__, file=sys.stderr)
        return 0 if names else 2
    from foxformer.ops.forgetting_attn.hopper.launch import variant_launches

    known = dict(variant_launches())
    unknown = [n for n in names if n not in known]
    if unknown:
        print(f"error: unknown variants {unknown}; aot's variants are: {', '.join(sorted(known))}", file=sys.stderr)
        return 2
    for name in names:
        print(f"== {name}")
        for n, blocks in enumerate(inner_loops(sass(name))):
            print(f"  loop {n}: {blocks[0][0][0]:#x}-{blocks[-1][-1][0]:#x}")
            for block in blocks:
                c = collections.Counter(_opcode(ins) for _, ins in block)
                print(f"    {block[0][0]:#07x}: {len(block):5d} instr  " + "  ".join(f"{op} {c[op]}" for op in OPS))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
