"""Forget-gate facts: a fixed gate is ALiBi; timescale initialisation."""
import math

import pytest
import torch
import torch.nn.functional as F

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
