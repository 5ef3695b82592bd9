"""What a new user met in `foxformer train`: flags described only by their config key, GPU-sized defaults that
silently took minutes a step on a small dataset, no word on what a new run trains (a mistyped --out started one
with every default), a time limit that stopped without a word, and a refused resume with no way forward."""
import json
import os
import re
import shlex
import shutil
import subprocess
import sys

import pytest
import yaml

from foxformer.cli import main
from foxformer.data.preparation import PrepareConfig, prepare
from foxformer.train import checkpoint as ckpt
from foxformer.train.config import TrainConfig, save_config
from foxformer.train.loop import train
from foxformer.train.metrics import read_metrics

from .test_user_path import SRC, _flags, _one_error_line

HELP = """
import sys
from foxformer.cli import build_parser
parser = build_parser()
try:
    parser.parse_args(["train", "--help"])
except SystemExit:
    pass
print("HEAVY", sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "transformers")))
"""


def _summary(out: str) -> dict:
    return json.loads(out[out.index("{\n"):])


def test_train_help_gives_each_flags_default_and_allowed_values_without_torch():
    done = subprocess.run([sys.executable, "-c", HELP], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": SRC}, timeout=120)
    assert done.returncode == 0, done.stderr
    text = " ".join(done.stdout.split())  # argparse wraps lines
    assert text.endswith("HEAVY []"), text[-300:]
    assert f"--lr LR config key lr (default: {TrainConfig.lr:g})" in text
    assert (f"--context CONTEXT config key context (default: {TrainConfig.context}); k/M: powers of 1000, Ki/Mi: "
            f"of 1024") in text
    assert "config key batch_tokens (default: 512Ki = 524288); k/M: powers of 1000, Ki/Mi: of 1024" in text
    assert "config key schedule, one of cosine, linear, constant (default: cosine)" in text
    assert "config key device, one of auto, cpu, cuda, cuda:N (default: auto)" in text
    assert "config key max_steps (default: unset)" in text
    assert "set compile: true (default: false)" in text


@pytest.mark.parametrize("flag, said", [
    ("--resume RESUME", "config key resume (default: auto); auto: continue from out_dir's latest checkpoint (a new "
                        "run where it has none); never: a new run, refused where out_dir has checkpoints; a "
                        "checkpoint folder: continue from that one"),
    ("--micro-batch-size MICRO_BATCH_SIZE", "config key micro_batch_size (default: 0); sequences each rank runs in "
                                            "one forward and backward pass"),
    ("--eval-tokens EVAL_TOKENS", "config key eval_tokens (default: unset); validation tokens at each evaluation"),
    ("--tokenizer TOKENIZER", "config key tokenizer (default: unset); the run trains with the one its dataset was "
                              "prepared with (manifest.json): given, it is only checked against that one"),
    ("--init-from INIT_FROM", "config key init_from (default: unset); start from this model's weights and "
                              "architecture instead of a preset's"),
    ("--max-minutes MAX_MINUTES", "config key max_minutes (default: unset); stop after this many minutes of "
                                  "training in this invocation, with a checkpoint"),
    ("--no-progress", "set progress: false (default: true): a progress bar on a terminal; the step lines on stdout "
                      "are printed either way"),
    ("--checkpoint-every-tokens CHECKPOINT_EVERY_TOKENS", "config key checkpoint_every_tokens (default: unset); "
                                                          "unset: a tenth of the horizon, at least one step"),
    ("--keep-last KEEP_LAST", "config key keep_last (default: 2); the newest checkpoints kept"),
    ("--eval-every-tokens EVAL_EVERY_TOKENS", "config key eval_every_tokens (default: unset); unset: a tenth of "
                                              "the horizon"),
    ("--roll", "set roll: true (default: false): rotate each training sequence by a random offset"),
    ("--compile", "set compile: true (default: false): torch.compile the model"),
    ("--activation-checkpointing", "set activation_checkpointing: true (default: false): recompute each block's "
                                   "activations in the backward"),
    ("--fused-loss", "set fused_loss: true (default: false): the loss through the LM head in chunks"),
    ("--precision PRECISION", "config key precision, one of auto, bf16, fp32 (default: auto); auto: bf16 on CUDA, "
                              "fp32 on a CPU"),
    ("--parallel PARALLEL", "config key parallel, one of auto, none, ddp, fsdp (default: auto); auto: FSDP2 under "
                            "torchrun (WORLD_SIZE > 1), none for one process"),
    ("--device DEVICE", "config key device, one of auto, cpu, cuda, cuda:N (default: auto); auto: a GPU where there "
                        "is one, else the CPU"),
], ids=["resume", "micro-batch-size", "eval-tokens", "tokenizer", "init-from", "max-minutes", "no-progress",
        "checkpoint-every-tokens", "keep-last", "eval-every-tokens", "roll", "compile", "activation-checkpointing",
        "fused-loss", "precision", "parallel", "device"])
def test_train_help_says_what_a_flag_does_beyond_its_key(capsys, flag, said):
    """--resume, --micro-batch-size, --eval-tokens, --tokenizer, --init-from, --max-minutes, --no-progress,
    --checkpoint-every-tokens, --keep-last and --eval-every-tokens said only "config key X" and a default
    (--no-progress nothing; "unset" for a cadence, which is what Ctrl-C may lose); --roll, --compile,
    --activation-checkpointing and --fused-loss only "set KEY: true"; --precision, --parallel and --device left their
    "auto" unexplained."""
    from foxformer.cli import build_parser

    with pytest.raises(SystemExit):
        build_parser().parse_args(["train", "--help"])
    assert f"{flag} {said}" in " ".join(capsys.readouterr().out.split())


@pytest.mark.parametrize("minutes, said", [(1, "at most 1 minute"), (0.5, "at most 0.5 minutes"),
                                            (2, "at most 2 minutes")], ids=["one", "half", "two"])
def test_the_start_line_gives_the_time_limit_in_a_unit_that_agrees_with_it(capsys, minutes, said):
    """`foxformer demo --minutes 0.5` gave each model a limit of 1 minute, which its start line said as "at most 1
    minutes"."""
    from foxformer.train.loop import _announce

    _announce(TrainConfig(data_dir="d", out_dir="o", max_steps=3, max_minutes=minutes), 10, 10**9)
    assert capsys.readouterr().err.rstrip().endswith(f" tokens), {said}")


def test_a_new_run_says_what_it_trains_and_warns_when_one_step_outgrows_the_data(tmp_path, capsys):
    data = str(tmp_path / "small")
    (tmp_path / "docs.jsonl").write_text("".join(json.dumps({"text": f"doc {i}: " + "abc def " * 20}) + "\n"
                                                 for i in range(40)))
    prepare(PrepareConfig(sources=[str(tmp_path / "docs.jsonl")], tokenizer="bytes", out_dir=data,
                          val_fraction=0.1), progress=False)
    out = str(tmp_path / "run")
    argv = _flags(data, out, steps=1)
    argv[argv.index("--batch-tokens") + 1] = "8Ki"  # the split holds about 6K tokens
    assert main(argv) == 0
    err = capsys.readouterr().err
    start = [line for line in err.splitlines() if line.startswith("train: new run in")]
    assert len(start) == 1 and (f"train: new run in {out}: fox-pro-tiny (" in start[0]
                                and f"parameters) on {data}, context 32, 8,192 tokens per step, 1 step "
                                    f"(8,192 tokens)" in start[0]), err
    warning = [line for line in err.splitlines() if line.startswith("train: warning:")]
    assert len(warning) == 1 and "one step holds 8,192 tokens, more than the" in warning[0], err
    assert "lower --batch-tokens (and --context, now 32" in warning[0]
    assert main(_flags(data, str(tmp_path / "fits"), steps=1)) == 0  # 128 tokens a step: no warning
    assert "warning" not in capsys.readouterr().err


@pytest.mark.parametrize("context, noted", [(256, True), (128, False)], ids=["longer-than-every-doc", "fits-one"])
def test_a_context_longer_than_every_document_is_noted_with_the_longest(tmp_path, capsys, context, noted):
    """`train --context 16Ki` on documents of a few thousand tokens trained without a word, each sequence several
    documents strung together; `eval loss --within-docs` refuses such a length. A new run now says so."""
    data = str(tmp_path / "short")
    (tmp_path / "docs.jsonl").write_text("".join(json.dumps({"text": f"doc {i:02d}: " + "abc def " * 20}) + "\n"
                                                 for i in range(40)))  # 168 bytes each
    prepare(PrepareConfig(sources=[str(tmp_path / "docs.jsonl")], tokenizer="bytes", out_dir=data,
                          val_fraction=0.1), progress=False)
    argv = _flags(data, str(tmp_path / "run"), steps=1)
    argv[argv.index("--context") + 1] = str(context)
    argv[argv.index("--batch-tokens") + 1] = str(context)
    assert main(argv) == 0
    notes = [line for line in capsys.readouterr().err.splitlines() if line.startswith("train: note: no document")]
    assert notes == ([f"train: note: no document of the training split is as long as the context ({context} tokens; "
                      f"the longest has 168): each sequence strings several documents together, so the model never "
                      f"sees one document's text further back than that; for long-context training, give longer "
                      f"documents (or a --context of at most 168)"] if noted else []), notes


def test_out_naming_no_run_says_so_and_the_closest_run(make_cfg, data_dir, tmp_path, capsys):
    """`train --out runs/quikc` failed with 'total_tokens / max_steps: set at least one'."""

    train(make_cfg(out_dir=str(tmp_path / "quick"), max_steps=1))
    typo = str(tmp_path / "quikc")
    assert main(["train", "--out", typo]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert f"out_dir: there is no run in '{typo}' to continue (did you mean '{tmp_path / 'quick'}'?)" in line
    assert f"start one with: foxformer train --data DIR --out {typo} --max-steps N" in line
    assert not os.path.exists(typo)


def test_a_time_limit_says_where_it_stopped_and_how_to_continue(data_dir, tmp_path, capsys):
    out = str(tmp_path / "run")
    argv = _flags(data_dir, out, steps=1000) + ["--max-minutes", "1e-9"]
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert _summary(captured.out)["time_limit"] is True
    last = ckpt.latest_checkpoint(out)
    assert captured.err.splitlines()[-1] == (
        f"training stopped at the time limit (max_minutes 1e-09) after step 1 ({out}); the last checkpoint is "
        f"{last}; resume with: foxformer train --out {out}")
    assert main(["train", "--out", out]) == 0  # the command it gave: one more step within the same limit
    captured = capsys.readouterr()
    assert _summary(captured.out)["step"] == 2 and "after step 2" in captured.err.splitlines()[-1]
    assert "new run" not in captured.err


def test_a_refused_resume_gives_a_command_that_starts_from_its_weights(data_dir, tmp_path, capsys):
    run = str(tmp_path / "quick")
    assert main(_flags(data_dir, run, steps=4)) == 0
    capsys.readouterr()
    assert main(["train", "--out", run, "--lr", "1e-2"]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert "differs" in line and "'lr'" in line and "nothing was overwritten" in line
    command = line[line.index("foxformer train --config"):line.index(" plus the changed flags")]
    assert command.endswith(f"--init-from {run} --out NEW_DIR")
    new = str(tmp_path / "new")
    assert main(shlex.split(command.replace("NEW_DIR", new))[1:] + ["--lr", "1e-2"]) == 0
    saved = yaml.safe_load(open(os.path.join(new, "config.yaml")))
    assert saved["lr"] == 1e-2 and saved["init_from"] == run and saved["data_dir"] == data_dir
    first = [r["loss"] for r in read_metrics(run) if r["kind"] == "train"]
    again = [r["loss"] for r in read_metrics(new) if r["kind"] == "train"]
    assert again[0] < first[0] - 0.5  # it went on from the trained weights, not from a fresh model


def test_resume_from_a_run_folder_names_its_checkpoints(data_dir, tmp_path, capsys):
    """`--resume RUN` (a run, not one of its checkpoints) was refused as a checkpoint with "no meta.json
    (incomplete save?); it cannot be trusted", of a run that was whole."""
    run = str(tmp_path / "quick")
    assert main(_flags(data_dir, run, steps=2)) == 0
    capsys.readouterr()
    assert main(_flags(data_dir, str(tmp_path / "new"), steps=4) + ["--resume", run]) == 2
    newest = ckpt.list_checkpoints(run)[-1]
    assert _one_error_line(capsys.readouterr().err) == (
        f"error: --resume (resume): {run!r} is a run's folder, not a checkpoint: give one of its checkpoints (its "
        f"newest is {newest}), or continue that run itself with `foxformer train --out {run}`")
    assert main(_flags(data_dir, str(tmp_path / "new"), steps=2) + ["--resume", newest]) == 0


def test_resume_from_another_runs_checkpoint_is_held_to_that_runs_config(data_dir, tmp_path, capsys):
    """A new out_dir resumed from another run's checkpoint was held to no saved config: another --preset failed
    with a traceback of mismatched weight shapes, another --lr trained on unremarked, and a checkpoint at the end
    of the schedule failed on the new folder's missing config.yaml."""
    run = str(tmp_path / "quick")
    assert main(_flags(data_dir, run, steps=4)) == 0
    middle, newest = ckpt.list_checkpoints(run)[-2:]
    capsys.readouterr()
    new = str(tmp_path / "new")
    assert main(_flags(data_dir, new, steps=4) + ["--resume", middle, "--preset", "transformer-pro-tiny"]) == 2
    assert "the model differs from the one saved in " + os.path.join(run, "config.yaml") in _one_error_line(
        capsys.readouterr().err)
    assert main(_flags(data_dir, new, steps=4) + ["--resume", middle, "--lr", "1e-2"]) == 2
    err = _one_error_line(capsys.readouterr().err)
    assert "in ['lr']; a resumed run must compute the same thing" in err and f"--init-from {middle} --out" in err
    assert not os.path.exists(new)
    assert main(_flags(data_dir, new, steps=4) + ["--resume", newest]) == 0
    done = capsys.readouterr()
    assert "Traceback" not in done.err and f"--config {os.path.join(run, 'config.yaml')} --init-from {run}" in done.err
    assert _summary(done.out)["trained"] is False and _summary(done.out)["params"] is not None
    assert main(_flags(data_dir, new, steps=4) + ["--resume", middle]) == 0
    assert [r["step"] for r in read_metrics(new) if r["kind"] == "train"] == [3, 4]


def test_export_names_a_missing_run_and_finds_a_checkpoint_by_its_name(data_dir, tmp_path, capsys):
    """`export-hf runs/qiuck` said the run "has no checkpoints"; `--checkpoint step_00000002` (a name the run
    lists) was looked up in the current folder."""
    assert main(["export-hf", str(tmp_path / "qiuck")]) == 2
    assert "no run folder" in _one_error_line(capsys.readouterr().err)
    run = str(tmp_path / "run")
    assert main(_flags(data_dir, run, steps=2)) == 0
    name = os.path.basename(ckpt.list_checkpoints(run)[0])
    capsys.readouterr()
    assert main(["export-hf", run, "--checkpoint", name, "--out", str(tmp_path / "hf")]) == 0
    assert json.loads(capsys.readouterr().out)["checkpoint"].endswith(name)
    assert main(["export-hf", run, "--checkpoint", "step_00009999"]) == 2
    assert f"holds {name}" in _one_error_line(capsys.readouterr().err)


def test_a_checkpoint_removed_by_keep_last_names_those_the_run_holds(data_dir, tmp_path, capsys):
    """The checkpoint a stop's note named, since removed by keep_last: `--resume` said only that it does not exist,
    and `export-hf` of it said "no run folder"."""
    run = str(tmp_path / "run")
    assert main(_flags(data_dir, run, steps=8)) == 0
    gone = os.path.join(run, "checkpoints", "step_00000002")
    assert not os.path.exists(gone)
    held = (f"{os.path.join(run, 'checkpoints')} holds step_00000006, step_00000008; a run keeps only its newest "
            f"keep_last")
    capsys.readouterr()
    assert main(["train", "--out", run, "--resume", gone]) == 2
    assert _one_error_line(capsys.readouterr().err).startswith(
        f"error: --resume (resume): checkpoint {gone!r} does not exist ({held}); resume from another checkpoint")
    assert main(["export-hf", gone]) == 2
    assert _one_error_line(capsys.readouterr().err) == (
        f"error: export: checkpoint {gone!r} does not exist ({held}): foxformer export-hf {run} --checkpoint NAME")
    assert main(["export-hf", run, "--checkpoint", "step_00000002"]) == 2
    assert f"of {run!r} ({held})" in _one_error_line(capsys.readouterr().err)


@pytest.mark.parametrize("extra, said", [
    (["--lr", "-1"], "--lr (lr): expected a finite non-negative number, got -1.0"),
    (["--schedule", "cosin"], "--schedule (schedule): expected one of"),
    (["--micro-batch-size", "3"], "--micro-batch-size (micro_batch_size): 3 does not divide the 4 sequences"),
    (["--context", "1Gi", "--batch-tokens", "1Gi"], "--context (context): 1073741824 is more than the "),
    (["--context", "1Gi", "--batch-tokens", "1Gi"], " tokens of split 'train' and the "),
    (["--preset", "fox-pro-tinny"], "--preset (preset): unknown preset 'fox-pro-tinny' (did you mean 'fox-pro-tiny'?)"),
], ids=["negative-lr", "schedule", "micro-batch", "context-past-the-data", "context-past-both-splits",
        "preset-typo"])
def test_a_bad_flag_value_is_named_by_its_flag(data_dir, tmp_path, capsys, extra, said):
    """Errors named the config key (lr) where the user had typed a flag (--lr); those of the checks that need the
    data or the ranks too (micro_batch_size: ..., and a context past the data as "data: ... seq_len=")."""
    assert main(_flags(data_dir, str(tmp_path / "run"), steps=1) + extra) == 2
    assert said in _one_error_line(capsys.readouterr().err)


@pytest.mark.parametrize("flag, value, said", [
    ("--lr", "abc", "expected a number, got 'abc'"),
    ("--total-tokens", "12x", "expected a token count such as 524288 or '512Ki', got '12x'"),
    ("--max-steps", "1.5", "expected an integer, got '1.5'"),
    ("--seed", "x", "expected an integer, got 'x'"),
], ids=["lr-not-a-number", "token-count", "steps-not-an-integer", "seed-not-a-number"])
def test_a_flag_value_of_no_number_is_refused_while_parsed(tmp_path, capsys, flag, value, said):
    """They were refused by TrainConfig, once torch had loaded (seconds); before that, in argparse's words
    ("invalid float value: 'abc'"). Now each in the key's words, while the arguments are parsed."""
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as exit_:
        main(["train", "--data", str(tmp_path), "--out", str(out), flag, value])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == f"foxformer train: error: argument {flag}: {said}"
    assert not out.exists()


def test_a_bad_number_is_refused_before_torch_loads():
    done = subprocess.run([sys.executable, "-c", "import sys\nfrom foxformer.cli import main\ntry:\n"
                           "    main(['train', '--max-steps', '1', '--lr', 'abc'])\nexcept SystemExit:\n"
                           "    print('torch' in sys.modules)"],
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": SRC}, timeout=120)
    assert done.stdout.strip() == "False", done.stderr
    assert done.stderr.strip().endswith("error: argument --lr: expected a number, got 'abc'")


@pytest.mark.parametrize("extra, said", [
    (["--set", "lrr=1"], "error: --set: unknown config key 'lrr' (did you mean 'lr'?); known keys: "),
    (["--set", "=3"], "error: --set: expected key=value, got '=3'"),
    (["--model", "hidden_size=abc"], "error: --model hidden_size=abc: hidden_size must be a positive int, got 'abc'"),
    (["--set", "model.num_heads=four"], "error: --set model.num_heads=four: num_heads must be a positive int, got "
                                        "'four'"),
    (["--model", "num_kv_heads=3"], "error: --model num_kv_heads=3: num_heads (4) must be a multiple of "
                                    "num_kv_heads (3)"),
    (["--model", "hidden_size=64", "--model", "num_head=8"],
     "error: --model num_head=8: unknown model key 'num_head' (did you mean 'num_heads'?); FoxConfig keys: "),
    (["--set", "model.fgate_bias=1"], "error: --set model.fgate_bias=1: unknown model key 'fgate_bias'"),
    (["--model", "gradient_checkpointing=true"], "error: --model gradient_checkpointing=true: gradient_checkpointing "
                                                 "is not read in training"),
    (["--model", "num_heads=3"], "error: --model num_heads=3: num_heads (3) must divide hidden_size (64); give both "),
    (["--set", "model.hidden_size=72"], "error: --set model.hidden_size=72: head_dim (16) must divide hidden_size "
                                        "(72)"),
    (["--model", "hidden_size=null"], "error: --model hidden_size=null: hidden_size must be a positive int, got None"),
    (["--model", "num_heads=[4]"], "error: --model num_heads=[4]: num_heads must be a positive int, got [4]"),
], ids=["unknown-key", "no-key", "model-width-not-a-number", "model-heads-not-a-number", "model-field-named-beside",
        "unknown-model-key", "unknown-model-key-by-set", "model-key-not-read", "preset-heads", "preset-width-by-set",
        "model-width-none", "model-heads-a-list"])
def test_a_bad_set_or_model_item_says_which_and_why(data_dir, tmp_path, capsys, extra, said):
    """--set's unknown keys were "overrides: unknown config key" (a word of the API, not of the command line),
    `--set =3` an unknown key '', and a model width that is no number a bare TypeError of the width's
    derivation ("can't multiply sequence by non-int of type 'float'"), then an error on FoxConfig.hidden_size, a
    name the user never typed: a bad --model item is named as given. get_preset's refusals were left unnamed
    ("get_preset: num_heads (3) must divide ...")."""
    assert main(_flags(data_dir, str(tmp_path / "run"), steps=1) + extra) == 2
    assert _one_error_line(capsys.readouterr().err).startswith(said)


@pytest.mark.parametrize("given, said", [
    (["--set", "warmup_tokens=12x"], "error: --set warmup_tokens=12x: expected a token count"),
    (["--set", "lr=-1"], "error: --set lr=-1: expected a finite non-negative number, got -1.0"),
    ({"lr": -1}, "error: config {path}: lr: expected a finite non-negative number, got -1.0"),
    ({"preset": "fox-pro-tinny"}, "error: config {path}: preset: unknown preset 'fox-pro-tinny' (did you mean "
                                  "'fox-pro-tiny'?): expected one of ["),
    ({"model": {"num_head": 8}}, "error: config {path}: model: unknown model key 'num_head' (did you mean "
                                 "'num_heads'?)"),
    ({"context": 2**30, "batch_tokens": 2**30}, "error: config {path}: context: 1073741824 is more than the "),
], ids=["set-token-count", "set-negative-lr", "file-negative-lr", "file-preset-typo", "file-model-key",
        "file-context-past-the-data"])
def test_a_bad_value_not_set_by_a_flag_says_where_it_was_set(data_dir, tmp_path, capsys, given, said):
    """A value refused from --set or a --config file was named by its key alone ("lr: expected ..."), leaving the
    user to find which of the two, or the file's defaults, set it; a --set item keeps the key (it is not said as
    --warmup-tokens, which the user did not type)."""
    flags = _flags(data_dir, str(tmp_path / "run"), steps=1)
    path = str(tmp_path / "my config.yaml")
    # the value of --set or of the file, not a flag's, is the one refused
    for key in ["lr", *given] if isinstance(given, dict) else ["lr"]:
        if (flag := f"--{key.replace('_', '-')}") in flags:
            del flags[flags.index(flag):flags.index(flag) + 2]
    if isinstance(given, dict):
        with open(path, "w") as f:
            yaml.safe_dump(given, f)
        given = ["--config", path]
    assert main(flags + given) == 2
    assert _one_error_line(capsys.readouterr().err).startswith(said.format(path=path))


def test_a_refused_dataset_is_named_as_the_run_set_it(data_dir, tmp_path, capsys):
    """The dataset's refusals named it "data: ...", neither the flag typed (--data) nor the config key (data_dir)."""
    missing = str(tmp_path / "nowhere")
    assert main(_flags(missing, str(tmp_path / "run"), steps=1)) == 2
    assert _one_error_line(capsys.readouterr().err).startswith(f"error: --data (data_dir): {missing!r} does not "
                                                               f"exist; prepare a dataset there")
    flags = _flags(data_dir, str(tmp_path / "run"), steps=1)
    flags[flags.index("--data"):flags.index("--data") + 2] = ["--set", f"data_dir={missing}"]
    assert main(flags) == 2
    assert _one_error_line(capsys.readouterr().err).startswith(f"error: --set data_dir={missing}: {missing!r} does "
                                                               f"not exist")


def test_a_default_dataset_that_is_not_there_says_that_data_was_left_out(tmp_path, capsys, monkeypatch):
    """`train --init-from RUN --max-steps 1` (no --data) said "data_dir: 'data_cache/default' does not exist": a
    key and a path the user had not typed. A run continued from its config.yaml does not call its data a default."""
    monkeypatch.chdir(tmp_path)
    for extra in ([], ["--init-from", str(tmp_path / "some-run")]):
        assert main(["train", "--out", "run", "--max-steps", "1", *extra]) == 2
        line = _one_error_line(capsys.readouterr().err)
        assert line.startswith("error: --data (data_dir): 'data_cache/default' does not exist; prepare a dataset ")
        assert line.endswith("; --data was left out, so its default (data_cache/default) was used")
    moved = str(tmp_path / "moved")
    os.makedirs("old")
    save_config(TrainConfig(data_dir=moved, max_steps=1), os.path.join("old", "config.yaml"))
    assert main(["train", "--out", "old"]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert line.startswith(f"error: data_dir: {moved!r} does not exist") and "left out" not in line


def test_a_config_that_is_a_folder_is_named_as_config(data_dir, tmp_path, capsys):
    """`--config FOLDER` said "is a directory (FOLDER): give a file, not a folder", in no setting's name."""
    flags = _flags(data_dir, str(tmp_path / "run"), steps=1)
    assert main(flags + ["--config", str(tmp_path)]) == 2
    assert _one_error_line(capsys.readouterr().err) == f"error: --config: {str(tmp_path)!r} is a folder; give the " \
                                                       f"YAML file itself"


def test_no_horizon_names_the_flags_that_set_one(data_dir, tmp_path, capsys):
    assert main(["train", "--data", data_dir, "--out", str(tmp_path / "run"), "--preset", "fox-pro-tiny"]) == 2
    assert ("total_tokens / max_steps: set at least one (the schedule needs a horizon): give --total-tokens or "
            "--max-steps") in _one_error_line(capsys.readouterr().err)


def test_export_never_replaces_a_folder_it_did_not_write(data_dir, tmp_path, capsys, monkeypatch):
    """`export-hf --out DIR` removed DIR whatever it held: a user's files, the run folder itself, the current
    folder. Now only an earlier export (which it says it replaces) or an empty folder is replaced."""
    run = str(tmp_path / "run")
    assert main(_flags(data_dir, run, steps=2)) == 0
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    capsys.readouterr()
    assert main(["export-hf", run, "--out", str(mine)]) == 2
    assert "holds other files (notes.txt)" in _one_error_line(capsys.readouterr().err)
    assert (mine / "notes.txt").read_text() == "keep me"
    assert main(["export-hf", run, "--out", run]) == 2
    assert "is a training run's folder" in _one_error_line(capsys.readouterr().err)
    assert ckpt.list_checkpoints(run)
    monkeypatch.chdir(mine)
    assert main(["export-hf", run, "--out", "."]) == 2
    assert "is the current folder" in _one_error_line(capsys.readouterr().err)
    assert (mine / "notes.txt").exists()
    out = str(tmp_path / "hf")
    assert main(["export-hf", run, "--out", out]) == 0
    assert main(["export-hf", run, "--out", out]) == 0
    assert f"note: replacing the earlier export in {out}" in capsys.readouterr().err
    assert os.path.exists(os.path.join(out, "config.json"))


def test_a_run_at_its_end_says_why_nothing_trains(data_dir, tmp_path, capsys):
    """`foxformer train --out RUN` again on a finished run printed only its summary (train_loss null)."""
    run = str(tmp_path / "run")
    assert main(_flags(data_dir, run, steps=2)) == 0
    printed = capsys.readouterr().out
    first = json.loads(printed[printed.index("{\n"):])  # after the line saying what the new run trains
    files = {name: os.path.getmtime(os.path.join(run, name)) for name in ("metrics.jsonl", "config.yaml")}
    metrics = open(os.path.join(run, "metrics.jsonl")).read()
    last_eval = [r for r in read_metrics(run) if r["kind"] == "eval"][-1]
    # again, and resumed from its last checkpoint by name: each appended another evaluation of step 2 (and start
    # and end records), which plots and reports showed twice; now nothing is evaluated or written
    for again in (["train", "--out", run], ["train", "--out", run, "--resume", ckpt.latest_checkpoint(run)]):
        assert main(again) == 0
        out, err = capsys.readouterr()
        # max_steps set the schedule here (no total_tokens): going further is a new schedule
        assert f"train: nothing to train: {run} is at step 2, the end of its schedule (256 tokens); a longer " in err
        assert f"--init-from {run} --out NEW_DIR --total-tokens N" in err
        summary = json.loads(out)
        assert (summary["step"], summary["val_loss"], summary["trained"]) == (2, last_eval["val_loss"], False)
        # the same keys as the run's own summary (its stopped_by was missing), in the same order
        assert list(summary) == list(first) and (first["trained"], summary["stopped_by"]) == (True, None)
        assert summary["hf_dir"] is None and summary["params"] == first["params"]  # export_hf=false: no export
        assert "export-hf" not in err
        assert open(os.path.join(run, "metrics.jsonl")).read() == metrics
        assert {name: os.path.getmtime(os.path.join(run, name)) for name in files} == files
    # a finished run wanting an export it lacks is told how to write one, still without training or evaluating
    assert main(["train", "--out", run, "--set", "export_hf=true"]) == 0
    assert f"train: {run} has no Hugging Face export; foxformer export-hf {run} writes it" in capsys.readouterr().err
    assert open(os.path.join(run, "metrics.jsonl")).read() == metrics


def test_a_finished_constant_schedule_run_goes_on_as_if_it_had_had_the_longer_horizon(data_dir, tmp_path, capsys):
    """A finished run went on only as a new run (--init-from). Under a constant schedule a longer horizon leaves
    every step's learning rate as it was (the warm-up kept), so the run itself goes on, to the same losses."""
    run, whole = str(tmp_path / "run"), str(tmp_path / "whole")
    assert main(_flags(data_dir, run, steps=2) + ["--schedule", "constant"]) == 0
    capsys.readouterr()
    assert main(["train", "--out", run]) == 0
    said = capsys.readouterr().err
    command = said[said.index("foxformer train --out"):].strip()
    assert command == f"foxformer train --out {run} --max-steps N --warmup-tokens 25"  # a tenth of 256 tokens
    # the unset warm-up is a tenth of the horizon: 4 steps would warm up over 51 tokens
    assert main(["train", "--out", run, "--max-steps", "4"]) == 2
    assert "keep it with --warmup-tokens 25" in _one_error_line(capsys.readouterr().err)
    assert main(shlex.split(command.replace("N", "4"))[1:]) == 0
    assert main(_flags(data_dir, whole, steps=4) + ["--schedule", "constant", "--warmup-tokens", "25"]) == 0
    went_on, straight = ([(r["step"], r["lr"], r["loss"]) for r in read_metrics(d) if r["kind"] == "train"]
                         for d in (run, whole))
    assert [step for step, _, _ in went_on] == [1, 2, 3, 4] and went_on == straight


def test_a_finished_cosine_run_given_a_longer_horizon_says_why_that_is_a_new_run(data_dir, tmp_path, capsys):
    run = str(tmp_path / "run")
    assert main(_flags(data_dir, run, steps=2)) == 0
    capsys.readouterr()
    assert main(["train", "--out", run, "--max-steps", "4", "--warmup-tokens", "25"]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert "a cosine schedule decays to its horizon, only a constant one extends on resume" in line
    assert f"--init-from {run} --out NEW_DIR" in line


def test_out_inside_a_runs_checkpoints_is_refused_naming_the_run(data_dir, tmp_path, capsys):
    """`--out RUN/checkpoints/step_N` (meant as --resume or --init-from) said there was "no run to continue", and
    with --data it trained a new run inside the checkpoint, which went when keep_last removed that checkpoint."""
    run = str(tmp_path / "run")
    assert main(_flags(data_dir, run, steps=2)) == 0
    capsys.readouterr()
    step = ckpt.list_checkpoints(run)[-1]
    for out, what in ((step, "a checkpoint"), (ckpt.checkpoint_root(run), "the checkpoints folder")):
        before = sorted(os.listdir(out))
        for argv in (["train", "--out", out], _flags(data_dir, out, steps=1)):
            assert main(argv) == 2
            assert _one_error_line(capsys.readouterr().err) == (
                f"error: out_dir: {out!r} is {what} of the run {run}, not a run folder; continue that run with "
                f"--out {run} (plus --resume CHECKPOINT to go back to one), or start a new run from a checkpoint's "
                f"weights with --init-from CHECKPOINT --out NEW_DIR")
        assert sorted(os.listdir(out)) == before


def test_out_naming_the_dataset_or_a_model_folder_is_refused(data_dir, tmp_path, capsys):
    """`--out DATA` (the flags swapped) and `--out RUN/hf` trained a run into the dataset's or the model's folder,
    its checkpoints and export mixed with the shards or the model's files."""
    run = str(tmp_path / "run")
    assert main(_flags(data_dir, run, steps=2)) == 0
    capsys.readouterr()
    hf = os.path.join(run, "hf")
    main(["export-hf", run, "--out", hf])
    capsys.readouterr()
    for out, what, hint in ((data_dir, "a prepared dataset (it holds manifest.json)", "the dataset goes to --data"),
                            (hf, "a Hugging Face model folder (it holds config.json)",
                             "to train on from its weights, pass it as --init-from")):
        before = sorted(os.listdir(out))
        assert main(_flags(data_dir, out, steps=1)) == 2
        assert _one_error_line(capsys.readouterr().err) == (
            f"error: --out: {out!r} is {what}, not a run folder: name a new folder for the run; {hint}")
        assert sorted(os.listdir(out)) == before
        with pytest.raises(ValueError, match=re.escape(f"out_dir: '{out}' is {what}, not a run folder")):
            train(TrainConfig(data_dir=data_dir, out_dir=out, preset="fox-pro-tiny", context=32, batch_tokens=128,
                              max_steps=1))


def test_a_refused_resume_with_another_model_does_not_advise_init_from(data_dir, tmp_path, capsys):
    """The advice to go on with --init-from trained the saved FoX weights under the new preset's name."""
    run = str(tmp_path / "run")
    assert main(_flags(data_dir, run, steps=2)) == 0
    capsys.readouterr()
    argv = _flags(data_dir, run, steps=2)
    argv[argv.index("fox-pro-tiny")] = "transformer-pro-tiny"
    assert main(argv) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert "the model differs" in line and "--init-from" not in line and "--out NEW_DIR" in line


def test_a_warm_up_as_long_as_the_schedule_is_warned_about(data_dir, tmp_path, capsys):
    argv = _flags(data_dir, str(tmp_path / "run"), steps=2) + ["--total-tokens", "256", "--warmup-tokens", "1Mi"]
    assert main(argv) == 0
    assert "train: warning: the warm-up (1,048,576 tokens) is as long as the schedule (256)" in \
        capsys.readouterr().err


def test_export_of_a_checkpoint_folder_names_the_run_and_the_flag(data_dir, tmp_path, capsys):
    run = str(tmp_path / "run")
    assert main(_flags(data_dir, run, steps=2)) == 0
    path = ckpt.list_checkpoints(run)[-1]
    capsys.readouterr()
    assert main(["export-hf", path]) == 2
    assert f"foxformer export-hf {run} --checkpoint {os.path.basename(path)}" in \
        _one_error_line(capsys.readouterr().err)


def test_export_of_the_checkpoints_folder_or_an_export_says_what_it_is(data_dir, tmp_path, capsys):
    """Both were "export: run ... has no checkpoints", of a folder of nothing but checkpoints."""
    run = str(tmp_path / "run")
    assert main(_flags(data_dir, run, steps=2)) == 0
    capsys.readouterr()
    assert main(["export-hf", ckpt.checkpoint_root(run), "--out", str(tmp_path / "hf")]) == 2
    assert _one_error_line(capsys.readouterr().err) == (
        f"error: export: {ckpt.checkpoint_root(run)!r} is the checkpoints folder of the run {run}; export-hf takes "
        f"the run folder: foxformer export-hf {run}")
    assert main(["export-hf", run, "--out", str(tmp_path / "hf")]) == 0
    capsys.readouterr()
    assert main(["export-hf", str(tmp_path / "hf"), "--out", str(tmp_path / "again")]) == 2
    assert "is a Hugging Face model folder (it holds config.json), which from_pretrained and every foxformer " \
        "command load as is; export-hf takes a run folder" in _one_error_line(capsys.readouterr().err)
    assert not (tmp_path / "again").exists()


def test_export_without_a_checkpoint_says_what_to_do(data_dir, tmp_path, capsys):
    """"export: run ... has no checkpoints" and "no run folder" said what was wrong, not what to do."""
    assert main(["export-hf", str(tmp_path / "qiuck")]) == 2
    assert _one_error_line(capsys.readouterr().err) == (
        f"error: export: no run folder {str(tmp_path / 'qiuck')!r}; export-hf takes a run folder, the --out of "
        f"`foxformer train`")
    (tmp_path / "other").mkdir()
    assert main(["export-hf", str(tmp_path / "other")]) == 2
    assert _one_error_line(capsys.readouterr().err) == (
        f"error: export: {str(tmp_path / 'other')!r} is no run folder (it holds no config.yaml and no checkpoint); "
        f"export-hf takes a run folder, the --out of `foxformer train`")
    run = str(tmp_path / "run")
    assert main(_flags(data_dir, run, steps=2)) == 0
    shutil.rmtree(ckpt.checkpoint_root(run))  # a run stopped before its first checkpoint
    capsys.readouterr()
    assert main(["export-hf", run]) == 2
    assert _one_error_line(capsys.readouterr().err) == (
        f"error: export: run {run!r} has no checkpoints yet; train it on until it saves one: foxformer train --out "
        f"{run}")


def test_export_of_a_dataset_says_it_is_one(data_dir, tmp_path, capsys):
    """`export-hf DATA` said "run ... has no checkpoints"."""
    assert main(["export-hf", data_dir, "--out", str(tmp_path / "hf")]) == 2
    assert _one_error_line(capsys.readouterr().err) == (
        f"error: export: {data_dir!r} is a prepared dataset (it holds manifest.json), which `foxformer train --data` "
        f"trains on; export-hf takes a run folder, the --out of `foxformer train`")
    assert not (tmp_path / "hf").exists()


def test_the_resume_note_under_torchrun_names_the_launch(tmp_path, monkeypatch):
    from foxformer.train.cli import _resume_note

    monkeypatch.setenv("WORLD_SIZE", "2")
    note = _resume_note(str(tmp_path / "run"))
    assert "start it again with: torchrun --nproc-per-node N -m foxformer.cli train --out" in note
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert _resume_note(str(tmp_path / "run")).endswith(f"with: foxformer train --out {tmp_path / 'run'}")


def test_a_run_started_from_another_model_records_no_preset_and_refuses_one(data_dir, tmp_path, capsys):
    """A run started --init-from saved `preset: fox-pro-tiny` (the default) or the --preset given in its
    config.yaml, and its model card said so, though it trains the model it starts from: it records none now, and a
    --preset given with --init-from, which would be ignored, is refused."""
    src, new = str(tmp_path / "src"), str(tmp_path / "new")
    assert main(_flags(data_dir, src, steps=1) + ["--model", "num_layers=1"]) == 0
    flags = _flags(data_dir, new, steps=1)
    flags[flags.index("--preset"):flags.index("--preset") + 2] = ["--init-from", src, "--total-tokens", "256"]
    capsys.readouterr()
    assert main(flags + ["--preset", "transformer-pro-tiny"]) == 2
    assert _one_error_line(capsys.readouterr().err) == (
        f"error: --preset (preset): the run trains the model init_from names ({src}), its architecture and weights, "
        f"so no preset is built; leave --preset out")
    assert not os.path.exists(new)
    assert main(flags) == 0
    saved = yaml.safe_load(open(os.path.join(new, "config.yaml")))
    assert saved["preset"] is None and saved["init_from"] == src
    with open(os.path.join(new, "model_config.json")) as f:
        assert json.load(f)["num_layers"] == 1
    assert main(["train", "--out", new, "--max-steps", "2"]) == 0  # the run resumes from what it saved
    assert [r["resumed_from"] is not None for r in read_metrics(new) if r["kind"] == "start"] == [False, True]
    assert yaml.safe_load(open(os.path.join(new, "config.yaml")))["preset"] is None


def test_a_log_file_gets_the_step_lines_and_no_progress_bar_frames(data_dir, tmp_path, capsys):
    """With stderr redirected (`2> train.log`, nohup) the bar wrote a frame at each update, carriage returns in
    one endless line of the log. Off a terminal the step lines on stdout are the progress."""
    argv = [a for a in _flags(data_dir, str(tmp_path / "run"), steps=2) if a != "--no-progress"]
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert "\r" not in captured.err and "%|" not in captured.err
    assert "step 1/2 tokens 128 loss" in captured.out and "step 2/2 tokens 256 loss" in captured.out


def test_the_eta_leaves_out_the_first_step_which_holds_the_start_up(make_cfg, tmp_path, capsys):
    """Step 1's line said `tok/s 759 ... ETA 2:59:51` where the next steps ran 13K tok/s: the ETA came from the
    first step's time, start-up included. Now it starts at the second step."""
    from foxformer.train.metrics import StepSpeed

    speed = StepSpeed()
    speed.add(759.0)
    assert speed.eta(1e6) is None
    speed.add(13000.0)
    assert speed.eta(13000.0) == pytest.approx(1.0)
    speed.add(8000.0)  # smoothed over the later steps, the first still left out
    assert speed.eta(1e6) == pytest.approx(1e6 / (0.8 * 13000.0 + 0.2 * 8000.0))

    train(make_cfg(out_dir=str(tmp_path / "run"), max_steps=2, log_every=1))
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("step ") and "tok/s" in line]
    assert lines[0].startswith("step 1/2 ") and lines[0].endswith(" ETA ?"), lines
    assert re.search(r" ETA \d+:\d\d$", lines[1]), lines
