"""Exact references for gated linear attention: one memory-hungry, one slow, both on purpose.

* ``naive_gated_linear_attention`` materialises the ``[T, T]`` decay matrix ``exp(c_i - c_j)`` and
  treats ``log f = -inf`` exactly (cut counting, no floor). The reference the tests trust.
* ``recurrent_gated_linear_attention`` runs the recurrence ``S_t = f_t S_{t-1} + k_t v_t^T`` token by
  token: the definition itself, and what decoding does one step at a time.
"""
from __future__ import annotations

import torch

from .checks import check_inputs


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """fp32 accumulation; fp64 inputs stay fp64 (exact test references)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def heads_first(x: torch.Tensor, group: int, dtype: torch.dtype) -> torch.Tensor:
    """[B, T, H, D] -> [B, H * group, T, D] in ``dtype``, each head repeated ``group`` times (GQA)."""
    x = x.transpose(1, 2).to(dtype)
    return x.repeat_interleave(group, dim=1) if group > 1 else x


def _prepare(q, k, v, log_fgate, initial_state):
    """Heads-first q, k, v [B, H, T, D] (GQA expanded), log f [B, H, T] and S_0 [B, H, Dk, Dv], all in the
    compute dtype."""
    cd = compute_dtype(q.dtype)
    B, _, Hq, Dk = q.shape
    group = Hq // k.shape[2]
    qh, kh, vh = heads_first(q, 1, cd), heads_first(k, group, cd), heads_first(v, group, cd)
    lf = log_fgate.transpose(1, 2).to(cd)
    state = (initial_state.to(cd) if initial_state is not None
             else q.new_zeros(B, Hq, Dk, v.shape[-1], dtype=cd))
    return qh, kh, vh, lf, state


def naive_gated_linear_attention(q, k, v, log_fgate, *, initial_state=None, return_final_state=False,
                                 chunk_size=64):
    """``o_i = sum_{j <= i} exp(c_i - c_j) (q_i . k_j) v_j + exp(c_i) S_0^T q_i`` with the full decay matrix.

    Same arguments and outputs as ``gated_linear_attention`` (``chunk_size`` is checked, then unused).
    Memory O(T^2) per head: tests and small inputs only.
    """
    check_inputs(q, k, v, log_fgate, initial_state, return_final_state, chunk_size)
    qh, kh, vh, lf, state = _prepare(q, k, v, log_fgate, initial_state)
    T = q.shape[1]
    cut = torch.isneginf(lf)
    # A -inf gate at l separates i from j exactly when it lies in (j, i]: compare the cut counts.
    n_cuts = torch.cumsum(cut.to(torch.int64), dim=-1)
    c = torch.cumsum(torch.where(cut, torch.zeros_like(lf), lf), dim=-1)
    causal = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    visible = causal & (n_cuts[..., :, None] == n_cuts[..., None, :])
    # -inf before exp, not a mask after it: exp of the positive c_i - c_j above the diagonal overflows.
    decay = torch.where(visible, c[..., :, None] - c[..., None, :], float("-inf")).exp()
    from_start = torch.where(n_cuts == 0, c, float("-inf")).exp()                   # weight of S_0, [B, H, T]
    out = torch.matmul(torch.matmul(qh, kh.transpose(-1, -2)) * decay, vh)
    out = out + from_start[..., None] * torch.matmul(qh, state)
    out = out.transpose(1, 2).to(q.dtype)
    if not return_final_state:
        return out
    final = from_start[..., -1, None, None] * state + torch.matmul((kh * decay[..., -1, :, None]).transpose(-1, -2), vh)
    return out, final


def recurrent_gated_linear_attention(q, k, v, log_fgate, *, initial_state=None, return_final_state=False,
                                     chunk_size=64):
    """The recurrence ``S_t = f_t S_{t-1} + k_t v_t^T``, ``o_t = S_t^T q_t``, one token at a time.

    Same arguments and outputs as ``gated_linear_attention`` (``chunk_size`` is checked, then unused).
    """
    check_inputs(q, k, v, log_fgate, initial_state, return_final_state, chunk_size)
    qh, kh, vh, lf, state = _prepare(q, k, v, log_fgate, initial_state)
    f = lf.exp()  # -inf gives exactly 0
    outs = []
    for t in range(q.shape[1]):
        state = f[:, :, t, None, None] * state + kh[:, :, t, :, None] * vh[:, :, t, None, :]
        outs.append(torch.matmul(qh[:, :, t, None, :], state)[:, :, 0])
    out = torch.stack(outs, dim=1).to(q.dtype)
    return (out, state) if return_final_state else out
