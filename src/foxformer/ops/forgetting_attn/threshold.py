"""Pruning's threshold, without Triton: tile pruning (pruning.py) and KV-cache eviction (models/kvcache/policy.py)
both call it, and a standalone export (models/standalone.py) carries it, so the portable ops prune by the same
rules and refuse the same arguments as forgetting_attention."""
from __future__ import annotations

import math

import torch

from .checks import values_checked

# The kernels compute |q . k| in fp32 from rounded inputs; a tiny relative margin on U keeps "auto"
# an upper bound of what they actually compute.
_AUTO_MARGIN = 1.0 + 1e-4


def pruning_threshold(eps: float, qk_bound, n_keys: int):
    """delta = log(eps) - 2U - log(N): a key j with c[p_i] - c[j] <= delta carries at most eps / N of row i.

    The one formula behind tile pruning (``prune_delta``) and KV-cache eviction (with N the longest sequence the
    cache will hold). qk_bound U: a float or a float64 tensor (the result follows).
    """
    return math.log(float(eps)) - math.log(max(int(n_keys), 1)) - 2.0 * qk_bound


def check_pruning(prune_eps, qk_bound, B: int, Hq: int, device: torch.device) -> None:
    """Validate prune_eps / qk_bound (ValueError / TypeError naming the argument)."""
    if prune_eps is None:
        if qk_bound is not None:
            # ignored without a word: a caller who took the bound for the switch got no pruning and no hint
            shown = (f"a tensor of shape {tuple(qk_bound.shape)}" if isinstance(qk_bound, torch.Tensor)
                     else repr(qk_bound))
            raise ValueError(f"qk_bound ({shown}) was given without prune_eps: qk_bound is the bound U on "
                             f"|softmax_scale * q . k| that tile pruning's threshold uses, and it only applies with "
                             f"prune_eps, which turns pruning on; pass prune_eps as well, or leave qk_bound None")
        return
    if isinstance(prune_eps, bool) or not isinstance(prune_eps, (int, float)):
        raise TypeError(f"prune_eps must be a float in (0, 1) or None, got {type(prune_eps).__name__}")
    if not 0.0 < float(prune_eps) < 1.0:
        raise ValueError(f"prune_eps must be in (0, 1), got {prune_eps!r}")
    if qk_bound is None or (isinstance(qk_bound, str) and qk_bound == "auto"):
        return
    if isinstance(qk_bound, str):
        raise ValueError(f"qk_bound must be 'auto', a float >= 0 or a tensor, got {qk_bound!r}")
    if isinstance(qk_bound, torch.Tensor):
        try:
            # broadcast_shapes also accepts shapes that would grow [B, Hq] (e.g. [3, 1, Hq] or, with
            # B = 1, [2, 1]); prune_delta then failed in broadcast_to with a bare RuntimeError
            fits = torch.broadcast_shapes(qk_bound.shape, (B, Hq)) == (B, Hq)
        except RuntimeError:
            fits = False
        if not fits:
            raise ValueError(f"qk_bound must broadcast to [B, Hq] = {(B, Hq)}, got shape {tuple(qk_bound.shape)}")
        if qk_bound.device != device:
            raise ValueError(f"qk_bound must be on {device}, got {qk_bound.device}")
        if not (qk_bound.is_floating_point() or qk_bound.dtype in (torch.int32, torch.int64)):
            raise TypeError(f"qk_bound must be a real tensor, got {qk_bound.dtype}")
        # a value check costs a sync on CUDA: the policy of every value check (checks.values_checked)
        if torch.compiler.is_compiling() or not values_checked(qk_bound):
            return
        if not (torch.isfinite(qk_bound).all() and (qk_bound >= 0).all()):
            raise ValueError("qk_bound must be finite and >= 0")
        return
    if isinstance(qk_bound, bool) or not isinstance(qk_bound, (int, float)):
        raise TypeError(f"qk_bound must be 'auto', a float or a tensor, got {type(qk_bound).__name__}")
    # a comparison, not math.isfinite: under torch.compile a float that varies between calls is a
    # SymFloat, which math.isfinite cannot trace (NaN fails the comparison too)
    if not 0 <= qk_bound < math.inf:
        raise ValueError(f"qk_bound must be finite and >= 0, got {qk_bound!r}")


def max_row_norms(x: torch.Tensor) -> torch.Tensor:
    """max_t ||x[b, t, h]|| per (batch, head), float64 [B, H], in plain torch.

    Norms in the inputs' own dtype: reductions accumulate half types in fp32 anyway, and asking for
    dtype=float32 made torch copy x to fp32 first. The rounding of each norm to the input dtype
    (at most one unit roundoff) is covered by auto_qk_bound's rounding factor.
    """
    return torch.linalg.vector_norm(x, dim=-1).amax(dim=1).double()


def auto_qk_bound(q: torch.Tensor, k: torch.Tensor, scale: float, row_norms=max_row_norms) -> torch.Tensor:
    """U = scale * max_i ||q_i|| * max_j ||k_j|| per (batch, query head): float64 [B, Hq].

    q [B, Tq, Hq, D], k [B, Tk, Hkv, D]; ``row_norms``: the max row norms of a [B, T, H, D] tensor as
    ``max_row_norms`` gives them (pruning.py passes its Triton pass on CUDA).
    """
    Hq, Hkv = q.shape[2], k.shape[2]
    q_max = row_norms(q)                                       # [B, Hq]
    k_max = row_norms(k).repeat_interleave(Hq // Hkv, dim=1)   # [B, Hkv] -> [B, Hq]
    rounding = (1.0 + torch.finfo(q.dtype).eps) * (1.0 + torch.finfo(k.dtype).eps)
    return (q_max * k_max) * (abs(scale) * _AUTO_MARGIN * rounding)


def prune_delta(q: torch.Tensor, k: torch.Tensor, prune_eps: float, qk_bound, scale: float,
                n_keys: int, row_norms=max_row_norms) -> torch.Tensor:
    """The skip threshold delta = log(eps) - 2U - log(N), float64 [B, Hq] (contiguous).

    qk_bound: None or "auto" (from the norms of q and k, by ``row_norms``), a float, or a tensor broadcastable
    to [B, Hq]. A given bound is trusted: if some |scale * q . k| exceeds it, more than eps can be pruned from
    a row (the caller's contract). n_keys: keys a row can see at most (Tk, or the longest packed sequence).
    """
    B, Hq = q.shape[0], q.shape[2]
    if qk_bound is None or isinstance(qk_bound, str):
        u = auto_qk_bound(q, k, scale, row_norms)
    elif isinstance(qk_bound, torch.Tensor):
        u = qk_bound.to(device=q.device, dtype=torch.float64)
    else:
        u = torch.full((B, Hq), float(qk_bound), dtype=torch.float64, device=q.device)
    return torch.broadcast_to(pruning_threshold(prune_eps, u, n_keys), (B, Hq)).contiguous()
