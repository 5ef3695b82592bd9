"""A new run that starts from another model's weights and config (``init_from``), checked against the run's
data and model overrides before anything is written."""

from __future__ import annotations

import torch

from ..data.preparation import recorded_tokenizer_files
from ..data.tokenizer import same_tokenizer
from .config import TrainConfig, config_fields
from .identity import check_same_weights


def init_source(cfg: TrainConfig, manifest: dict) -> tuple[dict, dict]:
    """(FoxConfig fields, state dict) of the model ``cfg.init_from`` names, checked against the run's data."""
    from ..models import FoxForCausalLM
    from .loading import load_model

    try:
        loaded = load_model(cfg.init_from, device="cpu", dtype=torch.float32, progress=False)
    except ValueError as e:
        raise ValueError(f"init_from: {e}") from None
    model = loaded.model
    check_same_weights(cfg.init_from, model.state_dict(), loaded.step)
    if not isinstance(model, FoxForCausalLM):
        raise ValueError(f"init_from: {cfg.init_from!r} holds a {type(model).__name__}; foxformer trains "
                         f"FoxForCausalLM models (foxformer convert official turns the paper's checkpoints into one)")
    fields = config_fields(model.config)
    # the machine decides these, not the model's origin
    fields.update(attention_backend="auto", gradient_checkpointing=False)
    data_tok, its_tok = manifest["tokenizer"], fields["tokenizer"]
    if its_tok is not None and not same_tokenizer(data_tok, its_tok, recorded_tokenizer_files(manifest)):
        raise ValueError(f"init_from: the model reads {its_tok!r} tokens but {cfg.data_dir!r} was tokenized with "
                         f"{data_tok!r}; prepare the data again with --tokenizer {its_tok}")
    if fields["vocab_size"] < manifest["vocab_size"]:
        raise ValueError(f"init_from: the model has {fields['vocab_size']} token ids, fewer than the "
                         f"{manifest['vocab_size']} of {cfg.data_dir!r}'s tokenizer {data_tok!r}")
    if cfg.vocab_size is not None and cfg.vocab_size != fields["vocab_size"]:
        raise ValueError(f"vocab_size: {cfg.vocab_size} given, but the model init_from names has "
                         f"{fields['vocab_size']}; leave vocab_size unset")
    ratio = cfg.model.get("mlp_ratio")
    if (ratio is not None and fields.get("intermediate_size") is not None and "intermediate_size" not in cfg.model
            and ratio != fields.get("mlp_ratio")):
        # the model's explicit intermediate_size wins over an mlp_ratio, which would be recorded and never read
        raise ValueError(f"init_from: model.mlp_ratio={ratio!r} cannot apply: the MLP of the model init_from names is "
                         f"{fields['intermediate_size']} wide, and its weights have that width; leave mlp_ratio out")
    return fields, model.state_dict()


def load_init_weights(model: torch.nn.Module, state_dict: dict, cfg: TrainConfig) -> None:
    try:
        model.load_state_dict(state_dict, strict=True)
    except RuntimeError as e:  # shapes or names: the run's model overrides changed the architecture
        raise ValueError(f"init_from: the weights of {cfg.init_from!r} do not fit the model with the overrides "
                         f"{cfg.model} ({str(e).splitlines()[0]} ...); override only fields that hold no weights "
                         f"(prune_eps, fgate_bias_shift, ...)") from None
