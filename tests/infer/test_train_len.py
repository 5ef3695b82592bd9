"""foxformer.generate past the length a model was trained on: allowed, and said once per model and longest length,
in the words Hugging Face's generate says it in (the library ran past it without a word; only the command warned,
of the prompt alone)."""
import re
import warnings

import pytest
import torch

from foxformer.data import load_tokenizer
from foxformer.infer import GenerationConfig, PastTrainLen, generate, stream_tokens
from foxformer.train.loading import wrap_model

from .conftest import make_model, tokens


def _said(run) -> list[str]:
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        run()
    return [str(w.message) for w in said if issubclass(w.category, PastTrainLen)]


def _ids(model, prompt, new):
    return lambda: list(generate(model, prompt, max_new_tokens=new, temperature=0))


def test_it_warns_once_per_model_as_hf_generate_does():
    ours, theirs = make_model(train_len=8), make_model(train_len=8)
    assert _said(_ids(ours, tokens(1, 4), 4)) == []  # 8 tokens: within
    said = _said(_ids(ours, tokens(1, 6), 4))
    assert said == _said(lambda: theirs.generate(tokens(1, 6), max_new_tokens=4, do_sample=False))
    assert said == ["generate: the prompt and new tokens may reach 10 tokens, 2 past the 8 this model was trained on "
                    "(train_len); it runs on, but quality may drop past the trained length (FoX, without position "
                    "embeddings, degrades gracefully; a Transformer with RoPE, badly)"]
    assert _said(_ids(ours, tokens(1, 6), 4)) == []  # generations run in loops: said once per length
    assert _said(lambda: ours.generate(tokens(1, 6), max_new_tokens=3, do_sample=False)) == []  # shorter
    assert _said(_ids(make_model(), tokens(1, 6), 40)) == []  # length unknown


@pytest.mark.parametrize("first, then", [("ours", "ours"), ("ours", "hf"), ("hf", "hf"), ("hf", "ours")])
def test_a_longer_generation_is_said_again_once(first, then):
    """Said once per model, a later generation running further past the length was silent: now each new longest
    one is said, once, by either generate."""
    model = make_model(train_len=8)
    run = {"ours": lambda new: _ids(model, tokens(1, 6), new),
           "hf": lambda new: lambda: model.generate(tokens(1, 6), max_new_tokens=new, do_sample=False)}

    def reached(new, how):
        return [re.match(r"generate: the prompt and new tokens may reach (\d+) tokens, \d+ past the 8 ", s)[1]
                for s in _said(run[how](new))]

    assert reached(4, first) == ["10"]
    assert reached(9, then) == ["15"]
    for new in (9, 9, 6):  # that length, or a shorter one, again: nothing new
        assert reached(new, then) == reached(new, first) == []
    assert reached(10, first) == ["16"]


@pytest.mark.parametrize("path", ["text", "batch", "stream"])
def test_each_way_in_counts_the_prompt_and_the_new_tokens(path):
    """The prompt alone within the length, the new tokens past it: the command counted only the prompt."""
    model = make_model(train_len=16)
    runs = {
        "text": lambda: list(generate(model, load_tokenizer("bytes"), ["a prompt", "hi"], max_new_tokens=9,
                                      temperature=0, ignore_eos=True)),
        "batch": lambda: list(generate(model, tokens(2, 8), max_new_tokens=9, temperature=0)),
        "stream": lambda: list(stream_tokens(model, tokens(2, 8), GenerationConfig(max_new_tokens=9, temperature=0))),
    }
    said = _said(runs[path])
    assert len(said) == 1 and said[0].startswith("generate: the prompt and new tokens may reach 17 tokens, 1 past the "
                                                 "16 this model"), said


def test_a_loaded_models_length_counts_where_its_config_has_none():
    """An older run's export records no train_len; load_model reads it from the run's config.yaml into the
    LoadedModel, which generate takes."""
    model = make_model()
    assert model.config.train_len is None
    said = _said(_ids(wrap_model(model, train_len=8), tokens(1, 6), 4))
    assert len(said) == 1 and "2 past the 8" in said[0], said


@pytest.mark.parametrize("how", ["ids", "text", "hf"])
def test_the_warning_names_the_callers_line(how):
    """Not a line inside foxformer, torch's no_grad wrapper or transformers' generate."""
    model = make_model(train_len=4)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        if how == "ids":
            list(generate(model, torch.zeros(1, 6, dtype=torch.long), max_new_tokens=2, temperature=0))
        elif how == "text":
            list(generate(model, load_tokenizer("bytes"), "a prompt", max_new_tokens=2, temperature=0))
        else:
            model.generate(tokens(1, 6), max_new_tokens=2, do_sample=False)
    assert [w.filename for w in said if issubclass(w.category, PastTrainLen)] == [__file__]
