"""Results record the code they came from."""
from foxformer.provenance import code_version


def test_commit_from_the_environment_wins(monkeypatch):
    monkeypatch.setenv("FOXFORMER_COMMIT", "0123abc")
    assert code_version() == "0123abc"


def test_commit_of_this_checkout_or_none(monkeypatch):
    monkeypatch.delenv("FOXFORMER_COMMIT", raising=False)
    v = code_version()
    assert v is None or (len(v.split("+")[0]) == 40 and v.split("+")[1:] in ([], ["dirty"]))
