"""Model-level pruning: prune_eps in the config reaches the op, with the QK-norm bound or "auto"."""
import pytest
import torch

from foxformer.models import FoxConfig
from foxformer.ops import pruning_stats

from .conftest import VOCAB, make_model


@pytest.mark.parametrize("preset", ["fox-pro-tiny", "fox-llama-tiny"], ids=["qk-norm-bound", "auto-bound"])
def test_pruned_model_matches_unpruned(preset):
    # fixed gates with short timescales forget fast, so most far tiles are prunable
    full = make_model(preset, fgate="fixed", fgate_tmin=2.0, fgate_tmax=8.0)
    pruned = make_model(preset, fgate="fixed", fgate_tmin=2.0, fgate_tmax=8.0, prune_eps=1e-6)
    pruned.load_state_dict(full.state_dict())
    ids = torch.randint(0, VOCAB, (2, 300), generator=torch.Generator().manual_seed(0))
    a, b = full(ids).logits, pruned(ids).logits
    assert not torch.equal(a, b)            # something was skipped ...
    torch.testing.assert_close(b, a, rtol=0, atol=1e-4)   # ... and it did not matter


def test_pruning_skips_tiles_on_a_fast_forgetting_model():
    model = make_model("fox-pro-tiny", fgate="fixed", fgate_tmin=2.0, fgate_tmax=8.0, prune_eps=1e-6)
    attn = model.model.layers[0].attn
    x = torch.randn(1, 512, model.config.hidden_size, dtype=torch.float64)
    q = attn.q_norm(attn.q_proj(x).view(1, 512, attn.num_heads, attn.head_dim))
    k = attn.k_norm(attn.k_proj(x).view(1, 512, attn.num_kv_heads, attn.head_dim))
    log_f = attn.fgate(x)
    kept = pruning_stats(q, k, log_f, 1e-6, qk_bound=attn._pruning()["qk_bound"], block_m=32, block_n=32)
    assert kept.max() < 1.0 and kept.min() < 0.5   # the fastest-forgetting head skips most tiles


def test_prune_eps_is_validated():
    with pytest.raises(ValueError, match="prune_eps"):
        FoxConfig(prune_eps=1.5)
