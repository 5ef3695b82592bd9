"""tiktoken encodings in their Hugging Face form: the same ids as tiktoken, special tokens at their own ids."""
import glob
import os

import pytest
import tiktoken

from foxformer.data import hf_tokenizer as hf_tok
from foxformer.data.specs import EOT_TEXT, GPT2_EOT
from foxformer.data.tokenizer import load_tokenizer, tiktoken_encoding

from .helpers import gpt2_ranks_with

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ODD_TEXTS = [
    "héllo wörld  \n\n\t  x", f"{EOT_TEXT} between {EOT_TEXT}", "1234567 numbers 3.14159 and 1,000,000",
    "日本語のテキストと中文", "emoji 🦊🦊 and a ZWJ 👩‍💻", "   leading spaces", "trailing spaces   \n",
    "it's we'LL they're I'M", "a\r\nb\r\n\r\n", "tabs\t\tand\u00a0nbsp", "CamelCaseWords andUPPER lower",
    "x" * 500, " " * 40 + "y", "\n" * 9,
]


def _texts() -> list[str]:
    """ODD_TEXTS and this repository's code and docs (~1 MB: prose, code, markdown, numbers, whitespace runs)."""
    files = sorted(glob.glob(os.path.join(ROOT, "src", "foxformer", "**", "*.py"), recursive=True))
    files += sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))
    texts = list(ODD_TEXTS)
    for path in files:
        with open(path, encoding="utf-8") as f:
            texts.append(f.read())
    return texts


def _same_ids(enc, tok, texts) -> None:
    for text in texts:
        want = enc.encode_ordinary(text)
        got = tok(text, add_special_tokens=False)["input_ids"]
        assert got == want, f"{text[:60]!r}: {len(got)} ids against tiktoken's {len(want)}"
        assert tok.decode(got) == enc.decode(want)


def test_gpt2_encoding_converts_to_the_same_ids():
    enc = tiktoken_encoding("gpt2")
    tok = hf_tok.tiktoken_tokenizer(enc)
    _same_ids(enc, tok, _texts())
    assert tok.eos_token_id == tok.bos_token_id == GPT2_EOT
    assert tok(EOT_TEXT, add_special_tokens=False)["input_ids"] == enc.encode_ordinary(EOT_TEXT)  # plain text
    assert tok.convert_tokens_to_ids(EOT_TEXT) == GPT2_EOT


@pytest.mark.parametrize("constructor", ["cl100k_base", "o200k_base"])
def test_newer_patterns_and_special_ids_convert(monkeypatch, constructor):
    enc = gpt2_ranks_with(monkeypatch, constructor)
    tok = hf_tok.tiktoken_tokenizer(enc)
    _same_ids(enc, tok, ODD_TEXTS + _texts()[-3:])
    for name, i in enc._special_tokens.items():  # ids past the ranks, with gaps: each keeps its own
        assert tok.convert_tokens_to_ids(name) == i
    assert tok.eos_token_id == enc.eot_token


def test_tiktoken_spec_saves_files_that_autotokenizer_loads(monkeypatch, tmp_path):
    from transformers import AutoTokenizer

    enc = gpt2_ranks_with(monkeypatch, "cl100k_base")
    monkeypatch.setattr(tiktoken, "get_encoding", lambda name: enc)
    assert hf_tok.save_hf_tokenizer("tiktoken:cl100k_base", str(tmp_path), model_max_length=4096).pad_token_id == 100257
    tok = AutoTokenizer.from_pretrained(tmp_path)
    text = ODD_TEXTS[0] + ODD_TEXTS[2]
    assert tok(text, add_special_tokens=False)["input_ids"] == enc.encode_ordinary(text)
    assert tok.eos_token_id == enc.eot_token == 100257 and tok.model_max_length == 4096
    load_tokenizer.cache_clear()  # its cache must not keep the patched encoding for other tests


def test_a_token_that_is_no_merge_is_refused():
    enc = tiktoken.Encoding(name="odd", pat_str=r"\S+|\s+", special_tokens={},
                            mergeable_ranks={**{bytes([b]): b for b in range(256)}, b"abc": 256})
    with pytest.raises(ValueError, match=r"b'abc' \(id 256\) is not the merge of two lower-ranked tokens"):
        hf_tok.tiktoken_tokenizer(enc)


def test_possessive_intervals_become_atomic_groups():
    """Oniguruma reads x{1,3}+ as "x{1,3}, repeated": cl100k's digits would group a whole number (the test above
    failed on "1234567" that way before the rewrite)."""
    assert hf_tok._oniguruma_pattern(r"\p{N}{1,3}+| ?[^\s]++[\r\n]*+") == r"(?>\p{N}{1,3})| ?[^\s]++[\r\n]*+"
    assert hf_tok._oniguruma_pattern(r"[a\]]{2,}+x") == r"(?>[a\]]{2,})x"
    with pytest.raises(ValueError, match="possessive interval on a group"):
        hf_tok._oniguruma_pattern(r"(ab){2}+")
