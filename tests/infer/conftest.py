"""Tiny models for the inference tests (float64 + the exact torch backend unless a test says otherwise)."""
import pytest
import torch

from foxformer.models import FoxForCausalLM, get_preset

VOCAB = 257  # the "bytes" tokenizer's vocabulary


def make_model(preset: str = "fox-pro-tiny", seed: int = 0, dtype=torch.float64, gate_bias=None,
               **overrides) -> FoxForCausalLM:
    """gate_bias: None leaves data-dependent gates spread over [-1, 4]; a list [H] sets every layer's
    gate biases (very negative = strongly forgetting head)."""
    torch.manual_seed(seed)
    overrides.setdefault("attention_backend", "torch")
    cfg = get_preset(preset, vocab_size=VOCAB, **overrides)
    model = FoxForCausalLM(cfg).to(dtype).eval()
    with torch.no_grad():
        for layer in model.model.layers:
            gate = layer.attn.fgate
            if gate is None or gate.kind != "data_dependent":
                continue
            if gate_bias is None:
                gate.proj.bias.uniform_(-1.0, 4.0)
            else:
                gate.proj.bias.copy_(torch.tensor(gate_bias, dtype=dtype))
                gate.proj.weight.mul_(0.1)
    return model


def tokens(batch: int, length: int, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (batch, length), generator=g)


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny ops on a shared 2-core machine: a second intra-op thread only adds barrier waits (a 0.1 s
    test was seen taking 50 s when the other core was busy)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
