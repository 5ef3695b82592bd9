"""A packed batch (cu_seqlens, B = 1) gives the logits and losses of the separate sequences."""
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from .conftest import make_model, tokens


def test_packed_equals_separate(preset):
    model = make_model(preset)
    lengths = [7, 1, 12, 5]
    seqs = [tokens(1, n, seed=10 + i) for i, n in enumerate(lengths)]
    packed = torch.cat(seqs, 1)
    cu = torch.tensor([0, 7, 8, 20, 25], dtype=torch.int32)
    out = model(packed, cu_seqlens=cu, max_seqlen=12, labels=packed, loss_reduction="none")
    sep_logits, sep_losses = [], []
    for s in seqs:
        o = model(s, labels=s, loss_reduction="none")
        sep_logits.append(o.logits)
        sep_losses.append(torch.cat([o.loss, o.loss.new_zeros(1, 1)], 1))  # boundary target is ignored
    torch.testing.assert_close(out.logits, torch.cat(sep_logits, 1), rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(out.loss, torch.cat(sep_losses, 1)[:, :-1], rtol=1e-6, atol=1e-6)
    mean = model(packed, cu_seqlens=cu, labels=packed).loss
    torch.testing.assert_close(mean, out.loss.sum() / (25 - 4), rtol=1e-6, atol=1e-6)


def test_packed_backward(preset):
    model = make_model(preset).train()
    packed = tokens(1, 16)
    cu = torch.tensor([0, 9, 16], dtype=torch.int32)
    model(packed, cu_seqlens=cu, labels=packed).loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


# transformers' DataCollatorWithFlattening packs a batch's documents into one row and marks them with position_ids
# restarting at 0 (its default), the flash-attention offsets cu_seq_lens_q / cu_seq_lens_k with max_length_q /
# max_length_k, or seq_idx. The forwards read only cu_seqlens and took these as unknown keywords: every document
# attended to the ones before it, without a word.
DOC_LENGTHS = (5, 11, 3)
COLLATORS = {"position_ids": {},
             "flash_attn_kwargs": dict(return_flash_attn_kwargs=True),
             "flash_attn_kwargs_only": dict(return_flash_attn_kwargs=True, return_position_ids=False),
             "seq_idx_only": dict(return_seq_idx=True, return_position_ids=False),
             "everything": dict(return_flash_attn_kwargs=True, return_seq_idx=True)}


def _documents() -> list[list[int]]:
    return [tokens(1, n, seed=30 + i)[0].tolist() for i, n in enumerate(DOC_LENGTHS)]


def _flattened(**flags) -> dict:
    from transformers import DataCollatorWithFlattening

    return DataCollatorWithFlattening(**flags)([{"input_ids": doc} for doc in _documents()])


@pytest.mark.parametrize("preset", ["fox-llama-tiny", "transformer-llama-tiny"])
@pytest.mark.parametrize("collator", COLLATORS)
def test_a_flattening_collator_batch_gives_each_document_alone(preset, collator):
    model = make_model(preset).float()
    batch = _flattened(**COLLATORS[collator])
    alone = [model(torch.tensor([doc]), labels=torch.tensor([doc])) for doc in _documents()]
    out = model(**batch)
    torch.testing.assert_close(out.logits, torch.cat([o.logits for o in alone], 1))
    # The collator's labels are -100 at each document's first token: the mean over the documents' own targets.
    counts = [n - 1 for n in DOC_LENGTHS]
    mean = sum(o.loss * c for o, c in zip(alone, counts)) / sum(counts)
    torch.testing.assert_close(out.loss, mean)
    torch.testing.assert_close(model(**batch, return_logits=False).loss, mean)  # the fused loss of training
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    alone = [model.model(torch.tensor([doc])).last_hidden_state for doc in _documents()]
    torch.testing.assert_close(model.model(**inputs).last_hidden_state, torch.cat(alone, 1))


def test_restarting_position_ids_pack_like_cu_seqlens_in_the_loss_too():
    """labels = input_ids (no -100 at the starts): a document's last token must not predict the next one's first."""
    model = make_model("transformer-llama-tiny")
    batch = _flattened()
    ids, positions = batch["input_ids"], batch["position_ids"]
    cu = torch.tensor([0, 5, 16, 19], dtype=torch.int32)
    want = model(ids, cu_seqlens=cu, labels=ids, loss_reduction="none")
    got = model(ids, position_ids=positions, labels=ids, loss_reduction="none")
    torch.testing.assert_close(got.loss, want.loss, rtol=0, atol=0)
    torch.testing.assert_close(got.logits, want.logits, rtol=0, atol=0)


def test_padded_rows_with_transformers_position_ids_are_no_packed_rows():
    """transformers numbers padding 1 (then 0, 1, ... for the real tokens): no document starts there."""
    model = make_model("transformer-llama-tiny")
    ids = tokens(2, 9)
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)
    torch.testing.assert_close(model(ids, attention_mask=mask, position_ids=positions).logits,
                               model(ids, attention_mask=mask).logits, rtol=0, atol=0)


def test_packing_markers_that_disagree_or_cannot_hold_are_refused():
    model = make_model("fox-llama-tiny")
    batch = _flattened(return_flash_attn_kwargs=True)
    ids = batch["input_ids"]
    other = torch.tensor([0, 5, 17, 19], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"cu_seqlens \[0, 5, 17, 19\] and cu_seq_lens_q \[0, 5, 16, 19\] mark "
                                         r"different documents"):
        model(**batch, cu_seqlens=other)
    with pytest.raises(ValueError, match="cu_seq_lens_q .* and cu_seq_lens_k .* differ: .* causal self-attention"):
        model(ids, cu_seq_lens_q=batch["cu_seq_lens_q"], cu_seq_lens_k=other)
    with pytest.raises(ValueError, match="cu_seq_lens_q .* and seq_idx .* mark different documents"):
        model(ids, cu_seq_lens_q=other, seq_idx=_flattened(return_seq_idx=True)["seq_idx"])
    model(**batch, cu_seqlens=batch["cu_seq_lens_q"].clone())  # the same documents twice: fine
    restarting = batch["position_ids"]
    with pytest.raises(ValueError, match="position_ids restart within a row.*takes no attention_mask"):
        model(ids, position_ids=restarting, attention_mask=torch.ones_like(ids))
    with pytest.raises(ValueError, match="position_ids restart within a row.*no cache can continue"):
        model(ids, position_ids=restarting, use_cache=True)
    with pytest.raises(ValueError, match="position_ids restart within a row.*takes no attention_mask"):
        model(ids.expand(2, -1), position_ids=restarting.expand(2, -1), attention_mask=torch.ones(2, 19))


# The refusals named cu_seqlens, foxformer's own argument, when the caller had passed transformers' cu_seq_lens_q.
# seq_idx marks the documents of each row: two rows of them are packed (the tests below), not refused.
REFUSED = [(marker, beside) for marker in ("cu_seqlens", "cu_seq_lens_q", "cu_seq_lens_k", "seq_idx")
           for beside in ("attention_mask", "use_cache", "two_rows") if (marker, beside) != ("seq_idx", "two_rows")]


@pytest.mark.parametrize("marker,beside", REFUSED, ids=[f"{m}-with-{b}" for m, b in REFUSED])
def test_a_refusal_names_the_packing_marker_given(marker, beside):
    model = make_model("fox-llama-tiny")
    batch = _flattened(return_flash_attn_kwargs=True, return_seq_idx=True)
    ids = batch["input_ids"]
    given = {marker: batch["seq_idx" if marker == "seq_idx" else "cu_seq_lens_q"]}
    if beside == "two_rows":
        ids, want = ids.expand(2, -1), "needs a batch of size 1"
    else:
        given[beside] = torch.ones_like(ids) if beside == "attention_mask" else True
        want = "takes no attention_mask" if beside == "attention_mask" else "no cache can continue"
    with pytest.raises(ValueError, match=f"^{marker} marks documents packed into one row.*{want}"):
        model(ids, **given)


# A longest document given with no offsets was ignored, a negative one too: the row's documents (the offsets
# forgotten) attended to each other. The FoX layers' op refuses it alone; softmax layers never reached the op.
LONE_LENGTHS = {"max_seqlen": ("max_seqlen", 5, "cu_seqlens"),
                "max_seqlen-negative": ("max_seqlen", -1, "cu_seqlens"),
                "max_length_q": ("max_length_q", 11, "cu_seq_lens_q / cu_seq_lens_k"),
                "max_length_k": ("max_length_k", 11, "cu_seq_lens_q / cu_seq_lens_k")}


@pytest.mark.parametrize("preset", ["fox-llama-tiny", "transformer-llama-tiny"])
@pytest.mark.parametrize("case", LONE_LENGTHS)
def test_a_longest_document_without_offsets_is_refused(preset, case):
    name, value, offsets = LONE_LENGTHS[case]
    model = make_model(preset)
    with pytest.raises(ValueError, match=rf"^{name}={value} was given without {offsets}: {name} only applies with"):
        model(tokens(1, 19), **{name: value})


# Restarting position_ids in a batch of several rows were refused: each row's documents now run as documents of one
# packed row [1, B * T], each row's first token beginning one.
ROW_DOCUMENTS = ((5, 11, 3), (19,), (1, 7, 6, 5))


def _rows_of_documents():
    docs = [[tokens(1, n, seed=50 + 10 * r + i) for i, n in enumerate(row)] for r, row in enumerate(ROW_DOCUMENTS)]
    ids = torch.cat([torch.cat(row, 1) for row in docs])
    positions = torch.stack([torch.cat([torch.arange(n) for n in row]) for row in ROW_DOCUMENTS])
    seq_idx = torch.stack([torch.cat([torch.full((n,), i) for i, n in enumerate(row)]) for row in ROW_DOCUMENTS])
    return docs, ids, positions, seq_idx


@pytest.mark.parametrize("preset", ["fox-llama-tiny", "transformer-llama-tiny", "fox-pro-tiny"])
@pytest.mark.parametrize("marker", ["position_ids", "seq_idx"])
def test_documents_packed_in_several_rows_give_each_document_alone(preset, marker):
    model = make_model(preset)
    docs, ids, positions, seq_idx = _rows_of_documents()
    given = {"position_ids": positions} if marker == "position_ids" else {"seq_idx": seq_idx}
    alone = [[model(d, labels=d, loss_reduction="none") for d in row] for row in docs]
    out = model(ids, labels=ids, loss_reduction="none", **given)
    assert out.logits.shape == (3, 19, model.config.vocab_size) and out.loss.shape == (3, 18)
    torch.testing.assert_close(out.logits, torch.cat([torch.cat([o.logits for o in row], 1) for row in alone]))
    # a document's last token predicts nothing (the next one's first token is no target of it)
    losses = torch.cat([torch.cat([torch.cat((o.loss, o.loss.new_zeros(1, 1)), 1) for o in row], 1)[:, :-1]
                        for row in alone])
    torch.testing.assert_close(out.loss, losses)
    mean = losses.sum() / sum(n - 1 for row in ROW_DOCUMENTS for n in row)
    torch.testing.assert_close(model(ids, labels=ids, **given).loss, mean)
    torch.testing.assert_close(model(ids, labels=ids, return_logits=False, **given).loss, mean)
    with torch.no_grad():  # evaluation's per-token losses through the head in chunks
        torch.testing.assert_close(model(ids, labels=ids, loss_reduction="none", return_logits=False, **given).loss,
                                   losses)
    torch.testing.assert_close(model(ids, logits_to_keep=1, **given).logits, out.logits[:, -1:])
    hidden = model.model(ids, output_hidden_states=True, **given)
    assert hidden.last_hidden_state.shape == (3, 19, model.config.hidden_size)
    assert [h.shape for h in hidden.hidden_states] == [(3, 19, model.config.hidden_size)] * 3
    alone = [torch.cat([model.model(d).last_hidden_state for d in row], 1) for row in docs]
    torch.testing.assert_close(hidden.last_hidden_state, torch.cat(alone))


def test_position_ids_of_one_row_restart_every_row_of_the_batch():
    model = make_model("transformer-llama-tiny")
    batch = _flattened()
    ids = torch.cat((batch["input_ids"], tokens(1, 19, seed=3)))
    alone = torch.cat([model(ids[:, a:b]).logits for a, b in ((0, 5), (5, 16), (16, 19))], 1)
    torch.testing.assert_close(model(ids, position_ids=batch["position_ids"]).logits, alone)
    torch.testing.assert_close(model(ids, position_ids=batch["position_ids"][0]).logits, alone)


class _HostReads(TorchDispatchMode):
    """Counts the ops that read a tensor's values on the host: each a device sync on a GPU."""

    READS = {"aten._local_scalar_dense.default", "aten.nonzero.default", "aten.equal.default"}

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += str(func) in self.READS
        return func(*args, **(kwargs or {}))


def _host_reads(forward) -> int:
    with torch.no_grad(), _HostReads() as reads:
        forward()
    return reads.count


def test_position_ids_cost_one_device_sync_alone_and_none_beside_a_mask():
    """Looking for restarts read position_ids on the host twice per FoxForCausalLM forward (its own look, then
    FoxModel's), and beside an attention_mask once more than the mask's own checks."""
    model = make_model("transformer-llama-tiny")
    ids = tokens(2, 12)
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    plain, padded = torch.arange(12).expand(2, -1), (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)
    assert _host_reads(lambda: model(ids, position_ids=plain)) == _host_reads(lambda: model(ids)) + 1
    assert _host_reads(lambda: model(ids, attention_mask=mask, position_ids=padded)) == \
        _host_reads(lambda: model(ids, attention_mask=mask))
    with pytest.raises(ValueError, match="position_ids restart within a row.*takes no attention_mask"):
        model(ids, attention_mask=mask, position_ids=torch.tensor([0, 1, 2, 0, 1, 2] * 2).expand(2, -1))
