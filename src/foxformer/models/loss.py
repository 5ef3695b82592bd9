"""Next-token loss through the LM head without materialising the [N, V] logits.

At 16K context and GPT-2's 50K vocabulary a 64K-token step holds 13 GB of fp32 logits (plus their
gradient) when the loss is computed the usual way. Here the rows go through the head in chunks:
each chunk's logits live only long enough to give its loss and its gradients, which are kept
(hidden [N, d] and head [V, d] sized) and scaled by the incoming gradient in the backward.
"""
from __future__ import annotations

import torch

IGNORE_INDEX = -100


def check_token_ids(ids: torch.Tensor, vocab: int | None, name: str, *, ignore: int | None = None,
                    values: bool | None = None) -> None:
    """ids must be an integer tensor of ids in [0, vocab) (or ``ignore``; vocab None: any id): outside it the embedding (or the loss)
    fails with a bare IndexError on the CPU and a device-side assert on a GPU. The values are read where that is
    free (CPU tensors, outside torch.compile) unless ``values`` says otherwise: on a GPU it costs a device sync,
    which a caller does once (a prompt), not at every step."""
    if ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
        raise TypeError(f"{name}: expected an integer tensor of token ids, got {ids.dtype}")
    if values is None:
        values = ids.device.type == "cpu" and not torch.compiler.is_compiling()
    if vocab is None or not values or not ids.numel():
        return
    # Compared in int64: in a narrower dtype the vocabulary size wraps (257 is 1 as uint8, 50257 negative as int16),
    # which refused ids inside it, and uint16 has no comparisons on the CPU.
    ids = ids.long()
    bad = (ids < 0) | (ids >= vocab)
    if ignore is not None:
        bad &= ids != ignore
    if bool(bad.any()):
        wrong = int(ids[bad][0])
        allowed = f" (or {ignore}, ignored)" if ignore is not None else ""
        raise ValueError(f"{name}: token id {wrong} is outside the model's vocabulary of {vocab}{allowed}; were "
                         f"they encoded with another tokenizer?")
# Rows per chunk such that one chunk's fp32 logits stay under 2^28 elements (1 GiB).
_CHUNK_ELEMENTS = 1 << 28


class _LinearCrossEntropySum(torch.autograd.Function):
    """sum_i CE(hidden_i @ weight^T, target_i) over targets != IGNORE_INDEX, in fp32 (fp64 inputs: fp64)."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, chunk):
        # hidden [N, d]; weight [V, d]; targets [N] int64
        acc = torch.promote_types(hidden.dtype, torch.float32)  # fp32, or fp64 for fp64 models
        grad_h = torch.empty_like(hidden)
        grad_w = torch.zeros(weight.shape, dtype=acc, device=weight.device)
        total = torch.zeros((), dtype=acc, device=hidden.device)
        for s in range(0, hidden.shape[0], chunk):
            h, t = hidden[s:s + chunk], targets[s:s + chunk]
            logits = torch.matmul(h, weight.t().to(h.dtype)).to(acc)      # under autocast: bf16 GEMM
            lse = torch.logsumexp(logits, dim=-1)
            valid = t != IGNORE_INDEX
            t0 = torch.where(valid, t, torch.zeros_like(t))
            picked = logits.gather(1, t0[:, None]).squeeze(1)
            total += torch.where(valid, lse - picked, torch.zeros_like(lse)).sum()
            # d CE / d logits = softmax - one_hot, zero on ignored rows
            g = torch.exp(logits.sub_(lse[:, None]))
            g[torch.arange(g.shape[0], device=g.device), t0] -= 1.0
            g.mul_(valid[:, None])
            g = g.to(h.dtype)
            grad_h[s:s + chunk] = torch.matmul(g, weight.to(h.dtype))
            grad_w += torch.matmul(g.t(), h).to(acc)
        ctx.save_for_backward(grad_h, grad_w)
        ctx.weight_dtype = weight.dtype
        return total

    @staticmethod
    def backward(ctx, grad_total):
        grad_h, grad_w = ctx.saved_tensors
        return (grad_h * grad_total.to(grad_h.dtype), (grad_w * grad_total).to(ctx.weight_dtype),
                None, None)


def next_token_targets(labels: torch.Tensor, cu_seqlens: torch.Tensor | None = None) -> torch.Tensor:
    """labels [B, T] -> targets [B, T-1] of positions 0..T-2; with cu_seqlens the last token of a
    packed sequence gets IGNORE_INDEX (it must not predict the next sequence's first token).

    cu_seqlens: int32 [N + 1] offsets into the tokens of every row, one row after another ([B * T]; with B = 1 the
    row itself): documents of several rows packed as one (models.packing.packed_documents)."""
    if cu_seqlens is None or cu_seqlens.numel() <= 2:
        return labels[:, 1:]
    B, T = labels.shape
    # A row's last token predicts nothing anyway: the targets get that column too, so that every offset lands in
    # them (a row's end among the offsets is one more ignored target, no index past the row).
    targets = torch.cat((labels[:, 1:], labels.new_full((B, 1), IGNORE_INDEX)), 1).reshape(-1)
    targets[cu_seqlens[1:-1].to(labels.device).long() - 1] = IGNORE_INDEX
    return targets.view(B, T)[:, :-1]


def _rows_and_targets(hidden: torch.Tensor, labels: torch.Tensor, cu_seqlens: torch.Tensor | None):
    """(rows [N, d] of the positions that predict, in autocast's dtype under autocast; their targets [N];
    the targets [B, T-1]) of hidden [B, T, d] and labels [B, T]."""
    if labels.shape != hidden.shape[:2]:
        raise ValueError(f"labels must be [batch, seq] = {tuple(hidden.shape[:2])}, got {tuple(labels.shape)}")
    targets = next_token_targets(labels, cu_seqlens)
    h = hidden[:, :-1].reshape(-1, hidden.shape[-1])
    if torch.is_autocast_enabled(h.device.type):
        h = h.to(torch.get_autocast_dtype(h.device.type))
    return h, targets.reshape(-1), targets


# Dynamo stays out: on the H200 (torch 2.11, CUDA) a compiled model calling this Function got no gradient
# at all (tests/gpu/test_fused_loss_cuda.py: eager passed, compiled failed, 2026-11-29), while torch 2.13 on
# the CPU was exact. The loss is a few large GEMMs per chunk, so running it eagerly costs ~nothing.
@torch.compiler.disable
def fused_causal_lm_loss(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor,
                         cu_seqlens: torch.Tensor | None = None,
                         num_items_in_batch: int | torch.Tensor | None = None) -> torch.Tensor:
    """Mean next-token cross-entropy of ``hidden @ weight^T`` without the logits.

    hidden [B, T, d] (final hidden states), weight [V, d] (the LM head), labels [B, T] (shifted
    here, -100 ignored; with cu_seqlens a packed sequence's last token predicts nothing).
    Same value as ``causal_lm_loss(lm_head(hidden), labels, cu_seqlens, num_items_in_batch=...)``:
    the sum is divided by num_items_in_batch when it is given, else by the targets counted here.
    """
    h, t, targets = _rows_and_targets(hidden, labels, cu_seqlens)
    chunk = max(1, _CHUNK_ELEMENTS // weight.shape[0])
    total = _LinearCrossEntropySum.apply(h, weight, t, chunk)
    # fp32 like causal_lm_loss (the sum itself is accumulated in fp64 for fp64 models)
    count = (t != IGNORE_INDEX).sum().clamp_min(1) if num_items_in_batch is None else num_items_in_batch
    return (total / count).float()


@torch.no_grad()
def chunked_token_losses(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor,
                         cu_seqlens: torch.Tensor | None = None) -> torch.Tensor:
    """Per-token next-token cross-entropy of ``hidden @ weight^T`` (no gradient) without the [B, T, V] logits.

    hidden [B, T, d], weight [V, d], labels [B, T] -> fp32 [B, T-1], 0 where the target is ignored: the values
    of ``causal_lm_loss(lm_head(hidden), labels, cu_seqlens, "none")``. An evaluation at the training shape held
    fp32 logits of 6 GiB for 8 x 4K tokens and ran out of memory beside three other runs on an H100 (thirty-ninth
    session); the rows go through the head one chunk at a time, as in training.
    """
    h, t, targets = _rows_and_targets(hidden, labels, cu_seqlens)
    acc = torch.promote_types(h.dtype, torch.float32)
    out = torch.zeros(t.shape, dtype=torch.float32, device=h.device)
    chunk = max(1, _CHUNK_ELEMENTS // weight.shape[0])
    for s in range(0, h.shape[0], chunk):
        logits = torch.matmul(h[s:s + chunk], weight.t().to(h.dtype)).to(acc)
        tc = t[s:s + chunk]
        valid = tc != IGNORE_INDEX
        picked = logits.gather(1, torch.where(valid, tc, torch.zeros_like(tc))[:, None]).squeeze(1)
        out[s:s + chunk] = torch.where(valid, torch.logsumexp(logits, dim=-1) - picked, 0.0).float()
    return out.view(targets.shape)

