"""The model's cached decoding through the Triton decode kernel (interpreted on CPU) reproduces
the full forward pass; with eviction the ragged per-head starts go through the kernel too."""
import torch

from foxformer.models.kvcache import EvictionPolicy

from .conftest import make_model, tokens


@torch.no_grad()
def test_triton_decode_path_matches_full_forward():
    model = make_model("fox-pro-tiny", dtype=torch.float16, num_kv_heads=2, attention_backend="triton")
    ids = tokens(2, 24)
    full = model(ids).logits
    cache = model.model.new_cache()
    parts = [model(ids[:, :9], cache=cache, use_cache=True).logits]
    parts += [model(ids[:, t:t + 1], cache=cache, use_cache=True).logits for t in range(9, 21)]
    parts.append(model(ids[:, 21:], cache=cache, use_cache=True).logits)  # a 3-token chunk
    torch.testing.assert_close(torch.cat(parts, 1).float(), full.float(), rtol=0, atol=1e-2)


@torch.no_grad()
def test_triton_and_torch_decode_agree_with_eviction():
    logits = {}
    starts = {}
    for backend in ("triton", "torch"):
        # fp16 weights (the Triton prefill takes half types), attention math in fp32 either way.
        model = make_model("fox-pro-tiny", dtype=torch.float16, gate_bias=[-3.0, 6.0, -3.0, -2.0],
                           attention_backend=backend)
        ids = tokens(1, 40, seed=5)
        cache = model.model.new_cache(EvictionPolicy(1e-4))
        out = [model(ids[:, :8], cache=cache, use_cache=True).logits]
        out += [model(ids[:, t:t + 1], cache=cache, use_cache=True).logits for t in range(8, 40)]
        logits[backend] = torch.cat(out, 1)
        starts[backend] = [layer.start.clone() for layer in cache.layers]
    assert all(torch.equal(a, b) for a, b in zip(starts["triton"], starts["torch"]))
    assert int(starts["torch"][0][0, 0]) > 8 and int(starts["torch"][0][0, 1]) == 0  # ragged
    torch.testing.assert_close(logits["triton"].float(), logits["torch"].float(), rtol=0, atol=1e-2)
