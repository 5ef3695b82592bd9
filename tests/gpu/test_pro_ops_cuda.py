"""shift_norm and gate_norm compiled for the GPU, in bf16, against their float64 references: every output and
gradient at FoX (Pro) 125M's shape at 16K and at awkward ones; and a compiled FoX (Pro) training step with
fused_pro_ops against the modules'. Skipped without CUDA: `python -m pytest -q tests/gpu/test_pro_ops_cuda.py`."""
from dataclasses import replace

import pytest
import torch

from foxformer.ops import gate_norm, shift_norm
from foxformer.ops.pro_block import gate_norm_reference, shift_norm_reference, tiles

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

# (B, T, H, D): FoX (Pro) 125M at 16K, then T = 1, a T no multiple of the tile with GQA's 2 heads, a small odd D
SHAPES = {"125m-16k": (2, 16384, 12, 64), "T1": (3, 1, 12, 64), "gqa-T1000": (2, 1000, 2, 64), "D24": (1, 77, 5, 24)}
TOL = 2e-2  # bf16 inputs and outputs: relative error (norm of difference over norm of reference)


def _rel_err(x, ref):
    assert torch.isfinite(x).all(), "non-finite values"
    return ((x.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def _grads(fn, args, dy):
    leaves = {k: (v.detach().clone().requires_grad_() if v.is_floating_point() else v) for k, v in args.items()}
    y = fn(**leaves)
    diff = {k: v for k, v in leaves.items() if v.requires_grad}
    return {"y": y, **dict(zip(("d" + k for k in diff), torch.autograd.grad(y, list(diff.values()), dy.to(y.dtype))))}


def _check(fn, ref_fn, args):
    first = next(iter(args.values()))  # x or o: the output has its shape and dtype
    torch.manual_seed(0)
    dy = torch.randn(first.shape, device="cuda", dtype=torch.float64)
    got = _grads(fn, args, dy)
    ref = _grads(ref_fn, {k: (v.double() if v.is_floating_point() else v) for k, v in args.items()}, dy)
    for name, r in ref.items():
        assert got[name].dtype == (first if name == "y" else args[name[1:]]).dtype, name
        err = _rel_err(got[name], r)
        assert err < TOL, f"{name}: relative error {err:.3g}"


def _strided(*shape, extra=24):
    """A bf16 view into a wider last dim, as the model's projections are slices of one joint product."""
    wide = torch.randn(*shape[:2], shape[2] * (shape[3] if len(shape) > 3 else 1) + extra, device="cuda")
    view = wide.bfloat16()[..., extra // 2: extra // 2 + wide.shape[-1] - extra]
    return view.unflatten(-1, shape[2:]) if len(shape) > 3 else view


@pytest.mark.parametrize("shape", list(SHAPES.values()), ids=list(SHAPES))
@pytest.mark.parametrize("case", ["shift+norm", "shift+prev+starts", "norm-only"])
@pytest.mark.parametrize("gather", [False, True], ids=["bwd-recompute", "bwd-gather"])
def test_shift_norm_bf16(shape, case, gather, monkeypatch):
    monkeypatch.setitem(tiles.TILES, "shift_bwd", replace(tiles.TILES["shift_bwd"], gather_next=gather))
    B, T, H, D = shape
    torch.manual_seed(1)
    args = dict(x=_strided(B, T, H, D))
    if case.startswith("shift"):
        args["logits"] = _strided(B, T, H) * 2
    if case == "shift+prev+starts":
        args["prev"] = torch.randn(B, H, D, device="cuda").bfloat16()
        args["starts"] = torch.rand(B, T, device="cuda") < 0.01
    if "norm" in case:
        args["weight"] = 1 + 0.5 * torch.randn(D, device="cuda")  # fp32, as the model's parameter under autocast
    _check(lambda **kw: shift_norm(**kw, backend="triton"), shift_norm_reference, args)


@pytest.mark.parametrize("shape", list(SHAPES.values()), ids=list(SHAPES))
def test_gate_norm_bf16(shape):
    B, T, H, D = shape
    torch.manual_seed(2)
    args = dict(o=torch.randn(B, T, H, D, device="cuda").bfloat16(), g=_strided(B, T, H * D) * 2,
                weight=1 + 0.5 * torch.randn(H, D, device="cuda"))
    _check(lambda **kw: gate_norm(**kw, backend="triton"), gate_norm_reference, args)


def test_compiled_training_step_matches_the_modules():
    from foxformer.models.modeling import FoxForCausalLM
    from foxformer.models.presets import get_preset

    x = torch.randint(0, 50304, (2, 512), device="cuda")
    results = []
    for fused in (False, True):
        torch.manual_seed(0)
        model = FoxForCausalLM(get_preset("fox-pro-small", vocab_size=50304, fused_pro_ops=fused)).cuda()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = torch.compile(model)(x, labels=x).loss
        loss.backward()
        results.append((loss.detach(), {n: p.grad.float() for n, p in model.named_parameters()}))
    (loss0, g0), (loss1, g1) = results
    assert abs(loss0.item() - loss1.item()) < 2e-2
    for name, g in g0.items():
        err = ((g1[name] - g).norm() / g.norm().clamp_min(1e-12)).item()
        assert err < 5e-2, f"{name}: relative gradient error {err:.3g}"


def test_foxformer_check_values_checks_the_gate_logits_on_cuda(monkeypatch):
    """As the attention ops' gates: without FOXFORMER_CHECK_VALUES=1 no device sync (a NaN logit gives NaN), with it
    the CPU's check (shift_norm passed NaN logits through on every device)."""
    x, w = torch.randn(2, 64, 4, 64, device="cuda").bfloat16(), torch.ones(64, device="cuda")
    logits, g = torch.randn(2, 64, 4, device="cuda"), torch.randn(2, 64, 256, device="cuda")
    logits[1, 40, 3] = g[0, 9, 70] = float("nan")
    monkeypatch.delenv("FOXFORMER_CHECK_VALUES", raising=False)
    assert torch.isnan(shift_norm(x, logits, weight=w)).any() and torch.isnan(gate_norm(x, g, w)).any()
    monkeypatch.setenv("FOXFORMER_CHECK_VALUES", "1")
    with pytest.raises(ValueError, match=r"shift_norm: logits contains NaN .*batch 1, position 40, head 3"):
        shift_norm(x, logits, weight=w)
    with pytest.raises(ValueError, match=r"gate_norm: g contains NaN .*batch 0, position 9, head 1"):
        gate_norm(x, g, w)
