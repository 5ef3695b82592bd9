"""Multi-query associative recall (MQAR, the synthetic retrieval task of the Zoology benchmark): small models
trained from scratch on key-value pairs followed by queries; accuracy by number of pairs and sequence length.

A sequence of T tokens with N pairs is ``k_1 v_1 ... k_N v_N`` followed by T - 2N tokens in which each key
appears once more (in random order, at random even offsets) followed by its value, filler tokens elsewhere.
The model is scored at each query key: its next-token prediction must be that key's value. Keys, values and
fillers come from disjoint ranges of the vocabulary, so a filler never looks like a query, and chance is
1 / num_values. Training uses one length (``train_len``) and a mix of pair counts; evaluation also covers
longer sequences, where the queries sit further from their pairs than anything seen in training, and more
pairs than trained on.

Every model is a preset family (``fox-pro``, ``transformer-pro``, ``linear-pro``, ``fox-llama``, ...; see
``models.presets.sized_config``) at the same depth and width, so their parameter counts match as the named
presets' do; ``kind:key=value`` overrides FoxConfig fields (``fox-llama:fgate=fixed``: a gate ablation;
``fox-pro:num_layers=4``: that model deeper, its heads and MLP width chosen for its own size).
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import time
import warnings
from dataclasses import InitVar, asdict, dataclass, field
from typing import Optional

import numpy as np
import torch
import torch.nn.functional as F
import yaml

from foxformer.argtypes import did_you_mean, setting_name, unset_said
from foxformer.models import FoxForCausalLM, count_non_embedding, sized_config
from foxformer.models.config import ConfigError
from foxformer.models.presets import KINDS, check_model_keys
from foxformer.paths import write_text
from foxformer.progress import progress_bar
from foxformer.train.config import TrainConfig
from foxformer.train.distributed import resolve_device
from foxformer.train.metrics import forget_gate_means
from foxformer.train.optim import learning_rate, param_groups
from foxformer.train.validation import autocast

from . import plots
from .outputs import mark_output_folder, markdown_table, note_replacing, safe_name, write_json, written

IGNORE = -100
LABELS = {"fox-pro": "FoX (Pro)", "transformer-pro": "Transformer (Pro)", "linear-pro": "gated linear attn (Pro)",
          "fox-llama": "FoX (LLaMA)", "transformer-llama": "Transformer (LLaMA)"}


# MqarConfig's fields that `eval mqar` sets by a flag of the same name
_FLAGGED = frozenset({"models", "steps", "lr", "batch_size", "seed", "max_minutes"})


@dataclass
class MqarConfig:
    """The task, the models and their training. Named presets in MQAR_PRESETS; saved in mqar.json. ``label``
    (not saved) names the settings in errors as argtypes.setting_name does: "--{}" for `eval mqar`'s flags."""

    models: list = field(default_factory=lambda: ["transformer-pro", "fox-pro:fgate=fixed", "fox-pro",
                                                  "fox-pro:fgate_bias_init=timescales"])
    num_layers: int = 2
    hidden_size: int = 64
    num_keys: int = 16
    num_values: int = 16
    num_fillers: int = 4
    train_len: int = 32
    train_pairs: list = field(default_factory=lambda: [2, 4])
    steps: int = 120
    batch_size: int = 16
    lr: float = 1e-2
    warmup_steps: int = 10
    weight_decay: float = 0.1
    eval_lengths: list = field(default_factory=lambda: [16, 32, 64, 128])
    eval_pairs: list = field(default_factory=lambda: [2, 4, 8])
    eval_seqs: int = 32
    seed: int = 0
    max_minutes: Optional[float] = None  # per model: stops its training early (recorded as steps_done)
    compile: bool = False
    label: InitVar[str] = "{}"

    def __post_init__(self, label: str) -> None:
        def named(key: str) -> str:
            # the fields `eval mqar` has no flag for come from its presets: a preset's mistake keeps their keyword
            # rather than naming a flag that does not exist
            return setting_name(label, key) if key in _FLAGGED else key

        for name in ("num_layers", "hidden_size", "num_keys", "num_values", "num_fillers", "train_len", "steps",
                     "batch_size", "eval_seqs"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{named(name)}: expected a positive integer, got {v!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"{named('seed')}: expected a non-negative integer, got {self.seed!r}")
        if not self.models:
            raise ValueError(f"{named('models')}: expected at least one model kind")
        twice = [m for i, m in enumerate(self.models) if m in self.models[:i]]
        if twice:  # one result file a spec: the second run would silently replace the first
            raise ValueError(f"{named('models')}: {twice[0]!r} is given more than once")
        for name in ("train_pairs", "eval_pairs", "eval_lengths"):
            v = list(getattr(self, name))
            if not v or any(isinstance(x, bool) or not isinstance(x, int) or x < 1 for x in v):
                raise ValueError(f"{name}: expected a non-empty list of positive integers, got {v!r}")
            setattr(self, name, sorted(set(v)))
        too_many = [n for n in self.train_pairs if 4 * n > self.train_len]
        if too_many:
            raise ValueError(f"train_pairs: {too_many} pairs need 4 tokens each (pair and query), more than "
                             f"train_len={self.train_len}")
        if max(self.train_pairs + self.eval_pairs) > self.num_keys:
            raise ValueError(f"num_keys: {self.num_keys} keys cannot make {max(self.train_pairs + self.eval_pairs)} "
                             f"distinct pairs")
        if isinstance(self.lr, bool) or not isinstance(self.lr, (int, float)) or not 0 < self.lr < math.inf:
            raise ValueError(f"{named('lr')}: expected a positive learning rate, got {self.lr!r}")
        w = self.warmup_steps
        if isinstance(w, bool) or not isinstance(w, int) or w < 0:
            raise ValueError(f"warmup_steps: expected a non-negative integer, got {w!r}")
        if w > self.steps:
            # named after steps: the presets fix the warm-up, and `eval mqar` has a --steps flag but no warm-up flag
            raise ValueError(f"{named('steps')}: expected at least {w}, the steps over which the learning rate "
                             f"warms up, got {self.steps}")
        if self.max_minutes is not None and not self.max_minutes > 0:
            raise ValueError(f"{named('max_minutes')}: expected a positive number, got {self.max_minutes!r}; "
                             f"{unset_said(label)} for no time limit")
        for spec in self.models:  # a bad override of the last model was found after training all the others
            model_config(spec, self, label=label)

    @property
    def vocab_size(self) -> int:
        return self.num_keys + self.num_values + self.num_fillers

    def task(self) -> dict:
        """What fixes the task and the evaluation sequences: results of equal tasks can be tabled together."""
        skip = {"models", "max_minutes", "compile"}
        return {k: v for k, v in asdict(self).items() if k not in skip}


def parse_model(spec: str, *, label: str = "{}") -> tuple[str, dict]:
    """"fox-llama:fgate=fixed,rope=true" -> ("fox-llama", {"fgate": "fixed", "rope": True}). ``label``: as
    MqarConfig's."""
    kind, _, rest = str(spec).partition(":")
    if kind not in KINDS:
        raise ValueError(f"{setting_name(label, 'models')}: unknown model kind {kind!r}{did_you_mean(kind, KINDS)}; "
                         f"expected one of {KINDS}, optionally with :key=value FoxConfig overrides")
    overrides = {}
    for item in filter(None, rest.split(",")):
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise ValueError(f"{setting_name(label, 'models')}: expected key=value after ':' in {spec!r}, got "
                             f"{item!r}")
        overrides[key] = yaml.safe_load(value)
    return kind, overrides


def model_config(spec: str, cfg: MqarConfig, *, label: str = "{}"):
    """The FoxConfig of ``spec``; an error in its overrides names the spec, as `train --model ITEM` names the item
    (``label``: as MqarConfig's)."""
    kind, overrides = parse_model(spec, label=label)
    where = f"{setting_name(label, 'models')} {spec}"
    check_model_keys(overrides, where)
    task = {"vocab_size": (cfg.vocab_size, "num_keys + num_values + num_fillers"),
            "max_position_embeddings": (max(cfg.eval_lengths + [cfg.train_len]), "the longest of eval_lengths and "
                                                                                 "train_len")}
    for key in sorted(task.keys() & overrides.keys()):  # the first of them, the same on every run
        raise ValueError(f"{where}: {key} is the task's ({task[key][1]}: {task[key][0]}); leave it out")
    size = {key: overrides.pop(key, getattr(cfg, key)) for key in ("num_layers", "hidden_size")}
    try:
        return sized_config(kind, **size, **{key: value for key, (value, _) in task.items()}, **overrides)
    except ConfigError as e:  # the spec is what its user typed; the reason names the field
        raise ValueError(f"{where}: {e.reason}") from e


def model_label(spec: str) -> str:
    kind, overrides = parse_model(spec)
    extra = ", ".join(f"{k}={v}" for k, v in overrides.items())
    return LABELS[kind] + (f", {extra}" if extra else "")


# The value a query asks for lies a median 15 tokens back in toy (5-95%: 3-27), 63 in mid (15-109) and 255 in
# small (67-443). FoX's data-dependent gate as the paper's code starts it (b = 0: f = 0.5, a key d tokens back
# weighed by 2^-d) gets its gradient to open only from answers a few tens of tokens back: it learns toy later (169
# to 325 steps against 49 to 61 at lr 3e-3, three seeds), mid never (1500 steps, lr up to 1e-2), small never in
# 3000 steps; fgate_bias_init=timescales starts it where the fixed gate stays and it learns as fast (docs/results.md,
# "Associative recall (MQAR) and the forget gate's start"). Models are compared at equal steps: max_minutes is a
# guard, and the table marks a model it stopped.
# toy (the defaults): the CPU test (~15 s for its four models); the fixed gate and the timescale start reach 1.0
# within 100 steps.
# mid: the CPU reproduction, under a minute a model on two cores; the fixed gate, the timescale start and the
# Transformer learn it by step ~200 of 600, the zero start stays at chance (three seeds).
# small: the GPU size of docs/results.md (2 layers, d = 256, as in the middle of Zoology's grid; 1024 keys;
# lengths up to 4x the training length and pair counts up to twice those trained). The fixed gate had learned
# it within the 1337 steps of the first GPU run, so 3000 leave room to spare.
TIMESCALE_START = "fox-pro:fgate_bias_init=timescales"
MQAR_PRESETS = {
    "toy": MqarConfig(),
    "mid": MqarConfig(
        models=["fox-pro", TIMESCALE_START, "fox-pro:fgate=fixed", "transformer-pro"],
        num_layers=2, hidden_size=64, num_keys=128, num_values=128, num_fillers=16, train_len=128,
        train_pairs=[4, 8, 16, 32], steps=600, batch_size=16, lr=1e-3, warmup_steps=50,
        eval_lengths=[64, 128, 256, 512], eval_pairs=[4, 8, 16, 32, 64], eval_seqs=64),
    "small": MqarConfig(
        models=["fox-pro", TIMESCALE_START, "transformer-pro", "linear-pro", "fox-pro:fgate=data_independent",
                "fox-pro:fgate=fixed", "linear-pro:fgate_bias_init=timescales", "fox-llama",
                "fox-llama:fgate_bias_init=timescales", "transformer-llama"],
        num_layers=2, hidden_size=256, num_keys=1024, num_values=1024, num_fillers=64, train_len=512,
        train_pairs=[16, 32, 64, 128], steps=3000, batch_size=64, lr=1e-3, warmup_steps=300,
        eval_lengths=[256, 512, 1024, 2048], eval_pairs=[16, 32, 64, 128, 256], eval_seqs=256),
}


def mqar_batch(rng: np.random.Generator, batch: int, seq_len: int, pairs: int, cfg: MqarConfig):
    """(inputs, targets), int64 [batch, seq_len] each; targets are IGNORE except at the query keys."""
    if 4 * pairs > seq_len:
        raise ValueError(f"pairs: {pairs} pairs and their queries need {4 * pairs} tokens, more than {seq_len}")
    k0, v0, f0 = 0, cfg.num_keys, cfg.num_keys + cfg.num_values
    x = rng.integers(f0, f0 + cfg.num_fillers, size=(batch, seq_len))
    y = np.full((batch, seq_len), IGNORE, dtype=np.int64)
    keys = np.argsort(rng.random((batch, cfg.num_keys)), axis=1)[:, :pairs] + k0  # distinct keys per row
    values = rng.integers(v0, v0 + cfg.num_values, size=(batch, pairs))
    x[:, 0:2 * pairs:2], x[:, 1:2 * pairs:2] = keys, values
    slots = (seq_len - 2 * pairs) // 2  # query slots of two tokens after the pairs
    rows = np.arange(batch)[:, None]
    where = np.sort(np.argsort(rng.random((batch, slots)), axis=1)[:, :pairs], axis=1) * 2 + 2 * pairs
    order = np.argsort(rng.random((batch, pairs)), axis=1)  # which pair each query slot asks for
    x[rows, where], x[rows, where + 1] = keys[rows, order], values[rows, order]
    y[rows, where] = values[rows, order]
    return torch.from_numpy(x), torch.from_numpy(y)


@torch.no_grad()
def gate_log_f(model: FoxForCausalLM, x: torch.Tensor, device: torch.device) -> Optional[list]:
    """Mean log f [layers][heads] over the tokens of ``x`` (None without forget gates). A forward of its own on
    the eager model: hooks inside a compiled one would make it recompile."""
    with forget_gate_means(model) as gates:
        _logits(model, x, device)
    return gates.result()


def longest_timescales(log_f: list) -> list[float]:
    """Per layer, the longest decay timescale of its heads, -1 / mean log f, in tokens: how far back attention
    can reach (a head at timescale t weighs a key d tokens back by about exp(-d / t))."""
    return [max(-1.0 / min(v, -1e-300) for v in layer) for layer in log_f]


def build_model(spec: str, cfg: MqarConfig) -> FoxForCausalLM:
    return FoxForCausalLM(model_config(spec, cfg))


def _schedule(cfg: MqarConfig) -> TrainConfig:
    """The training loop's own warm-up and cosine schedule, counted in steps (one 'token' a step)."""
    return TrainConfig(lr=cfg.lr, context=2, batch_tokens=2, total_tokens=2 * cfg.steps,
                       warmup_tokens=2 * cfg.warmup_steps, weight_decay=cfg.weight_decay)


def _logits(model, x, device) -> torch.Tensor:
    with autocast(device, bf16=device.type == "cuda"):
        return model(input_ids=x.to(device)).logits.float()


def train_mqar(model: FoxForCausalLM, cfg: MqarConfig, device: torch.device, *, progress: bool = True,
               label: str = "model") -> dict:
    """Train in place on fresh batches (seeded by cfg.seed); returns the history and the steps done."""
    sched = _schedule(cfg)
    opt = torch.optim.AdamW(param_groups(model, cfg.weight_decay), lr=cfg.lr, betas=(0.9, 0.95),
                            **({"fused": True} if device.type == "cuda" else {"foreach": True}))
    runner = torch.compile(model) if cfg.compile else model
    rng = np.random.default_rng([cfg.seed, 1])
    history, start, step = [], time.time(), 0
    log_every = max(1, cfg.steps // 50)
    model.train()
    bar = progress_bar(range(cfg.steps), desc=f"mqar train {label}", unit="step", wanted=progress)
    for step in bar:
        if cfg.max_minutes is not None and time.time() - start > 60 * cfg.max_minutes:
            break
        pairs = cfg.train_pairs[int(rng.integers(len(cfg.train_pairs)))]
        x, y = mqar_batch(rng, cfg.batch_size, cfg.train_len, pairs, cfg)
        for group in opt.param_groups:
            group["lr"] = learning_rate(2 * (step + 1), sched)
        logits = _logits(runner, x, device)
        y = y.to(device)
        loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), y.view(-1), ignore_index=IGNORE)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step % log_every == 0 or step == cfg.steps - 1:
            mask = y != IGNORE
            acc = (logits.argmax(-1)[mask] == y[mask]).float().mean()
            history.append({"step": step + 1, "loss": loss.item(), "accuracy": acc.item(), "pairs": pairs})
            log_f = gate_log_f(model, x, device)
            if log_f is not None:  # whether the gates open: a closed one never reaches the pairs
                history[-1]["gate_log_f"] = log_f
            bar.set_postfix(loss=f"{history[-1]['loss']:.3f}", acc=f"{history[-1]['accuracy']:.2f}", refresh=False)
    else:
        step = cfg.steps
    if step < cfg.steps:
        warnings.warn(f"mqar: {label} stopped by max_minutes={cfg.max_minutes} after {step} of {cfg.steps} steps, "
                      f"its learning rate not yet decayed; its accuracy is not the preset's", stacklevel=2)
    model.eval()
    return {"steps_done": int(step), "train_s": time.time() - start, "history": history}


@torch.no_grad()
def evaluate_mqar(model: FoxForCausalLM, cfg: MqarConfig, device: torch.device, batch: int = 64) -> list:
    """Accuracy grid [eval_pairs][eval_lengths] (None where the pairs and queries do not fit the length);
    the sequences depend on cfg.seed and the cell only, so every model reads the same ones."""
    grid = []
    for n in cfg.eval_pairs:
        row = []
        for length in cfg.eval_lengths:
            if 4 * n > length:
                row.append(None)
                continue
            rng = np.random.default_rng([cfg.seed, 2, n, length])
            hits = total = 0
            for s in range(0, cfg.eval_seqs, batch):
                x, y = mqar_batch(rng, min(batch, cfg.eval_seqs - s), length, n, cfg)
                pred = _logits(model, x, device).argmax(-1).cpu()
                mask = y != IGNORE
                hits += int((pred[mask] == y[mask]).sum())
                total += int(mask.sum())
            row.append(hits / total)
        grid.append(row)
    return grid


def run_model(spec: str, cfg: MqarConfig, device: torch.device, *, progress: bool = True) -> dict:
    """Build, train and evaluate one model (weights seeded by cfg.seed)."""
    torch.manual_seed(cfg.seed)
    model = build_model(spec, cfg).to(device)
    trained = train_mqar(model, cfg, device, progress=progress, label=spec)
    return {"model": spec, "label": model_label(spec), "non_embedding_params": count_non_embedding(model.config),
            **trained, "accuracy": evaluate_mqar(model, cfg, device)}


def _model_path(out_dir: str, spec: str) -> str:
    return os.path.join(out_dir, "models", f"{safe_name(spec)}.json")


def load_results(out_dir: str, task: dict) -> list[dict]:
    """Every model result saved in ``out_dir``/models (refusing results of another task)."""
    folder = os.path.join(out_dir, "models")
    results = []
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
        if not name.endswith(".json"):  # another process's result being written (write_json's temporary)
            continue
        with open(os.path.join(folder, name), encoding="utf-8") as f:
            data = json.load(f)
        if data["task"] != task:
            diff = sorted(k for k in task if data["task"].get(k) != task[k])
            raise ValueError(f"out: {os.path.join(folder, name)} holds a result of another task (differs in "
                             f"{diff}); use another --out")
        results.append(data["result"])
    return results


def _final_timescales(result: dict) -> str:
    logged = [h["gate_log_f"] for h in result["history"] if "gate_log_f" in h]
    return " / ".join(f"{t:.3g}" for t in longest_timescales(logged[-1])) if logged else "-"


def table_rows(results: list[dict], cfg: MqarConfig) -> list[list[str]]:
    """The query accuracy of each model (mqar.json's "models") at each pairs@length cell, as table rows, the
    header first (* marks cells beyond training)."""
    cells = [(n, l) for n in cfg.eval_pairs for l in cfg.eval_lengths if 4 * n <= l]
    head = ["model", "params", "steps", "gate reach"] + [
        f"{n}@{l}" + ("*" if l > cfg.train_len or n > max(cfg.train_pairs) else "") for n, l in cells]
    rows = [head]
    for r in results:
        acc = [r["accuracy"][cfg.eval_pairs.index(n)][cfg.eval_lengths.index(l)] for n, l in cells]
        steps = f"{r['steps_done']}" + (f" of {cfg.steps} (stopped)" if r["steps_done"] < cfg.steps else "")
        rows.append([r["label"], f"{r['non_embedding_params'] / 1e6:.2f}M", steps, _final_timescales(r)]
                    + [f"{a:.2f}" for a in acc])
    return rows


def table_caption(cfg: MqarConfig) -> str:
    return (f"Query accuracy, pairs@length (seed {cfg.seed}, {cfg.eval_seqs} sequences a cell; * beyond training: "
            f"longer than train_len or more pairs than trained; chance {1 / cfg.num_values:.3f}). Gate reach: per "
            f"layer, the longest decay timescale of its heads at the end of training (tokens; -1 / mean log f): the "
            f"answers lie up to {cfg.train_len} tokens back in training.")


def stopped_note(results: list[dict], cfg: MqarConfig) -> str:
    """A warning naming the models a time limit stopped early ("" where none was)."""
    stopped = [r["label"] for r in results if r["steps_done"] < cfg.steps]
    if not stopped:
        return ""
    return (f"**Stopped early** by max_minutes, before {cfg.steps} steps and with the learning rate still high: "
            f"{'; '.join(stopped)}. Their accuracy is what that part of the training reached, not the preset's; "
            f"compare models at equal steps.")


def table(results: list[dict], cfg: MqarConfig) -> str:
    text = table_caption(cfg) + "\n\n" + markdown_table(table_rows(results, cfg)) + "\n"
    note = stopped_note(results, cfg)
    return text + (f"\n{note}\n" if note else "")


def seed_table(out_dirs: list[str], *, label: str = "{}") -> str:
    """One table over MQAR reports that differ only in the seed (one folder each: `eval mqar --seed S --out DIR`,
    then its report), every cell the mean over seeds ± their standard deviation, with each model's seed count.

    The seed fixes the task's sequences and the weights, so each seed's models read their own sequences: the
    spread is over training and evaluation draws together. ``label``: as MqarConfig's (--pool gives out_dirs)."""
    reports = []
    for d in out_dirs:
        with open(os.path.join(d, "mqar.json"), encoding="utf-8") as f:
            reports.append(json.load(f))
    task = {k: v for k, v in reports[0]["task"].items() if k != "seed"}
    for d, r in zip(out_dirs, reports):
        if {k: v for k, v in r["task"].items() if k != "seed"} != task:
            raise ValueError(f"{setting_name(label, 'out_dirs', 'pool')}: {d} holds another task than {out_dirs[0]} "
                             f"(only the seed may differ)")
    seeds = [r["task"]["seed"] for r in reports]
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"{setting_name(label, 'out_dirs', 'pool')}: seeds {seeds} repeat; give one folder per "
                         f"seed")
    cfg = MqarConfig(**{**task, "seed": 0})
    by_model: dict[str, list[dict]] = {}
    for r in reports:
        for m in r["models"]:
            by_model.setdefault(m["label"], []).append(m)
    cells = [(n, l) for n in cfg.eval_pairs for l in cfg.eval_lengths if 4 * n <= l]
    head = ["model", "seeds", "steps (fewest)"] + [
        f"{n}@{l}" + ("*" if l > cfg.train_len or n > max(cfg.train_pairs) else "") for n, l in cells]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for label, runs in by_model.items():
        fewest = min(m["steps_done"] for m in runs)
        steps = f"{fewest}" + (f" of {cfg.steps} (stopped)" if fewest < cfg.steps else "")
        acc = []
        for n, l in cells:
            v = np.array([m["accuracy"][cfg.eval_pairs.index(n)][cfg.eval_lengths.index(l)] for m in runs])
            acc.append(f"{v.mean():.2f}" + (f" ± {v.std(ddof=1):.2f}" if len(v) > 1 else ""))
        lines.append("| " + " | ".join([label, str(len(runs)), steps] + acc) + " |")
    return (f"Query accuracy, pairs@length, mean ± standard deviation over seeds {sorted(seeds)} (* beyond "
            f"training; chance {1 / cfg.num_values:.3f}).\n\n" + "\n".join(lines) + "\n")


def _legend(result: dict, cfg: MqarConfig) -> str:
    """A model's label in the plots, with the steps a time limit stopped it at: its curve is not the preset's."""
    done = result["steps_done"]
    return result["label"] + (f" (stopped at {done} of {cfg.steps} steps)" if done < cfg.steps else "")


def _run_title(cfg: MqarConfig) -> str:
    return f"{cfg.num_layers} layers, d={cfg.hidden_size}, {cfg.steps} steps, seed {cfg.seed}"


def _plot_training(results: list[dict], cfg: MqarConfig, path: str) -> str:
    """Training query accuracy and the gates' reach against the step: a gate that never opens shows here."""
    import matplotlib.pyplot as plt

    fig, (acc_ax, gate_ax) = plt.subplots(1, 2, figsize=(9.6, 3.4), layout="constrained")
    for c, r in enumerate(results):
        steps = [h["step"] for h in r["history"]]
        acc_ax.plot(steps, [h["accuracy"] for h in r["history"]], color=f"C{c}", lw=1.2, label=_legend(r, cfg))
        gated = [h for h in r["history"] if "gate_log_f" in h]
        reach = np.array([longest_timescales(h["gate_log_f"]) for h in gated])
        for layer in range(reach.shape[1] if reach.size else 0):
            gate_ax.plot([h["step"] for h in gated], reach[:, layer], color=f"C{c}", lw=1.2,
                         ls=("-", "--", ":", "-.")[layer % 4])
    acc_ax.axhline(1 / cfg.num_values, color="0.6", ls=":", lw=1.0)
    acc_ax.set_ylim(-0.02, 1.02)
    acc_ax.set(xlabel="step", ylabel="training query accuracy")
    acc_ax.legend(fontsize=7)
    gate_ax.axhline(cfg.train_len, color="0.5", ls=":", lw=1.0)
    gate_ax.set_yscale("log")
    gate_ax.set(xlabel="step", ylabel="longest gate timescale (tokens)")
    gate_ax.set_title("solid: first layer, dashed: second; dotted: train_len", fontsize=9)
    for ax in (acc_ax, gate_ax):
        ax.grid(alpha=0.3)
    fig.suptitle(f"MQAR training, {_run_title(cfg)}", fontsize=10)
    return plots.save_figure(fig, path)


def _plot(results: list[dict], cfg: MqarConfig, path: str) -> str:
    import matplotlib.pyplot as plt

    n = len(cfg.eval_pairs)
    fig, axes = plt.subplots(1, n, figsize=(3.2 * n, 3.2), squeeze=False, sharey=True, layout="constrained")
    for ax, pairs, rows in zip(axes[0], cfg.eval_pairs, range(n)):
        for c, r in enumerate(results):
            acc = [np.nan if a is None else a for a in r["accuracy"][rows]]
            ax.plot(cfg.eval_lengths, acc, "o-", color=f"C{c}", ms=3, lw=1.3, label=_legend(r, cfg))
        ax.axvline(cfg.train_len, color="0.4", ls="--", lw=1.0)
        ax.axhline(1 / cfg.num_values, color="0.6", ls=":", lw=1.0)
        ax.set_xscale("log", base=2)
        ax.set_ylim(-0.02, 1.02)
        ax.set_title(f"{pairs} pairs" + (" (more than trained)" if pairs > max(cfg.train_pairs) else ""),
                     fontsize=9)
        ax.set_xlabel("sequence length")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("query accuracy")
    axes[0][-1].legend(fontsize=7)
    fig.suptitle(f"MQAR, {_run_title(cfg)} (dashed: training length; dotted: chance)",
                 fontsize=10)
    return plots.save_figure(fig, path)


def report(out_dir: str, cfg: MqarConfig) -> dict:
    """mqar.json, mqar.md and mqar.png from every model result in ``out_dir`` (several processes may have
    trained different models into one folder)."""
    results = load_results(out_dir, cfg.task())
    if not results:
        raise ValueError(f"out: {out_dir!r} holds no MQAR results (run without --report-only first)")
    text = table(results, cfg)
    note_replacing(os.path.join(out_dir, "mqar.json"))
    mark_output_folder(out_dir)
    write_text(os.path.join(out_dir, "mqar.md"), text)
    figs = [_plot(results, cfg, os.path.join(out_dir, "mqar.png")),
            _plot_training(results, cfg, os.path.join(out_dir, "mqar_training.png"))]
    data = {"command": "eval mqar", "task": cfg.task(), "chance": 1 / cfg.num_values,
            "plots": [os.path.basename(f) for f in figs],
            "models": [{**r, "stopped": r["steps_done"] < cfg.steps} for r in results]}
    write_json(os.path.join(out_dir, "mqar.json"), data)
    print(text, end="")
    return data


def run_mqar(cfg: MqarConfig, out_dir: str, *, device: str = "auto", progress: bool = True,
             report_only: bool = False, label: str = "{}") -> dict:
    """Train and evaluate every model of ``cfg`` (each result saved as it completes), then the report. ``label``
    names the settings in errors (argtypes.setting_name)."""
    saved = []  # this call's model results, named in the summary beside the report's files
    if not report_only:  # --report-only trains nothing, on any device
        # `--device cuda` without a GPU was torch's assertion "Torch not compiled with CUDA enabled", a traceback
        dev = resolve_device(device, setting_name(label, "device"))
        if dev.index is not None:  # Triton launches its kernels on the current GPU, as in the demo
            torch.cuda.set_device(dev)
        load_results(out_dir, cfg.task())  # another task's results there are refused before any training
        for spec in cfg.models:
            result = run_model(spec, cfg, dev, progress=progress)
            note_replacing(_model_path(out_dir, spec))
            mark_output_folder(out_dir)  # write_json marks models/, in it
            write_json(_model_path(out_dir, spec), {"task": cfg.task(), "config": asdict(cfg), "device": str(dev),
                                                    "result": result})
            saved.append(os.path.relpath(_model_path(out_dir, spec), out_dir))
    data = report(out_dir, cfg)
    return {**written(out_dir, ["mqar.json", "mqar.md", *saved], data["plots"]),
            "models": {r["label"]: {"steps_done": r["steps_done"], "steps": cfg.steps,
                                    "stopped": r["stopped"],
                                    "train_s": round(r["train_s"], 1), "accuracy": r["accuracy"]}
                       for r in data["models"]}}


def config_from(preset: str, *, label: str = "{}", **overrides) -> MqarConfig:
    """A named preset with fields replaced (None values are left as the preset has them). ``label``: as
    MqarConfig's."""
    if preset not in MQAR_PRESETS:
        raise ValueError(f"{setting_name(label, 'preset')}: unknown MQAR preset {preset!r}"
                         f"{did_you_mean(preset, MQAR_PRESETS)}; expected one of {sorted(MQAR_PRESETS)}")
    return dataclasses.replace(MQAR_PRESETS[preset], label=label,
                               **{k: v for k, v in overrides.items() if v is not None})
