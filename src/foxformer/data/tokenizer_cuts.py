"""Where a long document may be cut so that its parts, encoded one by one, give the ids of the whole text
(Tokenizer.encode_pieces): only for byte-level BPE tokenizers whose pre-tokenizer regexes are ones proven safe here."""

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
# digit is matched only by a run of letters, marks or digits (\p{L}+, [\p{L}\p{M}]+, a contraction's letters,
# \p{N}{1,3} or \p{N}, o200k's cased runs), after which the alternative goes on only with letters, marks, digits or
# a contraction's apostrophe, or ends; a space is matched only as a match's first character or inside a run of
# whitespace. So the match holding the character before the space ends there, and alike whether the space or the
# end of the text follows: neither passes the atom after that character ($ and (?!\S) follow whitespace only, and
# no possessive quantifier is left holding the space). The next match starts at the space: digits are grouped in
# threes from the start of their run, before the cut; a contraction ("it's", "they'LL") ends before the space;
# [^\r\n\p{L}\p{N}]?\p{L}+ (or [\p{L}\p{M}]+) takes the space, as the first character of the piece after the cut;
# o200k's case changes ("HTTPServer") split letter runs only, which the space ends. Combining marks change nothing:
# a mark is not a space, so a run that takes marks (Qwen3.5's, o200k's) stops at the space as \p{L}+ does, and the
# letter after the space is ASCII, so a mark after it is the right part's alone, as in the whole text. BPE never
# merges across the pieces.
_GPT2_HF = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"  # ByteLevel's own regex
_LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
           r"\s*[\r\n]+|\s+(?!\S)|\s+")  # also cl100k_base's in older tiktoken
_QWEN2 = _LLAMA3.replace(r"\p{N}{1,3}", r"\p{N}")
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
    _QWEN2,  # also Qwen3's
    _QWEN2.replace(r"]?\p{L}+", r"]?[\p{L}\p{M}]+").replace(r"[^\s\p{L}\p{N}]", r"[^\s\p{L}\p{M}\p{N}]"),  # Qwen3.5
    _CL100K,  # cl100k_base
    _CL100K.replace(r"\p{N}{1,3}+", r"(?>\p{N}{1,3})"),  # cl100k_base exported to Hugging Face (_oniguruma_pattern)
    rf"[^\r\n\p{{L}}\p{{N}}]?{_O200K_CAPS}*{_O200K_WORDS}+{_O200K_S}|"
    rf"[^\r\n\p{{L}}\p{{N}}]?{_O200K_CAPS}+{_O200K_WORDS}*{_O200K_S}|"
    r"\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",  # o200k_base
})


# DeepSeek-V3's Splits, each run on the pieces the one before left, as its tokenizer.json spells them (CR and LF
# are the characters themselves in the last). None has a lookbehind or an empty match. The digit groups and the
# runs of CJK ideographs or kana take none of the three ASCII characters at a cut: where a digit comes before the
# space, the digit groups end there (grouped from the start of their run, before the cut) and the parts' pieces are
# the whole text's from then on; otherwise the two pieces that meet at the cut, the left part's last and the right
# part's first, go on to the next Split as one piece. In the last regex only [A-Za-z]+ and [\p{L}\p{M}]+ take the
# letter before the space (its other classes leave letters out, so no other alternative gets past it), and the
# space ends them as the end of the text does; its next match starts at the space, by
# [^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+ as at the start of the right part (its first alternative needs
# punctuation before the letters). So that piece splits at the cut, into the parts' own pieces.
_DEEPSEEK_V3 = (
    r"\p{N}{1,3}",
    "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+|"
    " ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+")
# The Isolated Splits (by regex, in order) of a pre-tokenizer under which a cut at _CUT keeps the ids
SAFE_SPLITS = frozenset({(pattern,) for pattern in SAFE_PATTERNS} | {_DEEPSEEK_V3})


def gpt2_cut(text: str, pos: int) -> int:
    """The first place at or after ``pos`` where ``text`` may be cut, -1 where there is none."""
    found = _CUT.search(text, pos)
    return -1 if found is None else found.end()


def pattern_cut(pattern: Optional[str]) -> Optional[Callable[[str, int], int]]:
    """:func:`gpt2_cut` for a byte-level BPE that pre-tokenizes by ``pattern``, None unless that is proven safe."""
    return gpt2_cut if pattern in SAFE_PATTERNS else None


def _split_patterns(pre: dict) -> Optional[tuple[str, ...]]:
    """The regexes a Hugging Face pre-tokenizer (its JSON) cuts text by before its bytes are mapped: ByteLevel's
    own, or those of Splits that keep every match as a piece, each on the pieces of the one before, then ByteLevel
    without one (Llama-3, Qwen2, DeepSeek-V3)."""
    if pre.get("type") == "ByteLevel" and pre.get("use_regex", True):
        return (_GPT2_HF,)
    steps = pre.get("pretokenizers") if pre.get("type") == "Sequence" else None
    if not steps or len(steps) < 2:
        return None
    *splits, byte_level = steps
    if byte_level.get("type") != "ByteLevel" or byte_level.get("use_regex", True):
        return None
    patterns = []
    for split in splits:
        if split.get("type") != "Split" or split.get("behavior") != "Isolated" or split.get("invert"):
            return None
        patterns.append(split.get("pattern", {}).get("Regex"))
    return tuple(patterns)


def _nfc_or_none(normalizer: dict) -> bool:
    """Whether a normaliser (its JSON) is NFC, or a Sequence of NFCs: NFC again changes nothing, and DeepSeek's
    Sequence of none is no normaliser."""
    if normalizer.get("type") == "Sequence":
        return all(_nfc_or_none(step) for step in normalizer.get("normalizers", []))
    return normalizer.get("type") == "NFC"


def hf_cut(tok) -> Optional[Callable[[str, int], int]]:
    """:func:`gpt2_cut` for a Hugging Face tokenizer, None for any other (its documents are encoded whole): no
    normaliser or NFC (_nfc_or_none; no canonical decomposition holds an ASCII letter, digit or space but first,
    nor starts with a space: NFC leaves a letter or digit, then a space, as they are, and the text's NFC is its
    halves'), a byte-level pre-tokenizer by safe regexes (_split_patterns), BPE without dropout, and no added token
    matched in the text that could span a cut (one holding whitespace, or taking the whitespace beside it). Special
    tokens are not matched: documents are encoded with split_special_tokens."""
    backend = getattr(tok, "backend_tokenizer", None)  # a slow (Python) tokenizer has none
    if backend is None or backend.pre_tokenizer is None:
        return None
    normalizer, model = backend.normalizer, backend.model
    if normalizer is not None and not _nfc_or_none(json.loads(normalizer.__getstate__())) \
            or type(model).__name__ != "BPE" or model.dropout:
        return None
    for added in backend.get_added_tokens_decoder().values():
        if not added.special and (added.lstrip or added.rstrip or re.search(r"\s", added.content)):
            return None
    splits = _split_patterns(json.loads(backend.pre_tokenizer.__getstate__()))
    return gpt2_cut if splits in SAFE_SPLITS else None
