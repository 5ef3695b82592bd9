"""The training loop: one function for CPU, one GPU and torchrun (DDP / FSDP2), with exact resume.

Sample ``g`` of the run is ``TokenDataset.sample(g)``; step ``s`` uses samples ``[s*S, (s+1)*S)`` with
``S = batch_tokens / context``, split into contiguous slices per rank and micro-batch. Data order is thus a
function of the step alone, and a resumed run (same world size) reproduces the uninterrupted one.

Here: the run's out_dir and metrics, the steps' cadence (logging, evaluation, checkpoints, stopping) and its
end; train.setup builds what it trains, train.step takes one optimizer step.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import time
from dataclasses import dataclass
from typing import Callable

import torch
from tqdm.auto import tqdm

from ..data.tokenizer import tokenizer_files
from ..models.calls import hf_progress
from ..models.presets import attention_flops_per_token
from ..paths import check_export_dir, check_output_dir, folder_lock
from ..progress import bars_shown
from ..provenance import code_version
from . import checkpoint as ckpt
from .config import TrainConfig, save_config, write_model_config
from .distributed import (DistInfo, all_reduce_sum, barrier, broadcast_object, failures_reported, full_state_dicts,
                          init_distributed, start_process_group)
from .divergence import diverged
from .export import export_hf
from .identity import CHECKSUM_MOD
from .metrics import MetricsSink, StepSpeed, device_peak_flops, eta_string, mfu
from .plan import Plan, make_plan
from .resume import finished_summary
from .setup import RunData, RunInputs, RunSetup, build_model, build_run, read_data, read_inputs
from .sharded import CheckpointWriter, check_shared_run_dir, checkpoint_group, resolve_format
from .step import train_step
from .stopping import StopSignals
from .summary import RunSummary
from .validation import validation_record

# Plan, make_plan and build_model live in train.plan and train.setup; tests and callers import them from here
__all__ = ["Plan", "StepHook", "build_model", "make_plan", "train"]

StepHook = Callable[[int, dict], None]


def _time_limit(cfg: TrainConfig) -> str:
    minutes = cfg.max_minutes
    return f", at most {minutes:g} minute{'s' * (minutes != 1)}" if minutes is not None else ""


def _announce(cfg: TrainConfig, n_params: int, train_tokens: int, restarted: bool = False,
              longest_doc: int | None = None) -> None:
    """One line on what a new run trains: a mistyped --out starts one with every default, which should show.
    ``restarted``: out_dir holds a run stopped before its first checkpoint, which starts again from step 0.
    ``longest_doc``: the text tokens of the training split's longest document."""
    model = f"the weights of {cfg.init_from}" if cfg.init_from else cfg.preset
    length = f"{cfg.total_steps:,} step{'s' * (cfg.total_steps != 1)} ({cfg.total_steps * cfg.batch_tokens:,} tokens)"
    what = (f"{cfg.out_dir} has no checkpoint yet (stopped before its first), so it starts again from step 0"
            if restarted else f"new run in {cfg.out_dir}")
    tqdm.write(f"train: {what}: {model} ({n_params:,} parameters) on {cfg.data_dir}, context "
               f"{cfg.context}, {cfg.batch_tokens:,} tokens per step, {length}{_time_limit(cfg)}", file=sys.stderr)
    if cfg.warmup >= cfg.horizon_tokens:  # the rate never reached its peak (32Ki tokens with 1Mi of warm-up: 3%)
        tqdm.write(f"train: warning: the warm-up ({cfg.warmup:,} tokens) is as long as the schedule "
                   f"({cfg.horizon_tokens:,}): the learning rate never reaches {cfg.lr:g}; lower --warmup-tokens "
                   f"(default: a tenth of the schedule)", file=sys.stderr)
    if cfg.batch_tokens > train_tokens:  # the GPU-sized defaults on a small dataset: minutes per step, no progress
        tqdm.write(f"train: warning: one step holds {cfg.batch_tokens:,} tokens, more than the {train_tokens:,} of "
                   f"the training split of {cfg.data_dir} (each step reads it {cfg.batch_tokens / train_tokens:.1f} "
                   f"times over); lower --batch-tokens (and --context, now {cfg.context}, which it is a multiple "
                   f"of)", file=sys.stderr)
    if longest_doc is not None and longest_doc < cfg.context:
        # `--context 16Ki` on short files trained without a word; `eval loss --within-docs` refuses such a length
        tqdm.write(f"train: note: no document of the training split is as long as the context ({cfg.context:,} "
                   f"tokens; the longest has {longest_doc:,}): each sequence strings several documents together, so "
                   f"the model never sees one document's text further back than that; for long-context training, "
                   f"give longer documents (or a --context of at most {longest_doc:,})", file=sys.stderr)


def _announce_resume(cfg: TrainConfig, resume_path: str, step: int, tokens: int) -> None:
    """One line on where a resumed run goes on from: the CLI's "continuing RUN with its config.yaml" named no step
    or checkpoint, and nothing more was said before the first logged step, log_every steps later."""
    left = cfg.total_steps - step
    tqdm.write(f"train: resuming {cfg.out_dir} from {resume_path}: step {step:,} of {cfg.total_steps:,} "
               f"({tokens:,} tokens trained), {left:,} step{'s' * (left != 1)} to go{_time_limit(cfg)}",
               file=sys.stderr)


def train(cfg: TrainConfig, *, hook: StepHook | None = None, model_factory=None,
          signals: StopSignals | None = None) -> dict:
    """Run (or resume) training as configured; returns a summary dict (rank 0 has the full one).

    ``hook(step, record)`` runs after every optimizer step (tests use it to simulate crashes);
    ``model_factory(cfg, vocab_size) -> (model, model_cfg)`` replaces :func:`build_model`.
    While the run writes into out_dir, out_dir is locked: a second run on it fails at once. SIGTERM or SIGUSR1
    (train.stopping) stops it after the step in progress with a checkpoint: ``summary["stopped_by"]`` names it;
    ``signals``: the caller's StopSignals, entered (else the run installs its own while it runs).
    """
    info = init_distributed(cfg.device, cfg.parallel, cfg.dist_timeout_minutes)
    with (StopSignals() if signals is None else contextlib.nullcontext(signals)) as stop:
        # each rank's own checks, before the process group: a setting's error stops every rank at once, and a
        # rank that fails alone (a file on its host) stops the others with its message
        with failures_reported(info):
            check_output_dir(cfg.out_dir, "out_dir")
            ckpt.check_not_in_a_run(cfg.out_dir)
            ckpt.check_not_data_or_model(cfg.out_dir)
            if cfg.export_hf:  # before the training, not after it: the export replaces out_dir/hf whole
                check_export_dir(os.path.join(cfg.out_dir, "hf"), "out_dir/hf")
            data = read_data(cfg, info)
            start_process_group(info, cfg.dist_timeout_minutes, stop)
        group = checkpoint_group(info, cfg.dist_timeout_minutes)
        fmt = resolve_format(cfg.checkpoint_format, info)
        # `held`: the lock on out_dir and the metric sinks, also when a step raises; it is left last, so the lock
        # outlives the writer, whose exit waits for a save in flight; then a failure is reported to the other ranks
        with contextlib.ExitStack() as held, failures_reported(info), \
                CheckpointWriter(cfg.out_dir, info, fmt, cfg.checkpoint_async, cfg.keep_last, group) as writer:
            return _train(data, info, writer, held, stop, hook, model_factory)


def _stop_agreed(stop: StopSignals, device: torch.device) -> bool:
    """Whether any rank was asked to stop (every rank calls it at the same point, and all get the same answer)."""
    return bool(all_reduce_sum(torch.tensor(float(stop.requested), device=device)) > 0)


@dataclass(frozen=True)
class _Cadence:
    """Every how many tokens the run validates and saves, and on how many sequences it validates."""

    batch_tokens: int
    ckpt_every: int
    eval_every: int
    eval_seqs: int

    @classmethod
    def of(cls, cfg: TrainConfig, device: torch.device) -> "_Cadence":
        eval_tokens = cfg.eval_tokens or (2**18 if device.type == "cuda" else 2**13)
        return cls(cfg.batch_tokens, cfg.checkpoint_every_tokens or max(cfg.batch_tokens, cfg.horizon_tokens // 10),
                   cfg.eval_every_tokens or max(2 * cfg.batch_tokens, cfg.horizon_tokens // 10),
                   max(1, eval_tokens // cfg.context))

    def crossed(self, tokens: int, every: int) -> bool:
        """Whether the step that ended at ``tokens`` crossed a multiple of ``every``."""
        return tokens // every != (tokens - self.batch_tokens) // every


def _train(data: RunData, info: DistInfo, writer: CheckpointWriter, held: contextlib.ExitStack,
           stop: StopSignals, hook: StepHook | None, model_factory) -> dict:
    inputs = read_inputs(data, info, writer)
    cfg, plan, device, bf16 = inputs.cfg, inputs.plan, info.device, inputs.bf16
    if inputs.finished:
        state = inputs.loaded.state
        return finished_summary(cfg, info, int(state["step"]), int(state["tokens"]), inputs.resume_path)
    run = build_run(inputs, info, model_factory)
    model, optimizer, step, tokens = run.model, run.optimizer, run.step, run.tokens
    flops_per_token = 3.0 * (2 * run.n_nonemb + attention_flops_per_token(run.model_cfg, cfg.context))
    # fp32 training runs its matmuls on TF32 tensor cores (allow_tf32 in read_inputs): MFU against that peak.
    peak = cfg.peak_flops or device_peak_flops(device, "bf16" if bf16 else "tf32")
    sink = _open_out_dir(cfg, info, writer, held, inputs, run, _derived(cfg, info, inputs, run, flops_per_token, peak))
    cadence = _Cadence.of(cfg, device)

    time_up = False
    # a stop asked for while the run loaded: its checkpoint (if any) is where it stands, no step is needed
    stopped = _stop_agreed(stop, device)
    # off a terminal the step lines on stdout every log_every steps are the progress
    bar = tqdm(total=cfg.total_steps, initial=step, desc="train", unit="step",
               disable=not bars_shown(info.is_main and cfg.progress))
    start_time, start_tokens, start_step = time.time(), tokens, step
    last_rec: dict = {}
    last_eval: dict = {}
    speed = StepSpeed()
    model.train()
    while step < cfg.total_steps and not stopped:
        t0 = time.time()
        done = train_step(run.runner, run.wrapped, model, optimizer, inputs.train_ds, plan, step, tokens, info, bf16,
                          run.loss_kwargs, cfg, first=step == start_step)
        step += 1
        tokens += cfg.batch_tokens
        loss_val, data_crc, stopped = _agree(done, plan, stop, info)
        dt = time.time() - t0
        tps = cfg.batch_tokens / dt
        speed.add(tps)
        elapsed = time.time() - start_time
        last_rec = {"kind": "train", "step": step, "tokens": tokens, "loss": loss_val, "data_crc": data_crc,
                    "lr": done.lr, "grad_norm": float(done.grad_norm), "tokens_per_s": tps,
                    "mfu": mfu(tps, flops_per_token, peak, info.world_size), "step_time_s": dt, "elapsed_s": elapsed}
        # the gradient too: a finite loss over a NaN gradient saved NaN weights as the latest checkpoint
        if not (math.isfinite(loss_val) and math.isfinite(last_rec["grad_norm"])):
            raise diverged(cfg, step, f"the loss is {loss_val:g} and the gradient norm {last_rec['grad_norm']:g} "
                                       f"at lr {done.lr:.3g}")
        if sink is not None:
            sink.write(last_rec)
            _show_step(cfg, bar, last_rec, speed.eta((cfg.total_steps - step) * cfg.batch_tokens))
        time_up = cfg.max_minutes is not None and elapsed > 60 * cfg.max_minutes
        time_up = bool(broadcast_object(time_up))  # every rank stops at the same step
        finished = step >= cfg.total_steps or time_up
        if cadence.crossed(tokens, cadence.eval_every) or finished:
            last_eval = _validate(cfg, info, inputs, model, step, tokens, cadence.eval_seqs, sink)
            if sink is not None:
                tqdm.write(f"step {step} val_loss {last_eval['val_loss']:.4f}")
        # a stop on a signal saves at once: the scheduler kills the job seconds later (the step's periodic
        # evaluation, if due, ran above: the resumed run starts after it)
        if cadence.crossed(tokens, cadence.ckpt_every) or finished or stopped:
            with ckpt.write_errors(cfg.out_dir, step):
                writer.save(step, model, optimizer, {"tokens": tokens, "world_size": info.world_size,
                                                     "seqs_per_rank": plan.seqs_per_rank, "data": inputs.data_id})
        if hook is not None:
            hook(step, last_rec)
        if time_up:
            break
    bar.close()
    stopped = stopped and step < cfg.total_steps  # a stop asked for in the last step: the run is finished
    if stopped:
        writer.wait()  # an asynchronous save's commit: the note on where the run stopped names that checkpoint
        stop.done()

    if not stopped and not last_eval:  # no step taken (a finished run returned before): still report validation
        last_eval = _validate(cfg, info, inputs, model, step, tokens, cadence.eval_seqs, sink)
    hf_dir = _export(cfg, info, run) if cfg.export_hf and hasattr(run.model_cfg, "to_dict") and not stopped else None
    wall = time.time() - start_time
    summary = RunSummary(
        out_dir=cfg.out_dir, step=step, tokens=tokens, train_loss=last_rec.get("loss"),
        val_loss=last_eval.get("val_loss"), tokens_per_s=(tokens - start_tokens) / wall if wall else None,
        resumed_from=inputs.resume_path, hf_dir=hf_dir, params=run.n_params, non_embedding_params=run.n_nonemb,
        world_size=info.world_size, parallel=info.mode, device=str(device), wall_s=wall,
        time_limit=time_up and step < cfg.total_steps, stopped_by=stop.name if stopped else None,
        trained=step > start_step).to_dict()
    if sink is not None:
        sink.write({"kind": "end", "step": step, "tokens": tokens, **{k: v for k, v in summary.items()
                                                                      if isinstance(v, (int, float))}})
    return summary


def _agree(done, plan: Plan, stop: StopSignals, info: DistInfo) -> tuple[float, int, bool]:
    """The step's mean loss over ranks, its data checksum and whether any rank was asked to stop.

    One collective for the three, so that all ranks stop after this step together (a rank that stopped alone would
    leave the others waiting in the next step's collectives); each rank's checksum is < 2^31, so their float64 sum
    is exact."""
    device = info.device
    summed = all_reduce_sum(torch.stack([done.loss_sum.double() / plan.accum,
                                         torch.tensor(float(done.crc), dtype=torch.float64, device=device),
                                         torch.tensor(float(stop.requested), dtype=torch.float64, device=device)]))
    return (float(summed[0]) / info.world_size, int(round(float(summed[1]))) % CHECKSUM_MOD,
            float(summed[2]) > 0)


def _show_step(cfg: TrainConfig, bar, rec: dict, eta: float | None) -> None:
    """The progress bar's step, and every log_every steps (and the first and last) a line with the figures."""
    bar.update(1)
    bar.set_postfix(loss=f"{rec['loss']:.3f}", tok_s=f"{rec['tokens_per_s']:,.0f}", refresh=False)
    step, step_mfu = rec["step"], rec["mfu"]
    if step % cfg.log_every == 0 or step == 1 or step == cfg.total_steps:
        tqdm.write(f"step {step}/{cfg.total_steps} tokens {rec['tokens']:,} loss {rec['loss']:.4f} lr {rec['lr']:.2e} "
                   f"tok/s {rec['tokens_per_s']:,.0f} MFU {'n/a' if step_mfu is None else f'{100 * step_mfu:.1f}%'} "
                   f"ETA {eta_string(eta)}")


def _derived(cfg: TrainConfig, info: DistInfo, inputs: RunInputs, run: RunSetup, flops_per_token: float,
             peak: float | None) -> dict:
    """What the run derived from its config and machine, saved beside the config and in the "start" record."""
    plan = inputs.plan
    derived = {"world_size": info.world_size, "parallel": info.mode, "device": str(info.device), "bf16": inputs.bf16,
               "vocab_size": inputs.vocab_size, "micro_batch_size": plan.micro_batch, "grad_accum": plan.accum,
               "seqs_per_step": plan.seqs_per_step, "total_steps": cfg.total_steps, "warmup_tokens": cfg.warmup,
               "horizon_tokens": cfg.horizon_tokens, "params": run.n_params, "non_embedding_params": run.n_nonemb,
               "flops_per_token": flops_per_token, "peak_flops": peak, "document_token": inputs.train_ds.eot_id,
               "commit": code_version()}
    folder_files = tokenizer_files(cfg.tokenizer)
    if folder_files:  # the folder's content: evaluation accepts the same tokenizer moved elsewhere by it
        derived["tokenizer_files"] = folder_files
    return derived


def _open_out_dir(cfg: TrainConfig, info: DistInfo, writer: CheckpointWriter, held: contextlib.ExitStack,
                  inputs: RunInputs, run: RunSetup, derived: dict) -> MetricsSink | None:
    """Lock out_dir, write the run's config and start its metrics; rank 0's sink (None on the other ranks)."""
    sink = None
    # Rank 0 holds the lock for the whole job; the others learn at once when it could not (no rank waits at a
    # barrier for a peer that already stopped).
    busy = None
    if info.is_main:
        try:
            held.enter_context(folder_lock(cfg.out_dir, "out_dir"))  # creates out_dir
        except ValueError as e:
            busy = str(e)
    busy = broadcast_object(busy)
    if busy:
        raise ValueError(busy)
    check_shared_run_dir(cfg.out_dir, info, writer.group)
    if info.is_main:
        loaded, resume_path = inputs.loaded, inputs.resume_path
        if loaded is not None:  # resume=<older checkpoint>: newer step folders must not win over this lineage
            for moved in ckpt.adopt_checkpoint(cfg.out_dir, resume_path, run.step):
                tqdm.write(f"resume: {moved} is newer than {resume_path} and was set aside (not resumed from)")
        # a config.yaml without a checkpoint: the run was stopped before its first one
        restarted = loaded is None and os.path.isfile(os.path.join(cfg.out_dir, "config.yaml"))
        save_config(cfg, os.path.join(cfg.out_dir, "config.yaml"), derived)
        if hasattr(run.model_cfg, "to_dict"):  # loading and export rebuild the model from it, not from the preset
            write_model_config(cfg.out_dir, run.model_cfg)
        sink = MetricsSink(cfg.out_dir, run.step, cfg.tensorboard)
        held.callback(sink.close)
        sink.write({"kind": "start", "step": run.step, "tokens": run.tokens, "resumed_from": resume_path, **derived})
        if loaded is None:
            _announce(cfg, run.n_params, inputs.train_ds.tokens.size, restarted,
                      inputs.train_ds.longest_document)
        else:
            _announce_resume(cfg, resume_path, run.step, run.tokens)
    barrier()
    return sink


def _validate(cfg: TrainConfig, info: DistInfo, inputs: RunInputs, model: torch.nn.Module, step: int, tokens: int,
              n_seqs: int, sink: MetricsSink | None) -> dict:
    rec = validation_record(model, inputs.val_ds, n_seqs, inputs.plan.micro_batch, info, inputs.bf16, cfg, step,
                            tokens)
    if sink is not None:
        sink.write(rec)
    return rec


def _export(cfg: TrainConfig, info: DistInfo, run: RunSetup) -> str | None:
    """out_dir/hf from the trained weights (gathered from every rank; rank 0 writes it)."""
    hf_dir = None
    msd, _ = full_state_dicts(run.model, run.optimizer, info)
    if info.is_main:
        with hf_progress(cfg.progress):
            hf_dir = export_hf(run.model_cfg, msd, os.path.join(cfg.out_dir, "hf"), run_dir=cfg.out_dir)
    barrier()
    return hf_dir
