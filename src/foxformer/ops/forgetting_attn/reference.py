"""Exact PyTorch implementations of Forgetting Attention.

* ``naive_forgetting_attention``: materialises the full ``[Tq, Tk]`` score matrix and lets autograd
  differentiate it. It treats ``log f = -inf`` exactly (no floor) and is the reference every
  other backend is tested against. Memory O(T^2): for tests and small inputs only.
* ``torch_forward`` / ``torch_backward``: FlashAttention-style chunked forward and recomputing
  backward in plain PyTorch, with the same contract as the Triton launchers (they take the
  float64 cumsum c, return ``dc``). Memory O(T * chunk); runs at 64K tokens on a CPU.
"""
from __future__ import annotations

import torch

from .checks import check_inputs

# Scores held at once by the chunked backend, per chunk: 2^24 elements (64 MiB in fp32) keeps several live
# temporaries of that size well inside a 24 GiB CPU machine at 64K tokens (chunks keep 16 rows at least).
_CHUNK_ELEMENTS = 1 << 24
# Query rows per chunk, at most. A chunk scores only the keys up to its last row (and with pruning skips the
# keys all of its rows may skip), so short chunks skip most of the masked triangle, and their temporaries stay
# in cache. Forward+backward ms, float32, 2 CPU cores, at B 8 T 512 4 heads of 16 (the tiny presets) / B 2 T 2048
# 4x16 / B 1 T 4096 8x64 / B 1 T 16K 4x16: 64 rows 41 / 167 / 1360 / 9280; 32 rows 43 / 173 / 1594 / 9942;
# 128 rows 49 / 199 / 1352 / -; the element budget alone (up to 1024 rows) 172 / 509 / 1900 / 12817 (thirtieth
# session, `bench_case` of `foxformer bench attention` with the budget varied; docs/benchmarks.md "The CPU path").
CHUNK_ROWS = 64
# exp of a float32 score this far below its row's maximum is a denormal or 0, and x86 takes a slow path for those
# (`exp_` of 1M scores spread over [-300, 0], 30% masked: 7.5 ms, against 2.4 with this floor; thirtieth session, 2
# cores). Below it the probabilities are flushed to 0: they are under 2^-125 of the row's largest, which a row sum
# (at least 1) cannot hold and a gradient term cannot feel.
_EXP_FLOOR = -87.0


def _segments(cu_seqlens: torch.Tensor | None, T: int) -> list[tuple[int, int]]:
    if cu_seqlens is None:
        return [(0, T)]
    bounds = cu_seqlens.tolist()
    return list(zip(bounds[:-1], bounds[1:]))


def naive_forgetting_attention(q, k, v, log_fgate, softmax_scale=None, cu_seqlens=None,
                               max_seqlen=None, return_lse=False):
    """Materialised reference; same arguments, input checks and outputs as ``forgetting_attention``.

    Computes in the input dtype (pass float64 tensors for a high-precision reference), but for the gate cumsum,
    which is float64 as in every backend.
    ``log_fgate = -inf`` is handled exactly: it cuts every key before it, with no floor.
    """
    # Unchecked, a cu_seqlens not ending at T dropped the rows past its end and a positive gate gave NaN.
    softmax_scale, _ = check_inputs(q, k, v, log_fgate, "log_fgate", softmax_scale, cu_seqlens, max_seqlen,
                                    return_lse)
    return naive_unchecked(q, k, v, log_fgate, softmax_scale, cu_seqlens, return_lse)


def no_queries(q, k, v, gate, return_lse):
    """The result for Tq = 0 (cu_seqlens [0] included), as torch's attention gives it: out [batch, 0, heads, dim]
    and lse [batch, heads, 0], before any kernel (a grid of no rows) or packed segment (none to concatenate). Both
    hang off every input, so that a backward gives each a gradient (zero-size for q; for k, v and the gate zeros
    of their shapes, which hold Tk positions) instead of failing on an unused input."""
    tie = sum(x[:, :0].sum() for x in (k, v, gate)).to(q.dtype)
    out = q + tie
    return (out, out.sum(-1).transpose(1, 2).to(_compute_dtype(q.dtype))) if return_lse else out


def naive_unchecked(q, k, v, log_fgate, scale, cu_seqlens=None, return_lse=False):
    """``naive_forgetting_attention`` for inputs already checked (the scale resolved)."""
    if q.shape[1] == 0:
        return no_queries(q, k, v, log_fgate, return_lse)
    if cu_seqlens is not None:
        pieces = [
            naive_unchecked(q[:, s:e], k[:, s:e], v[:, s:e], log_fgate[:, s:e], scale, return_lse=True)
            for s, e in _segments(cu_seqlens, q.shape[1])
        ]
        out = torch.cat([o for o, _ in pieces], dim=1)
        lse = torch.cat([l for _, l in pieces], dim=2)
        return (out, lse) if return_lse else out

    B, Tq, Hq, D = q.shape
    Tk, Hkv = k.shape[1], k.shape[2]
    group = Hq // Hkv
    kh = k.repeat_interleave(group, dim=2)
    vh = v.repeat_interleave(group, dim=2)
    logits = torch.einsum("bihd,bjhd->bhij", q, kh) * scale           # [B, Hq, Tq, Tk]

    # c in float64 whatever the scores' dtype, as in every other backend: a bf16 cumsum (bf16 inputs, or fp32 ones
    # under autocast, the portable op's training path) stepped by its rounding, not by the gates (-0.5 gates over 2K
    # tokens: c near -1000, where bf16 steps by 8), and the output was off by O(1)
    lf = log_fgate.transpose(1, 2).double()                             # [B, Hq, Tk]
    cut = torch.isneginf(lf)
    # A -inf gate at l separates i from j exactly when it lies in (j, i]: compare -inf counts.
    n_cuts = torch.cumsum(cut.to(torch.int64), dim=-1)
    c = torch.cumsum(torch.where(cut, torch.zeros_like(lf), lf), dim=-1)
    pos = torch.arange(Tk - Tq, Tk, device=q.device)
    keys = torch.arange(Tk, device=q.device)
    bias = (c[..., pos, None] - c[..., None, :]).to(logits.dtype)
    visible = (keys[None, :] <= pos[:, None]) & (n_cuts[..., pos, None] == n_cuts[..., None, :])
    scores = torch.where(visible, logits + bias, torch.full_like(bias, float("-inf")))

    lse = torch.logsumexp(scores, dim=-1)                                 # [B, Hq, Tq]
    probs = torch.exp(scores - lse[..., None])
    out = torch.einsum("bhij,bjhd->bihd", probs, vh).to(q.dtype)
    if return_lse:
        lse_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
        return out, lse.to(lse_dtype)
    return out


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _row_step(batch_heads: int, keys: int) -> int:
    return max(16, min(CHUNK_ROWS, _CHUNK_ELEMENTS // max(1, batch_heads * keys)))


def _exp_(s: torch.Tensor) -> torch.Tensor:
    """s.exp_() for scores already shifted by their row's maximum (or lse); float32 arguments below _EXP_FLOOR,
    -inf included, give exactly 0."""
    if s.dtype != torch.float32:
        return s.exp_()
    flushed = s < _EXP_FLOOR
    return s.clamp_(min=_EXP_FLOOR).exp_().masked_fill_(flushed, 0.0)


def _heads_first(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[B, T, H, D] -> [B, H, T, D] in the compute dtype."""
    return x.transpose(1, 2).to(dtype)


def _split(x: torch.Tensor):
    """float64 -> fp32 hi + fp32 lo with hi + lo == x to ~48 bits."""
    hi = x.float()
    return hi, (x - hi.double()).float()


def _tile_bias(c, diag: slice, dtype):
    """c_i - c_j for i, j in ``diag`` (a chunk's diagonal block of positions) as [..., R, R] in ``dtype``, exact to
    fp32 rounding of the result.

    In fp32 the outer difference is formed from hi/lo parts relative to the block's first position:
    hi differences of nearby values are exact and lo restores what rounding c to fp32 dropped,
    so no float64 [R, R] temporary is needed (as in the kernels).
    """
    if dtype == torch.float64:
        return c[..., diag, None] - c[..., None, diag]
    hi, lo = _split(c[..., diag] - c[..., diag.start:diag.start + 1])
    return (hi[..., :, None] - hi[..., None, :]).add_(lo[..., :, None] - lo[..., None, :])


def _first_kept_key(c, prune_delta, p0):
    """First key that some row of a chunk starting at position p0 may not skip (0 without pruning).

    c: [B, Hkv, G, Tk] float64; prune_delta: [B, Hkv, G] or None. Every key j before the result has
    c[p0] - c[j] <= delta in every head, hence so has every pair (row >= p0, j) of the chunk.
    """
    if prune_delta is None or p0 == 0:
        return 0
    skippable = (c[..., p0, None] - c[..., :p0]) <= prune_delta[..., None]
    return int(skippable.sum(-1).min())  # c never increases: the skippable keys are a prefix


def _tile_scores(qg, kh, c, rows, Tq, Tk, prune_delta=None):
    """Scores of query rows ``rows`` (a slice) against the keys they may see, less a row term off the diagonal.

    qg: [B, Hkv, G, Tq, D] (already multiplied by the softmax scale); kh: [B, Hkv, Tk, D]; c: [B, Hkv, G, Tk]
    float64. Returns (scores [B, Hkv, G, R, K], keys: the slice of K keys scored, row [B, Hkv, G, R, 1]).

    Only the last R keys (the chunk's diagonal block, from its first row's own key on) get the whole bias
    c_i - c_j (``_tile_bias``). The keys before hold t_ij = q_i . k_j * scale - (c_j - r), r = c of the chunk's
    first row, and the score is t_ij + row_i with row_i = c_i - r: the row term is a constant of each row, which
    softmax takes through its maximum or lse (``_shift_rows_``) instead of an add per score. That saves the CPU
    three passes over [R, K] (the outer differences of the hi and lo parts and their sum) and loses nothing: c
    never increases, so c_j - r >= 0 >= c_i - r there and neither part exceeds the |c_i - c_j| that the whole
    bias would be rounded at (the Gluon forward folds its unmasked tiles the same way).
    """
    p0, n_keys = Tk - Tq + rows.start, Tk - Tq + rows.stop  # host ints: no device sync
    keys = slice(_first_kept_key(c, prune_delta, p0), n_keys)
    s = torch.matmul(qg[..., rows, :], kh[:, :, None, keys].transpose(-1, -2))
    R = rows.stop - rows.start
    ref = c[..., p0:p0 + 1]
    row = (c[..., p0:n_keys] - ref).to(s.dtype)[..., None]
    if keys.start < p0:
        s[..., :s.shape[-1] - R].sub_((c[..., keys.start:p0] - ref).to(s.dtype)[..., None, :])
    diag = s[..., s.shape[-1] - R:]
    diag.add_(_tile_bias(c, slice(p0, n_keys), s.dtype))
    # key p0 + j is hidden from row i when j > i: only the diagonal block holds such pairs
    diag.masked_fill_(torch.ones(R, R, dtype=torch.bool, device=qg.device).triu_(1), float("-inf"))
    return s, keys, row


def _shift_rows_(s, row, shift):
    """s -= shift in place, in the frame ``_tile_scores`` left each part in: the keys before the diagonal block
    are short of their row term. shift: [..., R, 1] (a row's maximum or lse)."""
    R = row.shape[-2]
    s[..., :s.shape[-1] - R].sub_(shift - row)
    s[..., s.shape[-1] - R:].sub_(shift)
    return s


def _row_max(s, row):
    """Each row's largest whole score [..., R, 1]: the diagonal block's and, before it, t + row."""
    R = row.shape[-2]
    m = s[..., s.shape[-1] - R:].amax(dim=-1, keepdim=True)
    if s.shape[-1] > R:
        m = torch.maximum(m, s[..., :s.shape[-1] - R].amax(dim=-1, keepdim=True) + row)
    return m


def _dense_forward(q, k, v, c, scale, prune_delta=None):
    B, Tq, Hq, D = q.shape
    Tk, Hkv = k.shape[1], k.shape[2]
    group = Hq // Hkv
    cd = _compute_dtype(q.dtype)
    # the scale on q once, not on every chunk's scores (a pass over [R, K] each)
    qg = (_heads_first(q, cd) * scale).reshape(B, Hkv, group, Tq, D)
    kh, vh = _heads_first(k, cd), _heads_first(v, cd)
    cg = c.reshape(B, Hkv, group, Tk)
    out = torch.empty(B, Hkv, group, Tq, D, dtype=cd, device=q.device)
    lse = torch.empty(B, Hkv, group, Tq, dtype=cd, device=q.device)
    pd = None if prune_delta is None else prune_delta.reshape(B, Hkv, group)
    step = _row_step(B * Hq, Tk)
    for start in range(0, Tq, step):
        rows = slice(start, min(Tq, start + step))
        s, keys, row = _tile_scores(qg, kh, cg, rows, Tq, Tk, pd)
        # one exp per score: every row sees its diagonal key, so the row max is finite
        row_max = _row_max(s, row)
        p = _exp_(_shift_rows_(s, row, row_max))
        row_sum = p.sum(dim=-1, keepdim=True)
        lse[..., rows] = (row_max + row_sum.log()).squeeze(-1)
        out[..., rows, :] = torch.matmul(p, vh[:, :, None, keys]).div_(row_sum)
    out = out.reshape(B, Hq, Tq, D).transpose(1, 2).to(q.dtype)
    return out, lse.reshape(B, Hq, Tq)


def _dense_backward(do, q, k, v, c, out, lse, scale, dlse, prune_delta=None):
    B, Tq, Hq, D = q.shape
    Tk, Hkv = k.shape[1], k.shape[2]
    group = Hq // Hkv
    cd = _compute_dtype(q.dtype)
    qg = (_heads_first(q, cd) * scale).reshape(B, Hkv, group, Tq, D)  # as in _dense_forward
    dog = _heads_first(do, cd).reshape(B, Hkv, group, Tq, D)
    kh, vh = _heads_first(k, cd), _heads_first(v, cd)
    cg = c.reshape(B, Hkv, group, Tk)
    lse_g = lse.to(cd).reshape(B, Hkv, group, Tq)
    delta = (dog * _heads_first(out, cd).reshape(B, Hkv, group, Tq, D)).sum(-1)
    if dlse is not None:
        # d lse_i / d s_ij = p_ij: the lse gradient enters dS exactly like a shift of delta.
        delta = delta - dlse.to(cd).reshape(B, Hkv, group, Tq)
    dq = torch.zeros_like(qg)
    dk = torch.zeros(B, Hkv, group, Tk, D, dtype=cd, device=q.device)
    dv = torch.zeros_like(dk)
    dc = torch.zeros(B, Hkv, group, Tk, dtype=cd, device=q.device)
    pd = None if prune_delta is None else prune_delta.reshape(B, Hkv, group)
    step = _row_step(B * Hq, Tk)
    for start in range(0, Tq, step):
        rows = slice(start, min(Tq, start + step))
        s, keys, row = _tile_scores(qg, kh, cg, rows, Tq, Tk, pd)
        p = _exp_(_shift_rows_(s, row, lse_g[..., rows, None]))
        dp = torch.matmul(dog[..., rows, :], vh[:, :, None, keys].transpose(-1, -2))
        ds = p * (dp - delta[..., rows, None])
        dq[..., rows, :] = torch.matmul(ds, kh[:, :, None, keys]) * scale
        dk[..., keys, :] += torch.matmul(ds.transpose(-1, -2), qg[..., rows, :])  # qg holds the scale
        dv[..., keys, :] += torch.matmul(p.transpose(-1, -2), dog[..., rows, :])
        # dc_t = (row sum of dS, t as a query) - (column sum of dS, t as a key); both from the
        # same dS so that rounding in delta cannot leak into the reverse cumsum of dc.
        dc[..., Tk - Tq + rows.start:Tk - Tq + rows.stop] += ds.sum(-1)
        dc[..., keys] -= ds.sum(-2)
    dq = dq.reshape(B, Hq, Tq, D).transpose(1, 2).to(q.dtype)
    dk = dk.sum(2).transpose(1, 2).to(k.dtype)
    dv = dv.sum(2).transpose(1, 2).to(v.dtype)
    return dq, dk, dv, dc.reshape(B, Hq, Tk)


def _kv_head_slices(B, Hq, Hkv):
    """(batch slice, query-head slice, kv-head slice) of every (batch, kv head) pair."""
    G = Hq // Hkv
    for b in range(B):
        for h in range(Hkv):
            yield slice(b, b + 1), slice(h * G, (h + 1) * G), slice(h, h + 1)


def _pruned_forward(q, k, v, c, scale, prune_delta):
    """Pruning skips the keys every row of a chunk and every head of the matmul may skip, so it
    runs one (batch, kv head) at a time: one slowly decaying head cannot hold the others back."""
    B, Tq, Hq, D = q.shape
    out = torch.empty_like(q)
    lse = torch.empty(B, Hq, Tq, dtype=_compute_dtype(q.dtype), device=q.device)
    for bs, hs, ks in _kv_head_slices(B, Hq, k.shape[2]):
        out[bs, :, hs], lse[bs, hs] = _dense_forward(q[bs, :, hs], k[bs, :, ks], v[bs, :, ks],
                                                     c[bs, hs], scale, prune_delta[bs, hs])
    return out, lse


def _pruned_backward(do, q, k, v, c, out, lse, scale, dlse, prune_delta):
    B, Tq, Hq, D = q.shape
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    dc = torch.empty(c.shape, dtype=_compute_dtype(q.dtype), device=q.device)
    for bs, hs, ks in _kv_head_slices(B, Hq, k.shape[2]):
        dq[bs, :, hs], dk[bs, :, ks], dv[bs, :, ks], dc[bs, hs] = _dense_backward(
            do[bs, :, hs], q[bs, :, hs], k[bs, :, ks], v[bs, :, ks], c[bs, hs], out[bs, :, hs],
            lse[bs, hs], scale, None if dlse is None else dlse[bs, hs], prune_delta[bs, hs])
    return dq, dk, dv, dc


def torch_forward(q, k, v, c, scale, cu_seqlens=None, max_seqlen=None, prune_delta=None):
    """Chunked exact forward. Contract as ``fwd.triton_forward``.

    q [B, Tq, Hq, D]; k, v [B, Tk, Hkv, D]; c float64 [B, Hq, Tk]; prune_delta: optional float64
    [B, Hq] threshold: each query chunk skips the keys every one of its pairs may skip.
    Returns out [B, Tq, Hq, D] (q's dtype) and lse [B, Hq, Tq] (fp32; fp64 for fp64 inputs).
    """
    del max_seqlen
    dense = _dense_forward if prune_delta is None else _pruned_forward
    parts = [
        dense(q[:, s:e], k[:, s:e], v[:, s:e], c[..., s:e], scale, prune_delta)
        for s, e in _segments(cu_seqlens, k.shape[1])
    ]
    out = torch.cat([o for o, _ in parts], dim=1)
    lse = torch.cat([l for _, l in parts], dim=2)
    return out, lse.to(_compute_dtype(q.dtype))


def torch_backward(do, q, k, v, c, out, lse, scale, cu_seqlens=None, max_seqlen=None, dlse=None,
                   prune_delta=None):
    """Chunked exact backward (recomputes the scores). Returns dq, dk, dv, dc [B, Hq, Tk].
    prune_delta as in ``torch_forward`` (the same chunks skip the same keys)."""
    del max_seqlen
    dense = _dense_backward if prune_delta is None else _pruned_backward
    grads = [
        dense(do[:, s:e], q[:, s:e], k[:, s:e], v[:, s:e], c[..., s:e], out[:, s:e],
                        lse[..., s:e], scale, None if dlse is None else dlse[..., s:e], prune_delta)
        for s, e in _segments(cu_seqlens, k.shape[1])
    ]
    return tuple(torch.cat([g[i] for g in grads], dim=2 if i == 3 else 1) for i in range(4))
