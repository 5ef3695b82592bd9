"""ForgettingAttention, the drop-in layer: the maths written out, the model's own attention, packed documents,
gradients, and clear errors."""
import inspect

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
    "wrong-width": (lambda layer: layer(torch.randn(1, 8, 31)), ValueError, r"\[batch, seq, 32\], got \(1, 8, 31\)"),
    "two-dims": (lambda layer: layer(torch.randn(8, 32)), ValueError, r"\[batch, seq, 32\]"),
    "packed-batch-of-two": (lambda layer: layer(torch.randn(2, 8, 32),
                                                cu_seqlens=torch.tensor([0, 8], dtype=torch.int32)),
                            ValueError, "packed batch of size 1"),
    "cu-seqlens-int64": (lambda layer: layer(torch.randn(1, 8, 32), cu_seqlens=torch.tensor([0, 8])), TypeError,
                         "int32"),
    "no-tokens": (lambda layer: layer(torch.randn(2, 0, 32)), ValueError, "at least one token"),
    # dropped without a word: the documents of x (its cu_seqlens forgotten) attended to each other
    "max-seqlen-without-cu-seqlens": (lambda layer: layer(torch.randn(1, 8, 32), max_seqlen=4), ValueError,
                                      r"^max_seqlen=4 was given without cu_seqlens: max_seqlen only applies with"),
    "dtype-of-weights": (lambda layer: layer(torch.randn(1, 8, 32, dtype=torch.float64)), TypeError,
                         r"\.to\(torch.float64\) or run it under torch.autocast"),
}


@pytest.mark.parametrize("call, error, match", list(BAD.values()), ids=list(BAD))
def test_bad_input_is_a_clear_error(call, error, match):
    layer = ForgettingAttention(32, num_heads=2, backend="torch")
    with pytest.raises(error, match=match):
        call(layer)


# Each argument refused, named as the user typed it (FoxConfig, which checks them, calls backend
# "attention_backend", eps "rms_norm_eps" and pro "qk_norm"), and a near miss of a name says which was meant.
REFUSED = {
    "hidden_size": (dict(hidden_size="32"), "hidden_size must be a positive int, got '32'"),
    "num_heads": (dict(num_heads=5), "num_heads (5) must divide hidden_size (32) when head_dim is not given"),
    "num_kv_heads": (dict(num_kv_heads=3), "num_heads (2) must be a multiple of num_kv_heads (3)"),
    "head_dim": (dict(head_dim=300), "head_dim must be at most 256 with attention='forgetting' (the op's kernels), "
                                     "got 300"),
    "pro": (dict(pro="yes"), "pro must be True or False, got 'yes'"),
    "fgate-typo": (dict(fgate="datadependent"), "fgate must be one of ('data_dependent', 'data_independent', "
                                                "'fixed', 'none'), got 'datadependent' (did you mean "
                                                "'data_dependent'?)"),
    "fgate-true": (dict(fgate=True), "fgate must be one of ('data_dependent', 'data_independent', 'fixed', 'none'), "
                                     "got True (a bool, as YAML reads on / yes / true; for a forget gate name its "
                                     "kind: 'data_dependent', the default, 'data_independent' or 'fixed')"),
    "fgate_bias_init-typo": (dict(fgate_bias_init="timescale"), "fgate_bias_init must be one of ('zero', "
                                                                "'timescales') or None (did you mean 'timescales'?), "
                                                                "got 'timescale'"),
    "backend": (dict(backend="flash"), "backend: expected one of auto, gluon, triton, torch, naive, got 'flash'"),
    "backend-typo": (dict(backend="trition"), "backend: expected one of auto, gluon, triton, torch, naive, got "
                                              "'trition' (did you mean 'triton'?)"),
    "prune_eps": (dict(prune_eps=2.0), "prune_eps must be in (0, 1) or None, got 2.0"),
    # no gate is softmax attention, which SDPA ran without a word of the pruning asked for
    "prune_eps-without-a-gate": (dict(fgate="none", prune_eps=0.1), "prune_eps must be None for a model with no "
                                 "forget gate (attention='forgetting', fgate='none'), got 0.1"),
    "eps": (dict(eps=0.0), "eps must be positive and finite, got 0.0"),
    "eps-not-a-number": (dict(eps="small"), "eps must be a number, got 'small'"),
}


@pytest.mark.parametrize("kwargs, message", list(REFUSED.values()), ids=list(REFUSED))
def test_a_refused_argument_is_named_as_given(kwargs, message):
    with pytest.raises(ValueError) as caught:
        ForgettingAttention(**{"hidden_size": 32, "num_heads": 2, **kwargs})
    assert str(caught.value) == f"ForgettingAttention: {message}"


def test_every_argument_has_a_refusal_above():
    """An argument added to the layer is checked (by FoxConfig) and named as given: REFUSED says so for each."""
    parameters = inspect.signature(ForgettingAttention.__init__).parameters.values()
    arguments = {p.name for p in parameters if p.kind != p.VAR_KEYWORD} - {"self"}
    assert arguments == {name.partition("-")[0] for name in REFUSED}


ARGUMENTS = ("its arguments: hidden_size, num_heads, num_kv_heads, head_dim, pro, fgate, fgate_bias_init, backend, "
             "prune_eps, eps")
# A keyword the layer does not take was Python's "got an unexpected keyword argument 'attention_backend'": a name of
# FoxConfig's (or another library's) is answered with the layer's argument for that field, any other with the list.
UNKNOWN = {
    "attention_backend": (dict(attention_backend="gluon"), "no argument attention_backend (FoxConfig's name): the "
                                                           "layer's is backend, as in backend='gluon'"),
    "rms_norm_eps": (dict(rms_norm_eps=1e-5), "no argument rms_norm_eps (FoxConfig's name): the layer's is eps, as in "
                                              "eps=1e-05"),
    "qk_norm": (dict(qk_norm=False), "no argument qk_norm (FoxConfig's name): the layer's is pro, which sets qk_norm, "
                                     "output_gate, output_norm and kv_shift together, as in pro=False"),
    "n_heads": (dict(n_heads=2), "no argument n_heads (another library's name of FoxConfig's num_heads): the layer's "
                                 "is num_heads, as in num_heads=2"),
    "layer_norm_eps": (dict(layer_norm_eps=1e-5), "no argument layer_norm_eps (another library's name of FoxConfig's "
                                                  "rms_norm_eps): the layer's is eps, as in eps=1e-05"),
    "field-not-taken": (dict(rope_theta=1e4), f"no argument rope_theta (a FoxConfig field the layer does not take); "
                                              f"{ARGUMENTS}"),
    "typo": (dict(bakend="torch"), f"no argument bakend (did you mean 'backend'?); {ARGUMENTS}"),
    "nothing-like-it": (dict(dropout=0.1), f"no argument dropout; {ARGUMENTS}"),
    "two": (dict(attention_backend="torch", dropout=0.1), "no argument attention_backend (FoxConfig's name): the "
                                                          "layer's is backend, as in backend='torch'; no argument "
                                                          f"dropout; {ARGUMENTS}"),
}


@pytest.mark.parametrize("kwargs, message", list(UNKNOWN.values()), ids=list(UNKNOWN))
def test_an_unknown_keyword_names_the_argument_meant(kwargs, message):
    with pytest.raises(TypeError) as caught:
        ForgettingAttention(32, 2, **kwargs)
    assert str(caught.value) == f"ForgettingAttention: {message}"


def test_the_arguments_listed_are_the_signatures():
    """The list an unknown keyword gets is the layer's own signature (a new argument joins it)."""
    with pytest.raises(TypeError) as caught:
        ForgettingAttention(32, 2, dropout=0.1)
    listed = str(caught.value).partition("its arguments: ")[2].split(", ")
    parameters = inspect.signature(ForgettingAttention.__init__).parameters.values()
    assert listed == [p.name for p in parameters if p.name != "self" and p.kind != p.VAR_KEYWORD]


def test_no_gate_is_causal_softmax_attention():
    """fgate="none": the layer without its forget gate is the Transformer baseline's attention."""
    layer = ForgettingAttention(32, num_heads=2, pro=False, fgate="none", backend="torch").to(D)
    x = _x(1, 9, 32)
    q, k, v = (p(x).view(1, 9, 2, 16).transpose(1, 2) for p in (layer.q_proj, layer.k_proj, layer.v_proj))
    want = layer.o_proj(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(1, 9, 32))
    assert layer.fgate is None
    torch.testing.assert_close(layer(x), want, rtol=0, atol=1e-12)
