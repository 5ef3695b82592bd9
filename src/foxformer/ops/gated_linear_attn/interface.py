"""The public gated linear attention: the chunked form, in plain PyTorch (autograd gives the backward).

Per head, with ``c_t = sum_{l <= t} log f_l``, the recurrence ``S_t = f_t S_{t-1} + k_t v_t^T``,
``o_t = S_t^T q_t`` unrolls to ``o_i = sum_{j <= i} exp(c_i - c_j) (q_i . k_j) v_j``. Split T into
chunks of C tokens and let ``b`` be c relative to the end of the previous chunk (a cumsum inside the
chunk, so ``b <= 0`` and non-increasing). For token i of a chunk that starts with state S:

    o_i   = sum_{j <= i in chunk} exp(b_i - b_j) (q_i . k_j) v_j  +  exp(b_i) S^T q_i
    S_new = exp(b_C) S  +  sum_{j in chunk} exp(b_C - b_j) k_j v_j^T

Every exponent is <= 0, so nothing overflows whatever |c| reaches (1e4 and beyond at 64K tokens):
exp(c_i) or exp(-c_j) on their own are never formed. Only the chunk scan is sequential (T / C small
steps on [B, H, Dk, Dv] states).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..forgetting_attn.cumsum import LOG_FGATE_FLOOR
from .checks import check_inputs
from .reference import compute_dtype, heads_first

# Tokens per chunk unless the caller picks another (the models keep it; their FLOP count reads it).
CHUNK_SIZE = 64

def _to_chunks(x: torch.Tensor, T_pad: int, C: int) -> torch.Tensor:
    """[B, H, T, D] -> [B, H, N, C, D], zero-padded at the end of T."""
    x = F.pad(x, (0, 0, 0, T_pad - x.shape[2]))
    return x.view(*x.shape[:2], T_pad // C, C, x.shape[-1])


def gated_linear_attention(q, k, v, log_fgate, *, initial_state=None, return_final_state=False,
                           chunk_size=CHUNK_SIZE):
    """Causal linear attention with a scalar forget gate per head and token (Mamba-2 / SSD form).

    ``o_i = sum_{j <= i} exp(c_i - c_j) (q_i . k_j) v_j + exp(c_i) S_0^T q_i``, ``c = cumsum(log_fgate)``:
    Forgetting Attention without the softmax (and without any scale: scale q yourself).

    Args:
        q: ``[B, T, Hq, Dk]``.
        k: ``[B, T, Hkv, Dk]``; v: ``[B, T, Hkv, Dv]``. ``Hq`` must be a multiple of ``Hkv`` (GQA: each
            k / v head serves ``Hq / Hkv`` consecutive query heads).
        log_fgate: ``[B, T, Hq]``, ``<= 0``; ``-inf`` (f = 0) clears the state before that token.
        initial_state: ``[B, Hq, Dk, Dv]`` state before the first token (None: zeros).
        return_final_state: also return the state after the last token.
        chunk_size: tokens per chunk: O(T * C * D) work inside chunks, T / C sequential steps between them.

    Returns:
        ``out`` ``[B, T, Hq, Dv]`` in q's dtype, or ``(out, state)`` with ``state`` ``[B, Hq, Dk, Dv]``
        in fp32 (fp64 for fp64 inputs). Accumulation is fp32 (fp64 for fp64 inputs); the decay exponents
        are formed in fp64. Differentiable in q, k, v, log_fgate and initial_state.
    """
    check_inputs(q, k, v, log_fgate, initial_state, return_final_state, chunk_size)
    B, T, Hq, Dk = q.shape
    group = Hq // k.shape[2]
    cd = compute_dtype(q.dtype)
    # not min(): under torch.compile's dynamic shapes a symbolic min() left the chunk views' strides undecidable
    # and the compiled train step failed ("view size is not compatible"); the branch guards on T instead
    C = chunk_size if T >= chunk_size else T
    T_pad = -(-T // C) * C
    # Zero padding at the end is inert: k = 0 adds nothing to the state and log f = 0 does not decay it.
    qc = _to_chunks(heads_first(q, 1, cd), T_pad, C)
    kc = _to_chunks(heads_first(k, group, cd), T_pad, C)
    vc = _to_chunks(heads_first(v, group, cd), T_pad, C)
    # fp64 keeps b_i - b_j exact next to a floored (-1e4) gate; the floor itself gives exp(...) == 0.
    lf = log_fgate.transpose(1, 2).double().clamp(min=LOG_FGATE_FLOOR)
    b = F.pad(lf, (0, T_pad - T)).view(B, Hq, T_pad // C, C).cumsum(-1)           # [B, H, N, C]
    b_end = b[..., -1:]
    causal = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()
    decay = (b[..., :, None] - b[..., None, :]).masked_fill(~causal, float("-inf")).to(cd).exp()
    out = torch.matmul(torch.matmul(qc, kc.transpose(-1, -2)) * decay, vc)         # [B, H, N, C, Dv]
    # Each chunk's own contribution to the state at its end, and the decay of the state across it.
    k_to_end = kc * (b_end - b).to(cd).exp()[..., None]
    local = torch.matmul(k_to_end.transpose(-1, -2), vc)                          # [B, H, N, Dk, Dv]
    across = b_end[..., 0].to(cd).exp()                                            # [B, H, N]
    state = initial_state.to(cd) if initial_state is not None else q.new_zeros(B, Hq, Dk, v.shape[-1], dtype=cd)
    starts = []
    for n in range(T_pad // C):
        starts.append(state)
        state = across[:, :, n, None, None] * state + local[:, :, n]
    q_from_start = qc * b.to(cd).exp()[..., None]
    out = out + torch.matmul(q_from_start, torch.stack(starts, dim=2))
    out = out.reshape(B, Hq, T_pad, v.shape[-1])[:, :, :T].transpose(1, 2).to(q.dtype)
    return (out, state) if return_final_state else out
