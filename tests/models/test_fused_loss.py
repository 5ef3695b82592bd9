"""The chunked LM-head loss equals the plain one, value and gradients, without returning logits."""
import pytest
import torch

from foxformer.models import loss as loss_mod

from .conftest import VOCAB, make_model


@pytest.mark.parametrize("packed", [False, True], ids=["batch", "packed"])
def test_fused_loss_matches_logits_loss(packed, monkeypatch):
    monkeypatch.setattr(loss_mod, "_CHUNK_ELEMENTS", 7 * VOCAB)  # several chunks, the last one partial
    model = make_model("fox-pro-tiny")
    g = torch.Generator().manual_seed(0)
    if packed:
        ids = torch.randint(0, VOCAB, (1, 40), generator=g)
        kw = dict(cu_seqlens=torch.tensor([0, 9, 30, 40], dtype=torch.int32), max_seqlen=21)
    else:
        ids = torch.randint(0, VOCAB, (2, 23), generator=g)
        kw = {}
    labels = ids.clone()
    labels[0, 5] = -100
    ref = model(ids, labels=labels, **kw)
    ref_grads = torch.autograd.grad(ref.loss, list(model.parameters()))
    got = model(ids, labels=labels, return_logits=False, **kw)
    assert got.logits is None
    # the plain loss runs its softmax in fp32 even for this fp64 model: compare at fp32 precision
    torch.testing.assert_close(got.loss, ref.loss, rtol=1e-6, atol=0)
    for a, b in zip(torch.autograd.grad(got.loss, list(model.parameters())), ref_grads):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-7)


def test_fused_loss_under_bf16_autocast_is_close():
    model = make_model("fox-llama-tiny").float()
    ids = torch.randint(0, VOCAB, (2, 32), generator=torch.Generator().manual_seed(1))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref = model(ids, labels=ids).loss
        got = model(ids, labels=ids, return_logits=False).loss
    assert abs(got.item() - ref.item()) < 2e-2


NOTHING_TO_PREDICT = {"all-labels-ignored": lambda ids: torch.full_like(ids, -100),
                      "one-token-sequences": lambda ids: ids[:, :1]}


@pytest.mark.parametrize("case", list(NOTHING_TO_PREDICT), ids=list(NOTHING_TO_PREDICT))
@pytest.mark.parametrize("fused", [False, True], ids=["logits-loss", "fused-loss"])
def test_a_batch_with_no_target_has_loss_zero_and_zero_gradients(case, fused):
    """A batch whose labels are all -100 (a fully masked SFT sample) or one token long has nothing to predict.
    The fused loss gave 0, the logits loss NaN (mean over no element), whose backward put NaN in every
    gradient and so in the weights after the optimizer step."""
    model = make_model("fox-pro-tiny").train()
    ids = torch.randint(0, VOCAB, (2, 9), generator=torch.Generator().manual_seed(0))
    labels = NOTHING_TO_PREDICT[case](ids)
    ids = ids[:, :labels.shape[1]]
    loss = model(ids, labels=labels, return_logits=not fused).loss
    assert loss.item() == 0.0
    loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is None or torch.all(p.grad == 0), name


@pytest.mark.parametrize("packed", [False, True], ids=["batch", "packed"])
def test_per_token_losses_without_logits_match_the_logits_loss(packed, monkeypatch):
    """Evaluation's per-token losses (train's `evaluate`) through the head in chunks: the same values as from the
    logits, 0 at ignored targets and at a packed sequence's last token, and no logits returned."""
    monkeypatch.setattr(loss_mod, "_CHUNK_ELEMENTS", 5 * VOCAB)
    model = make_model("fox-pro-tiny").eval()
    g = torch.Generator().manual_seed(2)
    if packed:
        ids = torch.randint(0, VOCAB, (1, 31), generator=g)
        kw = dict(cu_seqlens=torch.tensor([0, 12, 31], dtype=torch.int32), max_seqlen=19)
    else:
        ids = torch.randint(0, VOCAB, (2, 17), generator=g)
        kw = {}
    labels = ids.clone()
    labels[0, 3] = -100
    with torch.no_grad():
        ref = model(ids, labels=labels, loss_reduction="none", **kw)
        got = model(ids, labels=labels, loss_reduction="none", return_logits=False, **kw)
    assert got.logits is None and got.loss.dtype == torch.float32 and got.loss.shape == (ids.shape[0], ids.shape[1] - 1)
    torch.testing.assert_close(got.loss, ref.loss, rtol=1e-6, atol=1e-6)
    assert got.loss[0, 2] == 0 and (not packed or got.loss[0, 11] == 0)
    assert torch.all(got.loss[ref.loss != 0] > 0)


def test_per_token_losses_with_gradients_keep_the_logits():
    """With autograd on, the per-token losses come from the logits (the chunked path keeps no graph)."""
    model = make_model("fox-pro-tiny")
    ids = torch.randint(0, VOCAB, (1, 9), generator=torch.Generator().manual_seed(3))
    out = model(ids, labels=ids, loss_reduction="none", return_logits=False)
    assert out.logits is not None and out.loss.requires_grad
