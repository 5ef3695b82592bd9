import contextlib
import inspect
import warnings

import pytest
import torch
import torch.nn.functional as F

from foxformer.models import FoxForCausalLM, get_preset
from foxformer.models.layers import rope_tables

from .conftest import MAIN_PRESETS, VARIANTS, VOCAB, make_model, tokens

CASES = [(p, {}) for p in MAIN_PRESETS] + [("fox-llama-tiny", v) for v in VARIANTS.values()]
IDS = MAIN_PRESETS + [f"fox-llama-tiny+{k}" for k in VARIANTS]


@pytest.mark.parametrize("preset,overrides", CASES, ids=IDS)
def test_forward_backward(preset, overrides):
    model = make_model(preset, **overrides).train()
    ids = tokens(2, 24)
    out = model(ids, labels=ids)
    assert out.logits.shape == (2, 24, VOCAB)
    assert out.loss.ndim == 0 and torch.isfinite(out.loss)
    out.loss.backward()
    for name, p in model.named_parameters():
        if p.requires_grad:
            assert p.grad is not None and torch.isfinite(p.grad).all(), name
            assert p.grad.abs().sum() > 0, f"{name} gets no gradient"


def test_loss_is_shifted_mean_cross_entropy_and_per_token():
    model = make_model("fox-pro-tiny")
    ids = tokens(2, 16)
    labels = ids.clone()
    labels[0, 5] = -100
    out = model(ids, labels=labels)
    ref = F.cross_entropy(out.logits[:, :-1].reshape(-1, VOCAB), labels[:, 1:].reshape(-1), ignore_index=-100)
    torch.testing.assert_close(out.loss, ref.float(), rtol=1e-6, atol=1e-6)
    per_token = model(ids, labels=labels, loss_reduction="none").loss
    assert per_token.shape == (2, 15) and per_token.dtype == torch.float32
    assert per_token[0, 4] == 0
    torch.testing.assert_close(per_token.sum() / 29, out.loss, rtol=1e-6, atol=1e-6)


def test_fixed_gate_is_frozen_and_initialised_from_timescales():
    model = make_model("fox-llama-tiny", fgate="fixed", fgate_tmin=2.0, fgate_tmax=256.0)
    gate = model.model.layers[0].attn.fgate
    assert not gate.bias.requires_grad and "bias" in dict(gate.named_buffers())
    timescales = 1.0 / -F.logsigmoid(gate.bias.double())
    torch.testing.assert_close(timescales, torch.tensor([2.0, 10.0794, 50.7968, 256.0], dtype=torch.float64),
                               rtol=1e-4, atol=0)
    fresh = FoxForCausalLM(get_preset("fox-llama-tiny", vocab_size=VOCAB))
    assert torch.all(fresh.model.layers[0].attn.fgate.proj.bias == 0)  # data-dependent gates start at b = 0


# linear-pro-tiny at T = 70: two chunks of the op (64 tokens each), so the recomputed forward re-runs the
# chunk scan; the left padding puts -inf gates at the sequence start.
@pytest.mark.parametrize("preset,length", [("fox-pro-tiny", 16), ("linear-pro-tiny", 70)], ids=lambda x: str(x))
def test_gradient_checkpointing_gives_same_gradients(preset, length):
    ids = tokens(2, length)
    mask = torch.ones_like(ids)
    mask[1, :5] = 0
    grads = []
    for ckpt in (False, True):
        model = make_model(preset, gradient_checkpointing=ckpt).train()
        assert model.model.gradient_checkpointing == ckpt
        model(ids, attention_mask=mask, labels=ids).loss.backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]))
    torch.testing.assert_close(grads[0], grads[1])


def _saved_tensors(model, ids) -> int:
    count = 0

    def pack(t):
        nonlocal count
        count += 1
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(ids, labels=ids)
    return count


def test_gradient_checkpointing_enable_uses_transformers_settings():
    """gradient_checkpointing_kwargs, every_n_layers and offload were ignored: every layer was checkpointed with
    FoxModel's own non-reentrant call."""
    ids = tokens(2, 12)
    model = make_model("fox-pro-tiny", num_layers=4).train()
    model(ids, labels=ids).loss.backward()
    ref = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    saved = {"none": _saved_tensors(model, ids)}
    contexts = []

    def context_fn():
        contexts.append(1)
        return contextlib.nullcontext(), contextlib.nullcontext()

    settings = {"all": {}, "context_fn": {"use_reentrant": False, "context_fn": context_fn},
                "reentrant": {"use_reentrant": True}}
    for name, kwargs in settings.items():
        model.zero_grad()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # the alias of activation_checkpointing_enable
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs or None)
        saved[name] = _saved_tensors(model, ids)
        model(ids, labels=ids).loss.backward()
        for n, p in model.named_parameters():
            if n in ref:
                torch.testing.assert_close(p.grad, ref[n], msg=f"{name}: {n}")
    assert saved["all"] == saved["context_fn"] == saved["reentrant"] < saved["none"] / 4
    assert len(contexts) == 2 * 4  # each layer's forward and its recompute
    enable = getattr(model, "activation_checkpointing_enable", None)  # transformers >= 5.25
    if enable is not None and "every_n_layers" in inspect.signature(enable).parameters:
        model.activation_checkpointing_disable()
        model.activation_checkpointing_enable(every_n_layers=2)
        assert saved["all"] < _saved_tensors(model, ids) < saved["none"]


def test_gradient_checkpointing_with_a_cache_says_it_is_skipped():
    """A training forward with use_cache=True ran every layer unchecked without a word."""
    ids = tokens(2, 8)
    model = make_model("fox-pro-tiny", gradient_checkpointing=True).train()
    with pytest.warns(UserWarning, match="gradient checkpointing: this forward runs without it"):
        out = model(ids, labels=ids, use_cache=True)
    torch.testing.assert_close(out.loss, model(ids, labels=ids).loss)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model(ids, labels=ids)
        with torch.no_grad():  # nothing to recompute: generating from a model in training mode
            model(ids, use_cache=True)


def test_bad_inputs_raise():
    model = make_model("fox-llama-tiny")
    ids = tokens(2, 8)
    with pytest.raises(ValueError, match="attention_mask"):
        model(ids, attention_mask=torch.ones(2, 5))
    with pytest.raises(ValueError, match="cu_seqlens marks documents packed into one row, which needs a batch of "
                                         "size 1"):
        model(ids, cu_seqlens=torch.tensor([0, 8], dtype=torch.int32))
    with pytest.raises(TypeError, match="cu_seqlens"):
        model(ids[:1], cu_seqlens=torch.tensor([0, 8]))
    with pytest.raises(ValueError, match="loss_reduction"):
        model(ids, labels=ids, loss_reduction="sum")
    # returned no cache without a word
    with pytest.raises(ValueError, match="cu_seqlens marks documents .* no cache can continue"):
        model(ids[:1], cu_seqlens=torch.tensor([0, 3, 8], dtype=torch.int32), use_cache=True)
    for forward in (model, model.model):  # accepted and ignored: the output had no attentions field at all
        with pytest.raises(ValueError, match="output_attentions=True: .* never form attention weights"):
            forward(ids, output_attentions=True)
    assert model(ids, output_attentions=False).logits.shape == (2, 8, VOCAB)


@pytest.mark.parametrize("return_logits", [True, False], ids=["logits", "fused-loss"])
def test_bad_token_ids_and_labels_name_the_argument(return_logits):
    """Were a bare IndexError from the embedding or the loss, a tuple index error, or a message that blamed
    logits_to_keep (labels one position short); a negative logits_to_keep dropped the first position."""
    model = make_model("fox-pro-tiny")
    ids = tokens(2, 6)
    call = dict(return_logits=return_logits)
    for bad in (torch.full_like(ids, VOCAB), torch.full_like(ids, -1)):
        with pytest.raises(ValueError, match="input_ids: token id .* outside the model's vocabulary of 97"):
            model(bad, **call)
        with pytest.raises(ValueError, match=r"labels: token id .* vocabulary of 97 \(or -100, ignored\)"):
            model(ids, labels=bad, **call)
    for labels in (ids[:, :5], ids[0]):
        with pytest.raises(ValueError, match=r"labels must be \[batch, seq\] = \(2, 6\)"):
            model(ids, labels=labels, **call)
    with pytest.raises(TypeError, match="input_ids: expected an integer tensor"):
        model(ids.float(), **call)
    with pytest.raises(ValueError, match="logits_to_keep must be >= 0"):
        model(ids, logits_to_keep=-1, **call)
    ignored = ids.clone()
    ignored[:, :3] = -100
    assert torch.isfinite(model(ids, labels=ignored, **call).loss)


AUTOCAST_CASES = {"fox-llama+rope": ("fox-llama-tiny", dict(rope=True)),
                  "fox-pro+rope+gqa": ("fox-pro-tiny", dict(rope=True, num_kv_heads=2)),
                  "transformer-llama": ("transformer-llama-tiny", {})}


@pytest.mark.parametrize("case", list(AUTOCAST_CASES), ids=list(AUTOCAST_CASES))
def test_rope_under_bf16_autocast(case):
    """Mixed precision (fp32 weights, bf16 autocast, as the trainer runs): RoPE must not leave q, k in
    fp32 next to a bf16 v. Training, evaluation and cached decoding all run and agree."""
    preset, overrides = AUTOCAST_CASES[case]
    model = make_model(preset, **overrides).float().train()
    ids = tokens(2, 24)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(ids, labels=ids).loss
    loss.backward()
    assert torch.isfinite(loss)
    model.eval()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        full = model(ids).logits.float()
        out = model(ids[:, :20], use_cache=True)
        parts = [out.logits.float()]
        parts += [model(ids[:, t:t + 1], past_key_values=out.cache).logits.float() for t in range(20, 24)]
    torch.testing.assert_close(torch.cat(parts, 1), full, rtol=0, atol=3e-2)


def test_rope_tables_are_one_opaque_op_under_compile():
    """torch.compile sees the RoPE tables as one op a forward, not the angle, cos and sin, which Inductor would
    fuse into (and evaluate again in) every layer's RoPE kernels; the tables are the LLaMA angles."""
    model = make_model("transformer-llama-tiny").eval()
    graphs = []

    def record(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    ids = tokens(2, 24)
    with torch.no_grad():
        compiled = torch.compile(model, backend=record, fullgraph=True)(ids).logits
        torch.testing.assert_close(compiled, model(ids).logits, rtol=0, atol=0)
    targets = [n.target for g in graphs for n in g.graph.nodes if n.op in ("call_function", "call_method")]
    assert targets.count(torch.ops.foxformer.rope_tables.default) == 1
    assert not [t for t in targets if "cos" in str(t) or "sin" in str(t)]
    positions = torch.tensor([[0, 5, 70000]])
    cos, sin = rope_tables(positions, 8, 10000.0, torch.float64)
    angles = positions[..., None].double() * 10000.0 ** (-torch.arange(4, dtype=torch.float64) / 4)
    assert cos.shape == sin.shape == (1, 3, 1, 4)
    torch.testing.assert_close(cos[:, :, 0], angles.cos(), rtol=0, atol=1e-12)
    torch.testing.assert_close(sin[:, :, 0], angles.sin(), rtol=0, atol=1e-12)


HOLED_MASKS = {"zero-between-real-tokens": [[1, 1, 1, 0, 1, 1, 1, 1], [1] * 8],
               "left-padding-then-a-zero": [[1] * 8, [0, 0, 1, 1, 0, 1, 1, 1]]}


@pytest.mark.parametrize("mask", list(HOLED_MASKS), ids=list(HOLED_MASKS))
def test_attention_mask_zero_between_real_tokens_is_rejected(preset, mask):
    """Only padding before (or, in a plain forward, after) a row's real tokens is supported: a 0
    between real tokens would still be attended to, so it must raise instead of being ignored."""
    model = make_model(preset)
    ids = tokens(2, 8)
    with pytest.raises(ValueError, match="attention_mask"):
        model(ids, attention_mask=torch.tensor(HOLED_MASKS[mask]))
    out = model(ids[:, :5], attention_mask=torch.tensor([[1] * 5, [1, 1, 1, 0, 0]]), use_cache=True)
    with pytest.raises(ValueError, match="attention_mask"):  # continuing after right padding
        model(ids[:, 5:6], attention_mask=torch.tensor([[1] * 6, [1, 1, 1, 0, 0, 1]]), past_key_values=out.cache)


NOT_BINARY_MASKS = {"twos": (torch.tensor([[0, 2, 2, 2], [2, 2, 2, 2]]), "2"),
                    "a-half": (torch.tensor([[0, 1, 1, 1], [0.5, 1, 1, 1]]), "0.5"),
                    "minus-one": (torch.tensor([[-1, 1, 1, 1], [1, 1, 1, 1]]), "-1"),
                    "nan": (torch.tensor([[0, 1, 1, float("nan")], [1, 1, 1, 1]]), "nan")}


@pytest.mark.parametrize("name", list(NOT_BINARY_MASKS), ids=list(NOT_BINARY_MASKS))
def test_attention_mask_values_other_than_0_and_1_are_refused(name):
    """2s read as 1s and 0.5 as 1 (bool) without a word: any value but 0 and 1 is refused, naming it."""
    mask, said = NOT_BINARY_MASKS[name]
    with pytest.raises(ValueError, match=rf"attention_mask: expected only 0 \(padding\) and 1 .*got {said}"):
        make_model("fox-pro-tiny")(tokens(2, 4), attention_mask=mask)


def test_attention_masks_of_0_and_1_in_any_dtype_agree():
    model = make_model("fox-pro-tiny")
    ids, mask = tokens(2, 4), torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])
    want = model(ids, attention_mask=mask).logits
    for dtype in (torch.bool, torch.int32, torch.float32, torch.float64):
        torch.testing.assert_close(model(ids, attention_mask=mask.to(dtype)).logits, want, rtol=0, atol=0)


def test_right_padding_in_a_plain_forward_is_accepted(preset):
    model = make_model(preset)
    ids = tokens(2, 8)
    mask = torch.tensor([[1] * 8, [1] * 5 + [0] * 3])
    got = model(ids, attention_mask=mask).logits
    torch.testing.assert_close(got[1, :5], model(ids[1:, :5]).logits[0], rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(got[0], model(ids[:1]).logits[0], rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("fused", [False, True], ids=["logits-loss", "fused-loss"])
def test_num_items_in_batch_normalises_the_loss_for_gradient_accumulation(fused):
    """transformers' Trainer sees **kwargs in forward, so it passes num_items_in_batch (the counted tokens
    of all accumulated micro-batches) and no longer divides the loss by the accumulation steps: the model
    must divide its summed loss by that count. Ignoring it made every micro-batch's mean count in full
    (gradients k times too large with k accumulation steps)."""
    model = make_model("fox-pro-tiny")
    ids = tokens(4, 12)
    labels = ids.clone()
    labels[0, 3:7] = -100
    labels[3, :10] = -100
    full = model(ids, labels=labels).loss
    n = int((labels[:, 1:] != -100).sum())  # Trainer counts labels[..., 1:] for causal LMs
    kw = dict(return_logits=False) if fused else {}
    parts = [model(ids[s], labels=labels[s], num_items_in_batch=torch.tensor(n), **kw).loss
             for s in (slice(0, 1), slice(1, 4))]
    torch.testing.assert_close(parts[0] + parts[1], full, rtol=1e-6, atol=1e-6)
    per_token = model(ids[:1], labels=labels[:1], loss_reduction="none").loss
    torch.testing.assert_close(parts[0], per_token.sum() / n, rtol=1e-6, atol=1e-6)
