"""Compile the Gluon kernels for sm_90a without a GPU.

CI has no GPU, but Triton compiles Gluon for any target. ``compile_launch`` takes the very launch a
launcher would make (kernel, arguments, constexprs and options, built from CPU tensors) and returns
Triton's compiled kernel: its cubin, PTX, register count and spills. Tests compile every variant the
dispatcher can pick; ``python -m foxformer.ops.forgetting_attention.hopper.aot`` prints their resources
(``--json`` for the tests). Run it in a process without ``TRITON_INTERPRET=1``: the interpreter swaps
Triton's library functions for interpreted ones, and Gluon compiles then fail after the first.
"""
from __future__ import annotations

import re

from dataclasses import dataclass

import torch

from .compat import TensorDescriptor

_DTYPES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32", torch.float64: "fp64",
           torch.int32: "i32", torch.int64: "i64"}


@dataclass(frozen=True)
class Launch:
    """One kernel launch: what a launcher passes to ``kernel[grid](*args, **constexprs, **options)``."""

    kernel: object
    grid: tuple
    args: tuple
    constexprs: dict
    options: dict

    def run(self):
        """Launch on the current CUDA stream."""
        self.kernel[self.grid](*self.args, **self.constexprs, **self.options)


def _arg_type(a) -> str:
    if isinstance(a, torch.Tensor):
        return "*" + _DTYPES[a.dtype]
    if isinstance(a, TensorDescriptor):
        block = ",".join(str(b) for b in a.block_shape)
        return f"tensordesc<{_DTYPES[a.base.dtype]}[{block}],{a.layout!r}>"
    if isinstance(a, bool):
        return "i1"
    if isinstance(a, int):
        return "i32" if -(2**31) <= a < 2**31 else "i64"
    if isinstance(a, float):
        return "fp32"
    raise TypeError(f"no Triton signature type for {type(a).__name__}")


def compile_launch(launch: Launch, capability: int = 90):
    """Compile a launch for ``sm_{capability}a`` (CUDA, 32-thread warps); returns Triton's CompiledKernel."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    fn = launch.kernel
    names = fn.arg_names
    runtime_names = [n for n in names if n not in launch.constexprs]
    if len(runtime_names) != len(launch.args):
        raise ValueError(f"{fn.__name__}: {len(launch.args)} arguments for parameters {runtime_names}")
    signature = {n: _arg_type(a) for n, a in zip(runtime_names, launch.args)}
    for n in launch.constexprs:
        signature[n] = "constexpr"
    signature = {n: signature[n] for n in names}
    src = GluonASTSource(fn, signature, dict(launch.constexprs))
    return triton.compile(src, target=GPUTarget("cuda", capability, 32), options=dict(launch.options))


def resources(compiled) -> dict:
    """What the cubin needs: registers per thread at launch, local memory (spills: 0 when none), shared
    memory, whether the Hopper instructions the kernels are built on made it into the code, and the shared-memory
    offsets of the mbarriers the SASS initializes."""
    import subprocess
    import tempfile
    from pathlib import Path

    import triton

    cuobjdump = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        usage = subprocess.run([str(cuobjdump), "--dump-resource-usage", f.name], capture_output=True,
                               text=True, check=True).stdout
        sass = subprocess.run([str(cuobjdump), "-sass", f.name], capture_output=True, text=True, check=True).stdout
    fields = dict(item.split(":", 1) for item in usage.split() if ":" in item and item.split(":", 1)[1].isdigit())
    # mbarrier inits (SYNCS.EXCH.64) at their shared-memory offsets
    inits = sorted({int(m.group(1) or "0", 16)
                    for m in re.finditer(r"SYNCS\.EXCH\.64\s+URZ,\s*\[UR\d+(?:\+0x([0-9a-f]+))?\]", sass)})
    ptx = compiled.asm["ptx"]
    return {
        "registers": int(fields.get("REG", -1)),
        "local_bytes": int(fields.get("LOCAL", 0)) + int(fields.get("STACK", 0)),
        "shared_bytes": compiled.metadata.shared,
        "wgmma": ptx.count("wgmma.mma_async"),
        "tma": "cp.async.bulk.tensor" in ptx,
        "setmaxnreg": "setmaxnreg" in ptx,
        "fp_fusion": bool(compiled.metadata.enable_fp_fusion),
        "barrier_offsets": inits,
    }


def _compile_one(name: str) -> dict:
    from .launch import variant_launches

    launch = dict(variant_launches())[name]
    return {"name": name, **resources(compile_launch(launch))}


def main(argv=None) -> int:
    import argparse
    import json
    import sys
    from concurrent.futures import ProcessPoolExecutor

    from .launch import variant_names

    p = argparse.ArgumentParser(description="Compile every Gluon kernel variant for sm_90a (no GPU needed).")
    p.add_argument("--json", action="store_true", help="print one JSON list instead of a table")
    p.add_argument("--jobs", type=int, default=1, help="compile in this many processes")
    p.add_argument("--only", default="", help="compile only the variants whose name contains this")
    args = p.parse_args(argv)
    names = [n for n in variant_names() if args.only in n]
    if args.jobs > 1:
        with ProcessPoolExecutor(args.jobs) as pool:
            rows = list(pool.map(_compile_one, names))
    else:
        rows = [_compile_one(n) for n in names]
    if args.json:
        json.dump(rows, sys.stdout)
        return 0
    cols = ["name", "registers", "local_bytes", "shared_bytes", "wgmma", "tma", "setmaxnreg", "fp_fusion"]
    print(" | ".join(cols))
    for r in rows:
        print(" | ".join(str(r[c]) for c in cols))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
