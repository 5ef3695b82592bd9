"""Names of the built-in tokenizer specs and their end-of-document ids, known without loading a tokenizer.

No imports: the model config reads :func:`document_token_ids`, and the standalone export carries this file
along with the config.
"""
from __future__ import annotations

from typing import Optional

GPT2_SPEC = "gpt2"
GPT2_JSON_SPEC = "gpt2-json"
BYTES_SPEC = "bytes"
BYTES_EOT = 256    # after the 256 byte values: a 257-id vocabulary
GPT2_EOT = 50256   # GPT-2's <|endoftext|>
EOT_TEXT = "<|endoftext|>"  # GPT-2's name for it, which the bytes tokenizer's Hugging Face form borrows
# The token between documents in foxformer's prepared data: it ends each document (gpt2, bytes), or starts each
# one (gpt2-json's BOS, which is also where the previous one ended).
_DOCUMENT_TOKEN = {BYTES_SPEC: BYTES_EOT, GPT2_SPEC: GPT2_EOT, "tiktoken:gpt2": GPT2_EOT, GPT2_JSON_SPEC: GPT2_EOT}


def document_token_ids(spec: Optional[str]) -> tuple[Optional[int], Optional[int]]:
    """(bos_token_id, eos_token_id) of a model trained on ``spec``'s data: both its end-of-document token, which
    ends a generation and starts one from nothing (where foxformer's harness starts its sequences); (None, None)
    for specs whose ids are only known by loading them (tiktoken:<encoding>, hf:<name>: a run keeps its data's id)."""
    token = _DOCUMENT_TOKEN.get(spec) if isinstance(spec, str) else None
    return token, token
