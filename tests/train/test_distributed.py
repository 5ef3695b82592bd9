"""Two CPU processes through torchrun (gloo) must reproduce the single-process run, for DDP and FSDP2."""
import os
import signal
import subprocess
import sys

import pytest
import torch

from foxformer.train import checkpoint as ckpt
from foxformer.train import distributed
from foxformer.train.loop import train
from foxformer.train.metrics import read_metrics

from .helpers import signal_once

SRC = os.path.join(os.path.dirname(__file__), "..", "..", "src")


def _losses(run_dir):
    return [r["loss"] for r in read_metrics(run_dir) if r["kind"] == "train"]


def _evals(run_dir):
    """{step: (val_loss, gate_log_f)} of a run's evaluations."""
    return {r["step"]: (r["val_loss"], r.get("gate_log_f")) for r in read_metrics(run_dir) if r["kind"] == "eval"}


# The recurrent baseline only under FSDP2: its sharding of the new modules is what DDP cannot get wrong,
# and each case costs a torchrun start (~9 s).
@pytest.mark.parametrize("parallel,preset", [("ddp", "fox-pro-tiny"), ("fsdp", "fox-pro-tiny"),
                                             ("fsdp", "linear-pro-tiny")], ids=lambda x: x)
def test_two_process_gloo_run_matches_single_process(parallel, preset, make_cfg, data_dir, tmp_path):
    # 3 validation sequences: one rank evaluates two, the other one and a copy it leaves out
    single = train(make_cfg(preset=preset, out_dir=str(tmp_path / "single"), max_steps=6, total_tokens=768,
                            eval_tokens=96))
    out = str(tmp_path / parallel)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "foxformer.cli", "train", "--data", data_dir, "--out", out, "--preset", preset,
           "--context", "32", "--batch-tokens", "128", "--max-steps", "4", "--total-tokens", "768", "--lr", "3e-3", "--eval-tokens", "96",
           "--checkpoint-every-tokens", "256", "--eval-every-tokens", "512", "--parallel", parallel,
           "--no-progress", "--set", "tensorboard=false", "--set", "export_hf=false"]
    env = {**os.environ, "PYTHONPATH": os.path.abspath(SRC), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert _losses(out) == pytest.approx(_losses(single["out_dir"])[:4], abs=2e-4)
    # the same validation sequences on any number of ranks (the count rounded to a multiple of the ranks chose
    # others, so a run resumed on another world size logged another loss for the same weights)
    evals, single_evals = _evals(out), _evals(single["out_dir"])
    assert list(evals) == [4]
    assert evals[4][0] == pytest.approx(single_evals[4][0], abs=2e-4)
    assert evals[4][1] == [pytest.approx(row, abs=1e-5) for row in single_evals[4][1]]  # the gates' means
    start = read_metrics(out)[0]
    assert start["world_size"] == 2 and start["parallel"] == parallel and start["grad_accum"] == 1
    # The distributed checkpoint is sharded: one process reshards it and continues on the same data.
    assert os.path.basename(ckpt.latest_checkpoint(out)) == "step_00000004"
    resumed = train(make_cfg(preset=preset, out_dir=out, max_steps=6, total_tokens=768, parallel="none"))
    assert resumed["resumed_from"].endswith("step_00000004")
    assert _losses(out) == pytest.approx(_losses(single["out_dir"]), abs=2e-4)


def test_fsdp_with_fused_loss_matches_single_process(make_cfg, data_dir, tmp_path):
    """The fused loss reads the LM head weight outside lm_head.forward: FSDP2 must have it unsharded. Both runs
    start from another run's model (init_from, loaded whole on every rank before FSDP2 shards it; one torchrun
    start for both checks)."""
    src = str(tmp_path / "src")
    train(make_cfg(out_dir=src, preset="fox-llama-tiny", max_steps=2))
    single = train(make_cfg(out_dir=str(tmp_path / "single"), init_from=src, max_steps=3, total_tokens=768))
    out = str(tmp_path / "fsdp-fused")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "foxformer.cli", "train", "--data", data_dir, "--out", out, "--init-from", src,
           "--context", "32", "--batch-tokens", "128", "--max-steps", "3", "--total-tokens", "768", "--lr", "3e-3",
           "--eval-tokens", "128", "--checkpoint-every-tokens", "100000", "--eval-every-tokens", "100000",
           "--parallel", "fsdp", "--fused-loss", "--no-progress", "--set", "tensorboard=false",
           "--set", "export_hf=false"]
    env = {**os.environ, "PYTHONPATH": os.path.abspath(SRC), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert _losses(out) == pytest.approx(_losses(single["out_dir"])[:3], abs=2e-4)


def test_ddp_and_fsdp_on_one_process_train_as_one(make_cfg, tmp_path, capsys):
    """A run saved under torchrun records parallel: ddp or fsdp, and `foxformer train --out RUN` without torchrun
    resumes it: one process, whose losses are the single-process run's (it stopped with torch's "Default process
    group has not been initialized")."""
    ref = train(make_cfg(out_dir=str(tmp_path / "ref"), max_steps=4, total_tokens=512))
    first = train(make_cfg(max_steps=2, total_tokens=512, parallel="ddp"))
    resumed = train(make_cfg(max_steps=4, total_tokens=512, parallel="fsdp"))
    assert (first["parallel"], resumed["parallel"]) == ("none", "none")
    assert resumed["resumed_from"].endswith("step_00000002")
    assert _losses(resumed["out_dir"]) == _losses(ref["out_dir"])
    err = capsys.readouterr().err
    assert "parallel ddp spreads a run over several processes" in err and "torchrun --nproc-per-node N" in err


# SIGTERM as SLURM delivers it (to torchrun and to each worker; torchrun forwards its copy), Ctrl-C as a terminal
# does (to torchrun alone: its workers run in sessions of their own, and it forwards the signal)
@pytest.mark.parametrize("sig, children, parallel, said", [
    (signal.SIGTERM, True, "fsdp", "training stopped on SIGTERM after step {step} ({out}); the last checkpoint is "
                                   "{last}; resume with: torchrun"),
    (signal.SIGINT, False, "ddp", "interrupted: training stopped ({out}); the last checkpoint is {last} (the steps "
                                  "after it will be redone); resume with: torchrun")],
    ids=["sigterm-to-every-process", "ctrl-c-to-torchrun"])
def test_a_stopped_torchrun_job_says_where_once_and_resumes_to_the_same_losses(sig, children, parallel, said,
                                                                               make_cfg, data_dir, tmp_path):
    """SIGTERM under torchrun stops every rank after the same step (they agree at its end) with a checkpoint;
    Ctrl-C abandons the step. Either way the job says once where it stands, rank 0 alone, with no traceback
    from a rank (torchrun's own, of its SignalException, is torchrun's), and resumes to the losses of one run."""
    out = str(tmp_path / parallel)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "foxformer.cli", "train", "--data", data_dir, "--out", out, "--preset", "fox-pro-tiny",
           "--context", "32", "--batch-tokens", "128", "--max-steps", "300", "--total-tokens", str(300 * 128),
           "--lr", "3e-3", "--eval-tokens", "96", "--checkpoint-every-tokens", "256", "--eval-every-tokens", "512",
           "--parallel", parallel, "--no-progress", "--set", "tensorboard=false", "--set", "export_hf=false"]
    env = {**os.environ, "PYTHONPATH": os.path.abspath(SRC), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    signal_once(proc, os.path.join(out, "checkpoints", "step_00000002"), sig, children=children)
    err = proc.stderr.read()
    assert proc.wait(timeout=120) != 0, err[-3000:]
    last = ckpt.latest_checkpoint(out)
    step = int(os.path.basename(last).removeprefix("step_"))
    notes = [line for line in err.splitlines() if "training stopped" in line]
    assert len(notes) == 1 and notes[0].startswith(said.format(step=step, out=out, last=last)), err[-3000:]
    frames = [line for line in err.splitlines() if line.lstrip().startswith('File "')]
    assert not [f for f in frames if os.path.join(os.path.abspath(SRC), "foxformer") in f], err[-3000:]
    ref = train(make_cfg(out_dir=str(tmp_path / "ref"), max_steps=step + 2, total_tokens=300 * 128))
    resumed = train(make_cfg(out_dir=out, max_steps=step + 2, total_tokens=300 * 128, parallel="none"))
    assert resumed["resumed_from"] == last
    assert _losses(out) == pytest.approx(_losses(ref["out_dir"]), abs=2e-4)


class _Store:
    """The rendezvous store's check / get / set, in memory."""

    def __init__(self, reports):
        self.data = {f"foxformer/failed/{rank}": text.encode() for rank, text in reports.items()}
        self.counts = {"foxformer/failed": len(reports)}

    def check(self, keys):
        return all(k in self.data for k in keys)

    def add(self, key, amount):
        self.counts[key] = self.counts.get(key, 0) + amount
        return self.counts[key]

    def get(self, key):
        return self.data[key]

    def set(self, key, value):
        self.data[key] = value.encode()


@pytest.mark.parametrize("peer, raised, expected, left", [
    ("rank 0 was interrupted (Ctrl-C)", RuntimeError("Connection closed by peer"), KeyboardInterrupt, None),
    ("rank 0 was interrupted (Ctrl-C)", KeyboardInterrupt(), KeyboardInterrupt, "rank 1 was interrupted (Ctrl-C)"),
    ("rank 0 failed: ValueError: bad batch", KeyboardInterrupt(), distributed.PeerFailure, None),
], ids=["peer-interrupted-broke-my-collective", "both-interrupted", "peer-failed-then-ctrl-c"])
def test_a_peers_ctrl_c_is_no_failure_of_the_job(monkeypatch, peer, raised, expected, left):
    """Ctrl-C reaching one rank first broke the other's collective, which then said "error: rank 0 failed:
    KeyboardInterrupt" beside rank 0's note; now it stops as interrupted too, and the command says it once."""
    store = _Store({0: peer})
    monkeypatch.setattr(distributed, "_STORE", store)
    monkeypatch.setattr(distributed, "_REPORT_GRACE_S", 0.0)
    info = distributed.DistInfo(rank=1, world_size=2, local_rank=1, device=torch.device("cpu"), mode="ddp")
    with pytest.raises(expected) as caught:
        with distributed.failures_reported(info):
            raise raised
    if expected is distributed.PeerFailure:  # a peer's real failure is still the message to give
        assert str(caught.value).startswith("rank 0 failed: ValueError: bad batch (rank 1 stopped with it")
    assert store.data.get("foxformer/failed/1") == (left.encode() if left else None)  # what rank 2, 3... would read
    assert store.counts["foxformer/failed"] == 1 + bool(left)


class _Stop:
    """A StopSignals whose signal arrived (torchrun's SIGTERM, once a rank ended)."""

    requested = True

    def end_by_signal(self):
        raise SystemExit("ended by the signal")


@pytest.mark.parametrize("reports, stop, raised, expected", [
    ({1: "rank 1 failed: SettingError: out_dir: 'run' is a file"}, None, distributed.PeerFailure,
     "^rank 1 failed: SettingError: out_dir: 'run' is a file$"),
    ({1: "rank 1 was interrupted (Ctrl-C)"}, None, KeyboardInterrupt, None),
    ({}, _Stop(), SystemExit, "ended by the signal"),
    ({}, None, TimeoutError,
     r"rank 1 of this job did not reach the start of training within 0.0005 minutes \(dist_timeout_minutes\)"),
], ids=["peer-failed-its-checks", "peer-interrupted", "torchrun-stops-this-rank", "peer-never-came"])
def test_the_process_group_waits_for_every_ranks_checks_and_no_longer(monkeypatch, reports, stop, raised, expected):
    """init_process_group waited for a rank that had failed its own checks until torchrun's SIGKILL (one host) or
    the timeout (several): the wait before it ends with the peer's message, on torchrun's signal, or at the
    timeout naming the rank that never came; the process group is never started."""
    store = _Store(reports)
    monkeypatch.setattr(distributed, "_STORE", store)
    monkeypatch.setattr(distributed.dist, "init_process_group", lambda **kw: pytest.fail("started the group"))
    info = distributed.DistInfo(rank=0, world_size=2, local_rank=0, device=torch.device("cpu"), mode="ddp")
    with pytest.raises(raised, match=expected):
        distributed.start_process_group(info, timeout_minutes=0.0005, stop=stop)
    assert store.data["foxformer/ready/0"] == b"1" and store.counts["foxformer/ready"] == 1  # what the others wait for


@pytest.mark.parametrize("agent_store, left", [
    (True, "rank 1 failed: ValueError: --config: file 'cfg.yaml' does not exist"), (False, None),
], ids=["torchrun-keeps-the-store", "store-of-a-launch-by-hand"])
def test_a_rank_that_fails_before_it_joined_the_job_leaves_its_error(monkeypatch, agent_store, left):
    """A rank that failed before train() joined the job (a --config only another host had) left nothing: the
    others waited for it until dist_timeout_minutes. It joins torchrun's store to leave its error there, which
    outlives it (a store by hand is rank 0's, gone with it)."""
    server = torch.distributed.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    monkeypatch.setattr(distributed, "_STORE", None)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(server.port))
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", str(agent_store))
    with pytest.raises(ValueError, match="^--config: file 'cfg.yaml' does not exist$"):
        with distributed.failures_reported():
            raise ValueError("--config: file 'cfg.yaml' does not exist")
    assert server.add("foxformer/failed", 0) == (left is not None)  # what the waiting ranks poll
    assert (server.get("foxformer/failed/1").decode() if server.check(["foxformer/failed/1"]) else None) == left


def test_the_runs_report_of_a_failure_stands_when_the_command_rewords_it(monkeypatch):
    """train() leaves its error, which the command then names by its flag: one report, the run's, as the
    others read it (a second would count the failure twice)."""
    store = _Store({})
    monkeypatch.setattr(distributed, "_STORE", store)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    info = distributed.DistInfo(rank=1, world_size=2, local_rank=1, device=torch.device("cpu"), mode="ddp")
    with pytest.raises(ValueError, match="^--batch-tokens 48: reworded$"):
        with distributed.failures_reported():
            try:
                with distributed.failures_reported(info):
                    raise ValueError("batch_tokens: raw")
            except ValueError:
                raise ValueError("--batch-tokens 48: reworded") from None
    assert store.data == {"foxformer/failed/1": b"rank 1 failed: ValueError: batch_tokens: raw"}
    assert store.counts["foxformer/failed"] == 1


# A rank whose host cannot import transformers (an install that differs between hosts), under torchrun's store
_WITHOUT_TRANSFORMERS = """
import sys
sys.modules["transformers"] = None  # what its import finds on this host: none
from foxformer.cli import main
sys.exit(main(["train", "--out", "run", "--max-steps", "1"]))
"""


def test_a_rank_that_cannot_import_what_training_needs_leaves_its_error(monkeypatch, tmp_path):
    """The module that leaves a rank's error imported the models, and with them transformers and triton: a host
    without one of them stopped its ranks before they could say why, and the others waited until
    dist_timeout_minutes. Now the rank leaves the error, and the rank waiting for it stops with it."""
    server = torch.distributed.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    env = {**os.environ, "PYTHONPATH": os.path.abspath(SRC), "WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "0",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(server.port), "TORCHELASTIC_USE_AGENT_STORE": "True"}
    proc = subprocess.run([sys.executable, "-c", _WITHOUT_TRANSFORMERS], env=env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr[-3000:]
    left = "rank 1 failed: ModuleNotFoundError: import of transformers halted; None in sys.modules"
    key = "foxformer/failed/1"
    assert (server.get(key).decode() if server.check([key]) else None) == left, proc.stderr[-3000:]
    monkeypatch.setattr(distributed, "_STORE", server)
    monkeypatch.setattr(distributed.dist, "init_process_group", lambda **kw: pytest.fail("started the group"))
    info = distributed.DistInfo(rank=0, world_size=2, local_rank=0, device=torch.device("cpu"), mode="ddp")
    with pytest.raises(distributed.PeerFailure, match=f"^{left}$"):
        distributed.start_process_group(info, timeout_minutes=10)
