"""Every command's --device takes the same spellings and refuses a GPU this machine lacks in the same words: one
check (train.distributed.resolve_device) behind them all, run before any data, model or timing. The GPUs are
faked by patching torch.cuda (this machine has none)."""
from pathlib import Path

import pytest
import torch

from foxformer.cli import main


def _commands(tmp):
    model = str(tmp / "no-model")  # refused for its device before the model is looked for
    return {
        "demo": ["demo", "--out", str(tmp / "demo")],
        "train": ["train", "--max-steps", "1", "--out", str(tmp / "run")],
        "eval-loss": ["eval", "loss", model],
        "eval-niah": ["eval", "niah", model],
        "eval-eviction": ["eval", "eviction", model],
        "eval-mqar": ["eval", "mqar", "--out", str(tmp / "mqar")],
        "analyze-gates": ["analyze", "gates", model],
        "generate": ["generate", model, "--prompt", "x"],
        "bias-shift": ["bias-shift", model, "--source", "builtin:pydoc"],
        "bench-model": ["bench", "model", "--out", str(tmp / "model.json")],
        "bench-decode": ["bench", "decode", "--out", str(tmp / "decode.json")],
        "bench-attention": ["bench", "attention", "--out", str(tmp / "attention.json")],
    }


COMMANDS = list(_commands(Path(".")))  # the names, the ids of the tests


def _error(capsys) -> str:
    lines = capsys.readouterr().err.splitlines()
    assert lines and lines[-1].startswith("error: --device"), lines  # one line naming the flag, no traceback
    assert not any(line.startswith("Traceback") for line in lines), lines
    return lines[-1]


@pytest.mark.parametrize("device", ["cuda", "cuda:0"])
@pytest.mark.parametrize("command", COMMANDS)
def test_a_gpu_on_a_machine_without_one_is_refused_by_the_flag(tmp_path, capsys, monkeypatch, command, device):
    """eval mqar ended in torch's "Torch not compiled with CUDA enabled" traceback; demo and bench attention
    refused cuda:0 as an invalid choice, as if no GPU could ever be named."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(_commands(tmp_path)[command] + ["--device", device]) == 2
    assert _error(capsys).endswith(f"{device!r} asks for a GPU, but no GPU is visible on this machine; use "
                                   f"'cpu', or 'auto' (a GPU where there is one, else the CPU)")


@pytest.mark.parametrize("command", [c for c in COMMANDS if c != "bench-attention"])
def test_a_gpu_index_past_the_gpus_present_is_refused_by_the_flag(tmp_path, capsys, monkeypatch, command):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert main(_commands(tmp_path)[command] + ["--device", "cuda:2"]) == 2
    assert _error(capsys).endswith("'cuda:2' asks for GPU 2, but this machine has 2 visible GPUs (cuda:0, cuda:1); "
                                   "use one of those, or 'cuda' (the current one)")


def test_bench_attention_refuses_a_gpu_index_and_says_how_to_pick_the_gpu(tmp_path, capsys, monkeypatch):
    """It names the device by its type in its rows and times on the current GPU: an index would not be honoured."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert main(_commands(tmp_path)["bench-attention"] + ["--device", "cuda:1"]) == 2
    assert _error(capsys) == ("error: --device: bench attention times on the current GPU and takes no index, got "
                              "'cuda:1'; pass cuda and pick the GPU with CUDA_VISIBLE_DEVICES=1")


@pytest.mark.parametrize("command", COMMANDS)
def test_a_device_torch_knows_but_the_code_does_not_run_on_is_refused_alike(tmp_path, capsys, command):
    assert main(_commands(tmp_path)[command] + ["--device", "mps"]) == 2
    assert _error(capsys).endswith("expected 'auto', 'cpu', 'cuda' or 'cuda:N', got 'mps'")


def test_train_under_torchrun_refuses_a_gpu_index_as_each_rank_takes_its_own(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("LOCAL_RANK", "0")
    assert main(_commands(tmp_path)["train"] + ["--device", "cuda:1"]) == 2
    assert _error(capsys).endswith("'cuda:1' names one GPU, but under torchrun (WORLD_SIZE=2) each rank takes the GPU "
                                   "of its LOCAL_RANK; use 'cuda' or 'auto'")


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_line_takes_every_spelling(tmp_path, command):
    """demo's and bench attention's argparse choices refused cuda:0 before any check could say more."""
    from foxformer.cli import build_parser

    parser = build_parser()
    for device in ("auto", "cpu", "cuda", "cuda:0"):
        assert parser.parse_args(_commands(tmp_path)[command] + ["--device", device]).device == device
