"""The chunked torch backend against the materialised naive reference, and the input checks."""
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings, strategies as st

from foxformer import forgetting_attention, forgetting_attention_cumsum, gate_cumsum
from foxformer.ops import naive_forgetting_attention

from .helpers import REL_TOL, grad_of_grad, make_inputs, rel_err, run_with_grads

NAMES = ("out", "lse", "dq", "dk", "dv", "dlog_f")

SHAPES = [
    # B, Tq, Tk, Hq, Hkv, D
    pytest.param(2, 17, 17, 2, 2, 16, id="mha-T17"),
    pytest.param(1, 64, 130, 4, 1, 48, id="mqa-prefill-Tq64-Tk130"),
    pytest.param(2, 1, 33, 8, 2, 100, id="gqa-decode-Tq1"),
    pytest.param(1, 130, 130, 4, 4, 128, id="mha-T130-D128"),
]


def _torch_backend(*args, **kw):
    return forgetting_attention(*args, backend="torch", **kw)


@pytest.mark.parametrize("B,Tq,Tk,Hq,Hkv,D", SHAPES)
@pytest.mark.parametrize("gate", ["mixed", 0.0, -5.0], ids=lambda g: f"gate={g}")
def test_torch_matches_naive_fp64(B, Tq, Tk, Hq, Hkv, D, gate):
    inputs = make_inputs(B, Tq, Tk, Hq, Hkv, D, gate=gate)
    got = run_with_grads(_torch_backend, *inputs, lse_weight=0.5)
    ref = run_with_grads(naive_forgetting_attention, *inputs, lse_weight=0.5)
    for name, a, b in zip(NAMES, got, ref):
        assert rel_err(a, b) < 1e-10, name


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_torch_low_precision_against_fp64(dtype):
    inputs64 = make_inputs(2, 40, 50, 4, 2, 32)
    ref = run_with_grads(naive_forgetting_attention, *inputs64)
    low = [x.to(dtype) for x in inputs64[:3]] + [inputs64[3].float()]
    got = run_with_grads(_torch_backend, *low)
    expected_dtypes = (dtype, torch.float32, dtype, dtype, dtype, torch.float32)
    for name, a, b, want in zip(NAMES, got, ref, expected_dtypes):
        assert a.dtype == want, name
        assert rel_err(a, b) < REL_TOL[dtype] * 3, name


@pytest.mark.parametrize("gate", ["mixed", -2.0], ids=lambda g: f"gate={g}")
def test_float32_across_chunks_with_scores_far_below_the_row_maximum(gate):
    """Several 64-row chunks (the last one partial) in float32, with gates that put most scores more than 87 below
    their row's maximum: the probabilities flushed to 0 there change nothing the fp64 reference can see."""
    inputs64 = make_inputs(1, 200, 200, 2, 2, 16, gate=gate)
    ref = run_with_grads(naive_forgetting_attention, *inputs64)
    got = run_with_grads(_torch_backend, *[x.float() for x in inputs64])
    for name, a, b in zip(NAMES, got, ref):
        assert rel_err(a, b) < REL_TOL[torch.float32], name


def test_exp_flushes_what_float32_would_make_denormal():
    from foxformer.ops.forgetting_attn.reference import _EXP_FLOOR, _exp_

    s = torch.tensor([0.0, -1.0, _EXP_FLOOR + 0.5, _EXP_FLOOR - 0.5, -200.0, float("-inf")])
    assert torch.equal(_exp_(s.clone())[:3], s[:3].exp()) and torch.equal(_exp_(s.clone())[3:], torch.zeros(3))
    assert torch.equal(_exp_(s.double()), s.double().exp())   # float64 keeps every tiny value


def test_varlen_equals_separate_sequences():
    lengths = [1, 2, 77, 5]
    cu = torch.tensor([0, 1, 3, 80, 85], dtype=torch.int32)
    q, k, v, log_f = make_inputs(1, 85, 85, 4, 2, 16)
    got = run_with_grads(_torch_backend, q, k, v, log_f, cu_seqlens=cu, lse_weight=0.5)
    ref = run_with_grads(naive_forgetting_attention, q, k, v, log_f, cu_seqlens=cu, lse_weight=0.5)
    for name, a, b in zip(NAMES, got, ref):
        assert rel_err(a, b) < 1e-10, name
    # the packed result is the one of each sequence alone (cumsum restarts, nothing crosses)
    start = 0
    for n in lengths:
        piece = [t[:, start:start + n] for t in (q, k, v, log_f)]
        alone, alone_lse = naive_forgetting_attention(*piece, return_lse=True)
        assert rel_err(got[0][:, start:start + n], alone) < 1e-10
        assert rel_err(got[1][:, :, start:start + n], alone_lse) < 1e-10
        start += n


def test_long_sequence_8192_matches_naive():
    q, k, v, log_f = make_inputs(1, 8192, 8192, 2, 1, 16, dtype=torch.float32,
                                 gate=-0.01)
    log_f = log_f + F.logsigmoid(torch.randn(log_f.shape)) * 0.05
    got, got_lse = forgetting_attention(q, k, v, log_f, backend="torch", return_lse=True)
    # The naive reference materialises several [Tq, Tk] fp64 matrices (GBs here): 1024 rows at a time, each block
    # against the keys up to its last row (queries align to the keys' end), skips the masked half.
    q, k, v, log_f = (t.double() for t in (q, k, v, log_f))
    blocks = [naive_forgetting_attention(q[:, s:s + 1024], k[:, :s + 1024], v[:, :s + 1024], log_f[:, :s + 1024],
                                         return_lse=True) for s in range(0, 8192, 1024)]
    assert rel_err(got, torch.cat([o for o, _ in blocks], dim=1)) < 1e-5
    assert rel_err(got_lse, torch.cat([lse for _, lse in blocks], dim=2)) < 1e-6


def test_c_stays_exact_at_64k_tokens():
    """|c| ~ 45000 at 64K tokens with f ~ 0.5: an fp32 cumsum would lose ~4e-3 in every c_i - c_j."""
    Tk, Tq = 65536, 32
    q, k, v, _ = make_inputs(1, Tq, Tk, 2, 1, 16, dtype=torch.float32)
    log_f = F.logsigmoid(torch.randn(1, Tk, 2) * 0.3)
    got = forgetting_attention(q, k, v, log_f, backend="torch")
    ref = naive_forgetting_attention(*(t.double() for t in (q, k, v, log_f)))
    assert rel_err(got, ref) < 1e-5
    # the same op with an fp32 cumsum really is inaccurate here: the test can tell
    c32 = torch.cumsum(log_f, dim=1).double()
    bad = forgetting_attention_cumsum(q, k, v, c32, backend="torch")
    assert rel_err(bad, ref) > 10 * rel_err(got, ref)


def test_cumsum_entry_point_and_incremental_c():
    q, k, v, log_f = make_inputs(2, 9, 30, 4, 2, 16)
    c_first = gate_cumsum(log_f[:, :21])
    c_rest = gate_cumsum(log_f[:, 21:], initial=c_first[:, -1])
    c = torch.cat([c_first, c_rest], dim=1)
    torch.testing.assert_close(c, gate_cumsum(log_f))
    a = forgetting_attention_cumsum(q, k, v, c, backend="torch")
    b = forgetting_attention(q, k, v, log_f, backend="torch")
    torch.testing.assert_close(a, b)


def test_minus_inf_gate_hides_everything_before():
    q, k, v, log_f = make_inputs(1, 12, 12, 1, 1, 8, gate=-0.1)
    log_f[0, 6, 0] = float("-inf")
    out = forgetting_attention(q, k, v, log_f, backend="torch")
    # after the cut, rows 6.. only see keys 6..: changing keys 0..5 must not move them
    k2, v2 = k.clone(), v.clone()
    k2[:, :6] = torch.randn_like(k2[:, :6])
    v2[:, :6] = torch.randn_like(v2[:, :6])
    out2 = forgetting_attention(q, k2, v2, log_f, backend="torch")
    assert torch.equal(out[:, 6:], out2[:, 6:])
    assert not torch.allclose(out[:, :6], out2[:, :6])


@settings(max_examples=25, deadline=None)
@given(
    B=st.integers(1, 2), Tq=st.integers(1, 24), extra=st.integers(0, 20), Hkv=st.integers(1, 2),
    group=st.sampled_from([1, 2, 3]), D=st.integers(1, 40), seed=st.integers(0, 10_000),
)
def test_property_torch_equals_naive(B, Tq, extra, Hkv, group, D, seed):
    inputs = make_inputs(B, Tq, Tq + extra, Hkv * group, Hkv, D, seed=seed)
    got = run_with_grads(_torch_backend, *inputs)
    ref = run_with_grads(naive_forgetting_attention, *inputs)
    for name, a, b in zip(NAMES, got, ref):
        assert rel_err(a, b) < 1e-9, name


def test_torch_compile_traces_without_graph_breaks():
    q, k, v, log_f = make_inputs(1, 16, 16, 2, 1, 16, dtype=torch.float32)

    def layer(q, k, v, log_f):
        return forgetting_attention(q * 2, k, v, log_f, backend="torch").sum()

    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(q, k, v, log_f), layer(q, k, v, log_f))


@pytest.mark.parametrize("dynamic", [None, True], ids=["dynamic-auto", "dynamic-true"])
def test_torch_compile_with_a_softmax_scale_that_varies(dynamic):
    """A float argument that changes between calls turns symbolic under torch.compile (a SymFloat: at
    once with dynamic=True, at the first recompile otherwise); the finite check on softmax_scale used
    math.isfinite, which dynamo cannot trace on it, so fullgraph compilation failed."""
    q, k, v, log_f = make_inputs(1, 6, 10, 2, 1, 8, dtype=torch.float32)

    def layer(q, k, v, log_f, scale):
        return forgetting_attention(q, k, v, log_f, softmax_scale=scale, backend="torch")

    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager", dynamic=dynamic)
    for scale in (0.3, -0.4, 0.5):
        torch.testing.assert_close(compiled(q, k, v, log_f, scale), layer(q, k, v, log_f, scale))


def test_naive_supports_double_backward():
    q, k, v, _ = make_inputs(1, 5, 7, 2, 1, 4, seed=2)
    # away from 0: gradgradcheck's finite differences must not step to a positive log f
    log_f = -0.1 - torch.rand(1, 7, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    inputs = [t.requires_grad_() for t in (q, k, v, log_f)]

    def fn(q, k, v, log_f):
        return forgetting_attention(q, k, v, log_f, backend="naive").sum(-1)

    assert torch.autograd.gradgradcheck(fn, inputs)
    assert torch.isfinite(grad_of_grad(fn, *inputs)).all()


def test_torch_backend_double_backward_is_a_clear_error():
    """The torch backend runs its own backward (a custom op, no autograd through it): differentiating
    the gradient again failed with torch's 'no autograd formula was registered' for an internal op."""
    with pytest.raises(RuntimeError, match="forgetting_attention.*double backward is not supported"):
        grad_of_grad(forgetting_attention, *make_inputs(1, 6, 6, 2, 1, 8), backend="torch")


def _in_bf16(fn, q, k, v, log_f):
    return fn(q.bfloat16(), k.bfloat16(), v.bfloat16(), log_f.float())


def _under_autocast(fn, q, k, v, log_f):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        return fn(q.float(), k.float(), v.float(), log_f.float())


def _portable_with_grad(q, k, v, log_f):
    from foxformer.ops import portable

    return portable.forgetting_attention(q.requires_grad_(), k, v, log_f)  # a gradient: the materialised path


@pytest.mark.parametrize("fn", [pytest.param(naive_forgetting_attention, id="naive"),
                                pytest.param(_portable_with_grad, id="portable-with-grad")])
@pytest.mark.parametrize("precision", [pytest.param(_in_bf16, id="bf16-inputs"),
                                       pytest.param(_under_autocast, id="fp32-under-bf16-autocast")])
def test_the_materialised_path_keeps_the_gate_cumsum_in_float64(precision, fn):
    """It summed the gates in the scores' dtype: with bf16 scores (bf16 inputs, or fp32 ones under autocast) c
    near -500 steps by 4, so the -0.5 gates of 1K tokens gave an output off by O(1), where the other backends keep
    c in float64 and are off by bf16's rounding alone."""
    q, k, v, _ = make_inputs(1, 1024, 1024, 1, 1, 16)
    log_f = torch.full((1, 1024, 1), -0.5, dtype=torch.float64)
    ref = naive_forgetting_attention(q, k, v, log_f)
    assert rel_err(precision(fn, q, k, v, log_f), ref) < REL_TOL[torch.bfloat16]
