"""A long document in pieces through byte-level BPE tokenizers that pre-tokenize by Llama-3's, Qwen2's, Qwen3.5's,
DeepSeek-V3's or tiktoken's regexes (tokenizer_cuts): the ids of the whole text, cut many times; an unknown regex or
sequence of them still encodes it whole."""
import hashlib
import os
import random
import tempfile

import pytest

from foxformer.data import hf_tokenizer as hf_tok
from foxformer.data.tokenizer import _from_tiktoken_encoding, load_tokenizer

from .helpers import gpt2_ranks_with

pytest.importorskip("tokenizers")

# Spelt here as the models' tokenizer.json files have them, not taken from the code under test
LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|"
          r"\s+(?!\S)|\s+")
QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|"
         r"\s+(?!\S)|\s+")
QWEN35 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|"
          r"\s*[\r\n]+|\s+(?!\S)|\s+")  # Qwen/Qwen3.5-9B
# deepseek-ai/DeepSeek-V3: three Splits, each on the pieces of the one before; CR and LF themselves in the last
DEEPSEEK_V3 = [r"\p{N}{1,3}", "[一-龥\u3040-ゟ゠-ヿ]+",
               "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+|"
               " ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"]

# What a cut may meet on either side: digit runs longer than three, contractions in either case, punctuation,
# letters outside ASCII (decomposed ones for NFC), combining marks (after an ASCII letter, alone, in Devanagari),
# CJK and kana next to ASCII, other digits, case changes, runs of spaces, newlines, CRLF, tabs, nbsp
WORDS = ["it's", "THEY'LL", "don't", "we'Re", "1234567", "89", "x2", "3.14159", "1,000,000", "naïve", "Cafe\u0301",
         "東京", "ΑΒΓδ", "HTTPServer", "iPhone", "😀", "(a)", "--", "/usr/bin", "$5", "a", "Z", "q9", "word",
         "x\u0301", "a\u0308b", "\u0301", "\u0301\u0308x", "नमस्ते", "ひらがなabc", "カタカナ", "東京abc", "x東", "한국어",
         "٣٤٥", "½", "e.g.", ".com", "#tag", "'s", "a'", "9東"]
SEPARATORS = [" "] * 12 + ["  ", "   ", "\n", "\n\n", "\r\n", " \n ", "\t", "\u00a0", "\u3000", " \r\n\r\n  "]


def _text(n_words: int = 3000) -> str:
    rng = random.Random(0)
    return "".join(rng.choice(WORDS) + rng.choice(SEPARATORS) for _ in range(n_words))


TEXT = _text()


def _hf(folder, pattern: str = LLAMA3, normalizer=None, steps=None):
    """A byte-level BPE trained on TEXT, pre-tokenized by ``pattern`` (Split, then ByteLevel without its regex)
    or by ``steps``, saved in ``folder`` and loaded as foxformer loads Hugging Face tokenizers."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.normalizer = normalizer
    backend.pre_tokenizer = pre_tokenizers.Sequence(steps or [
        pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    backend.decoder = decoders.ByteLevel()
    backend.train_from_iterator([TEXT], trainers.BpeTrainer(
        vocab_size=600, special_tokens=["</s>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False))
    PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="</s>").save_pretrained(str(folder))
    return load_tokenizer(str(folder))


def _assert_cut_safely(tok, text: str = TEXT) -> None:
    assert tok._cut is not None
    whole = [int(i) for i in tok.encode(text)]
    for size in (1, 7, 64):
        pieces = list(tok.encode_pieces(text, size))
        assert len(pieces) > 10, size
        assert [int(i) for piece in pieces for i in piece] == whole, size


@pytest.mark.parametrize("pattern, nfc", [(LLAMA3, False), (QWEN2, True), (QWEN2, False), (QWEN35, True),
                                          (QWEN35, False)],
                         ids=["llama3", "qwen2 (NFC)", "qwen2 without NFC", "qwen3.5 (NFC)", "qwen3.5 without NFC"])
def test_llama3_and_qwen_regexes_cut_with_the_ids_of_the_whole(tmp_path, pattern, nfc):
    from tokenizers import normalizers

    _assert_cut_safely(_hf(tmp_path, pattern, normalizers.NFC() if nfc else None))


def _deepseek_steps(patterns=DEEPSEEK_V3):
    from tokenizers import Regex, pre_tokenizers

    return [pre_tokenizers.Split(Regex(p), behavior="isolated") for p in patterns] + [
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)]


def test_deepseek_v3_splits_cut_with_the_ids_of_the_whole(tmp_path):
    """Its normaliser is a Sequence of none, as in its tokenizer.json."""
    from tokenizers import normalizers

    _assert_cut_safely(_hf(tmp_path, normalizer=normalizers.Sequence([]), steps=_deepseek_steps()))


@pytest.mark.parametrize("constructor", ["r50k_base", "cl100k_base", "o200k_base"])
def test_tiktoken_regexes_cut_with_the_ids_of_the_whole(monkeypatch, tmp_path, constructor):
    """tiktoken's own regex strings (GPT-2's ranks, offline), in tiktoken and as exported to Hugging Face, whose
    regex engine reads cl100k's possessive digit groups otherwise (_oniguruma_pattern)."""
    enc = gpt2_ranks_with(monkeypatch, constructor)
    _assert_cut_safely(_from_tiktoken_encoding(f"tiktoken:{constructor}", enc))
    hf_tok.tiktoken_tokenizer(enc).save_pretrained(str(tmp_path))
    _assert_cut_safely(load_tokenizer(str(tmp_path)))


def _tiktoken_cached(url: str) -> bool:
    """Whether tiktoken has the file at ``url`` in its cache (it fetches the ones it lacks)."""
    cache = os.environ.get("TIKTOKEN_CACHE_DIR", os.environ.get("DATA_GYM_CACHE_DIR"))
    cache = os.path.join(tempfile.gettempdir(), "data-gym-cache") if cache is None else cache
    return bool(cache) and os.path.exists(os.path.join(cache, hashlib.sha1(url.encode()).hexdigest()))


def test_real_cl100k_base_cuts_with_the_ids_of_the_whole():
    if not _tiktoken_cached("https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken"):
        pytest.skip("tiktoken's cl100k_base files are not cached here")
    _assert_cut_safely(load_tokenizer("tiktoken:cl100k_base"))


def _unknown(tmp_path):
    """Pre-tokenizers without a cut proven safe: another regex (Llama-3's, but a word keeps the space after it
    rather than before it), a split that drops its matches, another step, a normaliser other than NFC, DeepSeek-V3's
    splits with that other regex last or in another order, and with a normaliser that lowercases."""
    from tokenizers import Regex, normalizers, pre_tokenizers

    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    split = pre_tokenizers.Split(Regex(LLAMA3), behavior="isolated")
    yield _hf(tmp_path / "regex", LLAMA3.replace(r"[^\r\n\p{L}\p{N}]?\p{L}+", r"\p{L}+ ?"))
    yield _hf(tmp_path / "removed", steps=[pre_tokenizers.Split(Regex(LLAMA3), behavior="removed", invert=True),
                                           byte_level])
    yield _hf(tmp_path / "digits", steps=[pre_tokenizers.Digits(), split, byte_level])
    yield _hf(tmp_path / "lowercase", normalizer=normalizers.Lowercase())
    other = LLAMA3.replace(r"[^\r\n\p{L}\p{N}]?\p{L}+", r"\p{L}+ ?")
    yield _hf(tmp_path / "deepseek-other", steps=_deepseek_steps(DEEPSEEK_V3[:2] + [other]))
    yield _hf(tmp_path / "deepseek-order", steps=_deepseek_steps(DEEPSEEK_V3[::-1]))
    yield _hf(tmp_path / "deepseek-lowercase", normalizer=normalizers.Sequence([normalizers.NFC(),
                                                                                normalizers.Lowercase()]),
              steps=_deepseek_steps())


def test_an_unknown_pre_tokenizer_encodes_the_text_whole(tmp_path):
    for tok in _unknown(tmp_path):
        assert tok._cut is None, tok.name
        assert [list(p) for p in tok.encode_pieces(TEXT, 7)] == [tok.encode(TEXT)]
