"""FusedLinears: the input projections of a one-token decode step as one product (models/fused_linear.py), and
never a stale or wrong one: every change to a source layer makes the copy again or skips the fusion."""
import pytest
import torch
from torch import nn

from foxformer.models.fused_linear import FusedLinears

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
