"""foxformer.infer.generation: greedy equals Hugging Face generate, seeded sampling, top-k / top-p,
text streaming (UTF-8 split across tokens), stop tokens, other causal LMs, clear errors."""
import warnings

import numpy as np
import pytest
import torch

from foxformer.data import load_tokenizer
from foxformer.infer import GenerationConfig, GreedyNote, generate, sample_next, stream_tokens

from .conftest import VOCAB, make_model, tokens


@pytest.mark.parametrize("preset", ["fox-pro-tiny", "fox-llama-tiny", "transformer-pro-tiny"])
def test_greedy_equals_hf_generate(preset):
    model = make_model(preset)
    prompt = tokens(2, 7)
    ours = torch.stack(list(generate(model, prompt, max_new_tokens=9, temperature=0)), 1)
    hf = model.generate(prompt, max_new_tokens=9, do_sample=False, pad_token_id=0)[:, 7:]
    assert torch.equal(ours, hf)
    assert list(generate(model, prompt[0].tolist(), max_new_tokens=9, temperature=0)) == hf[0].tolist()


def test_chunked_prefill_and_decode_kernel_path_agree():
    model = make_model("fox-pro-tiny")
    prompt = tokens(1, 40)
    a = list(generate(model, prompt[0], max_new_tokens=6, temperature=0))
    b = list(generate(model, prompt[0], max_new_tokens=6, temperature=0, prefill_chunk=7))
    assert a == b


def test_seeded_sampling_is_reproducible_and_filters_apply():
    model = make_model("fox-pro-tiny", dtype=torch.float32)
    prompt = tokens(1, 5)[0]
    runs = [list(generate(model, prompt, max_new_tokens=12, temperature=1.5, top_k=50, seed=7)) for _ in range(2)]
    assert runs[0] == runs[1]
    assert runs[0] != list(generate(model, prompt, max_new_tokens=12, temperature=1.5, top_k=50, seed=8))
    greedy = list(generate(model, prompt, max_new_tokens=12, temperature=0))
    assert list(generate(model, prompt, max_new_tokens=12, temperature=2.0, top_k=1, seed=1)) == greedy
    assert list(generate(model, prompt, max_new_tokens=12, temperature=2.0, top_p=1e-6, seed=1)) == greedy


def test_top_k_top_p_keep_the_right_tokens():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    g = torch.Generator().manual_seed(0)
    seen = {int(sample_next(logits, GenerationConfig(top_p=0.7), g)) for _ in range(200)}
    assert seen == {0, 1}  # 0.5 < 0.7 so the second token is needed, the third is not
    seen = {int(sample_next(logits, GenerationConfig(top_k=3), g)) for _ in range(300)}
    assert seen == {0, 1, 2}


def test_text_streaming_with_a_tokenizer():
    model = make_model("fox-pro-tiny", dtype=torch.float32)
    tok = load_tokenizer("bytes")
    pieces = list(generate(model, tok, "Hi there", max_new_tokens=15, temperature=0, ignore_eos=True))
    ids = list(generate(model, tok.encode("Hi there"), max_new_tokens=15, temperature=0))
    assert "".join(pieces) == tok.decode(ids) and len(pieces) > 1
    assert "".join(generate(model, "bytes", prompt="Hi there", max_new_tokens=15, temperature=0,
                            ignore_eos=True)) == "".join(pieces)


class _ByteTok:
    """Bytes tokenizer that reports an end-of-text id."""

    eot_id = 256

    def encode(self, text):
        return list(text.encode("utf-8"))

    def decode(self, ids):
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")


def test_a_prompt_starts_with_the_tokenizers_bos():
    """gpt2-json models read BOS first: generate prepends a tokenizer's bos_id to the prompt."""
    class BosTok(_ByteTok):
        bos_id = 256  # as in gpt2-json, also the end-of-text id

    model = make_model("fox-pro-tiny", dtype=torch.float32)
    text = "".join(generate(model, BosTok(), "Hi", max_new_tokens=8, temperature=0, ignore_eos=True))
    ids = list(generate(model, [256] + list(b"Hi"), max_new_tokens=8, temperature=0))
    assert text == BosTok().decode(ids)
    without = list(generate(model, list(b"Hi"), max_new_tokens=8, temperature=0))
    assert ids != without  # the BOS matters to the model, so the comparison above can tell


def test_multibyte_characters_are_not_split(monkeypatch):
    from foxformer.infer import generation as gen

    script = list("é€😀".encode("utf-8")) + [256, 65]

    def fake_stream(model, ids, cfg, state, **kwargs):
        for t in script[:cfg.max_new_tokens]:
            yield torch.tensor([t])

    monkeypatch.setattr(gen, "stream_tokens", fake_stream)
    pieces = list(gen.generate(make_model(), _ByteTok(), "x", max_new_tokens=20))
    assert pieces == ["é", "€", "😀"]  # nothing after the end-of-text token, no replacement characters


def _scripted(monkeypatch, script, interrupt_after=None):
    """generate's text path over a fixed sequence of new ids (no model): [T] ids for one row, or [B, T] (rows);
    Ctrl-C (a KeyboardInterrupt from the source) after ``interrupt_after`` steps."""
    from foxformer.infer import generation as gen

    steps = torch.tensor(script)
    steps = steps[:, None] if steps.dim() == 1 else steps.T  # [T, B]

    def fake_stream(model, ids, cfg, state, **kwargs):
        for i, step in enumerate(steps[:cfg.max_new_tokens]):
            if i == interrupt_after:
                raise KeyboardInterrupt
            yield step

    monkeypatch.setattr(gen, "stream_tokens", fake_stream)
    return gen


def test_gpt2_json_streams_its_escapes_decoded(monkeypatch):
    """The paper's models (gpt2-json) write an escape such as \\u00e9 as several tokens: each was decoded alone,
    so the stream (and `foxformer generate`'s text) showed '\\u00e9', '\\n' and '\\ud83d\\ude00' verbatim."""
    tok = load_tokenizer("gpt2-json")
    text = 'caf\u00e9 said "hi"\n\tC:\\path\\ \U0001F600 \u20ac, \\u00e9 stays literal'
    gen = _scripted(monkeypatch, tok.encode(text) + [tok.eot_id])
    pieces = list(gen.generate(make_model(), tok, "x", max_new_tokens=100))
    assert "".join(pieces) == text == tok.decode(tok.encode(text)) and len(pieces) > 10


def test_a_sentencepiece_tokenizer_streams_the_spaces_between_words(monkeypatch):
    """Decoded one piece at a time, a SentencePiece-style tokenizer (Hugging Face's Metaspace decoder) drops the
    space of each word's leading '\u2581': the stream read 'Helloworld!' for 'Hello world!'."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "</s>": 1, "\u2581Hello": 2, "\u2581world": 3, "!": 4, "<0xC3>": 5, "<0xA9>": 6}
    inner = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>", byte_fallback=True))
    inner.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                       decoders.Strip(" ", 1, 0)])
    tok = PreTrainedTokenizerFast(tokenizer_object=inner, eos_token="</s>", unk_token="<unk>")
    script = [2, 3, 4, 5, 6, 3, tok.eos_token_id]
    gen = _scripted(monkeypatch, script)
    pieces = list(gen.generate(make_model(), tok, "Hello", max_new_tokens=20))
    assert pieces == ["Hello", " world", "!", "\u00e9", " world"]
    assert "".join(pieces) == tok.decode(script[:-1]) == "Hello world!\u00e9 world"


STOPS = {"split-across-tokens": (["o w"], 20, ["Hell"]),
         "first-found-in-the-text": ([". The", "ll"], 20, ["He"]),
         "held-back-then-released": (["worlds", ". X"], 20, ["Hello", " ", "world", ". The", " end"]),
         "held-back-at-the-last-token": (["worlds"], 2, ["Hello", " ", "world"]),
         "one-string": (" end", 20, ["Hello", " world", ".", " The"])}


@pytest.mark.parametrize("stops, max_new_tokens, pieces", list(STOPS.values()), ids=list(STOPS))
def test_stop_strings_cut_the_streamed_text_before_them(monkeypatch, stops, max_new_tokens, pieces):
    """Stop strings end the text, which stops before the first one in it (the stop string is not output); text that
    may begin one is held back until the next token tells, so no piece streamed out holds part of a stop string."""
    tok = load_tokenizer("gpt2")
    gen = _scripted(monkeypatch, tok.encode("Hello world. The end") + [tok.eot_id])
    state = {}
    assert list(gen.generate(make_model(), tok, "x", max_new_tokens=max_new_tokens, stop=stops, state=state)) == pieces
    if stops == ["o w"]:
        assert state["new_tokens"] == 2  # " world" completed the stop string: nothing read past it


def test_stop_strings_end_a_generation_early():
    model = make_model("fox-pro-tiny")
    tok = load_tokenizer("bytes")
    free = "".join(generate(model, tok, "Once upon", max_new_tokens=24, temperature=0, ignore_eos=True))
    stop = free[6:9]
    calls = []
    handle = model.register_forward_hook(lambda *_: calls.append(None))
    state = {}
    text = "".join(generate(model, tok, "Once upon", max_new_tokens=24, temperature=0, ignore_eos=True, stop=[stop],
                            state=state))
    handle.remove()
    assert text == free[:free.index(stop)] and len(free) > len(text) + len(stop)
    assert state["new_tokens"] < 24 and len(calls) <= state["new_tokens"] + 1  # the prefill, one step queued per token


def test_rows_of_a_batch_end_each_at_its_first_stop(monkeypatch):
    """A list of prompts yields each row's piece per step: a row ends at a stop string or the stop token when it
    comes ("" after that), the others go on, and no token is read once every row has ended."""
    from foxformer.infer import generation as gen

    tok = load_tokenizer("gpt2")
    rows = [tok.encode("Hello. The end"), tok.encode("Hello world, and more. The end"),
            tok.encode("Hi") + [tok.eot_id] + tok.encode(" unread")]
    width = max(map(len, rows))
    script = torch.tensor([row + [tok.eot_id] * (width - len(row)) for row in rows])
    read = []

    def fake_stream(model, ids, cfg, state, **kwargs):
        assert kwargs["attention_mask"].tolist() == [[0, 0, 1], [0, 1, 1], [1, 1, 1]]  # left padding
        for step in range(script.shape[1]):
            read.append(step)
            yield script[:, step]

    monkeypatch.setattr(gen, "stream_tokens", fake_stream)
    state = {}
    steps = list(gen.generate(make_model(), tok, ["a", "b c", "a longer prompt"], max_new_tokens=40,
                              stop=[". The"], state=state))
    assert [[step[row] for step in steps] for row in range(3)] == [
        ["Hello", "", "", "", "", "", ""],
        ["Hello", " world", ",", " and", " more", "", ""],  # "." held back: it may begin ". The"
        ["Hi", "", "", "", "", "", ""]]
    assert state["new_tokens"] == [3, 7, 1] and len(read) == len(steps) == 7 < width


def _until_interrupted(stream) -> list:
    """What a stream hands out before its KeyboardInterrupt (which it must raise)."""
    out = []
    with pytest.raises(KeyboardInterrupt):
        for piece in stream:
            out.append(piece)
    return out


def test_ctrl_c_hands_out_the_text_held_back_for_a_stop_string(monkeypatch):
    """The text held back as it may begin a stop string was lost on Ctrl-C, though generated and no stop string:
    now an interrupted stream hands it out as one more piece, then raises the KeyboardInterrupt."""
    tok = load_tokenizer("gpt2")
    gen = _scripted(monkeypatch, tok.encode("Hello world. The end"), interrupt_after=2)
    assert _until_interrupted(gen.generate(make_model(), tok, "x", max_new_tokens=20, stop=["worlds"])) == [
        "Hello", " ", "world"]
    # Ctrl-C while the caller handles a piece: thrown in at the yield, the interrupt gets the same piece
    gen = _scripted(monkeypatch, tok.encode("Hello world. The end"))
    stream = gen.generate(make_model(), tok, "x", max_new_tokens=20, stop=["worlds"])
    assert [next(stream), next(stream)] == ["Hello", " "]
    assert stream.throw(KeyboardInterrupt()) == "world"
    with pytest.raises(KeyboardInterrupt):
        next(stream)


@pytest.mark.parametrize("where", ["between-steps", "mid-step"])
def test_ctrl_c_ends_each_row_of_a_batch_with_all_its_text(monkeypatch, where):
    """Every row hands out its text so far: what it held back, and (Ctrl-C while a step is decoded) the pieces the
    step already gave the rows before."""
    tok = load_tokenizer("gpt2")
    rows = [tok.encode("Hello world. The end"), tok.encode("Hi there, the end"),
            tok.encode("Hi") + [tok.eot_id] * 4]
    gen = _scripted(monkeypatch, rows, interrupt_after=3 if where == "between-steps" else None)
    if where == "mid-step":
        real, calls = gen._TextDecoder.add, []

        def add(self, token):
            calls.append(token)
            if len(calls) == 5:  # step 2, row 1 (" there"); row 0 has just released " " of " world"
                raise KeyboardInterrupt
            return real(self, token)

        monkeypatch.setattr(gen._TextDecoder, "add", add)
    steps = _until_interrupted(gen.generate(make_model(), tok, ["a", "b", "c"], max_new_tokens=20,
                                            stop=["world. T", ", the!"]))
    want = ["Hello world.", "Hi there,", "Hi"] if where == "between-steps" else ["Hello world", "Hi", "Hi"]
    assert ["".join(step[row] for step in steps) for row in range(3)] == want
    assert steps[-1] == (["world.", ",", ""] if where == "between-steps" else [" world", "", ""])


def test_a_batch_of_prompts_gives_each_row_its_text_alone():
    model = make_model("fox-pro-tiny")
    tok = load_tokenizer("bytes")
    prompts = ["Once upon", "Hi", "A longer prompt"]
    free = "".join(generate(model, tok, prompts[0], max_new_tokens=16, temperature=0, ignore_eos=True))
    options = dict(max_new_tokens=16, temperature=0, ignore_eos=True, stop=[free[4:6]])
    alone = ["".join(generate(model, tok, p, **options)) for p in prompts]
    steps = list(generate(model, tok, prompts, **options))
    assert ["".join(step[row] for step in steps) for row in range(3)] == alone
    assert alone[0] == free[:free.index(free[4:6])]


@pytest.mark.parametrize("case", ["token-ids", "empty-string", "not-a-string"])
def test_stop_strings_need_a_tokenizer_and_text(case):
    model = make_model("fox-pro-tiny")
    if case == "token-ids":
        with pytest.raises(ValueError, match=r"^stop: stop strings are found in the decoded text, which token ids "
                                             r"alone do not give; pass a tokenizer"):
            list(generate(model, tokens(2, 5), max_new_tokens=2, stop=["x"]))
        with pytest.raises(ValueError, match=r"^stop: stop strings are found in the decoded text"):
            list(stream_tokens(model, tokens(2, 5), GenerationConfig(max_new_tokens=2, stop="x")))
    else:
        value = ["ok", ""] if case == "empty-string" else ["ok", 3]
        with pytest.raises(ValueError, match=r"^stop: expected a stop string or a list of them \(each non-empty\), "
                                             r"got \['ok', .*\]; None for none$"):
            generate(model, load_tokenizer("bytes"), "Hi", max_new_tokens=2, stop=value)


def test_stop_token_ends_rows():
    model = make_model("fox-pro-tiny")
    prompt = tokens(2, 6)
    free = torch.stack(list(generate(model, prompt, max_new_tokens=8, temperature=0)), 1)
    stop = int(free[0, 2])
    out = torch.stack(list(generate(model, prompt, max_new_tokens=8, temperature=0, stop_token=stop)), 1)
    row0 = out[0].tolist()
    assert row0[:3] == free[0, :3].tolist() and all(t == stop for t in row0[3:])


@pytest.mark.parametrize("stop", [False, True], ids=["to-max-new-tokens", "stop-token"])
def test_the_next_step_is_queued_before_a_token_is_handed_out(stop):
    """A GPU then computes step t + 1 while the host takes token t: the stream asks the model for the next step
    before it yields, never more steps than max_new_tokens - 1 after the prompt, and at most one past a stop."""
    model = make_model("fox-pro-tiny")
    prompt = tokens(1, 6)
    free = list(generate(model, prompt[0], max_new_tokens=8, temperature=0))
    calls = []
    handle = model.register_forward_hook(lambda *_: calls.append(None))
    options = dict(stop_token=free[2]) if stop else {}
    steps_seen = [len(calls) for _ in stream_tokens(model, prompt, GenerationConfig(max_new_tokens=8, temperature=0,
                                                                                     **options))]
    handle.remove()
    if stop:  # tokens 0, 1 and the stop token; the step queued behind the stop token is the one wasted
        assert steps_seen == [2, 3, 4] and len(calls) == 4
    else:     # the prefill, then one step queued behind each token but the last
        assert steps_seen == [2, 3, 4, 5, 6, 7, 8, 8] and len(calls) == 8


def test_other_hf_causal_lms_work():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    llama = LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=2)).eval()
    prompt = tokens(1, 5)
    ours = list(generate(llama, prompt[0], max_new_tokens=5, temperature=0))
    assert ours == llama.generate(prompt, max_new_tokens=5, do_sample=False, pad_token_id=0)[0, 5:].tolist()
    with pytest.raises(ValueError, match="FoX"):
        list(generate(llama, prompt[0], max_new_tokens=2, evict_eps=1e-3))


def test_bad_arguments():
    model = make_model()
    with pytest.raises(ValueError, match="temperature"):
        generate(model, [1, 2], temperature=-1)
    with pytest.raises(ValueError, match=r"^top_p: expected a number in \(0, 1\], got 1.5; None \(or 1\) for no "
                                         r"nucleus sampling$"):
        generate(model, [1, 2], top_p=1.5)
    with pytest.raises(TypeError, match="unknown option"):
        generate(model, [1, 2], beams=3)
    with pytest.raises(TypeError, match=r"^generate: unknown option 'temprature' \(did you mean 'temperature'\?\); "
                                        r"the options: max_new_tokens, temperature, "):
        generate(model, [1, 2], temprature=0)
    with pytest.raises(TypeError, match="tokenizer spec"):
        generate(model, "hello world")
    with pytest.raises(TypeError, match="prompt"):
        generate(model, [1, 2], prompt="text")
    with pytest.raises(TypeError, match="token ids"):
        generate(model, [1.5, 2.0])
    with pytest.raises(TypeError, match="model"):
        generate("not a model", [1, 2])
    with pytest.raises(ValueError, match="seed: expected an integer"):
        list(generate(model, [1, 2], seed="a"))
    for stop in (-1, 1.5):
        with pytest.raises(ValueError, match="stop_token: expected a token id"):
            list(generate(model, [1, 2], stop_token=stop))
    with pytest.raises(ValueError, match="stop_token: 999 is outside the model's vocabulary"):
        list(generate(model, [1, 2], stop_token=999))


@pytest.mark.parametrize("shift", [0.0, 1.0], ids=["zero-shift", "positive-shift"])
def test_bias_shift_on_another_hf_causal_lm_is_a_clear_error(shift):
    """Like evict_eps: a model without foxformer blocks gets a TypeError naming the problem (the CLI
    reports TypeErrors), not an AttributeError from deep inside."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from foxformer.infer import set_fgate_bias_shift

    torch.manual_seed(0)
    llama = LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=2)).eval()
    with pytest.raises(TypeError, match="foxformer"):
        list(generate(llama, [1, 2, 3], max_new_tokens=2, fgate_bias_shift=shift))
    with pytest.raises(TypeError, match="foxformer"):
        set_fgate_bias_shift(llama, shift)


@pytest.mark.parametrize("mode", ["train", "eval"])
def test_generation_leaves_the_module_mode_as_it_was(mode):
    """generate runs in eval mode but must hand the model back in the caller's mode: a training loop
    that samples text would otherwise go on in eval mode (no gradient checkpointing, no dropout)."""
    model = make_model("fox-pro-tiny", gradient_checkpointing=True)
    model.train(mode == "train")
    greedy = list(generate(model, [1, 2, 3], max_new_tokens=4, temperature=0))
    assert model.training == (mode == "train") and all(m.training == (mode == "train") for m in model.modules())
    model.eval()
    assert greedy == list(generate(model, [1, 2, 3], max_new_tokens=4, temperature=0))
    stream = generate(model.train(), [1, 2, 3], max_new_tokens=4, temperature=0)
    next(stream)
    stream.close()  # a consumer that stops early
    assert model.training


@pytest.mark.parametrize("decode", ["eager", "static"])
def test_streams_of_one_model_with_different_shifts_can_alternate(decode):
    """A stream set its fgate_bias_shift on the model until it ended: zip(plain, shifted) gave the plain stream the
    shift from its second token on, a forward of the caller's between two tokens ran shifted too, and two alternating
    streams left a training model in eval mode. Each stream now holds its shift and eval mode only in its forwards."""
    model = make_model("fox-pro-tiny")
    prompt = tokens(1, 8)[0]
    options = dict(max_new_tokens=10, temperature=0, decode=decode)
    plain, shifted = (list(generate(model, prompt, **options, fgate_bias_shift=s)) for s in (None, 3.0))
    assert plain != shifted  # the shift changes the tokens, so the comparisons below can tell
    pairs = list(zip(generate(model, prompt, **options), generate(model, prompt, **options, fgate_bias_shift=3.0)))
    assert [a for a, _ in pairs] == plain and [b for _, b in pairs] == shifted
    stream = generate(model, prompt, **options, fgate_bias_shift=3.0)
    next(stream)
    assert all(block.attn.fgate.bias_shift is None for block in model.model.layers)
    ids = torch.cat([prompt, torch.tensor(plain[:1])])[None]
    assert int(model(ids).logits[0, -1].argmax()) == plain[1]
    assert list(stream) == shifted[1:]
    model.train()
    first, second = generate(model, prompt, **options), generate(model, prompt, **options)
    next(first), next(second)
    assert model.training
    list(first)
    assert list(second) == plain[1:] and model.training


@pytest.mark.parametrize("temperature", [float("nan"), float("inf")], ids=["nan", "inf"])
def test_non_finite_temperature_is_refused_up_front(temperature):
    """NaN passed `temperature < 0` and ended in torch.multinomial's 'probability tensor contains inf, nan'
    after the prefill; inf flattened every logit to 0, so top-k / top-p kept the whole vocabulary."""
    with pytest.raises(ValueError, match="temperature"):
        generate(make_model(), [1, 2], temperature=temperature, top_k=5)


@pytest.mark.parametrize("temperature", [1e-3, 1e-39, 1e-300], ids=["small", "below-float32-normals", "tiny"])
def test_a_tiny_temperature_samples_greedily(temperature):
    """Logits / 1e-39 overflowed float32 (inf - inf: NaN), and 1e-300 became 0 in it: 'probability tensor contains
    either inf, nan or element < 0' after the prefill, where temperature -> 0 is greedy decoding."""
    model = make_model("fox-pro-tiny")
    prompt = tokens(1, 6)[0]
    greedy = list(generate(model, prompt, max_new_tokens=8, temperature=0))
    assert list(generate(model, prompt, max_new_tokens=8, temperature=temperature, seed=0)) == greedy
    logits = torch.tensor([[30.0, 29.0, -1e4]])
    assert int(sample_next(logits, GenerationConfig(temperature=1e-300), torch.Generator().manual_seed(0))) == 0


@pytest.mark.parametrize("option, value", [("top_p", "0.9"), ("top_p", True), ("top_k", True), ("top_k", 2.5),
                                           ("temperature", True), ("prefill_chunk", True)])
def test_sampling_options_of_the_wrong_type_are_refused_by_name(option, value):
    """top_p='0.9' was a bare "'<' not supported between 'int' and 'str'", top_k=True a TypeError from torch.topk
    after the prefill, temperature=True sampled at 1, prefill_chunk=True read the prompt one token per forward."""
    with pytest.raises(ValueError, match=f"{option}: expected"):
        generate(make_model(), [1, 2], **{option: value})


def test_numpy_scalars_are_taken_as_the_numbers_they_hold():
    """A sweep's np.int64 top_k / seed and np.float32 temperature were refused as "expected an integer"; they now
    give the text of the Python numbers."""
    model = make_model()
    numpy_args = dict(top_k=np.int64(5), seed=np.int64(3), temperature=np.float32(0.5), max_new_tokens=np.int64(4))
    python_args = dict(top_k=5, seed=3, temperature=float(np.float32(0.5)), max_new_tokens=4)
    assert list(generate(model, [1, 2], **numpy_args)) == list(generate(model, [1, 2], **python_args))
    with pytest.raises(ValueError, match="top_k: expected"):
        generate(model, [1, 2], top_k=np.float64(2.5))


@pytest.mark.parametrize("prompt", [
    pytest.param([1, VOCAB], id="id-equal-to-vocab-size"),
    pytest.param([1, 50256], id="gpt2-id-on-a-byte-model"),
    pytest.param([-1, 2], id="negative-id"),
    pytest.param(torch.tensor([[1, 2], [3, VOCAB + 5]]), id="batch-row-out-of-range"),
])
def test_token_ids_outside_the_vocabulary_are_a_clear_error(prompt):
    """They reached the embedding: 'IndexError: index out of range in self' on the CPU, a device-side
    assert on a GPU."""
    with pytest.raises(ValueError, match="vocabulary of 257"):
        list(generate(make_model(), prompt, max_new_tokens=2))


@pytest.mark.parametrize("preset", ["transformer-pro-tiny", "transformer-llama-tiny"])
def test_eviction_on_a_model_without_forget_gates_is_a_clear_error(preset):
    """A foxformer softmax Transformer took evict_eps and silently kept every key (the CLI then said 'cache
    kept 100.0% of keys'); another Hugging Face model and `eval eviction` already refused it."""
    with pytest.raises(ValueError, match="forget gate"):
        list(generate(make_model(preset), [1, 2, 3], max_new_tokens=2, evict_eps=1e-3))


class _SmallTok:
    """A tokenizer with fewer ids than the model's (padded) vocabulary, which, like tiktoken's GPT-2 one
    with a 50304-id model, raises KeyError on ids it does not know."""

    vocab_size = 100

    def encode(self, text):
        return [ord(ch) % 100 for ch in text]

    def decode(self, ids):
        if any(i >= self.vocab_size for i in ids):
            raise KeyError(f"Invalid token for decoding: {max(ids)}")
        return "".join(chr(32 + i) for i in ids)


@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["greedy", "sampled"])
def test_only_ids_the_tokenizer_can_decode_are_generated(temperature):
    """Sampling ran over the model's whole vocabulary: an id past the tokenizer's (the padding ids of a
    50304-id model with GPT-2's 50257) stopped the stream with a KeyError from tokenizer.decode."""
    model = make_model()
    state = {}
    text = "".join(generate(model, _SmallTok(), "hello", max_new_tokens=20, temperature=temperature, seed=0,
                            state=state))
    assert state["new_tokens"] == 20 and len(text) == 20
    ids = torch.tensor([_SmallTok().encode("hello")])
    logits = model(ids).logits[0, -1]
    assert int(logits.argmax()) >= 100  # unrestricted greedy would pick an id the tokenizer cannot decode
    if temperature == 0:
        assert text[0] == chr(32 + int(logits[:100].argmax()))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16], ids=["float32", "float64", "bfloat16"])
def test_stream_tokens_refuses_float_ids_like_generate(dtype):
    """stream_tokens truncated float ids with .long() (1.7 became token 1) while generate() refused them."""
    model = make_model()
    ids = torch.tensor([[1.7, 2.0, 3.0]], dtype=dtype)
    with pytest.raises(TypeError, match="integer tensor"):
        generate(model, ids, max_new_tokens=1)
    with pytest.raises(TypeError, match="integer tensor"):
        next(stream_tokens(model, ids, GenerationConfig(max_new_tokens=1)))


class _HFStyleTokenizer:
    """Bytes in, one letter a token out, and the end of text named as a Hugging Face tokenizer names it
    (``eos_token_id``, no ``eot_id``): the export's own tokenizer loaded by AutoTokenizer."""

    def __init__(self, eos_token_id: int):
        self.eos_token_id = eos_token_id

    def __len__(self) -> int:
        return VOCAB

    def encode(self, text: str) -> list[int]:
        return list(text.encode())

    def decode(self, ids) -> str:
        return "".join(chr(ord("a") + i % 26) for i in ids)


def test_a_hugging_face_tokenizer_stops_at_its_eos_token():
    model = make_model("fox-pro-tiny")
    ids = list(b"Once upon")
    free = list(generate(model, ids, max_new_tokens=6, temperature=0))
    stop = free[2]
    tok = _HFStyleTokenizer(stop)
    text = "".join(generate(model, tok, "Once upon", max_new_tokens=6, temperature=0))
    assert text == tok.decode(free[:free.index(stop)])
    assert "".join(generate(model, tok, "Once upon", max_new_tokens=6, temperature=0, ignore_eos=True)) == \
        tok.decode(free)


@pytest.mark.parametrize("option", ["evict_qk_bound", "evict_max_len"])
def test_an_eviction_bound_without_eviction_is_a_clear_error(option):
    """--evict-max-len or --evict-qk-bound alone kept every key and said nothing."""
    model = make_model("fox-pro-tiny")
    with pytest.raises(ValueError, match=f"{option}: it sets the bound of KV eviction, which runs only with evict_eps"):
        list(generate(model, tokens(1, 5), max_new_tokens=2, **{option: 100 if option == "evict_max_len" else 5.0}))


def test_an_exported_tokenizer_pads_a_batch_of_prompts_for_generation():
    """The export's tokenizer had no pad token (`padding=True` raised) and padded on the right (which the model
    refuses): now left padding with the end-of-text token, and each row generates as it does alone."""
    from foxformer.data.hf_tokenizer import hf_tokenizer

    tok = hf_tokenizer("bytes")
    model = make_model("fox-pro-tiny")
    prompts = ["Hi", "Hello world"]
    batch = tok(prompts, padding=True, return_tensors="pt")
    assert tok.padding_side == "left" and batch["attention_mask"][0, 0] == 0
    both = model.generate(**batch, max_new_tokens=3, do_sample=False, pad_token_id=tok.pad_token_id)[:, -3:]
    for row, text in enumerate(prompts):
        alone = model.generate(tok(text, return_tensors="pt")["input_ids"], max_new_tokens=3, do_sample=False,
                               pad_token_id=tok.pad_token_id)[:, -3:]
        assert torch.equal(both[row], alone[0])


def test_a_prompt_row_without_a_real_token_is_a_clear_error():
    model = make_model("fox-pro-tiny")
    mask = torch.ones(2, 5, dtype=torch.long)
    mask[1] = 0
    with pytest.raises(ValueError, match="attention_mask: row 1 has no real token"):
        list(generate(model, tokens(2, 5), max_new_tokens=2, attention_mask=mask))


@pytest.mark.parametrize("max_new_tokens", [1, 3])
def test_a_right_padded_prompt_mask_is_refused_up_front(max_new_tokens):
    """One new token was sampled after the pads, without a word (a Hugging Face tokenizer pads on the right by
    default); more failed at the second step, on the model's 'a 0 between two real tokens'."""
    mask = torch.ones(2, 6, dtype=torch.long)
    mask[0, 4:] = 0
    with pytest.raises(ValueError, match=r"attention_mask: row 0 ends in padding .*padding_side='left'"):
        list(generate(make_model("fox-pro-tiny"), tokens(2, 6), max_new_tokens=max_new_tokens,
                      attention_mask=mask))


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int16, torch.uint16, torch.int32])
def test_token_ids_of_a_narrow_integer_dtype_generate_as_int64_ones_do(dtype):
    """The vocabulary check compared in the ids' dtype, where 257 wraps: uint8 id 137 was 'outside the model's
    vocabulary of 257', and uint16 ids failed on a comparison the CPU does not have."""
    model = make_model("fox-pro-tiny")
    ids = tokens(2, 5).clamp(max=200)
    want = [t.tolist() for t in generate(model, ids, max_new_tokens=3, temperature=0)]
    assert [t.tolist() for t in generate(model, ids.to(dtype), max_new_tokens=3, temperature=0)] == want
    if dtype != torch.uint8:  # whose ids all lie in the vocabulary of 257
        with pytest.raises(ValueError, match=f"token id {VOCAB + 43} is outside the model's vocabulary of {VOCAB}"):
            list(generate(model, torch.full((1, 2), VOCAB + 43).to(dtype), max_new_tokens=1))


def test_a_fractional_prompt_mask_is_refused_as_such_not_as_an_empty_row():
    """A cast to integers made 0.5 a 0, and a row of 0.5s 'a row without a real token'."""
    mask = torch.full((2, 5), 0.5)
    with pytest.raises(ValueError, match=r"attention_mask: expected only 0 \(padding\) and 1 .*got 0\.5"):
        list(generate(make_model("fox-pro-tiny"), tokens(2, 5), max_new_tokens=2, attention_mask=mask))


def test_a_seed_outside_the_generators_range_is_refused_up_front():
    with pytest.raises(ValueError, match=r"seed: expected an integer in \[-2\*\*63, 2\*\*64\)"):
        GenerationConfig(seed=2**70).validate()
    GenerationConfig(seed=2**64 - 1).validate()


def test_the_decode_benchmarks_p90_is_a_nearest_rank_percentile():
    from foxformer.bench.decode_steps import _p90_ms

    assert _p90_ms([0.002, 0.001]) == pytest.approx(1.9)  # was the minimum of two, below their median
    assert _p90_ms([i / 1000 for i in range(1, 12)]) == pytest.approx(10.0)
    assert _p90_ms([0.003]) == pytest.approx(3.0)
    assert _p90_ms([]) is None


def test_the_docstrings_name_every_option_and_decode_mode():
    """generate's docstring left out ignore_eos and decode, GenerationConfig's the "compiled" decode mode."""
    import dataclasses

    from foxformer.models.kvcache import FoxCache

    assert all(field.name in generate.__doc__ for field in dataclasses.fields(GenerationConfig))
    assert all(f'"{mode}"' in GenerationConfig.__doc__ for mode in FoxCache.DECODE_MODES)


@pytest.mark.parametrize("field, value, said", [
    ("evict_eps", 2.0, "evict_eps: expected a number in (0, 1) or None, got 2.0"),
    ("evict_qk_bound", -1.0, "evict_qk_bound: expected a finite number >= 0 or None, got -1.0"),
    ("evict_max_len", 0, "evict_max_len: expected a positive integer or None, got 0"),
])
def test_a_bad_eviction_setting_is_named_by_its_keyword(field, value, said):
    """The API's words for what the CLI names by its flag (tests/infer/test_cli.py): the keyword, None offered."""
    with pytest.raises(ValueError) as caught:
        list(generate(make_model(), [1, 2, 3], max_new_tokens=2, **{field: value}))
    assert str(caught.value) == said


def test_an_evict_max_len_below_max_new_tokens_is_refused_by_the_config():
    """Whatever the prompt, the cache is fed it and every new token but the last: N below max_new_tokens failed
    only once the prompt was read (after a model load, in the CLI)."""
    with pytest.raises(ValueError, match=r"^evict_max_len: expected an integer >= 10, got 5; .*\(max_new_tokens=10\)$"):
        GenerationConfig(max_new_tokens=10, evict_max_len=5).validate()
    GenerationConfig(max_new_tokens=10, evict_max_len=10).validate()


def test_greedy_note_names_only_the_sampling_settings_that_are_set():
    assert GenerationConfig(temperature=0, top_k=0, top_p=1.0).greedy_note() == ""
    assert GenerationConfig(temperature=0.5, top_k=5, seed=1).greedy_note() == ""
    assert GenerationConfig(temperature=0, top_p=0.5, seed=1).greedy_note().startswith(
        "top_p, seed have no effect under greedy decoding")


def test_generate_warns_once_that_greedy_decoding_leaves_sampling_settings_without_effect():
    """`foxformer generate --temperature 0 --top-k 5` said so in a note; foxformer.generate(..., temperature=0,
    top_k=5) said nothing."""
    model = make_model("fox-pro-tiny")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tokens_ = list(generate(model, [1, 2, 3], max_new_tokens=3, temperature=0, top_k=5))
    notes = [w for w in caught if issubclass(w.category, GreedyNote)]
    assert [str(w.message) for w in notes] == [
        "top_k has no effect under greedy decoding (temperature 0 takes the most likely token)"]
    assert notes[0].filename == __file__  # the caller's line, not generation.py's
    assert len(tokens_) == 3
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        list(generate(model, [1, 2, 3], max_new_tokens=3, temperature=0))
        list(generate(model, [1, 2, 3], max_new_tokens=3, temperature=0.5, top_k=5, seed=1))
    assert not [w for w in caught if issubclass(w.category, GreedyNote)]
