"""Hugging Face tokenizer files for a foxformer tokenizer spec, written next to exported weights so that
``AutoTokenizer.from_pretrained(dir)`` and ``pipeline("text-generation", model=dir)`` work without foxformer."""
from __future__ import annotations

import json
import os
from typing import Optional

from .specs import EOT_TEXT
from .tokenizer import BYTES_SPEC, GPT2_JSON_SPEC, GPT2_SPEC, _gpt2_files, canonical_name


def _gpt2_tables() -> tuple[dict, list]:
    vocab_bpe, encoder_json = _gpt2_files()
    with open(encoder_json, encoding="utf-8") as f:
        vocab = json.load(f)
    with open(vocab_bpe, encoding="utf-8") as f:
        lines = f.read().splitlines()
    merges = [tuple(line.split()) for line in lines[1:] if line.strip()]  # line 0: "#version: 0.2"
    return vocab, merges


def _byte_symbols() -> list[str]:
    """The character that stands for each byte value in byte-level BPE vocabularies (GPT-2's table): the printable
    Latin-1 characters stand for their own byte, the other 68 bytes for the code points from 256 up, in order."""
    printable = {*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)}
    symbols, shifted = [], 256
    for byte in range(256):
        if byte in printable:
            symbols.append(chr(byte))
        else:
            symbols.append(chr(shifted))
            shifted += 1
    return symbols


def bytes_tokenizer(**kwargs):
    """foxformer's ``bytes`` tokenizer as a plain ``tokenizers`` tokenizer (AutoTokenizer loads it without remote
    code): byte-level BPE whose vocabulary is the 256 bytes, each with its value as id, and no merges; id 256 is
    the special token <|endoftext|>, eos and bos as in GPT-2. With ``split_special_tokens`` the text
    "<|endoftext|>" in a prompt is its 13 bytes, as foxformer encodes it. ``kwargs`` go to the tokenizer."""
    from tokenizers import AddedToken, decoders, models, pre_tokenizers
    from tokenizers import Tokenizer as RustTokenizer
    from transformers import PreTrainedTokenizerFast

    backend = RustTokenizer(models.BPE(vocab={symbol: byte for byte, symbol in enumerate(_byte_symbols())},
                                       merges=[]))
    # no regex split (without merges, words change nothing), no prefix space (the ids are the text's own bytes)
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens([AddedToken(EOT_TEXT, special=True, normalized=False)])  # id 256
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token=EOT_TEXT, bos_token=EOT_TEXT,
                                   split_special_tokens=True, **kwargs)


def hf_tokenizer(spec: str, model_max_length: Optional[int] = None):
    """The transformers tokenizer of ``spec``, or None where there is none: gpt2 (GPT2Tokenizer, no remote code),
    gpt2-json (GPT2JSONTokenizer: its file is copied into the export, loading needs trust_remote_code=True),
    bytes (a tokenizer.json, no remote code: bytes_tokenizer), hf:<name or path>; tiktoken:<encoding> has no
    Hugging Face form."""
    name = canonical_name(spec)
    extra = {} if model_max_length is None else {"model_max_length": int(model_max_length)}
    if name == BYTES_SPEC:
        return bytes_tokenizer(**extra)
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
