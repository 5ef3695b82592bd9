"""Gated linear attention: chunked op against the naive (T x T) and recurrent references."""
import pytest
import torch
from hypothesis import given, settings, strategies as st

from foxformer.ops import (gated_linear_attention, naive_gated_linear_attention,
                           recurrent_gated_linear_attention)

from .helpers import REL_TOL, make_inputs, rel_err

IMPLS = {"chunked": gated_linear_attention, "recurrent": recurrent_gated_linear_attention}


def _state(B, H, Dk, Dv, seed=5, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, H, Dk, Dv, generator=g, dtype=torch.float64).to(dtype)


def _assert_close(got, ref, tol=1e-10):
    got, ref = (got, ref) if isinstance(got, tuple) else ((got,), (ref,))
    for x, y in zip(got, ref):
        assert x.shape == y.shape
        assert rel_err(x, y) < tol


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("T,chunk", [(1, 64), (17, 5), (64, 64), (64, 24), (130, 24), (130, 64)])
@pytest.mark.parametrize("D", [16, 48])
def test_matches_naive_with_gqa_and_initial_state(impl, T, chunk, D):
    # mixed gates: 0, -1e-4, -5, -30, -inf and logsigmoid values, per token and head
    q, k, v, log_f = make_inputs(2, T, T, 4, 1, D, gate="mixed", seed=T + D)
    s0 = _state(2, 4, D, D)
    kw = dict(initial_state=s0, return_final_state=True, chunk_size=chunk)
    _assert_close(IMPLS[impl](q, k, v, log_f, **kw), naive_gated_linear_attention(q, k, v, log_f, **kw))


@pytest.mark.parametrize("gate", [0.0, -1e-4, -5.0, -30.0, float("-inf")])
def test_constant_gates(gate):
    q, k, v, log_f = make_inputs(1, 70, 70, 2, 2, 16, gate=gate)
    ref = naive_gated_linear_attention(q, k, v, log_f, return_final_state=True)
    for fn in IMPLS.values():
        _assert_close(fn(q, k, v, log_f, return_final_state=True, chunk_size=32), ref)
    if gate == float("-inf"):  # f = 0 everywhere: each token sees only itself
        expect = ((q * k).sum(-1, keepdim=True) * v)
        _assert_close(ref[0], expect)


def test_value_dim_differs_from_key_dim():
    q, k, _, log_f = make_inputs(1, 40, 40, 2, 1, 16, gate="mixed")
    v = torch.randn(1, 40, 1, 48, dtype=torch.float64)
    kw = dict(initial_state=_state(1, 2, 16, 48), return_final_state=True, chunk_size=16)
    out, state = gated_linear_attention(q, k, v, log_f, **kw)
    assert out.shape == (1, 40, 2, 48) and state.shape == (1, 2, 16, 48)
    _assert_close((out, state), naive_gated_linear_attention(q, k, v, log_f, **kw))


def test_large_cumsum_stays_finite_and_exact():
    # c reaches -20480: exp(-c_j) alone would overflow, exp(c_i) alone underflow
    q, k, v, log_f = make_inputs(1, 4096, 4096, 2, 1, 16, gate=-5.0)
    out, state = gated_linear_attention(q, k, v, log_f, return_final_state=True)
    ref = recurrent_gated_linear_attention(q, k, v, log_f, return_final_state=True)
    assert torch.isfinite(out).all() and torch.isfinite(state).all()
    _assert_close((out, state), ref)
    out32 = gated_linear_attention(q.float(), k.float(), v.float(), log_f.float())
    assert out32.dtype == torch.float32 and rel_err(out32, ref[0]) < 1e-5


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_low_precision_inputs_accumulate_in_fp32(dtype):
    q, k, v, log_f = make_inputs(1, 100, 100, 2, 1, 16, gate="mixed")
    ref = naive_gated_linear_attention(*[t.to(dtype).double() for t in (q, k, v)], log_f, return_final_state=True)
    out, state = gated_linear_attention(q.to(dtype), k.to(dtype), v.to(dtype), log_f.float(),
                                        return_final_state=True, chunk_size=32)
    assert out.dtype == dtype and state.dtype == torch.float32
    assert rel_err(out, ref[0]) < (1e-5 if dtype == torch.float32 else 1e-2)
    assert rel_err(state, ref[1]) < 1e-5


def _fwd_bwd(q, k, v, log_f, dtype, autocast, **kw):
    """out, state and the gradients of q, k, v, log f for q, k, v in ``dtype`` (log f fp32 below fp64),
    optionally under CPU autocast to ``dtype``: the model's case, where the op's own matmuls drop to it."""
    gate_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    leaves = [t.detach().to(d).requires_grad_() for t, d in zip((q, k, v, log_f), (dtype,) * 3 + (gate_dtype,))]
    with torch.autocast("cpu", dtype=dtype, enabled=autocast):
        out, state = gated_linear_attention(*leaves, return_final_state=True, **kw)
    g = torch.Generator().manual_seed(1)
    (out.double() * torch.randn(out.shape, generator=g, dtype=torch.float64)).sum().backward()
    return [out, state] + [t.grad for t in leaves]


def _unit_qk(q, k, v, log_f):
    """L2-normalised q and k, as the linear model feeds the op: |q . k| <= 1 keeps the state's scale set by v."""
    return torch.nn.functional.normalize(q, dim=-1), torch.nn.functional.normalize(k, dim=-1), v, log_f


LOW = [torch.bfloat16, torch.float16]


@pytest.mark.parametrize("autocast", [False, True], ids=["plain", "autocast"])
@pytest.mark.parametrize("dtype", LOW, ids=str)
def test_half_precision_inputs_against_fp64(dtype, autocast):
    inputs = _unit_qk(*make_inputs(2, 100, 100, 4, 2, 16, gate="mixed", seed=4))
    ref = _fwd_bwd(*inputs, torch.float64, False, chunk_size=32)
    got = _fwd_bwd(*inputs, dtype, autocast, chunk_size=32)
    assert got[0].dtype == dtype and got[1].dtype == torch.float32
    for name, a, b in zip(("out", "state", "dq", "dk", "dv", "dlog_f"), got, ref):
        assert rel_err(a, b) < REL_TOL[dtype], name


@pytest.mark.parametrize("autocast", [False, True], ids=["plain", "autocast"])
def test_large_cumsum_in_bf16(autocast):
    # c reaches -6144, and |b| reaches 192 inside a chunk: exp(b) is 0 in fp32, exp(-b) would be inf
    inputs = _unit_qk(*make_inputs(1, 2048, 2048, 2, 1, 16, gate=-3.0, seed=2))
    ref = recurrent_gated_linear_attention(*inputs, return_final_state=True)
    got = _fwd_bwd(*inputs, torch.bfloat16, autocast)
    assert rel_err(got[0], ref[0]) < REL_TOL[torch.bfloat16]
    assert rel_err(got[1], ref[1]) < REL_TOL[torch.bfloat16]
    assert all(torch.isfinite(g).all() for g in got[2:])


@pytest.mark.parametrize("impl", IMPLS)
def test_an_empty_batch_gives_empty_outputs_and_gradients(impl):
    """As forgetting_attention does at batch 0: the chunked op failed reshaping its zero-element output to
    [0, H, T, -1], whose -1 has no single answer (Dv differs from Dk here, so the shape is read, not guessed)."""
    q = torch.randn(0, 5, 4, 8, requires_grad=True)
    k, v, log_f = torch.randn(0, 5, 2, 8), torch.randn(0, 5, 2, 6), -torch.rand(0, 5, 4)
    out, state = IMPLS[impl](q, k, v, log_f, return_final_state=True, chunk_size=2)
    out.sum().backward()
    assert out.shape == (0, 5, 4, 6) and state.shape == (0, 4, 8, 6) and q.grad.shape == q.shape


def test_state_chaining_equals_one_pass():
    q, k, v, log_f = make_inputs(2, 130, 130, 4, 2, 16, gate="mixed", seed=3)
    whole, final = gated_linear_attention(q, k, v, log_f, return_final_state=True, chunk_size=24)
    cut = 57
    first, mid = gated_linear_attention(q[:, :cut], k[:, :cut], v[:, :cut], log_f[:, :cut],
                                        return_final_state=True, chunk_size=24)
    second, last = gated_linear_attention(q[:, cut:], k[:, cut:], v[:, cut:], log_f[:, cut:],
                                          initial_state=mid, return_final_state=True, chunk_size=24)
    _assert_close((torch.cat((first, second), dim=1), last), (whole, final))


def test_gradients_match_naive():
    q, k, v, log_f = make_inputs(1, 130, 130, 4, 1, 16, gate="mixed", seed=7)
    s0 = _state(1, 4, 16, 16)
    grads = []
    for fn in (gated_linear_attention, naive_gated_linear_attention):
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v, log_f, s0)]
        out, state = fn(*leaves[:4], initial_state=leaves[4], return_final_state=True, chunk_size=24)
        g = torch.Generator().manual_seed(1)
        loss = (out * torch.randn(out.shape, generator=g, dtype=out.dtype)).sum() + \
            (state * torch.randn(state.shape, generator=g, dtype=state.dtype)).sum()
        loss.backward()
        grads.append([t.grad for t in leaves])
    for got, ref in zip(*grads):
        assert rel_err(got, ref) < 1e-10


def test_gradcheck_tiny():
    g = torch.Generator().manual_seed(0)
    q, k = (torch.randn(1, 7, 2, 3, generator=g, dtype=torch.float64) for _ in range(2))
    k = k[:, :, :1]
    v = torch.randn(1, 7, 1, 2, generator=g, dtype=torch.float64)
    # strictly negative gates: gradcheck's perturbation must not push log f above 0
    log_f = -0.01 - torch.rand(1, 7, 2, generator=g, dtype=torch.float64) * 3
    s0 = torch.randn(1, 2, 3, 2, generator=g, dtype=torch.float64)
    inputs = [t.requires_grad_() for t in (q, k, v, log_f, s0)]

    def fn(q, k, v, log_f, s0):
        return gated_linear_attention(q, k, v, log_f, initial_state=s0, return_final_state=True, chunk_size=3)

    assert torch.autograd.gradcheck(fn, inputs)


def _bad(change):
    q, k, v, log_f = make_inputs(1, 8, 8, 4, 2, 16, gate=-0.5)
    kw = dict(q=q, k=k, v=v, log_fgate=log_f)
    change(kw)
    return kw


@pytest.mark.parametrize("change,error,match", [
    (lambda kw: kw.update(q=kw["q"][0]), ValueError, "q must be 4-D"),
    (lambda kw: kw.update(k=kw["k"].numpy()), TypeError, "k must be a torch.Tensor"),
    (lambda kw: kw.update(v=kw["v"].float()), TypeError, "share one dtype"),
    (lambda kw: kw.update(q=kw["q"].int()), TypeError, "q must be float16"),
    (lambda kw: kw.update(k=kw["k"][:, :5]), ValueError, "k and v must agree"),
    (lambda kw: kw.update(k=kw["k"][:, :5], v=kw["v"][:, :5]), ValueError, r"k and v must be \[batch, seq\]"),
    (lambda kw: kw.update(k=kw["k"][..., :8]), ValueError, "head_dim mismatch"),
    (lambda kw: kw.update(k=kw["k"][:, :, :1].expand(-1, -1, 3, -1), v=kw["v"][:, :, :1].expand(-1, -1, 3, -1)),
     ValueError, "multiple of key/value heads"),
    (lambda kw: kw.update(log_fgate=kw["log_fgate"][..., :1]), ValueError, r"log_fgate must be \[batch, seq, Hq\]"),
    (lambda kw: kw.update(log_fgate=kw["log_fgate"][..., :2]), ValueError,
     r"log_fgate must be \[batch, seq, Hq\] = \(1, 8, 4\), got \(1, 8, 2\); it has one entry per key/value head "
     r"\(Hkv=2\), not per query head \(Hq=4\): where a group's query heads share one gate, pass "
     r"log_fgate\.repeat_interleave\(2, dim=2\)$"),
    (lambda kw: kw.update({name: x.transpose(1, 2) for name, x in kw.items()}), ValueError,
     r"pass q.transpose\(1, 2\), k.transpose\(1, 2\), v.transpose\(1, 2\), log_fgate.transpose\(1, 2\)$"),
    (lambda kw: kw.update(log_fgate=kw["log_fgate"].abs()), ValueError, "log_fgate must be <= 0"),
    (lambda kw: kw.update(log_fgate=kw["log_fgate"] * float("nan")), ValueError, "log_fgate contains NaN"),
    (lambda kw: kw.update(initial_state=torch.zeros(1, 2, 16, 16)), ValueError, "initial_state must be"),
    (lambda kw: kw.update(initial_state=[0.0]), TypeError, "initial_state must be a torch.Tensor"),
    (lambda kw: kw.update(chunk_size=0), ValueError, "chunk_size must be a positive int"),
    (lambda kw: kw.update(chunk_size=16.0), ValueError, "chunk_size must be a positive int"),
    (lambda kw: kw.update(return_final_state="yes"), TypeError, "return_final_state"),
])
@pytest.mark.parametrize("fn", [gated_linear_attention, naive_gated_linear_attention, recurrent_gated_linear_attention])
def test_bad_inputs_raise_clear_errors(fn, change, error, match):
    kw = _bad(change)
    with pytest.raises(error, match=match):
        fn(kw.pop("q"), kw.pop("k"), kw.pop("v"), kw.pop("log_fgate"), **kw)


def _random_case(B, T, Hq, Hkv, Dk, Dv, p_cut, seed, with_state):
    """fp64 q, k, v, log f, S_0. Gates span f ~ 1 to strong decay (logsigmoid of N(2, 3^2)), exact 0 (f = 1)
    and -inf (f = 0, a cut) with probability p_cut."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T, Hq, Dk, generator=g, dtype=torch.float64)
    k = torch.randn(B, T, Hkv, Dk, generator=g, dtype=torch.float64)
    v = torch.randn(B, T, Hkv, Dv, generator=g, dtype=torch.float64)
    log_f = torch.nn.functional.logsigmoid(torch.randn(B, T, Hq, generator=g, dtype=torch.float64) * 3 + 2)
    u = torch.rand(B, T, Hq, generator=g, dtype=torch.float64)
    log_f = torch.where(u < p_cut, float("-inf"), torch.where(u > 0.9, 0.0, log_f))
    s0 = torch.randn(B, Hq, Dk, Dv, generator=g, dtype=torch.float64) if with_state else None
    return q, k, v, log_f, s0


_shapes = dict(B=st.integers(1, 2), T=st.integers(1, 40), Hkv=st.integers(1, 2), group=st.sampled_from([1, 2, 3]),
               Dk=st.integers(1, 12), Dv=st.integers(1, 12), p_cut=st.sampled_from([0.0, 0.1, 0.5, 1.0]),
               seed=st.integers(0, 10_000))


@settings(max_examples=100, deadline=None)
@given(chunk=st.integers(1, 48), with_state=st.booleans(), **_shapes)
def test_property_chunked_equals_naive(B, T, Hkv, group, Dk, Dv, p_cut, seed, chunk, with_state):
    q, k, v, log_f, s0 = _random_case(B, T, Hkv * group, Hkv, Dk, Dv, p_cut, seed, with_state)
    results = []
    for fn in (gated_linear_attention, naive_gated_linear_attention):
        leaves = [t.clone().requires_grad_() for t in (q, k, v, log_f, s0) if t is not None]
        out, state = fn(*leaves[:4], initial_state=leaves[4] if with_state else None, return_final_state=True,
                        chunk_size=chunk)
        g = torch.Generator().manual_seed(seed + 1)
        loss = (out * torch.randn(out.shape, generator=g, dtype=out.dtype)).sum() + \
            (state * torch.randn(state.shape, generator=g, dtype=state.dtype)).sum()
        loss.backward()
        results.append([out, state] + [t.grad for t in leaves])
    for name, got, ref in zip(("out", "state", "dq", "dk", "dv", "dlog_f", "ds0"), *results):
        assert rel_err(got, ref) < 1e-10, name


@settings(max_examples=60, deadline=None)
@given(cut=st.integers(1, 39), chunk_a=st.integers(1, 48), chunk_b=st.integers(1, 48), **_shapes)
def test_property_state_passing_equals_one_pass(B, T, Hkv, group, Dk, Dv, p_cut, seed, cut, chunk_a, chunk_b):
    """Prefill in two calls, the second starting from the first's final state, whatever the chunk sizes."""
    T = max(T, 2)
    cut = min(cut, T - 1)
    q, k, v, log_f, s0 = _random_case(B, T, Hkv * group, Hkv, Dk, Dv, p_cut, seed, True)
    whole = naive_gated_linear_attention(q, k, v, log_f, initial_state=s0, return_final_state=True)
    first, mid = gated_linear_attention(q[:, :cut], k[:, :cut], v[:, :cut], log_f[:, :cut], initial_state=s0,
                                        return_final_state=True, chunk_size=chunk_a)
    second, last = gated_linear_attention(q[:, cut:], k[:, cut:], v[:, cut:], log_f[:, cut:], initial_state=mid,
                                          return_final_state=True, chunk_size=chunk_b)
    _assert_close((torch.cat((first, second), dim=1), last), whole)
