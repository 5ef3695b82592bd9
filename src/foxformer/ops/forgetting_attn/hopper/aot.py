"""Compile the Gluon kernels for sm_90a without a GPU.

CI has no GPU, but Triton compiles Gluon for any target. ``compile_launch`` takes the very launch a
launcher would make (kernel, arguments, constexprs and options, built from CPU tensors) and returns
Triton's compiled kernel: its cubin, PTX, register count and spills. Tests compile every variant the
dispatcher can pick; ``python -m foxformer.ops.forgetting_attn.hopper.aot`` prints their resources
(``--json`` for the tests). Run it in a process without ``TRITON_INTERPRET=1``: the interpreter swaps
Triton's library functions for interpreted ones, and Gluon compiles then fail after the first.
"""
from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Launch:
    """One kernel launch: what a launcher passes to ``kernel[grid](*args, **constexprs, **options)``."""

    kernel: object
    grid: tuple
    args: tuple
    constexprs: dict
    options: dict

    def run(self):
        """Launch on the current CUDA stream; returns Triton's compiled kernel (its ``n_spills``: local memory in
        4-byte words, from the driver)."""
        return self.kernel[self.grid](*self.args, **self.constexprs, **self.options)


def compile_launch(launch: Launch, capability: int = 90):
    """Compile a launch for ``sm_{capability}a`` (CUDA, 32-thread warps); returns Triton's CompiledKernel.

    The signature, constants and alignment attributes come from Triton's own launch binder, so the code is what
    ``launch.run()`` compiles on a GPU: the runtime marks each 16-byte-aligned pointer, and without that mark the
    compiler cannot prove a vector access aligned (the CPU's SASS would show scalar loads and stores where the
    GPU's has vectors)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import make_backend
    from triton.experimental.gluon._runtime import GluonASTSource
    from triton.runtime.jit import create_function_from_signature

    fn = launch.kernel
    target = GPUTarget("cuda", capability, 32)
    backend = make_backend(target)
    runtime_names = [n for n in fn.arg_names if n not in launch.constexprs]
    if len(runtime_names) != len(launch.args):
        raise ValueError(f"{fn.__name__}: {len(launch.args)} arguments for parameters {runtime_names}")
    kwargs = {**launch.constexprs, **launch.options}
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    bound, specialization, options = binder(*launch.args, **kwargs)
    options, signature, constexprs, attrs = fn._pack_args(backend, kwargs, bound, specialization, options)
    src = GluonASTSource(fn, signature, constexprs, attrs)
    return triton.compile(src, target=target, options=options.__dict__)


def cuobjdump(compiled, *flags: str) -> str:
    """What the cuobjdump shipped with Triton prints for the compiled kernel's cubin (``-sass``: its SASS)."""
    import subprocess
    import tempfile
    from pathlib import Path

    import triton

    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        return subprocess.run([str(tool), *flags, f.name], capture_output=True, text=True, check=True).stdout


def resources(compiled) -> dict:
    """What the cubin needs: registers per thread at launch, local memory (spills: 0 when none), shared
    memory, whether the Hopper instructions the kernels are built on made it into the code, the shared-memory
    offsets of the mbarriers the SASS initializes, and its global loads and stores of single 16-bit elements
    (every [B, T, H, D] row the kernels touch outside TMA moves in 16-byte vectors: common.row_starts)."""
    usage = cuobjdump(compiled, "--dump-resource-usage")
    sass = cuobjdump(compiled, "-sass")
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
        "scalar_16bit_global": len(re.findall(r"\b(?:LDG|STG)\.E\.U16\b", sass)),
    }


def _compile_one(name: str) -> dict:
    from .launch import variant_launches

    launch = dict(variant_launches())[name]
    return {"name": name, "max_free": bool(launch.constexprs.get("MAX_FREE")), **resources(compile_launch(launch))}


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
