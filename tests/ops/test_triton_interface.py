"""`forgetting_attention(backend="triton")` end to end (interpreted on CPU) against naive fp64.

Low-precision inputs carry an error that no kernel can remove (the rounded output feeds the
backward's delta, as in FlashAttention). So, as FlashAttention's own tests do, the kernel's error
is bounded by that of a plain implementation at the same precision (the chunked torch backend,
fp32 math on the same rounded inputs) plus a margin of the input precision.
"""
import pytest
import torch

from foxformer import forgetting_attention
from foxformer.ops import naive_forgetting_attention

from .helpers import REL_TOL, grad_of_grad, make_inputs, rel_err, run_with_grads

NAMES = ("out", "lse", "dq", "dk", "dv", "dlog_f")

CASES = [
    # B, Tq, Tk, Hq, Hkv, D, dtype
    pytest.param(1, 1, 45, 8, 1, 64, torch.bfloat16, id="decode-Tq1-mqa8-d64-bf16"),
    pytest.param(2, 17, 17, 4, 1, 48, torch.float16, id="Tq17-gqa4-d48-fp16"),
    pytest.param(1, 64, 96, 1, 1, 100, torch.bfloat16, id="prefill-Tq64-Tk96-d100-bf16"),
    pytest.param(1, 130, 130, 2, 2, 16, torch.float16, id="Tq130-d16-fp16"),
    pytest.param(1, 17, 130, 8, 1, 128, torch.float16, id="prefill-Tq17-Tk130-mqa8-d128-fp16"),
]


def _lowp(inputs, dtype):
    q, k, v, log_f = inputs
    return [q.to(dtype), k.to(dtype), v.to(dtype), log_f.float()]


def _check(got, plain, ref, dtype):
    for name, a, b, p in zip(NAMES, got, ref, plain):
        assert torch.isfinite(a).all(), name
        bound = 2 * rel_err(p, b) + REL_TOL[dtype]
        assert rel_err(a, b) <= bound, f"{name}: {rel_err(a, b):.2e} > {bound:.2e}"


@pytest.mark.parametrize("B,Tq,Tk,Hq,Hkv,D,dtype", CASES)
def test_triton_matches_naive(B, Tq, Tk, Hq, Hkv, D, dtype):
    inputs = make_inputs(B, Tq, Tk, Hq, Hkv, D, gate="mixed", seed=D)
    low = _lowp(inputs, dtype)
    ref = run_with_grads(naive_forgetting_attention, *[t.double() for t in low], lse_weight=0.3)
    plain = run_with_grads(forgetting_attention, *low, lse_weight=0.3, backend="torch")
    got = run_with_grads(forgetting_attention, *low, lse_weight=0.3, backend="triton")
    assert got[0].dtype == dtype and got[1].dtype == torch.float32
    _check(got, plain, ref, dtype)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_triton_varlen_matches_naive(dtype):
    cu = torch.tensor([0, 1, 3, 80, 91], dtype=torch.int32)
    low = _lowp(make_inputs(1, 91, 91, 4, 1, 64, gate="mixed", seed=3), dtype)
    ref = run_with_grads(naive_forgetting_attention, *[t.double() for t in low], cu_seqlens=cu)
    plain = run_with_grads(forgetting_attention, *low, cu_seqlens=cu, backend="torch")
    got = run_with_grads(forgetting_attention, *low, cu_seqlens=cu, backend="triton")
    _check(got, plain, ref, dtype)


@pytest.mark.parametrize("gate", [0.0, -1e-4, -5.0, -30.0, float("-inf")], ids=lambda g: f"logf={g}")
def test_triton_gate_extremes(gate):
    low = _lowp(make_inputs(1, 40, 40, 2, 1, 32, gate=gate, seed=7), torch.float16)
    ref = run_with_grads(naive_forgetting_attention, *[t.double() for t in low])
    plain = run_with_grads(forgetting_attention, *low, backend="torch")
    got = run_with_grads(forgetting_attention, *low, backend="triton")
    _check(got, plain, ref, torch.float16)


def test_triton_varlen_strided_cu_seqlens():
    """cu_seqlens as a strided view (every other entry of a larger tensor): the kernels read it by
    pointer, so they must not assume it is contiguous."""
    cu = torch.tensor([0, 7, 5, 7, 40, 7], dtype=torch.int32)[::2]   # [0, 5, 40]
    assert not cu.is_contiguous()
    low = _lowp(make_inputs(1, 40, 40, 2, 1, 16, gate="mixed", seed=5), torch.float16)
    ref = run_with_grads(naive_forgetting_attention, *[t.double() for t in low], cu_seqlens=cu)
    plain = run_with_grads(forgetting_attention, *low, cu_seqlens=cu, backend="torch")
    got = run_with_grads(forgetting_attention, *low, cu_seqlens=cu, backend="triton")
    _check(got, plain, ref, torch.float16)


def test_triton_head_dim_1_with_any_last_stride():
    """With D = 1 torch calls a tensor contiguous whatever its last stride (here [B, 1, T, H] permuted to
    [B, T, H, 1]: last stride T * H), and .contiguous() keeps it; the kernels read one element per
    row, so any last stride is fine there and must not be rejected as 'not contiguous'."""
    B, T, H = 1, 20, 2
    g = torch.Generator().manual_seed(6)
    q = torch.randn(B, 1, T, H, generator=g).half().permute(0, 2, 3, 1)
    assert q.is_contiguous() and q.stride(-1) != 1
    k, v = (torch.randn(B, T, H, 1, generator=g).half() for _ in range(2))
    log_f = -torch.rand(B, T, H, generator=g)
    low = [q, k, v, log_f]
    ref = run_with_grads(naive_forgetting_attention, *[t.double() for t in low])
    plain = run_with_grads(forgetting_attention, *low, backend="torch")
    got = run_with_grads(forgetting_attention, *low, backend="triton")
    _check(got, plain, ref, torch.float16)
    # the same for the upstream gradient: a loss on a permuted out hands backward such a tensor
    qq = q.detach().clone().requires_grad_()
    out = forgetting_attention(qq, k, v, log_f, backend="triton")
    (out.permute(0, 3, 1, 2).float() * torch.randn(B, 1, T, H, generator=g)).sum().backward()
    assert torch.isfinite(qq.grad).all()


@pytest.mark.parametrize("layout", ["contiguous", "permuted"])
def test_triton_zero_size_batch_forward_and_backward(layout):
    """B = 0: torch calls every empty tensor contiguous whatever its strides, so .contiguous() keeps
    them (the upstream gradient of out.sum() is an expanded stride-0 tensor, a permuted view keeps its
    last stride); the kernels read nothing, and such tensors must not be rejected as 'not contiguous'."""
    if layout == "permuted":
        q = torch.zeros(0, 16, 2, 8, dtype=torch.float16).transpose(1, 3)   # [0, 8, 2, 16]
        assert q.stride(-1) != 1
    else:
        q = torch.zeros(0, 8, 2, 16, dtype=torch.float16)
    k, v = torch.zeros(0, 8, 1, 16, dtype=torch.float16), torch.zeros(0, 8, 1, 16, dtype=torch.float16)
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    out, lse = forgetting_attention(*leaves, torch.zeros(0, 8, 2), backend="triton", return_lse=True)
    assert out.shape == (0, 8, 2, 16) and lse.shape == (0, 2, 8)
    (out.float().sum() + lse.sum()).backward()
    assert [t.grad.shape for t in leaves] == [(0, 8, 2, 16), (0, 8, 1, 16), (0, 8, 1, 16)]


def test_triton_double_backward_is_a_clear_error():
    """The kernels' backward has no derivative of its own: differentiating the gradient again failed
    with torch's 'no autograd formula was registered' for an internal op."""
    low = _lowp(make_inputs(1, 6, 6, 2, 1, 16), torch.float16)
    with pytest.raises(RuntimeError, match="forgetting_attention.*double backward is not supported"):
        grad_of_grad(forgetting_attention, *low, backend="triton")
