"""The ops on a GPU that is not the current one (ops/gpu.py): a model on cuda:1 while cuda:0 is current gives the
results it gives on cuda:0. Needs two GPUs: `python -m pytest -q tests/gpu/test_second_gpu_cuda.py`."""
import pytest
import torch

from foxformer.ops import forgetting_attention, gate_norm, shift_norm
from foxformer.ops.forgetting_attn.decode import forgetting_attention_decode

pytestmark = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")


def _inputs(device):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 300, 4, 64, generator=g).to(device, torch.bfloat16) for _ in range(3))
    log_f = torch.nn.functional.logsigmoid(torch.randn(2, 300, 4, generator=g) + 3).to(device)
    return [t.requires_grad_() for t in (q, k, v, log_f)]


@pytest.mark.parametrize("backend", ["triton", "auto"])
def test_attention_on_the_second_gpu_matches_the_first(backend):
    torch.cuda.set_device(0)
    results = []
    for device in ("cuda:0", "cuda:1"):
        q, k, v, log_f = _inputs(device)
        out = forgetting_attention(q, k, v, log_f, backend=backend)
        out.float().square().sum().backward()
        results.append([t.detach().cpu() for t in (out, q.grad, k.grad, v.grad, log_f.grad)])
    assert torch.cuda.current_device() == 0
    for first, second in zip(*results):
        torch.testing.assert_close(second, first, rtol=0, atol=0)


def test_decode_and_pro_ops_on_the_second_gpu_match_the_first():
    torch.cuda.set_device(0)
    results = []
    for device in ("cuda:0", "cuda:1"):
        q, k, v, log_f = (t.detach() for t in _inputs(device))
        c = torch.cumsum(log_f.double(), 1)
        w = torch.ones(64, device=device)
        results.append([t.cpu() for t in (forgetting_attention_decode(q[:, -1:], k, v, c, backend="triton"),
                                          shift_norm(q, weight=w, backend="triton"),
                                          gate_norm(q, k, w, backend="triton"))])
    for first, second in zip(*results):
        torch.testing.assert_close(second, first, rtol=0, atol=0)
