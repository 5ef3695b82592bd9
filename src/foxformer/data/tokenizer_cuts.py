"""Where a long document may be cut so that its parts, encoded one by one, give the ids of the whole text
(Tokenizer.encode_pieces): only for byte-level BPE tokenizers whose pre-tokenizer regex is one proven safe here."""

from __future__ import annotations

import json
import re
from typing import Callable, Optional

# A letter or digit, then a space and a letter. Cut there only (a run of whitespace is read ahead: "\n\n" is one
# token, "  " before a word two). ASCII only, so that the JSON escaping of gpt2-json leaves the three characters
# as they are, and NFC (below) neither composes nor reorders them.
_CUT = re.compile(r"[A-Za-z0-9](?= [A-Za-z])")

# The pre-tokenizer regexes under which a cut at _CUT keeps the ids. None has a lookbehind, \b, ^ or an empty
# match, so the matches from the space on are those of the text after the cut taken alone. An ASCII letter or
# digit is matched only by a run of letters, marks or digits (\p{L}+, a contraction's letters, \p{N}{1,3} or
# \p{N}, o200k's cased runs), after which the alternative goes on only with letters, marks, digits or a
# contraction's apostrophe, or ends; a space is matched only as a match's first character or inside a run of
# whitespace. So the match holding the character before the space ends there, and alike whether the space or the
# end of the text follows: neither passes the atom after that character ($ and (?!\S) follow whitespace only, and
# no possessive quantifier is left holding the space). The next match starts at the space: digits are grouped in
# threes from the start of their run, before the cut; a contraction ("it's", "they'LL") ends before the space;
# [^\r\n\p{L}\p{N}]?\p{L}+ takes the space, as the first character of the piece after the cut; o200k's case
# changes ("HTTPServer") split letter runs only, which the space ends. BPE never merges across the pieces.
_GPT2_HF = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"  # ByteLevel's own regex
_LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
           r"\s*[\r\n]+|\s+(?!\S)|\s+")  # also cl100k_base's in older tiktoken
_CL100K = (r"'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|"
           r"\s*[\r\n]|\s+(?!\S)|\s")
_O200K_WORDS = r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]"
_O200K_CAPS = r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]"
_O200K_S = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
SAFE_PATTERNS = frozenset({
    _GPT2_HF,
    r"'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+",  # r50k in older tiktoken
    r"'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s",  # r50k
    _LLAMA3,
    _LLAMA3.replace(r"\p{N}{1,3}", r"\p{N}"),  # Qwen2
    _CL100K,  # cl100k_base
    _CL100K.replace(r"\p{N}{1,3}+", r"(?>\p{N}{1,3})"),  # cl100k_base exported to Hugging Face (_oniguruma_pattern)
    rf"[^\r\n\p{{L}}\p{{N}}]?{_O200K_CAPS}*{_O200K_WORDS}+{_O200K_S}|"
    rf"[^\r\n\p{{L}}\p{{N}}]?{_O200K_CAPS}+{_O200K_WORDS}*{_O200K_S}|"
    r"\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",  # o200k_base
})


def gpt2_cut(text: str, pos: int) -> int:
    """The first place at or after ``pos`` where ``text`` may be cut, -1 where there is none."""
    found = _CUT.search(text, pos)
    return -1 if found is None else found.end()


def pattern_cut(pattern: Optional[str]) -> Optional[Callable[[str, int], int]]:
    """:func:`gpt2_cut` for a byte-level BPE that pre-tokenizes by ``pattern``, None unless that is proven safe."""
    return gpt2_cut if pattern in SAFE_PATTERNS else None


def _split_pattern(pre: dict) -> Optional[str]:
    """The regex a Hugging Face pre-tokenizer (its JSON) cuts text by before its bytes are mapped: ByteLevel's own,
    or a Split's by a regex that keeps every match as a piece, then ByteLevel without one (Llama-3, Qwen2)."""
    if pre.get("type") == "ByteLevel" and pre.get("use_regex", True):
        return _GPT2_HF
    steps = pre.get("pretokenizers") if pre.get("type") == "Sequence" else None
    if not steps or len(steps) != 2:
        return None
    split, byte_level = steps
    if split.get("type") != "Split" or split.get("behavior") != "Isolated" or split.get("invert") \
            or byte_level.get("type") != "ByteLevel" or byte_level.get("use_regex", True):
        return None
    return split.get("pattern", {}).get("Regex")


def hf_cut(tok) -> Optional[Callable[[str, int], int]]:
    """:func:`pattern_cut` for a Hugging Face tokenizer, None for any other (its documents are encoded whole):
    no normaliser or NFC (no canonical decomposition holds an ASCII letter, digit or space but first, nor starts
    with a space: NFC leaves a letter or digit, then a space, as they are, and the text's NFC is its halves'), a
    byte-level pre-tokenizer by a safe regex (_split_pattern), BPE without dropout, and no added token matched in
    the text that could span a cut (one holding whitespace, or taking the whitespace beside it). Special tokens are
    not matched: documents are encoded with split_special_tokens."""
    backend = getattr(tok, "backend_tokenizer", None)  # a slow (Python) tokenizer has none
    if backend is None or backend.pre_tokenizer is None:
        return None
    normalizer, model = backend.normalizer, backend.model
    if normalizer is not None and json.loads(normalizer.__getstate__()).get("type") != "NFC" \
            or type(model).__name__ != "BPE" or model.dropout:
        return None
    for added in backend.get_added_tokens_decoder().values():
        if not added.special and (added.lstrip or added.rstrip or re.search(r"\s", added.content)):
            return None
    return pattern_cut(_split_pattern(json.loads(backend.pre_tokenizer.__getstate__())))
