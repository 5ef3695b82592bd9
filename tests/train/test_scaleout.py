"""Sharded checkpoints across world sizes and simulated nodes, on CPU processes (gloo).

One chain of launches serves most tests (each torchrun start costs seconds): a 2-node launch (1 process
per node) trains FSDP2 and saves sharded checkpoints; a 3-process DDP launch resumes one of them; a
2-node launch of 2 processes each (4 ranks, FSDP2) resumes the 3-process run; single processes resume the
2- and 4-rank checkpoints. Every segment must follow one uninterrupted single-process run step by step.
"""
import io
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading

import pytest
import torch

from foxformer.train import checkpoint as ckpt
from foxformer.train import sharded
from foxformer.train.config import TrainConfig
from foxformer.train.loop import train
from foxformer.train.metrics import read_metrics
from tests.bars import BARS_BY_PLACE, Terminal

SRC = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "src"))
FAILING_RANK = os.path.join(os.path.dirname(__file__), "failing_rank.py")
RANK_FOLDER = os.path.join(os.path.dirname(__file__), "rank_folder.py")
STEPS = 6
# 12 sequences of 16 tokens a step: divisible by 1, 2, 3 and 4 ranks
RUN = dict(preset="fox-pro-tiny", context=16, batch_tokens=192, total_tokens=STEPS * 192, lr=3e-3, eval_tokens=64,
           eval_every_tokens=10**6, checkpoint_every_tokens=192, tensorboard=False, export_hf=False, progress=False)


@pytest.fixture(scope="module")
def byte_data(tmp_path_factory):
    """Byte-level tokens: a 320-entry vocabulary keeps every checkpoint near 1 MB."""
    from foxformer.data.preparation import PrepareConfig, prepare

    out = tmp_path_factory.mktemp("bytes") / "pydoc"
    prepare(PrepareConfig(sources=["builtin:pydoc"], out_dir=str(out), tokenizer="bytes", val_fraction=0.1,
                          max_tokens_per_source=200_000), progress=False)
    return str(out)


def _cfg(data: str, out: str, **overrides) -> TrainConfig:
    return TrainConfig(**{**RUN, "data_dir": data, "out_dir": out, "tokenizer": "bytes", **overrides})


def _cli_args(data: str, out: str, **overrides) -> list[str]:
    values = {**RUN, "data_dir": data, "out_dir": out, "tokenizer": "bytes", **overrides}
    return ["--no-progress", *[a for k, v in values.items() if k != "progress" for a in ("--set", f"{k}={v}")]]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(nodes: int, per_node: int, args: list[str], script: list[str] | None = None, timeout: float = 300,
            node_args: list[list[str]] | None = None):
    """``nodes`` torchrun launches over the loopback address, as on ``nodes`` hosts (one alone: standalone);
    ``node_args[i]`` is added to node i's command line. Returns [(returncode, stdout, stderr)] per node."""
    target = script or ["-m", "foxformer.cli", "train"]
    if nodes == 1:
        rdzv = [["--standalone"]]
    else:
        port = _free_port()
        rdzv = [["--nnodes", str(nodes), "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
                 "--rdzv-id", f"job{port}", "--rdzv-conf", f"is_host={int(i == 0)}"] for i in range(nodes)]
    env = {**os.environ, "PYTHONPATH": SRC, "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, "-m", "torch.distributed.run", *r, "--nproc-per-node", str(per_node),
                               *target, *args, *extra], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)
             for r, extra in zip(rdzv, node_args or [[]] * nodes)]
    try:
        outputs = [p.communicate(timeout=timeout) for p in procs]
        return [(p.returncode, *output) for p, output in zip(procs, outputs)]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()


def _ok(results):
    for rc, out, err in results:
        assert rc == 0, err[-4000:]
    return results


def _train_records(run: str) -> dict[int, dict]:
    return {r["step"]: r for r in read_metrics(run) if r["kind"] == "train"}


def _step_dir(run: str, step: int) -> str:
    return os.path.join(ckpt.checkpoint_root(run), ckpt.step_dir_name(step))


@pytest.fixture(scope="module")
def chain(byte_data, tmp_path_factory):
    root = tmp_path_factory.mktemp("chain")
    runs = {name: str(root / name) for name in ("ref", "a", "b", "c", "d1", "d2")}
    train(_cfg(byte_data, runs["ref"], checkpoint_every_tokens=10**6))
    logs = {"a": _ok(_launch(2, 1, _cli_args(byte_data, runs["a"], max_steps=4, keep_last=3, parallel="fsdp")))}
    logs["b"] = _ok(_launch(1, 3, _cli_args(byte_data, runs["b"], resume=_step_dir(runs["a"], 2), parallel="ddp",
                                            checkpoint_async=False, keep_last=3)))
    logs["c"] = _ok(_launch(2, 2, _cli_args(byte_data, runs["c"], resume=_step_dir(runs["b"], 4), parallel="fsdp")))
    for name, source in (("d1", _step_dir(runs["a"], 4)), ("d2", _step_dir(runs["c"], 5))):
        train(_cfg(byte_data, runs[name], resume=source))
    return runs, logs


def test_resumes_on_1_3_and_4_processes_follow_the_uninterrupted_run(chain):
    runs, _ = chain
    ref = _train_records(runs["ref"])
    # segment: (world size, parallel, first step it trained, resumed from)
    expected = {"a": (2, "fsdp", 1, None), "b": (3, "ddp", 3, "a"), "c": (4, "fsdp", 5, "b"), "d1": (1, "none", 5, "a"),
                "d2": (1, "none", 6, "c")}
    for name, (world, parallel, first, source) in expected.items():
        start = read_metrics(runs[name])[0]
        assert (start["world_size"], start["parallel"], start["step"] + 1) == (world, parallel, first), name
        assert (start["resumed_from"] or "").startswith(runs[source] if source else ""), name
        records = _train_records(runs[name])
        assert sorted(records) == list(range(first, 5 if name == "a" else STEPS + 1)), name
        for step, rec in records.items():
            assert rec["data_crc"] == ref[step]["data_crc"], (name, step)  # the same sequences in the same order
            assert rec["loss"] == pytest.approx(ref[step]["loss"], abs=1e-4), (name, step)
    assert len({rec["data_crc"] for rec in ref.values()}) == STEPS  # the checksum does tell steps apart


def test_sharded_checkpoints_are_committed_whole_and_pruned_to_keep_last(chain):
    runs, _ = chain
    root = ckpt.checkpoint_root(runs["a"])
    assert sorted(os.listdir(root)) == ["latest", "step_00000002", "step_00000003", "step_00000004"]
    for step in (2, 3, 4):
        meta = ckpt.verify_checkpoint(_step_dir(runs["a"], step))
        assert meta["format"] == "sharded" and {"__0_0.distcp", "__1_0.distcp"} <= set(meta["files"])
    # the 4-rank run: every rank wrote a shard file, and the synchronous 3-rank run committed the same way
    assert {f"__{r}_0.distcp" for r in range(4)} <= set(ckpt.verify_checkpoint(_step_dir(runs["c"], 6))["files"])
    assert ckpt.checkpoint_format(ckpt.latest_checkpoint(runs["b"])) == "sharded"
    assert ckpt.checkpoint_format(ckpt.latest_checkpoint(runs["d1"])) == "full"  # one process: full by default


def test_multi_node_launch_logs_and_writes_metrics_from_rank_0_only(chain):
    runs, logs = chain
    for name, world in (("a", 2), ("c", 4)):
        (_, out0, err0), (_, out1, err1) = logs[name]
        assert re.search(r"step \d/\d tokens", out0) and "val_loss" in out0 and f'"world_size": {world}' in out0
        assert "step " not in out1 + err1 and "val_loss" not in out1 + err1 and '"out_dir"' not in out1
        steps = [r["step"] for r in read_metrics(runs[name]) if r["kind"] == "train"]
        assert steps == sorted(set(steps))  # one writer: no step recorded twice


def test_a_sharded_checkpoint_converts_to_one_safetensors_file_piece_by_piece(chain, monkeypatch, tmp_path):
    from safetensors.torch import load_file

    from foxformer.cli import main
    from foxformer.train.loading import load_model
    from foxformer.models import FoxForCausalLM

    runs, _ = chain
    path = ckpt.latest_checkpoint(runs["c"])
    full = sharded.read_model_state_dict(path)
    reads = []
    real_read = sharded._read_model_tensors
    monkeypatch.setattr(sharded, "CONVERT_BATCH_BYTES", 64 * 1024)
    monkeypatch.setattr(sharded, "_read_model_tensors",
                        lambda p, names, specs: reads.append(names) or real_read(p, names, specs))
    out = str(tmp_path / "hf")
    assert main(["export-hf", runs["c"], "--out", out]) == 0
    nbytes = {name: t.numel() * t.element_size() for name, t in full.items()}
    # several reads, none above the budget unless one tensor alone is
    assert len(reads) > 1 and all(sum(nbytes[n] for n in names) <= max(64 * 1024, *(nbytes[n] for n in names))
                                  for names in reads)
    assert [f for f in os.listdir(out) if f.endswith(".safetensors")] == ["model.safetensors"]
    stored = load_file(os.path.join(out, "model.safetensors"))
    assert stored.keys() == full.keys() and all(torch.equal(stored[k], full[k]) for k in full)
    model = FoxForCausalLM.from_pretrained(out)
    assert all(torch.equal(v, full[k]) for k, v in model.state_dict().items())
    # the same files as save_pretrained of the gathered model, and evaluation reads the run as it is
    from foxformer.train.export import export_hf

    gathered = export_hf(model.config, full, str(tmp_path / "gathered"))
    assert sorted(os.listdir(gathered)) == sorted(os.listdir(out))
    assert json.load(open(os.path.join(gathered, "config.json"))) == json.load(open(os.path.join(out, "config.json")))
    loaded = load_model(runs["c"], device="cpu")
    assert loaded.step == STEPS and all(torch.equal(v, full[k]) for k, v in loaded.model.state_dict().items())


def test_a_failing_rank_ends_the_multi_node_job_with_its_message(byte_data, tmp_path):
    run = str(tmp_path / "fault")
    args = _cli_args(byte_data, run, parallel="fsdp", dist_timeout_minutes=2)
    # a hang would run into the launch's timeout: well under it, both nodes must have stopped
    (rc0, out0, err0), (rc1, out1, err1) = _launch(2, 1, args, script=[FAILING_RANK, "1", "2"], timeout=240)
    assert rc0 != 0 and rc1 != 0
    message = "simulated fault on rank 1 after step 2"
    assert message in err1
    # rank 0 was waiting for rank 1 in a collective: it names rank 1's error, not only a broken connection
    assert f"error: rank 1 failed: RuntimeError: {message}" in err0, err0[-3000:]
    # the checkpoint saved just before the fault was committed (its async save finished first) and is whole
    assert os.path.basename(ckpt.latest_checkpoint(run)) == "step_00000002"
    ckpt.verify_checkpoint(ckpt.latest_checkpoint(run))


def test_hosts_launched_with_different_flags_stop_before_training(byte_data, tmp_path):
    """Each host's torchrun reads its own command line: another lr on one trained its replica apart without a
    word. Another path to the same data is no difference."""
    run = str(tmp_path / "mixed")
    copy = str(tmp_path / "same-data")
    shutil.copytree(byte_data, copy)
    # each host its own whole command line (a flag added to the other's --set lr would be refused as given twice)
    results = _launch(2, 1, [], timeout=240, node_args=[_cli_args(byte_data, run, parallel="ddp"),
                                                        _cli_args(copy, run, parallel="ddp", lr=1e-3)])
    for rc, _, err in results:
        assert rc != 0
        assert re.search(r"error: the ranks of this job were started with different settings: lr \(rank 0: 0\.00[13], "
                         r"rank 1: 0\.00[13]\); start every process with the same flags", err), err[-3000:]
    assert not os.path.exists(run)


def _said_once(err: str, start: str) -> None:
    """The job gives the error once (rank 0: each rank's copy only repeated it), on a line of its own (print's
    separate write of the newline let two ranks' lines run into one); torchrun's summary gives it again as each
    failed rank's entry, ``traceback : error: ...``."""
    said = [line for line in err.splitlines() if "error: " in line and not line.startswith("  traceback : ")]
    assert len(said) == 1 and said[0].startswith(start), err[-3000:]
    assert f"  traceback : {start}" in err and "<N/A>" not in err, err[-3000:]


@pytest.mark.parametrize("one_rank", [False, True], ids=["every-rank", "one-rank"])
def test_a_setting_error_under_torchrun_is_said_once_with_no_traceback_and_no_wait(byte_data, tmp_path, one_rank):
    """Every rank printed the error, and torchrun's summary gave each rank our traceback of it; a rank that failed
    alone before the process group (a file in the way on its host) left the other waiting in
    init_process_group until torchrun's SIGKILL, 30 s later. Now the job says it once, torchrun's summary names it
    as the root cause, and the other rank stops at once with it."""
    base = str(tmp_path / "host")
    if one_rank:
        os.makedirs(base + "1")
        open(base + "1/run", "w").close()
        args, script = _cli_args(byte_data, "run", max_steps=1), [RANK_FOLDER, base]
        what = "'run' is a file, not a folder"
        said, cause = f"error: rank 1 failed: SettingError: out_dir: {what}", f"error: --set out_dir=run: {what}"
    else:  # 3 sequences of 16 tokens a step: they do not split over 2 ranks
        args, script = _cli_args(byte_data, str(tmp_path / "run"), max_steps=1, batch_tokens=48), None
        what = "48 tokens = 3 sequences of 16 cannot be split evenly over 2 ranks"
        said = cause = f"error: --set batch_tokens=48: {what}"
    (rc, _, err), = _launch(1, 2, args, script=script, timeout=120)  # a wait would run into it
    assert rc != 0
    _said_once(err, said)
    assert f"  traceback : {cause}" in err, err[-3000:]  # rank 1's own entry
    # the first rank to fail (to the second; rank 0 where both did within one) is the root cause
    assert what in err.partition("Root Cause (first observed failure):")[2], err[-3000:]
    assert "SIGKILL" not in err, err[-3000:]  # torchrun's last resort for a rank that would not stop
    assert not re.search(r'File "[^"]*/foxformer/', err), err[-3000:]  # no frame of ours: torchrun's own alone


@pytest.mark.parametrize("refused", [False, True], ids=["config-on-one-host", "flag-refused-on-one-host"])
def test_a_host_that_fails_before_its_run_stops_the_other_at_once(byte_data, tmp_path, refused):
    """A --config on one host's disk only, or a flag that argparse refuses on one host's command line only (each
    host's torchrun reads its own): rank 1 failed before its run joined the job and left nothing, and rank 0, on
    another host (no torchrun there to end it), waited for it until dist_timeout_minutes. Now rank 0 stops at once
    with rank 1's message, which names the host whose command line to fix."""
    base = str(tmp_path / "host")
    os.makedirs(base + "0")
    with open(base + "0/cfg.yaml", "w") as f:
        f.write("lr: 0.003\n")
    args = _cli_args(byte_data, "run", max_steps=1, dist_timeout_minutes=2)
    if refused:
        own = "foxformer train: error: argument --lr: expected a number, got 'abc'"
        error = (f"the command line on host {socket.gethostname()} was refused: foxformer train: argument --lr: "
                 f"expected a number, got 'abc'")
        node_args = [[], ["--lr", "abc"]]
    else:
        own = "error: --config: file 'cfg.yaml' does not exist"
        error, node_args = "ValueError: --config: file 'cfg.yaml' does not exist", None
        args = ["--config", "cfg.yaml", *args]
    # a wait for the timeout (2 minutes) would run into the launch's
    (rc0, _, err0), (rc1, _, err1) = _launch(2, 1, args, script=[RANK_FOLDER, base], timeout=90, node_args=node_args)
    assert rc0 != 0 and rc1 != 0
    assert f"  traceback : {own}" in err1, err1[-3000:]
    _said_once(err0, f"error: rank 1 failed: {error}")
    assert not os.path.exists(base + "0/run")


def test_ranks_that_do_not_see_the_same_folders_stop_before_training(byte_data, tmp_path):
    """A relative path on each rank's own folder stands for a local disk on each host. A new run failed at its
    first checkpoint (an interval into the run) with advice to free disk space; a resume waited in a collective
    for a rank that found no checkpoint, until the timeout ended it with gloo's words; init_from trained a mix of
    the weights each rank read (FSDP2 keeps each rank's shard of its own)."""
    base = str(tmp_path / "host")
    args = _cli_args(byte_data, "run", max_steps=2, parallel="fsdp")
    for resumed in (False, True):
        if resumed:  # rank 0's folder holds a run with a checkpoint, rank 1's none
            train(_cfg(byte_data, base + "0/run", max_steps=1))
        (rc, _, err), = _launch(1, 2, args, script=[RANK_FOLDER, base], timeout=240)
        assert rc != 0
        assert "error: --set out_dir=run: the processes of this job do not see one folder 'run' (a local disk on each" in err
        assert ("they find different checkpoints to resume from in it (rank 0: run/checkpoints/step_00000001, "
                "rank 1: none)" if resumed else "rank 1 on host ") in err, err[-3000:]
        assert "give --out a folder on storage all hosts share" in err and "Timed out" not in err
        _said_once(err, "error: --set out_dir=run: ")  # named as the command line set it
        assert not os.path.exists(base + "1/run")
        # the probe leaves nothing, and no step was trained
        assert sorted(os.listdir(ckpt.checkpoint_root(base + "0/run"))) == (["latest", "step_00000001"] if resumed
                                                                             else [])
        assert [r["step"] for r in read_metrics(base + "0/run") if r["kind"] == "train"] == [1] * resumed
    # one shared out_dir, but --init-from run reads step 1 on rank 0 and step 2 on rank 1
    train(_cfg(byte_data, base + "1/run", max_steps=2))
    shared = str(tmp_path / "shared")
    args = _cli_args(byte_data, shared, max_steps=2, parallel="fsdp", init_from="run")
    (rc, _, err), = _launch(1, 2, args, script=[RANK_FOLDER, base], timeout=240)
    assert rc != 0
    assert ("error: --set init_from=run: the ranks of this job read different weights from 'run' (rank 0 read the checkpoint "
            "of step 1, rank 1 that of step 2)") in err, err[-3000:]
    _said_once(err, "error: --set init_from=run: ")
    assert not os.path.exists(shared)


def test_async_save_lets_training_go_on_and_saves_the_state_of_its_own_step(byte_data, tmp_path, monkeypatch):
    run = str(tmp_path / "async")
    gate, seen = threading.Event(), {}
    real_hash = ckpt.hash_files

    def slow_hash(folder, names):  # holds step 2's commit back until step 3 has trained
        if ckpt.step_dir_name(2) in folder:
            gate.wait(timeout=120)  # a synchronous save would stall training here
        return real_hash(folder, names)

    def hook(step, record):
        if step == 3:
            seen["latest"] = ckpt.latest_checkpoint(run)
            gate.set()

    monkeypatch.setattr(ckpt, "hash_files", slow_hash)
    train(_cfg(byte_data, run, max_steps=4, checkpoint_every_tokens=2 * 192, checkpoint_format="sharded"), hook=hook)
    assert seen["latest"] is None  # step 3 ran while step 2's checkpoint was still being written
    assert ckpt.checkpoint_format(ckpt.latest_checkpoint(run)) == "sharded"
    # what was written is the state of step 2 (copied before step 3 changed the weights): resuming it
    # retraces steps 3 and 4 exactly
    again = str(tmp_path / "again")
    train(_cfg(byte_data, again, max_steps=4, resume=_step_dir(run, 2), checkpoint_format="sharded"))
    assert [_train_records(again)[s]["loss"] for s in (3, 4)] == [_train_records(run)[s]["loss"] for s in (3, 4)]


def test_a_sharded_save_that_dies_before_its_commit_is_never_loaded(byte_data, tmp_path, monkeypatch):
    run = str(tmp_path / "dies")
    cfg = _cfg(byte_data, run, max_steps=4, checkpoint_every_tokens=2 * 192, checkpoint_format="sharded")
    real_hash = ckpt.hash_files

    def dying_hash(folder, names):  # step 4's shards are on disk, but nothing will vouch for them
        if ckpt.step_dir_name(4) in folder:
            raise OSError("disk died")
        return real_hash(folder, names)

    monkeypatch.setattr(ckpt, "hash_files", dying_hash)
    with pytest.raises(ckpt.CheckpointError, match="step 4 could not be written.*disk died"):
        train(cfg)
    monkeypatch.undo()
    root = ckpt.checkpoint_root(run)
    assert not [d for d in os.listdir(root) if d.startswith(".tmp-")]  # its shards are removed at once (the space)
    assert os.path.basename(ckpt.latest_checkpoint(run)) == "step_00000002"
    summary = train(cfg)
    assert summary["resumed_from"].endswith("step_00000002") and summary["step"] == 4
    assert not [d for d in os.listdir(root) if d.startswith(".tmp-")]
    # a shard changed after its commit, or a folder without meta.json, is refused
    latest = ckpt.latest_checkpoint(run)
    with open(os.path.join(latest, "__0_0.distcp"), "r+b") as f:
        f.seek(100)
        byte = f.read(1)
        f.seek(100)
        f.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(ckpt.CheckpointError, match="__0_0.distcp is corrupted"):
        train(_cfg(byte_data, run, max_steps=6, checkpoint_format="sharded"))
    os.remove(os.path.join(latest, "meta.json"))
    with pytest.raises(ckpt.CheckpointError, match="no meta.json"):
        train(_cfg(byte_data, run, max_steps=6, checkpoint_format="sharded"))


def test_a_sharded_export_that_fails_midway_leaves_no_temporary_folder_and_the_earlier_export(byte_data, tmp_path,
                                                                                              monkeypatch, capsys):
    """The sharded converter wrote its own temporary folder beside --out and left it there when a write failed."""
    from foxformer.cli import main

    run = str(tmp_path / "run")
    train(_cfg(byte_data, run, max_steps=2, checkpoint_format="sharded"))
    out, fresh = str(tmp_path / "hf"), str(tmp_path / "hf-new")
    assert main(["export-hf", run, "--out", out]) == 0
    before = {name: open(os.path.join(out, name), "rb").read() for name in os.listdir(out)}
    real_read, reads = sharded._read_model_tensors, []

    def read_then_fail(path, names, specs):  # the safetensors file is half written when the disk fills
        reads.append(names)
        if len(reads) == 2:
            raise OSError(28, "No space left on device")
        return real_read(path, names, specs)

    monkeypatch.setattr(sharded, "CONVERT_BATCH_BYTES", 64 * 1024)
    monkeypatch.setattr(sharded, "_read_model_tensors", read_then_fail)
    assert main(["export-hf", run, "--out", out]) == 2
    assert len(reads) == 2  # one batch of tensors written before the failure
    reads.clear()
    assert main(["export-hf", run, "--out", fresh]) == 2
    assert capsys.readouterr().err.count("error: no space left on device: free disk space or choose another "
                                         "location\n") == 2
    assert {name: open(os.path.join(out, name), "rb").read() for name in os.listdir(out)} == before
    assert sorted(os.listdir(tmp_path)) == ["hf", "run"]


@pytest.fixture(scope="module")
def sharded_run(byte_data, tmp_path_factory):
    run = str(tmp_path_factory.mktemp("sharded") / "run")
    train(_cfg(byte_data, run, max_steps=2, checkpoint_format="sharded"))
    return run


@BARS_BY_PLACE
def test_a_sharded_export_writes_under_a_bar_that_follows_no_progress_and_the_terminal(
        sharded_run, tmp_path, monkeypatch, terminal, flag, shown):
    """export-hf had no --no-progress, ran outside hf_progress (transformers' bars drew whatever was asked, into a
    log too), and a sharded checkpoint was written batch by batch, minutes at 760M, with nothing said."""
    from transformers.utils import logging

    from foxformer.cli import main

    err = Terminal() if terminal else io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    monkeypatch.setattr(sharded, "CONVERT_BATCH_BYTES", 64 * 1024)
    bars, made = [], sharded.progress_bar
    monkeypatch.setattr(sharded, "progress_bar", lambda **kw: (
        bars.append((made(**kw), kw["wanted"], logging.is_progress_bar_enabled())), bars[-1][0])[1])
    assert main(["export-hf", sharded_run, "--out", str(tmp_path / "hf"), *flag]) == 0
    (bar, wanted, hf_bars), = bars
    assert (wanted, hf_bars) == (not flag, shown)
    total = os.path.getsize(tmp_path / "hf" / "model.safetensors")
    assert 0.9 * total < bar.total <= total and bar.n == bar.total  # the tensors' bytes, short of the header
    assert ("\rexport:" in err.getvalue()) is shown and ("\r" in err.getvalue()) is shown
