"""The inference tests' tiny models (float64, exact torch backend unless a test says otherwise) and their
one-thread fixture."""
from ...infer.conftest import VOCAB, _one_thread, make_model, tokens  # noqa: F401
