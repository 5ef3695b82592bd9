"""The training loop: one function for CPU, one GPU and torchrun (DDP / FSDP2), with exact resume.

Sample ``g`` of the run is ``TokenDataset.sample(g)``; step ``s`` uses samples ``[s*S, (s+1)*S)`` with
``S = batch_tokens / context``, split into contiguous slices per rank and micro-batch. Data order is thus a
function of the step alone, and a resumed run (same world size) reproduces the uninterrupted one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import math
import os
import shlex
import sys
import time
import zlib
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
from tqdm.auto import tqdm

from ..data.dataset import TokenDataset
from ..data.preparation import recorded_tokenizer_files
from ..data.tokenizer import moved_hint, same_tokenizer, tokenizer_files
from ..models.calls import hf_progress
from ..models.presets import attention_flops_per_token
from ..ops.forgetting_attn.checks import NonFiniteValueError
from ..paths import check_export_dir, check_output_dir, export_writer, folder_lock
from ..progress import bars_shown
from ..provenance import code_version
from . import checkpoint as ckpt
from .card import training_facts
from .config import (TrainConfig, config_fields, read_model_config, read_saved_config, run_model_config,
                     resume_conflicts, save_config, write_model_config)
from .distributed import (DistInfo, all_reduce_sum, barrier, broadcast_object, failures_reported, full_state_dicts,
                          gather_objects, grad_sync, init_distributed, wrap_model)
from .metrics import (GateMeans, MetricsSink, StepSpeed, device_peak_flops, eta_string, forget_gate_means, mfu,
                      read_metrics)
from .optim import build_optimizer, learning_rate
from .sharded import (CheckpointWriter, ResumePoint, check_same_resume, check_shared_run_dir, checkpoint_group,
                      resolve_format)
from .stopping import StopSignals
from .summary import RunSummary

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


def _init_source(cfg: TrainConfig, manifest: dict) -> tuple[dict, dict]:
    """(FoxConfig fields, state dict) of the model ``cfg.init_from`` names, checked against the run's data."""
    from ..models import FoxForCausalLM
    from .loading import load_model

    try:
        loaded = load_model(cfg.init_from, device="cpu", dtype=torch.float32, progress=False)
    except ValueError as e:
        raise ValueError(f"init_from: {e}") from None
    model = loaded.model
    _check_same_weights(cfg.init_from, model.state_dict(), loaded.step)
    if not isinstance(model, FoxForCausalLM):
        raise ValueError(f"init_from: {cfg.init_from!r} holds a {type(model).__name__}; foxformer trains "
                         f"FoxForCausalLM models (foxformer convert official turns the paper's checkpoints into one)")
    fields = config_fields(model.config)
    # the machine decides these, not the model's origin
    fields.update(attention_backend="auto", gradient_checkpointing=False)
    data_tok, its_tok = manifest["tokenizer"], fields["tokenizer"]
    if its_tok is not None and not same_tokenizer(data_tok, its_tok, recorded_tokenizer_files(manifest)):
        raise ValueError(f"init_from: the model reads {its_tok!r} tokens but {cfg.data_dir!r} was tokenized with "
                         f"{data_tok!r}; prepare the data again with --tokenizer {its_tok}")
    if fields["vocab_size"] < manifest["vocab_size"]:
        raise ValueError(f"init_from: the model has {fields['vocab_size']} token ids, fewer than the "
                         f"{manifest['vocab_size']} of {cfg.data_dir!r}'s tokenizer {data_tok!r}")
    if cfg.vocab_size is not None and cfg.vocab_size != fields["vocab_size"]:
        raise ValueError(f"vocab_size: {cfg.vocab_size} given, but the model init_from names has "
                         f"{fields['vocab_size']}; leave vocab_size unset")
    ratio = cfg.model.get("mlp_ratio")
    if (ratio is not None and fields.get("intermediate_size") is not None and "intermediate_size" not in cfg.model
            and ratio != fields.get("mlp_ratio")):
        # the model's explicit intermediate_size wins over an mlp_ratio, which would be recorded and never read
        raise ValueError(f"init_from: model.mlp_ratio={ratio!r} cannot apply: the MLP of the model init_from names is "
                         f"{fields['intermediate_size']} wide, and its weights have that width; leave mlp_ratio out")
    return fields, model.state_dict()


def _weights_identity(state_dict: dict) -> str:
    """A fingerprint of a state dict's contents: names, shapes and a strided sample of each tensor (a few MiB of
    reads even for billions of parameters; any two training steps differ throughout)."""
    h = hashlib.sha256()
    for name in sorted(state_dict):
        flat = state_dict[name].detach().reshape(-1)
        h.update(f"{name}:{tuple(state_dict[name].shape)}".encode())
        h.update(flat[::max(1, flat.numel() // 4096)].to(torch.float64).numpy().tobytes())
    return h.hexdigest()[:16]


def _check_same_weights(init_from: str, state_dict: dict, step: int | None) -> None:
    """Each rank reads init_from itself, and FSDP2 keeps each rank's shard of what that rank read: a run that
    committed a checkpoint while the ranks read it (or another folder of that name on each host) trained a mix
    of two models without a word."""
    ranks = gather_objects((_weights_identity(state_dict), step))
    other = next((r for r, (identity, _) in enumerate(ranks) if identity != ranks[0][0]), None)
    if other is None:
        return
    steps = (f" (rank 0 read the checkpoint of step {ranks[0][1]}, rank {other} that of step {ranks[other][1]})"
             if ranks[0][1] != ranks[other][1] else "")
    raise ValueError(f"init_from: the ranks of this job read different weights from {init_from!r}{steps}: a run that "
                     f"saved a checkpoint meanwhile, or another folder of that name on each host; name one checkpoint "
                     f"(--init-from RUN/checkpoints/step_N) on storage all hosts share (nothing was trained)")


def _load_init_weights(model: torch.nn.Module, state_dict: dict, cfg: TrainConfig) -> None:
    try:
        model.load_state_dict(state_dict, strict=True)
    except RuntimeError as e:  # shapes or names: the run's model overrides changed the architecture
        raise ValueError(f"init_from: the weights of {cfg.init_from!r} do not fit the model with the overrides "
                         f"{cfg.model} ({str(e).splitlines()[0]} ...); override only fields that hold no weights "
                         f"(prune_eps, fgate_bias_shift, ...)") from None


def _set_activation_checkpointing(model: torch.nn.Module, enabled: bool) -> None:
    for module in model.modules():
        if hasattr(module, "gradient_checkpointing") and isinstance(module.gradient_checkpointing, bool):
            module.gradient_checkpointing = enabled


def _autocast(device: torch.device, bf16: bool):
    if not bf16:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16)


class TrainingDiverged(FloatingPointError, ValueError):
    """The loss or the gradients stopped being finite. A ValueError too: what fixes it is a setting (lr, warm-up,
    clipping), and the CLI gives those as one error line, not a traceback."""


def _diverged(cfg: TrainConfig, step: int, what: str) -> TrainingDiverged:
    """The error for step ``step``, at which ``what`` happened; raised before that step's checkpoint, so the run's
    checkpoints all hold finite weights (a non-finite gradient already made the weights NaN in memory)."""
    clip = "" if cfg.grad_clip > 0 else ", and clip the gradients (--set grad_clip=1; 0 turned clipping off)"
    if ckpt.list_checkpoints(cfg.out_dir):
        saved = f"the checkpoints in {ckpt.checkpoint_root(cfg.out_dir)} are from before it"
        start = "another --out; --init-from one of those checkpoints keeps its weights"
    else:
        saved, start = "the run has no checkpoint", "another --out"
    # a resume keeps the run's lr and schedule (resume refuses to change them) and would diverge at this step again
    return TrainingDiverged(
        f"training diverged at step {step}: {what}; step {step} was not checkpointed, and {saved}. Start a new run "
        f"({start}) with a lower --lr (now {cfg.lr:g}) or a longer --warmup-tokens (now {cfg.warmup:,}){clip}")


def _check_gradients_arrived(model: torch.nn.Module) -> None:
    """A run whose backward reaches no parameter would train for hours with a flat loss; stop at step 1."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    if trainable and all(p.grad is None for p in trainable):
        raise RuntimeError("no gradient reached any parameter in the first step (the loss is not connected to "
                           "the model); if --compile is on, retry without it and report the torch version")


@torch.no_grad()
def evaluate(model: torch.nn.Module, val: TokenDataset, n_seqs: int, micro_batch: int, info: DistInfo,
             bf16: bool, gates: GateMeans | None = None) -> tuple[float, np.ndarray]:
    """Mean validation loss and per-position loss L(i) (fp64 [T-1]) over ``n_seqs`` sequences spread evenly
    over the validation split (so that many documents, not just the first, are represented), through the LM head
    in chunks whatever the training step does: the [B, T, V] fp32 logits of 8 x 4K tokens (6 GiB) ran a run out
    of memory at its first evaluation beside three others on an H100 (forty-third session, without --fused-loss).
    ``gates``: the forget_gate_means of the block around the call, told which rows of each forward count.

    The sequences are the same for any world size, so a run resumed on another number of ranks goes on with
    comparable validation losses (rounding their count to a multiple of the ranks gave others, and another
    loss for the same weights). Every rank runs as many forwards (FSDP's gathers need it): a rank with fewer
    sequences fills its last rows with copies that are left out of the sums.
    """
    world = info.world_size
    # Raising here stopped the run at its first evaluation, before the checkpoint, on every resume.
    n_seqs = max(1, min(n_seqs, len(val)))
    chosen = np.linspace(0, len(val) - 1, n_seqs).round().astype(int)
    mine = [int(j) for j in chosen[info.rank::world]]
    counted = len(mine)
    mine += [int(chosen[0])] * (-(-n_seqs // world) - counted)
    was_training = model.training
    model.eval()
    sums = torch.zeros(val.seq_len - 1, dtype=torch.float64, device=info.device)
    for i in range(0, len(mine), micro_batch):
        idx = mine[i:i + micro_batch]
        real = max(0, min(len(idx), counted - i))  # the copies come last
        if gates is not None:
            gates.rows = real
        x = torch.from_numpy(np.stack([val.sequence(j) for j in idx])).to(info.device)
        with _autocast(info.device, bf16):
            per_tok = model(x, labels=x, loss_reduction="none", return_logits=False).loss  # [B, T-1]
        sums += per_tok[:real].double().sum(0)
    if gates is not None:
        gates.rows = None
    model.train(was_training)
    per_pos = (all_reduce_sum(sums) / n_seqs).cpu().numpy()
    return float(per_pos.mean()), per_pos


CHECKSUM_MOD = 2**31 - 1


def batch_checksum(x: torch.Tensor, first: int) -> int:
    """A checksum of which token sequences a step trains on and where in the step's batch: sequence ``i``
    of ``x`` (position ``first + i`` in the step) contributes crc32(tokens) * (position + 1). Summed over
    ranks modulo CHECKSUM_MOD, it is the same for any world size that reads the same data in the same order."""
    rows = x.cpu().numpy()
    return sum(zlib.crc32(rows[i].tobytes()) * (first + i + 1) for i in range(rows.shape[0])) % CHECKSUM_MOD


def data_identity(train_ds: TokenDataset, val_ds: TokenDataset) -> str:
    """A fingerprint of a prepared dataset's contents, not of its path (data may move between resumes):
    tokenizer, split sizes, document offsets and a strided sample of the training tokens."""
    h = hashlib.sha256(train_ds.manifest["tokenizer"].encode())
    for ds in (train_ds, val_ds):
        h.update(np.asarray([ds.tokens.size], dtype=np.int64).tobytes())
        h.update(np.ascontiguousarray(ds.doc_offsets, dtype=np.int64).tobytes())
    stride = max(1, train_ds.tokens.size // 4096)  # a few MiB of reads even for billions of tokens
    h.update(np.ascontiguousarray(train_ds.tokens[::stride], dtype=np.int64).tobytes())
    return h.hexdigest()[:16]


# What only rank 0 does (console, metrics), and where each host keeps the data (compared by its contents instead).
_PER_RANK_KEYS = ("progress", "log_every", "tensorboard", "data_dir")


def _check_ranks_agree(cfg: TrainConfig, data_id: str) -> None:
    """Each torchrun launch (one a host) reads its own command line, and each rank would train what its own said:
    another lr or schedule on one host diverges its replica without a word, another out_dir splits the checkpoints."""
    mine = {**{k: v for k, v in dataclasses.asdict(cfg).items() if k not in _PER_RANK_KEYS}, "data": data_id}
    ranks = gather_objects((mine, cfg.data_dir))
    shown = []
    for key in mine:
        other = next((i for i, (r, _) in enumerate(ranks) if r[key] != ranks[0][0][key]), None)
        if other is None:
            continue
        if key == "data":
            shown.append(f"the data (rank 0 reads {ranks[0][1]!r}, rank {other} {ranks[other][1]!r}, which holds "
                         f"other tokens)")
        else:
            shown.append(f"{key} (rank 0: {ranks[0][0][key]!r}, rank {other}: {ranks[other][0][key]!r})")
    if not shown:
        return
    raise ValueError(f"the ranks of this job were started with different settings: {'; '.join(shown)}; start every "
                     f"process with the same flags and config (on several hosts, the same command on each), or each "
                     f"trains something else (nothing was written)")


def _resolve_resume(cfg: TrainConfig) -> str | None:
    existing = ckpt.list_checkpoints(cfg.out_dir)
    if cfg.resume == "never":
        if existing:
            raise ValueError(f"resume: out_dir {cfg.out_dir!r} already has checkpoints and resume='never'; "
                             f"choose another out_dir (nothing was overwritten)")
        return None
    if cfg.resume == "auto":
        return ckpt.latest_checkpoint(cfg.out_dir)
    if not os.path.isdir(cfg.resume):
        raise ckpt.CheckpointError(f"resume: checkpoint {cfg.resume!r} does not exist")
    # a run's folder was loaded as a checkpoint, and refused as "an incomplete save" that "cannot be trusted"
    if found := ckpt.list_checkpoints(cfg.resume):
        raise ValueError(f"resume: {cfg.resume!r} is a run's folder, not a checkpoint: give one of its checkpoints "
                         f"(its newest is {found[-1]}), or continue that run itself with `foxformer train --out "
                         f"{shlex.quote(cfg.resume)}`")
    return cfg.resume


def _say_nothing_to_train(cfg: TrainConfig, step: int) -> None:
    """A resumed run already at its end printed only its summary (train_loss null, 0 tokens/s), so a user who
    ran it again for "one more minute" did not learn why nothing happened."""
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
        saved = shlex.quote(os.path.join(cfg.out_dir, "config.yaml"))
        how = (f"a longer {cfg.schedule} schedule changes the learning rate of the steps taken, so it is a new run "
               f"from its weights: foxformer train --config {saved} --init-from {shlex.quote(cfg.out_dir)} --out "
               f"NEW_DIR --total-tokens N")
        end = f"schedule ({cfg.horizon_tokens:,} tokens)"
    tqdm.write(f"train: nothing to train: {cfg.out_dir} is at step {step:,}, the end of its {end}; {how}",
               file=sys.stderr)


def _finished_summary(cfg: TrainConfig, info: DistInfo, step: int, tokens: int, resume_path: str) -> dict:
    """The summary of a run resumed at the end of its schedule, from its own records: it is said why nothing
    trains, and nothing is evaluated or written. Evaluated again, each rerun of `foxformer train --out RUN`
    appended another validation record (and start and end records) of the last step to metrics.jsonl, which
    plots and reports then showed twice."""
    if info.is_main:
        _say_nothing_to_train(cfg, step)
    records = [r for r in read_metrics(cfg.out_dir) if r.get("step", 0) <= step]

    def last(kind: str, key: str):
        return next((r[key] for r in reversed(records) if r.get("kind") == kind and r.get(key) is not None), None)

    from .loading import read_run_config

    facts = read_run_config(os.path.join(cfg.out_dir, "config.yaml")).get("derived") or {}
    hf_dir = os.path.join(cfg.out_dir, "hf")
    exported = os.path.exists(os.path.join(hf_dir, "config.json"))
    if cfg.export_hf and not exported and info.is_main:  # the end's export failed, or export_hf was off then
        tqdm.write(f"train: {cfg.out_dir} has no Hugging Face export; foxformer export-hf "
                   f"{shlex.quote(cfg.out_dir)} writes it", file=sys.stderr)
    return RunSummary(
        out_dir=cfg.out_dir, step=step, tokens=tokens, train_loss=last("train", "loss"),
        val_loss=last("eval", "val_loss"), tokens_per_s=None, resumed_from=resume_path,
        hf_dir=hf_dir if exported else None, params=facts.get("params"),
        non_embedding_params=facts.get("non_embedding_params"), world_size=info.world_size, parallel=info.mode,
        device=str(info.device), wall_s=0.0, trained=False).to_dict()


def _check_saved_config(cfg: TrainConfig, resuming: bool, data_tokenizer_files: str | None) -> None:
    """``data_tokenizer_files``: the dataset's record of its tokenizer folder, which both the saved tokenizer and
    the run's were checked against: a folder moved since is given by its new path."""
    saved_path = os.path.join(cfg.out_dir, "config.yaml")
    if not resuming or not os.path.exists(saved_path):
        return
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
                         f"--init-from {shlex.quote(cfg.out_dir)} --out NEW_DIR plus the changed flags")


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


def export_hf(model_cfg, model_sd: dict, out: str, run_dir: str | None = None) -> str:
    """Save a full state dict as a Hugging Face model directory (``from_pretrained`` loads it; with
    ``trust_remote_code=True`` also where foxformer is not installed, and with its tokenizer files); its model card
    says how ``run_dir`` trained it."""
    from ..models import FoxForCausalLM
    from ..models.card import write_card

    earlier = check_export_dir(out, "export")
    model = FoxForCausalLM(model_cfg)
    model.load_state_dict(model_sd, strict=True)
    with export_writer(out, earlier) as tmp:
        model.save_pretrained(tmp)
        if run_dir is not None:
            write_card(tmp, model_cfg, training_facts(run_dir), replace=True)
    return out


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
    _check_ranks_agree(cfg, data_id)
    plan = make_plan(cfg, info.world_size, device.type)
    try:
        resume_path = _resolve_resume(cfg)
        check_same_resume(cfg.out_dir, resume_path, info, writer.group)
        _check_saved_config(cfg, resume_path is not None, recorded_tokenizer_files(train_ds.manifest))
        loaded = ResumePoint(resume_path, info, writer.group) if resume_path else None  # verifies hashes first
    except ckpt.CheckpointError as e:
        raise ckpt.CheckpointError(f"{e}; resume from another checkpoint (--resume RUN/checkpoints/step_N), or start "
                                   f"a new run in another out_dir") from None
    # (fields, weights) of the model the run starts from; a resumed run has its own in the checkpoint
    source = _init_source(cfg, train_ds.manifest) if cfg.init_from is not None and loaded is None else None
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
        return _finished_summary(cfg, info, int(loaded.state["step"]), int(loaded.state["tokens"]), resume_path)

    torch.manual_seed(cfg.seed)  # identical initial weights on every rank
    if model_factory is None:
        # a resumed run's own record of its model, else the model it starts from, else its preset
        base = read_model_config(cfg.out_dir) if loaded is not None else (source[0] if source else None)
        model, model_cfg = build_model(cfg, vocab_size, train_ds.eot_id, base)
        if source:
            _load_init_weights(model, source[1], cfg)
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
            raise _diverged(cfg, step, f"the validation forward pass overflowed ({e})") from None
        if not math.isfinite(loss):  # a model that gives NaN on held-out text is no checkpoint to keep
            raise _diverged(cfg, step, f"the validation loss is {loss:g}")
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
                with grad_sync(wrapped, info, sync=m == plan.accum - 1), _autocast(device, bf16):
                    loss = runner(x, labels=x, **loss_kwargs).loss
                (loss / plan.accum).backward()
            except NonFiniteValueError as e:  # the attention ops' value check, before the loss could show it
                raise _diverged(cfg, step + 1, f"the forward pass overflowed ({e})") from None
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
            raise _diverged(cfg, step, f"the loss is {loss_val:g} and the gradient norm {last_rec['grad_norm']:g} "
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
