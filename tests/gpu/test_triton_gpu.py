"""Triton kernels on CUDA at long context against the exact chunked torch backend (fp32).

Skipped without CUDA; run on the GPU machine: `python -m pytest -q tests/gpu`.
"""
import pytest
import torch
import torch.nn.functional as F

from foxformer import forgetting_attention
from foxformer.bench.attention import realistic_log_fgate

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _grads(q, k, v, log_f, backend, do, **kw):
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v, log_f)]
    out, lse = forgetting_attention(*leaves, backend=backend, return_lse=True, **kw)
    out.float().backward(do.float())
    return [out, lse] + [t.grad for t in leaves]


def _rel(a, b):
    a, b = a.double(), b.double()
    assert torch.isfinite(a).all()
    return ((a - b).norm() / b.norm().clamp_min(1e-6)).item()


@pytest.mark.parametrize("T", [16384, 65536], ids=lambda t: f"T{t // 1024}K")
@pytest.mark.parametrize("gates", ["realistic", "half"])
@pytest.mark.parametrize("D,Hq,Hkv", [(64, 2, 1), (128, 2, 2)], ids=["D64-gqa", "D128"])
@pytest.mark.parametrize("prune_eps", [None, 1e-3], ids=["full", "pruned"])
def test_long_context_matches_torch(T, gates, D, Hq, Hkv, prune_eps):
    torch.manual_seed(0)
    dev = "cuda"
    q = torch.randn(1, T, Hq, D, device=dev, dtype=torch.bfloat16)
    k = torch.randn(1, T, Hkv, D, device=dev, dtype=torch.bfloat16)
    v = torch.randn(1, T, Hkv, D, device=dev, dtype=torch.bfloat16)
    if gates == "realistic":
        log_f = realistic_log_fgate(1, T, Hq, dev)
    else:  # f ~ 0.5: |c| reaches ~45000 at 64K tokens, the precision trap
        log_f = F.logsigmoid(torch.randn(1, T, Hq, device=dev) * 0.3)
    do = torch.randn(1, T, Hq, D, device=dev, dtype=torch.bfloat16)
    got = _grads(q, k, v, log_f, "triton", do, prune_eps=prune_eps)
    ref = _grads(q.float(), k.float(), v.float(), log_f, "torch", do)
    for name, a, b in zip(("out", "lse", "dq", "dk", "dv", "dlog_f"), got, ref):
        assert _rel(a, b) < 2e-2, name


@pytest.mark.parametrize("prune_eps", [None, 1e-3], ids=["full", "pruned"])
def test_varlen_gqa_matches_torch(prune_eps):
    torch.manual_seed(1)
    dev = "cuda"
    lengths = [1, 2, 77, 4000, 12303]
    cu = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0)), dtype=torch.int32, device=dev)
    T = sum(lengths)
    q = torch.randn(1, T, 8, 64, device=dev, dtype=torch.bfloat16)
    k = torch.randn(1, T, 2, 64, device=dev, dtype=torch.bfloat16)
    v = torch.randn(1, T, 2, 64, device=dev, dtype=torch.bfloat16)
    log_f = realistic_log_fgate(1, T, 8, dev)
    do = torch.randn_like(q)
    got = _grads(q, k, v, log_f, "triton", do, cu_seqlens=cu, prune_eps=prune_eps)
    ref = _grads(q.float(), k.float(), v.float(), log_f, "torch", do, cu_seqlens=cu)
    for name, a, b in zip(("out", "lse", "dq", "dk", "dv", "dlog_f"), got, ref):
        assert _rel(a, b) < 2e-2, name


@pytest.mark.parametrize("T", [16384, 65536], ids=["16K", "64K"])
def test_the_gate_cumsum_kernel_matches_torch_at_long_context(T):
    """ops/forgetting_attn/scan.py on CUDA: c and the gradient of log f against the torch reference (float64),
    strong gates (|c| in the tens of thousands at 64K) with an f = 0 gate in the middle."""
    from foxformer.ops.forgetting_attn.cumsum import gate_cumsum_heads_first
    from foxformer.ops.forgetting_attn.scan import triton_gate_cumsum, triton_gate_cumsum_grad

    g = torch.Generator(device="cuda").manual_seed(0)
    log_f = realistic_log_fgate(2, T, 24, "cuda", generator=g) - 0.3
    log_f[1, T // 2, 5] = float("-inf")
    leaf = log_f.clone().requires_grad_()
    want = gate_cumsum_heads_first(leaf)
    grad_c = torch.randn(2, 24, T, device="cuda", generator=g, dtype=torch.float64)
    want.backward(grad_c)
    got = triton_gate_cumsum(log_f)
    assert want.abs().max() > 1e4
    torch.testing.assert_close(got, want.detach(), rtol=1e-12, atol=1e-6)  # summation order: ~1e-9 here
    grad = triton_gate_cumsum_grad(grad_c, log_f)
    torch.testing.assert_close(grad, leaf.grad, rtol=1e-6, atol=1e-4)
    assert grad[1, T // 2, 5] == 0


@pytest.mark.parametrize("backend", ["auto", "triton"])
def test_no_queries_give_an_empty_result_before_any_kernel(backend):
    """Tq = 0 returns out [B, 0, Hq, D] and lse [B, Hq, 0] on CUDA too (no launch of a grid of no rows), and its
    backward gives every input a gradient of its own shape."""
    q = torch.randn(2, 0, 4, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k, v = (torch.randn(2, 5, 2, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
    log_f = F.logsigmoid(torch.randn(2, 5, 4, device="cuda")).requires_grad_()
    out, lse = forgetting_attention(q, k, v, log_f, backend=backend, return_lse=True)
    assert out.shape == (2, 0, 4, 64) and lse.shape == (2, 4, 0) and lse.dtype == torch.float32
    (out.float().sum() + lse.sum()).backward()
    assert q.grad.shape == q.shape and k.grad.shape == k.shape and log_f.grad.shape == log_f.shape
    assert not (k.grad.any() or v.grad.any() or log_f.grad.any())
