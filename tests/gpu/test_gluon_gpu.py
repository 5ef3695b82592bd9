"""The Gluon Hopper kernels against float64 references, on an H100 / H200.

Every output (out, lse) and gradient (q, k, v, log_f) at awkward shapes, gate values 0 / -5 / -30 /
-inf, GQA, Tq < Tk, packed sequences of 1 and 77 tokens, pruning, fp16 and bf16; outputs start as NaN
(FOXFORMER_POISON_OUTPUTS) so an element no kernel wrote fails; gradients must be bitwise identical on
a second run. Skipped without an sm_90 GPU. Run: `python -m pytest -q tests/gpu/test_gluon_gpu.py`.
"""
import dataclasses

import pytest
import torch
import torch.nn.functional as F

from foxformer import forgetting_attention
from foxformer.bench.attention import realistic_log_fgate

HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
pytestmark = pytest.mark.skipif(not HOPPER, reason="needs an sm_90 GPU (H100 / H200)")
DEV = "cuda"


@pytest.fixture(autouse=True)
def _poison(monkeypatch):
    monkeypatch.setenv("FOXFORMER_POISON_OUTPUTS", "1")


def _gates(kind: str, B: int, T: int, H: int, seed: int) -> torch.Tensor:
    g = torch.Generator(device=DEV).manual_seed(seed)
    if kind == "realistic":
        return realistic_log_fgate(B, T, H, DEV, generator=g)
    if kind == "mixed":
        # Ordinary gates with 0, -5, -30 and -inf (f = 0: everything before is cut) sprinkled in.
        log_f = F.logsigmoid(torch.randn(B, T, H, device=DEV, generator=g) + 3.0)
        pick = torch.rand(B, T, H, device=DEV, generator=g)
        for lo, hi, value in ((0.0, 0.1, 0.0), (0.1, 0.15, -5.0), (0.15, 0.17, -30.0), (0.17, 0.18, -float("inf"))):
            log_f = torch.where((pick >= lo) & (pick < hi), torch.full_like(log_f, value), log_f)
        return log_f
    value = {"open": 0.0, "five": -5.0, "thirty": -30.0}[kind]
    return torch.full((B, T, H), value, device=DEV)


def _run(q, k, v, log_f, do, backend, dl=None, **kw):
    """dl: a gradient on lse as well (the backward's dlse path)."""
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v, log_f)]
    out, lse = forgetting_attention(*leaves, backend=backend, return_lse=True, **kw)
    if dl is None:
        out.backward(do.to(out.dtype))
    else:
        torch.autograd.backward([out, lse], [do.to(out.dtype), dl.to(lse.dtype)])
    return [out, lse] + [t.grad for t in leaves]


def _rel(a, b):
    """||a - b|| / ||b||, with ||b|| floored at an RMS of 1e-3: a gradient that is exactly zero (one key)
    or nearly so (gates of -30 per token) is compared in absolute terms."""
    a, b = a.double(), b.double()
    assert torch.isfinite(a).all(), "non-finite values (an unwritten element stays NaN)"
    return ((a - b).norm() / b.norm().clamp_min(1e-3 * b.numel() ** 0.5)).item()


NAMES = ("out", "lse", "dq", "dk", "dv", "dlog_f")


def _check(q, k, v, log_f, long_context=False, with_dlse=False, **kw):
    """Outputs and gradients against the exact float64 reference (float32 at long context), and bitwise
    equal on a second run. Short shapes: each error may be at most 3x that of the exact torch backend run
    at the same input precision (+1e-3), which stays meaningful where a gradient is nearly zero (strong
    gates, one token) and relative errors of any bf16 computation blow up."""
    do = torch.randn(q.shape, device=DEV, dtype=q.dtype)
    if with_dlse:
        kw["dl"] = torch.randn(q.shape[0], q.shape[2], q.shape[1], device=DEV, dtype=torch.float64)
    got = _run(q, k, v, log_f, do, "gluon", **kw)
    exact_kw = {key: val for key, val in kw.items() if key != "prune_eps"}
    if long_context:
        exact = _run(q.float(), k.float(), v.float(), log_f, do.float(), "torch", **exact_kw)
        errors = {name: _rel(a, b) for name, a, b in zip(NAMES, got, exact)}
        assert all(e < 2e-2 for e in errors.values()), errors
    else:
        exact = _run(q.double(), k.double(), v.double(), log_f.double(), do.double(), "naive", **exact_kw)
        same = _run(q, k, v, log_f, do, "torch", **kw)
        errors = {name: (_rel(a, b), _rel(t, b)) for name, a, t, b in zip(NAMES, got, same, exact)}
        assert all(e <= 3 * e_torch + 1e-3 for e, e_torch in errors.values()), errors
    again = _run(q, k, v, log_f, do, "gluon", **kw)
    for name, a, b in zip(NAMES, got, again):
        assert torch.equal(a, b), f"{name} differs between two runs (not deterministic)"


SHAPES = {  # B, Tq, Tk, Hq, Hkv
    "T1": (2, 1, 1, 2, 2),
    "T17": (2, 17, 17, 2, 1),
    "T130": (1, 130, 130, 3, 3),
    "T1000-gqa8": (1, 1000, 1000, 8, 1),
    "T4097": (1, 4097, 4097, 2, 2),
    "Tq77-Tk1000": (2, 77, 1000, 4, 2),
    "Tq300-Tk301": (1, 300, 301, 2, 2),
}


@pytest.mark.parametrize("gates", ["mixed", "open", "five", "thirty"])
@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("D", [64, 128], ids=lambda d: f"D{d}")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_matches_fp64(dtype, D, shape, gates):
    B, Tq, Tk, Hq, Hkv = SHAPES[shape]
    torch.manual_seed(0)
    q = torch.randn(B, Tq, Hq, D, device=DEV, dtype=dtype)
    k = torch.randn(B, Tk, Hkv, D, device=DEV, dtype=dtype)
    v = torch.randn(B, Tk, Hkv, D, device=DEV, dtype=dtype)
    _check(q, k, v, _gates(gates, B, Tk, Hq, seed=1))


@pytest.mark.parametrize("prune_eps", [None, 1e-3], ids=["full", "pruned"])
@pytest.mark.parametrize("D", [64, 128], ids=lambda d: f"D{d}")
def test_varlen_gqa(D, prune_eps):
    lengths = [1, 77, 1, 500, 77, 1300, 130]
    cu = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32, device=DEV)
    T = sum(lengths)
    torch.manual_seed(2)
    q = torch.randn(1, T, 8, D, device=DEV, dtype=torch.bfloat16)
    k = torch.randn(1, T, 2, D, device=DEV, dtype=torch.bfloat16)
    v = torch.randn(1, T, 2, D, device=DEV, dtype=torch.bfloat16)
    _check(q, k, v, _gates("mixed", 1, T, 8, seed=3), cu_seqlens=cu, prune_eps=prune_eps)


@pytest.mark.parametrize("D", [64, 128], ids=lambda d: f"D{d}")
def test_pruned_realistic(D):
    torch.manual_seed(4)
    B, T, H = 2, 3000, 4
    q, k, v = (torch.randn(B, T, H, D, device=DEV, dtype=torch.bfloat16) for _ in range(3))
    _check(q, k, v, _gates("realistic", B, T, H, seed=5), prune_eps=1e-3)


@pytest.mark.parametrize("T", [16384, 65536], ids=lambda t: f"T{t // 1024}K")
@pytest.mark.parametrize("gates", ["realistic", "half"])
@pytest.mark.parametrize("D,Hq,Hkv", [(64, 2, 1), (128, 2, 2)], ids=["D64-gqa", "D128"])
def test_long_context(T, gates, D, Hq, Hkv):
    _long_context(T, gates, D, Hq, Hkv)


def _long_context(T, gates, D, Hq, Hkv):
    torch.manual_seed(0)
    q = torch.randn(1, T, Hq, D, device=DEV, dtype=torch.bfloat16)
    k = torch.randn(1, T, Hkv, D, device=DEV, dtype=torch.bfloat16)
    v = torch.randn(1, T, Hkv, D, device=DEV, dtype=torch.bfloat16)
    if gates == "realistic":
        log_f = realistic_log_fgate(1, T, Hq, DEV)
    else:  # f ~ 0.5: |c| reaches ~45000 at 64K tokens, the precision trap
        log_f = F.logsigmoid(torch.randn(1, T, Hq, device=DEV) * 0.3)
    _check(q, k, v, log_f, long_context=True)


def _replace_bwd_configs(monkeypatch, change):
    """Every head dim's BwdConfig with the fields change(cfg) returns replaced, for one test."""
    from foxformer.ops.forgetting_attn.hopper import launch
    for D, cfg in list(launch.BWD_CONFIGS.items()):
        monkeypatch.setitem(launch.BWD_CONFIGS, D, dataclasses.replace(cfg, **change(cfg)))


@pytest.fixture
def other_delta(monkeypatch):
    """The backward with BwdConfig.fused_delta flipped from the defaults: the row deltas from their own kernel or
    from the dq kernel, whichever the defaults do not take, so both paths stay tested."""
    _replace_bwd_configs(monkeypatch, lambda cfg: dict(fused_delta=not cfg.fused_delta))


@pytest.mark.parametrize("with_dlse", [False, True], ids=["out", "out+lse"])
@pytest.mark.parametrize("shape", ["T1", "T130", "T1000-gqa8", "T4097", "Tq77-Tk1000"])
@pytest.mark.parametrize("D", [64, 128], ids=lambda d: f"D{d}")
def test_other_delta_path(other_delta, D, shape, with_dlse):
    B, Tq, Tk, Hq, Hkv = SHAPES[shape]
    torch.manual_seed(6)
    q = torch.randn(B, Tq, Hq, D, device=DEV, dtype=torch.bfloat16)
    k = torch.randn(B, Tk, Hkv, D, device=DEV, dtype=torch.bfloat16)
    v = torch.randn(B, Tk, Hkv, D, device=DEV, dtype=torch.bfloat16)
    _check(q, k, v, _gates("mixed", B, Tk, Hq, seed=7), with_dlse=with_dlse)


@pytest.mark.parametrize("D", [64, 128], ids=lambda d: f"D{d}")
def test_other_delta_path_varlen(other_delta, D):
    lengths = [1, 77, 1, 500, 77, 130]
    cu = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32, device=DEV)
    T = sum(lengths)
    torch.manual_seed(8)
    q = torch.randn(1, T, 4, D, device=DEV, dtype=torch.bfloat16)
    k, v = (torch.randn(1, T, 2, D, device=DEV, dtype=torch.bfloat16) for _ in range(2))
    _check(q, k, v, _gates("mixed", 1, T, 4, seed=9), with_dlse=True, cu_seqlens=cu)


def _packed_then_pruned(D, dtype, seed):
    """Packed sequences of 1 to 500 tokens (GQA 4:2), realistic gates; then the same tokens as one pruned sequence."""
    lengths = [1, 77, 1, 500, 77, 130]
    cu = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32, device=DEV)
    T = sum(lengths)
    torch.manual_seed(seed)
    q = torch.randn(1, T, 4, D, device=DEV, dtype=dtype)
    k, v = (torch.randn(1, T, 2, D, device=DEV, dtype=dtype) for _ in range(2))
    log_f = _gates("realistic", 1, T, 4, seed=seed + 1)
    _check(q, k, v, log_f, cu_seqlens=cu)
    _check(q, k, v, log_f, prune_eps=1e-3)


@pytest.fixture
def other_sums(monkeypatch):
    """The backward with BwdConfig.mma_sums flipped from the defaults: the dS sums of dc by a wgmma with ones (from
    the bf16 dS of the dQ / dK products), or across registers (fp32)."""
    _replace_bwd_configs(monkeypatch, lambda cfg: dict(mma_sums=not cfg.mma_sums))


@pytest.mark.parametrize("shape", ["T1", "T17", "T130", "T1000-gqa8", "T4097", "Tq77-Tk1000"])
@pytest.mark.parametrize("D", [64, 128], ids=lambda d: f"D{d}")
def test_other_sums_path(other_sums, D, shape):
    B, Tq, Tk, Hq, Hkv = SHAPES[shape]
    torch.manual_seed(14)
    q = torch.randn(B, Tq, Hq, D, device=DEV, dtype=torch.bfloat16)
    k = torch.randn(B, Tk, Hkv, D, device=DEV, dtype=torch.bfloat16)
    v = torch.randn(B, Tk, Hkv, D, device=DEV, dtype=torch.bfloat16)
    _check(q, k, v, _gates("mixed", B, Tk, Hq, seed=15), with_dlse=True)


@pytest.mark.parametrize("D", [64, 128], ids=lambda d: f"D{d}")
def test_other_sums_path_fp16_varlen_pruned(other_sums, D):
    _packed_then_pruned(D, torch.float16, seed=16)


@pytest.mark.parametrize("case", ["T1", "T17", "T1000-gqa8", "T4097", "Tq77-Tk1000", "varlen", "pruned", "16K"])
@pytest.mark.parametrize("D", [64, 128], ids=lambda d: f"D{d}")
def test_other_schedule_is_bitwise_equal(monkeypatch, D, case):
    """Persistent kernels (BwdConfig.*_persistent) compute each tile exactly as one CTA a tile does, only on another
    SM and after other tiles: every output and gradient must be bitwise equal with the schedule flipped (one CTA a
    tile where the defaults are persistent and the other way round), a gradient on lse included."""
    B, Tq, Tk, Hq, Hkv = {"varlen": (1, 786, 786, 4, 2), "pruned": (2, 3000, 3000, 4, 2),
                          "16K": (1, 16384, 16384, 4, 2)}.get(case) or SHAPES[case]
    torch.manual_seed(17)
    q = torch.randn(B, Tq, Hq, D, device=DEV, dtype=torch.bfloat16)
    k = torch.randn(B, Tk, Hkv, D, device=DEV, dtype=torch.bfloat16)
    v = torch.randn(B, Tk, Hkv, D, device=DEV, dtype=torch.bfloat16)
    log_f = _gates("realistic" if case in ("pruned", "16K") else "mixed", B, Tk, Hq, seed=18)
    kw = dict(dl=torch.randn(B, Hq, Tq, device=DEV, dtype=torch.float64))
    if case == "varlen":
        lengths = [1, 77, 1, 500, 77, 130]
        kw["cu_seqlens"] = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32, device=DEV)
    if case == "pruned":
        kw["prune_eps"] = 1e-3
    do = torch.randn(q.shape, device=DEV, dtype=q.dtype)
    default = _run(q, k, v, log_f, do, "gluon", **kw)
    _replace_bwd_configs(monkeypatch, lambda cfg: dict(dkdv_persistent=not cfg.dkdv_persistent,
                                                       dq_persistent=not cfg.dq_persistent))
    other = _run(q, k, v, log_f, do, "gluon", **kw)
    for name, a, b in zip(NAMES, default, other):
        assert torch.isfinite(a).all(), f"{name}: non-finite values (an unwritten element stays NaN)"
        assert torch.equal(a, b), f"{name} differs between the persistent and one-CTA-a-tile schedules"


@pytest.mark.parametrize("T", [16384, 65536], ids=lambda t: f"T{t // 1024}K")
@pytest.mark.parametrize("gates", ["realistic", "half"])
@pytest.mark.parametrize("D,Hq,Hkv", [(64, 2, 1), (128, 2, 2)], ids=["D64-gqa", "D128"])
def test_other_sums_long_context(other_sums, T, gates, D, Hq, Hkv):
    _long_context(T, gates, D, Hq, Hkv)


def test_auto_picks_gluon_and_unpacked_heads_fall_back():
    from foxformer.ops.forgetting_attn.checks import resolve_backend
    from foxformer.ops.forgetting_attn.hopper.dispatch import layout_reason

    q = torch.randn(1, 256, 4, 64, device=DEV, dtype=torch.bfloat16)
    assert resolve_backend("auto", q) == "gluon"
    assert resolve_backend("auto", q.float()) == "torch"
    assert resolve_backend("auto", torch.randn(1, 8, 2, 96, device=DEV, dtype=torch.bfloat16)) == "triton"
    # Heads not packed next to each other: TMA cannot read [B, T, H * D] rows, the Triton kernels run.
    qkv = torch.randn(1, 256, 4, 3, 64, device=DEV, dtype=torch.bfloat16)
    q, k, v = qkv.unbind(3)
    assert layout_reason(q=q) is not None
    _check(q, k, v, _gates("mixed", 1, 256, 4, seed=6))


@pytest.mark.parametrize("D", [64, 128], ids=lambda d: f"D{d}")
def test_column_slices_of_one_product(D):
    """q, k, v as column slices of one [B, T, W] product (a fused QKV projection, W a multiple of 8 columns): the
    kernels read and write through their row stride, and the gradients land in the slices."""
    from foxformer.ops.forgetting_attn.hopper.dispatch import layout_reason

    B, T, H = 2, 1000, 4
    W = 3 * H * D + 16  # the gate columns after q, k, v
    torch.manual_seed(3)
    x = torch.randn(B, T, W, device=DEV, dtype=torch.bfloat16).requires_grad_()
    q, k, v = (x[..., i * H * D:(i + 1) * H * D].view(B, T, H, D) for i in range(3))
    assert layout_reason(q=q, k=k, v=v) is None
    log_f = _gates("mixed", B, T, H, seed=7)
    do = torch.randn(B, T, H, D, device=DEV, dtype=torch.bfloat16)
    out = forgetting_attention(q, k, v, log_f, backend="gluon")
    out.backward(do)
    grads = [x.grad[..., i * H * D:(i + 1) * H * D].reshape(B, T, H, D) for i in range(3)]
    assert not x.grad[..., 3 * H * D:].any()
    leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
    ref = forgetting_attention(*leaves, log_f.double(), backend="naive")
    ref.backward(do.double())
    assert _rel(out, ref) < 2e-2
    for g, leaf in zip(grads, leaves):
        assert _rel(g, leaf.grad) < 2e-2


# "-thirty": gates of -30 a token, where the gate gradient is a near-total cancellation (the dP product started from
# -delta failed there, and for one token, where it is exactly 0: bwd._dkdv_tile). Without a gradient on lse: with one,
# dS_ii ~ dlse_i and the D 128 register sums leave fp32 rounding of ~1e-6 in dlog_f, 1e-3 relative to the test's floor
# (the torch backend: 4e-8; every option alike, thirty-second session).
OPTION_CASES = ["T1", "T17", "T130", "T1000-gqa8", "T4097", "T4097-thirty", "Tq77-Tk1000", "Tq300-Tk301", "varlen",
                "pruned"]


def _check_case(D, case, seed):
    """Every output and gradient of one awkward case against float64, a gradient on lse included."""
    shape = case.removesuffix("-thirty")
    B, Tq, Tk, Hq, Hkv = {"varlen": (1, 786, 786, 4, 2), "pruned": (2, 3000, 3000, 4, 2)}.get(shape) or SHAPES[shape]
    torch.manual_seed(seed)
    q = torch.randn(B, Tq, Hq, D, device=DEV, dtype=torch.bfloat16)
    k = torch.randn(B, Tk, Hkv, D, device=DEV, dtype=torch.bfloat16)
    v = torch.randn(B, Tk, Hkv, D, device=DEV, dtype=torch.bfloat16)
    kw = {}
    if case == "varlen":
        lengths = [1, 77, 1, 500, 77, 130]
        kw["cu_seqlens"] = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32, device=DEV)
    if case == "pruned":
        kw["prune_eps"] = 1e-3
    gates = _gates({"pruned": "realistic"}.get(case, "thirty" if case.endswith("-thirty") else "mixed"), B, Tk, Hq,
                   seed=seed + 1)
    _check(q, k, v, gates, with_dlse=not case.endswith("-thirty"), **kw)


@pytest.mark.parametrize("case", OPTION_CASES)
@pytest.mark.parametrize("options", ["plain", "dkdv_equal_len", "dkdv_split_loops", "dkdv_equal_len+dkdv_split_loops",
                                     "dq_split_loops"])
@pytest.mark.parametrize("D", [64, 128], ids=lambda d: f"D{d}")
def test_backward_options(monkeypatch, D, options, case):
    """The backward kernels' code options, exactly the named ones on ("plain": none; the defaults, launch.BWD_CONFIGS,
    are what the other tests run): equal lengths compiled in (a call with Tq < Tk or packed sequences must still get
    the general kernel), the masked tiles in loops of their own (the diagonal first, then the unmasked run, then a
    tile past the end), the dq kernel's split loops."""
    if options == "dq_split_loops" and D == 128:
        pytest.skip("the dq kernel's split loops are a D 64 option (they spill at D 128: launch.variant_names)")
    on = set(options.split("+"))
    _replace_bwd_configs(monkeypatch, lambda cfg: {field: field in on for field in (
        "dkdv_equal_len", "dkdv_split_loops", "dq_split_loops")})
    _check_case(D, case, seed=19)


@pytest.mark.parametrize("case", OPTION_CASES)
def test_forward_split_loops(monkeypatch, case):
    """FwdConfig.split_loops (off: it lost the thirty-second session's sweep): the D 64 forward with its unmasked and
    masked tiles in loops of their own, against float64 (the first masked tile, the query's own, can follow any
    number of unmasked ones)."""
    from foxformer.ops.forgetting_attn.hopper import launch
    monkeypatch.setitem(launch.FWD_CONFIGS, 64, dataclasses.replace(launch.FWD_CONFIGS[64], split_loops=True))
    _check_case(64, case, seed=21)


def _max_free(monkeypatch, D, on=True):
    """FwdConfig.max_free on (or off) for one test, whatever the head dim's default."""
    from foxformer.ops.forgetting_attn.hopper import launch
    monkeypatch.setitem(launch.FWD_CONFIGS, D, dataclasses.replace(launch.FWD_CONFIGS[D], max_free=on))


@pytest.mark.parametrize("case", OPTION_CASES)
@pytest.mark.parametrize("on", [True, False], ids=["max-free", "with-max"])
@pytest.mark.parametrize("D", [64, 128], ids=lambda d: f"D{d}")
def test_forward_max_free(monkeypatch, D, on, case):
    """The forward without a row maximum (fwd.fwd_kernel's MAX_FREE; at D 128 in the overlapped loop) and its redo
    launch, and the forward with it, against float64, whichever is the head dim's default."""
    _max_free(monkeypatch, D, on)
    _check_case(D, case, seed=23)


@pytest.mark.parametrize("T", [16384, 65536], ids=lambda t: f"T{t // 1024}K")
@pytest.mark.parametrize("D,Hq,Hkv", [(64, 2, 1), (128, 2, 2)], ids=["D64-gqa", "D128"])
def test_forward_max_free_long_context(monkeypatch, T, D, Hq, Hkv):
    """|c| in the tens of thousands (gates ~0.5): the row and key terms of the max-free scores keep the precision."""
    _max_free(monkeypatch, D)
    _long_context(T, "half", D, Hq, Hkv)


@pytest.mark.parametrize("D", [64, 128], ids=lambda d: f"D{d}")
def test_max_free_rows_outside_the_window_are_computed_again(monkeypatch, D):
    """Rows whose log-sum-exp lies beyond +-44 nats (a diagonal logit of +-60 under gates of -100 a token): the
    max-free launch alone leaves NaN in exactly their lse, and with the redo launch out and lse match float64."""
    from foxformer.ops.forgetting_attn.cumsum import gate_cumsum_heads_first
    from foxformer.ops.forgetting_attn.hopper import launch
    torch.manual_seed(29)
    B, T, H = 2, 700, 2
    q = F.normalize(torch.randn(B, T, H, D, device=DEV), dim=-1) * D ** 0.5
    sign = torch.zeros(B, T, H, 1, device=DEV)
    sign[:, 5::97], sign[:, 11::101] = 1.0, -1.0  # rows with lse ~ +60 and ~ -60 nats
    k = torch.where(sign != 0, sign * q * (60 / D ** 0.5), torch.randn(B, T, H, D, device=DEV))
    q, k, v = q.bfloat16(), k.bfloat16(), torch.randn(B, T, H, D, device=DEV, dtype=torch.bfloat16)
    log_f = torch.full((B, T, H), -100.0, device=DEV)
    cfg = dataclasses.replace(launch.FWD_CONFIGS[D], max_free=True)

    c = gate_cumsum_heads_first(log_f)
    out = torch.full_like(q, float("nan"))
    lse = torch.full((B, H, T), float("nan"), device=DEV)
    n_blocks = -(-T // launch.fwd_block_m(cfg))
    launch.forward_launch(q, k, v, c, out, lse, lse, lse, D ** -0.5, n_blocks, B, False, False, cfg).run()
    outside = (sign.squeeze(-1) != 0).transpose(1, 2)
    assert torch.equal(torch.isnan(lse), outside)

    monkeypatch.setitem(launch.FWD_CONFIGS, D, cfg)
    got, got_lse = forgetting_attention(q, k, v, log_f, backend="gluon", return_lse=True)
    ref, ref_lse = forgetting_attention(q.double(), k.double(), v.double(), log_f.double(), backend="naive",
                                        return_lse=True)
    assert _rel(got, ref) < 1e-2 and _rel(got_lse, ref_lse) < 1e-3
    assert got_lse[outside].abs().min() > 44
