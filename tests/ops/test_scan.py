"""The op's gate cumsum in Triton (ops/forgetting_attn/scan.py, interpreted here) against the torch reference
(cumsum.gate_cumsum_heads_first and its autograd): values and gradients, across chunk boundaries, with gates at
-inf and below the floor."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported (conftest.py does it too)

import pytest  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from foxformer.ops.forgetting_attn.cumsum import gate_cumsum_heads_first  # noqa: E402
from foxformer.ops.forgetting_attn.scan import triton_gate_cumsum, triton_gate_cumsum_grad  # noqa: E402


@pytest.mark.parametrize("B,T,H", [(1, 1, 1), (2, 17, 3), (1, 1024, 2), (2, 2500, 3)],
                         ids=["one-token", "short", "one-chunk", "three-chunks"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_values_and_gradient_match_the_torch_reference(B, T, H, dtype):
    g = torch.Generator().manual_seed(T)
    log_f = F.logsigmoid(torch.randn(B, T, H, generator=g) * 3).to(dtype)
    log_f[0, T // 2, 0] = float("-inf")                  # f = 0: clamped, no gradient
    if T > 3:
        log_f[-1, 3, -1] = -2e4                          # below the floor: clamped, no gradient
    leaf = log_f.clone().requires_grad_()
    want = gate_cumsum_heads_first(leaf)
    grad_c = torch.randn(B, H, T, generator=g, dtype=torch.float64)
    want.backward(grad_c)

    got = triton_gate_cumsum(log_f)
    assert got.dtype == torch.float64 and got.shape == (B, H, T) and got.is_contiguous()
    torch.testing.assert_close(got, want.detach(), rtol=1e-13, atol=1e-9)
    grad = triton_gate_cumsum_grad(grad_c, log_f)
    assert grad.dtype == dtype and grad.shape == (B, T, H)
    torch.testing.assert_close(grad, leaf.grad, rtol=1e-6 if dtype == torch.float32 else 1e-2, atol=1e-6)
    assert grad[0, T // 2, 0] == 0


def test_a_transposed_gate_view_is_read_through_its_strides():
    """The model hands [B, T, H] views of a projection: any strides are read, none copied."""
    base = F.logsigmoid(torch.randn(2, 3, 40))          # [B, H, T] storage, viewed as [B, T, H]
    log_f = base.transpose(1, 2)
    torch.testing.assert_close(triton_gate_cumsum(log_f), gate_cumsum_heads_first(log_f), rtol=1e-13, atol=1e-12)


def test_the_registered_ops_pass_torch_opcheck():
    """Schema, fake tensors (torch.compile), autograd registration: the op path through scan.py."""
    from foxformer.ops.forgetting_attn import interface

    log_f = F.logsigmoid(torch.randn(2, 37, 3)).requires_grad_()
    for op, args in ((interface._cumsum_op, (log_f,)),
                     (interface._cumsum_bwd_op, (torch.randn(2, 3, 37, dtype=torch.float64), log_f.detach()))):
        results = torch.library.opcheck(op, args)
        assert all(v == "SUCCESS" for v in results.values()), results
