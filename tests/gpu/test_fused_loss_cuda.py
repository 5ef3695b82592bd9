"""The fused LM-head loss on CUDA (bf16 autocast, eager and compiled) gives the plain loss's value and
gradients. Skipped without CUDA: `python -m pytest -q tests/gpu/test_fused_loss_cuda.py`."""
import pytest
import torch

from foxformer.models.modeling import FoxForCausalLM
from foxformer.models.presets import get_preset

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _loss_and_grads(model, runner, x, fused):
    model.zero_grad(set_to_none=True)
    kw = {"return_logits": False} if fused else {}
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = runner(x, labels=x, **kw).loss
    loss.backward()
    return loss.detach(), {n: p.grad for n, p in model.named_parameters()}


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("preset", ["fox-llama-small", "transformer-pro-small"])
def test_fused_loss_gradients_match_plain(preset, compiled):
    torch.manual_seed(0)
    model = FoxForCausalLM(get_preset(preset, vocab_size=50304)).cuda()
    runner = torch.compile(model) if compiled else model
    x = torch.randint(0, 50304, (2, 512), device="cuda")
    plain_loss, plain = _loss_and_grads(model, runner, x, fused=False)
    fused_loss, fused = _loss_and_grads(model, runner, x, fused=True)
    assert abs(plain_loss.item() - fused_loss.item()) < 2e-2
    for name, g in plain.items():
        assert fused[name] is not None, f"{name}: no gradient with the fused loss"
        err = ((fused[name].float() - g.float()).norm() / g.float().norm().clamp_min(1e-12)).item()
        assert err < 5e-2, f"{name}: relative gradient error {err:.3g}"
