"""The Gluon Hopper backend without a GPU: every kernel variant compiles for sm_90a, and the dispatcher
sends each case where it belongs. Correctness on the GPU: tests/gpu/test_gluon_gpu.py."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from foxformer import forgetting_attention
from foxformer.ops.forgetting_attn.checks import resolve_backend
from foxformer.ops.forgetting_attn.hopper import compat, dispatch

SRC = Path(__file__).resolve().parents[2] / "src"
needs_gluon = pytest.mark.skipif(not compat.AVAILABLE, reason=compat.MISSING_REASON or "no Gluon")


@needs_gluon
def test_compat_resolves_the_installed_tritons_names():
    for fn in (compat.tma_load, compat.tma_store, compat.thread_barrier):
        assert callable(fn)
    # The 3.6 spellings raise from 3.9 on: the shim must never pick a name that only warns or raises.
    import triton.experimental.gluon.language.nvidia.hopper.tma as tma
    if hasattr(tma, "async_load"):
        assert compat.tma_load is tma.async_load


# Local memory (spills) each kernel may use: a guard against register blow-ups, set above what ptxas 12.8
# (Triton 3.6) and 13.x (3.9) use today (at most 176 bytes in any variant, 2026-12-01; the persistent D 64 dk/dv
# kernel 352 bytes with either since the compiles carry a GPU launch's pointer alignment, 2026-12-04). The dk/dv
# kernel keeps tiles that spill a little because they ran faster (launch.BWD_CONFIGS). The forward's is tight: it
# keeps P in registers while its wgmma runs (FwdConfig.overlap), the configs that passed the GPU tests spill at most
# 16 bytes (scalars, Triton 3.6), and a D 64 config spilling 24 bytes gave wrong output on the H200 (the bound is
# launch.FWD_LOCAL_BYTES; a max-free forward beyond it is run again with the row maximum: gluon_forward, tested
# below, so those may spill: 88 bytes at D 128 with Triton 3.9, none with 3.6). The D 64 dq
# kernel's split loops (the default since the thirty-second session: the backward 1% faster on Triton 3.6, where they
# spill 56 / 112 bytes unpruned / pruned) spill 80 / 144 bytes with Triton 3.9, against 0 / 16 in one loop.
LOCAL_BUDGET = {"fwd": 16, "dq": 160, "dkdv": 512}
MAX_FREE_BUDGET = 128
VARIANTS = [] if not compat.AVAILABLE else __import__(
    "foxformer.ops.forgetting_attn.hopper.launch", fromlist=["variant_names"]).variant_names()


@pytest.fixture(scope="module")
def compiled():
    """Every variant compiled for sm_90a by aot.py's command, in fresh processes: the test session runs with
    TRITON_INTERPRET=1, under which Gluon compiles fail after the first."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "0"  # Triton 3.10's announced default: the launches must ask for FMAs
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, "-m", "foxformer.ops.forgetting_attn.hopper.aot", "--json",
                           "--jobs", str(min(4, os.cpu_count() or 1))],
                          capture_output=True, text=True, env=env, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {row["name"]: row for row in json.loads(proc.stdout)}


@needs_gluon
@pytest.mark.parametrize("name", VARIANTS)
def test_variant_compiles_for_sm90a(compiled, name):
    res = compiled[name]
    assert res["wgmma"] > 0 and res["tma"] and res["setmaxnreg"], res
    assert res["local_bytes"] <= (MAX_FREE_BUDGET if res["max_free"] else LOCAL_BUDGET[name.split("-")[0]]), res
    assert res["shared_bytes"] <= 227 * 1024, res
    assert res["fp_fusion"], res
    # Rows of O, dO, dQ, dK, dV move 16 bytes at a time: element by element, the D 64 forward's output stores used 8
    # times the sectors they need (Nsight Compute on the H200, docs/benchmarks.md "Where the rest is").
    assert res["scalar_16bit_global"] == 0, f"{name}: {res['scalar_16bit_global']} 2-byte global loads / stores"
    # Barriers that live through the kernel sit together; one the allocator placed elsewhere shares the space of a
    # buffer, so nothing uses it but its init, which can land after a TMA load there (bwd._dkdv_smem's docstring).
    offsets = res["barrier_offsets"]
    assert offsets and offsets[-1] - offsets[0] <= 16 * len(offsets), (
        f"{name}: mbarrier inits at {[hex(o) for o in offsets]}: a barrier apart from the others is one no "
        "partition uses (allocate it only on the path that waits on it)")


@needs_gluon
def test_row_strides_the_kernels_vectorize_are_checked():
    """common.row_starts rounds row offsets down to a multiple of 8 elements: a stride that is not one must stop the
    launch, not move rows."""
    from foxformer.ops.forgetting_attn.hopper.launch import packed_strides
    assert packed_strides(torch.empty(2, 17, 3, 64)) == (17 * 3 * 64, 3 * 64, 64)
    with pytest.raises(ValueError, match="multiples of 8"):
        packed_strides(torch.empty(2, 17, 3, 68)[..., :64])
    with pytest.raises(ValueError, match="multiples of 8"):
        packed_strides(torch.empty(2, 17, 64, 3).transpose(2, 3))


def test_variants_cover_every_dispatchable_case():
    if not VARIANTS:
        pytest.skip("no Gluon")
    from foxformer.ops.forgetting_attn.hopper.launch import dq_tails
    for kernel in ("fwd", "dkdv", "dq"):
        for D in dispatch.HEAD_DIMS:
            for dtype in ("bfloat16", "float16"):
                for tail in ("", "-varlen", "-prune", "-varlen-prune"):
                    for code in dq_tails(D) if kernel == "dq" else ("",):
                        assert f"{kernel}-D{D}-{dtype}{tail}{code}" in VARIANTS


@pytest.mark.parametrize("persistent", [False, True], ids=["one-a-tile", "persistent"])
@pytest.mark.parametrize("kernel", ["dkdv", "dq"])
def test_backward_schedules_launch(kernel, persistent):
    """A persistent backward kernel launches one CTA an SM (132 off the GPU, an H100 / H200) with a zeroed int32 task
    counter, never more CTAs than tiles; one CTA a tile launches every tile. Both schedules are compiled above."""
    if not VARIANTS:
        pytest.skip("no Gluon")
    import dataclasses

    from foxformer.ops.forgetting_attn.hopper import launch as L
    assert any(name.startswith(f"{kernel}-D64-") and name.endswith(("-persistent", "-one-a-tile")) for name in VARIANTS)
    cfg = dataclasses.replace(L.BWD_CONFIGS[64], dkdv_persistent=persistent, dq_persistent=persistent)
    for B, T, n_blocks in ((2, 300, 3), (4, 16384, 128)):
        q = torch.zeros(B, T, 4, 64, dtype=torch.bfloat16)
        k = torch.zeros(B, T, 2, 64, dtype=torch.bfloat16)
        c, vec = torch.zeros(B, 4, T, dtype=torch.float64), torch.zeros(B, 4, T)
        if kernel == "dkdv":
            launch, n_tasks = L.dkdv_launch(q, k, k, c, q, vec, vec, k, k, vec, vec, vec, 0.1, n_blocks, B, False,
                                            False, cfg), n_blocks * 2 * B
        else:
            launch, n_tasks = L.dq_launch(q, k, k, c, q, vec, vec, q, vec, vec, vec, 0.1, n_blocks, B, False, False,
                                          cfg, q), n_blocks * 4 * B
        assert launch.constexprs["PERSISTENT"] is persistent
        assert launch.args[-1] == n_tasks
        if persistent:
            counter = next(a for a in launch.args if isinstance(a, torch.Tensor) and a.dtype == torch.int32)
            assert counter.shape == (1,) and counter.item() == 0
            assert launch.grid == (min(n_tasks, 132),)
        else:
            assert launch.grid == (n_tasks,)


@pytest.mark.parametrize("Tq,Tk,varlen,expected", [(300, 300, False, True), (100, 300, False, False),
                                                     (300, 300, True, False)],
                         ids=["equal", "fewer-queries", "packed"])
def test_dkdv_equal_len_only_where_lengths_are_equal(Tq, Tk, varlen, expected):
    """BwdConfig.dkdv_equal_len makes the key offset of the queries a compile-time 0: a call with fewer queries than
    keys, or packed sequences (whose lengths the kernel reads), must get the general kernel."""
    if not VARIANTS:
        pytest.skip("no Gluon")
    import dataclasses

    from foxformer.ops.forgetting_attn.hopper import launch as L
    cfg = dataclasses.replace(L.BWD_CONFIGS[128], dkdv_equal_len=True)
    B = 1 if varlen else 2
    q = torch.zeros(B, Tq, 4, 128, dtype=torch.bfloat16)
    k = torch.zeros(B, Tk, 2, 128, dtype=torch.bfloat16)
    c, vec = torch.zeros(B, 4, Tk, dtype=torch.float64), torch.zeros(B, 4, Tk)
    cu = torch.tensor([0, Tq], dtype=torch.int32) if varlen else vec
    launch = L.dkdv_launch(q, k, k, c, q, vec, vec, k, k, vec, cu, vec, 0.1, 3, B, varlen, False, cfg)
    assert launch.constexprs["EQUAL_LEN"] is expected
    plain = dataclasses.replace(L.BWD_CONFIGS[128], dkdv_equal_len=False, dkdv_split_loops=False)
    off = L.dkdv_launch(q, k, k, c, q, vec, vec, k, k, vec, cu, vec, 0.1, 3, B, varlen, False, plain)
    assert off.constexprs["EQUAL_LEN"] is False
    # The split loops hold for any lengths: the flag reaches the kernel as it is.
    split = dataclasses.replace(L.BWD_CONFIGS[128], dkdv_split_loops=True)
    assert L.dkdv_launch(q, k, k, c, q, vec, vec, k, k, vec, cu, vec, 0.1, 3, B, varlen, False,
                         split).constexprs["SPLIT_LOOPS"] is True
    assert off.constexprs["SPLIT_LOOPS"] is False


@pytest.mark.parametrize("split", [False, True], ids=["one-loop", "split-loops"])
def test_forward_split_loops_reaches_the_kernel(split):
    """FwdConfig.split_loops is a compile-time switch of the forward, BwdConfig.dq_split_loops of the dq kernel
    (both settings of each are compiled above)."""
    if not VARIANTS:
        pytest.skip("no Gluon")
    import dataclasses

    from foxformer.ops.forgetting_attn.hopper import launch as L
    assert "fwd-D64-bfloat16-split-loops" in VARIANTS
    cfg = dataclasses.replace(L.FWD_CONFIGS[64], split_loops=split)
    q = torch.zeros(2, 300, 4, 64, dtype=torch.bfloat16)
    c, vec = torch.zeros(2, 4, 300, dtype=torch.float64), torch.zeros(2, 4, 300)
    launch = L.forward_launch(q, q, q, c, q, vec, vec, vec, 0.1, 3, 2, False, False, cfg)
    assert launch.constexprs["SPLIT_LOOPS"] is split
    # ... and BwdConfig.dq_split_loops of the dq kernel
    assert "dq-D64-bfloat16-fused-one-loop" in VARIANTS and "dkdv-D64-bfloat16-plain" in VARIANTS
    bwd = dataclasses.replace(L.BWD_CONFIGS[64], dq_split_loops=split)
    dq = L.dq_launch(q, q, q, c, q, vec, vec, q, vec, vec, vec, 0.1, 3, 2, False, False, bwd, q)
    assert dq.constexprs["SPLIT_LOOPS"] is split


def test_forward_max_free_options():
    """FwdConfig.max_free reaches the kernel as MAX_FREE, the redo launch as the regular kernel with REDO (every
    variant compiled above)."""
    if not VARIANTS:
        pytest.skip("no Gluon")
    import dataclasses

    from foxformer.ops.forgetting_attn.hopper import launch as L
    assert {f"fwd-D{D}-bfloat16{tail}" for D in (64, 128) for tail in ("-max-free", "-redo")} <= set(VARIANTS)
    cfg = dataclasses.replace(L.FWD_CONFIGS[64], max_free=True)
    q = torch.zeros(2, 300, 4, 64, dtype=torch.bfloat16)
    c, vec = torch.zeros(2, 4, 300, dtype=torch.float64), torch.zeros(2, 4, 300)
    free = L.forward_launch(q, q, q, c, q, vec, vec, vec, 0.1, 2, 2, False, False, cfg).constexprs
    assert (free["MAX_FREE"], free["REDO"]) == (True, False)
    redo = L.forward_launch(q, q, q, c, q, vec, vec, vec, 0.1, 2, 2, False, False,
                            dataclasses.replace(cfg, max_free=False), redo=True).constexprs
    assert (redo["MAX_FREE"], redo["REDO"]) == (False, True)


@pytest.mark.parametrize("spills", [4, 22], ids=["fits", "spills"])  # Triton's n_spills: 16 and 88 bytes
def test_a_spilling_max_free_forward_is_run_again_with_the_row_maximum(monkeypatch, spills):
    """gluon_forward's launches, with a compiled kernel that reports its local bytes: a max-free kernel within
    FWD_LOCAL_BYTES is followed by the redo launch; one beyond (D 128 with Triton 3.9) by the whole regular kernel, and
    that kernel shape (head dim, varlen, prune) is not launched max-free again; fp16 never is."""
    if not VARIANTS:
        pytest.skip("no Gluon")
    import dataclasses
    import types

    from foxformer.ops.forgetting_attn.hopper import launch as L
    monkeypatch.setattr(L, "_MAX_FREE_SPILLS", set())
    runs = []

    def fake_launch(*args, redo=False):
        cfg = args[-1]
        return types.SimpleNamespace(run=lambda: runs.append((cfg.max_free, redo)) or types.SimpleNamespace(
            n_spills=spills if cfg.max_free else 0))

    monkeypatch.setattr(L, "forward_launch", fake_launch)
    cfg = dataclasses.replace(L.FWD_CONFIGS[128], max_free=True)
    q = torch.zeros(1, 300, 2, 128, dtype=torch.bfloat16)
    c = torch.zeros(1, 2, 300, dtype=torch.float64)
    L.gluon_forward(q, q, q, c, 0.1, cfg=cfg)
    L.gluon_forward(q, q, q, c, 0.1, cfg=cfg)
    spilled = 4 * spills > L.FWD_LOCAL_BYTES
    again = [(False, False)] if spilled else [(True, False), (False, True)]
    assert runs == [(True, False), (False, False) if spilled else (False, True)] + again
    runs.clear()
    L.gluon_forward(q.half(), q.half(), q.half(), c, 0.1, cfg=cfg)
    assert runs == [(False, False)]


@pytest.mark.parametrize("capability,dtype,D,expected", [
    ((9, 0), torch.bfloat16, 64, None),
    ((9, 0), torch.float16, 128, None),
    ((9, 0), torch.bfloat16, 96, "head dim"),
    ((9, 0), torch.float32, 64, "float16 or bfloat16"),
    ((8, 0), torch.bfloat16, 64, "sm_80"),
    ((10, 0), torch.bfloat16, 64, "sm_100"),
    (None, torch.bfloat16, 64, "CPU"),
], ids=["h100-bf16-d64", "h100-fp16-d128", "d96", "fp32", "a100", "blackwell", "cpu"])
def test_static_reason(capability, dtype, D, expected):
    reason = dispatch.static_reason(dtype, D, capability)
    if expected is None:
        assert reason is None
    else:
        assert expected in reason


def test_layout_reason_packed_heads_only():
    q = torch.zeros(2, 33, 4, 64, dtype=torch.bfloat16)
    assert dispatch.layout_reason(q=q) is None
    qkv = torch.zeros(2, 33, 4, 3, 64, dtype=torch.bfloat16)
    assert "packed heads" in dispatch.layout_reason(q=qkv[:, :, :, 0])
    fused = torch.zeros(2, 33, 3 * 4 * 64, dtype=torch.bfloat16).view(2, 33, 3, 4, 64)
    assert dispatch.layout_reason(k=fused[:, :, 1]) is None  # a q/k/v split of a fused projection
    odd = torch.zeros(2 * 33 * 4 * 64 + 1, dtype=torch.bfloat16)[1:].view(2, 33, 4, 64)
    assert "16-byte" in dispatch.layout_reason(v=odd)


def test_cpu_calls_never_reach_gluon():
    q = torch.randn(1, 16, 2, 64)
    assert resolve_backend("auto", q) == "torch"
    with pytest.raises(ValueError, match="backend='gluon'.*sm_90"):
        forgetting_attention(q, q, q, F.logsigmoid(torch.randn(1, 16, 2)), backend="gluon")


def test_unaddressable_tensors_fall_back_to_triton():
    from foxformer.ops.forgetting_attn.interface import _kernel_backend

    q = torch.zeros(1, 8, 2, 64, dtype=torch.bfloat16)
    assert _kernel_backend("gluon", q=q, k=q, v=q) == "gluon"
    unpacked = torch.zeros(1, 8, 2, 2, 64, dtype=torch.bfloat16)[:, :, :, 0]
    assert _kernel_backend("gluon", q=q, k=unpacked, v=q) == "triton"
    assert _kernel_backend("triton", q=unpacked, k=q, v=q) == "triton"


def test_forward_options_for_one_benchmark_run():
    """bench model --gluon-fwd: the named fields replace the head dims' configs inside the block only, and a field
    FwdConfig lacks or a combination it refuses stops the run before any config changes."""
    if not VARIANTS:
        pytest.skip("no Gluon")
    import argparse

    from foxformer.bench.cli import _gluon_fwd
    from foxformer.ops.forgetting_attn.hopper import launch as L
    before = dict(L.FWD_CONFIGS)
    with L.fwd_options(_gluon_fwd("64:max_free=true,head_group=2;128:max_free=false")):
        assert L.FWD_CONFIGS[64].max_free and L.FWD_CONFIGS[64].head_group == 2 and not L.FWD_CONFIGS[128].max_free
    assert L.FWD_CONFIGS == before
    with L.fwd_options(_gluon_fwd("max_free=true")):
        assert all(cfg.max_free for cfg in L.FWD_CONFIGS.values())
    assert L.FWD_CONFIGS == before
    for text, match in (("max_free=true,mma_sums=true", "no field"), ("64:max_freee=true", "no field"),
                        ("96:max_free=true", "no config for head dim 96")):
        with pytest.raises(ValueError, match=match):
            with L.fwd_options(_gluon_fwd(text)):
                pass
        assert L.FWD_CONFIGS == before
    for text in ("x:max_free=true", "64:max_free"):
        with pytest.raises(argparse.ArgumentTypeError):
            _gluon_fwd(text)
