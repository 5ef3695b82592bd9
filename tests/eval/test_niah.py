"""Needle in a haystack: prompt construction, scoring, and the copy / forget-everything models."""
import re
import types
import warnings

import numpy as np
import pytest
import torch

from foxformer.eval import build_case, make_needle, niah_grid, normalize, run_case
from foxformer.eval.niah import answer_loglik
from foxformer.infer import GenerationConfig, stream_tokens

from .helpers import WordTokenizer, copy_model, tiny_model

FILLER = ("alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma tau "
          "upsilon").split()
KEYS = ("Lisbon", "Zanzibar")


def _haystack(seed: int, n_words: int, sentence_words: int):
    """A word tokenizer and filler text cut into sentences of ``sentence_words`` words."""
    tok = WordTokenizer(64)
    words = np.random.default_rng(seed).choice(FILLER, n_words)
    text = " ".join(f"{w} ." if i % sentence_words == sentence_words - 1 else str(w) for i, w in enumerate(words))
    return tok, tok.encode(text)


@pytest.fixture(scope="module")
def setup():
    return _haystack(0, 500, 9)


@pytest.mark.parametrize("mode", ["standard", "easy"])
def test_copy_model_finds_needle_and_forgetful_model_misses_it(setup, mode):
    tok, hay = setup
    kwargs = dict(lengths=[48, 160], depths=[0.0, 0.5, 1.0], modes=[mode], needles=2, keys=KEYS, progress=False)
    found = niah_grid(copy_model(64), tok, hay, **kwargs)
    missed = niah_grid(copy_model(64, forget_all=True), tok, hay, **kwargs)
    assert found.summary()[f"{mode}_accuracy"] == 1.0
    assert found.summary()[f"{mode}_ll_accuracy"] == 1.0
    assert missed.summary()[f"{mode}_accuracy"] == 0.0
    assert missed.summary()[f"{mode}_ll_accuracy"] == 0.0
    assert np.all(np.asarray(found.grid(mode)) == 1.0) and np.asarray(found.grid(mode)).shape == (3, 2)
    assert all(r["answer_logprob"] > -1e-3 for r in found.records)
    assert all(r["answer_logprob"] < -10 for r in missed.records)


def test_without_a_bar_the_grid_says_its_trials_in_plain_lines(setup, monkeypatch, capsys):
    """Off a terminal a 100K-token grid said nothing for ten minutes and more; now a line every LINE_EVERY_S."""
    import foxformer.progress

    monkeypatch.setattr(foxformer.progress, "LINE_EVERY_S", 0.0)
    tok, hay = setup
    niah_grid(copy_model(64), tok, hay, lengths=[48], depths=[0.0, 1.0], modes=["easy"], needles=1, keys=KEYS,
              progress=False, name="copy")
    assert [line.split(",")[0] for line in capsys.readouterr().err.splitlines()] == ["niah copy: trial 1/2 done"]


def test_without_a_bar_a_long_trial_says_its_context_while_it_runs(setup, monkeypatch, capsys):
    """The lines came as trials ended: one 100K-token trial on a CPU was silent until it ended."""
    import time

    import foxformer.progress

    monkeypatch.setattr(foxformer.progress, "LINE_EVERY_S", 0.2)
    tok, hay = setup
    model = copy_model(64)
    model.model.register_forward_pre_hook(lambda *_: time.sleep(0.5))
    niah_grid(model, tok, hay, lengths=[48], depths=[0.5], modes=["easy"], needles=1, keys=KEYS, generate=False,
              progress=False, name="copy")
    lines = capsys.readouterr().err.splitlines()
    assert lines and all(line.startswith("niah copy: trial 1/1 running (a 48-token context, easy, depth 0.5), ")
                         for line in lines), lines


def test_prompt_has_exact_length_and_needle_at_a_sentence_boundary(setup):
    tok, hay = setup
    needle = make_needle(0, 0, KEYS)
    for depth in (0.0, 0.3, 0.6, 1.0):
        case = build_case(tok, hay, 120, depth, needle, mode="easy", offset=7)
        assert len(case.prompt) == 120
        assert case.needle_pos == 0 or tok.decode([case.prompt[case.needle_pos - 1]]) == "."
        assert tok.decode(case.prompt).count(needle.value) == 1
    assert build_case(tok, hay, 120, 0.0, needle).needle_pos == 0


def test_needles_are_deterministic_and_vary():
    assert make_needle(1, 3) == make_needle(1, 3)
    assert len({make_needle(i, s).value for i in range(4) for s in range(3)}) == 12


def test_normalize():
    assert normalize(" Is: 1,234.") == normalize("is 1234")
    assert normalize("1234567") in normalize("The number is 1234567!")


def test_loglik_without_generation_matches_cached_scoring(setup):
    """The cheap one-pass log-likelihood equals the one scored on a copy of the prefill cache."""
    tok, hay = setup
    model = tiny_model("fox-pro-tiny", vocab=64).double()
    case = build_case(tok, hay, 80, 0.5, make_needle(0, 0, KEYS))
    rec = run_case(model, tok, case, generate=True, max_new_tokens=3)
    ll, greedy = answer_loglik(model, case.prompt, case.answer)
    assert rec["answer_logprob"] == pytest.approx(ll, rel=1e-6, abs=1e-6) and rec["ll_correct"] == greedy
    assert "found" in rec and "generated" in rec
    cheap = run_case(model, tok, case, generate=False)
    assert "found" not in cheap and cheap["answer_logprob"] == pytest.approx(ll)


def test_decoding_past_the_context_announces_its_length_to_an_evicting_cache(setup):
    """A config evict_eps derives the eviction bound for the tokens the cache is told of: run_case tells it the
    whole length (it warned once decoding passed max_position_embeddings) and decodes as generate does."""
    tok, hay = setup
    model = tiny_model("fox-pro-tiny", vocab=64, max_position_embeddings=48, evict_eps=1e-3).double()
    case = build_case(tok, hay, 44, 0.5, make_needle(0, 0, KEYS))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rec = run_case(model, tok, case, max_new_tokens=8)
        greedy = stream_tokens(model, torch.tensor([case.prompt]), GenerationConfig(max_new_tokens=8, temperature=0))
        assert rec["generated"] == tok.decode([int(t) for t in greedy])


@pytest.mark.parametrize("kwargs, match", [
    (dict(lengths=[10]), "too short"),
    (dict(lengths=[5000]), "haystack"),
    (dict(lengths=[80], depths=[1.5]), "depths"),
    (dict(lengths=[80], modes=["hard"]), "modes"),
    (dict(lengths=[]), "lengths"),
    (dict(lengths=[80], needles=0), "needles"),
    (dict(lengths=[80], seeds=[0, -1]), "seeds"),  # numpy's error named no key
    (dict(lengths=[80], seeds=[1.5]), "seeds"),
    (dict(lengths=[80], max_new_tokens=0), "max_new_tokens"),  # generated nothing: every trial scored "missed"
    (dict(lengths=[80], max_new_tokens=-2), "max_new_tokens"),
], ids=["length-too-short", "haystack-too-short", "bad-depth", "bad-mode", "no-lengths", "zero-needles",
        "negative-seed", "fractional-seed", "zero-new-tokens", "negative-new-tokens"])
def test_bad_grid_fails_clearly(setup, kwargs, match):
    tok, hay = setup
    with pytest.raises(ValueError, match=match):
        niah_grid(copy_model(64), tok, hay, keys=KEYS, progress=False, **kwargs)


@pytest.mark.parametrize("kwargs, said", [
    (dict(lengths=[80], depths=[0.0, 0.5, 0.5]), "depths: 0.5 is given more than once in [0.0, 0.5, 0.5]"),
    (dict(lengths=[80, 96, 80]), "lengths: 80 is given more than once in [80, 96, 80]"),
    (dict(lengths=[80], seeds=[0, 0]), "seeds: 0 is given more than once"),
    (dict(lengths=[80], modes=["easy", "easy"]), "modes: 'easy' is given more than once"),
], ids=["depths", "lengths", "seeds", "modes"])
def test_a_value_given_twice_is_refused(setup, kwargs, said):
    """`--depths 0,0.5,0.5` ran the 0.5 trials twice: the heatmap showed that row twice, each an accuracy over
    copies of the same trials (a repeated seed draws the same needles and offsets)."""
    tok, hay = setup
    with pytest.raises(ValueError, match=re.escape(said)):
        niah_grid(copy_model(64), tok, hay, keys=KEYS, progress=False, **kwargs)


def test_the_command_refuses_a_repeated_depth_before_loading_any_model(tmp_path, capsys):
    from foxformer.cli import main

    assert main(["eval", "niah", str(tmp_path / "no-such-run"), "--depths", "0,0.5,0.50", "--no-progress"]) == 2
    assert capsys.readouterr().err.strip() == ("error: --depths: 0.5 is given more than once in [0.0, 0.5, 0.5]; "
                                               "give each value once")


def test_haystack_outside_vocabulary_fails(setup):
    tok, hay = setup
    with pytest.raises(ValueError, match="vocabulary"):
        niah_grid(copy_model(8), tok, hay, lengths=[80], keys=KEYS, progress=False)


@pytest.mark.parametrize("lengths", [[16, 32, 64], [64, 16, 32], [32, 64, 16]],
                         ids=["ascending", "largest-first", "smallest-last"])
def test_heatmap_training_length_line_follows_the_lengths_in_any_order(lengths, tmp_path, monkeypatch):
    # the line sat after the first `count(l <= train_len)` columns, so it split unsorted --lengths wrongly
    from foxformer.eval import plots
    from foxformer.eval.niah import NiahResult

    figures, save = [], plots.save_figure
    monkeypatch.setattr(plots, "save_figure", lambda fig, path: (figures.append(fig), save(fig, path))[1])
    records = [{"length": l, "depth": 0.0, "mode": "standard", "found": l <= 32, "ll_correct": l <= 32,
                "answer_logprob": 0.0} for l in lengths]
    result = NiahResult(name="m", lengths=lengths, depths=[0.0], modes=["standard"], train_len=32, records=records)
    plots.plot_niah_heatmaps([result], str(tmp_path / "niah.png"))
    ax = figures[0].axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["16", "32", "64"]
    assert ax.images[0].get_array().tolist() == [[1.0, 1.0, 0.0]]   # the columns follow their labels
    assert [line.get_xdata()[0] for line in ax.lines] == [1.5]       # between 32 and 64


@pytest.mark.parametrize("metric, bar", [("accuracy", "greedy answer holds the value [share of trials]"),
                                         ("ll_accuracy", "every answer token is the top-1 [share of trials]")])
def test_heatmap_axes_and_colour_bar_say_what_they_count(metric, bar, tmp_path, monkeypatch):
    """The colour bar was labelled with the metric's key ("ll_accuracy"), the lengths had no unit and the dashed
    line no explanation."""
    from foxformer.eval import plots
    from foxformer.eval.niah import NiahResult

    figures, save = [], plots.save_figure
    monkeypatch.setattr(plots, "save_figure", lambda fig, path: (figures.append(fig), save(fig, path))[1])
    records = [{"length": l, "depth": 0.0, "mode": "standard", "found": True, "ll_correct": False,
                "answer_logprob": 0.0} for l in (16, 64)]
    result = NiahResult(name="m", lengths=[16, 64], depths=[0.0], modes=["standard"], train_len=32, records=records)
    plots.plot_niah_heatmaps([result], str(tmp_path / "niah.png"), metric=metric)
    heatmap, colour_bar = figures[0].axes
    assert colour_bar.get_ylabel() == bar
    assert heatmap.get_xlabel() == "context length [tokens] (right of the dashes: beyond train length)"
    assert heatmap.get_ylabel() == "needle depth [% of the context]"


class ScriptedLM(torch.nn.Module):
    """Greedy decoding after ``prompt_len`` tokens emits ``script`` token by token (then token 0)."""

    def __init__(self, vocab: int, prompt_len: int, script: list):
        super().__init__()
        self.anchor = torch.nn.Parameter(torch.zeros(1))
        self.config = types.SimpleNamespace(vocab_size=vocab)
        self.prompt_len, self.script = prompt_len, script

    def forward(self, input_ids, past_key_values=None, use_cache=False):
        seen = past_key_values[0] if past_key_values is not None else 0
        T = input_ids.shape[1]
        logits = torch.zeros(1, T, self.config.vocab_size)
        for r in range(T):
            k = seen + r + 1 - self.prompt_len
            logits[0, r, self.script[k] if 0 <= k < len(self.script) else 0] = 10.0
        return types.SimpleNamespace(logits=logits, past_key_values=[seen + T])


@pytest.mark.parametrize("answer, found", [
    ("{v} .", True),
    ("is {v} and", True),
    ("{v}9 .", False),          # a longer number is another number
    ("1{v} .", False),
    ("{v_commas} .", True),     # thousands separators are the same number
    ("7{v_commas} .", False),
    ("{v} , 123", True),
], ids=["exact", "after-words", "extra-trailing-digit", "extra-leading-digit", "thousands-commas",
        "longer-number-with-commas", "followed-by-a-list"])
def test_greedy_answer_is_found_only_as_the_whole_number(setup, answer, found):
    tok, hay = setup
    needle = make_needle(0, 0, KEYS)
    v = needle.value
    text = answer.format(v=v, v_commas=f"{int(v):,}")
    case = build_case(tok, hay, 80, 0.5, needle)
    model = ScriptedLM(64, len(case.prompt), tok.encode(text))
    rec = run_case(model, tok, case, max_new_tokens=8)
    assert normalize(v) in normalize(rec["generated"])
    assert rec["found"] is found


@pytest.fixture(scope="module")
def long_sentences():
    return _haystack(1, 5000, 60)


@pytest.mark.parametrize("length, depth", [(512, 1.0), (512, 0.5), (4096, 1.0), (4096, 0.25)],
                         ids=["512-depth-1", "512-depth-0.5", "4096-depth-1", "4096-depth-0.25"])
def test_needle_moves_only_a_small_fraction_of_the_length_and_its_position_is_recorded(long_sentences, length,
                                                                                         depth):
    # the needle moved back up to 64 tokens to a sentence end whatever the length (depth 1.0 at 512 landed
    # near 0.9), and the records kept the requested depth only
    tok, hay = long_sentences
    needle = make_needle(0, 0, KEYS)
    case = build_case(tok, hay, length, depth, needle, offset=40)  # sentence ends ~40 tokens before each target
    fact = tok.encode(f" The special magic number for {needle.key} is: {needle.value}. ")
    budget = length - len(fact) - len(tok.encode(f"\n\nWhat is the special magic number for {needle.key}? "
                                                 f"The special magic number for {needle.key} is:"))
    assert abs(case.needle_pos - round(depth * budget)) <= max(4, 0.02 * length)
    assert case.actual_depth == pytest.approx(case.needle_pos / budget)
    assert abs(case.actual_depth - depth) <= 0.02
    assert case.prompt[case.needle_pos:case.needle_pos + len(fact)] == fact  # the needle starts there
    rec = run_case(copy_model(64), tok, case, generate=False)
    assert rec["depth"] == depth  # the requested depth stays the bucket
    assert rec["needle_pos"] == case.needle_pos and rec["actual_depth"] == case.actual_depth


def test_grid_buckets_by_requested_depth_and_reports_the_actual_one(setup):
    tok, hay = setup
    result = niah_grid(copy_model(64), tok, hay, lengths=[48, 160], depths=[0.5, 1.0], modes=["standard"],
                       needles=1, keys=KEYS, generate=False, progress=False)
    actual = np.asarray(result.grid("standard", "actual_depth"))  # [depths, lengths]
    assert actual.shape == (2, 2) and np.all(np.abs(actual - np.asarray([[0.5], [1.0]])) <= 0.1)
    shift = max(abs(r["actual_depth"] - r["depth"]) for r in result.records)
    assert result.summary()["max_depth_shift"] == pytest.approx(shift)
    assert result.to_dict()["grids"]["standard"]["actual_depth"] == actual.tolist()


def test_heatmap_rows_are_requested_depths_labelled_with_the_actual_ones(tmp_path, monkeypatch):
    from foxformer.eval import plots
    from foxformer.eval.niah import NiahResult

    figures, save = [], plots.save_figure
    monkeypatch.setattr(plots, "save_figure", lambda fig, path: (figures.append(fig), save(fig, path))[1])
    records = [{"length": 64, "depth": d, "mode": "standard", "found": True, "ll_correct": True,
                "answer_logprob": 0.0, "needle_pos": 0, "actual_depth": a} for d, a in ((0.5, 0.5), (1.0, 0.96))]
    records.append({"length": 64, "depth": 0.0, "mode": "standard", "found": True, "ll_correct": True,
                    "answer_logprob": 0.0})  # written before actual depths were recorded
    result = NiahResult(name="m", lengths=[64], depths=[0.0, 0.5, 1.0], modes=["standard"], records=records)
    plots.plot_niah_heatmaps([result], str(tmp_path / "niah.png"))
    labels = [t.get_text() for t in figures[0].axes[0].get_yticklabels()]
    assert labels == ["0%", "50%", "100% (at 96%)"]


def test_prompt_of_a_tokenizer_with_bos_starts_with_it():
    from foxformer.data import load_tokenizer

    tok = load_tokenizer("gpt2-json")
    haystack = tok.encode("The sea was calm. The birds were loud. " * 40)
    case = build_case(tok, haystack, 96, 0.5, make_needle(0, 0))
    assert case.prompt[0] == 50256 and 50256 not in case.prompt[1:] and len(case.prompt) == 96
