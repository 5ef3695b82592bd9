"""The attention ops the models call, in plain PyTorch and without Triton: what a standalone Hugging Face export
runs where foxformer is not installed (foxformer.models.standalone substitutes this module for foxformer.ops and
for the decode module there).

Every op runs in PyTorch whatever backend a call names: prefill and other gradient-free calls take the chunked
torch forward of the kernels' reference, calls that need a gradient the materialised reference (autograd through
it), and the decode ops a dense masked softmax over the cache (a few queries). prune_eps and qk_bound are checked as
foxformer.ops.forgetting_attention checks them; the chunked forward prunes as the torch backend does, and the
materialised reference computes every tile (exact, so within any prune_eps, as that op's backend="naive").
"""
from __future__ import annotations

import torch

from .forgetting_attn.checks import check_inputs, check_softmax_scale
from .forgetting_attn.cumsum import LOG_FGATE_FLOOR, gate_cumsum, gate_cumsum_heads_first
from .forgetting_attn.decode_checks import check_decode
from .forgetting_attn.paging import append_token_torch, evict_scan_torch, gather_live
from .forgetting_attn.reference import naive_unchecked, no_queries, torch_forward
from .forgetting_attn.threshold import check_pruning, prune_delta
from .gated_linear_attn.interface import gated_linear_attention
from .gated_linear_attn.reference import naive_gated_linear_attention
from .pro_block.checks import check_gate_norm, check_shift_norm
from .pro_block.reference import gate_norm_reference, shift_norm_reference

# This decode op reads seq_len on the host: CUDA graphs cannot replay it (models/kvcache/graphs.py checks).
READS_LENGTH_ON_DEVICE = False

__all__ = ["LOG_FGATE_FLOOR", "READS_LENGTH_ON_DEVICE", "append_token_", "evict_scan_", "forgetting_attention",
           "forgetting_attention_cumsum", "forgetting_attention_decode", "gate_cumsum", "gate_norm",
           "gated_linear_attention", "naive_gated_linear_attention", "resolve_backend", "shift_norm"]


def resolve_backend(backend: str, q: torch.Tensor) -> str:
    """Every op here runs in PyTorch whatever backend a call names (the Gluon and Triton kernels are not in the
    copy), so none is refused."""
    return "torch"


def _needs_grad(*tensors: torch.Tensor) -> bool:
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def _chunked(q, k, v, c_t, scale, cu_seqlens, max_seqlen, return_lse, prune_eps, qk_bound):
    """The chunked torch forward, pruned as forgetting_attention's torch backend prunes (c_t float64 [B, Hq, Tk])."""
    delta = None
    if prune_eps is not None:
        n_keys = max_seqlen if cu_seqlens is not None else k.shape[1]
        delta = prune_delta(q, k, prune_eps, qk_bound, scale, n_keys)
    out, lse = torch_forward(q, k, v, c_t, scale, cu_seqlens, max_seqlen, prune_delta=delta)
    return (out, lse) if return_lse else out


def forgetting_attention(q, k, v, log_fgate, *, softmax_scale=None, cu_seqlens=None, max_seqlen=None,
                         return_lse=False, backend="auto", prune_eps=None, qk_bound=None):
    """foxformer.ops.forgetting_attention on any device (pruned only without a gradient); its input checks."""
    scale, max_seqlen = check_inputs(q, k, v, log_fgate, "log_fgate", softmax_scale, cu_seqlens, max_seqlen,
                                     return_lse)
    check_pruning(prune_eps, qk_bound, q.shape[0], q.shape[2], q.device)
    if q.shape[1] == 0:
        return no_queries(q, k, v, log_fgate, return_lse)
    if _needs_grad(q, k, v, log_fgate):
        return naive_unchecked(q, k, v, log_fgate, scale, cu_seqlens, return_lse)
    return _chunked(q, k, v, gate_cumsum_heads_first(log_fgate), scale, cu_seqlens, max_seqlen, return_lse,
                    prune_eps, qk_bound)


def forgetting_attention_cumsum(q, k, v, c, *, softmax_scale=None, cu_seqlens=None, max_seqlen=None,
                                return_lse=False, backend="auto", prune_eps=None, qk_bound=None):
    """foxformer.ops.forgetting_attention_cumsum (forward only: caches run without gradients); its input checks."""
    scale, max_seqlen = check_inputs(q, k, v, c, "c", softmax_scale, cu_seqlens, max_seqlen, return_lse)
    check_pruning(prune_eps, qk_bound, q.shape[0], q.shape[2], q.device)
    if q.shape[1] == 0:
        return no_queries(q, k, v, c, return_lse)
    return _chunked(q, k, v, c.transpose(1, 2).double().contiguous(), scale, cu_seqlens, max_seqlen, return_lse,
                    prune_eps, qk_bound)


def forgetting_attention_decode(q, k, v, c, start=None, *, page_table=None, seq_len=None, softmax_scale=None,
                                backend="auto", num_splits=None):
    """The last Tq of ``seq_len`` positions against a cache: q [B, Tq, Hq, D]; k, v [B, Tk, Hkv, D] and c float64
    [B, Tk, Hq], or with ``page_table`` [B, Hkv, pages] the page pools [P, PAGE, D] and [P, PAGE, G]; start int
    [B, Hkv] first live key of each kv head (None: 0); seq_len an int or a one-element tensor (None: Tk). The inputs are
    checked as forgetting_attention_decode checks them (a c of another dtype than float64 is a TypeError)."""
    check_decode(q, k, v, c, start, page_table, seq_len)
    if page_table is not None or seq_len is not None:
        n = k.shape[1] if seq_len is None else int(seq_len)
        if page_table is None:
            k, v, c = k[:, :n], v[:, :n], c[:, :n]
        else:
            if start is None:
                start = page_table.new_zeros(page_table.shape[:2], dtype=torch.int64)
            k, v, c, _ = gather_live(k, v, c, page_table, 0, n, start)
    B, Tq, Hq, _ = q.shape
    Tk, Hkv = k.shape[1], k.shape[2]
    calc = torch.float64 if q.dtype == torch.float64 else torch.float32
    group = Hq // Hkv
    kk = k.to(calc).repeat_interleave(group, dim=2)
    vv = v.to(calc).repeat_interleave(group, dim=2)
    scores = torch.einsum("bthd,bjhd->bhtj", q.to(calc), kk) * check_softmax_scale(softmax_scale, q.shape[-1])
    c = c.double()
    bias = c[:, Tk - Tq:].transpose(1, 2)[..., None] - c.transpose(1, 2)[:, :, None, :]     # [B, Hq, Tq, Tk]
    keys = torch.arange(Tk, device=q.device)
    hidden = keys[None, :] > torch.arange(Tk - Tq, Tk, device=q.device)[:, None]             # future keys
    hidden = hidden.expand(B, Hq, Tq, Tk)
    if start is not None:
        first = start.to(q.device).repeat_interleave(group, dim=1)                           # [B, Hq]
        hidden = hidden | (keys < first[:, :, None, None])
    scores = (scores + bias.to(calc)).masked_fill(hidden, float("-inf"))
    out = torch.einsum("bhtj,bjhd->bthd", torch.softmax(scores, dim=-1), vv)
    return out.to(q.dtype)


def append_token_(k_buf, v_buf, c_buf, c_last, at, k, v, log_f, k_shift=None, v_shift=None, *, page_table=None,
                  backend="auto"):
    """foxformer.ops.forgetting_attn.append.append_token_, as separate torch ops."""
    append_token_torch(k_buf, v_buf, c_buf, c_last, at, k, v, log_f, k_shift, v_shift, page_table)


def evict_scan_(start, c_pages, table, c_last, delta, window, last, backend="auto"):
    """foxformer.ops.forgetting_attn.evict_scan.evict_scan_, as separate torch ops."""
    evict_scan_torch(start, c_pages, table, c_last, delta, window, last)


def shift_norm(x, logits=None, prev=None, starts=None, weight=None, eps=1e-6, *, backend="auto"):
    """foxformer.ops.shift_norm, exact (its reference) on any device; its input checks."""
    check_shift_norm(x, logits, prev, starts, weight, eps)
    return shift_norm_reference(x, logits, prev, starts, weight, eps)


def gate_norm(o, g, weight, eps=1e-6, *, backend="auto"):
    """foxformer.ops.gate_norm, exact (its reference) on any device; its input checks."""
    check_gate_norm(o, g, weight, eps)
    return gate_norm_reference(o, g, weight, eps)
