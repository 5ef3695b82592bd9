"""fgate_bias_shift: 0 changes nothing, a positive shift slows the decay, every form (model / layer /
head, config / runtime / context manager) lands on the gate logits."""
import pytest
import torch
import torch.nn.functional as F

from foxformer.infer import bias_shift_sweep, fgate_bias_shift, set_fgate_bias_shift
from foxformer.models import FoxForCausalLM

from .conftest import VOCAB, make_model, tokens


@pytest.mark.parametrize("preset", ["fox-pro-tiny", "fox-llama-tiny"])
def test_zero_shift_changes_nothing(preset):
    model = make_model(preset)
    ids = tokens(2, 12)
    before = model(ids).logits
    for zero in (0.0, [0.0, 0.0], [[0.0] * 4, [0.0] * 4], torch.zeros(2, 4)):
        set_fgate_bias_shift(model, zero)
        assert torch.equal(model(ids).logits, before)
    cfg_model = FoxForCausalLM(model.config.__class__(**{**model.config.to_dict(), "fgate_bias_shift": 0.0}))
    assert all(b.attn.fgate.bias_shift is None for b in cfg_model.model.layers)


def test_shift_adds_to_gate_logits_per_layer_and_head():
    model = make_model("fox-pro-tiny")
    x = torch.randn(1, 5, model.config.hidden_size, dtype=torch.float64)
    gates = [b.attn.fgate for b in model.model.layers]
    base = [F.logsigmoid(g.proj(x)) for g in gates]
    shift = [[0.5, 1.0, 0.0, -1.0], [2.0, 2.0, 2.0, 2.0]]
    with fgate_bias_shift(model, shift):
        for g, b0, s in zip(gates, base, shift):
            want = F.logsigmoid(g.proj(x) + torch.tensor(s, dtype=torch.float64))
            torch.testing.assert_close(g(x), want)
            assert torch.all(g(x)[..., torch.tensor(s) > 0] > b0[..., torch.tensor(s) > 0])
    for g, b0 in zip(gates, base):  # restored on exit
        assert g.bias_shift is None and torch.equal(g(x), b0)


def test_config_field_reaches_the_gates_and_survives_save_load(tmp_path):
    model = make_model("fox-pro-tiny")
    cfg = model.config.to_dict()
    cfg["fgate_bias_shift"] = [1.5, [0.0, 0.5, 1.0, 1.5]]
    shifted = FoxForCausalLM(model.config.__class__(**cfg)).double().eval()
    shifted.load_state_dict(model.state_dict())
    assert shifted.model.layers[0].attn.fgate.bias_shift.tolist() == [1.5] * 4
    assert shifted.model.layers[1].attn.fgate.bias_shift.tolist() == [0.0, 0.5, 1.0, 1.5]
    ids = tokens(1, 10)
    runtime = make_model("fox-pro-tiny")
    set_fgate_bias_shift(runtime, [1.5, [0.0, 0.5, 1.0, 1.5]])
    torch.testing.assert_close(shifted(ids).logits, runtime(ids).logits, rtol=1e-12, atol=1e-12)
    shifted.save_pretrained(tmp_path)
    loaded = FoxForCausalLM.from_pretrained(tmp_path).double().eval()
    assert loaded.model.layers[1].attn.fgate.bias_shift.tolist() == [0.0, 0.5, 1.0, 1.5]
    assert "bias_shift" not in " ".join(loaded.state_dict())  # not a weight


def test_fixed_gates_and_softmax_layers():
    model = make_model("fox-pro-tiny", fgate="fixed")
    ids = tokens(1, 8)
    before = model(ids).logits
    with fgate_bias_shift(model, 1.0):
        assert not torch.equal(model(ids).logits, before)
    assert torch.equal(model(ids).logits, before)
    softmax = make_model("transformer-pro-tiny")
    set_fgate_bias_shift(softmax, 0.0)  # allowed: nothing to shift
    with pytest.raises(ValueError, match="no forget gate"):
        set_fgate_bias_shift(softmax, 1.0)


def test_bad_shapes_are_rejected():
    model = make_model("fox-pro-tiny")
    with pytest.raises(ValueError, match="fgate_bias_shift"):
        set_fgate_bias_shift(model, [1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="per head"):
        set_fgate_bias_shift(model, [[1.0, 2.0], [1.0, 2.0]])
    cfg = model.config.to_dict()
    with pytest.raises(ValueError, match="one entry per layer"):
        model.config.__class__(**{**cfg, "fgate_bias_shift": [1.0]})
    with pytest.raises(ValueError, match="fgate_bias_shift"):
        model.config.__class__(**{**cfg, "fgate_bias_shift": "big"})


def test_sweep_reports_loss_within_and_beyond_training_length():
    model = make_model("fox-pro-tiny", dtype=torch.float32)
    res = bias_shift_sweep(model, tokens(2, 40), [0.0, 2.0], train_len=16, bins=4)
    assert res["shifts"] == [0.0, 2.0] and len(res["binned_loss"]) == 2 and len(res["binned_loss"][0]) == 4
    assert res["loss_beyond"][0] is not None and res["loss_within"][0] != res["loss_within"][1]
    assert all(abs(v - torch.log(torch.tensor(float(VOCAB)))) < 1.0 for v in res["mean_loss"])
    assert all(b.attn.fgate.bias_shift is None for b in model.model.layers)


@torch.no_grad()
def test_cached_decoding_with_a_shift_matches_the_shifted_full_pass():
    model = make_model("fox-pro-tiny")
    ids = tokens(2, 16)
    with fgate_bias_shift(model, [[1.0, 0.0, 2.0, 0.5], 3.0]):
        full = model(ids).logits
        cache = model.model.new_cache()
        parts = [model(ids[:, :5], cache=cache, use_cache=True).logits]
        parts += [model(ids[:, t:t + 1], cache=cache, use_cache=True).logits for t in range(5, 16)]
    torch.testing.assert_close(torch.cat(parts, 1), full, rtol=1e-9, atol=1e-9)
    assert not torch.allclose(full, model(ids).logits)


@pytest.mark.parametrize("shift, said", [
    ([0.5, [1.0, 2.0]], "fgate_bias_shift[1]: expected a number or 4 of them (one per head), got [1.0, 2.0]"),
    ([["a"] * 4, 0.0], "fgate_bias_shift[0]: expected a number or 4 of them (one per head), got ['a', 'a', 'a', 'a']"),
    ([0.5, [0.0, float("nan"), 0.0, 0.0]], "fgate_bias_shift[1]: expected finite numbers, got [0.0, nan, 0.0, 0.0]"),
    (float("inf"), "fgate_bias_shift: expected finite numbers, got inf"),
], ids=["head-count", "str-among-heads", "nan-head", "inf-whole-model"])
def test_a_bad_shift_is_named_with_its_layer_and_value(shift, said):
    """A per-layer entry was refused without its layer ("fgate_bias_shift: expected one value or 4 (one per head), got
    2", "fgate_bias_shift must be finite"), and a str among the heads as torch's "too many dimensions 'str'"."""
    from foxformer.infer import generate

    with pytest.raises(ValueError) as e:
        list(generate(make_model("fox-pro-tiny"), [1, 2], max_new_tokens=1, fgate_bias_shift=shift))
    assert str(e.value) == said


BAD_SHIFTS = {"wrong-head-count-in-layer-1": [0.5, [1.0, 2.0]], "nan-in-layer-1": [0.5, float("nan")],
              "nan-head-in-layer-1": [[0.5] * 4, [1.0, float("nan"), 0.0, 0.0]]}


@pytest.mark.parametrize("bad", list(BAD_SHIFTS), ids=list(BAD_SHIFTS))
@pytest.mark.parametrize("entry", ["set_fgate_bias_shift", "context-manager", "generate"])
def test_rejected_shift_leaves_the_model_unchanged(bad, entry):
    """A shift rejected at layer 1 must not stay applied to layer 0 (later forwards would silently
    run a shifted model)."""
    from foxformer.infer import generate

    model = make_model("fox-pro-tiny")
    ids = tokens(1, 10)
    before = model(ids).logits
    with pytest.raises(ValueError, match="fgate_bias_shift"):
        if entry == "set_fgate_bias_shift":
            set_fgate_bias_shift(model, BAD_SHIFTS[bad])
        elif entry == "context-manager":
            with fgate_bias_shift(model, BAD_SHIFTS[bad]):
                pass
        else:
            list(generate(model, ids, max_new_tokens=2, fgate_bias_shift=BAD_SHIFTS[bad]))
    assert all(b.attn.fgate.bias_shift is None for b in model.model.layers)
    assert torch.equal(model(ids).logits, before)


GATELESS = {"transformer-pro": ("transformer-pro-tiny", {}), "fox-fgate-none": ("fox-llama-tiny", dict(fgate="none"))}


@pytest.mark.parametrize("shift", ["model", "per-layer", "per-head"])
@pytest.mark.parametrize("model_kind", list(GATELESS), ids=list(GATELESS))
def test_config_shift_on_a_model_without_forget_gates_is_rejected(model_kind, shift):
    """As set_fgate_bias_shift does: a nonzero shift on a model with nothing to shift would be
    silently ignored; zeros stay allowed."""
    from foxformer.models import get_preset

    preset, overrides = GATELESS[model_kind]
    heads = get_preset(preset, **overrides).num_heads
    value = {"model": 1.0, "per-layer": [0.0, 0.5], "per-head": [[0.0] * heads, [0.0] * (heads - 1) + [-1.0]]}[shift]
    with pytest.raises(ValueError, match="no forget gate"):
        get_preset(preset, fgate_bias_shift=value, **overrides)
    zeros = [[0.0] * heads, 0.0]
    assert get_preset(preset, fgate_bias_shift=zeros, **overrides).fgate_bias_shift == zeros
