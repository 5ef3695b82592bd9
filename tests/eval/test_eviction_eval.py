"""`foxformer eval eviction`: eviction's loss change and memory saving, measured on the same sequences."""
import json
import math
import os

import pytest
import torch

from foxformer.bench.decode import realistic_gates
from foxformer.cli import main
from foxformer.eval.eviction import _cached_pass, eviction_loss
from foxformer.models import EvictionPolicy

from .helpers import tiny_model


def test_no_eviction_pass_is_the_full_forward():
    model = tiny_model("fox-pro-tiny", vocab=97, seed=3)
    x = torch.randint(0, 97, (2, 150), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        full = model(x, labels=x, loss_reduction="none").loss
    cached, mem = _cached_pass(model, x, chunk=7, prefill=20, policy=None, progress=False, desc="")
    assert cached.shape == full.shape and torch.allclose(cached, full, atol=1e-5)
    assert mem["kept_fraction"] == 1.0


def test_strong_gates_evict_and_the_loss_stays_within_tolerance():
    model = tiny_model("fox-pro-tiny", vocab=97, seed=4)
    realistic_gates(model, 32)  # timescales 2..32 tokens: most keys become negligible
    x = torch.randint(0, 97, (2, 400), generator=torch.Generator().manual_seed(1))
    res = eviction_loss(model, x, evict_eps=1e-4, progress=False)
    assert res["kept_fraction"] < 0.6 and res["live_ratio"] < 0.7
    assert res["peak_allocated_bytes_evicted"] <= res["peak_allocated_bytes"]
    # eps bounds the dropped attention mass per row: the per-token loss moves by far less than 0.01
    assert res["max_abs_diff"] < 1e-2 and abs(res["loss"] - res["loss_evicted"]) < 1e-3
    assert math.isfinite(res["loss"])


def test_bad_arguments_are_named():
    model = tiny_model("fox-pro-tiny", vocab=97)
    x = torch.randint(0, 97, (1, 40))
    with pytest.raises(ValueError, match="evict_eps"):
        eviction_loss(model, x, evict_eps=0.0)
    with pytest.raises(ValueError, match="chunk"):
        eviction_loss(model, x, evict_eps=1e-3, chunk=0)
    with pytest.raises(ValueError, match="forget gate"):
        eviction_loss(tiny_model("transformer-pro-tiny", vocab=97), x, evict_eps=1e-3)


def test_cli_writes_eviction_json(tmp_path):
    hf = tmp_path / "hf"
    tiny_model("fox-pro-tiny", vocab=259, seed=5).save_pretrained(str(hf))  # byte tokens
    src = tmp_path / "doc.txt"
    src.write_text(" ".join(f"word{i % 50}" for i in range(3000)))
    out = tmp_path / "out"
    assert main(["eval", "eviction", str(hf), "--source", str(src), "--tokenizer", "bytes", "--seq-len", "200",
                 "--evict-eps", "1e-3", "--device", "cpu", "--out", str(out), "--no-progress", "--names", "fox"]) == 0
    res = json.load(open(os.path.join(out, "eviction.json")))
    assert res["seq_len"] == 200 and 0 < res["kept_fraction"] <= 1
    assert res["name"] == "fox"  # --names labels the one model, as its help says
    # it wrote no plot: the loss change by position (log-spaced bins), where people would rather look than read
    bins = res["by_position"]
    assert bins["position"][0] == 1.0 and bins["position"][-1] <= 199
    assert len(bins["mean_diff"]) == len(bins["max_abs_diff"]) == len(bins["position"])
    assert max(bins["max_abs_diff"]) == pytest.approx(res["max_abs_diff"])
    with open(out / "eviction.png", "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_a_model_without_qk_norm_needs_a_bound():
    model = tiny_model("fox-llama-tiny", vocab=97)
    x = torch.randint(0, 97, (1, 60))
    with pytest.raises(ValueError, match=r"^qk_bound: this model has no QK-norm"):
        eviction_loss(model, x, evict_eps=1e-3)
    assert eviction_loss(model, x, evict_eps=1e-3, qk_bound=10.0, progress=False)["seq_len"] == 60
    with pytest.warns(UserWarning, match="no layer can evict"):
        model.model.new_cache(EvictionPolicy(1e-3))


@pytest.mark.parametrize("config_eps", [None, 1e-1], ids=["config-without-evict-eps", "config-with-evict-eps"])
def test_the_no_eviction_pass_keeps_every_key_whatever_the_config_says(config_eps):
    """A model whose config sets evict_eps (how Hugging Face generate is told to evict) made the baseline pass
    evict too: live_ratio 1.0 and a loss difference of exactly 0, whatever eviction really cost."""
    model = tiny_model("fox-pro-tiny", vocab=97, seed=4)
    realistic_gates(model, 32)
    model.config.evict_eps = config_eps
    x = torch.randint(0, 97, (1, 200), generator=torch.Generator().manual_seed(1))
    _, mem = _cached_pass(model, x, chunk=16, prefill=16, policy=None, progress=False, desc="")
    assert mem["kept_fraction"] == 1.0
    res = eviction_loss(model, x, evict_eps=1e-1, progress=False)
    assert res["kept_fraction"] < 0.9 and res["live_ratio"] < 0.9 and res["max_abs_diff"] > 0



@pytest.mark.parametrize("entry", ["api", "cli"])
def test_a_qk_bound_in_the_config_is_used_without_the_flag(tmp_path, entry):
    """A model without QK-norm whose config sets evict_qk_bound was refused with 'needs --qk-bound', though
    new_cache (and so generate) takes the config's bound."""
    model = tiny_model("fox-llama-tiny", vocab=259, seed=4)
    realistic_gates(model, 8)
    x = torch.randint(0, 259, (1, 120), generator=torch.Generator().manual_seed(1))
    want = eviction_loss(model, x, evict_eps=1e-2, qk_bound=2.0, progress=False)
    assert want["kept_fraction"] < 1  # the bound makes it evict
    model.config.evict_qk_bound = 2.0
    if entry == "api":
        got = eviction_loss(model, x, evict_eps=1e-2, progress=False)
        assert got["kept_fraction"] == want["kept_fraction"] and got["max_abs_diff"] == want["max_abs_diff"]
    else:
        hf, out, src = tmp_path / "hf", tmp_path / "out", tmp_path / "doc.txt"
        model.save_pretrained(str(hf))
        src.write_text("".join(chr(32 + (i * 7) % 90) for i in range(400)))
        assert main(["eval", "eviction", str(hf), "--source", str(src), "--tokenizer", "bytes", "--seq-len", "120",
                     "--num-seqs", "1", "--evict-eps", "1e-2", "--device", "cpu", "--out", str(out),
                     "--no-progress"]) == 0
        # other text than x: the config's bound evicts all the same (no bound would keep every key)
        assert json.load(open(os.path.join(out, "eviction.json")))["kept_fraction"] < 1


def test_a_linear_attention_model_is_refused_before_any_pass(monkeypatch):
    """It has a forget gate but no keys: the refusal came from new_cache only after the whole no-eviction pass
    (at 64K tokens, 16 a step, the longest evaluation of reproduce.sh)."""
    model = tiny_model("linear-pro-tiny", vocab=97)
    monkeypatch.setattr(model.model, "forward", lambda *a, **k: pytest.fail("eviction_loss ran the model"))
    with pytest.raises(ValueError, match="attention='linear'.*no keys to evict"):
        eviction_loss(model, torch.randint(0, 97, (1, 40)), evict_eps=1e-3, progress=False)
