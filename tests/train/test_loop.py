import os
import signal

import pytest
import torch

from foxformer.models import get_preset, training_flops_per_token
from foxformer.train import checkpoint as ckpt
from foxformer.train.export import export_hf
from foxformer.train.loop import train
from foxformer.train.metrics import read_metrics

from .helpers import Crash, crash_at, signal_once


def _losses(run_dir):
    return [r["loss"] for r in read_metrics(run_dir) if r["kind"] == "train"]


@pytest.mark.parametrize("preset", ["fox-pro-tiny", "transformer-pro-tiny", "linear-pro-tiny"])
def test_tiny_model_loss_falls(make_cfg, preset):
    summary = train(make_cfg(preset=preset, max_steps=20, lr=1e-2, checkpoint_every_tokens=10**9))
    losses = _losses(summary["out_dir"])
    assert len(losses) == 20
    assert sum(losses[-4:]) / 4 < sum(losses[:4]) / 4 - 1.0
    assert summary["val_loss"] < losses[0]
    # MFU's FLOPs are bench model's: for linear attention the chunked op's, not the softmax term
    start = read_metrics(summary["out_dir"])[0]
    assert start["flops_per_token"] == training_flops_per_token(get_preset(preset, vocab_size=start["vocab_size"]), 32)
    # each evaluation logs the forget gates' mean log f per layer and head (none for the Transformer)
    cfg = get_preset(preset)
    for rec in (r for r in read_metrics(summary["out_dir"]) if r["kind"] == "eval"):
        if cfg.has_fgate:
            assert torch.tensor(rec["gate_log_f"]).shape == (cfg.num_layers, cfg.num_heads)
            assert all(v < 0 for row in rec["gate_log_f"] for v in row)
        else:
            assert "gate_log_f" not in rec


def test_killed_and_resumed_run_matches_uninterrupted_bit_for_bit(make_cfg, tmp_path):
    ref = train(make_cfg(out_dir=str(tmp_path / "ref"), max_steps=6))
    run = str(tmp_path / "crashy")
    with pytest.raises(Crash):
        train(make_cfg(out_dir=run, max_steps=6), hook=crash_at(3))  # checkpoint at step 2; step 3 is lost
    assert os.path.basename(ckpt.latest_checkpoint(run)) == "step_00000002"
    resumed = train(make_cfg(out_dir=run, max_steps=6))
    assert resumed["resumed_from"].endswith("step_00000002")
    assert _losses(run) == _losses(ref["out_dir"])  # exact float equality, step by step
    assert resumed["val_loss"] == ref["val_loss"]


def test_sigterm_saves_after_the_step_in_progress_and_the_resume_goes_on_bit_for_bit(make_cfg, tmp_path):
    """A preempted run lost every step since its last periodic checkpoint. Now the step in progress ends with a
    checkpoint of its own and the run returns."""
    ref = train(make_cfg(out_dir=str(tmp_path / "ref"), max_steps=6))
    run = str(tmp_path / "stopped")
    before = signal.getsignal(signal.SIGTERM)

    def signal_at_2(step, rec):
        if step == 2:  # between steps: the next one is the step in progress
            os.kill(os.getpid(), signal.SIGTERM)

    stopped = train(make_cfg(out_dir=run, max_steps=6), hook=signal_at_2)
    assert (stopped["stopped_by"], stopped["step"]) == ("SIGTERM", 3)
    assert os.path.basename(ckpt.latest_checkpoint(run)) == "step_00000003"  # the periodic ones: 2, 4, 6
    assert signal.getsignal(signal.SIGTERM) is before
    resumed = train(make_cfg(out_dir=run, max_steps=6))
    assert resumed["resumed_from"].endswith("step_00000003") and resumed["stopped_by"] is None
    assert _losses(run) == _losses(ref["out_dir"])  # exact float equality, step by step
    assert resumed["val_loss"] == ref["val_loss"]


def test_a_stop_signal_while_the_run_loads_trains_no_step(make_cfg, tmp_path):
    """A run preempted while it loads stops before its first step: a step and a save would only lengthen the
    seconds the scheduler gives it."""
    from foxformer.train.loop import build_model

    def signalled_while_building(cfg, vocab_size):
        os.kill(os.getpid(), signal.SIGTERM)
        return build_model(cfg, vocab_size)

    summary = train(make_cfg(max_steps=4), model_factory=signalled_while_building)
    assert (summary["stopped_by"], summary["step"], summary["val_loss"]) == ("SIGTERM", 0, None)
    assert summary["trained"] is False
    assert ckpt.latest_checkpoint(summary["out_dir"]) is None and _losses(summary["out_dir"]) == []


def test_crash_while_writing_a_checkpoint_keeps_the_previous_one(make_cfg, tmp_path, monkeypatch):
    run = str(tmp_path / "r")
    real_save = torch.save
    calls = {"n": 0}

    def flaky_save(obj, path, *a, **k):
        calls["n"] += 1
        if calls["n"] == 5:  # second checkpoint (3 torch.save calls each), while its optimizer file is written
            with open(path, "wb") as f:
                f.write(b"partial")
            raise Crash("disk died")
        return real_save(obj, path, *a, **k)

    monkeypatch.setattr(torch, "save", flaky_save)
    with pytest.raises(ckpt.CheckpointWriteError, match="could not be written.*disk died"):
        train(make_cfg(out_dir=run, max_steps=4))
    monkeypatch.setattr(torch, "save", real_save)
    assert os.path.basename(ckpt.latest_checkpoint(run)) == "step_00000002"
    summary = train(make_cfg(out_dir=run, max_steps=4))
    assert summary["resumed_from"].endswith("step_00000002") and summary["step"] == 4
    assert not [d for d in os.listdir(ckpt.checkpoint_root(run)) if d.startswith(".tmp-")]


def test_keep_last_and_resolved_config(make_cfg, tmp_path):
    run = str(tmp_path / "k")
    train(make_cfg(out_dir=run, keep_last=2))
    names = sorted(os.listdir(ckpt.checkpoint_root(run)))
    assert names == ["latest", "step_00000006", "step_00000008"]
    from foxformer.train.config import read_saved_config
    import yaml

    # the tokenizer left out comes from the dataset's manifest, and the saved config names it
    assert read_saved_config(os.path.join(run, "config.yaml")) == make_cfg(out_dir=run, keep_last=2, tokenizer="bytes")
    derived = yaml.safe_load(open(os.path.join(run, "config.yaml")))["derived"]
    assert derived["grad_accum"] == 1 and derived["seqs_per_step"] == 4 and derived["world_size"] == 1


def test_gradient_accumulation_matches_one_big_batch(make_cfg, tmp_path):
    a = train(make_cfg(out_dir=str(tmp_path / "a"), max_steps=2, micro_batch_size=4))
    b = train(make_cfg(out_dir=str(tmp_path / "b"), max_steps=2, micro_batch_size=2))
    assert _losses(b["out_dir"]) == pytest.approx(_losses(a["out_dir"]), abs=1e-4)


def test_a_batch_that_does_not_split_over_the_ranks_says_what_would(make_cfg):
    """Errors that said only what was wrong: each names values that work (batch_tokens may not change on resume,
    so the process count is the other way out)."""
    from foxformer.train.loop import make_plan

    with pytest.raises(ValueError, match=r"3 sequences of 32 cannot be split evenly over 2 ranks: give 64 or 128 "
                                         r"\(multiples of 2 ranks x 32\), or launch a number of processes that "
                                         r"divides 3 \(1, 3\)"):
        make_plan(make_cfg(batch_tokens=96), 2, "cpu")
    with pytest.raises(ValueError, match=r"micro_batch_size: 2 does not divide the 3 sequences per rank and step "
                                         r"\(6 sequences of 32 over 2 ranks\): give one that does \(1, 3\), or 0"):
        make_plan(make_cfg(batch_tokens=192, micro_batch_size=2), 2, "cpu")
    assert make_plan(make_cfg(batch_tokens=192, micro_batch_size=3), 2, "cpu").accum == 1


def test_hf_export_round_trips(make_cfg, tmp_path):
    from foxformer.models import FoxForCausalLM

    run = str(tmp_path / "hf")
    summary = train(make_cfg(out_dir=run, max_steps=2, export_hf=True))
    model = FoxForCausalLM.from_pretrained(summary["hf_dir"])
    sd, _, _, _ = ckpt.load_checkpoint(ckpt.latest_checkpoint(run))
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, sd[name]), name
    # standalone: the run's tokenizer and the model code travel with the weights
    assert model.config.tokenizer == "bytes"
    for name in ("tokenizer.json", "modeling_foxformer.py", "configuration_foxformer.py"):
        assert os.path.exists(os.path.join(summary["hf_dir"], name)), name
    # its model card says what it is and how this run trained it
    card = open(os.path.join(summary["hf_dir"], "README.md")).read()
    assert card.startswith("---\nlibrary_name: transformers") and "# FoX (Pro)" in card
    val = [r["val_loss"] for r in read_metrics(run) if r["kind"] == "eval"][-1]
    for fact in ("## Training", "`builtin:pydoc`", "2 steps, 256 tokens at context 32", f"{val:.4f} nats per token",
                 "preset `fox-pro-tiny`"):
        assert fact in card, fact


def test_time_limit_stops_cleanly_with_a_checkpoint(make_cfg, tmp_path):
    from foxformer.cli import main

    run = str(tmp_path / "t")
    summary = train(make_cfg(out_dir=run, max_steps=1000, max_minutes=1e-9))
    assert summary["step"] == 1
    assert os.path.basename(ckpt.latest_checkpoint(run)) == "step_00000001"
    # its export's card said "trained 1 steps", as of a whole run whose learning rate had decayed
    assert main(["export-hf", run, "--no-progress"]) == 0
    card = open(os.path.join(run, "hf", "README.md")).read()
    assert ("| trained | 1 of 1,000 planned steps (stopped before the end of its schedule), 128 tokens at context 32 "
            "(128 tokens a step) |") in card, card


def test_an_earlier_checkpoints_card_describes_that_checkpoint(make_cfg, tmp_path):
    """export-hf --checkpoint of an older step wrote the card of the run's last step and its last eval: the card
    now gives the checkpoint's step and tokens, and the eval at or before it (or says there was none)."""
    from foxformer.cli import main

    run = str(tmp_path / "e")
    train(make_cfg(out_dir=run, max_steps=4, keep_last=2, checkpoint_every_tokens=256, eval_every_tokens=256))
    evals = {r["step"]: r["val_loss"] for r in read_metrics(run) if r["kind"] == "eval"}
    assert {2, 4} <= set(evals), evals
    assert main(["export-hf", run, "--checkpoint", "step_00000002", "--no-progress"]) == 0
    card = open(os.path.join(run, "hf", "README.md")).read()
    assert ("| trained | 2 of 4 planned steps (an earlier checkpoint of a run logged to step 4), 256 tokens at "
            "context 32 (128 tokens a step) |") in card, card
    assert f"| validation loss | {evals[2]:.4f} nats per token at step 2 " in card, card
    assert f"{evals[4]:.4f}" not in card
    # the newest checkpoint's card is the run's end, as before
    assert main(["export-hf", run, "--out", str(tmp_path / "last"), "--no-progress"]) == 0
    card = open(os.path.join(tmp_path, "last", "README.md")).read()
    assert "| trained | 4 steps, 512 tokens at context 32" in card, card
    assert f"| validation loss | {evals[4]:.4f} nats per token at step 4 " in card, card


def test_activation_checkpointing_and_rolling(make_cfg, tmp_path):
    plain = train(make_cfg(out_dir=str(tmp_path / "p"), max_steps=3))
    ac = train(make_cfg(out_dir=str(tmp_path / "ac"), max_steps=3, activation_checkpointing=True))
    assert _losses(ac["out_dir"]) == pytest.approx(_losses(plain["out_dir"]), abs=1e-6)
    rolled = train(make_cfg(out_dir=str(tmp_path / "r"), max_steps=3, roll=True))
    assert _losses(rolled["out_dir"])[0] != _losses(plain["out_dir"])[0]


def test_fused_loss_follows_the_plain_trajectory(make_cfg, tmp_path):
    plain = train(make_cfg(out_dir=str(tmp_path / "p"), max_steps=4))
    fused = train(make_cfg(out_dir=str(tmp_path / "f"), max_steps=4, fused_loss=True))
    assert _losses(fused["out_dir"]) == pytest.approx(_losses(plain["out_dir"]), abs=1e-4)


def test_sigkilled_process_resumes_to_the_same_trajectory(make_cfg, data_dir, tmp_path):
    """A real SIGKILL (no cleanup at all) part-way through, then `foxformer train` again."""
    import signal
    import subprocess
    import sys

    # One thread in both processes, and float-rounding tolerance: CI once saw every loss after the resume
    # differ by ~3e-7 relative (same data, same state; another split of some reduction), while a resume that
    # loses the data position or the optimizer's moments moves the losses by far more than 1e-5.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        ref = train(make_cfg(out_dir=str(tmp_path / "ref"), max_steps=12))
    finally:
        torch.set_num_threads(threads)
    run = str(tmp_path / "killed")
    args = [sys.executable, "-m", "foxformer.cli", "train", "--data", data_dir, "--out", run, "--preset",
            "fox-pro-tiny", "--context", "32", "--batch-tokens", "128", "--max-steps", "12", "--lr", "3e-3",
            "--eval-tokens", "128", "--checkpoint-every-tokens", "256", "--eval-every-tokens", "512",
            "--no-progress", "--set", "tensorboard=false", "--set", "export_hf=false"]
    src = os.path.join(os.path.dirname(__file__), "..", "..", "src")
    env = {**os.environ, "PYTHONPATH": src, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    signal_once(proc, os.path.join(run, "checkpoints", "step_00000002"), signal.SIGKILL, timeout=120)
    assert proc.wait(timeout=60) == -signal.SIGKILL, proc.stderr.read()[-2000:]
    proc.stderr.close()
    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    assert '"resumed_from": "' in done.stdout
    assert _losses(run) == pytest.approx(_losses(ref["out_dir"]), rel=1e-5)


@pytest.mark.parametrize("world,val_seqs", [(2, 1), (4, 3)], ids=["two-ranks-one-sequence", "four-ranks-three-sequences"])
def test_validation_split_with_fewer_sequences_than_ranks(tmp_path, world, val_seqs):
    # evaluate raised at the first evaluation (after training up to it), and again on every resume
    import json

    import numpy as np

    from foxformer.data.dataset import TokenDataset
    from foxformer.data.preparation import PrepareConfig, prepare
    from foxformer.models import FoxForCausalLM, get_preset
    from foxformer.train.distributed import DistInfo
    from foxformer.train.validation import evaluate
    from foxformer.train.metrics import forget_gate_means

    src = tmp_path / "docs.jsonl"
    src.write_text("".join(json.dumps({"text": f"document {i} " + "words " * 6}) + "\n" for i in range(8)))
    data = tmp_path / "data"
    m = prepare(PrepareConfig(sources=[str(src)], out_dir=str(data), tokenizer="bytes", val_fraction=0.5),
                progress=False)
    seq_len = m["split"]["val"]["tokens"] // val_seqs
    val = TokenDataset(str(data), "val", seq_len)
    assert len(val) == val_seqs
    torch.manual_seed(0)
    model = FoxForCausalLM(get_preset("fox-pro-tiny", vocab_size=320, attention_backend="torch"))
    cpu = torch.device("cpu")
    with forget_gate_means(model) as one_gates:
        one_loss, _ = evaluate(model, val, 8, 2, DistInfo(0, 1, 0, cpu, "none"), False, gates=one_gates)
    per_rank, gates = [], []
    for r in range(world):
        with forget_gate_means(model) as g:
            per_rank.append(evaluate(model, val, 8, 2, DistInfo(r, world, r, cpu, "ddp"), False, gates=g)[0])
        gates.append(g)
    # no process group here: each rank's share is what it adds to the all-reduced sums, and the ranks' padding
    # copies add nothing, to the loss or to the gates' means
    assert all(np.isfinite(per_rank)) and sum(per_rank) == pytest.approx(one_loss)
    assert sum(g.tokens for g in gates) == one_gates.tokens == val_seqs * seq_len
    for i, total in enumerate(one_gates.sums):
        assert sum(g.sums[i] for g in gates).tolist() == pytest.approx(total.tolist())


def test_validation_goes_through_the_head_in_chunks_with_the_logits_paths_losses(tmp_path):
    """The periodic validation never builds the [B, T, V] logits (they ran a run out of memory beside three others
    on an H100 when the run trained without --fused-loss), and its per-position losses are the logits path's."""
    import json

    import numpy as np

    from foxformer.data.dataset import TokenDataset
    from foxformer.data.preparation import PrepareConfig, prepare
    from foxformer.models import FoxForCausalLM, get_preset
    from foxformer.train.distributed import DistInfo
    from foxformer.train.validation import evaluate

    src = tmp_path / "docs.jsonl"
    src.write_text("".join(json.dumps({"text": f"document {i} " + "some words " * 20}) + "\n" for i in range(8)))
    prepare(PrepareConfig(sources=[str(src)], out_dir=str(tmp_path / "data"), tokenizer="bytes", val_fraction=0.5),
            progress=False)
    val = TokenDataset(str(tmp_path / "data"), "val", 64)
    torch.manual_seed(0)
    model = FoxForCausalLM(get_preset("fox-pro-tiny", vocab_size=320, attention_backend="torch"))
    x = torch.from_numpy(np.stack([val.sequence(j) for j in range(len(val))]))
    with torch.no_grad():
        want = model(x, labels=x, loss_reduction="none").loss.double().mean(0).numpy()

    def no_logits(module, args):
        raise AssertionError("the evaluation built the [B, T, V] logits")

    hook = model.lm_head.register_forward_pre_hook(no_logits)
    loss, per_pos = evaluate(model, val, len(val), 2, DistInfo(0, 1, 0, torch.device("cpu"), "none"), False)
    hook.remove()
    assert per_pos == pytest.approx(want, rel=1e-5, abs=1e-6) and loss == pytest.approx(want.mean(), rel=1e-6)


@pytest.mark.parametrize("precision,peak_dtype", [("fp32", "tf32"), ("bf16", "bf16")], ids=["fp32-tf32", "bf16"])
def test_mfu_peak_follows_the_training_precision(make_cfg, tmp_path, monkeypatch, precision, peak_dtype):
    """fp32 training runs its matmuls on TF32 tensor cores on a GPU: its MFU is against the TF32 peak, not
    the bf16 one (half of it on Hopper), which made fp32 runs look half as efficient as they are."""
    import foxformer.train.loop as loop

    asked = []
    monkeypatch.setattr(loop, "device_peak_flops", lambda device, dtype="bf16": asked.append(dtype) or 1e12)
    train(make_cfg(out_dir=str(tmp_path / precision), max_steps=1, precision=precision))
    assert asked == [peak_dtype]


def test_a_failed_export_leaves_no_half_written_folder(tmp_path, monkeypatch):
    from foxformer.models import FoxForCausalLM

    def disk_full(self, folder, *args, **kwargs):
        os.makedirs(folder)
        open(os.path.join(folder, "model.safetensors"), "wb").close()
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(FoxForCausalLM, "save_pretrained", disk_full)
    cfg = get_preset("fox-llama-tiny", vocab_size=64)
    with pytest.raises(OSError, match="No space"):
        export_hf(cfg, FoxForCausalLM(cfg).state_dict(), str(tmp_path / "hf"))
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("umask", [0o022, 0o077], ids=["shared", "private"])
def test_an_exports_weights_are_as_readable_as_its_config(tmp_path, umask):
    """safetensors (0.8.1 on) writes model.safetensors 0600 whatever the umask, and another user (a container's)
    could not load an export whose config.json they could read; every file of it now has the umask's bits, and a
    private umask keeps it private."""
    import stat

    from foxformer.models import FoxForCausalLM

    cfg = get_preset("fox-llama-tiny", vocab_size=64)
    before = os.umask(umask)
    try:
        export_hf(cfg, FoxForCausalLM(cfg).state_dict(), str(tmp_path / "hf"))
    finally:
        os.umask(before)
    modes = {name: stat.S_IMODE(os.stat(tmp_path / "hf" / name).st_mode) for name in os.listdir(tmp_path / "hf")}
    assert modes["model.safetensors"] == modes["config.json"] == 0o666 & ~umask, modes


def test_a_run_on_any_tokenizer_exports_its_document_token_and_tokenizer(make_cfg, tmp_path):
    """A tokenizer whose ids foxformer knows only by loading it (hf:<dir> here, tiktoken:<encoding> alike): the
    run keeps the data's end-of-document id (config.yaml's derived facts), so its export, `foxformer export` later
    and a model loaded from the run all stop generating there, and the export carries the tokenizer's files."""
    import json

    from transformers import AutoTokenizer

    from foxformer.cli import main
    from foxformer.data.hf_tokenizer import tiktoken_tokenizer
    from foxformer.data.preparation import PrepareConfig, prepare
    from foxformer.data.tokenizer import tiktoken_encoding
    from foxformer.train.loading import load_model

    tok_dir, docs = tmp_path / "tok", tmp_path / "docs"
    tiktoken_tokenizer(tiktoken_encoding("gpt2")).save_pretrained(tok_dir)
    docs.mkdir()
    for i in range(6):
        (docs / f"{i}.txt").write_text(f"Document {i}: the fox forgets what it no longer needs. " * 20)
    data = str(tmp_path / "data")
    prepare(PrepareConfig(sources=[str(docs)], out_dir=data, tokenizer=f"hf:{tok_dir}", val_fraction=0.34),
            progress=False)
    run = str(tmp_path / "run")
    summary = train(make_cfg(data_dir=data, out_dir=run, max_steps=1, export_hf=True))
    assert main(["export-hf", run, "--out", str(tmp_path / "again")]) == 0
    for folder in (summary["hf_dir"], str(tmp_path / "again")):
        with open(os.path.join(folder, "config.json")) as f:
            saved = json.load(f)
        assert (saved["eos_token_id"], saved["bos_token_id"], saved["tokenizer"]) == (50256, 50256, f"hf:{tok_dir}")
        assert saved["pad_token_id"] == 50256  # the end of document pads as well: generate needs no fallback
        assert AutoTokenizer.from_pretrained(folder, trust_remote_code=True).eos_token_id == 50256
        assert "| validation loss |" in open(os.path.join(folder, "README.md")).read()  # export-hf's card too
    assert load_model(run, device="cpu", progress=False).model.config.eos_token_id == 50256


def test_exports_record_the_training_length_which_hf_generate_warns_past(make_cfg, tmp_path):
    """An export's config.json recorded no training length (max_position_embeddings is 16384 whatever the
    context), so Hugging Face generate could not tell when a prompt and its continuation ran past it: train_len is
    the run's context in the run's model_config.json and in both exports, and generate says once when it may go
    past."""
    import json
    import warnings

    from transformers import AutoModelForCausalLM

    from foxformer.cli import main

    run = str(tmp_path / "run")
    summary = train(make_cfg(out_dir=run, max_steps=1, export_hf=True))
    assert main(["export-hf", run, "--out", str(tmp_path / "again")]) == 0
    for folder in (run, summary["hf_dir"], str(tmp_path / "again")):
        with open(os.path.join(folder, "model_config.json" if folder == run else "config.json")) as f:
            assert json.load(f)["train_len"] == 32, folder
    model = AutoModelForCausalLM.from_pretrained(str(tmp_path / "again")).eval()
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        model.generate(torch.zeros(1, 30, dtype=torch.long), max_new_tokens=4, do_sample=False)
    assert [str(w.message).split(";")[0] for w in said if "train_len" in str(w.message)] == [
        "generate: the prompt and new tokens may reach 34 tokens, 2 past the 32 this model was trained on "
        "(train_len)"]


def test_init_from_starts_from_another_models_weights_and_architecture(make_cfg, tmp_path):
    """`init_from` (a run, one of its checkpoints, or a Hugging Face folder): the new run's model is that model,
    whatever its preset says, with its weights (at lr 0 they come out unchanged); model_config.json records it,
    so resuming, exporting and loading the new run rebuild that architecture, not the preset's."""
    from foxformer.cli import main
    from foxformer.train.loading import load_model

    src = str(tmp_path / "src")
    train(make_cfg(out_dir=src, preset="fox-llama-tiny", model={"num_layers": 1}, max_steps=2, export_hf=True))
    want = ckpt.load_checkpoint(ckpt.latest_checkpoint(src))[0]
    for i, origin in enumerate([src, ckpt.latest_checkpoint(src), os.path.join(src, "hf")]):
        run = str(tmp_path / f"ft{i}")
        train(make_cfg(out_dir=run, init_from=origin, lr=0.0, total_tokens=256, max_steps=1))  # not fox-pro-tiny
        got = ckpt.load_checkpoint(ckpt.latest_checkpoint(run))[0]
        assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want), origin
    loaded = load_model(run, device="cpu", progress=False).model  # from model_config.json, not fox-pro-tiny
    assert (loaded.config.num_layers, loaded.config.qk_norm) == (1, False)
    train(make_cfg(out_dir=run, init_from=origin, lr=0.0, total_tokens=256, max_steps=2))  # resumes its own
    assert [r["resumed_from"] is not None for r in read_metrics(run) if r["kind"] == "start"] == [False, True]
    assert main(["export-hf", run, "--out", str(tmp_path / "ft_hf")]) == 0
    assert load_model(str(tmp_path / "ft_hf"), device="cpu", progress=False).model.config.num_layers == 1


def test_init_from_refuses_what_does_not_fit(make_cfg, tmp_path):
    from foxformer.data.preparation import PrepareConfig, prepare

    src = str(tmp_path / "src")
    train(make_cfg(out_dir=src, max_steps=1))
    with pytest.raises(ValueError, match="do not fit the model with the overrides .'num_layers': 1"):
        train(make_cfg(out_dir=str(tmp_path / "a"), init_from=src, model={"num_layers": 1}, max_steps=1))
    with pytest.raises(ValueError, match=r"init_from: model.mlp_ratio=8.0 cannot apply: the MLP .* is \d+ wide"):
        train(make_cfg(out_dir=str(tmp_path / "r"), init_from=src, model={"mlp_ratio": 8.0}, max_steps=1))
    with pytest.raises(ValueError, match="vocab_size: 64 given, but the model init_from names has 320"):
        train(make_cfg(out_dir=str(tmp_path / "b"), init_from=src, vocab_size=64, max_steps=1))
    docs = tmp_path / "docs"
    docs.mkdir()
    for i in range(4):
        (docs / f"{i}.txt").write_text(f"document {i} " * 50)
    data = str(tmp_path / "gpt2")
    prepare(PrepareConfig(sources=[str(docs)], out_dir=data, tokenizer="gpt2", val_fraction=0.5), progress=False)
    with pytest.raises(ValueError, match="reads 'bytes' tokens but .* was tokenized with 'gpt2'"):
        train(make_cfg(out_dir=str(tmp_path / "c"), init_from=src, data_dir=data, max_steps=1))
    with pytest.raises(ValueError, match="init_from: model: .* is not a directory"):
        train(make_cfg(out_dir=str(tmp_path / "d"), init_from=str(tmp_path / "nowhere"), max_steps=1))
    assert sorted(os.listdir(tmp_path)) == ["docs", "gpt2", "src"]  # nothing written for the refused runs
