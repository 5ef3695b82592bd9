import math
import pickle
import re
import warnings

import pytest
import torch
from transformers import AutoConfig

from foxformer.models import config as config_module
from foxformer.models import PRESETS, FoxConfig, FoxForCausalLM, count_embedding, count_non_embedding, get_preset
from foxformer.models.config import ConfigError
from foxformer.models.presets import model_keys, preset_table, sized_config, training_flops_per_token


def test_preset_names_cover_the_grid():
    expected = {f"{f}-{b}-{s}" for f in ("fox", "transformer") for b in ("llama", "pro")
                for s in ("tiny", "small", "125m", "360m", "760m", "1.3b")}
    expected |= {f"linear-pro-{s}" for s in ("tiny", "small", "125m", "360m", "760m", "1.3b")}
    assert set(PRESETS) == expected


@pytest.mark.parametrize("size", ["tiny", "small", "125m", "360m", "760m", "1.3b"])
def test_linear_presets_are_fox_pro_without_the_softmax(size):
    linear, fox = get_preset(f"linear-pro-{size}"), get_preset(f"fox-pro-{size}")
    assert linear.attention == "linear" and linear.has_fgate
    assert {**linear.to_dict(), "attention": "forgetting"} == fox.to_dict()
    assert count_non_embedding(linear) == count_non_embedding(fox)


@pytest.mark.parametrize("size,layers,d", [("small", 8, 512), ("125m", 12, 768), ("360m", 24, 1024), ("760m", 24, 1536),
                                                ("1.3b", 24, 2048)])
def test_paper_sizes_and_head_dims(size, layers, d):
    fox, tf = get_preset(f"fox-llama-{size}"), get_preset(f"transformer-llama-{size}")
    assert (fox.num_layers, fox.hidden_size, fox.head_dim) == (layers, d, 64)
    assert (tf.num_layers, tf.hidden_size, tf.head_dim) == (layers, d, 128)
    assert fox.attention == "forgetting" and fox.fgate == "data_dependent" and not fox.rope
    assert tf.attention == "softmax" and tf.fgate == "none" and tf.rope and tf.rope_theta == 500000


def test_pro_presets_within_one_percent_of_llama():
    for row in preset_table():
        assert abs(row["vs_llama"]) < 0.01, row
    pro = get_preset("fox-pro-125m")
    assert pro.qk_norm and pro.output_gate and pro.output_norm and pro.kv_shift
    assert pro.intermediate_size < get_preset("fox-llama-125m").intermediate_size


@pytest.mark.parametrize("name", sorted(n for n in PRESETS if n.endswith("tiny")))
def test_analytic_count_matches_model(name):
    cfg = get_preset(name, vocab_size=101)
    model = FoxForCausalLM(cfg)
    assert model.num_parameters_non_embedding() == count_non_embedding(cfg)


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_non_embedding_counts_leave_out_the_lm_head_where_transformers_keeps_it(tied):
    """The paper's N (presets, MFU, cards) leaves out the head; transformers' exclude_embeddings leaves out only the
    nn.Embedding, so an untied head stays in its count, as the docstrings say."""
    cfg = get_preset("fox-pro-tiny", vocab_size=101, tie_embeddings=tied)
    model = FoxForCausalLM(cfg)
    head = 0 if tied else cfg.vocab_size * cfg.hidden_size
    assert model.num_parameters(exclude_embeddings=True) == count_non_embedding(cfg) + head
    assert model.num_parameters() == count_non_embedding(cfg) + count_embedding(cfg)


@pytest.mark.parametrize("name", sorted(n for n in PRESETS if n.endswith("tiny") and not n.startswith("linear")))
def test_softmax_attention_flops_are_the_papers(name):
    cfg = get_preset(name, vocab_size=101)
    assert training_flops_per_token(cfg, 128) == 3 * (2 * count_non_embedding(cfg) + 2 * 2 * 64 * 128)


@pytest.mark.parametrize("context", [16, 64, 1000, 4096], ids=lambda t: f"context-{t}")
def test_linear_attention_flops_are_the_chunked_ops_matmuls(context):
    """The softmax term grows with the context; the chunked linear op does not: its FLOPs per token are the
    matmuls it runs (counted here by torch), whatever the context beyond one chunk."""
    from torch.utils.flop_counter import FlopCounterMode

    from foxformer.ops import gated_linear_attention

    cfg = get_preset("linear-pro-tiny", vocab_size=101)
    H, D = cfg.num_heads, cfg.head_dim
    T = min(context, 256)  # past one chunk every token costs the same: no need to run 4K tokens
    q, k, v = (torch.randn(1, T, H, D) for _ in range(3))
    with FlopCounterMode(display=False) as counter:
        gated_linear_attention(q, k, v, -torch.rand(1, T, H))
    per_token = counter.get_total_flops() / T
    want = 3 * (2 * count_non_embedding(cfg) + cfg.num_layers * per_token)
    assert training_flops_per_token(cfg, context) == pytest.approx(want, rel=1e-12)


def test_overrides_and_head_dim_override():
    cfg = get_preset("transformer-llama-125m", head_dim=64, vocab_size=1000)
    assert (cfg.head_dim, cfg.num_heads, cfg.vocab_size) == (64, 12, 1000)


HEAD_OVERRIDES = {
    "num_heads-rederives-head_dim": (dict(num_heads=8), (64, 8, 8)),
    "head_dim-rederives-num_heads": (dict(head_dim=32), (64, 2, 32)),
    "hidden_size-keeps-the-family-head_dim": (dict(hidden_size=128), (128, 8, 16)),
    "hidden_size-and-num_heads": (dict(hidden_size=128, num_heads=2), (128, 2, 64)),
    "both-given-are-taken-as-is": (dict(num_heads=2, head_dim=48), (64, 2, 48)),
}


@pytest.mark.parametrize("overrides,expected", list(HEAD_OVERRIDES.values()), ids=list(HEAD_OVERRIDES))
def test_head_overrides_keep_the_attention_width_equal_to_hidden_size(overrides, expected):
    """get_preset("fox-llama-tiny", num_heads=8) kept the preset's head_dim 16: 8 x 16 = 128-wide attention on a
    64-wide model, built without a word. Only an explicit pair (num_heads and head_dim) decouples the widths."""
    cfg = get_preset("fox-llama-tiny", **overrides)
    assert (cfg.hidden_size, cfg.num_heads, cfg.head_dim) == expected
    FoxForCausalLM(cfg)


PRO_SHAPE_OVERRIDES = {
    "hidden_size": dict(hidden_size=128),
    "mlp_ratio": dict(mlp_ratio=8.0),
    "wider-attention": dict(num_heads=8, head_dim=16),
}


@pytest.mark.parametrize("kind", ["fox-pro", "transformer-pro", "linear-pro"])
@pytest.mark.parametrize("overrides", list(PRO_SHAPE_OVERRIDES.values()), ids=list(PRO_SHAPE_OVERRIDES))
def test_pro_mlp_width_follows_shape_overrides(kind, overrides):
    """A Pro preset fixes intermediate_size for its own shape: `--model mlp_ratio=8` on fox-pro-tiny was accepted,
    recorded in the run's card, and never read (the MLP stayed 168 wide), and hidden_size=128 kept the MLP of the
    64-wide model. The width is chosen again so that the Pro model matches its LLaMA counterpart."""
    base = get_preset(f"{kind}-tiny")
    pro = get_preset(f"{kind}-tiny", **overrides)
    llama = get_preset(f"{kind.replace('linear', 'fox').replace('pro', 'llama')}-tiny", **overrides)
    assert pro.intermediate_size != base.intermediate_size
    assert abs(count_non_embedding(pro) / count_non_embedding(llama) - 1) < 0.01
    assert get_preset(f"{kind}-tiny", **overrides, intermediate_size=100).intermediate_size == 100


@pytest.mark.parametrize("preset", ["fox-pro-small", "fox-pro-125m"])
def test_another_split_of_the_same_attention_width_keeps_the_pro_mlp(preset):
    """docs/results.md's head-dim runs (`fox-pro-small:head_dim=128`, `fox-pro-125m:head_dim=128`) trained the
    preset's MLP width: rerunning their commands must build the same models."""
    assert get_preset(preset, head_dim=128).intermediate_size == get_preset(preset).intermediate_size


def test_sized_config_takes_overrides_as_get_preset_does():
    from foxformer.models import sized_config

    assert sized_config("fox-pro", 2, 64, mlp_ratio=8.0).to_dict() == get_preset("fox-pro-tiny", mlp_ratio=8.0).to_dict()
    with pytest.raises(ValueError, match="did you mean 'mlp_ratio'"):
        sized_config("fox-pro", 2, 64, mlp_ration=8.0)


@pytest.mark.parametrize("overrides,match", [
    (dict(num_heads=5), r"num_heads \(5\) must divide hidden_size \(64\)"),
    (dict(head_dim=48), r"head_dim \(48\) must divide hidden_size \(64\)"),
    (dict(hidden_size=72), r"head_dim \(16\) must divide hidden_size \(72\)"),
], ids=["num_heads", "head_dim", "hidden_size"])
def test_head_overrides_that_do_not_divide_hidden_size_raise(overrides, match):
    with pytest.raises(ValueError, match=match):
        get_preset("fox-llama-tiny", **overrides)


@pytest.mark.parametrize("build, where, reason, fields", [
    (lambda: FoxConfig(hidden_size=64, num_heads=4, num_kv_heads=3), "FoxConfig.",
     "num_heads (4) must be a multiple of num_kv_heads (3)", ("num_heads", "num_kv_heads")),
    (lambda: FoxConfig(qk_norm=True, evict_max_len=0), "FoxConfig.",
     "evict_max_len: expected a positive integer or None", ("evict_max_len",)),
    (lambda: get_preset("fox-pro-tiny", num_heads=3), "get_preset: ", "num_heads (3) must divide hidden_size (64); ",
     ("num_heads", "hidden_size")),
    (lambda: sized_config("fox-pro", 2, 64, head_dim=48), "sized_config: ", "head_dim (48) must divide hidden_size",
     ("head_dim", "hidden_size")),
    (lambda: sized_config("fox-pro", 0, 64), "sized_config: ", "num_layers must be a positive int, got 0",
     ("num_layers",)),
    (lambda: get_preset("fox-pro-tiny", num_head=8), "model: ", "unknown model key 'num_head' (did you mean",
     ("num_head",)),
], ids=["foxconfig", "eviction", "get-preset", "sized-config", "sized-config-size", "unknown-key"])
def test_a_refused_setting_says_which_fields(build, where, reason, fields):
    """The CLIs found the field an error was about by cutting "FoxConfig." off its text (and missed get_preset's);
    ConfigError carries the fields, and the reason apart from the name of what refused it."""
    with pytest.raises(ConfigError) as caught:
        build()
    error = caught.value
    assert isinstance(error, ValueError) and str(error).startswith(where + reason)
    assert (error.where, error.reason[:len(reason)], error.fields) == (where, reason, fields)
    again = pickle.loads(pickle.dumps(error))  # as from a worker process
    assert (str(again), again.reason, again.fields) == (str(error), error.reason, fields)


@pytest.mark.parametrize("preset", ["fox-pro-tiny", "fox-llama-tiny"])
@pytest.mark.parametrize("overrides, field", [
    (dict(hidden_size=None), "hidden_size"),
    (dict(num_heads={"a": 1}), "num_heads"),
    (dict(head_dim=[64]), "head_dim"),
    (dict(num_heads=None, head_dim=None), "num_heads"),
    (dict(num_heads="abc", head_dim="abc"), "num_heads"),
])
def test_a_width_of_the_wrong_type_is_a_config_error_naming_it(preset, overrides, field):
    """The widths a preset derives others from were multiplied before any check: a bare TypeError ("unsupported
    operand type(s) for *: 'float' and 'NoneType'"), which training reported as a "bad override" of no key."""
    with pytest.raises(ConfigError) as caught:
        get_preset(preset, **overrides)
    assert caught.value.fields[0] == field
    assert caught.value.reason.startswith(f"{field} must be a positive int, got ")


@pytest.mark.parametrize("bad,match", [
    (dict(attention="mamba"), "attention"),
    (dict(attention="linear", fgate="none"), "fgate must not be 'none'"),
    (dict(attention="linear", evict_eps=1e-3), "evict_eps must be None"),
    (dict(attention="linear", prune_eps=1e-3), "prune_eps must be None"),
    (dict(fgate="sometimes"), "fgate"),
    (dict(fgate="datadependent"), r"got 'datadependent' \(did you mean 'data_dependent'\?\)"),
    (dict(attention="forgeting"), r"got 'forgeting' \(did you mean 'forgetting'\?\)"),
    (dict(attention="softmax", fgate="data_dependent"), "fgate"),
    (dict(num_heads=12, num_kv_heads=5), "num_kv_heads"),
    (dict(attention_backend="cuda"), "attention_backend"),
    (dict(fgate_tmin=10.0, fgate_tmax=2.0), "fgate_tmin"),
    (dict(fgate_bias_init="timescale"), "did you mean 'timescales'"),
    (dict(fgate="fixed", fgate_bias_init="zero"), "freeze f = 0.5"),
    (dict(attention="softmax", fgate="none", fgate_bias_init="zero"), "no forget gate"),
    (dict(hidden_size=0), "hidden_size"),
])
def test_bad_config_raises(bad, match):
    with pytest.raises(ValueError, match=match):
        FoxConfig(**bad)


UNREAD = {
    "fgate_tmin-zero-started-gate": ("fox-pro-tiny", dict(fgate_tmin=4.0), "fgate_tmin"),
    "fgate_tmax-no-gate": ("transformer-llama-tiny", dict(fgate_tmax=100.0), "fgate_tmax"),
    "rope_theta-without-rope": ("fox-pro-tiny", dict(rope_theta=10000.0), "rope_theta"),
    "qk_norm_per_head-without-qk_norm": ("fox-llama-tiny", dict(qk_norm_per_head=True), "qk_norm_per_head"),
    "prune_eps-softmax": ("transformer-pro-tiny", dict(prune_eps=1e-3), "prune_eps"),
    "evict_eps-softmax": ("transformer-llama-tiny", dict(evict_eps=1e-3, evict_qk_bound=10.0), "evict_eps"),
    "prune_eps-fox-without-gate": ("fox-llama-tiny", dict(fgate="none", prune_eps=1e-3), "prune_eps"),
    "evict_eps-fox-without-gate": ("fox-pro-tiny", dict(fgate="none", evict_eps=1e-3), "evict_eps"),
}


@pytest.mark.parametrize("preset,overrides,name", list(UNREAD.values()), ids=list(UNREAD))
def test_settings_the_model_never_reads_are_refused(preset, overrides, name):
    """Each was accepted, saved in the run's config and card, and never read by the model built: the zero-started
    gate ignores the timescales, FoX without RoPE its theta, softmax attention (a Transformer's, or FoX's with
    fgate="none") pruning and eviction (it never forgets, so no key is provably negligible)."""
    with pytest.raises(ValueError, match=f"FoxConfig.{name}"):
        get_preset(preset, **overrides)


@pytest.mark.parametrize("preset,overrides", [
    ("fox-pro-tiny", dict(fgate_bias_init="timescales", fgate_tmin=4.0)),
    ("fox-llama-tiny", dict(fgate="fixed", fgate_tmax=100.0)),
    ("fox-pro-tiny", dict(rope=True, rope_theta=10000.0)),
    ("fox-pro-tiny", dict(qk_norm_per_head=True)),
    ("transformer-llama-tiny", dict(rope=False)),
], ids=["timescales", "fixed-gate", "rope", "per-head-qk-norm", "transformer-nope"])
def test_the_same_settings_where_they_are_read_are_taken(preset, overrides):
    cfg = get_preset(preset, **overrides)
    assert all(getattr(cfg, k) == v for k, v in overrides.items())


def test_unknown_preset_raises():
    with pytest.raises(ValueError, match="unknown preset"):
        get_preset("fox-llama-7b")


def test_config_aliases_for_transformers():
    cfg = get_preset("fox-llama-tiny", tie_embeddings=True, num_kv_heads=2)
    assert cfg.num_hidden_layers == 2 and cfg.num_attention_heads == 4
    assert cfg.num_key_value_heads == 2 and cfg.tie_word_embeddings
    assert math.isclose(cfg.initializer_range, 0.02)


def test_hugging_face_names_given_to_the_constructor_shape_the_model_as_the_fields_do():
    """transformers set num_attention_heads & co. after __post_init__, which had derived head_dim and num_kv_heads
    from the default 12 heads: 24 heads became 24 x 64 wide (not 768) with GQA over 12, and hidden_size=64 with 4
    heads was refused for 12; initializer_range='2e-2' (YAML's reading) escaped the reading of numbers."""
    for given in ({"num_attention_heads": 24}, {"num_heads": 24}):
        cfg = FoxConfig(**given)
        assert (cfg.num_heads, cfg.head_dim, cfg.num_kv_heads) == (24, 32, 24)
    cfg = AutoConfig.for_model("foxformer", hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                               num_hidden_layers=3, fgate_bias_shift=[0.0, 1.0, 2.0], initializer_range="2e-2")
    assert (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.num_layers, cfg.init_std) == (4, 2, 16, 3, 0.02)
    saved = {**get_preset("fox-pro-tiny").to_dict(), "num_attention_heads": 2}
    del saved["num_heads"], saved["head_dim"], saved["num_kv_heads"]
    assert (FoxConfig.from_dict(saved).head_dim, FoxConfig.from_dict(saved, num_heads=8).head_dim) == (32, 8)
    with pytest.raises(ValueError, match="num_heads is given twice, as num_heads=4 and as num_attention_heads=8"):
        FoxConfig(hidden_size=64, num_heads=4, num_attention_heads=8)


def test_config_saved_with_the_removed_deterministic_attention_key_still_loads():
    # configs saved while the atomic attention backward existed carry this key
    cfg = FoxConfig.from_dict({**get_preset("fox-pro-tiny").to_dict(), "deterministic_attention": False})
    assert cfg.num_layers == get_preset("fox-pro-tiny").num_layers
    FoxForCausalLM(cfg)


def test_a_misspelled_key_warns_once_naming_the_field(monkeypatch):
    """transformers keeps any key as an attribute: FoxConfig(num_hiden_layers=2) built the default 12 layers."""
    monkeypatch.setattr(config_module, "_SAID_KEYS", set())
    with pytest.warns(UserWarning, match="'num_hiden_layers' is no field of FoxConfig.*did you mean "
                                         "'num_hidden_layers'") as said:
        cfg = FoxConfig(num_hiden_layers=2)
        FoxConfig(num_hiden_layers=2)
        FoxConfig.from_dict({**get_preset("fox-llama-tiny").to_dict(), "num_hiden_layers": 2})
    assert len(said) == 1 and said[0].filename == __file__  # pointed at the line building the config
    assert cfg.num_layers == 12
    with pytest.warns(UserWarning, match="'fgate_tmn' is no field.*did you mean 'fgate_tmin'"):
        FoxConfig(fgate_tmn=4.0)


def test_a_misspelled_override_at_loading_warns_instead_of_vanishing(tmp_path, monkeypatch):
    """transformers sets from_pretrained's overrides only where the config has the attribute: the others it drops."""
    monkeypatch.setattr(config_module, "_SAID_KEYS", set())
    get_preset("fox-llama-tiny", vocab_size=300).save_pretrained(tmp_path)
    with pytest.warns(UserWarning, match="'num_hiden_layers' is no field of FoxConfig; the override is ignored "
                                         r"\(did you mean 'num_hidden_layers'\?\)"):
        cfg = AutoConfig.from_pretrained(tmp_path, num_hiden_layers=1, num_hidden_layers=3)
    assert cfg.num_layers == 3


@pytest.mark.parametrize("key, field", [("n_embd", "hidden_size"), ("d_model", "hidden_size"),
                                        ("n_layer", "num_layers"), ("n_head", "num_heads"),
                                        ("n_inner", "intermediate_size"), ("n_positions", "max_position_embeddings")])
def test_another_librarys_name_of_a_field_warns_naming_the_field(tmp_path, monkeypatch, key, field):
    """GPT-2's and LLaMA's names are too far from the fields' for a "did you mean": FoxConfig(n_embd=64) built the
    768-wide default without a word. Warned of, as a misspelling is: a saved config carrying one still loads."""
    monkeypatch.setattr(config_module, "_SAID_KEYS", set())
    said = f"'{key}' is no field of FoxConfig; it is kept as an attribute that no model reads (FoxConfig calls it " \
           f"'{field}')"
    with pytest.warns(UserWarning, match=re.escape(said)):
        FoxConfig(**{key: 64})
    FoxForCausalLM(get_preset("fox-llama-tiny", vocab_size=300)).save_pretrained(tmp_path)
    monkeypatch.setattr(config_module, "_SAID_KEYS", set())
    with pytest.warns(UserWarning, match=re.escape(f"'{key}' is no field of FoxConfig; the override is ignored "
                                                   f"(FoxConfig calls it '{field}')")):
        AutoConfig.from_pretrained(tmp_path, **{key: 64})
    with pytest.raises(TypeError, match=re.escape(f"unknown keyword argument '{key}' (FoxConfig calls it '{field}')")):
        FoxForCausalLM.from_pretrained(tmp_path, **{key: 64})


def test_hugging_face_names_of_fields_are_read_as_them_without_a_word(monkeypatch):
    monkeypatch.setattr(config_module, "_SAID_KEYS", set())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cfg = FoxConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                        intermediate_size=128)
    assert (cfg.hidden_size, cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.intermediate_size) == \
        (64, 2, 4, 2, 128)


def test_a_tokenizers_keywords_pass_through_the_config_without_a_word(tmp_path, monkeypatch):
    """AutoTokenizer.from_pretrained (and pipeline() through it) hands AutoConfig its own keywords: FoxConfig said
    "'padding_side' is no field of FoxConfig; the override is ignored (did you mean 'hidden_size'?)", of bos_token,
    add_bos_token, model_max_length and pipeline's device_map alike, while the tokenizer took them."""
    from transformers import AutoTokenizer, pipeline

    monkeypatch.setattr(config_module, "_SAID_KEYS", set())
    FoxForCausalLM(get_preset("fox-llama-tiny", vocab_size=320, tokenizer="bytes")).save_pretrained(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tok = AutoTokenizer.from_pretrained(tmp_path, padding_side="right", add_bos_token=False, model_max_length=64,
                                            bos_token="<|endoftext|>")
        pipeline("text-generation", model=str(tmp_path), device_map="cpu")
    assert (tok.padding_side, tok.model_max_length) == ("right", 64)
    with pytest.warns(UserWarning, match="'num_hiden_layers' is no field of FoxConfig"):  # a config's own reading
        AutoConfig.from_pretrained(tmp_path, num_hiden_layers=1)


def test_keys_transformers_reads_or_saved_configs_carry_and_far_ones_are_silent(tmp_path, monkeypatch):
    monkeypatch.setattr(config_module, "_SAID_KEYS", set())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        # torch_dtype is close to dtype, num_beams to num_heads: transformers takes both out of the config itself
        cfg = FoxConfig(torch_dtype="bfloat16", num_beams=4, auto_map={}, my_own_note="kept")
        assert cfg.my_own_note == "kept" and cfg.dtype == torch.bfloat16
        model = FoxForCausalLM(get_preset("fox-llama-tiny", vocab_size=300))
        model.save_pretrained(tmp_path)
        AutoConfig.from_pretrained(tmp_path)
        AutoConfig.from_pretrained(tmp_path, trust_remote_code=True)
        FoxConfig.from_dict({**get_preset("fox-pro-tiny").to_dict(), "deterministic_attention": False})


@pytest.mark.parametrize("build", [
    pytest.param(lambda **kw: get_preset("fox-pro-tiny", **kw), id="get-preset"),
    pytest.param(lambda **kw: sized_config("fox-pro", 2, 64, **kw), id="sized-config"),
])
@pytest.mark.parametrize("key, hint", [
    pytest.param("colour", "", id="far-from-every-field"),
    pytest.param("num_head", " (did you mean 'num_heads'?)", id="close-to-a-field"),
    pytest.param("n_embd", " (FoxConfig calls it 'hidden_size')", id="another-librarys-name"),
])
def test_an_override_that_is_no_field_is_refused_listing_the_fields(build, key, hint):
    """FoxConfig (a Hugging Face config) keeps any key as an attribute, and warns only of one close to a field:
    an override is what the user means to train, so any unknown one is an error (saved configs' extra keys are
    the loading's, above)."""
    said = f"model: unknown model key {key!r}{hint}; FoxConfig keys: {', '.join(model_keys())}"
    with pytest.raises(ValueError, match=f"^{re.escape(said)}$"):
        build(**{key: 1})


NAN, INF = float("nan"), float("inf")
NON_FINITE = {
    "init_std-nan": dict(init_std=NAN),
    "init_std-inf": dict(init_std=INF),
    "rope_theta-nan": dict(rope=True, rope_theta=NAN),
    "rope_theta-inf": dict(rope=True, rope_theta=INF),
    "rms_norm_eps-nan": dict(rms_norm_eps=NAN),
    "fgate_tmax-inf": dict(fgate="fixed", fgate_tmax=INF),
    "fgate_bias_shift-nan": dict(fgate_bias_shift=NAN),
    "fgate_bias_shift-inf-in-a-list": dict(num_layers=2, fgate_bias_shift=[0.0, [1.0, INF]]),
    "evict_qk_bound-nan": dict(evict_qk_bound=NAN),
    "evict_qk_bound-inf": dict(evict_qk_bound=INF),
    "max_position_embeddings-negative": dict(max_position_embeddings=-5),
    "max_position_embeddings-float": dict(max_position_embeddings=2048.5),
    "evict_max_len-float": dict(evict_max_len=2.5),
}


@pytest.mark.parametrize("bad", list(NON_FINITE.values()), ids=list(NON_FINITE))
def test_non_finite_or_non_integer_values_are_rejected(bad):
    """NaN passes every `x <= 0` test: a NaN init_std / rms_norm_eps / rope_theta, an infinite fgate_tmax
    (a NaN fixed gate) or a NaN eviction bound were accepted, and the model failed (or gave NaN) later."""
    name = next(k for k in bad if k not in ("rope", "fgate", "num_layers", "num_heads"))
    with pytest.raises(ValueError, match=name):
        FoxConfig(**{"hidden_size": 32, "num_heads": 2, **bad})


def test_numbers_yaml_reads_as_strings_are_read_as_numbers():
    """YAML 1.1 reads 1e-5 (no dot) as a string: `--model rms_norm_eps=1e-5` or `init_std: 2e-2` in a config file
    failed with "'<' not supported between instances of 'int' and 'str'"."""
    import yaml

    cfg = FoxConfig(hidden_size=32, num_heads=2, **{k: yaml.safe_load(v) for k, v in [
        ("rms_norm_eps", "1e-5"), ("init_std", "2e-2"), ("prune_eps", "1e-3"), ("mlp_ratio", "3")]})
    assert (cfg.rms_norm_eps, cfg.init_std, cfg.prune_eps, cfg.mlp_ratio) == (1e-5, 2e-2, 1e-3, 3)
    assert cfg.qk_norm_eps == 1e-5 and cfg.intermediate_size == 64


@pytest.mark.parametrize("bad", [dict(rope_theta="abc"), dict(mlp_ratio="abc"), dict(init_std=True),
                                 dict(evict_eps=[0.1]), dict(mlp_ratio=0.0), dict(mlp_ratio=-4.0), dict(mlp_ratio=NAN)],
                         ids=["string", "mlp_ratio-string", "bool", "list", "mlp_ratio-zero", "mlp_ratio-negative",
                              "mlp_ratio-nan"])
def test_non_numbers_are_one_error_naming_the_field(bad):
    (name,) = bad
    with pytest.raises(ValueError, match=f"FoxConfig.{name} must be"):
        FoxConfig(hidden_size=32, num_heads=2, **bad)


BAD_TOKEN_IDS = {
    "eos-past-the-vocabulary": (dict(eos_token_id=64), "eos_token_id", "got 64"),
    "pad-negative": (dict(pad_token_id=-1), "pad_token_id", "got -1"),
    "bos-string": (dict(bos_token_id="1"), "bos_token_id", "got '1'"),
    "bos-float": (dict(bos_token_id=1.0), "bos_token_id", "got 1.0"),
    "pad-bool": (dict(pad_token_id=False), "pad_token_id", "got False"),
    "eos-list-with-a-bad-id": (dict(eos_token_id=[1, 99]), "eos_token_id", "got [1, 99]"),
    "eos-empty-list": (dict(eos_token_id=[]), "eos_token_id", "got []"),
    "bos-list": (dict(bos_token_id=[1]), "bos_token_id", "got [1]"),
    "tokenizer-end-of-document-past-the-vocabulary": (
        dict(tokenizer="bytes"), "bos_token_id", "got 256 (the end-of-document token of tokenizer 'bytes')"),
}


@pytest.mark.parametrize("bad, name, got", list(BAD_TOKEN_IDS.values()), ids=list(BAD_TOKEN_IDS))
def test_token_ids_outside_the_vocabulary_or_not_ints_are_refused(bad, name, got):
    """An eos id the model cannot emit never stopped generation, and a bos or pad id past the vocabulary was
    blamed on the input_ids when fed, far from the config that held it."""
    with pytest.raises(ValueError, match=re.escape(f"FoxConfig.{name} must be a token id in [0, vocab_size=64)")
                       + f".* {re.escape(got)}$"):
        FoxConfig(vocab_size=64, hidden_size=32, num_heads=2, **bad)


def test_token_ids_in_the_vocabulary_none_or_an_eos_list_are_taken():
    cfg = FoxConfig(vocab_size=64, hidden_size=32, num_heads=2, bos_token_id=0, eos_token_id=[63, 5], pad_token_id=None)
    assert (cfg.bos_token_id, cfg.eos_token_id, cfg.pad_token_id) == (0, [63, 5], None)
    cfg = FoxConfig(vocab_size=257, hidden_size=32, num_heads=2, tokenizer="bytes")
    assert (cfg.bos_token_id, cfg.eos_token_id, cfg.pad_token_id) == (256, 256, 256)
    again = FoxConfig.from_dict(cfg.to_dict())  # a saved config loads as it was written
    assert (again.bos_token_id, again.eos_token_id, again.pad_token_id) == (256, 256, 256)
    for name in PRESETS:
        get_preset(name, tokenizer="gpt2")  # every preset's vocabulary holds GPT-2's end of text


def test_num_heads_must_divide_hidden_size_when_head_dim_is_derived():
    """head_dim=None means hidden_size // num_heads: with 5 heads on 64 dims that silently built 5 x 12 = 60-wide
    attention (4 dims of every token dropped by q/k/v and o_proj). An explicit head_dim still decouples them."""
    with pytest.raises(ValueError, match="num_heads"):
        FoxConfig(hidden_size=64, num_heads=5)
    cfg = FoxConfig(hidden_size=64, num_heads=5, head_dim=16)  # explicit: attention width 80 is intended
    assert cfg.head_dim == 16
    assert FoxConfig(hidden_size=64, num_heads=4).head_dim == 16


@pytest.mark.parametrize("flag", ["rope", "qk_norm", "output_gate", "output_norm", "kv_shift", "tie_embeddings",
                                  "gradient_checkpointing"])
def test_switches_must_be_bools(flag):
    """A string is truthy: rope="false" (a hand-edited config.json, from_pretrained(..., rope="false")) turned
    RoPE on without a word."""
    with pytest.raises(ValueError, match=flag):
        FoxConfig(hidden_size=32, num_heads=2, **{flag: "false"})
    assert getattr(FoxConfig(hidden_size=32, num_heads=2, **{flag: False}), flag) is False


def test_sized_config_is_the_named_presets_rule_at_any_size():
    from foxformer.models import sized_config
    from foxformer.models.presets import KINDS, SIZES

    for kind in KINDS:
        for size, (layers, d) in SIZES.items():
            assert sized_config(kind, layers, d).to_dict() == get_preset(f"{kind}-{size}").to_dict()
    # an unnamed size stays matched: Pro within 2% of the LLaMA block of its family
    for family in ("fox", "transformer"):
        llama = count_non_embedding(sized_config(f"{family}-llama", 2, 256))
        assert abs(count_non_embedding(sized_config(f"{family}-pro", 2, 256)) / llama - 1) < 0.02
    with pytest.raises(ValueError, match="unknown model kind"):
        sized_config("fox-gpt", 2, 64)


@pytest.mark.parametrize("name", list(PRESETS))
def test_every_preset_builds_and_runs_on_the_meta_device(name):
    """FoX presets failed there (the op's value checks called Tensor.item()); the Transformer ones did not."""
    with torch.device("meta"):
        model = FoxForCausalLM(get_preset(name))
        ids = torch.zeros(2, 16, dtype=torch.long)
        out = model(ids, labels=ids)
    assert out.logits.is_meta and out.logits.shape == (2, 16, model.config.vocab_size) and out.loss.is_meta


@pytest.mark.parametrize("value, hint", [
    # True was told "'none' for no gate", the opposite of what it asked for
    (True, "got True (a bool, as YAML reads on / yes / true; for a forget gate name its kind: 'data_dependent', the "
           "default, 'data_independent' or 'fixed')"),
    (False, "got False (a bool, as YAML reads off / no / false; for no forget gate give 'none')"),
], ids=["true", "false"])
def test_a_boolean_gate_kind_gets_the_hint_of_its_meaning(value, hint):
    """FoxConfig(fgate=True) from Python and `fgate: on` from YAML reach the check alike; each bool is told the names
    that mean it."""
    with pytest.raises(ValueError) as e:
        FoxConfig(fgate=value)
    assert str(e.value).endswith(hint)
    for name in ("data_dependent", "data_independent", "fixed") if value else ("none",):
        FoxConfig(fgate=name)  # the names the hint gives are taken
