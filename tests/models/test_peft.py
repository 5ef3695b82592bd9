"""PEFT adapters on FoX models: LoRA on the attention and gate projections trains, generates through the cache (the
decode step's fused input product steps aside for adapted layers), and merges into the same logits."""
import pytest
import torch

from foxformer.models import FoxForCausalLM, get_preset

peft = pytest.importorskip("peft")


def test_lora_trains_generates_and_merges():
    torch.manual_seed(0)
    model = FoxForCausalLM(get_preset("fox-pro-tiny", vocab_size=97, attention_backend="torch")).double()
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "g_proj", "fgate.proj"]
    adapted = peft.get_peft_model(model, peft.LoraConfig(r=4, target_modules=targets, task_type="CAUSAL_LM"))
    trainable = {name for name, p in adapted.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in name for name in trainable)
    ids = torch.randint(0, 97, (2, 40), generator=torch.Generator().manual_seed(1))
    opt = torch.optim.AdamW([p for p in adapted.parameters() if p.requires_grad], lr=1e-2)
    losses = []
    for _ in range(15):
        loss = adapted(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 0.3
    adapted.eval()
    with torch.no_grad():
        want = adapted(input_ids=ids).logits
        # greedy decoding through the cache gives the tokens of the full forward's argmax, one at a time
        prompt = ids[:, :8]
        out = adapted.generate(input_ids=prompt, max_new_tokens=6, do_sample=False)
        step = prompt
        for _ in range(6):
            step = torch.cat([step, adapted(input_ids=step).logits[:, -1:].argmax(-1)], dim=1)
        assert torch.equal(out, step)
        merged = adapted.merge_and_unload()
        assert type(merged) is FoxForCausalLM
        torch.testing.assert_close(merged(input_ids=ids).logits, want, rtol=0, atol=1e-10)
