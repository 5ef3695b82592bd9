"""FusedLinears: the input projections of a one-token decode step as one product (models/fused_linear.py), and
never a stale or wrong one: every change to a source layer makes the copy again or skips the fusion. joint_linear:
the same in training, with gradients reaching every weight."""
import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from foxformer.models.fused_linear import JOINT_COLUMNS, FusedLinears, joint_linear

from .conftest import make_model, tokens


def _layers(seed=0, dtype=torch.float64):
    torch.manual_seed(seed)
    return [nn.Linear(8, 5, bias=False).to(dtype), nn.Linear(8, 3, bias=True).to(dtype),
            nn.Linear(8, 1, bias=False).to(dtype)]


def _separate(x, linears):
    return [lin(x) for lin in linears]


def test_one_product_gives_each_layers_output():
    linears, x = _layers(), torch.randn(2, 1, 8, dtype=torch.float64)
    fused = FusedLinears()
    got = fused(x, linears)
    for g, want in zip(got, _separate(x, linears)):
        torch.testing.assert_close(g, want, rtol=1e-12, atol=1e-12)
    weight, bias = fused.weights(linears)
    assert weight.shape == (9, 8) and bias.shape == (9,) and not bias[:5].any() and not bias[8:].any()


@pytest.mark.parametrize("change", ["in-place", "optimizer-step", "replaced", "swapped-layer", "hook-added",
                                    "forward-wrapped"])
def test_a_changed_source_is_never_read_from_a_stale_copy(change):
    linears, x = _layers(), torch.randn(3, 1, 8, dtype=torch.float64)
    fused = FusedLinears()
    fused(x, linears)
    if change == "in-place":
        with torch.no_grad():
            linears[1].bias.add_(1.0)
    elif change == "optimizer-step":
        sum(out.sum() for out in _separate(x, linears)).backward()
        torch.optim.SGD([p for lin in linears for p in lin.parameters()], lr=0.5).step()
    elif change == "replaced":
        linears[0].weight = nn.Parameter(torch.randn_like(linears[0].weight))
    elif change == "hook-added":
        linears[1].register_forward_hook(lambda mod, inp, out: out + 1)
    elif change == "forward-wrapped":  # as accelerate's offloading wraps a layer's forward on the instance
        inner = linears[0].forward
        linears[0].forward = lambda inp: inner(inp) - 1
    else:
        linears[2] = nn.Linear(8, 1, bias=False).double()
    with torch.no_grad():
        for g, want in zip(fused(x, linears), _separate(x, linears)):
            torch.testing.assert_close(g, want, rtol=1e-12, atol=1e-12)


class _Scaled(nn.Linear):
    """A Linear subclass that computes something else (as an adapter would): it must not be fused."""

    def forward(self, x):
        return 2 * super().forward(x)


def test_layers_that_cannot_share_a_product_run_one_by_one():
    linears, x = _layers(), torch.randn(1, 1, 8, dtype=torch.float64)
    odd = _Scaled(8, 4).double()
    fused = FusedLinears()
    got = fused(x, linears + [odd])
    torch.testing.assert_close(got[-1], odd(x))
    assert fused.weights(linears + [odd]) is None
    mixed = [linears[0], nn.Linear(8, 2).float()]
    assert fused.weights(mixed) is None
    assert [g.dtype for g in fused(x.float(), mixed[1:])] == [torch.float32]


@pytest.mark.parametrize("preset", ["fox-pro-tiny", "fox-llama-tiny", "transformer-pro-tiny", "linear-pro-tiny"])
def test_a_decode_step_runs_the_input_projections_as_one_product(preset):
    """The cache holds the fused copy after a one-token step, and the step's logits are the uncached forward's;
    a changed weight between two steps reaches the next one."""
    model = make_model(preset)
    ids = tokens(2, 9)
    with torch.no_grad():
        cache = model.model.new_cache()
        model(ids[:, :8], cache=cache)
        step = model(ids[:, 8:], cache=cache).logits[:, -1]
        attn = model.model.layers[0].attn
        weight, _ = cache[0].fused_inputs.weights(list(attn._input_linears().values()))
        assert weight.shape[0] == sum(lin.out_features for lin in attn._input_linears().values())
        torch.testing.assert_close(step, model(ids).logits[:, -1], rtol=1e-9, atol=1e-9)
        attn.k_proj.weight.mul_(0.5)
        cache = model.model.new_cache()
        model(ids[:, :8], cache=cache)
        torch.testing.assert_close(model(ids[:, 8:], cache=cache).logits[:, -1], model(ids).logits[:, -1],
                                   rtol=1e-9, atol=1e-9)


def _grads(linears, x, outs, seed=2):
    """Gradients of x and of every parameter for a fixed random cotangent of each output."""
    g = torch.Generator().manual_seed(seed)
    loss = sum((out * torch.randn(out.shape, generator=g, dtype=out.dtype)).sum() for out in outs)
    params = [p for lin in linears for p in lin.parameters()]
    return torch.autograd.grad(loss, [x, *params])


def test_joint_product_gives_each_layers_output_and_gradients():
    """9 output columns padded to 16: outputs, the input's and every weight's and bias's gradients as one by one."""
    linears = _layers()
    x = torch.randn(2, 7, 8, dtype=torch.float64, requires_grad=True)
    joint = joint_linear(x, linears)
    assert [o.shape[-1] for o in joint] == [5, 3, 1]
    assert joint[0].stride(-2) % JOINT_COLUMNS == 0  # views of the padded output
    separate = _separate(x, linears)
    for got, want in zip(joint, separate):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    for got, want in zip(_grads(linears, x, joint), _grads(linears, x, separate)):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_joint_product_keeps_layers_that_cannot_share_it_apart():
    linears, x = _layers(), torch.randn(1, 3, 8, dtype=torch.float64)
    hooked = nn.Linear(8, 2, bias=False).double()
    hooked.register_forward_hook(lambda mod, inp, out: out + 1)
    for group in (linears + [_Scaled(8, 4).double()], linears + [hooked]):
        for got, want in zip(joint_linear(x, group), _separate(x, group)):
            torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("field", ["joint_input_projections", "joint_gate_projections"])
@pytest.mark.parametrize("preset", ["fox-pro-tiny", "fox-llama-tiny", "transformer-llama-tiny", "transformer-pro-tiny",
                                    "linear-pro-tiny"])
def test_joint_projections_change_no_result(preset, field):
    """FoxConfig.joint_input_projections / joint_gate_projections: the same loss and gradients (float64), and the
    same state dict."""
    ids = tokens(2, 13)
    results = []
    for joint in (False, True):
        # the gate products apart in the reference (they are joint by default)
        model = make_model(preset, **{"joint_gate_projections": False, field: joint}).train()
        loss = model(ids, labels=ids).loss
        loss.backward()
        results.append((loss.detach(), {n: p.grad for n, p in model.named_parameters()}, model.state_dict().keys()))
    (loss0, grads0, keys0), (loss1, grads1, keys1) = results
    assert keys0 == keys1
    torch.testing.assert_close(loss1, loss0, rtol=1e-12, atol=1e-12)
    for name, grad in grads0.items():
        torch.testing.assert_close(grads1[name], grad, rtol=1e-9, atol=1e-12, msg=name)


class _Products(TorchDispatchMode):
    """Counts the matrix products (aten mm / addmm / bmm) run under it."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket in (torch.ops.aten.mm, torch.ops.aten.addmm, torch.ops.aten.bmm):
            self.count += 1
        return func(*args, **(kwargs or {}))


def test_joint_gate_projections_run_one_product_a_layer():
    """FoX (Pro)'s forget gate and two token-shift gates: three products a layer apart, one joint (the default)."""
    ids = tokens(1, 9)
    counts = {}
    for joint in (False, True):
        model = make_model("fox-pro-tiny", joint_gate_projections=joint)
        with torch.no_grad(), _Products() as products:
            model(ids)
        counts[joint] = products.count
    assert counts[False] - counts[True] == 2 * model.config.num_layers


def test_joint_product_compiles_without_a_graph_break():
    """Under torch.compile the joint product's checks are traced, not a break in every attention layer."""
    linears = _layers(dtype=torch.float32)
    x = torch.randn(2, 5, 8)
    explained = torch._dynamo.explain(lambda inp: joint_linear(inp, linears))(x)
    assert explained.graph_break_count == 0, explained.break_reasons
