"""Named presets "{fox,transformer}-{llama,pro}-{tiny,small,125m,360m,760m,1.3b}" and parameter counting, plus the
recurrent baseline "linear-pro-{size}": the FoX (Pro) preset of that size with gated linear attention.

Pro presets shrink the SwiGLU width so that their non-embedding parameter count stays within 1%
of the LLaMA preset of the same family and size (the paper's protocol). ``foxformer presets`` prints the counts
(not ``python -m`` on this module: the package imports it first, and runpy warns of the second copy).
"""
from __future__ import annotations

from ..argtypes import did_you_mean
from .config import ConfigError, FoxConfig, field_hint, is_positive_int

# (num_layers, hidden_size); tiny is for CPU tests; small (~25M non-embedding parameters) is the size of
# the one-GPU reproduction in docs/results.md, chosen to train ~100M+ tokens in minutes on an H200; 1.3b (GPT-3
# XL's shape) is the size docs/architecture.md's multi-GPU estimate goes up to.
SIZES = {"tiny": (2, 64), "small": (8, 512), "125m": (12, 768), "360m": (24, 1024), "760m": (24, 1536),
         "1.3b": (24, 2048)}
# Head dims: FoX 64 (the paper's at every size), Transformer 128 (the paper's at 760M; its 125M and 360M
# Transformers use 64), capped so that FoX keeps at least 4 heads and the Transformer 2 (tiny: 16 and 32). FoX (Pro)
# 125M trains 1.14x faster with head_dim=128 (H200, 16K, docs/benchmarks.md "Whole models"), and FoX (Pro) small
# reads 0.136 nats lower with it over three seeds (docs/results.md, "Head dim (Pro block)"); at 125M three seeds
# separate the two neither way (+0.033 [-0.120, +0.163] nats for 128: "Head dim at 125M"), so 64, the paper's
# choice, stays the default.
HEAD_DIM = {"fox": 64, "transformer": 128}
MIN_HEADS = {"fox": 4, "transformer": 2}
FAMILIES = ("fox", "transformer")
BLOCKS = ("llama", "pro")
PRO_MLP_MULTIPLE = 32  # 8 below d = 256 (tiny), where 32 would move the count by several percent


def count_non_embedding(cfg: FoxConfig) -> int:
    """Non-embedding parameters of FoxForCausalLM(cfg): everything but the token embedding and the LM head (the
    paper's N). transformers' ``num_parameters(exclude_embeddings=True)`` leaves out only nn.Embedding weights, so it
    counts an untied LM head too; FoxForCausalLM.num_parameters_non_embedding counts as this does."""
    d, h, hkv, dh, inter = (cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim,
                            cfg.intermediate_size)
    attn = d * h * dh * 2 + d * hkv * dh * 2
    if cfg.has_fgate:
        attn += {"data_dependent": d * h + h, "data_independent": h, "fixed": 0}[cfg.fgate]
    if cfg.qk_norm:
        attn += (h + hkv) * dh if cfg.qk_norm_per_head else 2 * dh
    attn += (int(cfg.k_shift) + int(cfg.v_shift)) * d * hkv
    if cfg.output_norm:
        attn += h * dh
    if cfg.output_gate:
        attn += d * h * dh
    block = attn + 3 * d * inter + 2 * d
    return cfg.num_layers * block + d


def count_embedding(cfg: FoxConfig) -> int:
    """The token embedding's parameters and the LM head's, counted once where they are tied."""
    return cfg.vocab_size * cfg.hidden_size * (1 if cfg.tie_embeddings else 2)


def attention_flops_per_token(cfg, context: int) -> float:
    """Forward FLOPs per token of the attention products (those not counted by the parameters), all layers.

    Softmax and forgetting attention: the paper's 2 * n_layers * d_model * T (QK^T and AV, averaged over the
    causal positions). Gated linear attention never forms a T x T matrix: its chunked op (C = min(chunk,
    T) tokens a chunk) costs per token and layer 2 * 2 * C * d_attn for the two C x C products inside the
    chunk (computed in full: the causal mask zeroes, it does not skip work) plus 2 * 2 * d_head * d_attn for
    the state products (the chunk's k^T v and q against the state it starts with), d_attn = n_heads *
    d_head (GQA expands k and v to every query head). Counting the softmax term for it would overstate its
    FLOPs, and MFU, more the longer the context. ``cfg``: a FoxConfig, or any config with these fields.
    """
    layers = getattr(cfg, "num_layers", 0)
    if getattr(cfg, "attention", None) == "linear":
        from foxformer.ops.gated_linear_attn.interface import CHUNK_SIZE

        d_attn = cfg.num_heads * cfg.head_dim
        return layers * (2 * 2 * min(CHUNK_SIZE, context) * d_attn + 2 * 2 * cfg.head_dim * d_attn)
    return 2 * layers * getattr(cfg, "hidden_size", 0) * context


def training_flops_per_token(cfg: FoxConfig, context: int) -> float:
    """Training FLOPs per token, 3 * (2N + attention_flops_per_token): the paper's 3 * (2N + 2 * n_layers *
    d_model * T) for softmax and forgetting attention, the chunked op's own count for gated linear attention.
    N is count_non_embedding's, so the LM head's product (6 * d_model * vocab_size a token) is left out, as the
    paper leaves it: an MFU of these FLOPs reads lower than one that counts it (for FoX (Pro) 125M at 16K the head
    adds 16% to these FLOPs, and to the MFU as much)."""
    return 3.0 * (2 * count_non_embedding(cfg) + attention_flops_per_token(cfg, context))


def _base(family: str, layers: int, d: int) -> dict:
    head_dim = min(HEAD_DIM[family], d // MIN_HEADS[family])
    fields = dict(num_layers=layers, hidden_size=d, num_heads=d // head_dim, head_dim=head_dim)
    if family == "fox":
        fields.update(attention="forgetting", fgate="data_dependent", rope=False)
    else:
        fields.update(attention="softmax", fgate="none", rope=True, rope_theta=500000.0)
    return fields


# The Pro additions, and the fields that decide how wide the Pro MLP must be to match the LLaMA block's count.
PRO_BLOCK = dict(qk_norm=True, output_gate=True, output_norm=True, kv_shift=True)
# kv_shift as a built config holds it: k_shift and v_shift (each may be set alone)
_PRO_FIELDS = ("qk_norm", "output_gate", "output_norm", "k_shift", "v_shift")


def block_of(config) -> str | None:
    """The block of a built config: "pro" (every Pro addition), "llama" (none), None (some only: no preset's)."""
    on = [bool(getattr(config, name)) for name in _PRO_FIELDS]
    return "pro" if all(on) else "llama" if not any(on) else None
_WIDTH_INPUTS = ("hidden_size", "num_heads", "num_kv_heads", "head_dim", "mlp_ratio")


def _pro_intermediate(fields: dict) -> int:
    """SwiGLU width of the Pro block whose non-embedding count matches the LLaMA block with the same ``fields``
    (width, heads, mlp_ratio, attention and gate; the LLaMA block's width follows mlp_ratio)."""
    shape = {k: fields[k] for k in ("num_layers", "attention", "fgate", *_WIDTH_INPUTS) if k in fields}
    layers, d = shape["num_layers"], shape["hidden_size"]
    target = count_non_embedding(FoxConfig(**shape))
    without_mlp = count_non_embedding(FoxConfig(**shape, **PRO_BLOCK, intermediate_size=1)) - 3 * d * layers
    exact = (target - without_mlp) / (3 * d * layers)
    multiple = PRO_MLP_MULTIPLE if d >= 256 else 8
    return max(multiple, int(round(exact / multiple)) * multiple)


def _kind_fields(kind: str, layers: int, d: int) -> dict:
    """Fields of "{fox,transformer}-{llama,pro}" or "linear-pro" at num_layers=layers, hidden_size=d."""
    family, _, block = kind.partition("-")
    if family == "linear" and block == "pro":
        # FoX (Pro) without the softmax: the same parameters, so it is compared with fox-llama as well
        return dict(_kind_fields("fox-pro", layers, d), attention="linear")
    if family not in FAMILIES or block not in BLOCKS:
        raise ValueError(f"unknown model kind {kind!r}: expected one of {KINDS}")
    fields = _base(family, layers, d)
    if block == "pro":
        fields.update(PRO_BLOCK, intermediate_size=_pro_intermediate(fields))
    return fields


def _preset_fields(name: str) -> dict:
    kind, _, size = name.rpartition("-")
    if kind not in KINDS or size not in SIZES:
        raise ValueError(f"unknown preset {name!r}: expected one of {PRESET_NAMES}")
    return _kind_fields(kind, *SIZES[size])


def sized_config(kind: str, num_layers: int, hidden_size: int, **overrides) -> FoxConfig:
    """FoxConfig of a preset family at any size: ``kind`` is a preset name without its size ("fox-pro",
    "transformer-llama", "linear-pro"); head dims and the Pro blocks' SwiGLU width follow the rules of the
    named presets, so that the families stay matched in parameters at this size too."""
    for name, value in (("num_layers", num_layers), ("hidden_size", hidden_size)):
        if not is_positive_int(value):
            raise ConfigError(f"{name} must be a positive int, got {value!r}", name, where="sized_config: ")
    check_model_keys(overrides)
    return FoxConfig(**_overridden(_kind_fields(kind, num_layers, hidden_size), overrides, "sized_config"))


KINDS = tuple(f"{f}-{b}" for f in FAMILIES for b in BLOCKS) + ("linear-pro",)
PRESET_NAMES = tuple(f"{f}-{b}-{s}" for f in FAMILIES for b in BLOCKS for s in SIZES) + \
    tuple(f"linear-pro-{s}" for s in SIZES)
PRESETS: dict[str, dict] = {name: _preset_fields(name) for name in PRESET_NAMES}


def get_preset(name: str, **overrides) -> FoxConfig:
    """FoxConfig of a named preset, with any field overridden (e.g. vocab_size, attention_backend).

    A preset's num_heads and head_dim are derived from its width, so overriding one of num_heads, head_dim or
    hidden_size re-derives the other head field to keep num_heads * head_dim == hidden_size (hidden_size alone
    keeps the family's head_dim); only an explicit num_heads and head_dim together decouple the two widths.
    A Pro preset's SwiGLU width, fixed for its own shape, is chosen again where hidden_size, mlp_ratio or the
    attention width (num_heads * head_dim) changes, so that it still matches the LLaMA preset with the same
    overrides (another split of the same attention width keeps it); an explicit intermediate_size is kept.
    """
    check_preset(name)
    check_model_keys(overrides)
    return FoxConfig(**_overridden(PRESETS[name], overrides, "get_preset"))


def _attention_width(fields: dict) -> int | None:
    """None where a width it is made of is no positive int: FoxConfig names that field."""
    heads, head_dim, hidden = (fields.get(name) for name in ("num_heads", "head_dim", "hidden_size"))
    if not all(is_positive_int(v) for v in (heads, head_dim or 1, hidden)):
        return None
    return heads * (head_dim or hidden // heads)


def _overridden(preset: dict, overrides: dict, caller: str) -> dict:
    """A preset's fields with ``overrides``, the fields derived from the overridden ones derived again; ``caller``
    names the function in an error."""
    fields = {**preset, **overrides}
    if "num_heads" in overrides and "head_dim" not in overrides:
        _derive_head_field(fields, caller, given="num_heads", derived="head_dim")
    elif "num_heads" not in overrides and ("head_dim" in overrides or "hidden_size" in overrides):
        _derive_head_field(fields, caller, given="head_dim", derived="num_heads")
    # The Pro width was computed for the preset's shape: kept, a wider model (or an mlp_ratio, which the fixed
    # width would leave unread) trained an MLP out of proportion to it and unmatched to its LLaMA counterpart.
    # Another split of the same attention width moves the count by a few per-head weights and keeps the width:
    # the head-dim runs of docs/results.md (`fox-pro-small:head_dim=128`, "Head dim (Pro block)") trained with it.
    pro = preset.get("intermediate_size") is not None and "intermediate_size" not in overrides
    attention_width = _attention_width(fields) != _attention_width(preset)
    if pro and ({"hidden_size", "mlp_ratio"} & set(overrides) or attention_width):
        fields["intermediate_size"] = _pro_intermediate(fields)
    return fields


def check_preset(name: str) -> None:
    """ValueError for an unknown preset name, with the closest one."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}{did_you_mean(name, PRESETS)}: expected one of {sorted(PRESETS)}")


def model_keys() -> list[str]:
    """The FoxConfig fields a preset may override (FoxConfig's own, not PretrainedConfig's)."""
    return [name for name in FoxConfig.__annotations__ if not name.startswith("_")]


def check_model_keys(keys, where: str = "model") -> None:
    """ValueError for a key that is no FoxConfig field, with the closest one: FoxConfig (a Hugging Face config)
    keeps unknown keys as attributes, so `num_head=8` was stored and ignored while the preset's heads trained."""
    known = model_keys()
    for key in keys:
        if key not in known:
            raise ConfigError(f"unknown model key {key!r}{field_hint(key, known)}; FoxConfig keys: "
                              f"{', '.join(known)}", key, where=f"{where}: ")


def _derive_head_field(fields: dict, caller: str, given: str, derived: str) -> None:
    """fields[derived] = hidden_size // fields[given], refusing a remainder (the attention would silently be
    narrower or wider than the model)."""
    hidden, value = fields["hidden_size"], fields[given]
    if not all(is_positive_int(v) for v in (hidden, value)):
        return  # FoxConfig names the bad field
    if hidden % value:
        raise ConfigError(f"{given} ({value}) must divide hidden_size ({hidden}); give both num_heads and head_dim "
                          f"to decouple the attention width from hidden_size", given, "hidden_size",
                          where=f"{caller}: ")
    fields[derived] = hidden // value


def preset_table() -> list[dict]:
    """One row per preset: name, layers, d, heads, head_dim, mlp width, non-embedding params and the
    relative difference from the LLaMA preset of the same family and size."""
    rows = []
    for name in PRESETS:
        cfg = get_preset(name)
        family, block, size = name.split("-")
        ref = count_non_embedding(get_preset(f"{'fox' if family == 'linear' else family}-llama-{size}"))
        n = count_non_embedding(cfg)
        rows.append(dict(name=name, layers=cfg.num_layers, hidden=cfg.hidden_size, heads=cfg.num_heads,
                         head_dim=cfg.head_dim, intermediate=cfg.intermediate_size, non_embedding=n,
                         vs_llama=(n - ref) / ref))
    return rows


def main() -> None:
    print(f"{'preset':24s} {'L':>3s} {'d':>5s} {'H':>3s} {'Dh':>4s} {'mlp':>5s} {'non-emb':>12s} {'vs llama':>9s}")
    for r in preset_table():
        print(f"{r['name']:24s} {r['layers']:3d} {r['hidden']:5d} {r['heads']:3d} {r['head_dim']:4d} "
              f"{r['intermediate']:5d} {r['non_embedding']:12,d} {100 * r['vs_llama']:+8.2f}%")
    print("L layers, d width, H query heads, Dh head dim, mlp SwiGLU width; non-emb: parameters outside the "
          "token embedding and the LM head; vs llama: against the same family's LLaMA-block preset of that size "
          "(FoX's for linear-pro), which the Pro MLP's width is chosen to match")
