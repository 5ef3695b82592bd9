"""A model whose outputs are NaN (a diverged checkpoint) is refused by every instrument, in one error naming it:
eviction wrote NaN losses into its JSON, NIAH and the harness scored every trial as a miss (accuracy 0)."""
import pytest
import torch

from foxformer.eval import HarnessAdapter, build_case, eval_loss, make_needle, run_case
from foxformer.eval.eviction import eviction_loss

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
