"""The `foxformer` entry point itself (each area's commands are tested in its own folder)."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

SRC = str(Path(__file__).resolve().parents[1] / "src")


def test_a_reader_that_stops_early_gets_no_traceback():
    """`foxformer presets | head -n 2` printed a BrokenPipeError traceback (or 'Exception ignored ...' from the
    final flush); the command now ends quietly with 141, as a program killed by SIGPIPE does."""
    env = {**os.environ, "PYTHONPATH": SRC}
    proc = subprocess.Popen([sys.executable, "-m", "foxformer.cli", "presets"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env)
    proc.stdout.close()  # the reader is gone before the first write
    err = proc.stderr.read().decode()
    rc = proc.wait(timeout=120)
    assert "BrokenPipeError" not in err and "Traceback" not in err and "Exception ignored" not in err, err
    assert rc == 141, err


def test_presets_into_an_open_pipe_still_exits_0():
    env = {**os.environ, "PYTHONPATH": SRC}
    out = subprocess.run([sys.executable, "-m", "foxformer.cli", "presets"], capture_output=True, text=True,
                         env=env, timeout=120)
    assert out.returncode == 0 and "fox-llama-tiny" in out.stdout and not out.stderr


def test_a_broken_pipe_that_is_not_stdout_still_fails(monkeypatch, capfd):
    """Only a closed stdout is ended quietly: a BrokenPipeError from another pipe (a data-loader worker, a
    socket) is a real error and must not turn into a silent exit 141."""
    from foxformer import cli
    from foxformer.models import cli as models_cli

    def worker_died(args):
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(models_cli, "_presets", worker_died)
    with pytest.raises(BrokenPipeError):
        cli.main(["presets"])
