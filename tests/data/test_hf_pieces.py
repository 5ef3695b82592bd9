"""A long document through a Hugging Face tokenizer: encoded in pieces where GPT-2's pre-tokenizer provably cuts,
with the ids of the whole text, and without transformers' warning about the model's maximum length."""
import lzma
import os

import pytest

from foxformer.data.hf_tokenizer import save_hf_tokenizer
from foxformer.data.tokenizer import load_tokenizer
from foxformer.data.tokenizer_cuts import hf_cut

from .helpers import word_tokenizer

PROSE = "/work/shared/data/prose.jsonl.xz"


@pytest.fixture(scope="module")
def gpt2_folder(tmp_path_factory):
    """GPT-2 saved as a Hugging Face tokenizer folder (byte-level BPE, GPT-2's regex), as the hub's is: its
    model_max_length 1024 is what transformers' length warning compares with."""
    folder = str(tmp_path_factory.mktemp("gpt2"))
    assert save_hf_tokenizer("gpt2", folder, model_max_length=1024) is not None
    return folder


def _real_text() -> str:
    """A few hundred KB of real text: two of Shakespeare's plays from the offline corpora, or Python's reference
    topics where those are not there."""
    if os.path.exists(PROSE):
        import json

        with lzma.open(PROSE, "rt", encoding="utf-8") as f:
            return "".join(json.loads(next(f))["text"] for _ in range(2))
    from pydoc_data.topics import topics

    return "".join(topics[k] for k in sorted(topics))


def _pieces(tok, text: str, size: int) -> list[list[int]]:
    return [[int(i) for i in piece] for piece in tok.encode_pieces(text, size)]


def test_a_long_real_text_in_pieces_gives_the_ids_of_the_whole(gpt2_folder):
    tok = load_tokenizer(gpt2_folder)
    text = _real_text()
    assert len(text) > 200_000
    pieces = _pieces(tok, text, 2000)
    assert len(pieces) > len(text) // 4000  # cut about every 2000 characters, not encoded whole
    assert [i for piece in pieces for i in piece] == tok.encode(text) == load_tokenizer("gpt2").encode(text)


# Whitespace runs just before and after the cuts, contractions, digits, non-ASCII letters and symbols
EDGES = {
    "spaces": "word" + "  " * 50 + " next a" + " b" * 300,
    "newlines": "para one.\n\n\n   Para two\n \n x" + "\n\n y z" * 200,
    "tabs and nbsp": "a\t\tb c\u00a0d e\u3000f " * 150,
    "non-ASCII": "naïve café Straße 東京 tōkyō 😀👍🏽 ﬁne é a " * 80,
    "digits and contractions": "it's 12 ab 3x don't 1,000 they'LL x2 y " * 100,
}


@pytest.mark.parametrize("text", EDGES.values(), ids=EDGES.keys())
def test_whitespace_and_non_ascii_at_the_cuts_keep_the_ids(gpt2_folder, text):
    tok = load_tokenizer(gpt2_folder)
    for size in (1, 7, 64):
        pieces = _pieces(tok, text, size)
        assert len(pieces) > 10
        assert [i for piece in pieces for i in piece] == tok.encode(text), size


@pytest.mark.parametrize("text", ["x" * 5000, "東京" * 3000, " \n" * 3000, "1 2 3 " * 800, "a-b-" * 1000],
                         ids=["one word", "no ASCII", "only whitespace", "no letter after a space", "no spaces"])
def test_a_text_without_a_safe_cut_is_encoded_whole(gpt2_folder, text):
    tok = load_tokenizer(gpt2_folder)
    assert _pieces(tok, text, 10) == [tok.encode(text)]


def test_a_long_document_gives_no_maximum_length_warning(gpt2_folder, capfd, caplog):
    """GPT-2's folder says model_max_length 1024: transformers warned that the document's ids 'will result in
    indexing errors', which training, cutting sequences from the stream, never meets."""
    load_tokenizer.cache_clear()  # transformers warns once a tokenizer: not one that another test already used
    tok = load_tokenizer(gpt2_folder)
    text = _real_text()[:50_000]
    assert len(tok.encode(text)) > 1024 and len(list(tok.encode_pieces(text, 20_000))) > 1
    out = capfd.readouterr()
    assert "longer than the specified maximum" not in out.out + out.err + caplog.text


def test_other_tokenizers_are_encoded_whole(gpt2_folder, tmp_path):
    """A pre-tokenizer other than GPT-2's (here: whitespace words), or an added token that could span a cut, has
    no cut proven safe: the document goes whole."""
    from transformers import AutoTokenizer

    word_tokenizer(tmp_path / "words", {"a": 1, "b": 2})
    words = load_tokenizer(str(tmp_path / "words"))
    assert words._cut is None and _pieces(words, "a b " * 100, 8) == [words.encode("a b " * 100)]
    hf = AutoTokenizer.from_pretrained(gpt2_folder)
    assert hf_cut(hf) is not None
    hf.add_tokens(["x y"])  # "...x| y..." is one token, whichever side of the space it is cut
    assert hf_cut(hf) is None
