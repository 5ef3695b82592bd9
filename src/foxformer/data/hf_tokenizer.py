"""Hugging Face tokenizer files for a foxformer tokenizer spec, written next to exported weights so that
``AutoTokenizer.from_pretrained(dir, trust_remote_code=False)`` and ``pipeline("text-generation", model=dir,
trust_remote_code=True)`` work without foxformer (AutoTokenizer reads config.json's auto_map first: left without the
argument, it asks whether to run the model's code)."""
from __future__ import annotations

import json
import os
import re
from typing import Optional

from ..argtypes import SettingError
from .specs import EOT_TEXT
from .tokenizer import BYTES_SPEC, GPT2_JSON_SPEC, GPT2_SPEC, _gpt2_files, canonical_name, tiktoken_encoding


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


def _split_by_lower_ranks(token: bytes, ranks: dict[bytes, int]) -> list[bytes]:
    """``token`` as tiktoken's BPE leaves it when only the tokens ranked below ``token`` exist: merge the adjacent
    pair whose union ranks lowest until none is left. A token made by a merge ends as that merge's two halves."""
    limit = ranks[token]
    parts = [token[i:i + 1] for i in range(len(token))]
    while len(parts) > 1:
        found = [(ranks[pair], i) for i in range(len(parts) - 1)
                 if ranks.get(pair := parts[i] + parts[i + 1], limit) < limit]
        if not found:
            break
        i = min(found)[1]
        parts[i:i + 2] = [parts[i] + parts[i + 1]]
    return parts


# One atom (a \p{..} class, a [..] set, an escape or a character) under a possessive interval such as \p{N}{1,3}+
_POSSESSIVE_INTERVAL = re.compile(r"(\\p\{\w+\}|\[(?:\\.|[^\]\\])*\]|\\.|[^\\()])(\{\d*,?\d*\})\+")


def _oniguruma_pattern(pattern: str) -> str:
    """tiktoken's pre-tokenizer regex as Oniguruma (HF tokenizers) reads it the same way. In Oniguruma's Ruby
    syntax ``x{1,3}+`` is "x{1,3}, one or more times", not possessive as in tiktoken's regex engine, so cl100k's
    digit groups would swallow a whole number: write the interval as an atomic group, which is what possessive
    means. The other possessive forms (``?+``, ``*+``, ``++``) mean the same in both."""
    rewritten = _POSSESSIVE_INTERVAL.sub(r"(?>\1\2)", pattern)
    if re.search(r"\{\d*,?\d*\}\+", rewritten):
        raise SettingError("tokenizer", f"a possessive interval on a group in the pattern {pattern!r} has no "
                                        f"Hugging Face form here")
    return rewritten


def tiktoken_tokenizer(enc, **kwargs):
    """A tiktoken ``Encoding`` as a plain ``tokenizers`` tokenizer (no remote code) with the same ids.

    tiktoken keeps ranks, not merges: a token of rank r was made by merging the two pieces that BPE with the tokens
    ranked below r leaves of it, and HF's merge list in rank order replays tiktoken's choice (the lowest-ranked
    union first). A whole pre-tokenized piece that is itself a token is taken at once (``ignore_merges``), as
    tiktoken does. Special tokens keep their ids; with ``split_special_tokens`` their text in a prompt is ordinary
    text, as foxformer encodes documents (``encode_ordinary``). The end-of-text token is eos and bos."""
    from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers
    from tokenizers import Tokenizer as RustTokenizer
    from transformers import PreTrainedTokenizerFast

    symbols = _byte_symbols()
    ranks = enc._mergeable_ranks  # tiktoken's table of token bytes -> id (no public accessor)
    specials = dict(enc._special_tokens)

    def text(token: bytes) -> str:
        return "".join(symbols[b] for b in token)

    merges = []
    for token, rank in sorted(ranks.items(), key=lambda item: item[1]):
        if len(token) < 2:
            continue
        parts = _split_by_lower_ranks(token, ranks)
        if len(parts) != 2:
            raise SettingError("tokenizer", f"tiktoken encoding {enc.name!r}: token {token!r} (id {rank}) is not the "
                                            f"merge of two lower-ranked tokens; it has no Hugging Face BPE form")
        merges.append((text(parts[0]), text(parts[1])))
    vocab = {text(token): rank for token, rank in ranks.items()}
    vocab.update(specials)  # present in the vocabulary, the added tokens below keep these ids
    backend = RustTokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=True))
    backend.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(_oniguruma_pattern(enc._pat_str)), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens([AddedToken(name, special=True, normalized=False)
                                for name in sorted(specials, key=specials.get)])
    eot = EOT_TEXT if EOT_TEXT in specials else None  # tiktoken's eot_token is this one
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token=eot, bos_token=eot, split_special_tokens=True,
                                   **kwargs)


def hf_tokenizer(spec: str, model_max_length: Optional[int] = None):
    """The transformers tokenizer of ``spec``, or None where there is none: gpt2 (GPT2Tokenizer, no remote code),
    gpt2-json (GPT2JSONTokenizer: its file is copied into the export, loading needs trust_remote_code=True),
    bytes (a tokenizer.json, no remote code: bytes_tokenizer), tiktoken:<encoding> (likewise: tiktoken_tokenizer),
    hf:<name or path>."""
    name = canonical_name(spec)
    if name.startswith("hf:"):
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(name[3:], **({} if model_max_length is None
                                                          else {"model_max_length": int(model_max_length)}))
    tok = _own_tokenizer(name, model_max_length)
    if tok is not None:
        tok.pad_token = tok.eos_token
    return tok


def _own_tokenizer(name: str, model_max_length: Optional[int]):
    # A batch of prompts: `tok(prompts, padding=True)` had no pad token (hf_tokenizer sets the end-of-text token),
    # and right padding puts a 0 between a prompt and its continuation, which the models refuse: generation needs
    # left padding (the mask hides it; nothing is padded in training). A constructor argument, as the attribute
    # set afterwards is not saved: the export's tokenizer padded on the right.
    extra = {"padding_side": "left"}
    if model_max_length is not None:
        extra["model_max_length"] = int(model_max_length)
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
    if name.startswith("tiktoken:"):
        return tiktoken_tokenizer(tiktoken_encoding(name.split(":", 1)[1]), **extra)
    return None


def save_hf_tokenizer(spec: str, out_dir: str, model_max_length: Optional[int] = None):
    """Write the tokenizer files of ``spec`` into ``out_dir`` and return the tokenizer saved (its pad token is what
    an export's config names); None, with nothing written, for specs without them."""
    tok = hf_tokenizer(spec, model_max_length)
    if tok is None:
        return None
    os.makedirs(out_dir, exist_ok=True)
    tok.save_pretrained(out_dir)
    return tok
