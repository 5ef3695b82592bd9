"""Public Forgetting Attention functions, dispatch, autograd and torch.library registration.

The chunked torch backend and the Triton kernels share one contract (see ``reference.torch_forward``):
they take the float64 cumsum ``c`` as ``[B, Hq, Tk]`` and return ``dc`` from the backward. The
gradient of ``log_fgate`` then comes from autograd through the gate cumsum (a reverse cumsum in
float64: torch's for the torch backend, scan.py's Triton op for the Triton and Gluon ones), so no
attention backend has to implement it.
"""
from __future__ import annotations

from typing import Optional

import torch

from .. import gpu
from .checks import check_differentiation, check_inputs, resolve_backend
from .cumsum import gate_cumsum_heads_first
from .pruning import prune_delta
from .reference import naive_unchecked, no_queries, torch_backward, torch_forward
from .scan import triton_gate_cumsum, triton_gate_cumsum_grad
from .threshold import check_pruning


def _lse_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _kernel_backend(backend: str, **tensors: torch.Tensor) -> str:
    """"gluon" falls back to "triton" for tensors TMA cannot address (hopper/dispatch.py)."""
    if backend == "gluon":
        from .hopper.dispatch import layout_reason
        if layout_reason(**tensors) is not None:
            return "triton"
    return backend


def kernel_backend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, backend: str = "auto") -> str:
    """The backend a forward of these tensors runs on: ``backend`` resolved ("auto" by device, dtype and head dim),
    then "gluon" as "triton" for tensors TMA cannot address. A benchmark's row names it: "auto" is another kernel
    on another GPU."""
    return _kernel_backend(resolve_backend(backend, q), q=q, k=k, v=v)


def _forward_impl(backend: str):
    if backend == "gluon":
        from .hopper.launch import gluon_forward
        return gluon_forward
    if backend == "triton":
        from .fwd import triton_forward
        return triton_forward
    return torch_forward


@torch.library.custom_op("foxformer::forgetting_attention_fwd", mutates_args=())
def _fwd_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, c: torch.Tensor, scale: float,
            cu_seqlens: Optional[torch.Tensor], max_seqlen: Optional[int],
            backend: str, prune_delta: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
    backend = _kernel_backend(backend, q=q, k=k, v=v)
    with gpu.gpu_of(q):
        out, lse = _forward_impl(backend)(q, k, v, c, scale, cu_seqlens, max_seqlen, prune_delta=prune_delta)
    return out, lse


@_fwd_op.register_fake
def _fwd_fake(q, k, v, c, scale, cu_seqlens, max_seqlen, backend, prune_delta=None):
    B, Tq, Hq, _ = q.shape
    return torch.empty_like(q), q.new_empty((B, Hq, Tq), dtype=_lse_dtype(q.dtype))


@torch.library.custom_op("foxformer::forgetting_attention_bwd", mutates_args=())
def _bwd_op(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, c: torch.Tensor,
            out: torch.Tensor, lse: torch.Tensor, dlse: Optional[torch.Tensor], scale: float,
            cu_seqlens: Optional[torch.Tensor], max_seqlen: Optional[int],
            backend: str, prune_delta: Optional[torch.Tensor] = None,
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    backend = _kernel_backend(backend, q=q, k=k, v=v, do=do)
    if backend in ("gluon", "triton"):
        if backend == "gluon":
            from .hopper.launch import gluon_backward as kernel_backward
        else:
            from .bwd import triton_backward as kernel_backward
        with gpu.gpu_of(q):
            dq, dk, dv, dc = kernel_backward(do, q, k, v, c, out, lse, scale, cu_seqlens, max_seqlen,
                                             dlse=dlse, prune_delta=prune_delta)
    else:
        dq, dk, dv, dc = torch_backward(do, q, k, v, c, out, lse, scale, cu_seqlens, max_seqlen,
                                        dlse=dlse, prune_delta=prune_delta)
    return dq.contiguous(), dk.contiguous(), dv.contiguous(), dc.contiguous()


@_bwd_op.register_fake
def _bwd_fake(do, q, k, v, c, out, lse, dlse, scale, cu_seqlens, max_seqlen, backend, prune_delta=None):
    dc_dtype = _lse_dtype(q.dtype)
    return (torch.empty_like(q), torch.empty_like(k), torch.empty_like(v),
            c.new_empty(c.shape, dtype=dc_dtype))


def _setup_context(ctx, inputs, output):
    q, k, v, c, scale, cu_seqlens, max_seqlen, backend, prune_delta = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, c, out, lse, cu_seqlens, prune_delta)
    ctx.scale, ctx.max_seqlen, ctx.backend = scale, max_seqlen, backend
    # Unused outputs (lse, usually) then reach backward as None instead of a tensor of zeros.
    ctx.set_materialize_grads(False)


def _backward(ctx, dout, dlse):
    q, k, v, c, out, lse, cu_seqlens, prune_delta = ctx.saved_tensors
    if dout is None:
        dout = torch.zeros_like(out)
    dq, dk, dv, dc = _bwd_op(dout.contiguous(), q, k, v, c, out, lse, dlse, ctx.scale, cu_seqlens,
                             ctx.max_seqlen, ctx.backend, prune_delta)
    return dq, dk, dv, dc.to(c.dtype), None, None, None, None, None


_fwd_op.register_autograd(_backward, setup_context=_setup_context)


def _no_double_backward(ctx, *grads):
    # Registered so that differentiating a gradient again names this op, instead of torch's generic
    # "no autograd formula was registered" for an internal op. Raised only then (create_graph=True
    # alone still works), as torch's own once_differentiable does.
    raise RuntimeError("forgetting_attention: double backward is not supported with the triton and "
                       "torch backends (their backward is not differentiable); use backend='naive'")


_bwd_op.register_autograd(_no_double_backward)


@torch.library.custom_op("foxformer::gate_cumsum", mutates_args=())
def _cumsum_op(log_fgate: torch.Tensor) -> torch.Tensor:
    with gpu.gpu_of(log_fgate):
        return triton_gate_cumsum(log_fgate)


@_cumsum_op.register_fake
def _cumsum_fake(log_fgate):
    B, T, H = log_fgate.shape
    return log_fgate.new_empty((B, H, T), dtype=torch.float64)


@torch.library.custom_op("foxformer::gate_cumsum_bwd", mutates_args=())
def _cumsum_bwd_op(grad_c: torch.Tensor, log_fgate: torch.Tensor) -> torch.Tensor:
    with gpu.gpu_of(log_fgate):
        return triton_gate_cumsum_grad(grad_c, log_fgate)


@_cumsum_bwd_op.register_fake
def _cumsum_bwd_fake(grad_c, log_fgate):
    return torch.empty_like(log_fgate, memory_format=torch.contiguous_format)


def _cumsum_setup_context(ctx, inputs, output):
    ctx.save_for_backward(inputs[0])


def _cumsum_backward(ctx, grad_c):
    (log_fgate,) = ctx.saved_tensors
    return _cumsum_bwd_op(grad_c, log_fgate)


_cumsum_op.register_autograd(_cumsum_backward, setup_context=_cumsum_setup_context)
_cumsum_bwd_op.register_autograd(_no_double_backward)


def _gate_cumsum(log_fgate: torch.Tensor, backend: str) -> torch.Tensor:
    """c [B, Hq, Tk] float64 for the kernels: scan.py's Triton scan with the Triton and Gluon backends (fewer
    kernels than torch's, which cost ~1.5% of the D 64 forward), the torch reference otherwise."""
    if backend in ("triton", "gluon"):
        return _cumsum_op(log_fgate)
    return gate_cumsum_heads_first(log_fgate)


def _last_dim_contiguous(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


def _attend(q, k, v, c_t, scale, cu_seqlens, max_seqlen, return_lse, backend, prune_eps, qk_bound):
    """c_t: float64 [B, Hq, Tk] contiguous, the layout the kernels read."""
    delta = None
    if prune_eps is not None:
        n_keys = max_seqlen if cu_seqlens is not None else k.shape[1]
        # U and delta depend on q, k only through a bound: no gradient flows through them
        delta = prune_delta(q.detach(), k.detach(), prune_eps, qk_bound, scale, n_keys).detach()
    out, lse = _fwd_op(_last_dim_contiguous(q), _last_dim_contiguous(k), _last_dim_contiguous(v),
                       c_t, scale, cu_seqlens, max_seqlen, backend, delta)
    return (out, lse) if return_lse else out


def forgetting_attention(q, k, v, log_fgate, *, softmax_scale=None, cu_seqlens=None,
                         max_seqlen=None, return_lse=False, backend="auto", prune_eps=None,
                         qk_bound=None):
    """Causal softmax attention with a forget gate (FoX).

    ``out_i = sum_j softmax_j(scale * q_i . k_j + c_i - c_j) v_j`` over keys ``j <= i``, where
    ``c = cumsum(log_fgate)`` along the key axis.

    Args:
        q: ``[B, Tq, Hq, D]`` queries. With ``Tq < Tk`` they are the last ``Tq`` positions (prefill
            or decoding on top of a cache): query ``i`` sits at key position ``Tk - Tq + i``. ``Tq = 0`` is
            allowed (an empty result, as torch's attention gives).
        k, v: ``[B, Tk, Hkv, D]``; ``Hq`` must be a multiple of ``Hkv`` (GQA, MQA). ``Tk = 0`` only with
            ``Tq = 0``: a query needs at least its own key (a ValueError otherwise).
        log_fgate: ``[B, Tk, Hq]`` log forget gate (``F.logsigmoid`` of the gate logits), ``<= 0``,
            one per query head; ``-inf`` (f = 0) hides every key before that token. (The cumsum puts
            ``LOG_FGATE_FLOOR`` = -1e4 in its place: exact while a row's scores ``scale * q . k`` differ by
            less than about 9000, i.e. always in practice; ``"naive"`` is exact at any scale.)
        softmax_scale: defaults to ``1 / sqrt(D)``.
        cu_seqlens: int32 ``[N + 1]`` cumulative lengths of ``N`` sequences packed along T (then
            ``B == 1`` and ``Tq == Tk``); attention and the cumsum restart at every boundary. Every
            sequence holds at least one token; ``T = 0`` packs none (``cu_seqlens = [0]``, N = 0).
        max_seqlen: longest packed sequence (computed from ``cu_seqlens`` when None); only with
            ``cu_seqlens`` (a ValueError without: nothing is packed then). A shorter value is a
            ValueError; under torch.compile (where it is required) it is checked on the device
            instead: a RuntimeError on CPU, a device-side assert on CUDA.
        return_lse: also return the log-sum-exp of each row, fp32 ``[B, Hq, Tq]`` (fp64 for
            fp64 inputs).
        backend: ``"auto"`` (the Gluon Hopper kernels where they apply, else Triton for fp16/bf16
            CUDA tensors, torch otherwise), ``"gluon"`` (H100 / H200, fp16 / bf16, head dim 64 or 128;
            tensors TMA cannot address, e.g. unpacked heads, run on the Triton kernels), ``"triton"``
            (CUDA, or CPU tensors under ``TRITON_INTERPRET=1``), ``"torch"`` (exact, chunked,
            O(T * chunk) memory), ``"naive"`` (materialised T x T reference).
        prune_eps: adaptive computation pruning. When set (a float in (0, 1)), the gluon, triton
            and torch backends skip every (query block, key block) tile whose pairs all satisfy
            ``c_i - c_j <= log(prune_eps) - 2U - log(N)`` (N: Tk, or max_seqlen with varlen):
            each row then loses at most ``prune_eps`` of its attention probability, so
            ``|out - exact| <= 2 * prune_eps * max|v|`` and ``|lse - exact| <= -log(1 - prune_eps)``.
            Forward and backward both skip. ``"naive"`` ignores it (computes everything).
            None (default): nothing is skipped and nothing extra is computed.
        qk_bound: U, a bound on ``|softmax_scale * q_i . k_j|`` per (batch, query head), used
            only with prune_eps. ``"auto"`` or None: ``softmax_scale * max ||q|| * max ||k||``
            computed from the inputs (one cheap pass over q and k). A float, or a tensor
            broadcastable to ``[B, Hq]`` (e.g. from QK-norm weights) is TRUSTED: if some
            ``|scale * q . k|`` exceeds it, rows may lose more than prune_eps (the caller's
            contract, not checked). Given without prune_eps, a ValueError: it would change nothing.

    Returns:
        ``out`` ``[B, Tq, Hq, D]`` in q's dtype, or ``(out, lse)`` when ``return_lse``.
        Differentiable in q, k, v and log_fgate; the backward is deterministic. With ``Tq = 0`` no kernel
        runs: ``out`` ``[B, 0, Hq, D]`` and ``lse`` ``[B, Hq, 0]``, whose backward gives q its zero-size
        gradient and k, v and log_fgate zeros of their shapes. Double backward
        (differentiating a gradient again), forward-mode AD (``torch.func.jvp``, ``jacfwd``) and
        ``torch.func.grad`` / ``jacrev`` are supported by ``backend="naive"`` only (a RuntimeError on the
        others).
    """
    softmax_scale, max_seqlen = check_inputs(q, k, v, log_fgate, "log_fgate", softmax_scale, cu_seqlens,
                                             max_seqlen, return_lse)
    check_pruning(prune_eps, qk_bound, q.shape[0], q.shape[2], q.device)
    backend = resolve_backend(backend, q)
    check_differentiation(backend, q, k, v, log_fgate)
    if q.shape[1] == 0:
        return no_queries(q, k, v, log_fgate, return_lse)
    if backend == "naive":
        return naive_unchecked(q, k, v, log_fgate, softmax_scale, cu_seqlens, return_lse)
    return _attend(q, k, v, _gate_cumsum(log_fgate, backend), softmax_scale, cu_seqlens, max_seqlen,
                   return_lse, backend, prune_eps, qk_bound)


def forgetting_attention_cumsum(q, k, v, c, *, softmax_scale=None, cu_seqlens=None,
                                max_seqlen=None, return_lse=False, backend="auto", prune_eps=None,
                                qk_bound=None):
    """Forgetting Attention from a precomputed cumsum ``c``: float64 ``[B, Tk, Hq]`` (see ``gate_cumsum``; another
    dtype is a TypeError, as in the decode op: the bias ``c_i - c_j`` needs the low bits a narrower sum has lost).

    For KV caches, which extend ``c`` token by token instead of recomputing it; the bias is
    ``c[Tk - Tq + i] - c[j]``. Same arguments and outputs as ``forgetting_attention`` otherwise;
    ``backend="naive"`` is not offered here (it needs the gates themselves). Pruning
    (prune_eps) assumes c never increases along T, as ``gate_cumsum`` guarantees.
    """
    softmax_scale, max_seqlen = check_inputs(q, k, v, c, "c", softmax_scale, cu_seqlens, max_seqlen, return_lse)
    check_pruning(prune_eps, qk_bound, q.shape[0], q.shape[2], q.device)
    backend = resolve_backend(backend, q)
    if backend == "naive":
        raise ValueError("backend='naive' needs log_fgate: call forgetting_attention instead")
    check_differentiation(backend, q, k, v, c)
    if q.shape[1] == 0:
        return no_queries(q, k, v, c, return_lse)
    c_t = c.transpose(1, 2).double().contiguous()
    return _attend(q, k, v, c_t, softmax_scale, cu_seqlens, max_seqlen, return_lse, backend,
                   prune_eps, qk_bound)
