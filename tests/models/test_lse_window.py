"""scripts/lse_window.py: each attention row's lse on a model's own activations, against the max-free forward's
window. The lse must be the full score matrix's, every preset kind must work (with and without a gate or QK-norm),
and rows pushed past the window must be counted."""
import math

import pytest
import torch

from .conftest import make_model, tokens


@pytest.fixture(scope="module")
def window_script(load_script):
    return load_script("lse_window")


@pytest.mark.parametrize("preset", ["fox-pro-tiny", "fox-llama-tiny", "transformer-pro-tiny"])
def test_quantiles_per_layer(window_script, preset):
    model = make_model(preset)
    rows = window_script.lse_window(model, tokens(2, 40))
    assert len(rows) == len(model.model.layers)
    for r in rows:
        assert r["min"] <= r["p1"] <= r["median"] <= r["p99"] <= r["max"]
        assert 0.0 <= r["outside"] <= 1.0


def test_row_lse_is_the_score_matrix_logsumexp(window_script):
    g = torch.Generator().manual_seed(0)
    B, T, H, Hkv, D = 2, 9, 4, 2, 8
    q, k = torch.randn(B, T, H, D, generator=g), torch.randn(B, T, Hkv, D, generator=g)
    log_f = torch.nn.functional.logsigmoid(torch.randn(B, T, H, generator=g))
    got = window_script.row_lse(q, k, log_f, 1 / math.sqrt(D))
    c = torch.cumsum(log_f.double(), dim=1)
    kk = k.double().repeat_interleave(H // Hkv, dim=2)
    for b in range(B):
        for h in range(H):
            for i in range(T):
                logits = torch.tensor([float(q[b, i, h].double() @ kk[b, j, h]) / math.sqrt(D)
                                       + float(c[b, i, h] - c[b, j, h]) for j in range(i + 1)], dtype=torch.float64)
                assert got[b, h, i].item() == pytest.approx(torch.logsumexp(logits, 0).item(), rel=1e-12, abs=1e-12)
    # no gate: plain causal attention's lse
    ungated = window_script.row_lse(q, k, None, 1 / math.sqrt(D))
    s = torch.einsum("bihd,bjhd->bhij", q.double(), kk) / math.sqrt(D)
    s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    torch.testing.assert_close(ungated, torch.logsumexp(s, -1), rtol=1e-12, atol=1e-12)


def test_rows_beyond_the_window_are_counted(window_script):
    """A query scaled so its logits reach ~+-100 nats lands outside +-44 in the layer's share."""
    model = make_model("fox-pro-tiny")
    with torch.no_grad():
        for block in model.model.layers:
            block.attn.q_norm.weight.mul_(40.0)
            block.attn.k_norm.weight.mul_(40.0)
    rows = window_script.lse_window(model, tokens(2, 40))
    assert max(r["outside"] for r in rows) > 0.0
    assert max(max(abs(r["min"]), abs(r["max"])) for r in rows) > window_script.WINDOW_NATS
