import pytest

from foxformer.data.tokenizer import load_tokenizer, start_ids

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


def test_a_hub_tokenizer_without_a_route_to_the_hub_looks_only_in_the_cache(monkeypatch):
    """Offline, transformers retried the hub for about a minute before it looked in its cache and failed."""
    import socket

    pytest.importorskip("transformers")
    import transformers

    asked = []
    real = transformers.AutoTokenizer.from_pretrained
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained",
                        lambda name, **kw: asked.append(kw) or real(name, **kw))
    for var in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "https://hub.example.org:8443")
    monkeypatch.setattr(socket, "create_connection", lambda address, timeout=None: (_ for _ in ()).throw(
        OSError("Network is unreachable")))
    with pytest.raises(ValueError, match=r"tokenizer: Hugging Face tokenizer 'nobody/no-such-tokenizer' is not in "
                                         r"the local cache, and hub.example.org:8443 cannot be reached from here "
                                         r"\(Network is unreachable\)"):
        load_tokenizer("hf:nobody/no-such-tokenizer")
    assert asked == [{"local_files_only": True}]


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


# gpt2-json: GPT-2 BPE of json.dumps(text)[1:-1]; the escaped forms below are written out by hand.
BY_HAND = [
    ("a\nb", r"a\nb"),
    ('say "hi"', r"say \"hi\""),
    ("tab\there\\", r"tab\there\\"),
    ("café", r"caf\u00e9"),
    ("東京", r"\u6771\u4eac"),
    ("😀", r"\ud83d\ude00"),  # outside the BMP: a UTF-16 surrogate pair
    ("bell\x07", r"bell\u0007"),
    ("a/b", "a/b"),  # json.dumps leaves slashes alone
]


@pytest.mark.parametrize("text,escaped", BY_HAND, ids=[e for _, e in BY_HAND])
def test_gpt2_json_tokenizes_the_escaped_text(text, escaped):
    tok, gpt2 = load_tokenizer("gpt2-json"), load_tokenizer("gpt2")
    assert tok.encode(text) == gpt2.encode(escaped)
    assert tok.decode(tok.encode(text)) == text


def test_gpt2_json_facts():
    tok = load_tokenizer("gpt2-json")
    assert (tok.name, tok.vocab_size, tok.eot_id, tok.bos_id) == ("gpt2-json", 50257, 50256, 50256)
    assert start_ids(tok) == [50256] and start_ids(load_tokenizer("gpt2")) == []
    # GPT-2 ids: "\" 59, "u" 84, "00" 405, "e" 68, "9" 24; "Hello" 15496, ' \"' 19990, "world" 6894, '\"' 7879
    assert tok.encode("é") == [59, 84, 405, 68, 24]
    assert tok.encode('Hello "world"') == [15496, 19990, 6894, 7879]
    assert tok.encode_batch(["a\nb", "é"]) == [tok.encode("a\nb"), tok.encode("é")]


@pytest.mark.parametrize("ids_text,want", [
    (r"cut at \u00", r"cut at \u00"),      # a stream stopped inside an escape
    ('a bare " quote', 'a bare " quote'),  # not valid JSON, kept as written
    (r"\ud83d alone", "\ufffd alone"),     # half of a surrogate pair
    (r"\\u0041", r"\u0041"),               # an escaped backslash, then plain text
])
def test_gpt2_json_decodes_whatever_a_model_writes(ids_text, want):
    tok, gpt2 = load_tokenizer("gpt2-json"), load_tokenizer("gpt2")
    assert tok.decode(gpt2.encode(ids_text)) == want


def test_hugging_face_form_of_gpt2_and_gpt2_json():
    from foxformer.data.hf_tokenizer import hf_tokenizer

    text = 'She wrote: "naïve"\n\t😀 done'
    for spec in ("gpt2", "gpt2-json"):
        ours, theirs = load_tokenizer(spec), hf_tokenizer(spec)
        assert theirs(text).input_ids == start_ids(ours) + ours.encode(text)
        assert theirs.decode(theirs(text).input_ids, skip_special_tokens=True) == text


def test_saved_tokenizers_load_without_remote_code_except_gpt2_json(tmp_path, monkeypatch):
    """`AutoTokenizer.from_pretrained(export)` asked whether to run remote code for a gpt2-json export. gpt2 and
    bytes load as plain tokenizers; gpt2-json cannot be one: JSON escaping (a \\uXXXX escape for each non-ASCII
    character) is code no step of a tokenizer.json expresses, and a plain GPT2Tokenizer would read newlines, quotes
    and non-ASCII text otherwise than the model did. Without trust_remote_code it is transformers' error, as
    docs/interop.md says; foxformer's own class loads the folder without remote code."""
    import io

    from transformers import AutoTokenizer

    from foxformer.data.hf_tokenizer import save_hf_tokenizer
    from foxformer.data.tokenization_gpt2_json import GPT2JSONTokenizer

    text = 'She wrote: "naïve"\n\t😀 done'
    for spec in ("gpt2", "bytes", "gpt2-json"):
        assert save_hf_tokenizer(spec, str(tmp_path / spec)).pad_token == "<|endoftext|>"
    assert save_hf_tokenizer("no-such-tokenizer", str(tmp_path / "none")) is None  # and writes nothing
    assert not (tmp_path / "none").exists()
    for spec in ("gpt2", "bytes"):
        ours, theirs = load_tokenizer(spec), AutoTokenizer.from_pretrained(tmp_path / spec)
        assert theirs(text).input_ids == start_ids(ours) + ours.encode(text)
        # batched generation needs left padding: the saved files said nothing, so a loaded one padded on the right
        assert (theirs.padding_side, theirs.pad_token) == ("left", "<|endoftext|>")
    monkeypatch.setattr("sys.stdin", io.StringIO(""))  # no one at a terminal to answer transformers' question
    with pytest.raises(ValueError, match="(?s)contains custom code.*`trust_remote_code=True`"):
        AutoTokenizer.from_pretrained(tmp_path / "gpt2-json")
    ours = load_tokenizer("gpt2-json")
    for theirs in (AutoTokenizer.from_pretrained(tmp_path / "gpt2-json", trust_remote_code=True),
                   GPT2JSONTokenizer.from_pretrained(tmp_path / "gpt2-json")):
        assert theirs(text).input_ids == start_ids(ours) + ours.encode(text)
        assert theirs.decode(theirs(text).input_ids, skip_special_tokens=True) == text
        assert theirs.padding_side == "left"


def test_hugging_face_form_of_bytes_gives_the_byte_ids():
    """bytes as a tokenizers tokenizer: the same ids as foxformer's byte tokenizer (a special token's text is
    bytes too), 256 as eos, and the same text back for any ids, even cut UTF-8."""
    import random

    from foxformer.data.hf_tokenizer import hf_tokenizer

    ours, theirs = load_tokenizer("bytes"), hf_tokenizer("bytes")
    texts = ["plain ASCII", "déf f(x): → ✓ naïve", "東京 😀👍🏽", "a\nb\r\n\tc  ", " <|endoftext|>x",
             "\x00\x7f\u00a0\u00ad\u00ff"]
    for text in texts:
        assert theirs(text).input_ids == ours.encode(text) == list(text.encode("utf-8"))
        assert theirs.decode(theirs(text).input_ids) == text
    assert (len(theirs), theirs.eos_token_id, theirs.bos_token_id, theirs.pad_token_id) == (257, 256, 256, 256)
    # every byte valid UTF-8 has: all 1- and 2-byte characters, and a character for each lead byte of 3 and 4
    every_byte = "".join(map(chr, [*range(0x1000), *range(0x1000, 0x10000, 0x1000),
                                   *range(0x10000, 0x110000, 0x40000)]))
    assert theirs(every_byte).input_ids == ours.encode(every_byte)
    rng = random.Random(0)
    for _ in range(300):
        ids = [rng.randrange(257) for _ in range(rng.randrange(1, 10))]
        assert theirs.decode(ids, skip_special_tokens=True) == ours.decode(ids)


# Text around the cuts' edges: whitespace runs before a word, contractions, digits, escapes, non-ASCII letters
_AWKWARD = ("x  y z\n\n w don't stop 12 ab 3x a\tb a\n b é f 😀 g \"q\" r\\ s 東京 t " * 30)


@pytest.mark.parametrize("spec", ["gpt2", "gpt2-json", "bytes"])
def test_a_long_text_encoded_in_pieces_gives_the_ids_of_the_whole(spec):
    """A document of gigabytes was encoded at once into one list of Python ints (about 40 bytes a token): the
    parts cut only where the ids either side stay the whole text's."""
    from pydoc_data.topics import topics

    tok = load_tokenizer(spec)
    text = _AWKWARD + "".join(topics[k] for k in sorted(topics)[:40])
    pieces = list(tok.encode_pieces(text, 500))
    assert len(pieces) > len(text) // 2000
    assert [int(i) for piece in pieces for i in piece] == tok.encode(text)
    assert [list(p) for p in tok.encode_pieces("short", 500)] == [tok.encode("short")]
