"""Forget-gate facts: a fixed gate is ALiBi; timescale initialisation."""
import json
import math

import pytest
import torch
import torch.nn.functional as F

from foxformer.models import FoxForCausalLM, get_preset
from foxformer.models.layers import SeqContext, timescale_bias

from .conftest import make_model, tokens


def test_fixed_gate_equals_alibi():
    """With f_h constant, c_i - c_j = (i - j) log f_h: ALiBi with slope m_h = -log f_h per head."""
    model = make_model("fox-llama-tiny", fgate="fixed", fgate_tmin=2.0, fgate_tmax=64.0)
    attn = model.model.layers[0].attn
    x = torch.randn(2, 11, 64, dtype=torch.float64)
    got = attn(x, SeqContext())

    B, T, H, D = 2, 11, attn.num_heads, attn.head_dim
    q = attn.q_proj(x).view(B, T, H, D).transpose(1, 2)
    k = attn.k_proj(x).view(B, T, H, D).transpose(1, 2)
    v = attn.v_proj(x).view(B, T, H, D).transpose(1, 2)
    slopes = -F.logsigmoid(attn.fgate.bias.double())  # m_h > 0
    dist = (torch.arange(T)[:, None] - torch.arange(T)[None, :]).double()
    alibi = -slopes[:, None, None] * dist  # [H, T, T]
    scores = q @ k.transpose(-1, -2) / math.sqrt(D) + alibi
    scores = scores.masked_fill(dist < 0, float("-inf"))
    ref = (scores.softmax(-1) @ v).transpose(1, 2).reshape(B, T, H * D)
    torch.testing.assert_close(got, attn.o_proj(ref), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("heads,tmin,tmax", [(1, 2.0, 2.0), (4, 2.0, 16384.0), (12, 2.0, 4096.0)])
def test_timescale_bias_is_geometric(heads, tmin, tmax):
    b = timescale_bias(heads, tmin, tmax).double()
    t = 1.0 / -F.logsigmoid(b)
    assert math.isclose(t[0].item(), tmin, rel_tol=1e-5) and math.isclose(t[-1].item(), tmax, rel_tol=1e-4)
    if heads > 2:
        ratios = t[1:] / t[:-1]
        torch.testing.assert_close(ratios, ratios[:1].expand_as(ratios), rtol=1e-4, atol=0)


def test_data_independent_gate_ignores_the_input():
    model = make_model("fox-llama-tiny", fgate="data_independent")
    gate = model.model.layers[0].attn.fgate
    a, b = gate(torch.randn(1, 3, 64, dtype=torch.float64)), gate(torch.randn(1, 3, 64, dtype=torch.float64))
    assert torch.equal(a, b) and a.shape == (1, 3, 4) and torch.all(a < 0)


def test_left_padding_cuts_every_gate_kind():
    """-inf at a row's first real token hides all padding, whatever the gate kind."""
    for kind in ("data_dependent", "fixed", "none"):
        model = make_model("fox-llama-tiny", fgate=kind)
        row = tokens(1, 4, seed=8)
        padded = torch.cat([tokens(1, 2, seed=9), row], 1)
        mask = torch.tensor([[0, 0, 1, 1, 1, 1]])
        torch.testing.assert_close(model(padded, attention_mask=mask).logits[:, 2:], model(row).logits,
                                   rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("preset", ["fox-pro-tiny", "fox-llama-tiny", "linear-pro-tiny"])
def test_data_dependent_gate_starts_as_the_papers_code_or_from_timescales(preset, tmp_path):
    """The paper's code starts w ~ N(0, init_std) and b = 0 (f = 0.5 in every head); fgate_bias_init="timescales"
    starts b where a fixed gate stays, so that at d = 64 each head's mean timescale is its own within the
    spread of w . x (std init_std * sqrt(d) = 0.16 on RMS-normed x), and the start survives a reload."""
    torch.manual_seed(0)
    paper = FoxForCausalLM(get_preset(preset))
    for layer in paper.model.layers:
        proj = layer.attn.fgate.proj
        assert torch.equal(proj.bias, torch.zeros(4)) and abs(proj.weight.std().item() - 0.02) < 0.003
    want = timescale_bias(4, 2.0, 16384.0)
    model = FoxForCausalLM(get_preset(preset, fgate_bias_init="timescales"))
    x = torch.randn(2, 64, 64)
    x = x / x.pow(2).mean(-1, keepdim=True).sqrt()
    for layer in model.model.layers:
        gate = layer.attn.fgate
        torch.testing.assert_close(gate.proj.bias.data, want)
        timescale = -1.0 / gate(x).mean(dim=(0, 1))
        ratio = timescale / (-1.0 / F.logsigmoid(want))
        assert ((ratio > 0.7) & (ratio < 1.4)).all(), ratio
    model.save_pretrained(tmp_path / "ts")
    again = FoxForCausalLM.from_pretrained(tmp_path / "ts")
    assert again.config.fgate_bias_init == "timescales"
    torch.testing.assert_close(again.model.layers[0].attn.fgate.proj.bias.data, want)


def test_config_saved_before_the_bias_init_field_loads_with_the_zero_start(tmp_path):
    FoxForCausalLM(get_preset("fox-pro-tiny")).save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    saved.pop("fgate_bias_init", None)
    (tmp_path / "config.json").write_text(json.dumps(saved))
    cfg = FoxForCausalLM.config_class.from_pretrained(tmp_path)
    assert cfg.fgate_bias_init is None and cfg.gate_bias_init == "zero"
    assert torch.equal(FoxForCausalLM(cfg).model.layers[0].attn.fgate.proj.bias, torch.zeros(4))
