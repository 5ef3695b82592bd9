"""`foxformer train` as a user meets it: strict configs, a run's own config, one-flag resume, a clear error
for every fault (through the CLI: the exit code and the one `error:` line are what a user sees), and the lock
that keeps two runs out of one folder."""
import errno
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
import yaml

from foxformer.cli import main
from foxformer.models import get_preset
from foxformer.train import checkpoint as ckpt
from foxformer.train.config import load_config
from foxformer.train.loop import train
from foxformer.train.metrics import read_metrics

from .helpers import signal_once

SRC = os.path.join(os.path.dirname(__file__), "..", "..", "src")


def _flags(data_dir, out, steps=8):
    """The tiny run of make_cfg as command-line flags (no --tokenizer: the dataset's manifest names it)."""
    return ["train", "--data", data_dir, "--out", out, "--preset", "fox-pro-tiny", "--context", "32",
            "--batch-tokens", "128", "--max-steps", str(steps), "--lr", "3e-3", "--eval-tokens", "128",
            "--checkpoint-every-tokens", "256", "--eval-every-tokens", "512", "--no-progress",
            "--set", "tensorboard=false", "--set", "export_hf=false"]


def _cli(*argv, timeout=300):
    return subprocess.run([sys.executable, "-m", "foxformer.cli", *argv], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": SRC}, timeout=timeout)


def _losses(run_dir):
    return [r["loss"] for r in read_metrics(run_dir) if r["kind"] == "train"]


def _one_error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert "Traceback" not in err and lines and lines[-1].startswith("error: "), err
    return lines[-1]


# 1. unknown model keys ----------------------------------------------------------------------------------------
def test_an_unknown_model_key_fails_with_the_closest_one(data_dir, tmp_path, capsys):
    """`--model num_head=8` exited 0, saved num_head: 8 and trained the preset's 4 heads."""
    out = str(tmp_path / "run")
    assert main(_flags(data_dir, out) + ["--model", "num_head=8"]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert "unknown model key 'num_head' (did you mean 'num_heads'?)" in line
    assert not os.path.exists(out)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"preset: fox-pro-tiny\ndata_dir: {data_dir}\nmax_steps: 1\nmodel: {{num_layer: 3}}\n")
    with pytest.raises(ValueError, match="unknown model key 'num_layer' \\(did you mean 'num_layers'\\?\\)"):
        load_config(str(cfg))
    with pytest.raises(ValueError, match="did you mean 'num_heads'"):
        get_preset("fox-pro-tiny", num_head=8)
    with pytest.raises(ValueError, match="did you mean 'fox-pro-tiny'"):
        get_preset("fox-pro-tinny")


@pytest.mark.parametrize("twice,said", [
    (["--model", "hidden_size=64", "--model", "hidden_size=128"], "--model: hidden_size is given twice"),
    (["--set", "model.hidden_size=128", "--model", "hidden_size=96"], "--model: hidden_size is given twice"),
    (["--set", "lr=1e-3", "--lr", "2e-3"], "--lr (lr): given as '2e-3' and by --set lr='1e-3'"),
    (["--set", "lr=0.001", "--lr", "2e-3"], "--lr (lr): given as '2e-3' and by --set lr=0.001; give it once"),
    (["--set", "batch_tokens=1Ki0", "--batch-tokens", "1024"], "given as '1024' and by --set batch_tokens='1Ki0'"),
], ids=["model-twice", "set-and-model", "set-and-flag", "set-and-flag-typed", "set-and-flag-of-no-count"])
def test_a_key_given_twice_with_two_values_is_refused(tmp_path, capsys, twice, said):
    """The last one won without a word: `--model hidden_size=64 ... --model hidden_size=128` trained 128."""
    out = str(tmp_path / "run")
    assert main(["train", "--data", str(tmp_path), "--out", out, "--max-steps", "1", *twice]) == 2
    assert said in _one_error_line(capsys.readouterr().err)
    assert not os.path.exists(out)


def test_a_key_given_twice_with_one_value_is_taken():
    from foxformer.train.config import parse_overrides

    assert parse_overrides(["model.rope=true", "model.rope=on", "lr=1e-3"]) == {"model": {"rope": True}, "lr": "1e-3"}


@pytest.mark.parametrize("flags, key, value", [
    (["--lr", "1e-3", "--set", "lr=0.001"], "lr", 0.001),
    (["--set", "lr=1", "--lr", "1.0"], "lr", 1.0),
    (["--batch-tokens", "2Ki", "--set", "batch_tokens=2048"], "batch_tokens", 2048),
    (["--max-steps", "10", "--set", "max_steps=1e1"], "max_steps", 10),
    (["--compile", "--set", "compile=on"], "compile", True),
], ids=["lr", "lr-int", "token-count", "steps", "switch"])
def test_one_value_given_by_a_flag_and_by_set_is_taken(flags, key, value):
    """`--lr 1e-3 --set lr=0.001` was refused as given twice: the flag's text and --set's YAML value were compared
    as text. They are compared as the config types them."""
    from foxformer.cli import build_parser
    from foxformer.train.cli import _overrides

    args = build_parser().parse_args(["train", "--max-steps", "10", *flags])
    cfg = load_config(None, _overrides(args))
    assert getattr(cfg, key) == value and type(getattr(cfg, key)) is type(value)


# 2. a run's own config, resume with --out alone, the tokenizer from the manifest --------------------------------
def test_a_runs_saved_config_is_a_valid_config_file(make_cfg, tmp_path):
    """`--config RUN/config.yaml` said: unknown config key 'derived'."""
    first = make_cfg(out_dir=str(tmp_path / "a"), max_steps=2)
    train(first)
    saved = os.path.join(first.out_dir, "config.yaml")
    assert "derived" in yaml.safe_load(open(saved))
    again = load_config(saved, {"out_dir": str(tmp_path / "b")})
    assert again == make_cfg(out_dir=str(tmp_path / "b"), max_steps=2, tokenizer="bytes")


def test_ctrl_c_says_where_to_resume_and_out_alone_resumes_to_the_same_losses(make_cfg, data_dir, tmp_path):
    """Ctrl-C printed a traceback and no word on the last checkpoint; resuming meant repeating every flag
    (`--out RUN` alone: 'total_tokens / max_steps: set at least one'). Now SIGINT mid-run ends with the last
    checkpoint and the resume command, and `foxformer train --out RUN` finishes the run with the same losses
    as an uninterrupted one."""
    ref = train(make_cfg(out_dir=str(tmp_path / "ref"), max_steps=6))
    run = str(tmp_path / "interrupted")
    # The child gets SIGINT's default disposition, as under a terminal: a suite started as a background job of a
    # non-interactive shell (`pytest &`) ignores SIGINT, and children inherit that (the run then never stopped).
    proc = subprocess.Popen([sys.executable, "-m", "foxformer.cli", *_flags(data_dir, run, steps=6)],
                            env={**os.environ, "PYTHONPATH": SRC}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    signal_once(proc, os.path.join(run, "checkpoints", "step_00000002"), signal.SIGINT)
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == 130, err[-2000:]
    assert "Traceback" not in err, err[-2000:]
    last = ckpt.latest_checkpoint(run)
    assert f"the last checkpoint is {last}" in err and f"resume with: foxformer train --out {run}" in err, err
    done = _cli("train", "--out", run)
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"continuing {run} with its config.yaml" in done.stderr
    # The reference ran in this process, the interrupted run in a child: on a loaded 2-core CI machine their second
    # step once differed in the 7th digit (10.800350 against 10.800348, thirty-ninth session) before any
    # interruption; a resume that read other data or lost the optimizer state differs by far more.
    assert _losses(run) == pytest.approx(_losses(ref["out_dir"]), rel=1e-5, abs=0)
    assert yaml.safe_load(open(os.path.join(run, "config.yaml")))["tokenizer"] == "bytes"  # from the manifest


def test_a_run_stopped_before_its_first_checkpoint_says_it_starts_again_from_step_0(make_cfg, tmp_path, capsys):
    """After a Ctrl-C before the first checkpoint, `train --out RUN` said both 'continuing RUN with its
    config.yaml' and 'new run in RUN'; now one line says that RUN starts again from step 0."""
    run = str(tmp_path / "early")

    def stop(step, record):
        raise RuntimeError("stopped before the first checkpoint")

    with pytest.raises(RuntimeError):
        train(make_cfg(out_dir=run, max_steps=2, checkpoint_every_tokens=1024), hook=stop)
    assert os.path.isfile(os.path.join(run, "config.yaml")) and ckpt.latest_checkpoint(run) is None
    capsys.readouterr()
    assert main(["train", "--out", run]) == 0
    said = [line for line in capsys.readouterr().err.splitlines() if line.startswith("train: ")]
    assert len(said) == 1 and said[0].startswith(f"train: {run} has no checkpoint yet (stopped before its first), "
                                                 f"so it starts again from step 0: fox-pro-tiny ("), said


def _cut_after_step_3(make_cfg, run: str) -> None:
    """A 6-step run in ``run`` that failed after step 3, its last checkpoint that of step 2."""
    def cut(step, record):
        if step == 3:
            raise RuntimeError("cut after step 3")

    with pytest.raises(RuntimeError):
        train(make_cfg(out_dir=run, max_steps=6), hook=cut)


def test_a_resumed_run_says_which_checkpoint_and_step_it_goes_on_from(make_cfg, tmp_path, capsys):
    """`train --out RUN` on an interrupted run said only 'continuing RUN with its config.yaml': nothing named the
    checkpoint or the step it went on from until the first step line, log_every steps later."""
    run = str(tmp_path / "cut")
    _cut_after_step_3(make_cfg, run)
    last = ckpt.latest_checkpoint(run)
    assert last.endswith("step_00000002")
    capsys.readouterr()
    assert main(["train", "--out", run, "--max-minutes", "5"]) == 0
    said = [line for line in capsys.readouterr().err.splitlines() if line.startswith("train: ")]
    assert said == [f"train: continuing {run} with its config.yaml (flags given override it)",
                    f"train: resuming {run} from {last}: step 2 of 6 (256 tokens trained), 4 steps to go, at most "
                    f"5 minutes"], said



def test_a_max_minutes_given_on_a_resume_is_said_on_later_ones_and_left_to_its_run(make_cfg, data_dir, tmp_path,
                                                                                    capsys):
    """`--max-minutes` given to one invocation is saved in the run's config.yaml: later resumes took it without a
    word, and so did a new run from `--config RUN/config.yaml` (a fine-tuning run said "at most 0.5 minutes").
    Resumes keep it (the README's "one more minute") and say so; a new run from another run's file does not take
    it; a file of the user's own keeps its limit."""
    run, tuned, own = str(tmp_path / "cut"), str(tmp_path / "tuned"), str(tmp_path / "own")

    def cut(step, record):
        if step == 3:
            raise RuntimeError("cut after step 3")

    with pytest.raises(RuntimeError):
        train(make_cfg(out_dir=run, max_steps=6, max_minutes=30), hook=cut)
    capsys.readouterr()
    assert main(["train", "--out", run]) == 0
    said = [line for line in capsys.readouterr().err.splitlines() if line.startswith("train: ")]
    assert said[0] == (f"train: continuing {run} with its config.yaml (flags given override it); its max_minutes (30, "
                       f"from an earlier invocation) applies again: --max-minutes M for another limit, --set "
                       f"max_minutes=null for none")
    assert said[1].endswith("4 steps to go, at most 30 minutes"), said
    saved = os.path.join(run, "config.yaml")
    assert main(["train", "--config", saved, "--out", tuned, "--max-steps", "1"]) == 0
    said = [line for line in capsys.readouterr().err.splitlines() if line.startswith("train: ")]
    assert said[0] == (f"train: note: --config {saved} is another run's, whose max_minutes (30) limited that run's "
                       f"own invocations: this run has no time limit (--max-minutes M gives it one)")
    assert said[1].startswith(f"train: new run in {tuned}: ") and "at most" not in said[1], said
    assert yaml.safe_load(open(os.path.join(tuned, "config.yaml")))["max_minutes"] is None
    mine = tmp_path / "mine.yaml"
    mine.write_text(yaml.safe_dump({"data_dir": data_dir, "out_dir": own, "preset": "fox-pro-tiny", "context": 32,
                                    "batch_tokens": 128, "max_steps": 1, "max_minutes": 30, "progress": False,
                                    "eval_tokens": 128, "tensorboard": False, "export_hf": False}))
    assert main(["train", "--config", str(mine)]) == 0
    said = [line for line in capsys.readouterr().err.splitlines() if line.startswith("train: ")]
    assert len(said) == 1 and said[0].endswith(", at most 30 minutes"), said


def _gpt2_data(tmp_path) -> str:
    """A dataset of GPT-2 tokens (the default tokenizer), beside the runs of make_cfg on bytes."""
    docs = tmp_path / "docs"
    docs.mkdir()
    for i in range(3):
        (docs / f"{i}.txt").write_text(f"document {i} " * 50)
    other = str(tmp_path / "gpt2")
    assert main(["data", "prepare", "--source", str(docs), "--out", other, "--no-progress"]) == 0
    return other


def test_resuming_on_data_of_another_tokenizer_names_the_data_the_run_trained_on(make_cfg, data_dir, tmp_path,
                                                                                  capsys):
    """`train --out RUN --data OTHER`, OTHER of GPT-2 tokens beside a bytes run, said "leave the tokenizer out to use
    the dataset's": the user had given none (the run's config.yaml had), and a resumed run cannot change it."""
    run = str(tmp_path / "run")
    _cut_after_step_3(make_cfg, run)
    other = _gpt2_data(tmp_path)
    capsys.readouterr()
    assert main(["train", "--out", run, "--data", other]) == 2
    assert _one_error_line(capsys.readouterr().err) == (
        f"error: --data (data_dir): {other!r} was tokenized with 'gpt2', but the run in {run} trained on 'bytes' "
        f"tokens, and a resumed run must see the same data: give the data it trained on ({data_dir!r}), or train on "
        f"this data as a new run in another out_dir (nothing was overwritten)")
    assert ckpt.latest_checkpoint(run).endswith("step_00000002")



def test_data_of_another_tokenizer_than_a_config_files_names_that_file_not_a_flag(make_cfg, tmp_path, capsys):
    """A new run from a bytes run's config.yaml (`--config RUN/config.yaml`, or RUN stopped before its first
    checkpoint) on `--data` of GPT-2 tokens said "leave the tokenizer out to use the dataset's": the file gave the
    tokenizer, no flag had. The --tokenizer that does use the dataset's is named; one given is still refused so."""
    run, restarted = str(tmp_path / "run"), str(tmp_path / "restarted")
    train(make_cfg(out_dir=run, max_steps=1))
    os.makedirs(restarted)
    saved = yaml.safe_load(open(os.path.join(run, "config.yaml")))
    with open(os.path.join(restarted, "config.yaml"), "w") as f:
        yaml.safe_dump({**saved, "out_dir": restarted}, f)
    other = _gpt2_data(tmp_path)
    for argv, source in ((["--config", os.path.join(run, "config.yaml"), "--out", str(tmp_path / "new")],
                          os.path.join(run, "config.yaml")),
                         (["--out", restarted], os.path.join(restarted, "config.yaml"))):
        capsys.readouterr()
        assert main(["train", *argv, "--data", other]) == 2
        assert _one_error_line(capsys.readouterr().err) == (
            f"error: --data (data_dir): {other!r} was tokenized with 'gpt2', but {source} sets tokenizer 'bytes' (no "
            f"flag gave it); give --tokenizer gpt2 to train on this data, or prepare the data again with --tokenizer "
            f"bytes")
    assert main(["train", "--out", restarted, "--data", other, "--tokenizer", "bytes"]) == 2
    assert _one_error_line(capsys.readouterr().err) == (
        f"error: --data (data_dir): {other!r} was tokenized with 'gpt2' but the run expects tokenizer 'bytes'; leave "
        f"the tokenizer out to use the dataset's, or prepare the data again with --tokenizer bytes")


def test_sigterm_saves_says_where_and_exits_143_and_the_run_resumes_to_the_same_losses(make_cfg, data_dir, tmp_path):
    """A scheduler's SIGTERM (preemption, the time limit) killed the run: everything since its last periodic
    checkpoint was lost. Now it ends the step in progress, saves it, says where and how to resume in one line and
    exits 143 (128 + SIGTERM), and the resumed run has the losses of an uninterrupted one."""
    run = str(tmp_path / "preempted")
    flags = [*_flags(data_dir, run, steps=300), "--total-tokens", str(300 * 128)]
    proc = subprocess.Popen([sys.executable, "-m", "foxformer.cli", *flags], env={**os.environ, "PYTHONPATH": SRC},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    signal_once(proc, os.path.join(run, "checkpoints", "step_00000002"), signal.SIGTERM)
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == 143, err[-2000:]
    last = ckpt.latest_checkpoint(run)
    step = int(os.path.basename(last).removeprefix("step_"))
    assert err.splitlines()[-1] == (f"training stopped on SIGTERM after step {step} ({run}); the last checkpoint is "
                                    f"{last}; resume with: foxformer train --out {run}"), err
    assert "Traceback" not in err
    ref = train(make_cfg(out_dir=str(tmp_path / "ref"), max_steps=step + 2, total_tokens=300 * 128))
    resumed = train(make_cfg(out_dir=run, max_steps=step + 2, total_tokens=300 * 128))
    assert resumed["resumed_from"] == last
    # rel 1e-5: the child and this process may round one reduction differently (see the Ctrl-C test above)
    assert _losses(run) == pytest.approx(_losses(ref["out_dir"]), rel=1e-5, abs=0)



def test_a_background_job_with_sigint_ignored_is_told_to_stop_by_sigterm(data_dir, tmp_path):
    """`foxformer train ... &` in a script: the shell starts it with SIGINT ignored, so Ctrl-C and `kill -INT` did
    nothing at all and the run went on unsaid; rank 0 now says so at start, and the command it names stops the run
    with a checkpoint."""
    run = str(tmp_path / "background")
    flags = [*_flags(data_dir, run, steps=300), "--total-tokens", str(300 * 128)]
    command = " ".join([sys.executable, "-m", "foxformer.cli", *flags])
    proc = subprocess.Popen(["sh", "-c", f"{command} & wait $!"], env={**os.environ, "PYTHONPATH": SRC},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    note = proc.stderr.readline()
    pid = int(note.rpartition("kill -TERM ")[2].partition("`")[0])
    assert note == (f"train: note: this process was started with SIGINT ignored (a background job, `... &` in a "
                    f"script), so Ctrl-C and kill -INT will not stop this run; stop it with `kill -TERM {pid}`, "
                    f"which ends it after the step in progress with a checkpoint\n")
    os.kill(pid, signal.SIGINT)
    _wait_for(proc, os.path.join(run, "checkpoints", "step_00000002"))
    os.kill(pid, signal.SIGINT)
    _wait_for(proc, os.path.join(run, "checkpoints", "step_00000004"))  # the interrupts changed nothing
    os.kill(pid, signal.SIGTERM)
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == 143, err[-2000:]  # the shell's `wait` gives the job's status
    last = ckpt.latest_checkpoint(run)
    step = int(os.path.basename(last).removeprefix("step_"))
    assert err.splitlines()[-1] == (f"training stopped on SIGTERM after step {step} ({run}); the last checkpoint is "
                                    f"{last}; resume with: foxformer train --out {run}"), err
    assert "KeyboardInterrupt" not in err


def _wait_for(proc, path, timeout=240.0):
    deadline = time.time() + timeout
    while not os.path.exists(path):
        assert proc.poll() is None and time.time() < deadline, proc.stderr.read()[-2000:]
        time.sleep(0.01)


# 6. one error line for each fault ----------------------------------------------------------------------------
@pytest.mark.parametrize("fault", ["torch-save-full-disk", "os-full-disk"])
def test_a_full_disk_during_a_checkpoint_is_one_error_line(data_dir, tmp_path, monkeypatch, capsys, fault):
    """A full disk ended in a traceback from inline_container.cc ('unexpected pos'); now one line naming the
    folder, the reason and the resume command, and no partial checkpoint folder."""
    real_save = torch.save
    calls = {"n": 0}

    def full_disk(obj, path, *a, **k):
        calls["n"] += 1
        if calls["n"] > 3:  # the second checkpoint
            if fault == "os-full-disk":
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)
            raise RuntimeError("[enforce fail at inline_container.cc:664] . unexpected pos 4352 vs 4246")
        return real_save(obj, path, *a, **k)

    monkeypatch.setattr(torch, "save", full_disk)
    out = str(tmp_path / "run")
    assert main(_flags(data_dir, out)) == 2
    line = _one_error_line(capsys.readouterr().err)
    root = ckpt.checkpoint_root(out)
    assert f"checkpoint: step 4 could not be written ({root})" in line
    assert ("unexpected pos" if fault == "torch-save-full-disk" else "No space left on device") in line
    assert f"resume with: foxformer train --out {out}" in line
    assert sorted(os.listdir(root)) == ["latest", "step_00000002"]


def test_a_full_disk_under_the_metrics_names_their_file(tmp_path):
    """A full disk while a step's record was written said "no space left on device" and not where."""
    from foxformer.train.metrics import MetricsSink

    class FullDisk:
        def write(self, text):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    sink = MetricsSink(str(tmp_path), 0, tensorboard=False)
    sink._file.close()
    sink._file = FullDisk()
    with pytest.raises(OSError) as raised:
        sink.write({"kind": "train", "step": 1, "loss": 5.0})
    assert raised.value.errno == errno.ENOSPC and raised.value.filename == str(tmp_path / "metrics.jsonl")


def test_out_that_is_a_file_or_read_only_is_one_error_line(data_dir, tmp_path, monkeypatch, capsys):
    """`--out` naming a file, or a folder under a read-only mount, ended in tracebacks."""
    a_file = tmp_path / "notes.txt"
    a_file.write_text("x")
    assert main(_flags(data_dir, str(a_file))) == 2
    assert f"--out (out_dir): '{a_file}' is a file, not a folder" in _one_error_line(capsys.readouterr().err)
    assert main(_flags(data_dir, str(a_file / "run"))) == 2
    assert f"cannot be created ({a_file} is a file)" in _one_error_line(capsys.readouterr().err)
    locked = tmp_path / "read-only"
    locked.mkdir()
    if os.geteuid() != 0:
        locked.chmod(0o555)
    else:  # root writes through permissions: answer as a read-only mount does (EROFS)
        real_access = os.access
        monkeypatch.setattr(os, "access", lambda p, mode, **k: False if os.path.abspath(p) == str(locked)
                            else real_access(p, mode, **k))
    try:
        assert main(_flags(data_dir, str(locked / "run"))) == 2
        line = _one_error_line(capsys.readouterr().err)
        assert f"--out (out_dir): '{locked / 'run'}' is not writable ({locked} is read-only" in line
    finally:
        locked.chmod(0o755)
    assert not os.path.exists(locked / "run")


def test_a_diverged_run_is_one_error_line_naming_the_step(data_dir, tmp_path, monkeypatch, capsys):
    """A NaN loss ended in a FloatingPointError traceback (and a FoX model's NaN gate in 'error: log_fgate
    contains NaN', naming no step); now one line with the step, what went non-finite and what to change."""
    from foxformer.train import setup

    real_build = setup.build_model

    def nan_loss_from_step_3(*args, **kwargs):
        model, model_cfg = real_build(*args, **kwargs)
        calls = {"n": 0}

        def poison(module, inputs, out):
            calls["n"] += module.training
            return out * float("nan") if module.training and calls["n"] >= 3 else out
        model.get_output_embeddings().register_forward_hook(poison)
        return model, model_cfg

    monkeypatch.setattr(setup, "build_model", nan_loss_from_step_3)
    out = str(tmp_path / "run")
    assert main([*_flags(data_dir, out), "--set", "grad_clip=0"]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert line.startswith("error: training diverged at step 3: the loss is nan and the gradient norm nan at lr ")
    assert "--lr (now 0.003)" in line and "--set grad_clip=1" in line
    assert os.path.basename(ckpt.latest_checkpoint(out)) == "step_00000002"


# 8. one run per folder ------------------------------------------------------------------------------------------
def test_a_second_run_on_a_busy_folder_stops_at_once(data_dir, tmp_path):
    """Two `foxformer train --out SAME` both ran and interleaved metrics.jsonl."""
    from foxformer.paths import folder_lock

    out = str(tmp_path / "busy")
    with folder_lock(out, "out_dir"):  # what the first run holds while it writes
        second = _cli(*_flags(data_dir, out, steps=2))
    assert second.returncode == 2
    assert f"another process is writing into '{out}'" in _one_error_line(second.stderr)
    assert not os.path.exists(os.path.join(out, "metrics.jsonl"))
    assert main(_flags(data_dir, out, steps=2)) == 0  # free again once its holder let go


def test_an_interrupted_config_save_keeps_the_earlier_config_and_leaves_no_temporary(tmp_path, monkeypatch):
    """save_config wrote a temporary and renamed it, but a Ctrl-C in between left the temporary in the run folder."""
    from foxformer.train.config import TrainConfig, save_config

    path = tmp_path / "config.yaml"
    save_config(TrainConfig(total_tokens=1000), str(path))
    earlier = path.read_text()
    monkeypatch.setattr(os, "fsync", lambda fd: (_ for _ in ()).throw(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        save_config(TrainConfig(total_tokens=2000), str(path))
    assert path.read_text() == earlier
    assert os.listdir(tmp_path) == ["config.yaml"]
