"""FoX and Transformer causal LMs as Hugging Face models (model_type "foxformer").

Importing this package registers FoxConfig / FoxModel / FoxForCausalLM with AutoConfig,
AutoModel and AutoModelForCausalLM.
"""
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

from . import modeling
from .attention_layer import ForgettingAttention
from .card import write_card
from .config import FoxConfig
from .kvcache import EvictionPolicy, FoxCache
from .modeling import FoxCausalLMOutput, FoxForCausalLM, FoxModel, FoxPreTrainedModel, causal_lm_loss
from .presets import (PRESETS, count_embedding, count_non_embedding, get_preset, sized_config,
                      training_flops_per_token)
from .standalone import write_standalone


def _register() -> None:
    for auto, cls in ((AutoModel, FoxModel), (AutoModelForCausalLM, FoxForCausalLM)):
        try:
            auto.register(FoxConfig, cls, exist_ok=True)
        except TypeError:  # older signatures without exist_ok
            auto.register(FoxConfig, cls)
    try:
        AutoConfig.register(FoxConfig.model_type, FoxConfig, exist_ok=True)
    except TypeError:
        AutoConfig.register(FoxConfig.model_type, FoxConfig)


_register()
for _writer in (write_standalone, write_card):
    if _writer not in modeling.SAVE_WRITERS:
        modeling.SAVE_WRITERS.append(_writer)

__all__ = [
    "EvictionPolicy", "FoxCache", "FoxCausalLMOutput", "FoxConfig", "ForgettingAttention", "FoxForCausalLM", "FoxModel",
    "FoxPreTrainedModel", "PRESETS", "causal_lm_loss", "count_embedding", "count_non_embedding", "get_preset",
    "sized_config", "training_flops_per_token",
]
