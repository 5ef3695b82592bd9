"""Documents packed into one row: how transformers marks them and how the forwards read them.

``packed_documents`` turns transformers' markers (HF_PACKING_KWARGS: cu_seq_lens_q / _k, max_length_q / _k,
seq_idx) and position_ids that restart within a row into the (cu_seqlens, max_seqlen, rows) a forward runs,
refusing markers that disagree and packed rows beside an attention mask or a cache; ``one_row`` makes the rows
of such a batch into the one packed row FoxModel runs. The model classes are in modeling.py.
"""
from __future__ import annotations

from typing import Optional

import torch

from ..ops.forgetting_attn.checks import check_max_seqlen

# How transformers marks documents packed into one row (DataCollatorWithFlattening; prepare_fa_kwargs_from_position_ids
# for its flash-attention path): the offsets cu_seq_lens_q / cu_seq_lens_k with max_length_q / max_length_k, seq_idx
# (the document of each token), or position_ids alone that restart at each document (the collator's default). The
# forwards read them (packed_documents): taken as unknown keywords, a packed batch attended across its documents.
HF_PACKING_KWARGS = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k", "seq_idx")


def _shown(t: torch.Tensor) -> str:
    values = t.reshape(-1).tolist()
    return str(values) if len(values) <= 12 else f"{values[:6]} ... {values[-3:]} ({len(values)} values)"


def _offsets(name: str, value) -> torch.Tensor:
    """int32 [N + 1] offsets from an HF cu_seq_lens_* (annotated LongTensor there, int32 from the collator)."""
    if not isinstance(value, torch.Tensor) or value.dim() != 1 or value.dtype.is_floating_point \
            or value.dtype == torch.bool:
        raise TypeError(f"{name} must be a 1-D integer tensor [N + 1] of document offsets, got "
                        f"{type(value).__name__} {tuple(getattr(value, 'shape', ()))}")
    return value.to(torch.int32)


def _offsets_of_starts(new_doc: torch.Tensor) -> torch.Tensor:
    """int32 [N + 1] offsets of the documents of rows that begin one where ``new_doc`` (bool [B, T - 1], for tokens
    1..T-1 of each row) is True, and one at each row's first token: into the rows' tokens one row after another
    ([B * T])."""
    rows, length = new_doc.shape[0], new_doc.shape[1] + 1
    begins = torch.cat((new_doc.new_ones(rows, 1), new_doc), 1).reshape(-1).nonzero().flatten()
    return torch.cat((begins, begins.new_full((1,), rows * length))).to(torch.int32)


def _check_same(first: torch.Tensor, first_name: str, second: torch.Tensor, second_name: str) -> None:
    if not torch.equal(first.to(second.device, torch.int32), second.to(torch.int32)):
        raise ValueError(f"{first_name} {_shown(first)} and {second_name} {_shown(second)} mark different "
                         f"documents in the packed row; pass one of them")


def _packing_said(source: str) -> str:
    if source == "position_ids":
        return ("position_ids restart within a row, which marks documents packed into it (as transformers' "
                "DataCollatorWithFlattening packs them)")
    return f"{source} marks documents packed into one row"


def masked_packing(source: str) -> ValueError:
    return ValueError(f"{_packing_said(source)}: a packed row takes no attention_mask (its documents hold no "
                      f"padding); leave it out")


def position_restarts(positions: torch.Tensor, real: Optional[torch.Tensor] = None) -> torch.Tensor:
    """bool [B, T - 1]: where tokens 1..T-1 of position_ids [B, T] (or [T]) begin a document, their position not
    growing. real (bool [B, T], the attention mask's): only pairs of real tokens count, so padded rows with
    transformers' position_ids (1 at padding, then 0, 1, ...) are no packed rows."""
    positions = positions[None] if positions.dim() == 1 else positions
    new_doc = positions[:, 1:] <= positions[:, :-1]
    return new_doc if real is None else new_doc & real[:, 1:] & real[:, :-1]


def packed_documents(kwargs: dict, inputs: Optional[torch.Tensor], position_ids: Optional[torch.Tensor],
                     cu_seqlens: Optional[torch.Tensor], max_seqlen: Optional[int],
                     attention_mask: Optional[torch.Tensor], cached: bool
                     ) -> tuple[Optional[torch.Tensor], Optional[int], int]:
    """(cu_seqlens, max_seqlen, rows) of a forward, with transformers' packing markers (HF_PACKING_KWARGS, popped
    from ``kwargs``) and position_ids that restart within a row taken into account.

    inputs: input_ids or inputs_embeds, for the batch size and length (None: the forward's own checks refuse it).
    cached: the forward continues or builds a cache. Every marker given must agree with cu_seqlens and the
    others; cu_seq_lens_k must equal cu_seq_lens_q (causal self-attention: one set of documents). position_ids mark
    documents only where nothing else does, as in transformers' flash attention; they stay the RoPE positions.
    Offsets (cu_seqlens, cu_seq_lens_q / _k) index one packed row; seq_idx and position_ids may mark documents in
    several rows [B, T]: rows is then B, the offsets index the rows' tokens one row after another ([B * T], each
    row's first token beginning a document), and FoxModel runs them as that one row (one_row, modeling._as_rows).
    A packed row takes no attention_mask and no cache: refused, naming the marker the caller passed."""
    hf = {name: kwargs.pop(name, None) for name in HF_PACKING_KWARGS}
    if inputs is None or inputs.dim() < 2:
        return cu_seqlens, max_seqlen, 1
    batch, length = inputs.shape[:2]
    source = "cu_seqlens" if cu_seqlens is not None else None
    given = [(name, _offsets(name, hf[name])) for name in ("cu_seq_lens_q", "cu_seq_lens_k") if hf[name] is not None]
    if len(given) == 2 and not torch.equal(given[0][1], given[1][1].to(given[0][1].device)):
        raise ValueError(f"cu_seq_lens_q {_shown(given[0][1])} and cu_seq_lens_k {_shown(given[1][1])} differ: "
                         f"foxformer models are causal self-attention, whose queries and keys are the same tokens")
    if given:
        name, offsets = given[0]
        if cu_seqlens is None:
            cu_seqlens, source = offsets, name
        else:
            _check_same(cu_seqlens, source, offsets, name)
    if cu_seqlens is not None and batch != 1:
        raise ValueError(f"{_packing_said(source)}, which needs a batch of size 1 (one row), got {batch} rows; pack "
                         f"every document into one row")
    lengths = [int(hf[name]) for name in ("max_length_q", "max_length_k") if hf[name] is not None]
    if len(set(lengths)) > 1:
        raise ValueError(f"max_length_q = {lengths[0]} and max_length_k = {lengths[1]} differ: foxformer models are "
                         f"causal self-attention, whose queries and keys are the same tokens")
    length_name = "max_seqlen"
    if max_seqlen is None and lengths:
        max_seqlen, length_name = lengths[0], "max_length_q" if hf["max_length_q"] is not None else "max_length_k"
    new_doc = None
    seq_idx = hf["seq_idx"]
    if seq_idx is not None:
        if not isinstance(seq_idx, torch.Tensor) or seq_idx.shape != (batch, length):
            raise ValueError(f"seq_idx must be [batch, seq] = {(batch, length)}, the document of each token, got "
                             f"{tuple(getattr(seq_idx, 'shape', ())) or type(seq_idx).__name__}")
        new_doc, marker = seq_idx[:, 1:] != seq_idx[:, :-1], "seq_idx"
    elif cu_seqlens is None and position_ids is not None and length >= 2:
        positions = position_ids[None] if position_ids.dim() == 1 else position_ids
        if positions.dim() != 2 or positions.shape[1] != length or positions.shape[0] not in (1, batch):
            raise ValueError(f"position_ids must be [batch, seq] = {(batch, length)} (or [1, seq]), got "
                             f"{tuple(position_ids.shape)}")
        # Beside a mask a restart is refused: FoxModel._positions looks for one in the device sync it makes anyway.
        if attention_mask is None:
            new_doc, marker = position_restarts(positions).expand(batch, -1), "position_ids"
    rows = 1
    if new_doc is not None:
        if cu_seqlens is not None:
            _check_same(cu_seqlens, source, _offsets_of_starts(new_doc), marker)
        elif bool(new_doc.any()):  # the one device sync where no row holds two documents (the common case)
            cu_seqlens, source, rows = _offsets_of_starts(new_doc), marker, batch
            if max_seqlen is None:
                max_seqlen = int((cu_seqlens[1:] - cu_seqlens[:-1]).max())
    if cu_seqlens is None:
        # nothing marks documents: a longest document given alone means its offsets were forgotten, and the row's
        # documents would attend to each other (the op refuses it, but softmax and linear layers ignored it)
        check_max_seqlen(None, max_seqlen, length_name,
                         "cu_seqlens" if length_name == "max_seqlen" else "cu_seq_lens_q / cu_seq_lens_k")
        return None, None, 1
    if attention_mask is not None:
        raise masked_packing(source)
    if cached:
        raise ValueError(f"{_packing_said(source)}, which no cache can continue; pass the documents as rows of a "
                         f"batch to decode them")
    return cu_seqlens, max_seqlen, rows


def one_row(rows: int, *tensors: Optional[torch.Tensor]) -> list[Optional[torch.Tensor]]:
    """Inputs [B, T, ...] of a batch whose documents packed_documents made into one packed row (``rows`` = B) as that
    row [1, B * T, ...]; position_ids [1, T] or [T] are every row's. None stays None; rows = 1: the tensors as given."""
    if rows == 1:
        return list(tensors)
    flat = []
    for t in tensors:
        if t is not None:
            t = t if t.dim() > 1 else t[None]
            t = t.expand(rows, *t.shape[1:]).reshape(1, rows * t.shape[1], *t.shape[2:])
        flat.append(t)
    return flat
