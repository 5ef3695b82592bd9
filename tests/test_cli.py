"""The `foxformer` entry point itself (each area's commands are tested in its own folder)."""
import json
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

    def worker_died(args):
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(cli, "_presets", worker_died)
    with pytest.raises(BrokenPipeError):
        cli.main(["presets"])


def _run_cli(*argv, **env):
    return subprocess.run([sys.executable, "-m", "foxformer.cli", *argv], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": SRC, **env}, timeout=300)


HELP_IMPORTS = """
import argparse, contextlib, io, sys
from foxformer.cli import build_parser

def commands(parser, path):
    yield path
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from commands(child, path + [name])

helped = 0
for path in commands(build_parser(), []):
    with contextlib.redirect_stdout(io.StringIO()) as out:
        try:
            build_parser().parse_args(path + ["--help"])
        except SystemExit:
            pass
    helped += "usage: foxformer" in out.getvalue()
heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "transformers", "triton"))
print(helped, len(heavy), heavy[:5])
"""


def test_every_help_answers_without_torch_transformers_or_triton():
    """`import foxformer.cli` imported torch, transformers and triton (4.5 s; `foxformer --help` took 6-8 s):
    every command's --help, nested ones included, now leaves them out (checked in a fresh interpreter)."""
    out = subprocess.run([sys.executable, "-c", HELP_IMPORTS], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": SRC}, timeout=300)
    assert out.returncode == 0, out.stderr
    helped, n_heavy, heavy = out.stdout.split(" ", 2)
    assert int(helped) >= 20 and int(n_heavy) == 0, out.stdout
    top = _run_cli("--help")
    assert top.returncode == 0 and "train" in top.stdout and "generate" in top.stdout


def _subcommands(parser):
    """(parser, the help line its parent lists for it) of every command below ``parser``, nested ones included."""
    import argparse

    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            listed = {choice.dest: choice.help for choice in action._choices_actions}
            for name, child in action.choices.items():
                yield child, listed.get(name)
                yield from _subcommands(child)


def test_every_command_says_what_it_does():
    """`foxformer data`, `eval`, `bench attention`, `convert` and others had no description in their --help (and a
    command added without one went unnoticed): every command and subcommand has one, and a help line in its
    parent's list."""
    from foxformer.cli import build_parser

    found = {child.prog: (child.description, listed) for child, listed in _subcommands(build_parser())}
    assert {"foxformer data info", "foxformer bench scaling", "foxformer convert official"} <= set(found)
    assert len(found) >= 25, sorted(found)
    undescribed = sorted(prog for prog, (description, _) in found.items() if not (description or "").strip())
    unlisted = sorted(prog for prog, (_, listed) in found.items() if not (listed or "").strip())
    assert undescribed == [] and unlisted == [], (undescribed, unlisted)


def test_every_argument_says_what_it_is():
    """`eval compare` and `report` listed RUN_DIR with no word, `bench model --vocab-size` and several
    --no-progress flags had no help, and others only the default argparse's help line was given (`--warmup
    (default: 4)`): every argument of every command, positional ones included, says what it is before any default
    (argparse's own -h is left to argparse)."""
    import argparse

    from foxformer.cli import build_parser

    root = build_parser()
    unsaid = []
    for parser in [root, *(child for child, _ in _subcommands(root))]:
        for action in parser._actions:
            if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
                continue
            text = (action.help or "").strip()
            if not text or text.lower().startswith("default"):
                unsaid.append(f"{parser.prog} {'/'.join(action.option_strings) or action.metavar or action.dest}")
    assert unsaid == [], unsaid
    compare = " ".join(_run_cli("eval", "compare", "--help").stdout.split())
    assert "RUN_DIR a folder where `eval loss` wrote loss.json" in compare
    assert "--no-progress accepted as by the other commands; this one shows no progress bar" in compare


def test_lazy_packages_still_export_their_names():
    import foxformer
    from foxformer.data import prepare
    from foxformer.infer import generate

    assert callable(prepare) and callable(generate) and callable(foxformer.generate)
    assert generate is foxformer.generate
    assert "TokenDataset" in dir(foxformer.data)


def test_a_misspelled_flag_is_reported_by_its_command_with_the_closest_flag():
    """It printed the top-level usage (`foxformer [-h] COMMAND ...`) and no hint."""
    out = _run_cli("train", "--totl-tokens", "1Mi")
    assert out.returncode == 2
    assert "usage: foxformer train" in out.stderr and "did you mean --total-tokens?" in out.stderr, out.stderr
    out = _run_cli("eval", "loss", "RUN", "--seqlen", "64")
    assert "usage: foxformer eval loss" in out.stderr and "did you mean --seq-len?" in out.stderr, out.stderr


@pytest.mark.parametrize("argv,hint", [
    (["eval", "report", "RUN"], "'report' is `foxformer report`"),
    (["loss", "RUN"], "'loss' is `foxformer eval loss`"),
    (["evl"], "did you mean 'eval'?"),
    (["bench", "modle"], "did you mean 'model'?"),
], ids=["command-of-another-level", "subcommand-given-alone", "misspelled-command", "misspelled-subcommand"])
def test_a_command_not_there_says_where_it_is_or_the_closest(argv, hint):
    """`foxformer eval report` was argparse's bare "invalid choice" (the report is a command of its own)."""
    out = _run_cli(*argv)
    assert out.returncode == 2 and hint in out.stderr, out.stderr


@pytest.mark.parametrize("argv,line", [
    (["eval", "loss", "RUN", "--split", "trian"],
     "foxformer eval loss: error: argument --split: invalid choice: 'trian' (choose from 'train', 'val') "
     "(did you mean 'train'?)"),
    (["report", "RUN", "--format", "htm"],
     "foxformer report: error: argument --format: invalid choice: 'htm' (choose from 'md', 'html') "
     "(did you mean 'html'?)"),
    (["bench", "model", "--dtype", "bf61"],
     "foxformer bench model: error: argument --dtype: invalid choice: 'bf61' (choose from 'bf16', 'fp16', 'fp32') "
     "(did you mean 'bf16'?)"),
], ids=["eval-loss-split", "report-format", "bench-model-dtype"])
def test_an_option_value_not_among_its_choices_says_the_closest(argv, line, capsys):
    """Only a misspelled command got a did-you-mean; an option's choices got argparse's bare "invalid choice"."""
    from foxformer import cli

    with pytest.raises(SystemExit) as stopped:
        cli.main(argv)
    assert stopped.value.code == cli.USER_ERROR_EXIT
    assert capsys.readouterr().err.splitlines()[-1] == line


def test_a_user_error_is_one_line_and_debug_shows_the_traceback(tmp_path, monkeypatch):
    bad = tmp_path / "bad.yaml"
    bad.write_text("preset: fox-pro-tiny\nlr: [0.1\nmax_steps: 2\n")
    out = _run_cli("train", "--config", str(bad))
    assert out.returncode == 2 and "Traceback" not in out.stderr
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: --config: not valid YAML"), out.stderr
    assert f"({bad}, line 3, column " in lines[0]
    # the error reaches Python's own handler, which prints the traceback (in-process: a second launch costs seconds)
    from foxformer.cli import main

    monkeypatch.setenv("FOXFORMER_DEBUG", "1")
    with pytest.raises(ValueError, match="not valid YAML"):
        main(["train", "--config", str(bad)])


def test_version_names_the_release_and_the_commit():
    out = _run_cli("--version")
    assert out.returncode == 0 and out.stdout.startswith("foxformer 0.1.0"), out


def test_an_error_line_starts_a_line_of_its_own_after_an_open_progress_bar(monkeypatch, capsys):
    """An exception inside a progress bar printed `...tok_s=33,474]error: ...` on the bar's line."""
    from tqdm import tqdm

    import foxformer.cli as cli

    def fail(args):
        bar = tqdm(total=10, desc="work")
        bar.update(3)
        raise ValueError("source: broken")

    monkeypatch.setattr(cli, "_presets", fail)  # build_parser, called by main, takes the command from here
    assert cli.main(["presets"]) == 2
    err = capsys.readouterr().err
    assert "\nerror: source: broken" in err and not tqdm._instances


def test_foxformers_warnings_are_one_line_under_the_cli_and_pythons_elsewhere(monkeypatch, capsys):
    """`evict_eps is set but no layer can evict` came out under Python's `path.py:123: UserWarning:` prefix with
    the source line echoed; other code's warnings, and foxformer's outside the CLI, keep Python's form."""
    import warnings

    import foxformer.cli as cli
    from foxformer.models import FoxModel, get_preset
    from foxformer.models.kvcache import EvictionPolicy

    model = FoxModel(get_preset("fox-llama-tiny", vocab_size=16))  # no QK-norm: no bound, no layer can evict

    def warn(args):
        model.new_cache(EvictionPolicy(1e-3))
        warnings.warn("not foxformer's")
        return 0

    monkeypatch.setattr(cli, "_presets", warn)
    with warnings.catch_warnings(record=True) as python_shown:
        warnings.simplefilter("always")
        assert cli.main(["presets"]) == 0
        assert capsys.readouterr().err.splitlines() == [
            "warning: evict_eps is set but no layer can evict: without QK-norm no bound on |q.k| is known; pass "
            "evict_qk_bound (your bound on |q.k| * scale) to evict"]
        assert [str(w.message) for w in python_shown] == ["not foxformer's"]
        model.new_cache(EvictionPolicy(1e-3))  # the CLI has returned: a library call's warning is Python's again
        assert str(python_shown[-1].message).startswith("evict_eps is set") and not capsys.readouterr().err


def test_every_option_of_a_token_count_says_what_k_and_ki_mean():
    """`eval loss --seq-len 1k` ran at 1000 tokens while its help showed only 4Ki: the help of every option that
    reads a token count (argtypes.count_type) says once, in the same words, what k/M and Ki/Mi mean; no other's."""
    from foxformer.argtypes import COUNT_SUFFIXES, is_count_type
    from foxformer.cli import build_parser

    root = build_parser()
    counted, stray = [], []
    for parser in [root, *(child for child, _ in _subcommands(root))]:
        formatter = parser._get_formatter()
        for action in parser._actions:
            if not action.option_strings or not action.help:
                continue
            name, text = f"{parser.prog} {action.option_strings[0]}", formatter._expand_help(action)
            if is_count_type(action.type):
                counted.append(name)
                assert text.count(COUNT_SUFFIXES) == 1, (name, text)
            elif COUNT_SUFFIXES in text:
                stray.append(name)
    assert stray == []
    assert {"foxformer eval loss --seq-len", "foxformer eval loss --lengths", "foxformer eval niah --lengths",
            "foxformer eval compare --positions", "foxformer eval harness --max-length", "foxformer bias-shift --seq-len",
            "foxformer train --context", "foxformer train --batch-tokens",
            "foxformer data prepare --max-tokens-per-source"} <= set(counted), counted


def test_every_help_gives_the_defaults_a_user_would_otherwise_guess():
    """`generate --temperature` (0.8: sampling) and `eval loss --num-seqs` said nothing of their defaults."""
    import re

    help_text = " ".join(_run_cli("bias-shift", "--help").stdout.split())
    assert "--seq-len SEQ_LEN tokens per sequence, e.g. 4096 or 4Ki (default: 4096)" in help_text and "--shifts SHIFTS comma-separated shifts (default: " \
        "0,0.5,1,2)" in help_text
    loss = " ".join(_run_cli("eval", "loss", "--help").stdout.split())
    assert re.search(r"--num-seqs NUM_SEQS .*?\(default: \d+\)", loss) and "--no-progress (default" not in loss
    assert "default 0.8" in " ".join(_run_cli("generate", "--help").stdout.split())
    # a switch's default is the setting it turns off: `--no-anchor (default: True)` read as "no anchor by default"
    model = " ".join(_run_cli("bench", "model", "--help").stdout.split())
    assert "--no-anchor" in model and "(default: True)" not in model


@pytest.mark.parametrize("rank, message, shown", [("0", "", "interrupted"), ("1", "", None),
                                                   ("1", "stopped at step 3", "interrupted: stopped at step 3")],
                         ids=["rank0-bare", "rank1-bare-silent", "rank1-with-message"])
def test_ctrl_c_under_torchrun_is_said_once(monkeypatch, capsys, rank, message, shown):
    """Ctrl-C reaches every torchrun process: rank 0 says where to resume, and the other ranks' bare
    'interrupted' lines only repeated it; a rank with something of its own to say still says it."""
    import argparse

    from foxformer import cli

    def stopped(_args):
        raise KeyboardInterrupt(message) if message else KeyboardInterrupt

    monkeypatch.setenv("RANK", rank)
    monkeypatch.setattr(cli, "_parse", lambda parser, argv: (argparse.Namespace(func=stopped),
                                                             argparse.ArgumentParser(prog="foxformer train")))
    assert cli.main([]) == cli.INTERRUPTED_EXIT
    err = capsys.readouterr().err.strip()
    assert err == (shown or "")


@pytest.mark.parametrize("argv", [["export-hf", "RUN"], ["eval", "niah", "RUN"], ["generate", "RUN", "--prompt", "x"],
                                  ["demo"]], ids=["export-hf", "eval-niah", "generate", "demo"])
def test_a_command_of_one_process_refuses_to_be_one_of_several_under_torchrun(monkeypatch, capsys, argv):
    """Under torchrun every process ran the whole command, and the copies wrote the same outputs at once (an
    export's folder, eval's JSON and plots). Now the job stops before any work, said once, by rank 0."""
    from foxformer import cli

    monkeypatch.setenv("WORLD_SIZE", "2")
    for rank, said in (("0", True), ("1", False)):
        monkeypatch.setenv("RANK", rank)
        assert cli.main(argv) == cli.USER_ERROR_EXIT
        err = capsys.readouterr().err
        expected = (f"error: foxformer {argv[0]}{' ' + argv[1] if argv[0] == 'eval' else ''} runs in one process, "
                    f"and WORLD_SIZE=2 makes this one of 2 (torchrun sets it): each would run the whole command and "
                    f"write the same outputs; run it without torchrun (or unset WORLD_SIZE)\n")
        assert err == (expected if said else "")


def test_a_refused_flag_under_torchrun_is_said_once_and_named_in_torchruns_summary(monkeypatch, capsys, tmp_path):
    """Every rank parses the command line: each printed argparse's usage and error (as the launcher's SIGTERM let
    it), and torchrun's summary said "<N/A>". Now rank 0 says it, and each rank's entry there is the error line."""
    from foxformer import cli

    monkeypatch.setenv("WORLD_SIZE", "2")
    for rank in ("0", "1"):
        monkeypatch.setenv("RANK", rank)
        monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(tmp_path / f"error{rank}.json"))
        with pytest.raises(SystemExit) as stopped:
            cli.main(["train", "--lr", "abc"])
        assert stopped.value.code == cli.USER_ERROR_EXIT
        err = capsys.readouterr().err
        line = "foxformer train: error: argument --lr: expected a number, got 'abc'"
        assert (err.startswith("usage: foxformer train") and err.endswith(line + "\n")) if rank == "0" else err == ""
        assert json.loads((tmp_path / f"error{rank}.json").read_text())["message"]["message"] == line


def test_no_command_under_torchrun_is_a_refusal_reported_to_the_job(monkeypatch, capsys):
    """`torchrun ... -m foxformer.cli` with no command printed the help on every rank and exited 2, but left no
    failure in torchrun's store, so the other hosts' ranks waited until dist_timeout_minutes."""
    from foxformer import cli
    from foxformer.train import distributed

    reported = []
    monkeypatch.setattr(distributed, "report_early_failure", reported.append)
    monkeypatch.delenv("TORCHELASTIC_ERROR_FILE", raising=False)
    monkeypatch.setenv("WORLD_SIZE", "2")
    for rank in ("0", "1"):
        monkeypatch.setenv("RANK", rank)
        with pytest.raises(SystemExit) as stopped:
            cli.main([])
        assert stopped.value.code == cli.USER_ERROR_EXIT
        out, err = capsys.readouterr()
        assert not out
        if rank == "0":
            assert err.startswith("usage: foxformer") and "presets" in err, err
            assert err.endswith("foxformer: error: a command is required\n"), err
        else:
            assert err == ""
    assert reported == [f"the command line on host {cli.socket.gethostname()} was refused: "
                        "foxformer: a command is required"] * 2


@pytest.mark.parametrize("world, command, refused", [("2", "foxformer train", False),
                                                     ("1", "foxformer export-hf", False),
                                                     ("4", "foxformer bench model", True)],
                         ids=["train-is-distributed", "one-process", "bench-under-torchrun"])
def test_only_train_runs_as_one_process_of_several(monkeypatch, world, command, refused):
    from foxformer import cli

    monkeypatch.setenv("WORLD_SIZE", world)
    assert (cli._one_of_several(command) is not None) is refused


# A command interrupted with something in its frames whose freeing waits (as a DDP model with collectives in flight
# that the peers abandoned: every rank waited for the others until torchrun's SIGKILL, 30 s later, note unsaid).
_STUCK = """
import argparse, sys, time
from foxformer import cli

class Stuck:
    def __del__(self):
        time.sleep(60)

def interrupted(_args):
    held = Stuck()
    raise KeyboardInterrupt("training stopped (RUN); resume with: torchrun ...")

cli._parse = lambda parser, argv: (argparse.Namespace(func=interrupted), argparse.ArgumentParser(prog="foxformer train"))
sys.exit(cli.main([]))
"""


def test_ctrl_c_under_torchrun_ends_the_process_once_it_is_said():
    proc = subprocess.run([sys.executable, "-c", _STUCK], capture_output=True, text=True, timeout=30,
                          env={**os.environ, "PYTHONPATH": SRC, "WORLD_SIZE": "2", "RANK": "0"})
    assert (proc.returncode, proc.stderr) == (130, "interrupted: training stopped (RUN); resume with: torchrun ...\n")
