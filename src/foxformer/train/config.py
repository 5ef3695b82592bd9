"""TrainConfig: one typed, flat config for `foxformer train`, from YAML and/or ``key=value`` overrides.

Token counts accept suffixes: ``16K`` = 16,000, ``16Ki`` = 16,384, likewise ``M``/``Mi``/``G``/``Gi``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import numbers
import os
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import yaml

from ..argtypes import SettingError, did_you_mean, parse_count
from ..paths import write_json, write_text

# The models (torch, transformers) and the tokenizers (numpy) are imported where used: `foxformer train --help`
# reads the defaults below, and every --help answers without them.
if TYPE_CHECKING:
    from ..models.config import FoxConfig


SCHEDULES = ("cosine", "linear", "constant")
PRECISIONS = ("auto", "bf16", "fp32")
PARALLEL = ("auto", "none", "ddp", "fsdp")
DEVICES = ("auto", "cpu", "cuda")  # and "cuda:N": one GPU of several (a single-process run)
# how every device setting's error lists the spellings, the config's own check and every command's --device alike
DEVICE_SPELLINGS = "'auto', 'cpu', 'cuda' or 'cuda:N'"
_ONE_GPU = re.compile(r"cuda:[0-9]+")
CHECKPOINT_FORMATS = ("auto", "full", "sharded")
CHOICES = {"schedule": SCHEDULES, "precision": PRECISIONS, "parallel": PARALLEL,
           "checkpoint_format": CHECKPOINT_FORMATS}

FLOAT_KEYS = ("lr", "min_lr_ratio", "weight_decay", "beta1", "beta2", "eps", "grad_clip", "max_minutes", "peak_flops",
              "dist_timeout_minutes")
COUNT_KEYS = ("batch_tokens", "context", "total_tokens", "warmup_tokens", "checkpoint_every_tokens",
              "eval_every_tokens", "eval_tokens")
INT_KEYS = ("max_steps", "micro_batch_size", "keep_last", "log_every", "seed", "vocab_size")
BOOL_KEYS = ("roll", "compile", "activation_checkpointing", "fused_loss", "tensorboard", "export_hf", "progress",
             "checkpoint_async")
_BOOL_WORDS = {"true": True, "yes": True, "on": True, "false": False, "no": False, "off": False}

# Keys that may differ between a run and its resumption without changing what is computed step by step.
RESUMABLE_CHANGES = frozenset({
    "max_steps", "max_minutes", "log_every", "tensorboard", "compile", "resume", "keep_last", "eval_every_tokens",
    "eval_tokens", "checkpoint_every_tokens", "export_hf", "device", "micro_batch_size", "activation_checkpointing",
    "parallel", "progress", "data_dir", "peak_flops", "out_dir", "checkpoint_format", "checkpoint_async",
    "dist_timeout_minutes",
})


def _parse_int(value: Any, name: str) -> Any:
    """``"10"`` / ``"1e3"`` / ``1000.0`` -> an int; text of no integer is a ValueError, anything else is returned
    for ``validate`` to judge."""
    if isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            number = math.nan
        if not number.is_integer():
            raise ValueError(f"{name}: expected an integer, got {value!r}")
        value = number
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def typed_value(key: str, value: Any) -> Any:
    """``value`` of ``key`` as TrainConfig types it (``"1e-3"`` -> 0.001, ``"16Ki"`` -> 16384, ``"off"`` -> False);
    a value of no key's type is returned for ``validate`` to judge, text that is no number of the key's kind is a
    ValueError naming ``key``. Light: a command types its flags with it while parsing, before torch is imported."""
    if key in FLOAT_KEYS:
        # YAML 1.1 reads "2e-3" as a string; accept numeric strings for numeric fields.
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                raise ValueError(f"{key}: expected a number, got {value!r}") from None
        # beta2=0 (a YAML int beside beta1's float) failed in AdamW: "betas must be either both floats or both
        # Tensors"; a bool stays one, for validate to refuse
        return float(value) if isinstance(value, int) and not isinstance(value, bool) else value
    if value is None:
        return None
    if key in COUNT_KEYS:
        return parse_count(value, key)
    if key in INT_KEYS:  # YAML 1.1 also reads 1e3 as a string, and a quoted '10' is still meant as a number
        return value if isinstance(value, bool) else _parse_int(value, key)
    # a quoted "false" is a truthy string: it would switch the option on
    if key in BOOL_KEYS and isinstance(value, str) and value.strip().lower() in _BOOL_WORDS:
        return _BOOL_WORDS[value.strip().lower()]
    return value


@dataclass
class TrainConfig:
    """Everything a training run needs. ``None`` means "derive it" (see the field comments)."""

    # model
    preset: str | None = "fox-pro-tiny"     # "{fox,transformer}-{llama,pro}-{size}", "linear-pro-{size}"; None
    #                                         with init_from, whose model replaces it
    model: dict = field(default_factory=dict)  # FoxConfig overrides, e.g. {hidden_size: 128}
    init_from: str | None = None            # what it takes: _MEANINGS
    vocab_size: int | None = None           # None: the tokenizer's size rounded up to a multiple of 64
    # data
    data_dir: str = "data_cache/default"
    tokenizer: str | None = None            # None: the dataset's (its manifest); given, it must match it
    context: int = 2048                     # T, tokens per sequence
    roll: bool = False                      # random rolling of each training sequence
    # batch
    batch_tokens: int = 2**19               # tokens per optimizer step (all ranks, all micro-batches)
    micro_batch_size: int = 0               # sequences per rank per forward; 0: auto
    # optimizer and schedule
    lr: float = 1e-3
    min_lr_ratio: float = 0.1               # final learning rate / lr
    warmup_tokens: int | None = None        # None: 10% of the horizon, at most 256Mi
    schedule: str = "cosine"                # cosine | linear | constant (after warmup)
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    grad_clip: float = 1.0                  # the global gradient norm is clipped to this; 0: no clipping
    total_tokens: int | None = None         # schedule horizon and stop; None: max_steps * batch_tokens
    max_steps: int | None = None            # stop after this many steps (does not change the schedule)
    max_minutes: float | None = None        # stop after this much training wall time
    # runtime
    precision: str = "auto"                 # auto (bf16 on CUDA, fp32 on CPU) | bf16 | fp32
    compile: bool = False
    activation_checkpointing: bool = False
    fused_loss: bool = False                # loss through the LM head in chunks, no [B, T, V] logits
    device: str = "auto"
    parallel: str = "auto"                  # auto (fsdp when WORLD_SIZE > 1) | none | ddp | fsdp (one process: none)
    dist_timeout_minutes: float = 10.0      # a collective waiting longer (a rank hung or gone) ends the job;
    #                                         torch's NCCL default, and a full save or HF export takes less
    seed: int = 0
    # output
    out_dir: str = "runs/default"
    checkpoint_every_tokens: int | None = None  # None: about 10 checkpoints per run
    keep_last: int = 2
    checkpoint_format: str = "auto"         # auto (sharded under torchrun, full for one process) | full | sharded
    checkpoint_async: bool = True           # sharded saves are written while training goes on
    resume: str = "auto"                    # auto (latest checkpoint in out_dir) | never | <checkpoint dir>
    #                                         (a checkpoint dir sets out_dir's newer step folders aside as abandoned-step_N)
    eval_every_tokens: int | None = None    # None: about 10 evaluations per run
    eval_tokens: int | None = None          # validation tokens per evaluation; None: 256Ki on CUDA, 8Ki on CPU
    log_every: int = 10                     # steps between console lines (JSONL gets every step)
    tensorboard: bool = True                # only if tensorboard is installed
    export_hf: bool = True                  # save_pretrained into out_dir/hf at the end
    peak_flops: float | None = None         # per device; None: looked up (H100/H200 bf16 989e12), CPU n/a
    progress: bool = True

    def __post_init__(self) -> None:
        for name in (*FLOAT_KEYS, *COUNT_KEYS, *INT_KEYS, *BOOL_KEYS):
            setattr(self, name, typed_value(name, getattr(self, name)))
        if self.init_from is not None:
            # the model init_from names is the architecture (model_config.json records it): a preset here would
            # be saved in config.yaml, and read by cards and comparisons, without ever being built
            self.preset = None
        self.validate()

    def validate(self) -> None:
        def positive(name: str, allow_none: bool = False, allow_zero: bool = False) -> None:
            v = getattr(self, name)
            if v is None and allow_none:
                return
            # NaN passes every comparison: max_minutes=nan never stopped the run, grad_clip=nan disabled clipping
            if (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0
                    or (v == 0 and not allow_zero)):
                raise ValueError(f"{name}: expected a finite {'non-negative' if allow_zero else 'positive'} number, "
                                 f"got {v!r}")

        for name in INT_KEYS:  # 1.5 steps ran 2 steps over a horizon of 1.5 batches
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, numbers.Integral)):
                raise ValueError(f"{name}: expected an integer, got {v!r}")
        for name in BOOL_KEYS:
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name}: expected true or false, got {getattr(self, name)!r}")
        for name in ("batch_tokens", "context", "log_every", "keep_last", "dist_timeout_minutes"):
            positive(name)
        for name in ("eval_tokens", "total_tokens", "max_steps", "max_minutes", "checkpoint_every_tokens", "eval_every_tokens",
                     "vocab_size", "peak_flops"):
            positive(name, allow_none=True)
        # numpy's generators (data order, rolling) refuse negative seeds, at the first batch
        for name in ("micro_batch_size", "weight_decay", "grad_clip", "lr", "seed"):
            positive(name, allow_zero=True)
        positive("warmup_tokens", allow_none=True, allow_zero=True)
        positive("eps")  # eps=inf made every Adam update 0
        for name in ("beta1", "beta2"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0.0 <= v < 1.0:  # NaN fails too
                raise ValueError(f"{name}: expected a number in [0, 1), got {v!r}")
        if self.context < 2:
            raise ValueError(f"context: expected at least 2 tokens, got {self.context}")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ValueError(f"min_lr_ratio: expected a number in [0, 1], got {self.min_lr_ratio!r}")
        for name, allowed in CHOICES.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name}: expected one of {allowed}, got {getattr(self, name)!r}")
        if self.device not in DEVICES and not (isinstance(self.device, str) and _ONE_GPU.fullmatch(self.device)):
            raise ValueError(f"device: expected {DEVICE_SPELLINGS}, got {self.device!r}")
        if not isinstance(self.model, dict):
            raise TypeError(f"model: expected a mapping of FoxConfig overrides, got {type(self.model).__name__}")
        from ..models.config import ConfigError
        from ..models.presets import check_model_keys, check_preset

        if self.init_from is None:
            try:
                check_preset(self.preset)
            except ValueError as e:  # named by its key, as the other settings are: a command re-says it as --preset
                raise ValueError(f"preset: {e}") from None
        check_model_keys(self.model)
        if "gradient_checkpointing" in self.model:
            # the loop sets it on the model's layers from activation_checkpointing, over whatever the model says
            raise ConfigError("gradient_checkpointing is not read in training, where activation_checkpointing "
                              "decides it for every layer; set activation_checkpointing: true "
                              "(--activation-checkpointing) instead", "gradient_checkpointing", where="model: ")
        if self.total_tokens is None and self.max_steps is None:
            raise ValueError("total_tokens / max_steps: set at least one (the schedule needs a horizon)")
        if self.batch_tokens % self.context:
            near = max(self.context, round(self.batch_tokens / self.context) * self.context)
            raise ValueError(f"batch_tokens: {self.batch_tokens} is not a multiple of context={self.context} (a step "
                             f"holds whole sequences): give {near}")

    # derived quantities -------------------------------------------------------------------------------------
    @property
    def horizon_tokens(self) -> int:
        return self.total_tokens if self.total_tokens is not None else self.max_steps * self.batch_tokens

    @property
    def total_steps(self) -> int:
        steps = -(-self.horizon_tokens // self.batch_tokens)
        return min(steps, self.max_steps) if self.max_steps is not None else steps

    @property
    def warmup(self) -> int:
        if self.warmup_tokens is not None:
            return self.warmup_tokens
        return min(self.horizon_tokens // 10, 2**28)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _fields() -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(TrainConfig)}


def _shown(key: str, value: Any) -> str:
    if value is None or value is dataclasses.MISSING:
        return "unset"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, int) and key.endswith("tokens"):  # the suffixed form a flag accepts, where one is exact
        for suffix, scale in (("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10)):
            if value >= scale and value % scale == 0:
                return f"{value // scale}{suffix} = {value}"
    return str(value)


def shown_default(key: str) -> str:
    """``key``'s default as `foxformer train --help` shows it (``unset``, ``512Ki = 524288``, ``cosine``)."""
    return _shown(key, _fields()[key].default)


# What a key does where its name does not say it, after its default in `foxformer train --help`
_MEANINGS = {
    "preset": "; `foxformer presets` lists them with their sizes",
    "schedule": ": the learning rate rises linearly over the warm-up to lr, then cosine and linear decay it to "
                "min_lr_ratio * lr at the horizon (total_tokens), constant holds it. A finished run may go on to a "
                "larger --total-tokens (or --max-steps) only under constant, its warm-up kept; under cosine and "
                "linear a longer horizon would change the rate of the steps already taken, so the longer run is a "
                "new one (--init-from RUN)",
    "warmup_tokens": "; unset: a tenth of the horizon, at most 256Mi",
    "total_tokens": "; the schedule's horizon and where training ends (unset: max_steps * batch_tokens)",
    "max_steps": "; stop after this many steps (the horizon too, while total_tokens is unset)",
    "micro_batch_size": "; sequences each rank runs in one forward and backward pass, the step's gradient summed "
                        "over as many passes as its batch needs (less memory, the same step); 0: the largest that "
                        "divides a rank's sequences within 32Ki tokens a pass (8Ki on CPU)",
    "eval_tokens": "; validation tokens at each evaluation, in sequences spread evenly over the val split (at most "
                   "all of it); unset: 256Ki on CUDA, 8Ki on CPU",
    "init_from": "; start from this model's weights and architecture instead of a preset's: a run dir, a checkpoint "
                 "dir, a Hugging Face folder or Hub id, a paper model too; --model still sets its runtime fields",
    "tokenizer": "; the run trains with the one its dataset was prepared with (manifest.json): given, it is only "
                 "checked against that one",
    # the cadence a user weighs against what Ctrl-C loses, and keep_last against a checkpoint a note named earlier
    "checkpoint_every_tokens": "; unset: a tenth of the horizon, at least one step; a stop on SIGTERM, SIGUSR1 or "
                               "max_minutes saves one too (Ctrl-C does not)",
    "keep_last": "; the newest checkpoints kept in out_dir/checkpoints, older ones removed as each is saved",
    "eval_every_tokens": "; unset: a tenth of the horizon, at least two steps (and at the end)",
    "max_minutes": "; stop after this many minutes of training in this invocation, with a checkpoint (`foxformer "
                   "train --out RUN` goes on from it, for as long again: the run's config.yaml keeps it; a new run "
                   "from that file with --config does not)",
    "progress": ": a progress bar on a terminal; the step lines on stdout are printed either way",
    # "auto" unexplained, and a flag that said only "set KEY: true", left a user nothing to weigh
    "precision": "; auto: bf16 on CUDA, fp32 on a CPU",
    "device": "; auto: a GPU where there is one, else the CPU",
    "parallel": "; auto: FSDP2 under torchrun (WORLD_SIZE > 1), none for one process",
    "checkpoint_format": "; auto: sharded under torchrun (each rank writes its own shards), full for one process",
    "log_every": "; a line with the step's loss, learning rate and tokens/s every this many steps (and the first "
                 "and last)",
    "roll": ": rotate each training sequence by a random offset fixed by (seed, epoch, index); its end wraps "
            "round to its start",
    "compile": ": torch.compile the model (the first steps are slower: they compile it)",
    "activation_checkpointing": ": recompute each block's activations in the backward instead of keeping them "
                                "(less memory, more compute)",
    "fused_loss": ": the loss through the LM head in chunks, never the whole [batch, context, vocab] logits (less "
                  "memory)",
    "resume": "; auto: continue from out_dir's latest checkpoint (a new run where it has none); never: a new run, "
              "refused where out_dir has checkpoints; a checkpoint folder: continue from that one (out_dir's later "
              "step folders are set aside as abandoned-step_N)",
}


def describe_key(key: str) -> str:
    """What `foxformer train --help` adds to a key's name: the values it takes where the config fixes them, and
    its default and what it does (_MEANINGS), e.g. ``", one of cosine, linear, constant (default: cosine): the
    learning rate rises ..."``."""
    allowed = {**CHOICES, "device": DEVICES + ("cuda:N",)}.get(key)
    choices = f", one of {', '.join(allowed)}" if allowed else ""
    return f"{choices} (default: {shown_default(key)}){_MEANINGS.get(key, '')}"


def _check_keys(keys, where: str) -> None:
    known = _fields()
    for key in keys:
        if key not in known:
            raise ValueError(f"{where}: unknown config key {key!r}{did_you_mean(key, known)}; known keys: "
                             f"{', '.join(sorted(known))}")


def parse_overrides(items: list[str] | None, flag: str = "--set", into: dict | None = None) -> dict:
    """``["lr=3e-4", "model.hidden_size=128"]`` -> ``{"lr": 3e-4, "model": {"hidden_size": 128}}`` (YAML values),
    added to ``into`` where given; ``flag`` names the option the items came from in errors. A key given twice with
    two values is refused: the last one won without a word, which one command line built from pieces hides."""
    out: dict = {} if into is None else into
    for item in items or []:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ValueError(f"{flag}: expected key=value, got {item!r}")
        value = yaml.safe_load(raw) if raw else None
        target = out
        if key.startswith("model."):
            target, key = out.setdefault("model", {}), key[len("model."):]
        if key in target and target[key] != value:
            raise ValueError(f"{flag}: {key} is given twice, as {target[key]!r} and as {value!r}; give it once")
        target[key] = value
    return out


SAVED_CONFIG = "config.yaml"


def read_yaml(path: str, what: str = "config") -> Any:
    """The YAML document in ``path``; a syntax error is a ValueError naming the file, line and column (a
    SettingError of ``what``, which a command re-says after the flag its user typed)."""
    if not os.path.exists(path):
        raise SettingError(what, f"file {path!r} does not exist")
    if os.path.isdir(path):  # open() said only "is a directory", in no setting's name
        inside = os.path.join(path, SAVED_CONFIG)
        saved = f" (a run's folder: its settings are {inside})" if os.path.isfile(inside) else ""
        raise SettingError(what, f"{path!r} is a folder{saved}; give the YAML file itself")
    with open(path, encoding="utf-8") as f:
        try:
            return yaml.safe_load(f)
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            where = f", line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
            problem = getattr(e, "problem", None) or str(e).splitlines()[0]
            raise SettingError(what, f"not valid YAML ({path}{where}): {problem}; fix the syntax there (one "
                                     f"'key: value' per line)") from None


def load_config(path: str | None = None, overrides: dict | None = None) -> TrainConfig:
    """YAML file (optional) updated by ``overrides``; unknown keys raise ValueError with a suggestion.

    Without a file, the config.yaml that a run saved in ``overrides["out_dir"]`` is the base: `foxformer train
    --out RUN` continues RUN with nothing else (flags still override it, and a resume refuses those that change
    what is computed). A run's saved config.yaml is itself a valid file (its ``derived`` facts are skipped).
    """
    values: dict = {}
    if path is None and overrides and overrides.get("out_dir"):
        saved = os.path.join(str(overrides["out_dir"]), SAVED_CONFIG)
        path = saved if os.path.isfile(saved) else None
    if path is not None:
        loaded = read_yaml(path) or {}
        if not isinstance(loaded, dict):
            raise ValueError(f"config: {path!r} must hold a mapping of keys to values")
        loaded.pop("derived", None)  # facts save_config adds for readers, not settings
        _check_keys(loaded, f"config {path}")
        values.update(loaded)
    if overrides:
        _check_keys(overrides, "overrides")
        for key, value in overrides.items():
            if key == "model" and isinstance(value, dict):
                values["model"] = {**values.get("model", {}), **value}
            else:
                values[key] = value
    return TrainConfig(**values)


def save_config(cfg: TrainConfig, path: str, extra: dict | None = None) -> None:
    """Write the resolved config (plus derived facts under ``derived``) atomically."""
    data = cfg.to_dict()
    if extra:
        data["derived"] = extra
    write_text(path, yaml.safe_dump(data, sort_keys=False))


MODEL_CONFIG = "model_config.json"  # beside config.yaml: the FoxConfig a run trains, whatever built it


def run_model_config(preset: str, model: dict, *, vocab_size: int, context: Any, tokenizer: str | None = None,
                     document_token: int | None = None, base: dict | None = None) -> FoxConfig:
    """The FoxConfig a run trains: ``base`` (a whole FoxConfig's fields: the run's model_config.json, or the model
    init_from names) or else its preset, then the run's ``model`` overrides, then what its data and context decide
    where nothing else did (vocabulary size, tokenizer, the token between documents, positions past 16K), and
    train_len, which the context sets."""
    from ..data.tokenizer import canonical_name
    from ..models.config import FoxConfig
    from ..models.presets import get_preset

    fields = {**(base or {}), **model}

    def fill(key: str, value) -> None:
        if value is not None and fields.get(key) is None:
            fields[key] = value

    fill("vocab_size", int(vocab_size))
    # the model's own record: its Hugging Face export writes the tokenizer files, eval reads it
    fill("tokenizer", None if tokenizer is None else canonical_name(tokenizer))
    fill("bos_token_id", document_token)  # generation stops where the training documents ended, and starts there
    fill("eos_token_id", document_token)
    if isinstance(context, int) and context > 16384 and "max_position_embeddings" not in model:
        fields["max_position_embeddings"] = max(fields.get("max_position_embeddings", 0), context)
    if isinstance(context, int) and "train_len" not in model:
        # a run trains at its context; one started from a model keeps the longer context that model had
        fields["train_len"] = max(fields.get("train_len") or 0, context)
    return get_preset(preset, **fields) if base is None else FoxConfig(**fields)


def config_fields(model_cfg: FoxConfig) -> dict:
    """FoxConfig's own fields of ``model_cfg`` (not PretrainedConfig's bookkeeping): enough to build it again."""
    from ..models.presets import model_keys

    return {key: getattr(model_cfg, key) for key in model_keys()}


def write_model_config(run_dir: str, model_cfg: FoxConfig) -> None:
    """The FoxConfig fields of the model a run trains, into RUN/model_config.json."""
    write_json(os.path.join(run_dir, MODEL_CONFIG), config_fields(model_cfg), sort_keys=True)


def read_model_config(run_dir: str) -> dict | None:
    """The FoxConfig fields a run saved (None for runs from before it saved them: their preset rebuilds them)."""
    path = os.path.join(run_dir, MODEL_CONFIG)
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as f:
        fields = json.load(f)
    from ..models.presets import check_model_keys

    check_model_keys(fields, f"model: {path}")
    return fields


def saved_model_config(run_dir: str, run_cfg: dict, vocab_size: int) -> FoxConfig:
    """The FoxConfig of a saved run, from its config.yaml (``run_cfg``, read as saved: settings and derived facts)
    and its model_config.json (runs from before it was saved: their preset); ``vocab_size``: its weights'."""
    facts = run_cfg.get("derived") or {}
    return run_model_config(run_cfg.get("preset", "fox-pro-tiny"), run_cfg.get("model") or {},
                            vocab_size=vocab_size, context=run_cfg.get("context"),
                            tokenizer=run_cfg.get("tokenizer"), document_token=facts.get("document_token"),
                            base=read_model_config(run_dir))


def read_saved_config(path: str) -> TrainConfig:
    return load_config(path)


def _precision_on(precision: str, device: str) -> str:
    """The precision a run computes in on ``device`` (TrainConfig.precision's "auto": bf16 on CUDA, else fp32)."""
    if precision != "auto":
        return precision
    if device == "auto":
        import torch

        return "bf16" if torch.cuda.is_available() else "fp32"
    return "bf16" if device.startswith("cuda") else "fp32"


def resume_conflicts(saved: TrainConfig, new: TrainConfig) -> list[str]:
    """Keys whose change would make a resumed run compute something else.

    The horizon (total_tokens, or max_steps while it is unset) may change under a constant schedule that keeps
    its warm-up: every step's learning rate is then what it was, and the resumed run is the run that had the
    new horizon from its start. Cosine and linear decay to the horizon, so there another one changes the
    learning rate of steps already taken."""
    a, b = saved.to_dict(), new.to_dict()
    schedule_keys = {"total_tokens", "warmup_tokens"}  # judged by what they set below, not by their text
    keys = sorted(k for k in a if k not in RESUMABLE_CHANGES | schedule_keys and a[k] != b.get(k))
    # "auto" is fp32 on a CPU: `--precision fp32` there computes the same thing (and --device may change anyway)
    if "precision" in keys and _precision_on(saved.precision, new.device) == _precision_on(new.precision, new.device):
        keys.remove("precision")
    constant = saved.schedule == new.schedule == "constant"
    if saved.warmup != new.warmup:
        derived = a["warmup_tokens"] == b["warmup_tokens"]  # unset in both: a tenth of a changed horizon
        keep = f"; keep it with --warmup-tokens {saved.warmup}" if constant else ""
        keys.append(f"warmup_tokens (unset: a tenth of the horizon, {new.warmup:,} tokens now, {saved.warmup:,} in "
                    f"the run{keep})" if derived else "warmup_tokens")
    if saved.horizon_tokens != new.horizon_tokens and not constant:
        horizon = ("total_tokens" if a["total_tokens"] != b["total_tokens"]
                   else "max_steps (it sets the schedule horizon while total_tokens is unset)")
        keys.append(f"{horizon}: a {saved.schedule} schedule decays to its horizon, only a constant one extends on "
                    f"resume")
    return keys
