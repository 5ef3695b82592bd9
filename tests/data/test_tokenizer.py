import pytest

from foxformer.data.tokenizer import load_tokenizer

# Reference ids from tiktoken's "gpt2" encoding (OpenAI's GPT-2 BPE).
KNOWN = [
    ("Hello world", [15496, 995]),
    ("hello world", [31373, 995]),
    (" The quick brown fox", [383, 2068, 7586, 21831]),
    ("def f(x):\n    return x", [4299, 277, 7, 87, 2599, 198, 220, 220, 220, 1441, 2124]),
]


@pytest.mark.parametrize("text,ids", KNOWN, ids=[k[0].split("\n")[0].strip() for k in KNOWN])
def test_gpt2_ids_match_reference(text, ids):
    tok = load_tokenizer("gpt2")
    assert tok.encode(text) == ids
    assert tok.decode(ids) == text


def test_gpt2_facts():
    tok = load_tokenizer("gpt2")
    assert tok.name == "gpt2"
    assert tok.vocab_size == 50257
    assert tok.eot_id == 50256
    # Special-token text inside a document is ordinary text, never the separator.
    assert 50256 not in tok.encode("a <|endoftext|> b")


def test_batch_equals_single():
    tok = load_tokenizer("gpt2")
    texts = ["one", "two words", "", "ünïcödé ✓"]
    assert tok.encode_batch(texts) == [tok.encode(t) for t in texts]


@pytest.mark.parametrize("spec", ["bogus", "nope:thing"], ids=["plain-name", "unknown-scheme"])
def test_unknown_spec_is_a_clear_error(spec):
    with pytest.raises(ValueError, match="tokenizer"):
        load_tokenizer(spec)


def test_non_string_spec():
    with pytest.raises(TypeError, match="tokenizer"):
        load_tokenizer(None)


def test_byte_tokenizer_round_trips_utf8():
    tok = load_tokenizer("bytes")
    assert (tok.vocab_size, tok.eot_id) == (257, 256)
    text = "déf f(x): → ✓"
    ids = tok.encode(text)
    assert ids == list(text.encode("utf-8")) and max(ids) < 256
    assert tok.decode(ids + [256]) == text
