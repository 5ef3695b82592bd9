"""Needle in a haystack on local text: a grid of context lengths x needle depths, two modes, two scores.

A needle states a fact, "The special magic number for {key} is: {value}.", inserted at relative depth
``depth`` of a haystack cut from local long text, moved to the nearest sentence boundary if one lies within
:func:`snap_window` tokens (2% of the context length, 4 to 64 tokens). Each record keeps the requested
``depth`` (the heatmap bucket) and where the needle really went: ``needle_pos`` (its first token in the
prompt) and ``actual_depth`` (``needle_pos`` over the haystack tokens of the prompt). The prompt ends with
the question and the start of the answer ("... What is the special magic number for {key}? The special magic
number for {key} is:"), so base models answer by completion. "easy" mode puts the question inside the needle as well (the paper's
easy mode): the model then only needs to copy what followed the same words before.

Scores per trial: ``found`` (greedy generation contains the value, compared after normalisation: lower case,
letters and digits only; a number counts only whole, not inside a longer one) and the cheaper teacher-forced
log-likelihood of the answer tokens (``answer_logprob``, and ``ll_correct``: every answer token is the model's argmax).
"""
from __future__ import annotations

import copy
import inspect
import numbers
import re
from dataclasses import asdict, dataclass, field
from typing import Optional, Protocol, Sequence

import numpy as np
import torch

from foxformer.argtypes import setting_name, unknown_words
from foxformer.data.tokenizer import start_ids
from foxformer.models.calls import cache_of, fresh_cache, model_device, vocab_size_of
from foxformer.progress import progress_bar, working

from .loss import check_finite

MODES = ("standard", "easy")
NEEDLE = "The special magic number for {key} is: {value}."
QUESTION = "What is the special magic number for {key}?"
ANSWER_PREFIX = "The special magic number for {key} is:"
DEFAULT_KEYS = ("Lisbon", "the old lighthouse", "a silver kettle", "the violet comet", "Timbuktu", "the quiet library",
                "a paper crane", "the northern bridge", "Zanzibar", "the wooden flute", "a copper lantern",
                "the frozen lake")
_BOUNDARY = re.compile(r"[.!?\n]\s*$")
# Text the command reads beyond the longest context: each (seed, needle) cuts its prompts from a random offset
# within it, so that they stand in different text. A shorter haystack still serves (offsets then vary less):
# the prompts, needle and question included, are never longer than the longest context.
HAYSTACK_ROOM = 4096


class TextTokenizer(Protocol):
    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


def normalize(text: str) -> str:
    """Lower case, letters and digits only: "Is: 1,234." and "is 1234" compare equal."""
    return re.sub(r"[^0-9a-z]", "", text.lower())


def answer_found(text: str, value: str) -> bool:
    """Whether ``text`` contains ``value`` (after :func:`normalize`); a number only as a whole number, so
    "2478431" is not found in "24784319" (thousands separators may split it: "2,478,431" is found)."""
    v = normalize(value)
    if v.isdigit():
        runs = re.findall(r"\d+", text) + re.findall(r"\d+(?:\s*,\s*\d{3})+", text)
        return any(normalize(run) == v for run in runs)
    return v in normalize(text)


@dataclass
class Needle:
    key: str
    value: str


def make_needle(index: int, seed: int, keys: Sequence[str] = DEFAULT_KEYS) -> Needle:
    """Needle ``index`` of seed ``seed``: a key from ``keys`` and a random 7-digit value (deterministic)."""
    rng = np.random.default_rng([seed, index, 17])
    return Needle(key=keys[int(rng.integers(len(keys)))], value=str(int(rng.integers(1_000_000, 10_000_000))))


@dataclass
class NiahCase:
    """One prompt. prompt: token ids whose length is the context length; answer: ids of " {value}"."""

    prompt: list[int]
    answer: list[int]
    value: str
    length: int
    depth: float
    mode: str
    needle_index: int
    seed: int
    needle_pos: int                         # index of the needle's first token in the prompt
    actual_depth: Optional[float] = None    # needle_pos / haystack tokens in the prompt (depth after snapping)


def snap_window(length: int) -> int:
    """How far (tokens) the needle may move to reach a sentence end: 2% of the context length, 4 to 64."""
    return min(64, max(4, length // 50))


def _snap_to_boundary(tokenizer: TextTokenizer, hay: Sequence[int], pos: int, window: int) -> int:
    """Move ``pos`` to just after the nearest sentence end at most ``window`` tokens away (backwards on a
    tie), else keep it."""
    for dist in range(window + 1):
        for p in (pos - dist, pos + dist):
            if 0 <= p <= len(hay) and (p == 0 or _BOUNDARY.search(tokenizer.decode([hay[p - 1]]))):
                return p
    return pos


def _fixed_parts(tokenizer: TextTokenizer, needle: Needle, mode: str) -> tuple[list[int], list[int], list[int]]:
    """The ids of a prompt that are not haystack: its start (a BOS where the tokenizer has one), the needle (with
    the question in easy mode) and the question that ends it."""
    question = QUESTION.format(key=needle.key)
    fact = NEEDLE.format(key=needle.key, value=needle.value)
    needle_text = f" {question} {fact} " if mode == "easy" else f" {fact} "
    tail = tokenizer.encode(f"\n\n{question} {ANSWER_PREFIX.format(key=needle.key)}")
    return start_ids(tokenizer), tokenizer.encode(needle_text), tail


def _too_short(length: int, fixed: int, label: str) -> ValueError:
    name = setting_name(label, "lengths")
    return ValueError(f"{name}: context length {length} is too short for the needle and question ({fixed} tokens); "
                      f"use {name} > {fixed}")


def check_room(tokenizer: TextTokenizer, lengths: Sequence[int], modes: Sequence[str], needles: int,
               seeds: Sequence[int], keys: Sequence[str] = DEFAULT_KEYS, *, label: str = "{}") -> None:
    """Refuse ``lengths`` whose shortest leaves no haystack beside the longest needle and question of the grid's
    needles and modes (their tokens depend on ``tokenizer`` alone), before a model or the haystack is read.
    ``label``: as check_grid's."""
    fixed = max(sum(map(len, _fixed_parts(tokenizer, make_needle(n, seed, keys), mode)))
                for seed in seeds for n in range(needles) for mode in modes)
    if min(lengths) <= fixed:
        raise _too_short(min(lengths), fixed, label)


def build_case(tokenizer: TextTokenizer, haystack: Sequence[int], length: int, depth: float, needle: Needle, *,
               mode: str = "standard", offset: int = 0, needle_index: int = 0, seed: int = 0,
               label: str = "{}") -> NiahCase:
    """Prompt of exactly ``length`` tokens: haystack[offset:...] with the needle at relative ``depth``. ``label``:
    as check_grid's."""
    if mode not in MODES:
        raise ValueError(f"mode: expected one of {MODES}, got {mode!r}")
    if not 0.0 <= depth <= 1.0:
        raise ValueError(f"depths: expected values in [0, 1], got {depth!r}")
    head, needle_ids, tail = _fixed_parts(tokenizer, needle, mode)
    answer = tokenizer.encode(f" {needle.value}")
    fixed = len(head) + len(needle_ids) + len(tail)
    budget = length - fixed
    if budget < 1:
        raise _too_short(length, fixed, label)
    if offset + budget > len(haystack):
        raise ValueError(f"{setting_name(label, 'haystack')}: {len(haystack)} tokens cannot fill a context of "
                         f"{length} tokens (needs {offset + budget}); give a longer haystack source")
    hay = list(haystack[offset:offset + budget])
    pos = _snap_to_boundary(tokenizer, hay, int(round(depth * budget)), snap_window(length))
    prompt = head + hay[:pos] + needle_ids + hay[pos:] + tail
    return NiahCase(prompt=prompt, answer=answer, value=needle.value, length=length, depth=float(depth), mode=mode,
                    needle_index=needle_index, seed=seed, needle_pos=pos, actual_depth=pos / budget)


def _step(model, ids: torch.Tensor, cache, last_only: bool = False):
    kw = {}
    if last_only and "logits_to_keep" in inspect.signature(model.forward).parameters:
        kw["logits_to_keep"] = 1  # a 16K-token prompt would otherwise make [16K, V] logits (3 GB in fp32)
    out = model(input_ids=ids, past_key_values=cache, use_cache=True, **kw)
    return out.logits[:, -1].float(), cache_of(out), out.logits


@torch.no_grad()
def answer_loglik(model: torch.nn.Module, prompt: Sequence[int], answer: Sequence[int]) -> tuple[float, bool]:
    """(sum of log p(answer | prompt), whether every answer token is the argmax) from one forward pass."""
    dev = model_device(model)
    ids = torch.tensor([list(prompt) + list(answer)], device=dev)
    n = len(answer)
    if "logits_to_keep" in inspect.signature(model.forward).parameters:
        logits = model(input_ids=ids, logits_to_keep=n + 1).logits[0, :-1].float()  # the answer's predictors
    else:
        logits = model(input_ids=ids).logits[0, len(prompt) - 1:-1].float()
    return _score_answer(logits, answer)


def _score_answer(logits: torch.Tensor, answer: Sequence[int]) -> tuple[float, bool]:
    """logits [len(answer), V] predicting each answer token."""
    check_finite(logits, "niah")
    target = torch.tensor(list(answer), device=logits.device)
    logp = torch.log_softmax(logits, dim=-1)
    total = float(logp.gather(1, target[:, None]).sum())
    return total, bool((logits.argmax(-1) == target).all())


@torch.no_grad()
def run_case(model: torch.nn.Module, tokenizer: TextTokenizer, case: NiahCase, *, generate: bool = True,
             max_new_tokens: Optional[int] = None) -> dict:
    """Score one prompt. With ``generate`` the prompt is prefilled once with a KV cache; a copy of the cache
    scores the answer by teacher forcing, the original decodes greedily."""
    dev = model_device(model)
    rec = {"length": case.length, "depth": case.depth, "mode": case.mode, "needle": case.needle_index,
           "seed": case.seed, "value": case.value, "needle_pos": case.needle_pos, "actual_depth": case.actual_depth}
    if not generate:
        rec["answer_logprob"], rec["ll_correct"] = answer_loglik(model, case.prompt, case.answer)
        return rec
    new = max_new_tokens if max_new_tokens is not None else len(case.answer) + 4
    # The last new token is never fed back; the scoring copy is fed all but the last answer token.
    fed = len(case.prompt) + max(new - 1, len(case.answer) - 1, 0)
    cache = fresh_cache(model, fed)
    last, cache, _ = _step(model, torch.tensor([case.prompt], device=dev), cache, last_only=True)
    forced_cache = copy.deepcopy(cache)
    if len(case.answer) > 1:
        _, _, logits = _step(model, torch.tensor([case.answer[:-1]], device=dev), forced_cache)
        answer_logits = torch.cat([last, logits[0].float()], dim=0)
    else:
        answer_logits = last
    rec["answer_logprob"], rec["ll_correct"] = _score_answer(answer_logits, case.answer)
    del forced_cache
    generated: list[int] = []
    for step in range(new):
        token = int(last.argmax(-1))
        generated.append(token)
        if step + 1 < new:
            last, cache, _ = _step(model, torch.tensor([[token]], device=dev), cache)
    text = tokenizer.decode(generated)
    rec["generated"] = text
    rec["found"] = answer_found(text, case.value)
    return rec


@dataclass
class NiahResult:
    """All trials of one model plus the grid axes. ``grid(mode, metric)`` -> [depths][lengths] means, the
    trials bucketed by requested depth; metric "actual_depth" gives where their needles really were."""

    name: str
    lengths: list
    depths: list
    modes: list
    train_len: Optional[int] = None
    generate: bool = True
    records: list = field(default_factory=list)

    def grid(self, mode: str, metric: str = "accuracy") -> list:
        key = {"accuracy": "found", "ll_accuracy": "ll_correct", "answer_logprob": "answer_logprob",
               "actual_depth": "actual_depth"}.get(metric)
        if key is None:
            raise ValueError(f"metric: expected 'accuracy', 'll_accuracy', 'answer_logprob' or 'actual_depth', "
                             f"got {metric!r}")
        if key == "found" and not self.generate:
            key = "ll_correct"
        out = []
        for d in self.depths:
            row = []
            for l in self.lengths:
                vals = [float(r[key]) for r in self.records  # records from before actual_depth lack it
                        if r["mode"] == mode and r["length"] == l and abs(r["depth"] - d) < 1e-9
                        and r.get(key) is not None]
                row.append(float(np.mean(vals)) if vals else float("nan"))
            out.append(row)
        return out

    def summary(self) -> dict:
        out = {"name": self.name, "train_len": self.train_len, "trials": len(self.records)}
        for mode in self.modes:
            rs = [r for r in self.records if r["mode"] == mode]
            if self.generate:
                out[f"{mode}_accuracy"] = float(np.mean([r["found"] for r in rs]))
            out[f"{mode}_ll_accuracy"] = float(np.mean([r["ll_correct"] for r in rs]))
        shifts = [abs(r["actual_depth"] - r["depth"]) for r in self.records if r.get("actual_depth") is not None]
        if shifts:  # how far the needles moved from their requested depths to reach sentence ends
            out["max_depth_shift"] = float(max(shifts))
        return out

    @classmethod
    def from_dict(cls, d: dict) -> "NiahResult":
        """Back from one entry of niah.json's "models" (``to_dict`` plus the summary)."""
        return cls(name=d["name"], lengths=d["lengths"], depths=d["depths"], modes=d["modes"],
                   train_len=d.get("train_len"), generate=d.get("generate", True), records=d["records"])

    def to_dict(self) -> dict:
        d = asdict(self)
        d["summary"] = self.summary()
        d["grids"] = {mode: {m: self.grid(mode, m) for m in ("accuracy", "ll_accuracy", "answer_logprob",
                                                               "actual_depth")}
                      for mode in self.modes}
        return d


def check_grid(lengths, depths, modes, needles: int, seeds, max_new_tokens: Optional[int] = None, *,
               label: str = "{}") -> None:
    """Refuse a grid niah_grid cannot run, before any model is loaded. ``label`` names the settings as
    argtypes.setting_name does: the keywords by default, "--{}" the flags of `eval niah`."""
    def name(field: str) -> str:
        return setting_name(label, field)

    if not lengths or any(isinstance(l, bool) or not isinstance(l, int) or l < 2 for l in lengths):
        raise ValueError(f"{name('lengths')}: expected a non-empty list of integer context lengths >= 2, got "
                         f"{lengths!r}")
    if not depths or any(not 0.0 <= float(d) <= 1.0 for d in depths):
        raise ValueError(f"{name('depths')}: expected a non-empty list of numbers in [0, 1], got {depths!r}")
    bad = unknown_words(modes, MODES)
    if not modes or bad:
        raise ValueError(f"{name('modes')}: expected a non-empty subset of {MODES}, got {bad or 'none'}")
    if isinstance(needles, bool) or not isinstance(needles, int) or needles < 1:
        raise ValueError(f"{name('needles')}: expected a positive integer (needles per cell), got {needles!r}")
    if not seeds:
        raise ValueError(f"{name('seeds')}: expected at least one seed")
    # numpy's own error for a negative seed names no argument
    if any(isinstance(s, bool) or not isinstance(s, numbers.Integral) or s < 0 for s in seeds):
        raise ValueError(f"{name('seeds')}: expected non-negative integers, got {list(seeds)!r}")
    # no new tokens cannot contain the answer: every trial would be scored as missed
    if max_new_tokens is not None and (isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int)
                                       or max_new_tokens < 1):
        raise ValueError(f"{name('max_new_tokens')}: expected a positive integer, got {max_new_tokens!r}")
    # a repeat runs its trials again: a heatmap row shown twice, or a cell's accuracy over copies of one trial
    for key, values in (("lengths", lengths), ("depths", depths), ("modes", modes), ("seeds", seeds)):
        values = list(values)
        twice = next((v for i, v in enumerate(values) if v in values[:i]), None)
        if twice is not None:
            raise ValueError(f"{name(key)}: {twice!r} is given more than once in {values}; give each value once")


def niah_grid(model: torch.nn.Module, tokenizer: TextTokenizer, haystack: Sequence[int], *,
              lengths: Sequence[int], depths: Sequence[float] = (0.0, 0.25, 0.5, 0.75, 1.0),
              modes: Sequence[str] = MODES, needles: int = 2, seeds: Sequence[int] = (0,),
              keys: Sequence[str] = DEFAULT_KEYS, generate: bool = True, max_new_tokens: Optional[int] = None,
              name: str = "model", train_len: Optional[int] = None, progress: bool = True,
              label: str = "{}") -> NiahResult:
    """Run every (mode, length, depth, needle, seed) trial. ``haystack``: token ids of local text, at least
    max(lengths) long (plus room for the per-seed offsets). ``label``: as check_grid's."""
    lengths, depths, modes, seeds = list(lengths), [float(d) for d in depths], list(modes), list(seeds)
    check_grid(lengths, depths, modes, needles, seeds, max_new_tokens, label=label)
    check_room(tokenizer, lengths, modes, needles, seeds, keys, label=label)
    vocab = vocab_size_of(model)
    if vocab is not None and haystack and max(haystack) >= vocab:
        raise ValueError(f"{setting_name(label, 'haystack')}: token id {max(haystack)} is outside the model's "
                         f"vocabulary of {vocab}; use the tokenizer the model was trained with")
    result = NiahResult(name=name, lengths=lengths, depths=depths, modes=modes, train_len=train_len,
                        generate=generate)
    total = len(modes) * len(lengths) * len(depths) * needles * len(seeds)
    bar = progress_bar(total=total, desc=f"niah {name}", unit="trial", wanted=progress)
    for seed in seeds:
        for n in range(needles):
            needle = make_needle(n, seed, keys)
            rng = np.random.default_rng([seed, n, 29])
            for length in lengths:
                spare = max(0, len(haystack) - length)
                offset = int(rng.integers(spare + 1)) if spare else 0
                for mode in modes:
                    for depth in depths:
                        case = build_case(tokenizer, haystack, length, depth, needle, mode=mode, offset=offset,
                                          needle_index=n, seed=seed, label=label)
                        with working(bar, f"a {length:,}-token context, {mode}, depth {depth:g}"):
                            result.records.append(run_case(model, tokenizer, case, generate=generate,
                                                           max_new_tokens=max_new_tokens))
                        bar.update(1)
    bar.close()
    return result
