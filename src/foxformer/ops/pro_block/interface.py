"""shift_norm and gate_norm: public functions, dispatch, and their torch.library ops with fake implementations and
autograd, so that torch.compile sees each forward and each backward as one opaque op (no graph break)."""
from __future__ import annotations

from typing import Optional

import torch

from .checks import check_gate_norm, check_shift_norm, resolve_backend
from .gate import gate_norm_backward, gate_norm_forward
from .reference import gate_norm_reference, shift_norm_reference
from .shift import shift_norm_backward, shift_norm_forward


def _contiguous_like(x: torch.Tensor, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    return x.new_empty(x.shape, dtype=dtype or x.dtype)


def _or_empty(t: Optional[torch.Tensor], like: torch.Tensor) -> torch.Tensor:
    # A custom op returns tensors, not None: an empty one stands for the gradient of an absent input.
    return like.new_empty(0) if t is None else t


@torch.library.custom_op("foxformer::shift_norm", mutates_args=())
def _shift_norm_op(x: torch.Tensor, logits: Optional[torch.Tensor], prev: Optional[torch.Tensor],
                   starts: Optional[torch.Tensor], weight: Optional[torch.Tensor], eps: float) -> torch.Tensor:
    return shift_norm_forward(x, logits, prev, starts, weight, eps)


@_shift_norm_op.register_fake
def _(x, logits, prev, starts, weight, eps):
    return _contiguous_like(x)


@torch.library.custom_op("foxformer::shift_norm_bwd", mutates_args=())
def _shift_norm_bwd_op(dy: torch.Tensor, x: torch.Tensor, logits: Optional[torch.Tensor],
                       prev: Optional[torch.Tensor], starts: Optional[torch.Tensor], weight: Optional[torch.Tensor],
                       eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    grads = shift_norm_backward(dy, x, logits, prev, starts, weight, eps)
    return tuple(_or_empty(g, x) for g in grads)


@_shift_norm_bwd_op.register_fake
def _(dy, x, logits, prev, starts, weight, eps):
    return tuple(_or_empty(None if t is None else _contiguous_like(t), x) for t in (x, logits, prev, weight))


def _shift_norm_setup(ctx, inputs, output):
    x, logits, prev, starts, weight, eps = inputs
    ctx.save_for_backward(x, logits, prev, starts, weight)
    ctx.eps = eps


def _shift_norm_backward(ctx, dy):
    x, logits, prev, starts, weight = ctx.saved_tensors
    dx, dlogits, dprev, dweight = _shift_norm_bwd_op(dy, x, logits, prev, starts, weight, ctx.eps)
    given = [t is not None for t in (logits, prev, weight)]
    dlogits, dprev, dweight = [g if ok else None for g, ok in zip((dlogits, dprev, dweight), given)]
    return dx, dlogits, dprev, None, dweight, None


_shift_norm_op.register_autograd(_shift_norm_backward, setup_context=_shift_norm_setup)


@torch.library.custom_op("foxformer::gate_norm", mutates_args=())
def _gate_norm_op(o: torch.Tensor, g: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return gate_norm_forward(o, g, weight, eps)


@_gate_norm_op.register_fake
def _(o, g, weight, eps):
    return _contiguous_like(o)


@torch.library.custom_op("foxformer::gate_norm_bwd", mutates_args=())
def _gate_norm_bwd_op(dy: torch.Tensor, o: torch.Tensor, g: torch.Tensor, weight: torch.Tensor,
                      eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return gate_norm_backward(dy, o, g, weight, eps)


@_gate_norm_bwd_op.register_fake
def _(dy, o, g, weight, eps):
    return _contiguous_like(o), _contiguous_like(g), _contiguous_like(weight)


def _gate_norm_setup(ctx, inputs, output):
    o, g, weight, eps = inputs
    ctx.save_for_backward(o, g, weight)
    ctx.eps = eps


def _gate_norm_backward(ctx, dy):
    o, g, weight = ctx.saved_tensors
    return (*_gate_norm_bwd_op(dy, o, g, weight, ctx.eps), None)


_gate_norm_op.register_autograd(_gate_norm_backward, setup_context=_gate_norm_setup)


def shift_norm(x: torch.Tensor, logits: Optional[torch.Tensor] = None, prev: Optional[torch.Tensor] = None,
               starts: Optional[torch.Tensor] = None, weight: Optional[torch.Tensor] = None, eps: float = 1e-6, *,
               backend: str = "auto") -> torch.Tensor:
    """The Pro block's token shift of k or v and its QK-norm, in one pass.

    ``u_t = x_t + a_t (s_t - x_t)`` with ``a = sigmoid(logits)`` and ``s_t = x_{t-1}`` (``prev`` at t = 0, zeros
    without it, and zeros where ``starts``), then ``y = u / sqrt(mean(u^2) + eps) * weight`` over the head dim.

    Args:
        x: ``[B, T, H, D]``: rows may lie at any strides, each row's D elements contiguous (else it is copied).
        logits: ``[B, T, H]`` shift gate logits, one per head; None: no shift (then prev and starts must be None).
            NaN is refused (NonFiniteValueError), as the attention ops refuse a NaN gate (CUDA tensors only with
            FOXFORMER_CHECK_VALUES=1); +-inf is a gate shut or open.
        prev: ``[B, H, D]`` the candidate before ``x[:, 0]`` (a cache's last token); None: zeros.
        starts: bool ``[B, T]``: True where a sequence begins, whose shift reads zeros instead of the token before.
        weight: ``[D]`` (shared by the heads) or ``[H, D]``; None: no RMSNorm. At least one of logits and weight.
        eps: the RMSNorm's epsilon.
        backend: ``"auto"`` (the Triton kernels for CUDA fp16 / bf16 / fp32 tensors, the torch reference
            otherwise), ``"triton"`` (CUDA, or CPU tensors under TRITON_INTERPRET=1; fp64 too) or ``"torch"``.

    Returns:
        ``y`` ``[B, T, H, D]`` in x's dtype, computed in fp32 (fp64 for fp64 inputs) and rounded once.
        Differentiable in x, logits, prev and weight; the backward is deterministic (no atomics).
    """
    check_shift_norm(x, logits, prev, starts, weight, eps)
    if resolve_backend(backend, x) == "torch":
        return shift_norm_reference(x, logits, prev, starts, weight, eps)
    return _shift_norm_op(x, logits, prev, starts, weight, float(eps))


def gate_norm(o: torch.Tensor, g: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, *,
              backend: str = "auto") -> torch.Tensor:
    """The Pro block's output norm and output gate in one pass: ``o / sqrt(mean(o^2) + eps) * weight * sigmoid(g)``.

    Args:
        o: ``[B, T, H, D]`` attention output (rows at any strides, each row contiguous, else it is copied).
        g: the output gate's logits, ``[B, T, H * D]`` or ``[B, T, H, D]`` (likewise); NaN is refused as in
            ``shift_norm``'s logits.
        weight: ``[H, D]`` (or ``[D]`` shared by the heads).
        eps: the RMSNorm's epsilon.
        backend: as for ``shift_norm``.

    Returns:
        ``[B, T, H, D]`` in o's dtype, computed in fp32 (fp64 for fp64 inputs). Differentiable in o, g and weight;
        the backward is deterministic.
    """
    check_gate_norm(o, g, weight, eps)
    if resolve_backend(backend, o) == "torch":
        return gate_norm_reference(o, g, weight, eps)
    return _gate_norm_op(o, g, weight, float(eps))
