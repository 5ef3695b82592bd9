"""What a run finds in its out_dir before it trains: the checkpoint it resumes from, the saved config it must
match, and the summary of a run already at the end of its schedule."""

from __future__ import annotations

import os
import shlex
import sys

from tqdm.auto import tqdm

from ..argtypes import SettingError
from ..data.dataset import TokenizerMismatch
from ..data.tokenizer import same_tokenizer
from . import checkpoint as ckpt
from .config import SAVED_CONFIG, TrainConfig, read_saved_config, resume_conflicts
from .distributed import DistInfo
from .metrics import read_metrics
from .summary import RunSummary


def resolve_resume(cfg: TrainConfig) -> str | None:
    existing = ckpt.list_checkpoints(cfg.out_dir)
    if cfg.resume == "never":
        if existing:
            raise ValueError(f"resume: out_dir {cfg.out_dir!r} already has checkpoints and resume='never'; "
                             f"choose another out_dir (nothing was overwritten)")
        return None
    if cfg.resume == "auto":
        return ckpt.latest_checkpoint(cfg.out_dir)
    if not os.path.isdir(cfg.resume):
        raise ckpt.CheckpointError(f"resume: checkpoint {cfg.resume!r} does not exist "
                                   f"({ckpt.checkpoints_held(cfg.out_dir)})")
    # a run's folder was loaded as a checkpoint, and refused as "an incomplete save" that "cannot be trusted"
    if found := ckpt.list_checkpoints(cfg.resume):
        raise ValueError(f"resume: {cfg.resume!r} is a run's folder, not a checkpoint: give one of its checkpoints "
                         f"(its newest is {found[-1]}), or continue that run itself with `foxformer train --out "
                         f"{shlex.quote(cfg.resume)}`")
    return cfg.resume


def saved_run(cfg: TrainConfig, resume_path: str | None) -> str:
    """The run folder whose config.yaml and model_config.json a resume is held to: out_dir's own, else (a new
    out_dir that goes on from another run's checkpoint, RUN/checkpoints/step_N) that RUN's. Held to nothing there,
    another --preset failed with a traceback of mismatched weight shapes and another --lr went unremarked."""
    if resume_path is None or os.path.exists(os.path.join(cfg.out_dir, SAVED_CONFIG)):
        return cfg.out_dir
    source = os.path.dirname(os.path.dirname(os.path.normpath(resume_path)))
    return source if os.path.exists(os.path.join(source, SAVED_CONFIG)) else cfg.out_dir


def on_resumed_data(cfg: TrainConfig, error: TokenizerMismatch) -> SettingError:
    """``error`` (the data's tokenizer is not the one ``cfg`` names) as said of a run to be resumed, else ``error``.
    The dataset's own refusal said "leave the tokenizer out to use the dataset's", which the user had not given (the
    run's config.yaml had) and a resumed run cannot do; this one names the data the run trained on."""
    saved_path = os.path.join(cfg.out_dir, SAVED_CONFIG)
    if cfg.resume == "never" or not ckpt.list_checkpoints(cfg.out_dir) or not os.path.exists(saved_path):
        return error
    saved = read_saved_config(saved_path)
    again = (f"prepare it again with --tokenizer {saved.tokenizer}" if saved.data_dir == cfg.data_dir
             else f"give the data it trained on ({saved.data_dir!r})")
    return SettingError("data_dir", f"{cfg.data_dir!r} was tokenized with {error.found!r}, but the run in "
                                    f"{cfg.out_dir} trained on {saved.tokenizer!r} tokens, and a resumed run must see "
                                    f"the same data: {again}, or train on this data as a new run in another out_dir "
                                    f"(nothing was overwritten)")


def _say_nothing_to_train(cfg: TrainConfig, step: int, run: str) -> None:
    """A resumed run already at its end printed only its summary (train_loss null, 0 tokens/s), so a user who
    ran it again for "one more minute" did not learn why nothing happened. ``run``: the run the checkpoint is
    of (saved_run), whose config a new run would start from."""
    schedule = -(-cfg.horizon_tokens // cfg.batch_tokens)
    if cfg.max_steps is not None and cfg.max_steps < schedule:
        how = f"give a larger --max-steps to go on (its schedule runs to step {schedule:,})"
        end = f"max_steps {cfg.max_steps:,}"
    elif cfg.schedule == "constant":  # resume_conflicts lets its horizon change
        longer = "--total-tokens N" if cfg.total_tokens is not None else "--max-steps N"
        warmup = f" --warmup-tokens {cfg.warmup}" if cfg.warmup_tokens is None else ""  # else a tenth of N
        how = (f"its constant schedule goes on to a longer horizon: foxformer train --out {shlex.quote(cfg.out_dir)} "
               f"{longer}{warmup}")
        end = f"schedule ({cfg.horizon_tokens:,} tokens)"
    else:
        saved = shlex.quote(os.path.join(run, "config.yaml"))
        how = (f"a longer {cfg.schedule} schedule changes the learning rate of the steps taken, so it is a new run "
               f"from its weights: foxformer train --config {saved} --init-from {shlex.quote(run)} --out "
               f"NEW_DIR --total-tokens N")
        end = f"schedule ({cfg.horizon_tokens:,} tokens)"
    tqdm.write(f"train: nothing to train: {cfg.out_dir} is at step {step:,}, the end of its {end}; {how}",
               file=sys.stderr)


def finished_summary(cfg: TrainConfig, info: DistInfo, step: int, tokens: int, resume_path: str) -> dict:
    """The summary of a run resumed at the end of its schedule, from its own records: it is said why nothing
    trains, and nothing is evaluated or written. Evaluated again, each rerun of `foxformer train --out RUN`
    appended another validation record (and start and end records) of the last step to metrics.jsonl, which
    plots and reports then showed twice."""
    run = saved_run(cfg, resume_path)
    if info.is_main:
        _say_nothing_to_train(cfg, step, run)
    records = [r for r in read_metrics(run) if r.get("step", 0) <= step]

    def last(kind: str, key: str):
        return next((r[key] for r in reversed(records) if r.get("kind") == kind and r.get(key) is not None), None)

    from .loading import read_run_config

    facts = read_run_config(os.path.join(run, "config.yaml")).get("derived") or {}
    hf_dir = os.path.join(run, "hf")
    exported = os.path.exists(os.path.join(hf_dir, "config.json"))
    if cfg.export_hf and not exported and info.is_main:  # the end's export failed, or export_hf was off then
        tqdm.write(f"train: {run} has no Hugging Face export; foxformer export-hf "
                   f"{shlex.quote(run)} writes it", file=sys.stderr)
    return RunSummary(
        out_dir=cfg.out_dir, step=step, tokens=tokens, train_loss=last("train", "loss"),
        val_loss=last("eval", "val_loss"), tokens_per_s=None, resumed_from=resume_path,
        hf_dir=hf_dir if exported else None, params=facts.get("params"),
        non_embedding_params=facts.get("non_embedding_params"), world_size=info.world_size, parallel=info.mode,
        device=str(info.device), wall_s=0.0, trained=False).to_dict()


def check_saved_config(cfg: TrainConfig, resume_path: str | None, data_tokenizer_files: str | None) -> None:
    """``data_tokenizer_files``: the dataset's record of its tokenizer folder, which both the saved tokenizer and
    the run's were checked against: a folder moved since is given by its new path."""
    run = saved_run(cfg, resume_path)
    saved_path = os.path.join(run, "config.yaml")
    if resume_path is None or not os.path.exists(saved_path):
        return
    # another run's weights are those of the checkpoint given, not of that run's newest
    weights = cfg.out_dir if run == cfg.out_dir else resume_path
    saved = read_saved_config(saved_path)
    conflicts = resume_conflicts(saved, cfg)
    if "tokenizer" in conflicts and saved.tokenizer and same_tokenizer(saved.tokenizer, cfg.tokenizer,
                                                                       data_tokenizer_files):
        conflicts.remove("tokenizer")
    if conflicts and any(k in ("preset", "model") for k in conflicts):
        # --init-from would carry the saved model's weights and architecture under the new preset's name
        raise ValueError(f"resume: the model differs from the one saved in {saved_path} ({conflicts}); another "
                         f"model is a new run in another folder (nothing was overwritten): foxformer train --config "
                         f"{shlex.quote(saved_path)} --out NEW_DIR plus the changed flags")
    if conflicts:
        raise ValueError(f"resume: the config differs from the one saved in {saved_path} in {conflicts}; a resumed "
                         f"run must compute the same thing (nothing was overwritten). To go on from its weights with "
                         f"the new settings, start a new run: foxformer train --config {shlex.quote(saved_path)} "
                         f"--init-from {shlex.quote(weights)} --out NEW_DIR plus the changed flags")
