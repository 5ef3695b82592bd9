"""scripts/qk_headroom.py: each row's largest logit against QK-norm's bound U. The bound must hold on the model's
own activations (U - max >= 0 in every row), the row maxima must be the full score matrix's, and a model without
QK-norm is refused (it has no free bound)."""
import math

import pytest
import torch

from foxformer.ops import naive_forgetting_attention

from .conftest import make_model, tokens


@pytest.fixture(scope="module")
def headroom_script(load_script):
    return load_script("qk_headroom")


@pytest.mark.parametrize("preset", ["fox-pro-tiny", "transformer-pro-tiny"])
def test_the_bound_holds_in_every_row(headroom_script, preset):
    model = make_model(preset)
    with torch.no_grad():  # larger norm weights than at init, so that U is not trivially loose
        for block in model.model.layers:
            block.attn.q_norm.weight.mul_(3.0)
    rows = headroom_script.headroom(model, tokens(2, 40))
    assert len(rows) == len(model.model.layers)
    for r in rows:
        assert r["min"] >= 0.0 and r["min"] <= r["median"] <= r["p99"] <= r["max"] <= r["U"] * 2 + 1e-9
        assert 0.0 <= r["beyond"] <= 1.0


def test_row_maxima_are_the_score_matrix_maxima(headroom_script):
    g = torch.Generator().manual_seed(0)
    B, T, H, Hkv, D = 2, 9, 4, 2, 8
    q, k = torch.randn(B, T, H, D, generator=g), torch.randn(B, T, Hkv, D, generator=g)
    log_f = torch.nn.functional.logsigmoid(torch.randn(B, T, H, generator=g))
    got = headroom_script.row_maxima(q, k, log_f, 1 / math.sqrt(D))
    c = torch.cumsum(log_f.double(), dim=1)
    kk = k.double().repeat_interleave(H // Hkv, dim=2)
    for b in range(B):
        for h in range(H):
            for i in range(T):
                want = max(float(q[b, i, h].double() @ kk[b, j, h]) / math.sqrt(D) + float(c[b, i, h] - c[b, j, h])
                           for j in range(i + 1))
                assert got[b, h, i].item() == pytest.approx(want, rel=1e-12, abs=1e-12)
    # the same maxima make the naive op's lse finite and at least the maximum
    _, lse = naive_forgetting_attention(q.double(), k.double(), q.double()[..., :Hkv, :], log_f.double(),
                                        return_lse=True)
    assert torch.all(lse >= got - 1e-9)


def test_a_model_without_qk_norm_is_refused(headroom_script):
    with pytest.raises(ValueError, match="no QK-norm"):
        headroom_script.headroom(make_model("fox-llama-tiny"), tokens(1, 8))
