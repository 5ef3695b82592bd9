"""shift_norm and gate_norm (the Pro block's fused extras): the Triton kernels, run by the interpreter on CPU,
against their float64 references; every output and gradient, strided inputs, NaN-poisoned output buffers; the
argument checks and the gate logits' value checks."""
import re
from dataclasses import replace

import pytest
import torch

from foxformer.ops import gate_norm, portable, shift_norm
from foxformer.ops.forgetting_attn.checks import NonFiniteValueError
from foxformer.ops.pro_block import checks as pro_checks
from foxformer.ops.pro_block import gate, gate_norm_reference, shift, shift_norm_reference, tiles

from .helpers import REL_TOL, rel_err

# (B, T, H, D): a small odd D, T = 1, FoX (Pro) 125M's 12 query heads of 64, GQA's 2 kv heads past one default tile
SHAPES = {"2x7x3x5": (2, 7, 3, 5), "T1": (1, 1, 2, 64), "12heads": (2, 9, 12, 64), "2heads-T70": (2, 70, 2, 64)}
# which optional inputs shift_norm gets
SHIFT_VARIANTS = {
    "shift+prev+starts+headnorm": dict(logits=True, prev=True, starts=True, weight="heads"),
    "shift-only": dict(logits=True),
    "norm-only": dict(weight="shared"),
    "shift+starts+norm": dict(logits=True, starts=True, weight="shared"),
}


class _PoisonedTorch:
    """torch as the kernel modules see it, its empty() filled with NaN for floating dtypes: an output element (or
    weight partial) a kernel leaves unwritten shows as NaN. Patched into those modules alone: replacing torch.empty
    itself would leak into caches of torch's (torch.utils._device's constructor list)."""

    def __getattr__(self, name):
        return getattr(torch, name)

    @staticmethod
    def empty(*args, **kwargs):
        t = torch.empty(*args, **kwargs)
        return t.fill_(float("nan")) if t.is_floating_point() else t


@pytest.fixture(autouse=True)
def poisoned_empty(monkeypatch):
    for module in (shift, gate):
        monkeypatch.setattr(module, "torch", _PoisonedTorch())


@pytest.fixture(params=["4rows", "4rows-heads-inner", "default"], ids=lambda p: f"tile-{p}")
def tile(request, monkeypatch):
    """4 rows a program (tiles cross sequence ends and T is no multiple of them), numbered head-fastest or not,
    or the default tile."""
    if request.param != "default":
        heads_inner = request.param.endswith("heads-inner")
        for module in (shift, gate):
            monkeypatch.setattr(module, "block_sizes",
                                lambda D, kernel: (4, max(2, 1 << (D - 1).bit_length()), 4, heads_inner))


@pytest.fixture(params=[False, True], ids=lambda p: "bwd-gather" if p else "bwd-recompute")
def shift_bwd(request, monkeypatch):
    """shift_norm's backward with the next rows' du recomputed (the old kernel) or gathered from overlapping tiles
    (Tile.gather_next); without a shift both run the old kernel."""
    monkeypatch.setitem(tiles.TILES, "shift_bwd", replace(tiles.TILES["shift_bwd"], gather_next=request.param))


def _rand(*shape, seed, dtype=torch.float64, strided=False):
    g = torch.Generator().manual_seed(seed)
    if not strided:
        return torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype)
    # a view into a wider last dim, as the model's projections are slices of one joint product
    wide = torch.randn(*shape[:2], shape[2] * (shape[3] if len(shape) > 3 else 1) + 5, generator=g,
                       dtype=torch.float64).to(dtype)
    view = wide[..., 3:3 + (wide.shape[-1] - 5)]
    return view.unflatten(-1, shape[2:]) if len(shape) > 3 else view


def _shift_inputs(shape, variant, dtype, seed=0):
    B, T, H, D = shape
    args = dict(x=_rand(B, T, H, D, seed=seed, dtype=dtype, strided=True))
    if variant.get("logits"):
        args["logits"] = _rand(B, T, H, seed=seed + 1, dtype=dtype, strided=True) * 2
    if variant.get("prev"):
        args["prev"] = _rand(B, H, D, seed=seed + 2, dtype=dtype)
    if variant.get("starts"):
        g = torch.Generator().manual_seed(seed + 3)
        args["starts"] = torch.rand(B, T, generator=g) < 0.3
        args["starts"][:, 0] = True  # a start at t = 0 drops prev
        args["starts"][-1, 0] = False
    if variant.get("weight"):
        w_shape = (H, D) if variant["weight"] == "heads" else (D,)
        args["weight"] = 1 + 0.5 * _rand(*w_shape, seed=seed + 4, dtype=torch.float32 if dtype != torch.float64
                                         else dtype)
    return args


def _outputs_and_grads(fn, args, dy_seed=9):
    leaves = {k: (v.detach().clone().requires_grad_() if v.is_floating_point() else v) for k, v in args.items()}
    y = fn(**leaves)
    dy = _rand(*y.shape, seed=dy_seed).to(y.dtype)
    diff = [v for v in leaves.values() if v.requires_grad]
    grads = torch.autograd.grad(y, diff, dy)
    return [y] + list(grads)


def _check(got, ref, dtype):
    names = ["y"] + [f"d{i}" for i in range(len(ref) - 1)]
    for name, a, b in zip(names, got, ref):
        assert a.shape == b.shape and a.dtype == b.dtype, name
        assert not a.isnan().any(), f"{name}: NaN (an element left unwritten)"
        assert rel_err(a, b) < REL_TOL[dtype], f"{name}: relative error {rel_err(a, b):.3g}"


def _against_float64(fn, ref_fn, args, dtype):
    got = _outputs_and_grads(lambda **kw: fn(**kw, backend="triton"), args)
    ref = _outputs_and_grads(ref_fn, {k: (v.double() if v.is_floating_point() else v) for k, v in args.items()})
    _check(got, [r.to(g.dtype) for r, g in zip(ref, got)], dtype)


@pytest.mark.parametrize("variant", SHIFT_VARIANTS)
@pytest.mark.parametrize("shape", SHAPES)
def test_shift_norm_matches_float64_reference(shape, variant, tile, shift_bwd):
    args = _shift_inputs(SHAPES[shape], SHIFT_VARIANTS[variant], torch.float64)
    _against_float64(shift_norm, shift_norm_reference, args, torch.float64)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_shift_norm_low_precision(dtype, shift_bwd):
    # as in the model under autocast: x, logits in the low precision, an fp32 weight
    args = _shift_inputs(SHAPES["12heads"], SHIFT_VARIANTS["shift+prev+starts+headnorm"], dtype)
    _against_float64(shift_norm, shift_norm_reference, args, dtype)


def _gate_inputs(shape, g_layout, dtype, weight="heads"):
    B, T, H, D = shape
    g_shape = (B, T, H * D) if g_layout == "flat" else (B, T, H, D)
    w_dtype = torch.float32 if dtype != torch.float64 else dtype
    return dict(o=_rand(B, T, H, D, seed=0, dtype=dtype), g=_rand(*g_shape, seed=1, dtype=dtype, strided=True) * 2,
                weight=1 + 0.5 * _rand(*((H, D) if weight == "heads" else (D,)), seed=2, dtype=w_dtype))


@pytest.mark.parametrize("g_layout", ["flat", "heads"], ids=lambda s: f"g-{s}")
@pytest.mark.parametrize("shape", SHAPES)
def test_gate_norm_matches_float64_reference(shape, g_layout, tile):
    _against_float64(gate_norm, gate_norm_reference, _gate_inputs(SHAPES[shape], g_layout, torch.float64),
                     torch.float64)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_gate_norm_low_precision(dtype):
    _against_float64(gate_norm, gate_norm_reference, _gate_inputs(SHAPES["12heads"], "flat", dtype), dtype)


def test_gate_norm_shared_weight():
    _against_float64(gate_norm, gate_norm_reference, _gate_inputs(SHAPES["2x7x3x5"], "flat", torch.float64,
                                                                  weight="shared"), torch.float64)


def test_cpu_auto_is_the_reference():
    args = _shift_inputs(SHAPES["2x7x3x5"], SHIFT_VARIANTS["shift+prev+starts+headnorm"], torch.float32)
    assert torch.equal(shift_norm(**args), shift_norm_reference(**args))
    gargs = _gate_inputs(SHAPES["2x7x3x5"], "flat", torch.float32)
    assert torch.equal(gate_norm(**gargs), gate_norm_reference(**gargs))


def test_compile_sees_one_op_each():
    x, logits = _rand(2, 5, 3, 4, seed=0), _rand(2, 5, 3, seed=1)
    o, g, w = _rand(2, 5, 3, 4, seed=2), _rand(2, 5, 12, seed=3), _rand(3, 4, seed=4)

    def block(x, logits, o, g, w):
        return shift_norm(x, logits, weight=w, backend="triton").sum() + gate_norm(o, g, w, backend="triton").sum()

    explained = torch._dynamo.explain(block)(x, logits, o, g, w)
    assert explained.graph_break_count == 0 and explained.graph_count == 1
    ops = {str(n.target) for gm in explained.graphs for n in gm.graph.nodes if n.op == "call_function"}
    assert {"foxformer.shift_norm.default", "foxformer.gate_norm.default"} <= ops, ops


_X = torch.zeros(2, 3, 4, 8)
BAD_SHIFT = {
    "x-3d": (dict(x=torch.zeros(2, 3, 8), weight=torch.ones(8)), ValueError, "x must be a non-empty"),
    "x-int": (dict(x=_X.long(), weight=torch.ones(8)), TypeError, "x must be a floating"),
    "nothing": (dict(x=_X), ValueError, "needs logits"),
    "prev-no-logits": (dict(x=_X, prev=torch.zeros(2, 4, 8), weight=torch.ones(8)), ValueError, "pass logits"),
    "logits-shape": (dict(x=_X, logits=torch.zeros(2, 3, 2)), ValueError, r"logits must have shape \(2, 3, 4\)"),
    "starts-float": (dict(x=_X, logits=torch.zeros(2, 3, 4), starts=torch.zeros(2, 3)), ValueError, "bool"),
    "weight-shape": (dict(x=_X, weight=torch.ones(4)), ValueError, "weight must be"),
    "eps": (dict(x=_X, weight=torch.ones(8), eps=0.0), ValueError, "eps must be"),
    "backend": (dict(x=_X, weight=torch.ones(8), backend="cuda"), ValueError, "backend must be"),
    "backend-typo": (dict(x=_X, weight=torch.ones(8), backend="trition"), ValueError,
                     r"got 'trition' \(did you mean 'triton'\?\)"),
}


@pytest.mark.parametrize("case", BAD_SHIFT)
def test_shift_norm_rejects(case):
    kwargs, error, match = BAD_SHIFT[case]
    with pytest.raises(error, match=match):
        shift_norm(**kwargs)


@pytest.mark.parametrize("g_shape,match", [((2, 3, 31), "g must be"), ((2, 3, 4, 8), None)],
                         ids=["g-width", "weight-dtype"])
def test_gate_norm_rejects(g_shape, match):
    if match is None:
        with pytest.raises(TypeError, match="weight must be a floating"):
            gate_norm(_X, torch.zeros(g_shape), torch.ones(4, 8, dtype=torch.long))
        return
    with pytest.raises(ValueError, match=match):
        gate_norm(_X, torch.zeros(g_shape), torch.ones(4, 8))


def test_triton_on_cpu_needs_the_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="needs CUDA tensors"):
        shift_norm(_X, weight=torch.ones(8), backend="triton")


def _nan_gate_call(op, backend="torch"):
    """A call with NaN at two gate entries (batch 1, position 2, head 3 first): the op's message and the call."""
    x, w = _rand(2, 5, 4, 8, seed=0), torch.ones(4, 8, dtype=torch.float64)
    if op == "shift_norm":
        logits = _rand(2, 5, 4, seed=1)
        logits[1, 2, 3] = logits[1, 4, 0] = float("nan")
        return ("shift_norm: logits contains NaN (2 of 40 entries, the first at batch 1, position 2, head 3)",
                lambda fn=shift_norm: fn(x, logits, weight=w, backend=backend))
    g = _rand(2, 5, 4, 8, seed=1)
    g[1, 2, 3, 5] = g[1, 2, 3, 6] = g[1, 4, 0, 0] = float("nan")  # two in one head's row: counted once
    if op == "gate_norm-flat":
        g = g.flatten(2)
    return ("gate_norm: g contains NaN (per head: 2 of 40 entries, the first at batch 1, position 2, head 3)",
            lambda fn=gate_norm: fn(x, g, w, backend=backend))


NAN_OPS = ["shift_norm", "gate_norm-flat", "gate_norm-heads"]


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("op", NAN_OPS)
def test_nan_gate_logits_are_refused_with_where_they_are(op, backend):
    """shift_norm passed NaN logits through to a NaN output without a word, where the attention ops refuse a NaN
    gate: the same error class (the training loop's "diverged"), naming the op, the input and its first NaN."""
    said, call = _nan_gate_call(op, backend)
    with pytest.raises(NonFiniteValueError) as e:
        call()
    assert str(e.value) == (f"{said}: NaN gate logits come from NaN in what made them (their projection's input or "
                            f"weights); find the first with torch.isnan")
    assert e.value.what == said.split(" (")[0]


@pytest.mark.parametrize("op", NAN_OPS)
def test_the_portable_ops_refuse_nan_gate_logits_alike(op):
    said, call = _nan_gate_call(op)
    with pytest.raises(NonFiniteValueError, match=re.escape(said)):
        call(getattr(portable, op.split("-")[0]))


@pytest.mark.parametrize("env", [None, "0", "1"], ids=lambda v: f"FOXFORMER_CHECK_VALUES={v}")
@pytest.mark.parametrize("op", NAN_OPS)
def test_cpu_gate_logits_are_checked_whatever_foxformer_check_values_says(op, env, monkeypatch):
    """The attention ops' policy (checks.values_checked): CPU values are read always, free of a device sync;
    FOXFORMER_CHECK_VALUES=1 turns the checks on for CUDA tensors alone (tests/gpu/test_pro_ops_cuda.py)."""
    if env is None:
        monkeypatch.delenv("FOXFORMER_CHECK_VALUES", raising=False)
    else:
        monkeypatch.setenv("FOXFORMER_CHECK_VALUES", env)
    with pytest.raises(NonFiniteValueError):
        _nan_gate_call(op)[1]()


@pytest.mark.parametrize("op", NAN_OPS)
def test_gate_logits_are_read_only_where_values_checked_says(op, monkeypatch):
    """One policy for every value check: where values_checked says no (a CUDA tensor without
    FOXFORMER_CHECK_VALUES=1), nothing is read and a NaN gate gives a NaN output, as the attention ops' does."""
    read = []
    monkeypatch.setattr(pro_checks, "values_checked", lambda t: read.append(t) or False)
    y = _nan_gate_call(op)[1]()
    assert len(read) == 1 and y.isnan().any()


@pytest.mark.parametrize("op", NAN_OPS)
def test_compiled_calls_check_the_gate_logits_on_cpu(op):
    """Under torch.compile a host read would break the graph (and sync on CUDA): on CPU the check is an assert in
    the graph, as the attention ops' gate checks are; test_compile_sees_one_op_each: no graph break."""
    torch._dynamo.reset()
    x, w = _rand(2, 5, 4, 8, seed=0), torch.ones(4, 8, dtype=torch.float64)
    gate_shape = (2, 5, 4) if op == "shift_norm" else (2, 5, 32) if op == "gate_norm-flat" else (2, 5, 4, 8)
    if op == "shift_norm":
        fn, name = (lambda x, gate: shift_norm(x, gate, weight=w, backend="triton")), "shift_norm: logits"
    else:
        fn, name = (lambda x, gate: gate_norm(x, gate, w, backend="triton")), "gate_norm: g"
    compiled = torch.compile(fn, backend="aot_eager", fullgraph=True)
    gate = _rand(*gate_shape, seed=1)
    torch.testing.assert_close(compiled(x, gate), fn(x, gate))
    with pytest.raises(RuntimeError, match=f"{name} must not hold NaN"):
        compiled(x, gate.index_fill(1, torch.tensor([3]), float("nan")))


INFINITE = [pytest.param(v, id=f"{'minus' if v < 0 else 'plus'}-inf") for v in (float("-inf"), float("inf"))]


@pytest.mark.parametrize("value", INFINITE)
def test_infinite_gate_logits_are_a_shut_or_open_gate(value, shift_bwd):
    """Not refused: a shift logit of -inf keeps x, one of +inf takes the token before; an output gate logit of -inf
    shuts the output, one of +inf leaves it open. The kernels give the reference's finite outputs and gradients."""
    args = _shift_inputs(SHAPES["2x7x3x5"], SHIFT_VARIANTS["shift+prev+starts+headnorm"], torch.float64)
    args["logits"] = args["logits"].index_fill(1, torch.tensor([0, 4]), value)
    args["starts"][:, 4] = False
    _against_float64(shift_norm, shift_norm_reference, args, torch.float64)
    at = args["x"][:, 4] if value < 0 else args["x"][:, 3]
    unshifted = shift_norm_reference(at[:, None], weight=args["weight"])[:, 0]
    torch.testing.assert_close(shift_norm(**args, backend="triton")[:, 4], unshifted)
    gargs = _gate_inputs(SHAPES["2x7x3x5"], "flat", torch.float64)
    gargs["g"] = gargs["g"].index_fill(1, torch.tensor([0, 4]), value)
    _against_float64(gate_norm, gate_norm_reference, gargs, torch.float64)
    assert (gate_norm(**gargs, backend="triton")[:, 4] == 0).all() == (value < 0)


def test_vmap_over_the_gate_logits_checks_every_element():
    """The check reads the values under torch.func's wrappers: bool() of a batched tensor is control flow that
    torch.vmap refuses, and shift_norm's torch path ran under vmap before the check."""
    x = _rand(2, 5, 4, 8, seed=0)
    logits = _rand(3, 2, 5, 4, seed=1)
    per_gate = torch.vmap(lambda lg: shift_norm(x, lg))(logits)
    torch.testing.assert_close(per_gate, torch.stack([shift_norm(x, lg) for lg in logits]))
    logits[2, 1, 0, 3] = float("nan")
    with pytest.raises(NonFiniteValueError, match=r"logits contains NaN \(1 of 120 entries\)"):
        torch.vmap(lambda lg: shift_norm(x, lg))(logits)


def test_meta_tensors_pass_without_values():
    """Models build and trace on the meta device: the value check skips tensors without data."""
    x, logits, w = torch.empty(2, 5, 4, 8, device="meta"), torch.empty(2, 5, 4, device="meta"), torch.ones(8)
    assert shift_norm(x, logits, weight=w.to("meta")).is_meta
    assert gate_norm(x, torch.empty(2, 5, 32, device="meta"), w.to("meta")).is_meta
