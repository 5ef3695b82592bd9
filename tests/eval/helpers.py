"""Tiny models and a word tokenizer for the eval tests."""
from __future__ import annotations

import math
import os
import re

import pytest
import torch

from foxformer.models import FoxConfig, FoxForCausalLM, get_preset


class WordTokenizer:
    """Words and punctuation marks are tokens; unseen ones get the next free id (up to ``capacity``)."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.vocab: dict[str, int] = {"<eot>": 0}
        self.words: list[str] = ["<eot>"]
        self.eot_id = 0

    def _id(self, word: str) -> int:
        if word not in self.vocab:
            if len(self.words) >= self.capacity:
                raise ValueError("WordTokenizer: vocabulary full")
            self.vocab[word] = len(self.words)
            self.words.append(word)
        return self.vocab[word]

    def encode(self, text: str) -> list[int]:
        return [self._id(w) for w in re.findall(r"\w+|[^\w\s]", text)]

    def decode(self, ids) -> str:
        return " ".join(self.words[i] if i < len(self.words) else f"<unk{i}>" for i in ids)


def tiny_model(preset: str = "fox-pro-tiny", vocab: int = 97, seed: int = 0, **overrides) -> FoxForCausalLM:
    torch.manual_seed(seed)
    cfg = get_preset(preset, vocab_size=vocab, attention_backend="torch", **overrides)
    return FoxForCausalLM(cfg).eval()


def copy_model(vocab: int, forget_all: bool = False) -> FoxForCausalLM:
    """One FoX layer wired by hand as an induction head: at token t it attends to the position right after an
    earlier occurrence of t and predicts the token found there (it copies what followed last time).

    Token embeddings are one-hot in the first ``vocab`` features. The key shift (a = 1) makes key j hold the
    token j-1 while the value (a = 0) holds token j; q . k is large only where token j-1 equals the current
    token. The head writes the copied token into the second half of the residual, which the LM head reads.
    ``forget_all`` sets every forget gate to ~0, so nothing before the current token is visible.
    """
    V = vocab
    cfg = FoxConfig(vocab_size=V, hidden_size=2 * V, num_layers=1, num_heads=1, head_dim=V, intermediate_size=8,
                    attention="forgetting", fgate="data_dependent", kv_shift=True, attention_backend="torch")
    model = FoxForCausalLM(cfg).eval()
    eye = torch.eye(V)
    r = math.sqrt(2 * V)  # RMSNorm scales a one-hot of 2V features by sqrt(2V)
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        model.model.embed_tokens.weight[:, :V] = eye
        for norm in (model.model.layers[0].attn_norm, model.model.layers[0].mlp_norm, model.model.norm):
            norm.weight.fill_(1.0)
        attn = model.model.layers[0].attn
        attn.q_proj.weight[:, :V] = 3.0 * eye
        attn.k_proj.weight[:, :V] = eye
        attn.v_proj.weight[:, :V] = eye
        attn.k_shift.proj.weight[:, :V] = 30.0 / r
        attn.v_shift.proj.weight[:, :V] = -30.0 / r
        attn.fgate.proj.bias.fill_(-40.0 if forget_all else 40.0)
        attn.o_proj.weight[V:, :] = eye
        model.lm_head.weight[:, V:] = 10.0 * eye
    return model


def save_loss_unplotted(curves, out_dir: str, settings: dict) -> dict:
    """``save_loss`` for the made-up runs that `eval compare` and the doc scripts read: their loss.json as eval
    writes it, but their own two figures as empty files. Nothing reads those, and rendering them (two PNGs a run,
    a dozen runs a test) was most of those tests' time."""
    from foxformer.eval import outputs, plots

    def placeholder(fig, path):
        plots.plt.close(fig)
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        open(path, "wb").close()
        return path

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(plots, "save_figure", placeholder)
        return outputs.save_loss(curves, out_dir, settings)
