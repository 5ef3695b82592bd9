"""Checkpoints of the FoX paper's own code (github zhixuan-lin/forgetting-transformer) as foxformer models.

Their released models (``zhixuan-lin/{fox,transformer}-{pro,llama}-760m-longcrawl64-48b``) are Hugging Face
folders of two classes: ``forgetting_transformer-project_fox`` (FoX, and the Transformer (Pro), which is that class
with ``fgate_type="none"`` and RoPE) and ``transformer-project_fox`` (the Transformer (LLaMA)). What differs from
foxformer's layout, each checked against their modeling code:

- the SwiGLU input projection is one ``gate_proj`` [2I, d], gate rows first, then up rows; I comes from it;
- ``embeddings`` for ``embed_tokens``; ``fgate_proj`` (weight, bias) / ``fgate_bias`` for the forget gate;
  ``ogate_proj`` for the output gate; the shifted keys and values are ``k_proj.linear`` / ``k_proj.shift_proj``
  (their shift a = sigmoid(shift_proj x) weighs the previous token's projection, as ours);
- the output norm weight is [hidden], grouped by head: ours is [heads, head_dim];
- QK-norm: the released models share one [head_dim] weight between heads (``qk_norm_share_param_across_head``),
  their newer default is [hidden] per head; both with eps 1e-5, while the block norms use ``norm_eps``;
- keys and values shift each by their own switch (``use_k_shift``, ``use_v_shift``);
- the vocabulary is 50257 (GPT-2, unpadded) and the text is JSON-escaped: tokenizer ``gpt2-json``;
- ``max_position_embeddings`` is null: the converted config gets the training context of the released models,
  16384 (it only sets the eviction bound's N and the default harness window).

What has no exact equivalent is refused: their other baselines (Mamba-2, DeltaNet, HGRN2, Samba), the GLU MLP
(``hidden_act="sigmoid"``), the SiLU output gate without an output norm, sliding windows, GQA in their FoX class
(which itself refuses it), and any weight this mapping does not account for. Their adaptive computation pruning
(``log_pruning_tolerance``) becomes ``prune_eps = exp(tolerance)``: both bound the attention mass a row may lose.
"""
from __future__ import annotations

import json
import math
import os
import re
from typing import Optional

import torch

from ..data.layout import MANIFEST, prepared_dataset
from ..paths import RUN_FOLDER_FILES, check_export_dir, export_writer
from .config import ROPE_THETA_DEFAULT, FoxConfig
from .hub import download, is_hub_id
from .modeling import FoxForCausalLM

FOX_TYPE = "forgetting_transformer-project_fox"
TRANSFORMER_TYPE = "transformer-project_fox"
OTHER_TYPES = {"mamba2-project_fox": "Mamba-2", "delta_net-project_fox": "DeltaNet", "hgrn2-project_fox": "HGRN2",
               "samba-project_fox": "Samba"}
OFFICIAL_TYPES = (FOX_TYPE, TRANSFORMER_TYPE, *OTHER_TYPES)
# Their QK-norm modules are built without an eps argument: the default of their RMSNorm / GroupNorm.
QK_NORM_EPS = 1e-5
# The released models were trained at 16K tokens (REPRODUCE.md; configs/experiment/longcrawl64/*_48b.yaml).
TRAINING_CONTEXT = 16384
GPT2_VOCAB = 50257
FGATES = {"full": "data_dependent", "bias_only": "data_independent", "fixed": "fixed", "none": "none"}
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")

# official name (after "model.layers.N.") -> ours; None: derived buffers that are not weights
_LAYER_KEYS = {
    "attn_norm.weight": "attn_norm.weight", "mlp_norm.weight": "mlp_norm.weight",
    "attn.q_proj.weight": "attn.q_proj.weight", "attn.o_proj.weight": "attn.o_proj.weight",
    "attn.k_proj.weight": "attn.k_proj.weight", "attn.k_proj.linear.weight": "attn.k_proj.weight",
    "attn.v_proj.weight": "attn.v_proj.weight", "attn.v_proj.linear.weight": "attn.v_proj.weight",
    "attn.k_proj.shift_proj.weight": "attn.k_shift.proj.weight",
    "attn.v_proj.shift_proj.weight": "attn.v_shift.proj.weight",
    "attn.fgate_proj.weight": "attn.fgate.proj.weight", "attn.fgate_proj.bias": "attn.fgate.proj.bias",
    "attn.fgate_bias": "attn.fgate.bias", "attn.ogate_proj.weight": "attn.g_proj.weight",
    "attn.output_norm.weight": "attn.o_norm.weight",
    "attn.q_norm.weight": "attn.q_norm.weight", "attn.k_norm.weight": "attn.k_norm.weight",
    "mlp.down_proj.weight": "mlp.down_proj.weight", "attn.rotary.inv_freq": None,
}
_TOP_KEYS = {"model.embeddings.weight": "model.embed_tokens.weight", "model.norm.weight": "model.norm.weight",
             "lm_head.weight": "lm_head.weight"}
_LAYER = re.compile(r"model\.layers\.(\d+)\.(.+)")


def _refuse(src: str, why: str) -> ValueError:
    return ValueError(f"convert official: {src}: {why}")


def resolve_source(src: str) -> str:
    """A local folder as is; otherwise a Hugging Face Hub repository id, downloaded (needs the network)."""
    if os.path.isdir(src):
        return src
    if os.path.exists(src):
        raise _refuse(src, "is a file; expected a checkpoint folder (config.json and the weights)")
    if not is_hub_id(src):
        raise _refuse(src, "no such folder (and not a Hub repository id such as "
                           "zhixuan-lin/fox-pro-760m-longcrawl64-48b)")
    try:
        return download(src)
    except OSError as e:
        raise _refuse(src, f"not a local folder, and {e}; download the folder where the Hub is reachable and "
                           f"pass its path") from e


def read_state_dict(folder: str) -> dict[str, torch.Tensor]:
    """All tensors of a checkpoint folder: model.safetensors, pytorch_model.bin, or their sharded index."""
    for name in WEIGHT_FILES:
        path = os.path.join(folder, name)
        if not os.path.exists(path):
            continue
        if name.endswith(".index.json"):
            with open(path, encoding="utf-8") as f:
                shards = sorted(set(json.load(f)["weight_map"].values()))
        else:
            shards = [name]
        state = {}
        for shard in shards:
            shard_path = os.path.join(folder, shard)
            if shard.endswith(".safetensors"):
                from safetensors.torch import load_file

                state.update(load_file(shard_path))
            else:
                state.update(torch.load(shard_path, map_location="cpu", weights_only=True))
        return state
    raise _refuse(folder, f"has none of {', '.join(WEIGHT_FILES)}")


def _foxformer_run_said(folder: str) -> Optional[str]:
    """Where ``folder`` is a foxformer training run's folder, its checkpoints/ or one of its checkpoints: that it is a
    foxformer model already, and how to use it. "has no config.json" sent the user looking for one in their own run."""
    config, checkpoints = RUN_FOLDER_FILES[:2]

    def is_run(path: str) -> bool:
        return os.path.isfile(os.path.join(path, config)) and any(
            os.path.exists(os.path.join(path, name)) for name in RUN_FOLDER_FILES[1:])

    here = os.path.normpath(folder)
    parent = os.path.dirname(os.path.abspath(here))
    if is_run(here):
        run, what, model, flag = here, "a foxformer training run's folder", "it as is", ""
    elif os.path.basename(here) == checkpoints and is_run(parent):
        run = os.path.normpath(os.path.join(here, os.pardir))
        what, model, flag = f"the checkpoints folder of the foxformer training run {run!r}", f"the run folder {run}", ""
    elif os.path.basename(parent) == checkpoints and is_run(os.path.dirname(parent)):
        run = os.path.normpath(os.path.join(here, os.pardir, os.pardir))
        what, model = f"a checkpoint of the foxformer training run {run!r}", "it as is"
        flag = f" --checkpoint {os.path.basename(here)}"
    else:
        return None
    return (f"{what}: already a foxformer model, with nothing to convert; pass {model} as the model (foxformer "
            f"generate / eval MODEL, bench --model), or write a Hugging Face folder of it with `foxformer export-hf "
            f"{run}{flag}`")


def _dataset_said(folder: str) -> Optional[str]:
    """Where ``folder`` is a dataset that `foxformer data prepare` wrote: that it holds tokens, not a model, and what
    this command reads instead ("has no config.json" read as a checkpoint missing a file)."""
    if not prepared_dataset(folder):
        return None
    return (f"a prepared dataset (it holds the {MANIFEST} or lock that `foxformer data prepare` writes), not a model "
            f"checkpoint: convert official reads a Hugging Face folder saved by the FoX paper's code (config.json and "
            f"model.safetensors or pytorch_model.bin) or a Hub id such as zhixuan-lin/fox-pro-760m-longcrawl64-48b; a "
            f"dataset goes to --data (foxformer train, eval)")


def _check_supported(src: str, cfg: dict) -> None:
    model_type = cfg.get("model_type")
    if model_type in OTHER_TYPES:
        raise _refuse(src, f"holds their {OTHER_TYPES[model_type]} baseline ({model_type}), which foxformer does "
                           f"not implement; only {FOX_TYPE} and {TRANSFORMER_TYPE} convert")
    if model_type == FoxConfig.model_type:
        # a foxformer export (this command's own output, a training run's hf/ folder) given again
        raise _refuse(src, f"model_type {model_type!r}: the folder already loads as a foxformer model as is, with "
                           f"nothing to convert; pass it as the model (foxformer generate / eval MODEL, bench "
                           f"--model) or load it with FoxForCausalLM.from_pretrained")
    if model_type not in (FOX_TYPE, TRANSFORMER_TYPE):
        raise _refuse(src, f"model_type {model_type!r} is not a checkpoint of the FoX paper's code (expected "
                           f"{FOX_TYPE} or {TRANSFORMER_TYPE})")
    if cfg.get("hidden_act", "swish") != "swish":
        raise _refuse(src, f"hidden_act={cfg['hidden_act']!r}: foxformer's MLP is SwiGLU (swish) only")
    if cfg.get("window_size") is not None:
        raise _refuse(src, f"window_size={cfg['window_size']}: sliding-window attention has no foxformer form")
    if model_type == FOX_TYPE and cfg.get("num_kv_heads") is not None:
        raise _refuse(src, "num_kv_heads is set, which their FoX class itself refuses (GQA untested there)")
    if cfg.get("use_output_gate") and not cfg.get("use_output_norm") and cfg.get("ogate_act", "sigmoid") != "sigmoid":
        raise _refuse(src, f"ogate_act={cfg['ogate_act']!r}: foxformer's output gate is a sigmoid")
    if cfg.get("fgate_type", "full") not in FGATES:
        raise _refuse(src, f"fgate_type={cfg['fgate_type']!r} is none of {sorted(FGATES)}")
    hidden, heads = cfg.get("hidden_size"), cfg.get("num_heads")
    if not isinstance(hidden, int) or not isinstance(heads, int) or heads < 1 or hidden % heads:
        raise _refuse(src, f"num_heads ({heads}) must divide hidden_size ({hidden})")


def _map_weights(src: str, state: dict, num_layers: int, heads: int, head_dim: int) -> dict[str, torch.Tensor]:
    out = {}
    for key, value in state.items():
        if key in _TOP_KEYS:
            out[_TOP_KEYS[key]] = value
            continue
        m = _LAYER.fullmatch(key)
        if m is None or int(m.group(1)) >= num_layers or (m.group(2) not in _LAYER_KEYS
                                                          and m.group(2) != "mlp.gate_proj.weight"):
            raise _refuse(src, f"weight {key!r} {tuple(value.shape)} has no place in the converted model; a "
                               f"variant this converter does not know, so nothing was written")
        layer, name = int(m.group(1)), m.group(2)
        prefix = f"model.layers.{layer}."
        if name == "mlp.gate_proj.weight":  # [2I, d]: gate rows, then up rows (their MLP's chunk(2, -1))
            gate, up = value.chunk(2, dim=0)
            out[prefix + "mlp.gate_proj.weight"], out[prefix + "mlp.up_proj.weight"] = gate, up
        elif _LAYER_KEYS[name] is not None:
            grouped = name == "attn.output_norm.weight" or (name in ("attn.q_norm.weight", "attn.k_norm.weight")
                                                            and value.numel() != head_dim)
            if grouped:  # [hidden], one group of head_dim weights per head
                if value.numel() != heads * head_dim:
                    raise _refuse(src, f"weight {key!r} has shape {tuple(value.shape)}, expected [{heads * head_dim}]")
                value = value.reshape(heads, head_dim)
            out[prefix + _LAYER_KEYS[name]] = value
    return out


def official_config(src: str, cfg: dict, state: dict, *, tokenizer: Optional[str] = None,
                    max_position_embeddings: Optional[int] = None) -> FoxConfig:
    """The FoxConfig of an official checkpoint (``cfg``: its config.json; ``state``: its weights)."""
    _check_supported(src, cfg)
    fox_class = cfg["model_type"] == FOX_TYPE
    hidden, heads = cfg["hidden_size"], cfg["num_heads"]
    head_dim = hidden // heads
    if "model.embeddings.weight" not in state or "model.layers.0.mlp.gate_proj.weight" not in state:
        raise _refuse(src, "the weights lack model.embeddings.weight or model.layers.0.mlp.gate_proj.weight")
    layers = 1 + max(int(m.group(1)) for m in map(_LAYER.fullmatch, state) if m)
    if cfg.get("num_hidden_layers", layers) != layers:
        raise _refuse(src, f"config.json says {cfg['num_hidden_layers']} layers, the weights hold {layers}")
    inter = state["model.layers.0.mlp.gate_proj.weight"].shape[0] // 2
    if cfg.get("intermediate_size") not in (None, inter):
        raise _refuse(src, f"config.json says intermediate_size {cfg['intermediate_size']}, the weights {inter}")
    fgate = FGATES[cfg.get("fgate_type", "full")] if fox_class else "none"
    qk_norm = bool(cfg.get("qk_norm")) and fox_class
    q_norm = state.get("model.layers.0.attn.q_norm.weight")
    if qk_norm and q_norm is None:
        raise _refuse(src, "qk_norm is set but the weights hold no attn.q_norm.weight")
    per_head = qk_norm and q_norm.numel() == hidden != head_dim
    shared = cfg.get("qk_norm_share_param_across_head")
    if qk_norm and shared is not None and bool(shared) == per_head:
        raise _refuse(src, f"qk_norm_share_param_across_head={shared} but the QK-norm weight is "
                           f"{tuple(q_norm.shape)} (head_dim {head_dim}, hidden {hidden})")
    rope = bool(cfg.get("use_rope", not fox_class))
    fields = dict(
        vocab_size=int(state["model.embeddings.weight"].shape[0]), hidden_size=hidden, num_layers=layers,
        num_heads=heads, num_kv_heads=cfg.get("num_kv_heads") or heads, head_dim=head_dim,
        intermediate_size=inter, attention="forgetting" if fgate != "none" else "softmax", fgate=fgate,
        rope=rope, rope_theta=float(cfg.get("rope_base", ROPE_THETA_DEFAULT)) if rope else ROPE_THETA_DEFAULT,
        qk_norm=qk_norm, qk_norm_per_head=per_head, qk_norm_eps=QK_NORM_EPS,
        output_gate=fox_class and bool(cfg.get("use_output_gate")),
        output_norm=fox_class and bool(cfg.get("use_output_norm")),
        k_shift=fox_class and bool(cfg.get("use_k_shift")), v_shift=fox_class and bool(cfg.get("use_v_shift")),
        tie_embeddings=bool(cfg.get("tie_word_embeddings", False)), rms_norm_eps=float(cfg.get("norm_eps", 1e-6)),
        init_std=float(cfg.get("initializer_range", 0.02)),
        max_position_embeddings=max_position_embeddings or cfg.get("max_position_embeddings") or TRAINING_CONTEXT,
        tokenizer=tokenizer,
    )
    if fgate in ("data_independent", "fixed") and cfg.get("decay_time_min") and cfg.get("decay_time_max"):
        fields.update(fgate_tmin=float(cfg["decay_time_min"]), fgate_tmax=float(cfg["decay_time_max"]))
    if fgate != "none" and cfg.get("log_pruning_tolerance") is not None:
        fields["prune_eps"] = math.exp(float(cfg["log_pruning_tolerance"]))
    bos, eos = cfg.get("bos_token_id"), cfg.get("eos_token_id")
    if tokenizer == "gpt2-json":
        # The tokenizer decides: LongCrawl64's BOS is GPT-2's end of text, whatever their config's defaults (1, 2)
        # or nulls say.
        bos = eos = GPT2_VOCAB - 1
    return FoxConfig(**fields, bos_token_id=bos, eos_token_id=eos, pad_token_id=cfg.get("pad_token_id"))


def official_tokenizer(folder: str, vocab_size: int) -> Optional[str]:
    """The tokenizer spec of an official folder: gpt2-json for their JSONGPT2Tokenizer and for a GPT-2-sized
    vocabulary without tokenizer files (LongCrawl64 is their only GPT-2 data); hf:<folder> for other tokenizer
    files (their SlimPajama models); None when unknown."""
    path = os.path.join(folder, "tokenizer_config.json")
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            cls = json.load(f).get("tokenizer_class") or ""
        return "gpt2-json" if "JSONGPT2" in cls else f"hf:{os.path.abspath(folder)}"
    return "gpt2-json" if vocab_size == GPT2_VOCAB else None


def load_official(src: str, *, tokenizer: Optional[str] = "auto",
                  max_position_embeddings: Optional[int] = None) -> FoxForCausalLM:
    """An official checkpoint (a local folder, or a Hub id when the Hub is reachable) as a FoxForCausalLM in eval
    mode, in the dtype of its weights. ``tokenizer``: a spec, "auto" (see official_tokenizer) or None."""
    folder = resolve_source(src)
    config_path = os.path.join(folder, "config.json")
    if not os.path.exists(config_path):
        raise _refuse(src, _foxformer_run_said(folder) or _dataset_said(folder) or "has no config.json")
    with open(config_path, encoding="utf-8") as f:
        cfg = json.load(f)
    _check_supported(src, cfg)
    state = read_state_dict(folder)
    emb = state.get("model.embeddings.weight")
    if tokenizer == "auto":
        tokenizer = official_tokenizer(folder, int(emb.shape[0]) if emb is not None else 0)
    config = official_config(src, cfg, state, tokenizer=tokenizer, max_position_embeddings=max_position_embeddings)
    mapped = _map_weights(src, state, config.num_layers, config.num_heads, config.head_dim)
    if config.tie_embeddings:
        mapped.pop("lm_head.weight", None)
    model = FoxForCausalLM(config)
    expected = set(model.state_dict()) - ({"lm_head.weight"} if config.tie_embeddings else set())
    missing, unexpected = sorted(expected - set(mapped)), sorted(set(mapped) - expected)
    if missing or unexpected:
        raise _refuse(src, f"the weights do not match the model its config.json describes: missing {missing[:4]}, "
                           f"unexpected {unexpected[:4]}")
    try:
        model.load_state_dict(mapped, strict=False)  # the keys were compared above; a tied head has no key
    except RuntimeError as e:
        raise _refuse(src, f"a weight has the wrong shape for its config.json ({e})") from e
    return model.to(emb.dtype).eval()


def convert_official(src: str, out: str, *, tokenizer: Optional[str] = "auto",
                     max_position_embeddings: Optional[int] = None) -> dict:
    """Convert ``src`` (see load_official) and save it in ``out`` (save_pretrained: a standalone folder with its
    tokenizer). Returns a summary. ``out`` is replaced whole, as by export-hf: it must be absent, empty or an
    earlier export, never ``src``; save_pretrained wrote into a run's folder or among a user's files, and over the
    checkpoint it read."""
    if os.path.isdir(src) and os.path.isdir(out) and os.path.samefile(src, out):
        raise ValueError(f"--out: {out!r} is the checkpoint being converted (SRC): name a new folder, e.g. "
                         f"{os.path.normpath(out) + '-foxformer'!r}")
    earlier = check_export_dir(out, "--out")  # before the load, which takes minutes for the released 760M models
    model = load_official(src, tokenizer=tokenizer, max_position_embeddings=max_position_embeddings)
    with export_writer(out, earlier) as tmp:
        model.save_pretrained(tmp)
    cfg = model.config
    return {"source": src, "out": out, "tokenizer": cfg.tokenizer, "dtype": str(next(model.parameters()).dtype),
            "layers": cfg.num_layers, "hidden_size": cfg.hidden_size, "heads": cfg.num_heads,
            "attention": cfg.attention, "qk_norm": "per head" if cfg.qk_norm_per_head else (
                "shared" if cfg.qk_norm else "none"), "k_shift": cfg.k_shift, "v_shift": cfg.v_shift,
            "parameters": sum(p.numel() for p in model.parameters())}
