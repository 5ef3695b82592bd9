"""What every `foxformer bench` subcommand checks before it times anything."""
import importlib

import pytest

from foxformer.cli import main

SUBCOMMANDS = {
    "attention": ["bench", "attention", "--device", "cpu"],
    "model": ["bench", "model", "--presets", "fox-pro-tiny"],
    "bench-model": ["bench-model", "--presets", "fox-pro-tiny"],
    "decode": ["bench", "decode", "--preset", "fox-pro-tiny"],
    "bench-decode": ["bench-decode", "--preset", "fox-pro-tiny"],
    "scaling": ["bench", "scaling", "."],
}
MODULES = {"bench-model": "model", "bench-decode": "decode"}


@pytest.fixture
def never_runs(monkeypatch):
    def refuse(args):
        raise AssertionError("the benchmark ran")
    for module in {"attention", "model", "decode", "scaling"}:
        monkeypatch.setattr(importlib.import_module(f"foxformer.bench.{module}"), "run", refuse)


@pytest.mark.parametrize("name", list(SUBCOMMANDS))
def test_out_naming_a_folder_is_refused_before_the_run(name, tmp_path, capsys, never_runs):
    assert main([*SUBCOMMANDS[name], "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --out:") and "is a folder" in err
    assert list(tmp_path.parent.glob(f"{tmp_path.name}.tmp-*")) == []


@pytest.mark.parametrize("name", list(SUBCOMMANDS))
def test_out_inside_a_file_is_refused_before_the_run(name, tmp_path, capsys, never_runs):
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert main([*SUBCOMMANDS[name], "--out", str(blocker / "x.json")]) == 2
    assert capsys.readouterr().err.startswith("error: --out:")


@pytest.mark.parametrize("name", ["attention", "model", "decode"])
def test_profile_folder_inside_a_file_is_refused_before_the_run(name, tmp_path, capsys, never_runs):
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert main([*SUBCOMMANDS[name], "--profile", str(blocker / "prof")]) == 2
    assert capsys.readouterr().err.startswith("error: --profile:")


@pytest.mark.parametrize("argv", [["--contexts", "64,128,64"], ["--batches", "1,1"], ["--decode", "eager,eager"],
                                  ["--kernel", "--num-splits", "2,2"]])
def test_decode_refuses_a_list_entry_given_twice(argv, capsys, never_runs):
    with pytest.raises(SystemExit) as e:
        main([*SUBCOMMANDS["decode"], *argv])
    assert e.value.code == 2 and "more than once" in capsys.readouterr().err


def test_decode_refuses_an_anchor_given_twice(capsys, never_runs):
    assert main([*SUBCOMMANDS["decode"], "--anchors", "sdpa,sdpa"]) == 2
    assert "more than once" in capsys.readouterr().err
