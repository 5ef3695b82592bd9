"""GPT-2 BPE over JSON-escaped text: the tokenization of LongCrawl64, which the FoX paper's released models read.

A text is tokenized as ``json.dumps(text)[1:-1]``: newlines, tabs, quotes and backslashes become two-character
escapes and every non-ASCII character a ``\\uXXXX`` escape (two of them, a UTF-16 surrogate pair, outside the
Basic Multilingual Plane), so the GPT-2 BPE only ever sees ASCII. Decoding undoes the escapes.

This file stands alone (the standard library and transformers only): Hugging Face exports carry a copy of it as
their tokenizer code, so that ``AutoTokenizer.from_pretrained(dir, trust_remote_code=True)`` works where
foxformer is not installed. foxformer's own ``gpt2-json`` tokenizer (foxformer.data.tokenizer) uses the two
functions below.
"""
from __future__ import annotations

import json
import re

from transformers import GPT2Tokenizer

_ESCAPE = re.compile(r'\\(?:u([0-9a-fA-F]{4})|(["\\/bfnrt]))')
_SIMPLE = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}


def json_escape(text: str) -> str:
    """The body of ``text`` as a JSON string literal (ASCII only)."""
    return json.dumps(text)[1:-1]


def json_unescape(text: str) -> str:
    """Inverse of json_escape, and total: unlike ``json.loads`` it keeps what is not a complete escape (a model
    may write a bare quote, a stream may stop inside ``\\u00``) and turns an unpaired surrogate into U+FFFD."""
    out = _ESCAPE.sub(lambda m: chr(int(m.group(1), 16)) if m.group(1) else _SIMPLE[m.group(2)], text)
    # A character outside the BMP arrives as two escaped UTF-16 surrogates: the round trip through UTF-16 joins
    # each pair into one character.
    return out.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")


# An odd run of backslashes at the end (an even one is escaped backslashes), perhaps with the start of \uXXXX.
_OPEN_ESCAPE = re.compile(r"(?<!\\)(?:\\\\)*\\(?:u[0-9a-fA-F]{0,3})?\Z")


def ends_inside_escape(text: str) -> bool:
    """Whether the escaped ``text`` stops inside an escape, whose rest (and so what it decodes to) comes after it:
    the tokens of one escape (``\\u00e9`` is several GPT-2 tokens) must be decoded together."""
    return _OPEN_ESCAPE.search(text) is not None


def _escape_input(text):
    if isinstance(text, str):
        return json_escape(text)
    if isinstance(text, (list, tuple)):
        return type(text)(_escape_input(t) for t in text)
    return text


class GPT2JSONTokenizer(GPT2Tokenizer):
    """GPT2Tokenizer that escapes text as JSON before BPE and unescapes after decoding."""

    def _encode_plus(self, text, text_pair=None, *args, is_split_into_words: bool = False, **kwargs):
        if not is_split_into_words:
            text, text_pair = _escape_input(text), _escape_input(text_pair)
        return super()._encode_plus(text, text_pair, *args, is_split_into_words=is_split_into_words, **kwargs)

    def _decode(self, token_ids, *args, **kwargs) -> str:
        return json_unescape(super()._decode(token_ids, *args, **kwargs))
