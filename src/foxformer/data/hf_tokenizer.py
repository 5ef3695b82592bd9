"""Hugging Face tokenizer files for a foxformer tokenizer spec, written next to exported weights so that
``AutoTokenizer.from_pretrained(dir)`` and ``pipeline("text-generation", model=dir)`` work without foxformer."""
from __future__ import annotations

import json
import os
from typing import Optional

from .tokenizer import GPT2_JSON_SPEC, GPT2_SPEC, _gpt2_files, canonical_name


def _gpt2_tables() -> tuple[dict, list]:
    vocab_bpe, encoder_json = _gpt2_files()
    with open(encoder_json, encoding="utf-8") as f:
        vocab = json.load(f)
    with open(vocab_bpe, encoding="utf-8") as f:
        lines = f.read().splitlines()
    merges = [tuple(line.split()) for line in lines[1:] if line.strip()]  # line 0: "#version: 0.2"
    return vocab, merges


def hf_tokenizer(spec: str, model_max_length: Optional[int] = None):
    """The transformers tokenizer of ``spec``, or None where there is none: gpt2 (GPT2Tokenizer, no remote code),
    gpt2-json (GPT2JSONTokenizer: its file is copied into the export, loading needs trust_remote_code=True),
    hf:<name or path>; bytes and tiktoken:<encoding> have no Hugging Face form."""
    name = canonical_name(spec)
    extra = {} if model_max_length is None else {"model_max_length": int(model_max_length)}
    if name in (GPT2_SPEC, GPT2_JSON_SPEC):
        vocab, merges = _gpt2_tables()
        if name == GPT2_SPEC:
            from transformers import GPT2Tokenizer

            return GPT2Tokenizer(vocab=vocab, merges=merges, **extra)
        from .tokenization_gpt2_json import GPT2JSONTokenizer

        tok = GPT2JSONTokenizer(vocab=vocab, merges=merges, add_bos_token=True, **extra)
        tok.register_for_auto_class("AutoTokenizer")  # save_pretrained copies its code file and writes auto_map
        return tok
    if name.startswith("hf:"):
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(name[3:], **extra)
    return None


def save_hf_tokenizer(spec: str, out_dir: str, model_max_length: Optional[int] = None) -> bool:
    """Write the tokenizer files of ``spec`` into ``out_dir``; False (nothing written) for specs without them."""
    tok = hf_tokenizer(spec, model_max_length)
    if tok is None:
        return False
    os.makedirs(out_dir, exist_ok=True)
    tok.save_pretrained(out_dir)
    return True
