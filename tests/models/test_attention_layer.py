"""ForgettingAttention, the drop-in layer: the maths written out, the model's own attention, packed documents,
gradients, and clear errors."""
import pytest
import torch
import torch.nn.functional as F

from foxformer import ForgettingAttention
from foxformer.models import FoxForCausalLM, get_preset
from foxformer.ops import naive_forgetting_attention

D = torch.float64


def _x(B, T, d, seed=0):
    return torch.randn(B, T, d, generator=torch.Generator().manual_seed(seed), dtype=D)


def test_plain_layer_is_projections_gate_and_the_op_written_out():
    """pro=False: o_proj(attention(q_proj x, k_proj x, v_proj x, log sigmoid(w_f . x + b_f))), GQA 4:2."""
    layer = ForgettingAttention(48, num_heads=4, num_kv_heads=2, pro=False, backend="naive").to(D)
    x = _x(2, 37, 48)
    B, T, _ = x.shape
    q = layer.q_proj(x).view(B, T, 4, 12)
    k, v = (p(x).view(B, T, 2, 12) for p in (layer.k_proj, layer.v_proj))
    log_f = F.logsigmoid(layer.fgate.proj(x))
    want = layer.o_proj(naive_forgetting_attention(q, k, v, log_f).reshape(B, T, 48))
    torch.testing.assert_close(layer(x), want, rtol=0, atol=1e-12)


@pytest.mark.parametrize("pro", [True, False], ids=["pro", "llama"])
def test_layer_is_the_models_attention(pro):
    """The same parameter names as FoX's own blocks: the layer loads a model layer's weights and computes it."""
    model = FoxForCausalLM(get_preset("fox-pro-tiny" if pro else "fox-llama-tiny", attention_backend="torch",
                                      vocab_size=64)).to(D)
    cfg = model.config
    attn = model.model.layers[0].attn
    layer = ForgettingAttention(cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, pro=pro,
                                backend="torch", eps=cfg.rms_norm_eps).to(D)
    layer.load_state_dict(attn.state_dict(), strict=True)
    x = _x(1, 50, cfg.hidden_size)
    from foxformer.models.layers import SeqContext

    torch.testing.assert_close(layer(x), attn(x, SeqContext()), rtol=0, atol=1e-12)


def test_packed_documents_see_nothing_of_each_other():
    """cu_seqlens: attention and the key / value shift stop at each document's start, as if run one by one."""
    layer = ForgettingAttention(32, num_heads=2, backend="torch").to(D)
    docs = [_x(1, n, 32, seed=n) for n in (1, 17, 30)]
    cu = torch.tensor([0, 1, 18, 48], dtype=torch.int32)
    packed = layer(torch.cat(docs, dim=1), cu_seqlens=cu)
    # float64; the op's chunks fall differently in the packed row, hence not bit for bit
    torch.testing.assert_close(packed, torch.cat([layer(d) for d in docs], dim=1), rtol=0, atol=1e-10)
    torch.testing.assert_close(layer(torch.cat(docs, dim=1), cu_seqlens=cu, max_seqlen=30), packed)


def test_gradients_reach_every_parameter():
    layer = ForgettingAttention(32, num_heads=2, backend="torch")
    layer(torch.randn(2, 20, 32)).square().mean().backward()
    missing = [name for name, p in layer.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
    assert missing == []


BAD = {
    "wrong-width": (dict(), lambda layer: layer(torch.randn(1, 8, 31)), ValueError, r"\[batch, seq, 32\], got \(1, 8, 31\)"),
    "two-dims": (dict(), lambda layer: layer(torch.randn(8, 32)), ValueError, r"\[batch, seq, 32\]"),
    "packed-batch-of-two": (dict(), lambda layer: layer(torch.randn(2, 8, 32),
                                                        cu_seqlens=torch.tensor([0, 8], dtype=torch.int32)),
                            ValueError, "packed batch of size 1"),
    "cu-seqlens-int64": (dict(), lambda layer: layer(torch.randn(1, 8, 32), cu_seqlens=torch.tensor([0, 8])),
                         TypeError, "int32"),
    "no-tokens": (dict(), lambda layer: layer(torch.randn(2, 0, 32)), ValueError, "at least one token"),
    # dropped without a word: the documents of x (its cu_seqlens forgotten) attended to each other
    "max-seqlen-without-cu-seqlens": (dict(), lambda layer: layer(torch.randn(1, 8, 32), max_seqlen=4), ValueError,
                                      r"^max_seqlen=4 was given without cu_seqlens: max_seqlen only applies with"),
    "dtype-of-weights": (dict(), lambda layer: layer(torch.randn(1, 8, 32, dtype=torch.float64)), TypeError,
                         r"\.to\(torch.float64\) or run it under torch.autocast"),
    "head-dim-past-the-op": (dict(head_dim=300), None, ValueError, "head_dim must be at most 256"),
    "gate-kind": (dict(fgate="dynamic"), None, ValueError, "fgate"),
    "heads-not-dividing": (dict(num_heads=5), None, ValueError, "num_heads"),
}


@pytest.mark.parametrize("kwargs, call, error, match", list(BAD.values()), ids=list(BAD))
def test_bad_input_is_a_clear_error(kwargs, call, error, match):
    with pytest.raises(error, match=match):
        layer = ForgettingAttention(32, **{"num_heads": 2, "backend": "torch", **kwargs})
        call(layer)
