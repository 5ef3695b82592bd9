"""The warning that a generation may run past the length a model was trained on: Hugging Face's generate
(FoxForCausalLM) and foxformer's (infer.generation, which `foxformer generate` calls) say it in the same words,
once per model and length: again only for a generation that may run further than any said before."""
from __future__ import annotations

import sys
import warnings
from typing import Optional

# top-level modules whose frames stand between the user's call and the warning
_LIBRARIES = frozenset({"foxformer", "transformers", "transformers_modules", "torch"})


class PastTrainLen(UserWarning):
    """A generation may run past the tokens its model was trained on: allowed (FoX has no position embedding to
    run out of), but its quality may drop there."""


def past_train_len(total: int, train_len: Optional[int]) -> str:
    """What the warning says of a generation whose prompt and new tokens may reach ``total`` tokens, or "" within
    ``train_len`` (None: unknown, so nothing is said)."""
    if not train_len or total <= train_len:
        return ""
    return (f"generate: the prompt and new tokens may reach {total} tokens, {total - train_len} past the {train_len} "
            f"this model was trained on (train_len); it runs on, but quality may drop past the trained length "
            f"(FoX, without position embeddings, degrades gracefully; a Transformer with RoPE, badly)")


def warn_past_train_len(model, total: int, train_len: Optional[int]) -> None:
    """Warn (PastTrainLen) when a generation by ``model`` may run past ``train_len``, once per model for each new
    longest ``total``: generations run in loops, and one model serves both generates, so a length already said is
    not said again; a longer one is (said once per model, a later generation running thousands of tokens further
    was silent). The warning names the line that called into the libraries."""
    said = past_train_len(total, train_len)
    if not said or total <= getattr(model, "_said_train_len", 0):
        return
    model._said_train_len = total
    warnings.warn(said, PastTrainLen, stacklevel=_outside_the_libraries())


def _outside_the_libraries() -> int:
    """warnings.warn's stacklevel, for the caller of warn_past_train_len, of the first frame outside foxformer (an
    export's copy of it too), transformers and torch. A fixed count named a line inside them: the generation runs
    lazily under torch.no_grad's generator wrapper, reached from foxformer.generate's text rows or from
    transformers' generate."""
    frame, level = sys._getframe(2), 2
    while frame.f_back is not None and frame.f_globals.get("__name__", "").split(".")[0] in _LIBRARIES:
        frame, level = frame.f_back, level + 1
    return level
