"""The training loop: one function for CPU, one GPU and torchrun (DDP / FSDP2), with exact resume.

Sample ``g`` of the run is ``TokenDataset.sample(g)``; step ``s`` uses samples ``[s*S, (s+1)*S)`` with
``S = batch_tokens / context``, split into contiguous slices per rank and micro-batch. Data order is thus a
function of the step alone, and a resumed run (same world size) reproduces the uninterrupted one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import sys
import time
from dataclasses import dataclass
from typing import Callable

import torch
from tqdm.auto import tqdm

from ..data.dataset import TokenDataset
from ..data.preparation import recorded_tokenizer_files
from ..data.tokenizer import moved_hint, tokenizer_files
from ..models.calls import hf_progress
from ..models.presets import attention_flops_per_token
from ..ops.forgetting_attn.checks import NonFiniteValueError
from ..paths import check_export_dir, check_output_dir, folder_lock
from ..progress import bars_shown
from ..provenance import code_version
from . import checkpoint as ckpt
from .config import TrainConfig, read_model_config, run_model_config, save_config, write_model_config
from .distributed import (DistInfo, all_reduce_sum, barrier, broadcast_object, failures_reported, full_state_dicts,
                          grad_sync, init_distributed, wrap_model)
from .divergence import diverged
from .export import export_hf
from .identity import CHECKSUM_MOD, batch_checksum, check_ranks_agree, data_identity
from .init_from import init_source, load_init_weights
from .metrics import MetricsSink, StepSpeed, device_peak_flops, eta_string, forget_gate_means, mfu
from .optim import build_optimizer, learning_rate
from .resume import check_saved_config, finished_summary, resolve_resume
from .sharded import (CheckpointWriter, ResumePoint, check_same_resume, check_shared_run_dir, checkpoint_group,
                      resolve_format)
from .stopping import StopSignals
from .summary import RunSummary
from .validation import autocast, evaluate

StepHook = Callable[[int, dict], None]


@dataclass
class Plan:
    """Batch geometry derived from the config and the world size."""

    seqs_per_step: int   # S, all ranks
    seqs_per_rank: int
    micro_batch: int     # sequences per forward
    accum: int           # micro-batches per step per rank


def make_plan(cfg: TrainConfig, world: int, device_type: str) -> Plan:
    seqs = cfg.batch_tokens // cfg.context
    if seqs % world:
        unit = world * cfg.context
        near = " or ".join(f"{n:,}" for n in (seqs // world * unit, (seqs // world + 1) * unit) if n)
        # batch_tokens may not change on resume (it is what a step computes): there, the process count is the fix
        counts = ", ".join(str(d) for d in range(1, seqs + 1) if seqs % d == 0)
        raise ValueError(f"batch_tokens: {cfg.batch_tokens:,} tokens = {seqs} sequences of {cfg.context} cannot be "
                         f"split evenly over {world} ranks: give {near} (multiples of {world} ranks x {cfg.context}), "
                         f"or launch a number of processes that divides {seqs} ({counts})")
    per_rank = seqs // world
    mbs = cfg.micro_batch_size
    if mbs == 0:  # largest divisor of per_rank within a token budget per forward
        budget = max(1, (32768 if device_type == "cuda" else 8192) // cfg.context)
        mbs = max(d for d in range(1, per_rank + 1) if per_rank % d == 0 and d <= budget)
    if per_rank % mbs:
        fits = ", ".join(str(d) for d in range(1, per_rank + 1) if per_rank % d == 0)
        raise ValueError(f"micro_batch_size: {mbs} does not divide the {per_rank} sequences per rank and step "
                         f"({seqs} sequences of {cfg.context} over {world} rank{'s' * (world > 1)}): give one that "
                         f"does ({fits}), or 0 to let the run choose")
    return Plan(seqs_per_step=seqs, seqs_per_rank=per_rank, micro_batch=mbs, accum=per_rank // mbs)


def build_model(cfg: TrainConfig, vocab_size: int, document_token: int | None = None, base: dict | None = None):
    """(model, its FoxConfig) for ``cfg``: its preset, or ``base`` (a whole FoxConfig's fields: the run's
    model_config.json, or the model init_from names), with the run's overrides (train.config.run_model_config);
    ``document_token``: the token between the data's documents (eos)."""
    from ..models import FoxForCausalLM

    # cfg.tokenizer is None while train() has not yet read it from the dataset's manifest
    model_cfg = run_model_config(cfg.preset, cfg.model, vocab_size=vocab_size, context=cfg.context,
                                 tokenizer=cfg.tokenizer, document_token=document_token, base=base)
    return FoxForCausalLM(model_cfg), model_cfg


def _set_activation_checkpointing(model: torch.nn.Module, enabled: bool) -> None:
    for module in model.modules():
        if hasattr(module, "gradient_checkpointing") and isinstance(module.gradient_checkpointing, bool):
            module.gradient_checkpointing = enabled


def _check_gradients_arrived(model: torch.nn.Module) -> None:
    """A run whose backward reaches no parameter would train for hours with a flat loss; stop at step 1."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    if trainable and all(p.grad is None for p in trainable):
        raise RuntimeError("no gradient reached any parameter in the first step (the loss is not connected to "
                           "the model); if --compile is on, retry without it and report the torch version")


def _announce(cfg: TrainConfig, n_params: int, train_tokens: int, restarted: bool = False) -> None:
    """One line on what a new run trains: a mistyped --out starts one with every default, which should show.
    ``restarted``: out_dir holds a run stopped before its first checkpoint, which starts again from step 0."""
    model = f"the weights of {cfg.init_from}" if cfg.init_from else cfg.preset
    length = f"{cfg.total_steps:,} step{'s' * (cfg.total_steps != 1)} ({cfg.total_steps * cfg.batch_tokens:,} tokens)"
    limit = f", at most {cfg.max_minutes:g} minutes" if cfg.max_minutes is not None else ""
    what = (f"{cfg.out_dir} has no checkpoint yet (stopped before its first), so it starts again from step 0"
            if restarted else f"new run in {cfg.out_dir}")
    tqdm.write(f"train: {what}: {model} ({n_params:,} parameters) on {cfg.data_dir}, context "
               f"{cfg.context}, {cfg.batch_tokens:,} tokens per step, {length}{limit}", file=sys.stderr)
    if cfg.warmup >= cfg.horizon_tokens:  # the rate never reached its peak (32Ki tokens with 1Mi of warm-up: 3%)
        tqdm.write(f"train: warning: the warm-up ({cfg.warmup:,} tokens) is as long as the schedule "
                   f"({cfg.horizon_tokens:,}): the learning rate never reaches {cfg.lr:g}; lower --warmup-tokens "
                   f"(default: a tenth of the schedule)", file=sys.stderr)
    if cfg.batch_tokens > train_tokens:  # the GPU-sized defaults on a small dataset: minutes per step, no progress
        tqdm.write(f"train: warning: one step holds {cfg.batch_tokens:,} tokens, more than the {train_tokens:,} of "
                   f"the training split of {cfg.data_dir} (each step reads it {cfg.batch_tokens / train_tokens:.1f} "
                   f"times over); lower --batch-tokens (and --context, now {cfg.context}, which it is a multiple "
                   f"of)", file=sys.stderr)


def train(cfg: TrainConfig, *, hook: StepHook | None = None, model_factory=None,
          signals: StopSignals | None = None) -> dict:
    """Run (or resume) training as configured; returns a summary dict (rank 0 has the full one).

    ``hook(step, record)`` runs after every optimizer step (tests use it to simulate crashes);
    ``model_factory(cfg, vocab_size) -> (model, model_cfg)`` replaces :func:`build_model`.
    While the run writes into out_dir, out_dir is locked: a second run on it fails at once. SIGTERM or SIGUSR1
    (train.stopping) stops it after the step in progress with a checkpoint: ``summary["stopped_by"]`` names it;
    ``signals``: the caller's StopSignals, entered (else the run installs its own while it runs).
    """
    check_output_dir(cfg.out_dir, "out_dir")
    ckpt.check_not_in_a_run(cfg.out_dir)
    ckpt.check_not_data_or_model(cfg.out_dir)
    if cfg.export_hf:  # before the training, not after it: the export replaces out_dir/hf whole
        check_export_dir(os.path.join(cfg.out_dir, "hf"), "out_dir/hf")
    info = init_distributed(cfg.device, cfg.parallel, cfg.dist_timeout_minutes)
    group = checkpoint_group(info, cfg.dist_timeout_minutes)
    fmt = resolve_format(cfg.checkpoint_format, info)
    # `held`: the lock on out_dir and the metric sinks, also when a step raises; it is left last, so the lock
    # outlives the writer, whose exit waits for a save in flight; then a failure is reported to the other ranks
    with contextlib.ExitStack() as held, failures_reported(info), \
            (StopSignals() if signals is None else contextlib.nullcontext(signals)) as stop, \
            CheckpointWriter(cfg.out_dir, info, fmt, cfg.checkpoint_async, cfg.keep_last, group) as writer:
        return _train(cfg, info, writer, held, stop, hook, model_factory)


def _stop_agreed(stop: StopSignals, device: torch.device) -> bool:
    """Whether any rank was asked to stop (every rank calls it at the same point, and all get the same answer)."""
    return bool(all_reduce_sum(torch.tensor(float(stop.requested), device=device)) > 0)


def _train(cfg: TrainConfig, info: DistInfo, writer: CheckpointWriter, held: contextlib.ExitStack,
           stop: StopSignals, hook: StepHook | None, model_factory) -> dict:
    device = info.device
    bf16 = cfg.precision == "bf16" or (cfg.precision == "auto" and device.type == "cuda")
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True

    # Validate everything that can fail before touching out_dir.
    train_ds = TokenDataset(cfg.data_dir, "train", cfg.context, roll=cfg.roll, seed=cfg.seed,
                            expect_tokenizer=cfg.tokenizer, length="context", data="data_dir", also=("val",))
    if cfg.tokenizer is None:  # the saved config names it, for evaluation and generation
        gone = moved_hint(train_ds.manifest["tokenizer"], recorded_tokenizer_files(train_ds.manifest))
        if gone:  # it would send them to a folder that is not there
            raise ValueError(f"data_dir: {cfg.data_dir!r} was tokenized with {train_ds.manifest['tokenizer']!r}, and "
                             f"{gone}")
        cfg = dataclasses.replace(cfg, tokenizer=train_ds.manifest["tokenizer"])
    # checked against the dataset's own tokenizer too: its folder may hold another one since, which the saved
    # config would send evaluation and generation to
    val_ds = TokenDataset(cfg.data_dir, "val", cfg.context, expect_tokenizer=cfg.tokenizer, length="context",
                          data="data_dir")
    data_id = data_identity(train_ds, val_ds)
    check_ranks_agree(cfg, data_id)
    plan = make_plan(cfg, info.world_size, device.type)
    try:
        resume_path = resolve_resume(cfg)
        check_same_resume(cfg.out_dir, resume_path, info, writer.group)
        check_saved_config(cfg, resume_path is not None, recorded_tokenizer_files(train_ds.manifest))
        loaded = ResumePoint(resume_path, info, writer.group) if resume_path else None  # verifies hashes first
    except ckpt.CheckpointError as e:
        raise ckpt.CheckpointError(f"{e}; resume from another checkpoint (--resume RUN/checkpoints/step_N), or start "
                                   f"a new run in another out_dir") from None
    # (fields, weights) of the model the run starts from; a resumed run has its own in the checkpoint
    source = init_source(cfg, train_ds.manifest) if cfg.init_from is not None and loaded is None else None
    vocab_size = source[0]["vocab_size"] if source else (
        cfg.vocab_size or int(math.ceil(train_ds.manifest["vocab_size"] / 64) * 64))
    if vocab_size < train_ds.manifest["vocab_size"]:
        raise ValueError(f"vocab_size: {vocab_size} is smaller than the dataset tokenizer's "
                         f"{train_ds.manifest['vocab_size']} ids")
    # data_dir may change on resume (moved data); what it holds may not (checkpoints before this have no "data")
    if loaded is not None and loaded.state.get("data", data_id) != data_id:
        raise ValueError(f"resume: {cfg.data_dir!r} holds another dataset than the one {resume_path} was trained "
                         f"on; a resumed run must see the same data. Use the original data or another out_dir "
                         f"(nothing was overwritten)")
    if loaded is not None and int(loaded.state["step"]) >= cfg.total_steps:
        return finished_summary(cfg, info, int(loaded.state["step"]), int(loaded.state["tokens"]), resume_path)

    torch.manual_seed(cfg.seed)  # identical initial weights on every rank
    if model_factory is None:
        # a resumed run's own record of its model, else the model it starts from, else its preset
        base = read_model_config(cfg.out_dir) if loaded is not None else (source[0] if source else None)
        model, model_cfg = build_model(cfg, vocab_size, train_ds.eot_id, base)
        if source:
            load_init_weights(model, source[1], cfg)
            source = None  # the weights are in the model; drop the copy
            if info.is_main:
                tqdm.write(f"init_from: starting from the weights and config of {cfg.init_from} "
                           f"({model_cfg.num_layers} layers, width {model_cfg.hidden_size}; no preset)")
    else:
        model, model_cfg = model_factory(cfg, vocab_size)
    _set_activation_checkpointing(model, cfg.activation_checkpointing)
    model.to(device)
    n_params = sum(p.numel() for p in model.parameters())
    n_nonemb = getattr(model, "num_parameters_non_embedding", lambda: n_params)()
    flops_per_token = 3.0 * (2 * n_nonemb + attention_flops_per_token(model_cfg, cfg.context))
    # fp32 training runs its matmuls on TF32 tensor cores (allow_tf32 above): MFU against that peak.
    peak = cfg.peak_flops or device_peak_flops(device, "bf16" if bf16 else "tf32")

    wrapped = wrap_model(model, info, bf16)
    optimizer = build_optimizer(model, cfg, device.type)
    step, tokens = 0, 0
    if loaded is not None:
        loaded.restore(model, optimizer)
        ckpt.set_rng_state(loaded.rng)
        # The data order depends on the step only, so a run may resume on another number of ranks.
        step, tokens = int(loaded.state["step"]), int(loaded.state["tokens"])
    # `wrapped` controls gradient sync (DDP / FSDP2 methods); `runner` is what the micro-batches call.
    runner = torch.compile(wrapped) if cfg.compile else wrapped
    loss_kwargs = {"return_logits": False} if cfg.fused_loss else {}

    derived = {"world_size": info.world_size, "parallel": info.mode, "device": str(device), "bf16": bf16,
               "vocab_size": vocab_size, "micro_batch_size": plan.micro_batch, "grad_accum": plan.accum,
               "seqs_per_step": plan.seqs_per_step, "total_steps": cfg.total_steps, "warmup_tokens": cfg.warmup,
               "horizon_tokens": cfg.horizon_tokens, "params": n_params, "non_embedding_params": n_nonemb,
               "flops_per_token": flops_per_token, "peak_flops": peak, "document_token": train_ds.eot_id,
               "commit": code_version()}
    folder_files = tokenizer_files(cfg.tokenizer)
    if folder_files:  # the folder's content: evaluation accepts the same tokenizer moved elsewhere by it
        derived["tokenizer_files"] = folder_files
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
        if loaded is not None:  # resume=<older checkpoint>: newer step folders must not win over this lineage
            for moved in ckpt.adopt_checkpoint(cfg.out_dir, resume_path, step):
                tqdm.write(f"resume: {moved} is newer than {resume_path} and was set aside (not resumed from)")
        # a config.yaml without a checkpoint: the run was stopped before its first one
        restarted = loaded is None and os.path.isfile(os.path.join(cfg.out_dir, "config.yaml"))
        save_config(cfg, os.path.join(cfg.out_dir, "config.yaml"), derived)
        if hasattr(model_cfg, "to_dict"):  # loading and export rebuild the model from it, not from the preset
            write_model_config(cfg.out_dir, model_cfg)
        sink = MetricsSink(cfg.out_dir, step, cfg.tensorboard)
        held.callback(sink.close)
        sink.write({"kind": "start", "step": step, "tokens": tokens, "resumed_from": resume_path, **derived})
        if loaded is None:
            _announce(cfg, n_params, train_ds.tokens.size, restarted)
    barrier()

    ckpt_every = cfg.checkpoint_every_tokens or max(cfg.batch_tokens, cfg.horizon_tokens // 10)
    eval_every = cfg.eval_every_tokens or max(2 * cfg.batch_tokens, cfg.horizon_tokens // 10)
    eval_tokens = cfg.eval_tokens or (2**18 if device.type == "cuda" else 2**13)
    eval_seqs = max(1, eval_tokens // cfg.context)

    def save(at_step: int) -> None:
        with ckpt.write_errors(cfg.out_dir, at_step):
            writer.save(at_step, model, optimizer, {"tokens": tokens, "world_size": info.world_size,
                                                    "seqs_per_rank": plan.seqs_per_rank, "data": data_id})

    def run_eval() -> dict:
        try:
            with forget_gate_means(model) as gates:
                loss, _ = evaluate(model, val_ds, eval_seqs, plan.micro_batch, info, bf16, gates)
        except NonFiniteValueError as e:
            raise diverged(cfg, step, f"the validation forward pass overflowed ({e})") from None
        if not math.isfinite(loss):  # a model that gives NaN on held-out text is no checkpoint to keep
            raise diverged(cfg, step, f"the validation loss is {loss:g}")
        rec = {"kind": "eval", "step": step, "tokens": tokens, "val_loss": loss}
        log_f = gates.result(all_reduce_sum)
        if log_f is not None:  # [layers][heads]: the gates' course over training (eval compare's training.png)
            rec["gate_log_f"] = log_f
        if sink is not None:
            sink.write(rec)
        return rec

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
        lr = learning_rate(tokens + cfg.batch_tokens, cfg)
        for group in optimizer.param_groups:
            group["lr"] = lr
        loss_sum = torch.zeros((), device=device)
        base = step * plan.seqs_per_step + info.rank * plan.seqs_per_rank
        crc = 0
        for m in range(plan.accum):
            x = train_ds.batch(base + m * plan.micro_batch, plan.micro_batch)
            crc = (crc + batch_checksum(x, base + m * plan.micro_batch - step * plan.seqs_per_step)) % CHECKSUM_MOD
            x = x.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else x
            try:
                with grad_sync(wrapped, info, sync=m == plan.accum - 1), autocast(device, bf16):
                    loss = runner(x, labels=x, **loss_kwargs).loss
                (loss / plan.accum).backward()
            except NonFiniteValueError as e:  # the attention ops' value check, before the loss could show it
                raise diverged(cfg, step + 1, f"the forward pass overflowed ({e})") from None
            loss_sum += loss.detach()
        if step == start_step:
            _check_gradients_arrived(model)
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip if cfg.grad_clip > 0 else 1e30)
        if hasattr(grad_norm, "full_tensor"):
            grad_norm = grad_norm.full_tensor()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        tokens += cfg.batch_tokens
        # one collective for the loss, the data checksum (< 2^31 per rank: their sum is exact in float64) and the
        # ranks asked to stop, so that all stop after this step together (a rank that stopped alone would leave
        # the others waiting in the next step's collectives)
        summed = all_reduce_sum(torch.stack([loss_sum.double() / plan.accum,
                                             torch.tensor(float(crc), dtype=torch.float64, device=device),
                                             torch.tensor(float(stop.requested), dtype=torch.float64, device=device)]))
        loss_val, data_crc = float(summed[0]) / info.world_size, int(round(float(summed[1]))) % CHECKSUM_MOD
        stopped = float(summed[2]) > 0
        dt = time.time() - t0
        tps = cfg.batch_tokens / dt
        speed.add(tps)
        step_mfu = mfu(tps, flops_per_token, peak, info.world_size)
        elapsed = time.time() - start_time
        last_rec = {"kind": "train", "step": step, "tokens": tokens, "loss": loss_val, "data_crc": data_crc, "lr": lr,
                    "grad_norm": float(grad_norm), "tokens_per_s": tps, "mfu": step_mfu, "step_time_s": dt,
                    "elapsed_s": elapsed}
        # the gradient too: a finite loss over a NaN gradient saved NaN weights as the latest checkpoint
        if not (math.isfinite(loss_val) and math.isfinite(last_rec["grad_norm"])):
            raise diverged(cfg, step, f"the loss is {loss_val:g} and the gradient norm {last_rec['grad_norm']:g} "
                                       f"at lr {lr:.3g}")
        eta = speed.eta((cfg.total_steps - step) * cfg.batch_tokens)
        if sink is not None:
            sink.write(last_rec)
            bar.update(1)
            bar.set_postfix(loss=f"{loss_val:.3f}", tok_s=f"{tps:,.0f}", refresh=False)
            if step % cfg.log_every == 0 or step == 1 or step == cfg.total_steps:
                tqdm.write(f"step {step}/{cfg.total_steps} tokens {tokens:,} loss {loss_val:.4f} lr {lr:.2e} "
                           f"tok/s {tps:,.0f} MFU {'n/a' if step_mfu is None else f'{100 * step_mfu:.1f}%'} "
                           f"ETA {eta_string(eta)}")
        time_up = cfg.max_minutes is not None and elapsed > 60 * cfg.max_minutes
        time_up = bool(broadcast_object(time_up))  # every rank stops at the same step
        finished = step >= cfg.total_steps or time_up
        if tokens // eval_every != (tokens - cfg.batch_tokens) // eval_every or finished:
            last_eval = run_eval()
            if sink is not None:
                tqdm.write(f"step {step} val_loss {last_eval['val_loss']:.4f}")
        # a stop on a signal saves at once: the scheduler kills the job seconds later (the step's periodic
        # evaluation, if due, ran above: the resumed run starts after it)
        if tokens // ckpt_every != (tokens - cfg.batch_tokens) // ckpt_every or finished or stopped:
            save(step)
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
        last_eval = run_eval()
    hf_dir = None
    if cfg.export_hf and hasattr(model_cfg, "to_dict") and not stopped:
        msd, _ = full_state_dicts(model, optimizer, info)
        if info.is_main:
            with hf_progress(cfg.progress):
                hf_dir = export_hf(model_cfg, msd, os.path.join(cfg.out_dir, "hf"), run_dir=cfg.out_dir)
        barrier()
    wall = time.time() - start_time
    summary = RunSummary(
        out_dir=cfg.out_dir, step=step, tokens=tokens, train_loss=last_rec.get("loss"),
        val_loss=last_eval.get("val_loss"), tokens_per_s=(tokens - start_tokens) / wall if wall else None,
        resumed_from=resume_path, hf_dir=hf_dir, params=n_params, non_embedding_params=n_nonemb,
        world_size=info.world_size, parallel=info.mode, device=str(device), wall_s=wall,
        time_limit=time_up and step < cfg.total_steps, stopped_by=stop.name if stopped else None,
        trained=step > start_step).to_dict()
    if sink is not None:
        sink.write({"kind": "end", "step": step, "tokens": tokens, **{k: v for k, v in summary.items()
                                                                      if isinstance(v, (int, float))}})
    return summary
