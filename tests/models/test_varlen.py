"""A packed batch (cu_seqlens, B = 1) gives the logits and losses of the separate sequences."""
import torch

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
