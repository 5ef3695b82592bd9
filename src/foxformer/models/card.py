"""A model card (README.md) for a saved FoX / Transformer folder: what the model is, how to load it, and, for a
training run's export, how it was trained. The Hugging Face Hub shows it as the model's page."""
from __future__ import annotations

import os
from typing import Optional

from ..paths import write_text
from .config import FoxConfig
from .presets import block_of, count_embedding, count_non_embedding

CARD = "README.md"
PAPER = "Forgetting Transformer: Softmax Attention with a Forget Gate (arXiv 2503.02130)"
_ATTENTION = {"forgetting": "FoX", "softmax": "Transformer", "linear": "Gated linear attention"}


def model_name(config: FoxConfig) -> str:
    """"FoX (Pro)", "Transformer (LLaMA)", ...: the paper's names, the block named by its additions."""
    block = {"pro": "Pro", "llama": "LLaMA", None: "custom block"}[block_of(config)]
    return f"{_ATTENTION[config.attention]} ({block})"


def _count(n: int) -> str:
    for size, unit in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= size:
            return f"{n / size:.1f}{unit}"
    return str(n)


def model_card(config: FoxConfig, training: Optional[dict] = None) -> str:
    """The card's Markdown: a YAML header for the Hub, the architecture, loading, and ``training`` ({label: value},
    in order) when the folder is a training run's export."""
    gate = "none" if not config.has_fgate else config.fgate.replace("_", "-")
    extras = [name for on, name in ((config.qk_norm, "QK-norm"), (config.output_gate, "output gate"),
                                    (config.output_norm, "per-head output RMSNorm"), (config.k_shift, "key shift"),
                                    (config.v_shift, "value shift"), (config.rope, "RoPE")) if on]
    rows = [("layers, width", f"{config.num_layers}, {config.hidden_size}"),
            ("heads x head dim", f"{config.num_heads} x {config.head_dim} ({config.num_kv_heads} key / value heads)"),
            ("forget gate", gate),
            ("block additions", ", ".join(extras) or "none"),
            ("parameters", f"{_count(count_non_embedding(config))} non-embedding, "
                           f"{_count(count_embedding(config))} in the token embedding and LM head"
                           f"{' (tied)' if config.tie_embeddings else ''}"),
            ("tokenizer", f"{config.tokenizer or 'not recorded'} ({config.vocab_size} ids"
                          + (f", end of document {config.eos_token_id})" if config.eos_token_id is not None else ")"))]
    lines = ["---", "library_name: transformers", "pipeline_tag: text-generation",
             "tags: [foxformer, forgetting-transformer, fox]", "---", "",
             f"# {model_name(config)}, {_count(count_non_embedding(config))} non-embedding parameters", "",
             f"A causal language model from foxformer, the implementation of *{PAPER}*: softmax attention whose "
             f"scores decay with a data-dependent forget gate (no positional embedding for FoX).", "",
             "| | |", "|---|---|", *[f"| {k} | {v} |" for k, v in rows], "",
             "## Use", "", "```python",
             "from transformers import AutoModelForCausalLM, AutoTokenizer",
             'model = AutoModelForCausalLM.from_pretrained("THIS_FOLDER", trust_remote_code=True)',
             'tokenizer = AutoTokenizer.from_pretrained("THIS_FOLDER", trust_remote_code=True)',
             "```", "",
             "The folder carries the model code (exact PyTorch attention), so only torch and transformers are "
             "needed; with foxformer installed, `foxformer.models.FoxForCausalLM.from_pretrained` runs its fused "
             "kernels instead."]
    if training:
        lines += ["", "## Training", "", "| | |", "|---|---|", *[f"| {k} | {v} |" for k, v in training.items()]]
    return "\n".join(lines) + "\n"


def write_card(directory: str, config: FoxConfig, training: Optional[dict] = None, replace: bool = False) -> None:
    """README.md in ``directory``; a card already there (the user's own) is kept unless ``replace``."""
    path = os.path.join(directory, CARD)
    if os.path.exists(path) and not replace:
        return
    write_text(path, model_card(config, training))
