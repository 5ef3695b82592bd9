"""What a run sets up before its first step, in three phases: what each rank reads and checks on its own before
the ranks meet (the datasets, the batch plan), the inputs the ranks check together (the checkpoint it resumes
from, the vocabulary), then the model, its wrapper and optimizer, restored on a resume.

A resumed run already at the end of its schedule stops before the last, before a model is built.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
from tqdm.auto import tqdm

from ..data.dataset import TokenDataset, TokenizerMismatch
from ..data.preparation import recorded_tokenizer_files
from ..data.tokenizer import moved_hint
from . import checkpoint as ckpt
from .config import TrainConfig, read_model_config, run_model_config
from .distributed import DistInfo, wrap_model
from .identity import check_ranks_agree, data_identity
from .init_from import init_source, load_init_weights
from .optim import build_optimizer
from .plan import Plan, make_plan
from .resume import check_saved_config, on_resumed_data, resolve_resume, saved_run
from .sharded import CheckpointWriter, ResumePoint, check_same_resume


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


@dataclass
class RunData:
    """What a rank reads and checks on its own, before the ranks meet: every rank of a job fails these checks the
    same way, at once (a rank that fails one alone tells the others through the rendezvous store)."""

    cfg: TrainConfig              # with the tokenizer of the dataset's manifest where the config named none
    bf16: bool
    train_ds: TokenDataset
    val_ds: TokenDataset
    data_id: str
    plan: Plan


@dataclass
class RunInputs(RunData):
    """What the run reads and checks before it touches out_dir or builds a model."""

    resume_path: str | None
    loaded: ResumePoint | None
    source: tuple[dict, dict] | None  # (fields, weights) of the model init_from names, on a new run
    vocab_size: int

    @property
    def finished(self) -> bool:
        """A resumed run whose checkpoint is already at the end of its schedule."""
        return self.loaded is not None and int(self.loaded.state["step"]) >= self.cfg.total_steps


@dataclass
class RunSetup:
    """The model a run trains and what trains it, at the step it starts from."""

    model: torch.nn.Module
    model_cfg: object
    wrapped: torch.nn.Module      # controls gradient sync (DDP / FSDP2 methods)
    runner: object                # what the micro-batches call: `wrapped`, compiled with cfg.compile
    optimizer: torch.optim.Optimizer
    loss_kwargs: dict
    step: int
    tokens: int
    n_params: int
    n_nonemb: int


def read_data(cfg: TrainConfig, info: DistInfo) -> RunData:
    """The batch plan and the datasets, checked before the process group starts (no collective here)."""
    device = info.device
    plan = make_plan(cfg, info.world_size, device.type)  # first: it needs no data
    bf16 = cfg.precision == "bf16" or (cfg.precision == "auto" and device.type == "cuda")
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True

    try:
        train_ds = TokenDataset(cfg.data_dir, "train", cfg.context, roll=cfg.roll, seed=cfg.seed,
                                expect_tokenizer=cfg.tokenizer, length="context", data="data_dir", also=("val",))
    except TokenizerMismatch as e:
        raise on_resumed_data(cfg, e) from None
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
    return RunData(cfg=cfg, bf16=bf16, train_ds=train_ds, val_ds=val_ds, data_id=data_identity(train_ds, val_ds),
                   plan=plan)


def read_inputs(data: RunData, info: DistInfo, writer: CheckpointWriter) -> RunInputs:
    """Validate everything else that can fail before touching out_dir (the ranks compare what they read)."""
    cfg, train_ds, data_id = data.cfg, data.train_ds, data.data_id
    check_ranks_agree(cfg, data_id)
    try:
        resume_path = resolve_resume(cfg)
        check_same_resume(cfg.out_dir, resume_path, info, writer.group)
        check_saved_config(cfg, resume_path, recorded_tokenizer_files(train_ds.manifest))
        loaded = ResumePoint(resume_path, info, writer.group) if resume_path else None  # verifies hashes first
    except ckpt.CheckpointError as e:
        raise ckpt.CheckpointError(f"{e}; resume from another checkpoint (--resume RUN/checkpoints/step_N), or start "
                                   f"a new run in another out_dir") from None
    # a resumed run has its own model in the checkpoint
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
    return RunInputs(**{f.name: getattr(data, f.name) for f in dataclasses.fields(data)}, resume_path=resume_path,
                     loaded=loaded, source=source, vocab_size=vocab_size)


def build_run(inputs: RunInputs, info: DistInfo, model_factory=None) -> RunSetup:
    """The model on the device, wrapped, with its optimizer, restored from the checkpoint on a resume.
    ``model_factory(cfg, vocab_size) -> (model, model_cfg)`` replaces :func:`build_model`."""
    cfg, loaded, source = inputs.cfg, inputs.loaded, inputs.source
    torch.manual_seed(cfg.seed)  # identical initial weights on every rank
    if model_factory is None:
        # a resumed run's own record of its model, else the model it starts from, else its preset
        base = (read_model_config(saved_run(cfg, inputs.resume_path)) if loaded is not None
                else source[0] if source else None)
        model, model_cfg = build_model(cfg, inputs.vocab_size, inputs.train_ds.eot_id, base)
        if source:
            load_init_weights(model, source[1], cfg)
            source = inputs.source = None  # the weights are in the model; drop the copy
            if info.is_main:
                tqdm.write(f"init_from: starting from the weights and config of {cfg.init_from} "
                           f"({model_cfg.num_layers} layers, width {model_cfg.hidden_size}; no preset)")
    else:
        model, model_cfg = model_factory(cfg, inputs.vocab_size)
    _set_activation_checkpointing(model, cfg.activation_checkpointing)
    model.to(info.device)
    n_params = sum(p.numel() for p in model.parameters())
    n_nonemb = getattr(model, "num_parameters_non_embedding", lambda: n_params)()

    wrapped = wrap_model(model, info, inputs.bf16)
    optimizer = build_optimizer(model, cfg, info.device.type)
    step, tokens = 0, 0
    if loaded is not None:
        loaded.restore(model, optimizer)
        ckpt.set_rng_state(loaded.rng)
        # The data order depends on the step only, so a run may resume on another number of ranks.
        step, tokens = int(loaded.state["step"]), int(loaded.state["tokens"])
    return RunSetup(model=model, model_cfg=model_cfg, wrapped=wrapped,
                    runner=torch.compile(wrapped) if cfg.compile else wrapped, optimizer=optimizer,
                    loss_kwargs={"return_logits": False} if cfg.fused_loss else {}, step=step, tokens=tokens,
                    n_params=n_params, n_nonemb=n_nonemb)
