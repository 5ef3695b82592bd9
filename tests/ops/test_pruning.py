"""Adaptive computation pruning (prune_eps): error bounds, skipped work, and the API contract.

Pruned results are compared with the unpruned result of the same backend in fp32, against the
bounds derived in README.md: per row at most eps of probability is dropped, so
|d out| <= 2 eps max|v| and |d lse| <= -log(1 - eps); the gradient bounds below follow from the
same per-row L1 bound sum_j |p'_ij - p_ij| <= 2 eps (doubled here: the three kernels may drop
slightly different pairs, each set within the bound).
The Triton kernels run through the interpreter at kernel level (the public triton backend takes
fp16/bf16 only); the torch backend runs through the public function.
"""
import math

import pytest
import torch
import triton
import triton.language as tl

import foxformer.ops
from foxformer import forgetting_attention
from foxformer.ops import auto_qk_bound, gate_cumsum, portable, pruning_stats
from foxformer.ops.forgetting_attn.bwd import INTERPRET_DKDV_CONFIG, INTERPRET_DQ_CONFIG, triton_backward
from foxformer.ops.forgetting_attn.fwd import INTERPRET_FWD_CONFIG, triton_forward
from foxformer.ops.forgetting_attn.tiles import SEARCH_WIDTH, first_true, tile_bounds
from foxformer.ops.forgetting_attn.pruning import key_block_starts, max_sq_row_norms, prune_delta
from foxformer.ops.forgetting_attn.reference import torch_backward, torch_forward

EPS = 1e-3
ROUND = 1e-5  # fp32 rounding allowance, relative to each bound's scale

# log f per head, [H] -> [T] values: every regime pruning must handle.
GATES = {
    "open": lambda t, h: torch.full((t,), -1e-7),                # f ~ 1: nothing can be pruned
    "strong": lambda t, h: torch.full((t,), math.log(0.5)),      # f ~ 0.5: most tiles pruned
    # across heads: open, strong, slow decay, and mild gates with -inf cuts
    "mixed": lambda t, h: [torch.zeros(t), torch.full((t,), -0.69), torch.full((t,), -0.05),
                           torch.where(torch.arange(t) % 37 == 5, float("-inf"), -0.01)][h % 4],
}


def make(B, Tq, Tk, Hq, Hkv, D, gate, seed=0, q_scale=1.0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Tq, Hq, D, generator=g) * q_scale
    k = torch.randn(B, Tk, Hkv, D, generator=g)
    v = torch.randn(B, Tk, Hkv, D, generator=g)
    do = torch.randn(B, Tq, Hq, D, generator=g)
    log_f = torch.stack([GATES[gate](Tk, h) for h in range(Hq)], -1).expand(B, Tk, Hq).float()
    return q, k, v, log_f, do


def kernels(q, k, v, c_t, do, scale, delta=None, cu=None, max_seqlen=None):
    out, lse = triton_forward(q, k, v, c_t, scale, cu, max_seqlen, prune_delta=delta)
    return (out, lse, *triton_backward(do, q, k, v, c_t, out, lse, scale, cu, max_seqlen, prune_delta=delta))


def torch_kernels(q, k, v, c_t, do, scale, delta=None, cu=None, max_seqlen=None):
    out, lse = torch_forward(q, k, v, c_t, scale, cu, max_seqlen, prune_delta=delta)
    return (out, lse, *torch_backward(do, q, k, v, c_t, out, lse, scale, cu, max_seqlen, prune_delta=delta))


def check_bounds(got, ref, q, k, v, do, scale, eps=EPS):
    """got/ref: out, lse, dq, dk, dv, dc (kernel contract), pruned and unpruned."""
    out, lse, dq, dk, dv, dc = (x.double() for x in got)
    out0, lse0, dq0, dk0, dv0, dc0 = (x.double() for x in ref)
    q, k, v, do = (x.double() for x in (q, k, v, do))
    vmax = v.abs().max().item()
    assert (out - out0).abs().max() <= 2 * eps * vmax * (1 + ROUND) + ROUND, "out"
    assert (lse - lse0).abs().max() <= -math.log1p(-eps) + ROUND * lse0.abs().max(), "lse"
    # |dP_ij| <= A_i = ||do_i|| max_j ||v_j||; per row sum_j |dS'_ij - dS_ij| <= 6 eps A_i (x2 slack)
    a = (do.norm(dim=-1) * v.norm(dim=-1).max()).sum().item()
    ds_l1 = 12 * eps * a
    l1 = lambda x: x.abs().sum().item()  # noqa: E731
    tol = lambda x: ROUND * (l1(x) + 1)  # noqa: E731
    assert l1(dv - dv0) <= 4 * eps * l1(do) + tol(dv0), "dv"
    assert l1(dq - dq0) <= scale * k.abs().sum(-1).max().item() * ds_l1 + tol(dq0), "dq"
    assert l1(dk - dk0) <= scale * q.abs().sum(-1).max().item() * ds_l1 + tol(dk0), "dk"
    assert l1(dc - dc0) <= 2 * ds_l1 + tol(dc0), "dc"


CASES = [
    # B, Tq, Tk, Hq, Hkv, D, gate
    pytest.param(1, 130, 130, 2, 1, 16, "open", id="open-gqa2"),
    pytest.param(2, 70, 160, 2, 2, 16, "strong", id="strong-prefill-Tq70-Tk160"),
    pytest.param(1, 160, 160, 4, 2, 16, "mixed", id="mixed-heads-cuts-gqa2"),
]


@pytest.mark.parametrize("backend", ["triton", "torch"])
@pytest.mark.parametrize("B,Tq,Tk,Hq,Hkv,D,gate", CASES)
def test_pruned_within_bound_auto(backend, B, Tq, Tk, Hq, Hkv, D, gate):
    q, k, v, log_f, do = make(B, Tq, Tk, Hq, Hkv, D, gate)
    c_t = gate_cumsum(log_f).transpose(1, 2).contiguous()
    scale = D ** -0.5
    delta = prune_delta(q, k, EPS, "auto", scale, Tk)
    run = kernels if backend == "triton" else torch_kernels
    got, ref = run(q, k, v, c_t, do, scale, delta), run(q, k, v, c_t, do, scale)
    check_bounds(got, ref, q, k, v, do, scale)
    if gate == "open" and backend == "triton":
        for a, b in zip(got, ref):  # nothing pruned: the very same loops run
            assert torch.equal(a, b)


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_given_bound_prunes_visible_mass_within_bound(backend):
    """q = 0 makes U = 0 an exact bound, so delta is as high as it can be: pruning drops a mass
    well above rounding, which must still stay under the bound (eps large to see it)."""
    eps = 0.05
    q, k, v, log_f, do = make(1, 160, 160, 2, 1, 16, "strong", seed=1, q_scale=0.0)
    log_f = log_f * 0.3  # slow enough that dropped keys still carry visible weight
    c_t = gate_cumsum(log_f).transpose(1, 2).contiguous()
    scale = 0.25
    delta = prune_delta(q, k, eps, 0.0, scale, 160)
    run = kernels if backend == "triton" else torch_kernels
    got, ref = run(q, k, v, c_t, do, scale, delta), run(q, k, v, c_t, do, scale)
    assert (got[0] - ref[0]).abs().max() > 1e-5  # something was really dropped
    check_bounds(got, ref, q, k, v, do, scale, eps=eps)


def test_varlen_within_bound_and_triton_matches_torch_stats():
    lengths = [5, 90, 1, 64]
    T = sum(lengths)
    cu = torch.tensor([0] + lengths).cumsum(0).to(torch.int32)
    q, k, v, log_f, do = make(1, T, T, 2, 1, 16, "mixed", seed=2)
    c_t = gate_cumsum(log_f).transpose(1, 2).contiguous()
    scale = 0.25
    delta = prune_delta(q, k, EPS, "auto", scale, max(lengths))
    got = kernels(q, k, v, c_t, do, scale, delta, cu, max(lengths))
    ref = kernels(q, k, v, c_t, do, scale, None, cu, max(lengths))
    check_bounds(got, ref, q, k, v, do, scale)
    got_t = torch_kernels(q, k, v, c_t, do, scale, delta, cu, max(lengths))
    check_bounds(got_t, ref, q, k, v, do, scale)
    kept = pruning_stats(q, k, log_f, EPS, cu_seqlens=cu)
    assert kept.shape == (1, 2) and kept[0, 0] == 1.0 and kept[0, 1] < 1.0


def test_interface_torch_backend_gradients_within_bound():
    """Public function, torch backend, autograd down to log_fgate (through the cumsum)."""
    q, k, v, log_f, do = make(1, 150, 150, 4, 2, 16, "mixed", seed=3)
    leaves = lambda: [t.clone().requires_grad_() for t in (q, k, v, log_f)]  # noqa: E731
    res = []
    for eps in (EPS, None):
        xs = leaves()
        out, lse = forgetting_attention(*xs, backend="torch", return_lse=True, prune_eps=eps)
        (out * do).sum().backward()
        res.append([out.detach(), lse.detach()] + [x.grad for x in xs])
    (out, lse, dq, dk, dv, dlf), (out0, lse0, dq0, dk0, dv0, dlf0) = res
    assert (out - out0).abs().max() <= 2 * EPS * v.abs().max() + 1e-5
    assert (lse - lse0).abs().max() <= -math.log1p(-EPS) + 1e-5
    # dlog f_l = sum_{t >= l} dc_t, so |d dlog f| <= ||d dc||_1 (bound as in check_bounds)
    a = (do.double().norm(dim=-1) * v.double().norm(dim=-1).max()).sum().item()
    assert (dlf - dlf0).abs().max() <= 24 * EPS * a + 1e-4
    for g, g0 in ((dq, dq0), (dk, dk0), (dv, dv0)):
        assert (g - g0).abs().max() <= 1e-2 * g0.abs().max()


def test_interface_triton_fp16_open_gates_bitwise_and_strong_close():
    q, k, v, log_f, _ = make(1, 64, 64, 2, 1, 32, "open", seed=4)
    q, k, v = (x.half() for x in (q, k, v))
    a = forgetting_attention(q, k, v, log_f, backend="triton", prune_eps=EPS)
    b = forgetting_attention(q, k, v, log_f, backend="triton")
    assert torch.equal(a, b)
    strong = log_f.new_full(log_f.shape, math.log(0.5))
    a = forgetting_attention(q, k, v, strong, backend="triton", prune_eps=EPS, qk_bound=torch.tensor(50.0))
    b = forgetting_attention(q, k, v, strong, backend="triton")
    assert (a.float() - b.float()).abs().max() <= 2 * EPS * v.abs().max().item() + 2e-3


def test_too_small_given_bound_breaks_the_guarantee():
    """Documented contract: a given qk_bound is trusted. Far keys with large logits are then
    pruned although they dominate their rows; 'auto' keeps them."""
    T, D = 128, 16
    q, k, v, log_f, _ = make(1, T, T, 1, 1, D, "strong", seed=5)
    q = torch.zeros_like(q)
    q[..., 0] = 4.0
    k = torch.zeros_like(k)
    k[:, :8, :, 0] = 40.0  # logit 40 * 4 / 4 = 40 for keys far behind most queries
    exact = forgetting_attention(q, k, v, log_f, backend="torch")
    wrong = forgetting_attention(q, k, v, log_f, backend="torch", prune_eps=EPS, qk_bound=0.0)
    auto = forgetting_attention(q, k, v, log_f, backend="torch", prune_eps=EPS, qk_bound="auto")
    bound = 2 * EPS * v.abs().max()
    assert (wrong - exact).abs().max() > 10 * bound
    assert (auto - exact).abs().max() <= bound + 1e-5


LAYOUTS = [
    # Tq, Tk, cu_seqlens: the checked sequence is the last one (keys s0 .. Tk)
    pytest.param(192, 192, None, id="dense"),
    pytest.param(100, 192, None, id="prefill-Tq100-Tk192"),
    pytest.param(192, 192, [0, 40, 192], id="varlen"),
]


@pytest.mark.parametrize("bm,bn", [(32, 16), (16, 32)], ids=["bm32-bn16", "bm16-bn32"])
@pytest.mark.parametrize("Tq,Tk,cu", LAYOUTS)
def test_tile_bounds_match_a_plain_scan(Tq, Tk, cu, bm, bn):
    """The per-program search kernel against the tile test written out in torch: for each query
    block the first key block with c[first query] - c[block's last key] > delta (query-stationary),
    for each key block the first query tile with c[first query] - c[last key] <= delta."""
    _, _, _, log_f, _ = make(1, Tk, Tk, 3, 1, 16, "mixed", seed=3)
    log_f = log_f[..., :3] * torch.tensor([1.0, 0.3, 3.0])     # three decay speeds
    c_t = gate_cumsum(log_f).transpose(1, 2).contiguous()          # [1, H, Tk] float64
    H = c_t.shape[1]
    delta = torch.tensor([[-3.0, -8.0, -20.0]], dtype=torch.float64)
    segs = [(0, Tk)] if cu is None else list(zip(cu[:-1], cu[1:]))
    cu_t = torch.tensor(cu if cu is not None else [0, Tk], dtype=torch.int32)
    max_len = max(e - s for s, e in segs)
    n_q_all = Tq if cu is None else max_len
    qs_blocks, ks_blocks = triton.cdiv(n_q_all, bm), triton.cdiv(max_len if cu else Tk, bn)
    args = (c_t, delta, cu_t, cu is not None, len(segs), Tq, Tk)
    got_q = tile_bounds(*args, qs_blocks, bm, bn, False)
    got_k = tile_bounds(*args, ks_blocks, bm, bn, True)
    assert (got_q > 0).any(), "the case must prune something"
    for z, (s0, e0) in enumerate(segs):
        n_k = e0 - s0
        n_q = n_k if cu is not None else Tq
        off = n_k - n_q
        c = c_t[0, :, s0:e0]
        for h in range(H):
            d = delta[0, h].item()
            for b in range(triton.cdiv(n_q, bm)):
                p = off + b * bm
                want = next(j for j in range(0, p // bn + 1) if j == p // bn or c[h, p] - c[h, j * bn + bn - 1] > d)
                assert got_q[z, h, b].item() == want * bn, ("query block", z, h, b)
            for b in range(triton.cdiv(n_k, bn)):
                i_lo = max(b * bn - off, 0)
                last = min(b * bn + bn, n_k) - 1
                tiles = list(range(i_lo, n_q, bm))
                want = next((t for t in tiles if c[h, off + t] - c[h, last] <= d), i_lo + len(tiles) * bm)
                assert got_k[z, h, b].item() == want, ("key block", z, h, b)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the interpreter's numpy meets the NaN
@pytest.mark.parametrize("Tq,Tk,cu", LAYOUTS)
def test_skipped_tiles_are_never_loaded(Tq, Tk, cu):
    """NaN in k/v of keys the forward and dq kernels skip, and in q/do of query rows the dk/dv
    kernel skips, must not reach the rows and columns that skip them (masking would leak NaN)."""
    H, D = 2, 16
    q, k, v, log_f, do = make(1, Tq, Tk, H, 1, D, "strong", seed=6)
    c_t = gate_cumsum(log_f).transpose(1, 2).contiguous()
    scale = 0.25
    s0 = 0 if cu is None else cu[-2]
    n_k = Tk - s0
    off = n_k - (Tq - s0)
    cu_t = None if cu is None else torch.tensor(cu, dtype=torch.int32)
    max_len = None if cu is None else max(b - a for a, b in zip(cu[:-1], cu[1:]))
    delta = prune_delta(q, k, EPS, 1.0, scale, Tk)  # a given bound: only the ranges matter here
    clean = kernels(q, k, v, c_t, do, scale, delta, cu_t, max_len)
    seg_c = c_t[..., s0:]

    # forward and dq: poison the first 16 keys of the sequence
    kp, vp = k.clone(), v.clone()
    kp[:, s0:s0 + 16] = float("nan")
    vp[:, s0:s0 + 16] = float("nan")
    out, lse = triton_forward(q, kp, vp, c_t, scale, cu_t, max_len, prune_delta=delta)
    dq = triton_backward(do, q, kp, vp, c_t, clean[0], clean[1], scale, cu_t, max_len, prune_delta=delta)[0]
    unpruned = triton_forward(q, kp, vp, c_t, scale, cu_t, max_len)[0]
    for cfg, got, ref in ((INTERPRET_FWD_CONFIG, out, clean[0]), (INTERPRET_DQ_CONFIG, dq, clean[2])):
        starts = torch.arange(0, Tq - s0, cfg.block_m)
        lo = key_block_starts(seg_c, delta, off + starts, cfg.block_n)[0]          # [H, n_blocks]
        safe = (lo >= 16).repeat_interleave(cfg.block_m, dim=1)[:, :Tq - s0].T      # [rows, H]
        assert safe.sum() >= safe.numel() // 4
        assert torch.equal(got[0, s0:][safe], ref[0, s0:][safe])
    assert torch.isnan(unpruned[0, s0:][safe]).all()  # without pruning the poison does arrive

    # dk/dv: poison query rows from R on, R past every kept query tile of the first key block
    bn, bm = INTERPRET_DKDV_CONFIG.block_n, INTERPRET_DKDV_CONFIG.block_m
    i_lo = max(-off, 0)
    tile_starts = torch.arange(i_lo, Tq - s0, bm)
    pruned = (seg_c[0, :, off + tile_starts] - seg_c[0, :, bn - 1:bn]) <= delta[0, :, None]  # [H, tiles]
    assert pruned.any(-1).all()
    R = s0 + i_lo + int(pruned.int().argmax(-1).max()) * bm
    assert R < Tq
    qp, dop = q.clone(), do.clone()
    qp[:, R:] = float("nan")
    dop[:, R:] = float("nan")
    _, dk, dv, dc = triton_backward(dop, qp, k, v, c_t, clean[0], clean[1], scale, cu_t, max_len,
                                    prune_delta=delta)
    keys = slice(s0, s0 + bn)
    assert torch.equal(dk[:, keys], clean[3][:, keys]) and torch.equal(dv[:, keys], clean[4][:, keys])
    if off == 0:
        assert torch.equal(dc[..., keys], clean[5][..., keys])
    assert torch.isnan(dk[:, s0 + bn:]).any()


@pytest.mark.parametrize("T,H,D", [(1, 1, 16), (130, 3, 48), (64, 2, 100)], ids=["T1", "T130-D48", "T64-D100"])
def test_max_sq_row_norms_kernel_matches_torch(T, H, D):
    """The one-pass Triton kernel behind the auto bound, on a strided view (a slice of a wider
    projection output), against fp64 torch; a NaN poisons a row outside the view."""
    g = torch.Generator().manual_seed(1)
    wide = torch.randn(2, T, H, D + 8, generator=g) * torch.linspace(0.1, 3.0, T)[:, None, None]
    wide[..., D:] = float("nan")
    x = wide.to(torch.bfloat16)[..., :D]
    assert not x.is_contiguous()
    got = max_sq_row_norms(x)
    want = x.double().square().sum(-1).amax(dim=1)
    assert got.dtype == torch.float32 and got.shape == (2, H)
    torch.testing.assert_close(got.double(), want, rtol=1e-6, atol=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=["bf16", "fp16", "fp32"])
def test_auto_bound_covers_every_logit_of_half_inputs(dtype):
    """Norms taken in the input dtype (no fp32 copy) still bound |scale * q . k| of the rounded inputs,
    including the pair that attains it (q and k parallel), and exceed it by a few units of rounding only."""
    g = torch.Generator().manual_seed(3)
    q = (torch.randn(2, 37, 4, 100, generator=g) * 3).to(dtype)
    k = (torch.randn(2, 37, 2, 100, generator=g) * 5).to(dtype)
    k[:, 5] = (q[:, 7, ::2] * 2).to(dtype)  # k parallel to some q: the Cauchy-Schwarz bound is attained
    u = auto_qk_bound(q, k, 0.1)
    qq, kk = q.double(), k.double().repeat_interleave(2, dim=2)
    logits = torch.einsum("bihd,bjhd->bhij", qq, kk).abs().amax(dim=(-1, -2)) * 0.1    # [B, Hq]
    exact = qq.norm(dim=-1).amax(1) * kk.norm(dim=-1).amax(1) * 0.1
    assert (u >= logits).all() and (u >= exact).all()
    assert (u <= exact * (1 + 1e-4) * (1 + 4 * torch.finfo(dtype).eps)).all()  # 1e-4: the fp32 margin


def test_pruning_stats():
    T = 4096
    q, k, _, _, _ = make(1, T, T, 3, 1, 16, "open", seed=7)
    log_f = torch.stack([GATES["open"](T, 0), GATES["strong"](T, 0), GATES["mixed"](T, 3)], -1)[None]
    kept = pruning_stats(q, k, log_f, EPS, block_m=128, block_n=64)
    assert kept.shape == (1, 3)
    assert kept[0, 0] == 1.0 and kept[0, 1] < 0.15 and kept[0, 2] < 0.5
    # a larger eps or a smaller bound prunes more; decoding (Tq = 1) sees one tile row
    assert (pruning_stats(q, k, log_f, 0.5, qk_bound=1.0, block_m=128, block_n=64) <= kept).all()
    one = pruning_stats(q[:, -1:], k, log_f, EPS, block_m=128, block_n=64)
    assert one[0, 0] == 1.0 and one[0, 1] < 0.1


@pytest.mark.parametrize("kw,err,match", [
    (dict(prune_eps=None), TypeError, "prune_eps"),
    (dict(prune_eps=EPS, block_m=0), ValueError, "block_m"),
    (dict(prune_eps=EPS, block_n=-16), ValueError, "block_n"),
], ids=["eps-none", "block-m-0", "block-n-negative"])
def test_pruning_stats_rejects_bad_arguments_by_name(kw, err, match):
    # prune_eps=None used to fail in float(None) inside prune_delta, block_m=0 in a range step of 0
    q, k, _, log_f, _ = make(1, 8, 8, 2, 1, 16, "strong")
    with pytest.raises(err, match=match):
        pruning_stats(q, k, log_f, **kw)


@pytest.mark.parametrize("change,err,match", [
    (lambda q, k, f: (q, k, f.transpose(1, 2)), ValueError, r"pass log_fgate\.transpose\(1, 2\)"),
    (lambda q, k, f: (q, k, f.masked_fill(f.new_ones(f.shape, dtype=torch.bool), float("nan"))),
     ValueError, "log_fgate contains NaN"),
    (lambda q, k, f: (q, k, -f), ValueError, r"<= 0 .*F\.logsigmoid"),
    (lambda q, k, f: (q[0], k, f), ValueError, r"q must be 4-D \[batch, seq, heads, head_dim\]"),
    (lambda q, k, f: (q, k[..., :8], f), ValueError, "head_dim mismatch"),
    (lambda q, k, f: (q.half(), k, f), TypeError, "share one dtype"),
], ids=["gate-heads-first", "gate-nan", "gate-positive", "q-3d", "head-dims-differ", "dtypes-differ"])
def test_pruning_stats_checks_its_inputs_as_the_op_does(change, err, match):
    """pruning_stats took a [B, H, T] gate into a broadcast error, a 3-D q into an unpacking error, and counted
    the tiles of a NaN or positive gate as if it were one."""
    q, k, _, log_f, _ = make(1, 8, 8, 2, 1, 16, "strong")
    with pytest.raises(err, match=match):
        pruning_stats(*change(q, k, log_f), EPS)
    c = gate_cumsum(log_f)
    with pytest.raises(ValueError, match="one of the two"):
        pruning_stats(q, k, log_f, EPS, c=c)
    assert torch.equal(pruning_stats(q, k, None, EPS, c=c), pruning_stats(q, k, log_f, EPS))


@pytest.mark.parametrize("change,err,match", [
    (lambda q, k: (q[0], k), ValueError, "q must be 4-D"),
    (lambda q, k: (q, k[..., :8]), ValueError, "head_dim mismatch"),
    (lambda q, k: (q, k.expand(-1, -1, 3, -1)), ValueError, r"multiple of key/value heads \(3\)"),
    (lambda q, k: (q, k.long()), TypeError, "k must be float16, bfloat16, float32 or float64"),
], ids=["q-3d", "head-dims-differ", "heads-not-a-multiple", "k-integer"])
def test_auto_qk_bound_names_a_wrong_input(change, err, match):
    """A 3-D q failed with an IndexError, and k of another head dim gave a bound without a word."""
    q, k, _, _, _ = make(1, 8, 8, 2, 1, 16, "strong")
    with pytest.raises(err, match=match):
        auto_qk_bound(*change(q, k), 0.25)
    assert torch.equal(auto_qk_bound(q, k, None), auto_qk_bound(q, k, 0.25))  # None: 1 / sqrt(16)


def test_compiles_without_graph_breaks():
    q, k, v, log_f, _ = make(1, 40, 40, 2, 1, 16, "strong", seed=8)

    def f(q, k, v, log_f):
        given = forgetting_attention(q, k, v, log_f, backend="torch", prune_eps=EPS,
                                     qk_bound=torch.full((1, 2), 30.0))
        return given + forgetting_attention(q, k, v, log_f, backend="torch", prune_eps=EPS, qk_bound="auto")
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(q, k, v, log_f), f(q, k, v, log_f))


def test_compiles_with_a_float_qk_bound_that_varies():
    """A float qk_bound that changes between calls turns symbolic under torch.compile (a SymFloat at the
    first recompile); its check used math.isfinite, which dynamo cannot trace, so fullgraph failed."""
    q, k, v, log_f, _ = make(1, 12, 12, 2, 1, 8, "strong", seed=8)

    def f(q, k, v, log_f, bound):
        return forgetting_attention(q, k, v, log_f, backend="torch", prune_eps=EPS, qk_bound=bound)
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    for bound in (20.0, 30.0, 40.0):
        torch.testing.assert_close(compiled(q, k, v, log_f, bound), f(q, k, v, log_f, bound))


@pytest.mark.parametrize("kw,err,match", [
    (dict(prune_eps=0.0), ValueError, "prune_eps"),
    (dict(prune_eps=1e-3, qk_bound=float("nan")), ValueError, "qk_bound"),
    (dict(prune_eps=1e-3, qk_bound=float("inf")), ValueError, "qk_bound"),
    (dict(prune_eps=1.5), ValueError, "prune_eps"),
    (dict(prune_eps="1e-3"), TypeError, "prune_eps"),
    (dict(prune_eps=1e-3, qk_bound=-1.0), ValueError, "qk_bound"),
    (dict(prune_eps=1e-3, qk_bound="max"), ValueError, "qk_bound"),
    (dict(prune_eps=1e-3, qk_bound=torch.ones(3)), ValueError, "qk_bound"),
    (dict(prune_eps=1e-3, qk_bound=torch.tensor([float("nan")])), ValueError, "qk_bound"),
    # broadcastable with [B, Hq] = [1, 2], but not to it
    (dict(prune_eps=1e-3, qk_bound=torch.ones(3, 1, 2)), ValueError, "qk_bound"),
    (dict(prune_eps=1e-3, qk_bound=torch.ones(2, 1)), ValueError, "qk_bound"),
    # a bound without prune_eps was ignored: no pruning, and no word that it takes prune_eps to prune
    (dict(qk_bound=10.0), ValueError, r"^qk_bound \(10\.0\) was given without prune_eps: .* it only applies with "
                                      r"prune_eps, which turns pruning on"),
    (dict(qk_bound="auto"), ValueError, r"^qk_bound \('auto'\) was given without prune_eps"),
    (dict(qk_bound=torch.ones(1, 2)), ValueError,
     r"^qk_bound \(a tensor of shape \(1, 2\)\) was given without prune_eps"),
], ids=["eps0", "bound-float-nan", "bound-float-inf", "eps1.5", "eps-str", "bound-neg", "bound-str", "bound-shape", "bound-nan",
        "bound-extra-dim", "bound-grows-batch", "bound-without-eps", "bound-auto-without-eps",
        "bound-tensor-without-eps"])
@pytest.mark.parametrize("entry", ["log_fgate", "cumsum", "portable-log_fgate", "portable-cumsum"])
def test_bad_pruning_arguments(kw, err, match, entry):
    """The portable ops (a standalone export's) took every one of these without a word, and pruned nothing."""
    q, k, v, log_f, _ = make(1, 8, 8, 2, 1, 16, "strong")
    ops = portable if entry.startswith("portable-") else foxformer.ops
    fn, gate = ((ops.forgetting_attention, log_f) if entry.endswith("log_fgate")
                else (ops.forgetting_attention_cumsum, gate_cumsum(log_f)))
    with pytest.raises(err, match=match):
        fn(q, k, v, gate, backend="torch", **kw)


@pytest.mark.parametrize("entry", ["log_fgate", "cumsum"])
@pytest.mark.parametrize("bound", ["auto", 4.0])
def test_the_portable_ops_prune_as_the_torch_backend_does(entry, bound):
    """A gradient-free call of the portable ops skips the keys forgetting_attention's torch backend skips (the same
    chunked forward, the same threshold): bit for bit its result, and not the exact one."""
    q, k, v, log_f, _ = make(2, 96, 96, 4, 2, 16, "strong", q_scale=0.1)
    gate = log_f if entry == "log_fgate" else gate_cumsum(log_f)
    name = "forgetting_attention" if entry == "log_fgate" else "forgetting_attention_cumsum"
    pruning = dict(prune_eps=0.2, qk_bound=bound, return_lse=True)
    with torch.no_grad():
        got = getattr(portable, name)(q, k, v, gate, **pruning)
        want = getattr(foxformer.ops, name)(q, k, v, gate, backend="torch", **pruning)
        exact = getattr(portable, name)(q, k, v, gate, return_lse=True)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert not torch.equal(got[1], exact[1])


@triton.jit
def _search_probe(C, Ref, Delta, Out, n, STEP: tl.constexpr, KEEP_ABOVE: tl.constexpr, W: tl.constexpr):
    i = tl.program_id(0)
    tl.store(Out + i, first_true(C, STEP, tl.load(Ref + i), tl.load(Delta + i), n, KEEP_ABOVE, W))


@pytest.mark.parametrize("n", [0, 1, 2, 63, 64, 65, 200, 4097], ids=lambda n: f"n{n}")
def test_wide_search_finds_the_flip_of_a_monotone_predicate(n):
    """first_true (the tile-range search of every pruned kernel) against a plain scan, for flips at
    every kind of place: first, last, group edges, none; both predicate directions."""
    step = 3
    c = -torch.rand(max(n, 1) * step, dtype=torch.float64).cumsum(0)    # non-increasing, like c
    x = c[::step][:n]
    flips = sorted({0, 1, n // 2, n - 1, n, 63, 64, 65, 128} - {-1})
    for keep_above in (True, False):
        refs, deltas, want = [], [], []
        for f in flips:
            f = min(max(f, 0), n)
            if keep_above:   # ref - x_i > delta flips to true at f: x_i decreases
                ref = 0.0
                delta = (-(x[f - 1]).item() + (-(x[f]).item() if f < n else 1e9)) / 2 if f > 0 else -1e9
                if f == n and n > 0:
                    delta = -x[n - 1].item() + 1.0
            else:            # x_i - ref <= delta flips to true at f
                ref = 0.0
                delta = ((x[f - 1].item() if f > 0 else 1.0) + (x[f].item() if f < n else -1e9)) / 2
            refs.append(ref), deltas.append(delta)
            xs = x.numpy()
            pred = (ref - xs > delta) if keep_above else (xs - ref <= delta)
            want.append(int(pred.argmax()) if pred.any() else n)
        out = torch.full((len(flips),), -1, dtype=torch.int32)
        _search_probe[(len(flips),)](c, torch.tensor(refs, dtype=torch.float64), torch.tensor(deltas, dtype=torch.float64),
                             out, n, STEP=step, KEEP_ABOVE=keep_above, W=SEARCH_WIDTH)
        assert out.tolist() == want, (keep_above, flips)
