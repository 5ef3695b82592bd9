"""Models on CUDA in bf16 (Triton and, on sm_90, Gluon backends) against the exact torch backend.

Skipped without CUDA; run on the GPU machine: `TRITON_INTERPRET=0 python -m pytest -q tests/gpu`.
"""
import pytest
import torch

from foxformer.models import FoxForCausalLM, get_preset

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

PRESETS = ["fox-llama-tiny", "fox-pro-tiny", "transformer-pro-tiny"]


def _model(preset, backend, **kw):
    torch.manual_seed(0)
    cfg = get_preset(preset, vocab_size=512, hidden_size=256, num_heads=4, head_dim=64, attention_backend=backend,
                     **kw)
    return FoxForCausalLM(cfg).cuda()


def _rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


@pytest.mark.parametrize("backend", ["triton", pytest.param("gluon", marks=pytest.mark.skipif(
    not HOPPER, reason="the Gluon kernels need an sm_90 GPU"))])
@pytest.mark.parametrize("preset", PRESETS)
def test_bf16_kernels_match_torch_backend(preset, backend):
    ids = torch.randint(0, 512, (2, 1024), device="cuda")
    outs = []
    for name in (backend, "torch"):
        model = _model(preset, name)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = model(ids, labels=ids)
        out.loss.backward()
        outs.append((out.logits.float(), out.loss, model.lm_head.weight.grad, model.model.layers[0].attn.q_proj.weight.grad))
    (la, a, ga, qa), (lb, b, gb, qb) = outs
    assert _rel(la, lb) < 2e-2 and abs(a.item() - b.item()) < 1e-2
    assert _rel(ga, gb) < 5e-2 and _rel(qa, qb) < 5e-2


@pytest.mark.parametrize("preset", PRESETS)
def test_bf16_decode_matches_full_forward(preset):
    model = _model(preset, "auto").to(torch.bfloat16).eval()
    ids = torch.randint(0, 512, (2, 300), device="cuda")
    with torch.no_grad():
        full = model(ids).logits.float()
        out = model(ids[:, :200], use_cache=True)
        parts = [out.logits]
        for t in range(200, 300, 20):
            parts.append(model(ids[:, t:t + 20], past_key_values=out.cache).logits)
    assert _rel(torch.cat(parts, 1).float(), full) < 2e-2


def test_packed_varlen_triton():
    model = _model("fox-pro-tiny", "triton").to(torch.bfloat16)
    seqs = [torch.randint(0, 512, (1, n), device="cuda") for n in (300, 17, 700)]
    cu = torch.tensor([0, 300, 317, 1017], dtype=torch.int32, device="cuda")
    with torch.no_grad():
        packed = model(torch.cat(seqs, 1), cu_seqlens=cu, max_seqlen=700).logits.float()
        sep = torch.cat([model(s).logits.float() for s in seqs], 1)
    assert _rel(packed, sep) < 2e-2


@pytest.mark.parametrize("preset", ["fox-pro-small", "fox-llama-small"])
def test_training_steps_at_the_recipe_shape_have_finite_gradients(preset):
    """The small presets at docs/results.md's micro-batch (8 x 4096 tokens, bf16 autocast, the default kernels), three
    AdamW steps at the sweep's largest rate: every gradient finite. A tree whose kernels passed the op's tests at
    16K once gave NaN gradients at the first step of this training (twenty-eighth session, docs/benchmarks.md)."""
    torch.manual_seed(0)
    model = FoxForCausalLM(get_preset(preset)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=4e-3)
    for step in range(3):
        ids = torch.randint(0, model.config.vocab_size, (8, 4096), device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(ids, labels=ids).loss
        loss.backward()
        bad = [n for n, p in model.named_parameters() if p.grad is not None and not torch.isfinite(p.grad).all()]
        assert torch.isfinite(loss) and not bad, f"step {step}: loss {loss.item()}, non-finite gradients in {bad[:4]}"
        opt.step()
        opt.zero_grad(set_to_none=True)


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("field", ["joint_input_projections", "joint_gate_projections"])
@pytest.mark.parametrize("preset", ["fox-llama-tiny", "fox-pro-tiny", "transformer-llama-tiny"])
def test_joint_projections_match_one_product_a_layer(preset, field, compiled):
    """FoxConfig.joint_input_projections / joint_gate_projections under bf16 autocast, on the default kernels (in
    FoX (LLaMA) q, k and v reach the op as views of the padded joint output: strided rows the Gluon kernels read by
    TMA; the gate logits are views too): the loss and gradients of the separate products, to bf16 rounding."""
    ids = torch.randint(0, 512, (2, 1024), device="cuda")
    outs = []
    for joint in (False, True):
        model = _model(preset, "auto", **{"joint_gate_projections": False, field: joint})
        step = torch.compile(model) if compiled else model
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = step(ids, labels=ids)
        out.loss.backward()
        attn = model.model.layers[0].attn
        mlp = model.model.layers[0].mlp
        outs.append((out.loss, *(lin.weight.grad for lin in attn._input_linears().values()), mlp.up_proj.weight.grad))
    (a, *ga), (b, *gb) = outs
    assert abs(a.item() - b.item()) < 1e-2
    for x, y in zip(ga, gb):
        assert _rel(x, y) < 5e-2


def test_reorder_cache_on_cuda_syncs_only_where_values_are_checked(monkeypatch):
    """reorder_cache runs every beam-search step: on a CUDA cache its checks read no value from the device (no
    sync) unless FOXFORMER_CHECK_VALUES=1, which refuses a row past the batch by name instead of a device assert."""
    monkeypatch.delenv("FOXFORMER_CHECK_VALUES", raising=False)
    model = _model("fox-llama-tiny", "auto").to(torch.bfloat16).eval()
    ids = torch.randint(0, 512, (3, 8), device="cuda")
    with torch.no_grad():
        cache = model(ids, use_cache=True).cache
    index = torch.tensor([2, 2, 0], device="cuda")
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        cache.reorder_cache(index)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert cache.batch_size == 3
    monkeypatch.setenv("FOXFORMER_CHECK_VALUES", "1")
    with pytest.raises(ValueError, match=r"beam_idx holds 3, and the cache holds 3 row\(s\)"):
        cache.reorder_cache(torch.tensor([0, 3], device="cuda"))
