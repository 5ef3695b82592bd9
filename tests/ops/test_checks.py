"""Bad input fails with a clear ValueError/TypeError that names the argument."""
import pytest
import torch

from foxformer import forgetting_attention, forgetting_attention_cumsum, gate_cumsum
from foxformer.ops import gated_linear_attention, naive_forgetting_attention, portable
from foxformer.ops.forgetting_attn.checks import NonFiniteValueError


def _ok(B=1, Tq=8, Tk=8, Hq=4, Hkv=2, D=16):
    return dict(q=torch.randn(B, Tq, Hq, D), k=torch.randn(B, Tk, Hkv, D),
                v=torch.randn(B, Tk, Hkv, D), log_fgate=-torch.rand(B, Tk, Hq))


def _call(fn=None, **overrides):
    args = _ok()
    kwargs = {key: overrides.pop(key) for key in list(overrides) if key not in args}
    args.update(overrides)
    if fn is None:
        fn, kwargs["backend"] = forgetting_attention, "torch"
    return fn(args["q"], args["k"], args["v"], args["log_fgate"], **kwargs)


CASES = [
    ("q-3d", dict(q=torch.randn(8, 4, 16)), ValueError, "q must be 4-D"),
    ("batch-mismatch", dict(k=torch.randn(2, 8, 2, 16), v=torch.randn(2, 8, 2, 16)), ValueError, "batch mismatch"),
    ("k-v-shapes", dict(v=torch.randn(1, 8, 2, 8)), ValueError, "k and v must have the same shape"),
    ("head-dim", dict(k=torch.randn(1, 8, 2, 8), v=torch.randn(1, 8, 2, 8)), ValueError, "head_dim mismatch"),
    ("heads-not-multiple", dict(k=torch.randn(1, 8, 3, 16), v=torch.randn(1, 8, 3, 16)), ValueError, "multiple"),
    ("D-too-large", dict(q=torch.randn(1, 8, 4, 300), k=torch.randn(1, 8, 2, 300), v=torch.randn(1, 8, 2, 300)),
     ValueError, "head_dim must be in"),
    ("Tq-gt-Tk", dict(q=torch.randn(1, 9, 4, 16)), ValueError, "more positions"),
    ("gate-shape", dict(log_fgate=torch.zeros(1, 8, 2)), ValueError, "log_fgate must be"),
    ("gate-dtype", dict(log_fgate=torch.zeros(1, 8, 4, dtype=torch.int64)), TypeError, "log_fgate must be a floating"),
    ("gate-nan", dict(log_fgate=torch.full((1, 8, 4), float("nan"))), ValueError, "NaN"),
    ("gate-positive", dict(log_fgate=torch.full((1, 8, 4), 0.5)), ValueError, "<= 0"),
    ("qkv-dtypes", dict(k=torch.randn(1, 8, 2, 16, dtype=torch.float64)), TypeError,
     r"share one dtype, got q torch.float32, k torch.float64, v torch.float32; cast them with \.to\(q\.dtype\)"),
    ("int-q", dict(q=torch.zeros(1, 8, 4, 16, dtype=torch.int32)), TypeError, "q must be float16"),
    ("not-a-tensor", dict(q=[1, 2]), TypeError, "q must be a torch.Tensor"),
    ("cu-int64", dict(cu_seqlens=torch.tensor([0, 8])), TypeError, "int32"),
    ("cu-not-increasing", dict(cu_seqlens=torch.tensor([0, 5, 5, 8], dtype=torch.int32)), ValueError, "strictly increasing"),
    ("cu-wrong-end", dict(cu_seqlens=torch.tensor([0, 5, 7], dtype=torch.int32)), ValueError, "end at T=8"),
    ("cu-2d", dict(cu_seqlens=torch.tensor([[0, 8]], dtype=torch.int32)), ValueError, "1-D"),
    ("cu-batch", dict(q=torch.randn(2, 8, 4, 16), k=torch.randn(2, 8, 2, 16), v=torch.randn(2, 8, 2, 16),
                      log_fgate=-torch.rand(2, 8, 4), cu_seqlens=torch.tensor([0, 8], dtype=torch.int32)),
     ValueError, "batch must be 1"),
    ("max-seqlen-short", dict(cu_seqlens=torch.tensor([0, 6, 8], dtype=torch.int32), max_seqlen=4), ValueError, "max_seqlen"),
    ("scale", dict(softmax_scale="x"), TypeError, "softmax_scale"),
    # True was a scale of 1.0, not the default 1 / sqrt(D)
    ("scale-bool", dict(softmax_scale=True), TypeError, "softmax_scale must be a finite float or None, got True"),
    ("max-seqlen-str", dict(cu_seqlens=torch.tensor([0, 6, 8], dtype=torch.int32), max_seqlen="6"), TypeError,
     "max_seqlen must be an int"),
    ("max-seqlen-float", dict(max_seqlen=5.7), TypeError, "max_seqlen must be an int"),
    # alone it was ignored, a negative one too: a forgotten cu_seqlens attended across the packed documents
    ("max-seqlen-without-cu", dict(max_seqlen=4), ValueError,
     r"^max_seqlen=4 was given without cu_seqlens: max_seqlen only applies with cu_seqlens "),
    ("max-seqlen-negative-without-cu", dict(max_seqlen=-1), ValueError, r"^max_seqlen=-1 was given without cu_seqlens"),
    ("return-lse-str", dict(return_lse="yes"), TypeError, "return_lse must be True or False"),
    # q, k, v in [B, H, T, D] (with GQA) blamed the gate's shape, or claimed q had more positions than k
    ("bhtd-layout", dict(q=torch.randn(1, 4, 8, 16), k=torch.randn(1, 2, 8, 16), v=torch.randn(1, 2, 8, 16),
                         log_fgate=-torch.rand(1, 8, 4)), ValueError,
     r"\[batch, heads, seq, \.\.\.\] layout\): pass q\.transpose\(1, 2\), k\.transpose\(1, 2\), "
     r"v\.transpose\(1, 2\)$"),
    # the gate in [B, H, T] as well: "q has more positions (Tq=4) than k and v (Tk=2)"
    ("bhtd-layout-gate-too", dict(q=torch.randn(1, 4, 8, 16), k=torch.randn(1, 2, 8, 16), v=torch.randn(1, 2, 8, 16),
                                  log_fgate=-torch.rand(1, 4, 8)), ValueError,
     r"pass q\.transpose\(1, 2\), k\.transpose\(1, 2\), v\.transpose\(1, 2\), "
     r"log_fgate\.transpose\(1, 2\)$"),
    # k and v alone: "query heads (4) must be a multiple of key/value heads (8)"
    ("k-v-bhtd", dict(k=torch.randn(1, 2, 8, 16), v=torch.randn(1, 2, 8, 16)), ValueError,
     r"pass k\.transpose\(1, 2\), v\.transpose\(1, 2\)$"),
    ("gate-bht", dict(log_fgate=-torch.rand(1, 4, 8)), ValueError, r"pass log_fgate\.transpose\(1, 2\)$"),
    # T = 4 and H = 8 fit as well as T = 8 and H = 4: both fixes, for the caller to choose
    ("bhtd-or-gate-bht", dict(q=torch.randn(1, 4, 8, 16), k=torch.randn(1, 4, 8, 16), v=torch.randn(1, 4, 8, 16),
                              log_fgate=-torch.rand(1, 8, 4)), ValueError,
     r"pass log_fgate\.transpose\(1, 2\) or q\.transpose\(1, 2\), k\.transpose\(1, 2\), v\.transpose\(1, 2\) "
     r"\(whichever matches how they were made\)$"),
    # with Tq < Tk a gate of the queries alone (Tq = Hq = 4 here) was taken for a transposed one
    ("gate-of-queries-only", dict(q=torch.randn(1, 4, 4, 16), log_fgate=-torch.rand(1, 4, 4)), ValueError,
     r"got \(1, 4, 4\); it has one entry per key position \(Tk=8\), not per query \(Tq=4\)"),
    # GQA: a gate per key/value head, the layout of k and v, said only the shape it must have
    ("gate-per-kv-head", dict(log_fgate=-torch.rand(1, 8, 2)), ValueError,
     r"got \(1, 8, 2\); it has one entry per key/value head \(Hkv=2\), not per query head \(Hq=4\): where a group's "
     r"query heads share one gate, pass log_fgate\.repeat_interleave\(2, dim=2\)$"),
    # Tq = 0 has an (empty) answer; queries with no key have none
    ("queries-without-keys",
     dict(k=torch.randn(1, 0, 2, 16), v=torch.randn(1, 0, 2, 16), log_fgate=-torch.rand(1, 0, 4)), ValueError, r"more positions \(Tq=8\) than k and v \(Tk=0\)"),
    ("cu-no-bounds", dict(cu_seqlens=torch.tensor([], dtype=torch.int32)), ValueError, r"1-D \[N \+ 1\]"),
    ("cu-no-sequence-in-T-8", dict(cu_seqlens=torch.tensor([0], dtype=torch.int32)), ValueError, "end at T=8"),
    ("no-heads", dict(q=torch.randn(1, 8, 0, 16), k=torch.randn(1, 8, 0, 16), v=torch.randn(1, 8, 0, 16),
                      log_fgate=-torch.rand(1, 8, 0)), ValueError, "need at least one head .*Hq=0, Hkv=0"),
    # +inf is f = e^inf: as invalid a log-sigmoid as any positive gate
    ("gate-plus-inf", dict(log_fgate=torch.zeros(1, 8, 4).index_fill_(1, torch.tensor([3]), float("inf"))),
     ValueError, r"log_fgate must be <= 0 .*F\.logsigmoid"),
]


@pytest.mark.parametrize("overrides,exc,match", [pytest.param(*c[1:], id=c[0]) for c in CASES])
def test_bad_input(overrides, exc, match):
    with pytest.raises(exc, match=match):
        _call(**overrides)


@pytest.mark.parametrize("overrides,exc,match", [pytest.param(*c[1:], id=c[0]) for c in CASES])
def test_the_naive_reference_checks_its_input_alike(overrides, exc, match):
    """naive_forgetting_attention is public and checked nothing: a cu_seqlens ending before T returned fewer rows
    than q has, a positive or NaN gate gave NaN, a bad max_seqlen passed."""
    with pytest.raises(exc, match=match):
        _call(naive_forgetting_attention, **overrides)


def test_unknown_backend():
    a = _ok()
    with pytest.raises(ValueError, match="backend must be one of"):
        forgetting_attention(a["q"], a["k"], a["v"], a["log_fgate"], backend="cuda")


def test_a_misspelt_backend_is_offered_the_closest_one():
    a = _ok()
    with pytest.raises(ValueError, match=r"^backend must be one of \('auto', 'gluon', 'triton', 'torch', 'naive'\), "
                                         r"got 'trition' \(did you mean 'triton'\?\)$"):
        forgetting_attention(a["q"], a["k"], a["v"], a["log_fgate"], backend="trition")


def test_triton_backend_rejects_fp32():
    a = _ok()
    with pytest.raises(TypeError, match="float16 or bfloat16"):
        forgetting_attention(a["q"], a["k"], a["v"], a["log_fgate"], backend="triton")


def test_gluon_on_cpu_tensors_points_to_a_backend_that_runs_there():
    a = {name: t.to(torch.bfloat16) if name != "log_fgate" else t for name, t in _ok().items()}
    with pytest.raises(ValueError, match="backend='gluon'.*use backend='torch' or 'auto'"):
        forgetting_attention(a["q"], a["k"], a["v"], a["log_fgate"], backend="gluon")


def test_different_devices():
    a = _ok()
    meta_k = torch.empty(1, 8, 2, 16, device="meta")
    with pytest.raises(ValueError, match=r"one device, got q on cpu, k on meta, v on meta, log_fgate on cpu; move them "
                                         r"with \.to\(q\.device\)"):
        forgetting_attention(a["q"], meta_k, meta_k, a["log_fgate"], backend="torch")


def test_cumsum_entry_rejects_naive():
    a = _ok()
    with pytest.raises(ValueError, match="needs log_fgate"):
        forgetting_attention_cumsum(a["q"], a["k"], a["v"], torch.zeros(1, 8, 4, dtype=torch.float64), backend="naive")


@pytest.mark.parametrize("bad", [float("-inf"), float("inf")], ids=["c-minus-inf", "c-plus-inf"])
def test_cumsum_entry_rejects_non_finite_c(bad):
    """c = log_fgate.cumsum() of a -inf gate is -inf from there on, and c_i - c_j = nan: c must be finite
    (gate_cumsum floors -inf gates)."""
    a = _ok()
    c = torch.zeros(1, 8, 4, dtype=torch.float64)
    c[0, 4:, 1] = bad
    with pytest.raises(ValueError, match=r"c must be finite .*got inf \(4 of 32 entries, the first at batch 0, "
                                         r"position 4, head 1\)"):
        forgetting_attention_cumsum(a["q"], a["k"], a["v"], c, backend="torch")


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_a_nan_gate_is_said_with_where_it_is_and_where_it_came_from(backend):
    """Was `log_fgate contains NaN` alone: no entry to look at, nothing on where the NaN came from."""
    a = _ok(B=2)
    a["log_fgate"][1, 5, 3] = a["log_fgate"][1, 6, 0] = float("nan")
    with pytest.raises(NonFiniteValueError) as e:
        forgetting_attention(a["q"], a["k"], a["v"], a["log_fgate"], backend=backend)
    assert str(e.value) == ("log_fgate contains NaN (2 of 64 entries, the first at batch 1, position 5, head 3): a NaN "
                            "gate comes from NaN in what made it (the gate logits, their inputs or weights); find the "
                            "first with torch.isnan")
    assert e.value.what == "log_fgate contains NaN"  # what the training loop says, with its own fix


def _varlen_half(T=40, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, T, 2, 16, generator=g).half() for _ in range(3))
    return q, k, v, -torch.rand(1, T, 2, generator=g)


def _varlen_call(compiled, backend):
    def call(q, k, v, log_f, cu, max_seqlen):
        return forgetting_attention(q, k, v, log_f, cu_seqlens=cu, max_seqlen=max_seqlen, backend=backend)
    return torch.compile(call, backend="aot_eager", fullgraph=True) if compiled else call


BACKENDS_MODES = [pytest.param(b, m, id=f"{b}-{'compiled' if m else 'eager'}")
                  for b in ("torch", "triton") for m in (False, True)]
BAD_CU = [
    pytest.param([0, 5, 40], 8, id="max_seqlen-shorter-than-a-segment"),
    pytest.param([0, 5, 48], 43, id="cu-past-T"),
    pytest.param([0, 5, 5, 40], 35, id="cu-empty-segment"),
]


@pytest.mark.parametrize("backend,compiled", BACKENDS_MODES)
@pytest.mark.parametrize("bounds,max_seqlen", BAD_CU)
def test_bad_varlen_bounds_never_give_a_silent_answer(backend, compiled, bounds, max_seqlen):
    """Under torch.compile reading cu_seqlens on the host would be a device sync, so the eager check is
    skipped; the kernels' grid then trusted max_seqlen and rows of longer segments stayed unwritten."""
    cu = torch.tensor(bounds, dtype=torch.int32)
    with pytest.raises((ValueError, RuntimeError), match="max_seqlen|cu_seqlens"):
        _varlen_call(compiled, backend)(*_varlen_half(), cu, max_seqlen)


@pytest.mark.parametrize("backend,compiled", BACKENDS_MODES)
def test_good_varlen_bounds_pass_the_device_check(backend, compiled):
    cu = torch.tensor([0, 5, 40], dtype=torch.int32)
    inputs = _varlen_half()
    got = _varlen_call(compiled, backend)(*inputs, cu, 35)
    torch.testing.assert_close(got, forgetting_attention(*inputs, cu_seqlens=cu, backend=backend))


def _empty_pack(compiled, backend, bounds):
    if compiled:  # the tests above compiled `call` for other shapes, past dynamo's recompile limit
        torch._dynamo.reset()
    return _varlen_call(compiled, backend)(*_varlen_half(T=0), torch.tensor(bounds, dtype=torch.int32), 0)


@pytest.mark.parametrize("backend,compiled", BACKENDS_MODES)
def test_an_empty_pack_gives_an_empty_result(backend, compiled):
    """T = 0 packs no sequence: cu_seqlens [0] (N = 0), whose longest sequence is 0 tokens long."""
    assert _empty_pack(compiled, backend, [0]).shape == (1, 0, 2, 16)


@pytest.mark.parametrize("backend,compiled", BACKENDS_MODES)
def test_an_empty_sequence_in_an_empty_pack_is_still_refused(backend, compiled):
    with pytest.raises((ValueError, RuntimeError), match="cu_seqlens"):
        _empty_pack(compiled, backend, [0, 0])


def _positive(gate):
    return gate.index_fill(1, torch.tensor([5]), 0.25)


def _nan(gate):
    return gate.index_fill(1, torch.tensor([5]), float("nan"))


def _infinite_c(gate):
    return gate_cumsum(gate).index_fill(1, torch.tensor([5]), float("-inf"))


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("fn,spoil,match", [
    pytest.param(forgetting_attention, _positive, "log_fgate must not hold NaN, and must be <= 0",
                 id="log_fgate-positive"),
    pytest.param(forgetting_attention, _nan, "log_fgate must not hold NaN", id="log_fgate-nan"),
    pytest.param(forgetting_attention_cumsum, _infinite_c, "c must not hold NaN, and must be finite",
                 id="c-minus-inf"),
])
def test_compiled_calls_check_the_gate_values_on_cpu(fn, spoil, match, backend):
    """The value checks were skipped under torch.compile (a host read breaks the graph): a positive gate ran without
    a word. On CPU, where the eager checks always run, they are now an assert in the graph, as for cu_seqlens."""
    torch._dynamo.reset()
    q, k, v, log_f = _varlen_half(T=8)
    compiled = torch.compile(lambda q, k, v, gate: fn(q, k, v, gate, backend=backend), backend="aot_eager",
                             fullgraph=True)
    good = log_f if fn is forgetting_attention else gate_cumsum(log_f)
    torch.testing.assert_close(compiled(q, k, v, good), fn(q, k, v, good, backend=backend))
    with pytest.raises(RuntimeError, match=match):
        compiled(q, k, v, spoil(log_f))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("fn", [forgetting_attention_cumsum, portable.forgetting_attention_cumsum],
                         ids=["op", "portable"])
def test_a_cumsum_of_another_dtype_than_float64_is_refused(fn, dtype):
    """c was cast to float64 without a word: the low bits a narrower cumsum lost do not come back (at 64K tokens an
    fp32 one is off by more than ten times the float64 one: test_reference), as the decode op refuses them too."""
    a = _ok()
    with pytest.raises(TypeError, match=f"c must be float64, got {dtype}: c is the cumulative sum"):
        fn(a["q"], a["k"], a["v"], gate_cumsum(a["log_fgate"]).to(dtype))


def _no_queries(fn, Tk, dtype=torch.float32, **kwargs):
    """forgetting_attention(_cumsum) or the portable one of Tq = 0 before Tk keys, every input requiring grad:
    (the inputs, out, lse)."""
    a = {name: t.to(dtype) if name != "log_fgate" else t for name, t in _ok(B=2, Tq=0, Tk=Tk).items()}
    if fn in (forgetting_attention_cumsum, portable.forgetting_attention_cumsum):
        a["log_fgate"] = gate_cumsum(a["log_fgate"])
    inputs = [t.requires_grad_() for t in a.values()]
    return inputs, *fn(*inputs, return_lse=True, **kwargs)


EMPTY_ENTRIES = [pytest.param(fn, backend, id=f"{fn.__module__.rsplit('.', 1)[-1]}.{fn.__name__}-{backend}")
                 for fn, backends in ((forgetting_attention, ("torch", "naive", "triton")),
                                      (forgetting_attention_cumsum, ("torch", "triton")),
                                      (portable.forgetting_attention, ("auto",)),
                                      (portable.forgetting_attention_cumsum, ("auto",)))
                 for backend in backends]


@pytest.mark.parametrize("Tk", [0, 5])
@pytest.mark.parametrize("fn,backend", EMPTY_ENTRIES)
def test_no_queries_give_an_empty_result_with_gradients(fn, backend, Tk):
    """Tq = 0 was a ValueError while the decode op returned an empty result for it: now both do, as torch's
    attention does, and the backward reaches every input (k, v and the gate with Tk > 0 get zeros)."""
    dtype = torch.float16 if backend == "triton" else torch.float32  # the kernels' dtypes
    inputs, out, lse = _no_queries(fn, Tk, dtype, backend=backend)
    assert out.shape == (2, 0, 4, 16) and out.dtype == inputs[0].dtype
    assert lse.shape == (2, 4, 0) and lse.dtype == torch.float32
    grads = torch.autograd.grad(out.sum() + lse.sum(), inputs)
    for grad, x in zip(grads, inputs):
        assert grad.shape == x.shape and grad.dtype == x.dtype and not grad.any()


@pytest.mark.parametrize("fn,backend", EMPTY_ENTRIES)
def test_every_entry_refuses_max_seqlen_without_cu_seqlens(fn, backend):
    """CASES try forgetting_attention and the naive reference; the cumsum entry and the portable ops (a standalone
    export's) share the check: none computes attention across the documents of a row whose cu_seqlens was left out."""
    a = {name: t.half() if backend == "triton" and name != "log_fgate" else t for name, t in _ok().items()}
    gate = gate_cumsum(a["log_fgate"]) if fn in (forgetting_attention_cumsum, portable.forgetting_attention_cumsum) \
        else a["log_fgate"]
    with pytest.raises(ValueError, match=r"^max_seqlen=8 was given without cu_seqlens"):
        fn(a["q"], a["k"], a["v"], gate, max_seqlen=8, backend=backend)


def test_the_naive_reference_has_no_queries_alike():
    inputs, out, lse = _no_queries(naive_forgetting_attention, 5)
    assert out.shape == (2, 0, 4, 16) and lse.shape == (2, 4, 0)
    assert [g.shape for g in torch.autograd.grad(out.sum(), inputs)] == [x.shape for x in inputs]


@pytest.mark.parametrize("packed", [False, True], ids=["batch", "cu_seqlens"])
def test_meta_and_fake_tensors_pass_the_checks_without_values(packed):
    """The value checks (NaN gates, cu_seqlens bounds) called Tensor.item() and failed on the meta device and
    under FakeTensorMode, so a FoX model could not be built or traced there: shapes are checked, values skipped."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    args = _ok(B=1, Tq=8, Tk=8)
    extra = {"cu_seqlens": torch.tensor([0, 3, 8], dtype=torch.int32)} if packed else {}
    meta = {k: v.to("meta") for k, v in {**args, **extra}.items()}
    out = forgetting_attention(meta.pop("q"), meta.pop("k"), meta.pop("v"), meta.pop("log_fgate"), backend="torch",
                               **meta)
    assert out.is_meta and out.shape == (1, 8, 4, 16)
    with FakeTensorMode() as mode:
        fake = {k: mode.from_tensor(v) for k, v in {**args, **extra}.items()}
        out = forgetting_attention(fake.pop("q"), fake.pop("k"), fake.pop("v"), fake.pop("log_fgate"),
                                   backend="torch", **fake)
    assert out.shape == (1, 8, 4, 16)
    with pytest.raises(ValueError, match="log_fgate must be"):  # a shape fault is still one
        forgetting_attention(*(torch.empty(1, 8, 4, 16, device="meta") for _ in range(3)),
                             torch.empty(1, 8, 2, device="meta"), backend="torch")


def _jvp(f, x):
    return torch.func.jvp(f, (x,), (torch.ones_like(x),))[1]


def _forward_ad(f, x):
    from torch.autograd import forward_ad

    with forward_ad.dual_level():
        return forward_ad.unpack_dual(f(forward_ad.make_dual(x, torch.ones_like(x)))).tangent


def _func_grad(f, x):
    return torch.func.grad(lambda y: f(y).sum())(x)


TRANSFORMS = [pytest.param(_jvp, "forward-mode", id="func-jvp"),
              pytest.param(_forward_ad, "forward-mode", id="forward_ad-dual"),
              pytest.param(_func_grad, "torch.func.grad", id="func-grad")]
ENTRIES = [pytest.param(False, id="log_fgate"), pytest.param(True, id="cumsum")]


@pytest.mark.parametrize("from_cumsum", ENTRIES)
@pytest.mark.parametrize("transform,match", TRANSFORMS)
def test_function_transforms_the_custom_ops_lack_are_refused(transform, match, from_cumsum):
    """The backends other than "naive" are custom ops with a backward alone: torch.func.jvp and forward_ad gave
    them a zero tangent without a word, and torch.func.grad failed on autograd.Function internals."""
    a = {name: t.double() for name, t in _ok().items()}
    if from_cumsum:
        c = gate_cumsum(a["log_fgate"])
        f = lambda q: forgetting_attention_cumsum(q, a["k"], a["v"], c, backend="torch")  # noqa: E731
    else:
        f = lambda q: forgetting_attention(q, a["k"], a["v"], a["log_fgate"], backend="torch")  # noqa: E731
    with pytest.raises(RuntimeError, match=f"backend='torch'.*{match}.*use backend='naive'"):
        transform(f, a["q"])


@pytest.mark.parametrize("transform", [pytest.param(p.values[0], id=p.id) for p in TRANSFORMS])
def test_naive_backend_runs_the_function_transforms(transform):
    """What the refusal points to: the naive backend's derivatives along q match central differences."""
    a = {name: t.double() for name, t in _ok().items()}
    f = lambda q: forgetting_attention(q, a["k"], a["v"], a["log_fgate"], backend="naive")  # noqa: E731
    got = transform(f, a["q"])
    h = 1e-6
    along_ones = (f(a["q"] + h) - f(a["q"] - h)) / (2 * h)
    if transform is _func_grad:  # the gradient of sum(f), contracted with the same direction
        got, along_ones = got.sum(), along_ones.sum()
    torch.testing.assert_close(got, along_ones, rtol=1e-6, atol=1e-6)


VMAPPED = [pytest.param(lambda q, k, v, f: forgetting_attention(q, k, v, f, backend="torch"), id="torch"),
           pytest.param(lambda q, k, v, f: forgetting_attention(q, k, v, f, backend="naive"), id="naive"),
           pytest.param(lambda q, k, v, f: gated_linear_attention(q, k, v, f), id="gated_linear_attention")]


@pytest.mark.parametrize("fn", VMAPPED)
def test_vmap_over_the_gates_checks_every_element(fn):
    """The gate checks took bool() of a batched tensor, which torch.vmap refuses ("data-dependent control
    flow"): vmap over the gates failed on every backend. They now read the values under vmap's wrapper."""
    a = {name: t.double() for name, t in _ok().items()}
    gates = -torch.rand(3, *a["log_fgate"].shape, dtype=torch.float64)
    per_gate = torch.vmap(lambda f: fn(a["q"], a["k"], a["v"], f), in_dims=3)(gates.movedim(0, 3))
    torch.testing.assert_close(per_gate, torch.stack([fn(a["q"], a["k"], a["v"], f) for f in gates]))
    gates[2, 0, 5, 1] = 0.5
    with pytest.raises(ValueError, match="log_fgate must be <= 0"):
        torch.vmap(lambda f: fn(a["q"], a["k"], a["v"], f))(gates)


GATE_CUMSUM_CASES = [
    ("list", dict(log_fgate=[[[-0.5]]]), TypeError, "log_fgate must be a torch.Tensor"),
    ("2d", dict(log_fgate=-torch.rand(8, 4)), ValueError, r"log_fgate must be \[B, T, H\]"),
    ("int", dict(log_fgate=torch.zeros(1, 8, 4, dtype=torch.int64)), TypeError, "log_fgate must be a floating"),
    ("nan", dict(log_fgate=torch.full((1, 8, 4), float("nan"))), ValueError, "NaN"),
    ("positive", dict(log_fgate=torch.full((1, 8, 4), 0.5)), ValueError, "<= 0"),
    ("plus-inf", dict(log_fgate=torch.full((1, 8, 4), float("inf"))), ValueError, "<= 0"),
    ("initial-shape", dict(initial=torch.zeros(4, 1)), ValueError, r"initial must be \[B, H\]"),
    ("initial-int", dict(initial=torch.zeros(1, 4, dtype=torch.int64)), TypeError, "initial must be a floating"),
    ("initial-device", dict(initial=torch.zeros(1, 4, device="meta")), ValueError, "initial must be on log_fgate's"),
]


@pytest.mark.parametrize("overrides,exc,match", [pytest.param(*c[1:], id=c[0]) for c in GATE_CUMSUM_CASES])
def test_gate_cumsum_checks_its_gate_as_the_attention_ops_do(overrides, exc, match):
    """gate_cumsum took a positive or NaN gate without a word (and the cumsum ops downstream check only that c is
    finite), failed on .dim() for a list, and left a wrong initial to torch's own errors."""
    args = dict(log_fgate=-torch.rand(1, 8, 4), initial=None) | overrides
    with pytest.raises(exc, match=match):
        gate_cumsum(args["log_fgate"], initial=args["initial"])


def test_gate_cumsum_accepts_cut_gates_and_an_initial_value():
    """-inf (f = 0) is a valid gate: floored, not refused."""
    log_f = -torch.rand(1, 8, 4, dtype=torch.float64)
    log_f[0, 3] = float("-inf")
    c = gate_cumsum(log_f, initial=torch.full((1, 4), -2.0, dtype=torch.float64))
    torch.testing.assert_close(c, (log_f.clamp(min=-1e4).cumsum(1) - 2.0))
