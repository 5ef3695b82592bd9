import hashlib
import os

import pytest
import torch

from foxformer.train import checkpoint as ckpt
from foxformer.train.config import load_config
from foxformer.train.loop import train

from .helpers import Crash, crash_at


def _snapshot(root):
    out = {}
    for d, _, files in os.walk(root):
        for f in files:
            p = os.path.join(d, f)
            out[os.path.relpath(p, root)] = hashlib.sha256(open(p, "rb").read()).hexdigest()
    return out


@pytest.fixture
def finished_run(make_cfg, tmp_path):
    cfg = make_cfg(out_dir=str(tmp_path / "done"), max_steps=4)
    train(cfg)
    return cfg


def test_corrupted_checkpoint_fails_clearly_and_overwrites_nothing(finished_run, make_cfg):
    run = finished_run.out_dir
    model_file = os.path.join(ckpt.latest_checkpoint(run), "model.pt")
    data = bytearray(open(model_file, "rb").read())
    data[len(data) // 2] ^= 0xFF
    open(model_file, "wb").write(bytes(data))
    before = _snapshot(run)
    with pytest.raises(ckpt.CheckpointError, match="corrupted"):
        train(finished_run)
    assert _snapshot(run) == before


def test_truncated_checkpoint_fails_clearly(finished_run, make_cfg):
    run = finished_run.out_dir
    optim_file = os.path.join(ckpt.latest_checkpoint(run), "optim.pt")
    os.truncate(optim_file, 10)
    with pytest.raises(ckpt.CheckpointError, match="optim.pt is corrupted"):
        train(finished_run)


def test_missing_checkpoint_fails_clearly(finished_run, make_cfg, tmp_path):
    run = finished_run.out_dir
    with pytest.raises(ckpt.CheckpointError, match="does not exist"):
        train(make_cfg(out_dir=run, max_steps=4, resume=str(tmp_path / "nope")))
    import shutil

    shutil.rmtree(ckpt.latest_checkpoint(run))
    before = _snapshot(run)
    with pytest.raises(ckpt.CheckpointError, match="missing"):
        train(finished_run)
    assert _snapshot(run) == before


def test_unknown_config_key(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("preset: fox-pro-tiny\nlrr: 0.001\nmax_steps: 3\n")
    with pytest.raises(ValueError, match="unknown config key 'lrr' \\(did you mean 'lr'\\?\\)"):
        load_config(str(path))
    with pytest.raises(ValueError, match="unknown config key 'batch_token'"):
        load_config(overrides={"batch_token": 4096, "max_steps": 1})


def test_wrong_tokenizer_dataset_fails_before_writing(make_cfg, tmp_path):
    out = tmp_path / "never"
    with pytest.raises(ValueError, match="tokenized with 'bytes'"):
        train(make_cfg(out_dir=str(out), tokenizer="hf:some/other-tokenizer"))
    assert not out.exists()


@pytest.mark.parametrize("given", [True, False], ids=["tokenizer-given", "tokenizer-from-the-data"])
def test_a_tokenizer_folder_saved_again_since_the_data_fails_before_writing(make_cfg, tmp_path, given):
    """Compared by name only, a tokenizer folder saved again between `data prepare` and `train` trained a run on
    ids that the tokenizer its config names now gives to other tokens."""
    from ..data.helpers import word_dataset, word_tokenizer

    data, tok = word_dataset(tmp_path)
    word_tokenizer(tok, {"b": 1, "a": 2})
    out = tmp_path / "never"
    with pytest.raises(ValueError, match="the files of the tokenizer .* changed since the data was prepared"):
        train(make_cfg(data_dir=data, out_dir=str(out), tokenizer=tok if given else None))
    assert not out.exists()


def test_changed_config_on_resume_is_refused(finished_run, make_cfg):
    run = finished_run.out_dir
    before = _snapshot(run)
    with pytest.raises(ValueError, match="differs.*'lr'"):
        train(make_cfg(out_dir=run, max_steps=4, lr=1e-4))
    with pytest.raises(ValueError, match="resume='never'"):
        train(make_cfg(out_dir=run, max_steps=4, resume="never"))
    assert _snapshot(run) == before


@pytest.mark.parametrize("kw,match", [
    ({"batch_tokens": 100}, "batch_tokens"), ({"schedule": "step"}, "schedule"),
    ({"max_steps": None, "total_tokens": None}, "total_tokens"), ({"precision": "fp8"}, "precision"),
    ({"context": "lots"}, "context"),
], ids=["batch-not-multiple", "bad-schedule", "no-horizon", "bad-precision", "bad-count"])
def test_bad_values_name_the_key(make_cfg, kw, match):
    with pytest.raises(ValueError, match=match):
        make_cfg(**kw)


@pytest.mark.parametrize("kw,match", [
    ({"max_steps": 1.5}, "max_steps"), ({"max_steps": "2.5"}, "max_steps"), ({"keep_last": 1.5}, "keep_last"),
    ({"log_every": 0.5}, "log_every"), ({"micro_batch_size": 2.5}, "micro_batch_size"),
    ({"total_tokens": "1000.5"}, "total_tokens"), ({"batch_tokens": "128.4"}, "batch_tokens"),
    ({"roll": 2}, "roll"), ({"compile": "no way"}, "compile"), ({"export_hf": None}, "export_hf"),
], ids=["fractional-steps", "fractional-steps-string", "fractional-keep-last", "fractional-log-every",
        "fractional-micro-batch", "fractional-token-count", "fractional-batch-tokens", "int-as-bool",
        "string-not-a-bool", "none-bool"])
def test_values_of_the_wrong_kind_are_refused_not_bent(make_cfg, kw, match):
    # 1.5 steps ran 2 steps over a 1.5-step horizon; a string or a number for a switch was used as truthy
    with pytest.raises(ValueError, match=match):
        make_cfg(**kw)


@pytest.mark.parametrize("text,value", [("true", True), ("False", False), ("yes", True), ("off", False)],
                         ids=["true", "False", "yes", "off"])
def test_yaml_booleans_written_as_strings_mean_what_they_say(make_cfg, text, value):
    assert make_cfg(roll=text).roll is value


def test_a_backward_that_reaches_no_parameter_stops_the_run():
    import torch

    from foxformer.train.step import check_gradients_arrived

    model = torch.nn.Linear(4, 4)
    with pytest.raises(RuntimeError, match="no gradient reached any parameter"):
        check_gradients_arrived(model)
    model(torch.randn(2, 4)).sum().backward()
    check_gradients_arrived(model)


def test_a_save_killed_before_the_pointer_update_is_still_found(finished_run):
    """A checkpoint folder appears by an atomic rename; `latest` is written just after. A kill between
    the two must not lose that checkpoint (the first one: resume would silently start over)."""
    import shutil

    run = finished_run.out_dir
    newest = ckpt.latest_checkpoint(run)
    os.remove(os.path.join(ckpt.checkpoint_root(run), "latest"))
    assert ckpt.latest_checkpoint(run) == newest
    older = ckpt.list_checkpoints(run)
    if len(older) > 1:  # pointer still at an older checkpoint, the newer folder complete
        with open(os.path.join(ckpt.checkpoint_root(run), "latest"), "w") as f:
            f.write(os.path.basename(older[0]) + "\n")
        assert ckpt.latest_checkpoint(run) == newest
    shutil.rmtree(ckpt.checkpoint_root(run))
    assert ckpt.latest_checkpoint(run) is None


@pytest.mark.parametrize("seed", [-1, "-3"], ids=["int", "string"])
def test_negative_seed_fails_before_writing(make_cfg, tmp_path, seed):
    # numpy's generators refuse negative seeds: the run used to die at its first batch, after writing out_dir
    out = tmp_path / "never"
    with pytest.raises(ValueError, match="seed"):
        train(make_cfg(out_dir=str(out), seed=seed))
    assert not out.exists()


def test_resume_on_other_data_is_refused_but_moved_data_resumes(make_cfg, data_dir, tmp_path):
    # data_dir may change on resume (the data may have moved), but its contents were never compared: a run
    # resumed on a re-prepared or other dataset silently continued on different sequences
    import shutil

    from foxformer.data.preparation import PrepareConfig, prepare

    run = str(tmp_path / "run")

    def crash(step, rec):
        if step == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train(make_cfg(out_dir=run, max_steps=4), hook=crash)  # checkpoint at step 2
    other = tmp_path / "other data"
    prepare(PrepareConfig(sources=["builtin:pydoc"], out_dir=str(other), tokenizer="bytes", val_fraction=0.3),
            progress=False)
    before = _snapshot(run)
    with pytest.raises(ValueError, match="another dataset"):
        train(make_cfg(out_dir=run, max_steps=4, data_dir=str(other)))
    assert _snapshot(run) == before
    moved = tmp_path / "moved data"
    shutil.copytree(data_dir, moved)
    assert train(make_cfg(out_dir=run, max_steps=4, data_dir=str(moved)))["step"] == 4


def test_data_without_validation_documents_says_how_to_fix_it(make_cfg, tmp_path):
    # the message said only that split 'val' had 0 tokens, not what to do about it
    from foxformer.data.preparation import PrepareConfig, prepare

    data = tmp_path / "no val"
    prepare(PrepareConfig(sources=["builtin:pydoc"], out_dir=str(data), val_fraction=0.0), progress=False)
    with pytest.raises(ValueError, match=r"split 'val'.*0 tokens") as err:
        train(make_cfg(out_dir=str(tmp_path / "never"), data_dir=str(data)))
    assert "--val-fraction above 0" in str(err.value) and "--data" in str(err.value)
    assert "validation split" in str(err.value)


@pytest.mark.parametrize("crash_after, expected", [(3, "step_00000002"), (5, "step_00000004")],
                         ids=["killed-before-its-first-save", "killed-after-its-first-save"])
def test_resuming_an_older_checkpoint_abandons_the_newer_ones(make_cfg, tmp_path, crash_after, expected):
    # resume=<older checkpoint> continued from it, but latest_checkpoint still let the abandoned newer
    # step folder win over `latest`: the next automatic resume and load_model(run) silently went back to it
    from foxformer.train.loading import load_model

    run = str(tmp_path / "r")
    train(make_cfg(out_dir=run, max_steps=6, keep_last=3))  # step_2, 4, 6
    root = ckpt.checkpoint_root(run)
    with pytest.raises(Crash):
        train(make_cfg(out_dir=run, max_steps=6, keep_last=3, resume=os.path.join(root, "step_00000002")),
              hook=crash_at(crash_after))
    assert os.path.basename(ckpt.latest_checkpoint(run)) == expected
    assert load_model(run, device="cpu").step == int(expected[len("step_"):])
    assert "step_00000006" not in [os.path.basename(p) for p in ckpt.list_checkpoints(run)]
    assert os.path.isdir(os.path.join(root, "abandoned-step_00000006"))  # kept aside, not deleted
    summary = train(make_cfg(out_dir=run, max_steps=6, keep_last=3))
    assert summary["resumed_from"].endswith(expected) and summary["step"] == 6


@pytest.mark.parametrize("kw,match", [
    ({"beta1": 1.0}, "beta1"), ({"beta1": -0.1}, "beta1"), ({"beta2": 1.5}, "beta2"),
    ({"beta2": float("nan")}, "beta2"), ({"beta1": True}, "beta1"), ({"eps": float("inf")}, "eps"),
    ({"eps": 0.0}, "eps"), ({"eps": -1e-8}, "eps"), ({"eps": "nan"}, "eps"),
], ids=["beta1-one", "beta1-negative", "beta2-above-one", "beta2-nan", "beta1-bool", "eps-inf", "eps-zero",
        "eps-negative", "eps-nan-string"])
def test_adam_betas_and_eps_are_checked(make_cfg, kw, match):
    # they were not validated: eps=inf was accepted (every Adam update became 0, only weight decay acted)
    with pytest.raises(ValueError, match=match):
        make_cfg(**kw)


@pytest.mark.parametrize("kw", [{"beta1": 0.0}, {"beta2": 0.999}, {"eps": 1e-12}, {"eps": "1e-6"}],
                         ids=["beta1-zero", "beta2-close-to-one", "eps-tiny", "eps-yaml-string"])
def test_valid_adam_betas_and_eps_are_accepted(make_cfg, kw):
    cfg = make_cfg(**kw)
    assert all(getattr(cfg, k) == float(v) for k, v in kw.items())



@pytest.mark.parametrize("override", ["beta1=0", "beta2=0", "lr=1", "grad_clip=2"])
def test_whole_numbers_for_float_keys_build_the_optimizer(make_cfg, override):
    # `--set beta2=0` is a YAML int beside beta1's float: AdamW refused the pair ("betas must be either both
    # floats or both Tensors"), an error naming neither the key nor the flag
    from foxformer.train.config import parse_overrides
    from foxformer.train.optim import build_optimizer

    cfg = make_cfg(**parse_overrides([override]))
    key = override.split("=")[0]
    assert type(getattr(cfg, key)) is float
    build_optimizer(torch.nn.Linear(2, 2), cfg, "cpu")

def _poisoned_model(poison):
    """A train() model_factory: the run's own model, with ``poison(model)`` attaching the fault (hooks)."""
    from foxformer.train.loop import build_model

    def factory(cfg, vocab_size):
        model, model_cfg = build_model(cfg, vocab_size)
        poison(model)
        return model, model_cfg

    return factory


def _all_finite(checkpoint):
    return all(torch.isfinite(t).all() for t in ckpt.load_checkpoint(checkpoint)[0].values())


def test_a_nan_gradient_under_a_finite_loss_stops_before_its_checkpoint(make_cfg, tmp_path):
    # only the loss was checked: a NaN gradient under a finite loss made the weights NaN, that step's checkpoint
    # was saved with them as `latest`, and the run failed one step later (resuming failed at the same place again)
    from foxformer.train.divergence import TrainingDiverged

    backwards = {"n": 0}

    def nan_at_third_backward(model):
        def hook(grad):
            backwards["n"] += 1
            return grad * float("nan") if backwards["n"] == 3 else grad
        model.get_output_embeddings().weight.register_hook(hook)

    run = str(tmp_path / "r")
    cfg = make_cfg(out_dir=run, checkpoint_every_tokens=128, keep_last=10)
    with pytest.raises(TrainingDiverged, match=r"diverged at step 3: the loss is [0-9.]+ and the gradient norm nan"
                       ) as err:
        train(cfg, model_factory=_poisoned_model(nan_at_third_backward))
    assert "--lr" in str(err.value) and "--warmup-tokens" in str(err.value) and "grad_clip" not in str(err.value)
    assert [os.path.basename(p) for p in ckpt.list_checkpoints(run)] == ["step_00000001", "step_00000002"]
    assert os.path.basename(ckpt.latest_checkpoint(run)) == "step_00000002"
    assert all(_all_finite(p) for p in ckpt.list_checkpoints(run))
    assert "another --out; --init-from one of those checkpoints" in str(err.value)


def test_the_divergence_advice_follows_the_run(make_cfg, tmp_path):
    from foxformer.train.divergence import diverged

    said = str(diverged(make_cfg(out_dir=str(tmp_path / "none"), grad_clip=0.0), 1, "the loss is nan"))
    # no checkpoint to start again from, and clipping, which was off, is one of the fixes
    assert "the run has no checkpoint. Start a new run (another --out) with a lower --lr" in said
    assert said.endswith("and clip the gradients (--set grad_clip=1; 0 turned clipping off)")


@pytest.mark.parametrize("where, step, said", [
    ("train", 3, r"the forward pass overflowed \(log_fgate contains NaN\)"),
    ("eval", 2, r"the validation forward pass overflowed \(log_fgate contains NaN\)"),
    ("eval-hidden", 2, "the validation loss is nan"),
], ids=["training-gate", "validation-gate", "validation-hidden-states"])
def test_a_forward_that_overflows_stops_the_run_at_its_step(make_cfg, tmp_path, where, step, said):
    # the attention op's value check ended the run with "error: log_fgate contains NaN", naming no step and
    # no fix (the loss, which the loop checks, is never computed); a NaN validation loss was logged, and the
    # step's checkpoint saved, as though nothing had happened
    from foxformer.models.layers import ForgetGate
    from foxformer.train.divergence import TrainingDiverged

    forwards = {"n": 0}

    def nan_forward(model):
        # the validation's losses come from the final norm's output through the head's weight in chunks (no
        # forward of the head itself): NaN hidden states there give a NaN loss and no op's value check
        target = (model.model.norm if where == "eval-hidden"
                  else next(m for m in model.modules() if isinstance(m, ForgetGate)))

        def hook(module, args, out):
            if module.training != (where == "train"):
                return out
            forwards["n"] += 1
            return out * float("nan") if where != "train" or forwards["n"] == step else out
        target.register_forward_hook(hook)

    run = str(tmp_path / "r")
    with pytest.raises(TrainingDiverged, match=rf"diverged at step {step}: {said};"):
        train(make_cfg(out_dir=run, checkpoint_every_tokens=128, eval_every_tokens=256, keep_last=10),
              model_factory=_poisoned_model(nan_forward))
    assert os.path.basename(ckpt.latest_checkpoint(run)) == f"step_{step - 1:08d}"
