"""Tiny float64 models on the exact torch backend: differences are rounding only."""
import pytest
import torch

from foxformer.models import FoxForCausalLM, get_preset

VOCAB = 97
MAIN_PRESETS = ["fox-llama-tiny", "fox-pro-tiny", "transformer-llama-tiny", "transformer-pro-tiny", "linear-pro-tiny"]
# Ablations on top of the FoX (LLaMA) preset: every gate kind, RoPE, each Pro component, GQA.
VARIANTS = {
    "fgate-data_independent": dict(fgate="data_independent"),
    "fgate-fixed": dict(fgate="fixed"),
    "fgate-none": dict(fgate="none"),
    "rope": dict(rope=True),
    "qk_norm": dict(qk_norm=True),
    "output_gate": dict(output_gate=True),
    "output_norm": dict(output_norm=True),
    "kv_shift": dict(kv_shift=True),
    "gqa": dict(num_kv_heads=2),
    "tied": dict(tie_embeddings=True),
}


def make_model(preset: str, seed: int = 0, **overrides) -> FoxForCausalLM:
    torch.manual_seed(seed)
    cfg = get_preset(preset, vocab_size=VOCAB, attention_backend="torch", **overrides)
    model = FoxForCausalLM(cfg).double().eval()
    # Data-dependent gates start at b = 0 (f = 0.5); spread them so the tests see varied decays.
    with torch.no_grad():
        for layer in model.model.layers:
            gate = layer.attn.fgate
            if gate is not None and gate.kind == "data_dependent":
                gate.proj.bias.uniform_(-1.0, 4.0)
    return model


@pytest.fixture(params=MAIN_PRESETS)
def preset(request):
    return request.param


def tokens(batch: int, length: int, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (batch, length), generator=g)
