"""`train --context 4k` (or `context: 4k` in a YAML file) trains at 4000 tokens, as eval's lengths so written
run: and says so once for the job, in the words of eval's note (argtypes.decimal_length_note)."""
import pytest
import yaml

from foxformer.cli import main
from foxformer.train import loop

NOTE = "train: note: context 4k is 4,000 tokens (k/M: powers of 1000, Ki/Mi: of 1024); 4Ki is 4,096"


@pytest.fixture
def trained(monkeypatch):
    """The configs the command would train, in place of the training itself."""
    configs = []
    monkeypatch.setattr(loop, "train", lambda cfg, signals=None: configs.append(cfg) or {})
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("RANK", raising=False)
    return configs


def _notes(err: str) -> list[str]:
    return [line for line in err.splitlines() if "context" in line and "note" in line]


def _run(tmp_path, *extra) -> int:
    return main(["train", "--out", str(tmp_path / "run"), "--max-steps", "1", "--no-progress", *extra])


@pytest.mark.parametrize("given", [["--context", "4k"], ["--set", "context=4k"], ["yaml"]],
                         ids=["flag", "set", "yaml"])
def test_a_context_written_with_k_trains_as_typed_and_says_so_once(trained, tmp_path, capsys, given):
    if given == ["yaml"]:
        path = tmp_path / "cfg.yaml"
        path.write_text(yaml.safe_dump({"context": "4k"}))
        given = ["--config", str(path)]
    assert _run(tmp_path, "--batch-tokens", "8000", *given) == 0
    assert trained[0].context == 4000
    assert _notes(capsys.readouterr().err) == [NOTE]


def test_the_note_comes_before_the_refusal_it_explains(trained, tmp_path, capsys):
    """512Ki tokens a step hold no whole number of 4000-token sequences."""
    assert _run(tmp_path, "--context", "4k") == 2
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == NOTE and "multiple of context=4000" in lines[-1] and not trained


@pytest.mark.parametrize("given", [["--context", "4Ki"], ["--context", "4096"], []], ids=["Ki", "digits", "none"])
def test_a_context_in_binary_units_or_digits_says_nothing(trained, tmp_path, capsys, given):
    assert _run(tmp_path, *given) == 0
    assert _notes(capsys.readouterr().err) == []


def test_under_torchrun_only_rank_0_says_it(trained, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    assert _run(tmp_path, "--context", "4k", "--batch-tokens", "8000") == 0
    assert trained[0].context == 4000
    assert _notes(capsys.readouterr().err) == []
