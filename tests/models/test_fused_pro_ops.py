"""FoxConfig.fused_pro_ops: the Pro block's extras as the fused shift_norm / gate_norm ops give the modules' loss and
every parameter gradient (float64: rounding only), leave cached decoding as it was, and refuse NaN gate logits on
either path."""
import pytest
import torch

from foxformer.ops.forgetting_attn.checks import NonFiniteValueError
from foxformer.ops.pro_block import interface

from .conftest import make_model, tokens

CASES = {
    "fox-pro": ("fox-pro-tiny", {}),
    "fox-pro-gqa-perhead": ("fox-pro-tiny", dict(num_kv_heads=2, qk_norm_per_head=True)),
    "k-shift-only": ("fox-pro-tiny", dict(kv_shift=False, k_shift=True, output_gate=False)),
    "transformer-pro": ("transformer-pro-tiny", {}),
    "linear-pro": ("linear-pro-tiny", {}),
}


def _loss_and_grads(model, **batch):
    model.zero_grad(set_to_none=True)
    loss = model(**batch).loss
    loss.backward()
    return loss.detach(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}


def _assert_same_training(preset, overrides, **batch):
    off = _loss_and_grads(make_model(preset, fused_pro_ops=False, **overrides).train(), **batch)
    on = _loss_and_grads(make_model(preset, fused_pro_ops=True, **overrides).train(), **batch)
    torch.testing.assert_close(on[0], off[0], rtol=1e-12, atol=0)
    assert on[1].keys() == off[1].keys()
    for name, grad in off[1].items():
        torch.testing.assert_close(on[1][name], grad, rtol=1e-9, atol=1e-12, msg=name)


@pytest.mark.parametrize("case", CASES)
def test_fused_pro_ops_give_the_same_loss_and_gradients(case):
    preset, overrides = CASES[case]
    ids = tokens(2, 13)
    _assert_same_training(preset, overrides, input_ids=ids, labels=ids)


def test_packed_documents_reset_the_fused_shift():
    ids = tokens(1, 16)
    _assert_same_training("fox-pro-tiny", {}, input_ids=ids, labels=ids,
                          cu_seqlens=torch.tensor([0, 5, 6, 16], dtype=torch.int32))


def test_through_the_triton_kernels(monkeypatch):
    """The same with the kernels themselves (the interpreter on CPU, in float64), not the references "auto" picks on
    a CPU: left padding makes sequence starts inside the batch."""
    calls = []

    def kernels(backend, x):
        calls.append(x.shape)
        return "triton"

    monkeypatch.setattr(interface, "resolve_backend", kernels)
    ids = tokens(2, 11)
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    _assert_same_training("fox-pro-tiny", dict(num_kv_heads=2), input_ids=ids, labels=ids, attention_mask=mask)
    assert len(calls) == 2 * 4  # 2 layers: q, k, v and the output


def test_cached_decoding_is_unchanged():
    ids = tokens(2, 12)
    off, on = make_model("fox-pro-tiny", fused_pro_ops=False), make_model("fox-pro-tiny", fused_pro_ops=True)
    with torch.no_grad():
        full = on(ids).logits
        steps = []
        for model in (off, on):
            out = model(ids[:, :8], use_cache=True)
            parts = [out.logits] + [model(ids[:, t:t + 1], past_key_values=out.cache).logits for t in range(8, 12)]
            steps.append(torch.cat(parts, 1))
    assert torch.equal(steps[0], steps[1])  # a cache takes the modules' path either way
    torch.testing.assert_close(steps[1], full, rtol=1e-9, atol=1e-9)


def test_the_presets_fuse_by_default():
    from foxformer.models import get_preset
    assert get_preset("fox-pro-125m").fused_pro_ops


def test_flag_is_a_bool():
    from foxformer.models import get_preset
    with pytest.raises(ValueError, match="fused_pro_ops must be True or False"):
        get_preset("fox-pro-tiny", fused_pro_ops="yes")


# NaN in one head's row of a gate projection: that head's logits are NaN at every token. Each refusal names what ran:
# the fused op (fused_pro_ops, no cache) or the module (fused_pro_ops=False, or any cached step); the fused output
# path needs the output norm too, and an output gate without it was refused as "gate_norm: g", an op never called.
NAN_GATES = {
    "k-shift": ("k_shift.proj", {}, "shift_norm: logits contains NaN", "key shift: k_shift.proj(x) contains NaN"),
    "v-shift": ("v_shift.proj", {}, "shift_norm: logits contains NaN", "value shift: v_shift.proj(x) contains NaN"),
    "output-gate": ("g_proj", {}, "gate_norm: g contains NaN (per head",
                    "output gate: g_proj(x) contains NaN (per head"),
    "output-gate-without-norm": ("g_proj", dict(output_norm=False), "output gate: g_proj(x) contains NaN (per head",
                                 "output gate: g_proj(x) contains NaN (per head"),
}


def _poison(model, module: str) -> None:
    with torch.no_grad():
        model.model.layers[1].attn.get_submodule(module).weight[0] = float("nan")


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "modules"])
@pytest.mark.parametrize("gate", NAN_GATES)
def test_nan_gate_logits_are_refused_naming_what_ran(gate, fused):
    module, overrides, said_fused, said_modules = NAN_GATES[gate]
    model = make_model("fox-pro-tiny", fused_pro_ops=fused, **overrides)
    _poison(model, module)
    with pytest.raises(NonFiniteValueError) as e:
        model(tokens(2, 9))
    assert str(e.value).startswith(said_fused if fused else said_modules)


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "modules"])
@pytest.mark.parametrize("gate", NAN_GATES)
def test_a_cached_decode_step_refuses_nan_gate_logits_naming_the_module(gate, fused):
    """A cache always takes the modules' path, fused_pro_ops or not."""
    module, overrides, _, said = NAN_GATES[gate]
    ids = tokens(2, 9)
    model = make_model("fox-pro-tiny", fused_pro_ops=fused, **overrides)
    with torch.no_grad():
        cache = model(ids[:, :8], use_cache=True).cache
        _poison(model, module)
        with pytest.raises(NonFiniteValueError) as e:
            model(ids[:, 8:], past_key_values=cache)
    assert str(e.value).startswith(said)
