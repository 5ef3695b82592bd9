"""Contract tests of the Triton forward/backward launchers, run by the Triton interpreter on CPU.

Everything is compared with a materialised float64 reference written here (independent of the
package's reference.py); dc comes from autograd through c.
"""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported (conftest.py does it too)

import math  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
from triton.runtime.interpreter import InterpretedFunction  # noqa: E402

from foxformer.ops.forgetting_attn import bwd, fwd  # noqa: E402
from foxformer.ops.forgetting_attn.bwd import triton_backward  # noqa: E402
from foxformer.ops.forgetting_attn.fwd import triton_forward  # noqa: E402

assert isinstance(fwd._fwd_kernel, InterpretedFunction), (
    "foxformer Triton kernels were imported before TRITON_INTERPRET=1 was set")

# Relative error of norms, and max-abs error relative to the reference's largest entry.
TOL = {torch.float32: (2e-5, 1e-4), torch.float16: (3e-3, 1e-2), torch.bfloat16: (2.5e-2, 6e-2)}
FLOOR = 0.05
NAMES = ("out", "lse", "dq", "dk", "dv", "dc")

# log f values before the cumsum; "closed" mixes clamped -inf gates (-1e4) into mild ones.
GATES = {
    "open": lambda g, n: -1e-7 * torch.rand(n, generator=g, dtype=torch.float64),
    "slow": lambda g, n: -1e-4 * (0.5 + torch.rand(n, generator=g, dtype=torch.float64)),
    "strong": lambda g, n: -5.0 * (0.5 + torch.rand(n, generator=g, dtype=torch.float64)),
    "hard": lambda g, n: torch.full((n,), -30.0, dtype=torch.float64),
    "closed": lambda g, n: torch.where(torch.rand(n, generator=g) < 0.08, -1e4,
                                       -0.3 * torch.rand(n, generator=g, dtype=torch.float64)),
}


def make_case(B, Tq, Tk, Hq, Hkv, D, dtype, gate, seed=0, c_offset=0.0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Tq, Hq, D, generator=g).to(dtype)
    k = torch.randn(B, Tk, Hkv, D, generator=g).to(dtype)
    v = torch.randn(B, Tk, Hkv, D, generator=g).to(dtype)
    do = torch.randn(B, Tq, Hq, D, generator=g).to(dtype)
    log_f = GATES[gate](g, B * Hq * Tk).reshape(B, Hq, Tk)
    c = log_f.cumsum(-1) + c_offset
    return q, k, v, c, do


def dense_reference(q, k, v, c, scale):
    """float64 out [B, Tq, Hq, D], lse [B, Hq, Tq]; inputs float64 and differentiable."""
    B, Tq, Hq, D = q.shape
    Tk, Hkv = k.shape[1], k.shape[2]
    k = k.repeat_interleave(Hq // Hkv, dim=2)
    v = v.repeat_interleave(Hq // Hkv, dim=2)
    pos = torch.arange(Tq) + (Tk - Tq)
    s = scale * torch.einsum("bihd,bjhd->bhij", q, k) + c[:, :, pos, None] - c[:, :, None, :]
    s = s.masked_fill(torch.arange(Tk)[None, :] > pos[:, None], float("-inf"))
    return torch.einsum("bhij,bjhd->bihd", torch.softmax(s, -1), v), torch.logsumexp(s, -1)


def reference(q, k, v, c, do, scale, segments=None, dlse=None, out_used=None):
    """out, lse, dq, dk, dv, dc in float64; segments: list of (start, end) for packed sequences.

    out_used: the output the backward kernel was given. Like FlashAttention, the kernel forms
    delta_i = do_i . o_i from that stored (rounded) output, which shifts dS_ij by p_ij * e_i with
    e_i = do_i . (o_exact_i - o_used_i). That is exactly the gradient of sum_i e_i lse_i, so the
    reference adds it as an lse gradient: what remains is the kernel's own error, not the
    conditioning of near-diagonal attention (where dS is a small difference of large terms).
    """
    leaves = [t.detach().double().requires_grad_() for t in (q, k, v, c)]
    qq, kk, vv, cc = leaves
    if segments is None:
        out, lse = dense_reference(qq, kk, vv, cc, scale)
    else:
        parts = [dense_reference(qq[:, s:e], kk[:, s:e], vv[:, s:e], cc[..., s:e], scale) for s, e in segments]
        out = torch.cat([p[0] for p in parts], dim=1)
        lse = torch.cat([p[1] for p in parts], dim=2)
    loss = (out * do.double()).sum()
    if dlse is not None:
        loss = loss + (lse * dlse.double()).sum()
    if out_used is not None:
        residual = (do.double() * (out.detach() - out_used.double())).sum(-1).transpose(1, 2)
        loss = loss + (lse * residual).sum()
    grads = torch.autograd.grad(loss, leaves)
    return (out.detach(), lse.detach(), *grads)


def run_kernels(q, k, v, c, do, scale, cu_seqlens=None, max_seqlen=None, dlse=None):
    out, lse = triton_forward(q, k, v, c, scale, cu_seqlens, max_seqlen)
    grads = triton_backward(do, q, k, v, c, out, lse, scale, cu_seqlens, max_seqlen, dlse=dlse)
    return (out, lse, *grads)


def assert_close(got, want, dtype, label=""):
    """Relative error of norms and max-abs error over max |ref|; both denominators are floored at
    FLOOR (per element) because some gradients are ~0 exactly (a single visible key, or hard gates),
    where only an absolute error is meaningful."""
    rel_tol, max_tol = TOL[dtype]
    for name, a, b in zip(NAMES, got, want):
        assert a.shape == b.shape, f"{label}{name}: shape {tuple(a.shape)} != {tuple(b.shape)}"
        assert torch.isfinite(a).all(), f"{label}{name}: non-finite values"
        err = a.double() - b
        rel = (err.norm() / max(b.norm().item(), FLOOR * math.sqrt(b.numel()))).item()
        worst = (err.abs().max() / max(b.abs().max().item(), FLOOR)).item()
        assert rel <= rel_tol, f"{label}{name}: relative error {rel:.2e} > {rel_tol:.0e}"
        assert worst <= max_tol, f"{label}{name}: max error {worst:.2e} (of max |ref|) > {max_tol:.0e}"


def check_dtypes(got, q, k):
    out, lse, dq, dk, dv, dc = got
    assert out.dtype == dq.dtype == q.dtype and dk.dtype == dv.dtype == k.dtype
    assert lse.dtype == torch.float32 and dc.dtype == torch.float32


# (B, Tq, Tk, Hq, Hkv, D, dtype, gate): a pairwise-style cover of lengths, offsets (Tq < Tk),
# head dims (padded and not), GQA ratios, gate regimes and input precisions.
DENSE_CASES = [
    (2, 17, 17, 2, 2, 16, torch.float16, "slow"),
    (1, 64, 64, 4, 1, 64, torch.bfloat16, "strong"),
    (1, 130, 130, 4, 1, 48, torch.float16, "open"),  # the interpreter's time goes with Hq: 8:1 runs at T 17 below
    (2, 1, 37, 4, 1, 100, torch.bfloat16, "hard"),
    (1, 17, 80, 8, 1, 128, torch.float16, "closed"),
    (1, 130, 161, 1, 1, 100, torch.bfloat16, "closed"),
    (2, 64, 100, 4, 4, 128, torch.float32, "strong"),
    (1, 130, 130, 2, 1, 16, torch.bfloat16, "slow"),
    (1, 1, 1, 8, 8, 64, torch.float16, "open"),
    (1, 33, 33, 2, 1, 1, torch.float32, "closed"),
    (1, 20, 45, 2, 2, 256, torch.float16, "strong"),
]


def case_id(case):
    B, Tq, Tk, Hq, Hkv, D, dtype, gate = case
    return f"B{B}-q{Tq}-k{Tk}-h{Hq}:{Hkv}-d{D}-{str(dtype).split('.')[-1]}-{gate}"


@pytest.mark.parametrize("case", DENSE_CASES, ids=[case_id(c) for c in DENSE_CASES])
def test_dense_matches_reference(case):
    B, Tq, Tk, Hq, Hkv, D, dtype, gate = case
    q, k, v, c, do = make_case(B, Tq, Tk, Hq, Hkv, D, dtype, gate)
    scale = D ** -0.5
    got = run_kernels(q, k, v, c, do, scale)
    check_dtypes(got, q, k)
    assert_close(got, reference(q, k, v, c, do, scale, out_used=got[0]), dtype)


VARLEN_CASES = [
    ([1, 2, 77, 5], 4, 1, 64, torch.bfloat16, "strong"),
    ([33, 1, 40], 2, 2, 48, torch.float16, "closed"),
    ([50, 16, 3], 8, 1, 100, torch.float32, "slow"),
]


def varlen_id(case):
    lengths, Hq, Hkv, D, dtype, gate = case
    return f"seg{'-'.join(map(str, lengths))}-h{Hq}:{Hkv}-d{D}-{str(dtype).split('.')[-1]}-{gate}"


@pytest.mark.parametrize("case", VARLEN_CASES, ids=[varlen_id(c) for c in VARLEN_CASES])
def test_varlen_matches_per_sequence_reference(case):
    lengths, Hq, Hkv, D, dtype, gate = case
    T = sum(lengths)
    q, k, v, c, do = make_case(1, T, T, Hq, Hkv, D, dtype, gate, seed=1)
    bounds = torch.tensor([0] + lengths).cumsum(0)
    cu_seqlens = bounds.to(torch.int32)
    segments = list(zip(bounds[:-1].tolist(), bounds[1:].tolist()))
    scale = D ** -0.5
    got = run_kernels(q, k, v, c, do, scale, cu_seqlens, max(lengths))
    check_dtypes(got, q, k)
    assert_close(got, reference(q, k, v, c, do, scale, segments, out_used=got[0]), dtype)


def test_large_c_keeps_full_precision():
    """|c| ~ 1e6 (a long running cumsum) with clamped -inf gates inside blocks, in fp32 inputs.

    fp32 c_i - c_j would be off by ~0.06 here; the float64 reference per program plus the hi/lo
    split on diagonal tiles must keep the result at fp32 accuracy.
    """
    q, k, v, c, do = make_case(1, 90, 120, 2, 1, 32, torch.float32, "closed", seed=3, c_offset=-1.0e6)
    c[..., 60:] -= 3.0e4  # a deep drop inside a block on both the query and the key side
    scale = 32 ** -0.5
    got = run_kernels(q, k, v, c, do, scale)
    assert_close(got, reference(q, k, v, c, do, scale), torch.float32)


def test_strided_inputs_and_lse_gradient():
    """q, k, v sliced out of one packed qkv tensor (non-contiguous), plus a gradient on lse."""
    B, T, H, D = 2, 40, 4, 24
    g = torch.Generator().manual_seed(4)
    qkv = torch.randn(B, T, 3, H, D, generator=g).to(torch.float16)
    q, k, v = qkv.unbind(2)
    assert not q.is_contiguous()
    c = GATES["strong"](g, B * H * T).reshape(B, H, T).cumsum(-1)
    do = torch.randn(B, T, H, D, generator=g).to(torch.float16)
    dlse = torch.randn(B, H, T, generator=g)
    scale = 0.3
    got = run_kernels(q, k, v, c, do, scale, dlse=dlse)
    assert_close(got, reference(q, k, v, c, do, scale, dlse=dlse, out_used=got[0]), torch.float16)


def test_out_buffer_fully_written_and_backward_deterministic():
    B, Tq, Tk, Hq, Hkv, D = 1, 50, 70, 4, 2, 40
    q, k, v, c, do = make_case(B, Tq, Tk, Hq, Hkv, D, torch.bfloat16, "strong", seed=5)
    scale = D ** -0.5
    buf = torch.full_like(q, float("nan"))
    out, lse = triton_forward(q, k, v, c, scale, out=buf)
    assert out.data_ptr() == buf.data_ptr()
    assert torch.isfinite(out).all() and torch.isfinite(lse).all()
    first = triton_backward(do, q, k, v, c, out, lse, scale)
    second = triton_backward(do, q, k, v, c, out, lse, scale)
    for name, a, b in zip(NAMES[2:], first, second):
        assert torch.equal(a, b), f"{name} differs between two identical backward calls"
    assert_close((out, lse, *first), reference(q, k, v, c, do, scale, out_used=out), torch.bfloat16)


def test_dc_rows_do_not_rely_on_zero_row_sums():
    """dc must equal the true gradient even where the query-side term (row sums of dS) is
    far from zero, as happens with a gradient on lse."""
    q, k, v, c, do = make_case(1, 24, 24, 1, 1, 16, torch.float32, "slow", seed=6)
    dlse = torch.full((1, 1, 24), 3.0)
    scale = 0.25
    got = run_kernels(q, k, v, c, do, scale, dlse=dlse)
    want = reference(q, k, v, c, do, scale, dlse=dlse)
    assert want[-1][0, 0, 1:].abs().max() > 0.1  # the query-side term matters here
    assert_close(got, want, torch.float32)


def test_bad_inputs_are_rejected():
    q, k, v, c, _ = make_case(1, 8, 8, 4, 2, 16, torch.float16, "slow")
    with pytest.raises(ValueError, match="c must be float64"):
        triton_forward(q, k, v, c.float(), 1.0)
    with pytest.raises(ValueError, match="multiple of kv heads"):
        triton_forward(q[:, :, :3], k, v, c[:, :3], 1.0)
    with pytest.raises(ValueError, match="must not exceed"):
        triton_forward(torch.cat([q, q], 1), k, v, c, 1.0)
    with pytest.raises(ValueError, match="cu_seqlens"):
        triton_forward(q, k, v, c, 1.0, torch.tensor([0, 8]), 8)


def test_configs_cover_every_head_dim(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    probe = torch.empty(0, device="meta")  # not CPU: exercise the GPU tables
    for D in (1, 16, 63, 64, 65, 128, 200, 256):
        for cfg in (fwd.fwd_config(D, probe), bwd.dkdv_config(D, probe), bwd.dq_config(D, probe)):
            assert min(cfg.block_m, cfg.block_n) >= 16 and cfg.num_warps in (1, 2, 4, 8)
        assert fwd.block_d_for(D) >= max(16, D) and math.log2(fwd.block_d_for(D)).is_integer()


class _GridRecorder:
    """Stands in for a Triton kernel: records the grid of each launch and runs nothing."""

    def __init__(self):
        self.grids = []

    def __getitem__(self, grid):
        self.grids.append(grid)
        return lambda *args, **kwargs: None


GRID_SHAPES = [  # B, T, Hq, Hkv, number of packed sequences (None: dense), max_seqlen
    pytest.param(1, 1 << 22, 16, 2, 1, 1 << 22, id="varlen-one-4M-segment"),
    pytest.param(1, 1 << 22, 16, 2, 70000, 8192, id="varlen-70000-segments"),
    pytest.param(70000, 64, 1, 1, None, None, id="dense-B70000"),
    pytest.param(4375, 64, 16, 16, None, None, id="dense-BxH70000"),
]


@pytest.mark.parametrize("B,T,Hq,Hkv,n_seq,max_seqlen", GRID_SHAPES)
def test_launch_grids_stay_within_cuda_limits(monkeypatch, B, T, Hq, Hkv, n_seq, max_seqlen):
    """CUDA takes up to 2^31 - 1 programs on grid axis 0 but only 65535 on axes 1 and 2; a launch
    past that fails on the GPU ('invalid argument'). Meta tensors and GPU tile sizes, nothing runs."""
    from foxformer.ops.forgetting_attn import decode, pruning, tiles

    rec = _GridRecorder()
    for mod, name in ((fwd, "_fwd_kernel"), (bwd, "_delta_kernel"), (bwd, "_dkdv_kernel"), (bwd, "_dq_kernel"),
                      (tiles, "_tile_bounds_kernel"), (pruning, "_max_sq_norm_kernel"),
                      (decode, "_decode_split_kernel"), (decode, "_decode_merge_kernel")):
        monkeypatch.setattr(mod, name, rec)
    for mod, name in ((fwd, "is_interpreted"), (bwd, "is_interpreted"), (decode, "_interpreted")):
        monkeypatch.setattr(mod, name, lambda t: False)
    meta = dict(device="meta", dtype=torch.bfloat16)
    q, do = torch.empty(B, T, Hq, 64, **meta), torch.empty(B, T, Hq, 64, **meta)
    k = v = torch.empty(B, T, Hkv, 64, **meta)
    c = torch.empty(B, Hq, T, device="meta", dtype=torch.float64)
    cu = None if n_seq is None else torch.empty(n_seq + 1, device="meta", dtype=torch.int32)
    delta = torch.empty(B, Hq, device="meta", dtype=torch.float64)
    for prune in (None, delta):
        out, lse = triton_forward(q, k, v, c, 0.125, cu, max_seqlen, prune_delta=prune)
        triton_backward(do, q, k, v, c, out, lse, 0.125, cu, max_seqlen, prune_delta=prune)
    pruning.max_sq_row_norms(torch.empty(1, 1, 1, 64).expand(B, T, Hq, 64))  # CPU: the custom op's real body
    # decoding a chunk of 8K queries (G * Tq rows) against the cache
    decode.triton_decode(q[:1, -8192:], k[:1], v[:1], c[:1].transpose(1, 2), None, 0.125, None, None, T, T)
    assert len(rec.grids) == 4 + 7 + 1 + 2  # attention (with pruning: 3 tile_bounds more), norms, decode
    for grid in rec.grids:
        assert len(grid) <= 3 and 1 <= grid[0] <= 2**31 - 1 and all(1 <= n <= 65535 for n in grid[1:]), grid


def test_launch_grid_past_one_launch_is_a_clear_error():
    """A varlen grid covers max_seqlen for every sequence: 70000 sequences next to one of 4M tokens
    would be 3.7e10 programs."""
    from foxformer.ops.forgetting_attn.tiles import launch_grid

    with pytest.raises(ValueError, match="more than one launch takes"):
        launch_grid(32768, 16, 70000)
