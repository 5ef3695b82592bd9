"""A model whose outputs are NaN (a diverged checkpoint) is refused by every instrument, in one error naming it:
eviction wrote NaN losses into its JSON, NIAH and the harness scored every trial as a miss (accuracy 0)."""
import os

import pytest
import torch

from foxformer.cli import main
from foxformer.eval import HarnessAdapter, build_case, eval_loss, make_needle, run_case
from foxformer.eval.eviction import eviction_loss
from foxformer.train.loading import check_finite_weights

from .helpers import WordTokenizer, tiny_model


@pytest.fixture(scope="module")
def nan_model():
    model = tiny_model("fox-pro-tiny", vocab=64)
    with torch.no_grad():
        model.lm_head.weight[0, 0] = float("nan")  # every position's logit of token 0
    return model


@pytest.fixture(scope="module")
def words():
    tok = WordTokenizer(64)
    hay = tok.encode(" ".join(f"w{i % 20} ." if i % 7 == 6 else f"w{i % 20}" for i in range(300)))
    return tok, hay


def _niah(model, words, generate):
    tok, hay = words
    return run_case(model, tok, build_case(tok, hay, 80, 0.5, make_needle(0, 0, ("Lisbon",))), generate=generate,
                    max_new_tokens=2)


TOKENS = torch.randint(0, 64, (2, 40), generator=torch.Generator().manual_seed(0))
RUNS = {
    "eval-loss": lambda m, w: eval_loss(m, TOKENS, n_boot=10, progress=False),
    "eviction": lambda m, w: eviction_loss(m, TOKENS, evict_eps=1e-4, progress=False),
    "niah-generate": lambda m, w: _niah(m, w, True),
    "niah-loglik-only": lambda m, w: _niah(m, w, False),
    "harness-loglikelihood": lambda m, w: HarnessAdapter(m, w[0], progress=False).loglikelihood([("w1 w2", " w3")]),
    "harness-rolling": lambda m, w: HarnessAdapter(m, w[0], max_length=8, progress=False).loglikelihood_rolling(
        ["w1 w2 w3 w4 w5 w6 w7 w8 w9 w10"]),
    "harness-generate": lambda m, w: HarnessAdapter(m, w[0], progress=False).generate_until(
        [("w1 w2", {"until": ["."], "max_gen_toks": 3})]),
}


@pytest.mark.parametrize("run", list(RUNS.values()), ids=list(RUNS))
def test_nan_outputs_are_an_error_not_a_result(nan_model, words, run):
    with pytest.raises(ValueError, match="outputs contain NaN or inf"):
        run(nan_model, words)


@pytest.fixture(scope="module")
def saved_nan_model(tmp_path_factory):
    """A saved model with one NaN in a layer's query weights: a NaN the attention op meets later, as its gate."""
    path = tmp_path_factory.mktemp("nan_model")
    model = tiny_model("fox-pro-tiny", vocab=300)
    with torch.no_grad():
        model.model.layers[0].attn.q_proj.weight[0, 0] = float("nan")
    model.save_pretrained(path)
    return str(path)


COMMANDS = {  # (the command's words, what follows the model)
    "eval-loss": (["eval", "loss"], ["--source", "builtin:pydoc", "--seq-len", "64", "--num-seqs", "1",
                                     "--no-progress"]),
    "generate": (["generate"], ["--prompt", "The ", "--max-new-tokens", "4"]),
    "generate-greedy": (["generate"], ["--prompt", "The ", "--max-new-tokens", "4", "--temperature", "0"]),
}


@pytest.mark.parametrize("words, flags", list(COMMANDS.values()), ids=list(COMMANDS))
def test_a_model_with_nan_weights_is_refused_at_load_naming_it_and_the_weight(saved_nan_model, tmp_path, capsys,
                                                                             words, flags):
    """Was `error: log_fgate contains NaN` (naming neither the model nor the weight); a NaN in the LM head gave
    `per_seq: the model's outputs contain NaN`, a torch.multinomial traceback in `generate`, or, greedy, garbage."""
    out = str(tmp_path / ("out" if words[0] == "eval" else "out.json"))
    rc = main([*words, saved_nan_model, *flags, "--tokenizer", "bytes", "--device", "cpu", "--out", out])
    captured = capsys.readouterr()
    assert rc == 2
    assert captured.err.strip().splitlines() == [
        f"error: model: {saved_nan_model!r} has non-finite weights: model.layers.0.attn.q_proj.weight (1 NaN of "
        f"4,096 values); the checkpoint is damaged or its run diverged: load an earlier checkpoint"]
    assert captured.out == "" and not os.path.exists(out)


def test_weights_that_overflow_fp16_are_told_to_load_in_bf16_or_fp32():
    model = tiny_model("fox-pro-tiny", vocab=64)
    with torch.no_grad():
        model.lm_head.weight[0, 0] = float("inf")
    with pytest.raises(ValueError, match=r"lm_head.weight \(1 inf of 4,096 values\); --dtype bf16 or fp32 keeps"):
        check_finite_weights(model, "m", torch.float16, label="--{}")
