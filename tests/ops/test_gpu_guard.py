"""Every Triton launch runs with its inputs' GPU current (ops/gpu.py): Triton launches on the current GPU, and a
custom op body runs under no device guard, so a model on cuda:1 with cuda:0 current launched on the wrong GPU.
On the CPU the guard is checked through a stand-in; tests/gpu checks it on two GPUs where a machine has them."""
import contextlib

import pytest
import torch

from foxformer.ops import forgetting_attention, gate_norm, shift_norm
from foxformer.ops import gpu
from foxformer.ops.forgetting_attn.decode import forgetting_attention_decode


class _OnGpu:
    """Stands for a CUDA tensor of GPU ``index`` (gpu_of reads only these)."""
    is_cuda = True

    def __init__(self, index):
        self.device = torch.device("cuda", index)
        self._index = index

    def get_device(self):
        return self._index


@pytest.mark.parametrize("index,current,enters", [(1, 0, "cuda:1"), (0, 0, None), (0, 1, "cuda:0")],
                         ids=["other-gpu", "current-gpu", "back-to-gpu0"])
def test_gpu_of_makes_the_tensors_gpu_current_only_where_it_is_not(monkeypatch, index, current, enters):
    entered = []
    monkeypatch.setattr(torch.cuda, "current_device", lambda: current)
    monkeypatch.setattr(torch.cuda, "device", lambda d: entered.append(str(d)) or contextlib.nullcontext())
    with gpu.gpu_of(_OnGpu(index)):
        pass
    assert entered == ([enters] if enters else [])


def test_gpu_of_a_cpu_tensor_touches_no_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "current_device", lambda: pytest.fail("asked for the current GPU"))
    with gpu.gpu_of(torch.zeros(1)):
        pass


@pytest.fixture
def guarded(monkeypatch):
    """The tensors each launch's guard was given, in order."""
    seen = []
    monkeypatch.setattr(gpu, "gpu_of", lambda t: seen.append(t) or contextlib.nullcontext())
    return seen


def test_attention_forward_backward_and_gate_cumsum_launch_under_the_guard(guarded):
    B, T, H, D = 1, 20, 2, 16
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, T, H, D, generator=g).bfloat16().requires_grad_() for _ in range(3))
    log_f = torch.nn.functional.logsigmoid(torch.randn(B, T, H, generator=g)).requires_grad_()
    forgetting_attention(q, k, v, log_f, backend="triton").sum().backward()
    kinds = [tuple(t.shape) for t in guarded]
    assert kinds.count((B, T, H)) == 2  # the gate cumsum, forward and backward
    assert kinds.count((B, T, H, D)) >= 2  # the attention forward and backward (q)
    assert all(t.grad is not None for t in (q, k, v, log_f))


def test_decode_and_pro_ops_launch_under_the_guard(guarded):
    g = torch.Generator().manual_seed(1)
    q, k, v = torch.randn(1, 1, 4, 16, generator=g), torch.randn(1, 9, 2, 16, generator=g), \
        torch.randn(1, 9, 2, 16, generator=g)
    c = torch.cumsum(torch.nn.functional.logsigmoid(torch.randn(1, 9, 4, generator=g)), 1).double()
    forgetting_attention_decode(q, k, v, c, backend="triton")
    assert guarded and guarded[-1] is q
    x, w = torch.randn(1, 5, 2, 16, generator=g), torch.ones(16)
    shift_norm(x, weight=w, backend="triton")
    assert guarded[-1] is x
    o, gate_in = torch.randn(1, 5, 2, 16, generator=g), torch.randn(1, 5, 2, 16, generator=g)
    gate_norm(o, gate_in, w, backend="triton")
    assert guarded[-1] is o
