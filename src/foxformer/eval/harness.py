"""lm-evaluation-harness for foxformer models (``pip install lm_eval``; it is optional).

:class:`HarnessAdapter` does the work with no lm_eval import (log-likelihoods, rolling log-likelihoods, greedy
generation until stop strings), so it is tested without lm_eval; :func:`make_lm` wraps it in an
``lm_eval.api.model.LM`` subclass when lm_eval is installed, and :func:`run_harness` calls
``lm_eval.simple_evaluate`` with it.

Offline use: lm_eval tasks read their data through Hugging Face ``datasets``. Without network only these run:
  - tasks whose datasets are already in the local Hugging Face cache (set HF_DATASETS_OFFLINE=1 and
    HF_HUB_OFFLINE=1, which run_harness also sets for itself where the Hub does not answer; copy
    ~/.cache/huggingface/datasets from a machine with network);
  - tasks that generate their data: RULER's synthetic tasks with generated haystacks (niah_single_1,
    niah_multikey_2, niah_multikey_3, ruler_vt, ruler_cwe, ruler_fwe); they need lm_eval's extra packages
    (wonderwords, nltk) and an offline-loadable Hugging Face tokenizer passed in ``metadata``
    (e.g. {"tokenizer": "/path/to/gpt2-tokenizer", "max_seq_lengths": [4096]}). RULER tasks with essay
    haystacks (niah_single_2, ...) download the essays and do not run offline.
  That list is from lm_eval's documentation. Tested here with lm_eval 0.4.13: task YAMLs over local JSON
  files (``include_path``), multiple-choice and generate_until, run offline (tests/eval/test_harness.py).
  ``foxformer eval niah`` and ``foxformer eval loss`` need no lm_eval and no network.
"""
from __future__ import annotations

import contextlib
import functools
import os
import socket
import urllib.parse
import urllib.request
from typing import Optional, Sequence

import torch

from foxformer import __version__
from foxformer.argtypes import did_you_mean, setting_name, unset_said
from foxformer.data.tokenizer import start_ids
from foxformer.json_text import json_text
from foxformer.models.calls import cache_of, fresh_cache, model_device
from foxformer.paths import write_text
from foxformer.progress import bars_shown, progress_bar
from foxformer.provenance import code_version

from .loss import check_batch_size, check_finite
from .outputs import mark_output_folder, note_replacing


def check_max_length(max_length, *, label: str = "{}") -> None:
    """``label`` names the setting as argtypes.setting_name does: the keyword, or "--{}" a command's flag."""
    if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 2:
        raise ValueError(f"{setting_name(label, 'max_length')}: expected an integer >= 2, got {max_length!r}")


def check_request(tasks, num_fewshot=None, limit=None, *, label: str = "{}") -> None:
    """What run_harness asks lm_eval for, refused before lm_eval (or, in the CLI, any model) loads: lm_eval ran a
    negative num_fewshot as zero-shot, a limit of 0 as no limit and a limit of 2.5 as 2. ``label``: as
    check_max_length's."""
    if not tasks:
        raise ValueError(f"{setting_name(label, 'tasks')}: expected at least one lm_eval task name")
    if num_fewshot is not None and (isinstance(num_fewshot, bool) or not isinstance(num_fewshot, int)
                                    or num_fewshot < 0):
        raise ValueError(f"{setting_name(label, 'num_fewshot')}: expected an integer >= 0, got {num_fewshot!r}; "
                         f"{unset_said(label)} for each task's own")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, (int, float)) or not limit > 0
                              or (limit >= 1 and not float(limit).is_integer())):
        raise ValueError(f"{setting_name(label, 'limit')}: expected a whole number of examples per task or a "
                         f"fraction in (0, 1), got {limit!r}; {unset_said(label)} for all of them")


class HarnessAdapter:
    """Text-level scoring for one causal LM. ``tokenizer``: encode(str) -> ids, decode(ids) -> str, and an
    ``eot_id``; every sequence starts with its ``bos_id`` when it has one (gpt2-json), else with ``eot_id`` (so a
    request with an empty context still has a token to predict from). ``max_length``: context window used
    (inputs are cut from the left)."""

    def __init__(self, model: torch.nn.Module, tokenizer, *, max_length: int = 2048, batch_size: int = 8,
                 progress: bool = True):
        check_max_length(max_length)
        check_batch_size(batch_size)
        self.model, self.tokenizer = model.eval(), tokenizer
        self.max_length, self.batch_size, self.progress = max_length, batch_size, progress
        self.eot_id = int(getattr(tokenizer, "eot_id", 0))
        self.start_id = (start_ids(tokenizer) or [self.eot_id])[0]

    def _split(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        # Encoding the joined text and splitting it keeps the tokenization the model saw in training at the
        # seam (trailing spaces of the context move into the continuation, as lm_eval's own models do).
        spaces = len(context) - len(context.rstrip())
        if spaces:
            context, continuation = context[:-spaces], context[-spaces:] + continuation
        whole = self.tokenizer.encode(context + continuation)
        ctx = self.tokenizer.encode(context) if context else []
        n_ctx = len(ctx) if whole[:len(ctx)] == ctx else len(ctx) - 1
        cont = whole[n_ctx:] or self.tokenizer.encode(continuation)
        return ([self.start_id] + whole[:n_ctx]) if n_ctx else [self.start_id], cont

    @torch.no_grad()
    def _score(self, items: Sequence[tuple[list[int], list[int]]]) -> list[tuple[float, bool]]:
        """(sum log p(cont | ctx), greedy) for token pairs, batched by length with right padding."""
        out: list = [None] * len(items)
        for i, (_, cont) in enumerate(items):
            # The window holds max_length inputs: a longer continuation cannot be scored whole (and a partial
            # sum would be a different number than lm_eval asks for).
            if len(cont) > self.max_length:
                raise ValueError(f"max_length: a continuation of {len(cont)} tokens does not fit the context "
                                 f"window of {self.max_length} tokens; pass a larger max_length (--max-length)")
            if not cont:  # nothing to score; alone it would be an empty forward (both strings empty)
                out[i] = (0.0, True)
        order = sorted((i for i in range(len(items)) if items[i][1]),
                       key=lambda i: -len(items[i][0]) - len(items[i][1]))
        dev = model_device(self.model)
        for s in progress_bar(range(0, len(order), self.batch_size), desc="loglikelihood", unit="batch",
                              wanted=self.progress):
            idx = order[s:s + self.batch_size]
            seqs = []
            for i in idx:
                ctx, cont = items[i]
                ids = (ctx + cont)[-(self.max_length + 1):][:-1]  # the last token is only a target
                seqs.append(ids)
            width = max(len(x) for x in seqs)
            batch = torch.zeros(len(seqs), width, dtype=torch.long)
            for r, ids in enumerate(seqs):
                batch[r, :len(ids)] = torch.tensor(ids)
            logits = self.model(input_ids=batch.to(dev)).logits.float()
            check_finite(logits, "harness")
            logp = torch.log_softmax(logits, dim=-1)
            for r, i in enumerate(idx):
                cont = items[i][1]
                n = len(seqs[r])
                rows = logp[r, n - len(cont):n]
                target = torch.tensor(cont, device=rows.device)
                out[i] = (float(rows.gather(1, target[:, None]).sum()), bool((rows.argmax(-1) == target).all()))
        return out

    def loglikelihood(self, pairs: Sequence[tuple[str, str]]) -> list[tuple[float, bool]]:
        """lm_eval's loglikelihood: for (context, continuation) strings."""
        return self._score([self._split(c, x) for c, x in pairs])

    @torch.no_grad()
    def loglikelihood_rolling(self, texts: Sequence[str]) -> list[float]:
        """Total log-likelihood of each text, in windows of ``max_length`` that each see the most context."""
        dev = model_device(self.model)
        out = []
        for text in progress_bar(texts, desc="rolling", unit="doc", wanted=self.progress):
            toks = [self.start_id] + self.tokenizer.encode(text)
            total, a = 0.0, 1
            while a < len(toks):
                b = min(len(toks), a + self.max_length)
                s = max(0, b - 1 - self.max_length)
                logits = self.model(input_ids=torch.tensor([toks[s:b - 1]], device=dev)).logits[0].float()
                check_finite(logits, "harness")
                logp = torch.log_softmax(logits[a - 1 - s:], dim=-1)
                target = torch.tensor(toks[a:b], device=logp.device)
                total += float(logp.gather(1, target[:, None]).sum())
                a = b
            out.append(total)
        return out

    @torch.no_grad()
    def generate_until(self, requests: Sequence[tuple[str, dict]]) -> list[str]:
        """Greedy continuation of each context until a stop string or ``max_gen_toks`` tokens."""
        dev = model_device(self.model)
        out = []
        for context, kwargs in progress_bar(requests, desc="generate", unit="req", wanted=self.progress):
            until = kwargs.get("until") or []
            until = [until] if isinstance(until, str) else list(until)
            max_new = int(kwargs.get("max_gen_toks", 256))
            ids = ([self.start_id] + self.tokenizer.encode(context))[-max(1, self.max_length - max_new):]
            # The last new token is never fed back: the cache sees the context and max_new - 1 tokens.
            cache = fresh_cache(self.model, len(ids) + max_new - 1)
            res = self.model(input_ids=torch.tensor([ids], device=dev), past_key_values=cache, use_cache=True)
            check_finite(res.logits[0, -1], "harness")
            generated: list[int] = []
            text = ""
            for _ in range(max_new):
                token = int(res.logits[0, -1].argmax())
                if token == self.eot_id:
                    break
                generated.append(token)
                text = self.tokenizer.decode(generated)
                if any(u in text for u in until) or len(generated) == max_new:
                    break
                res = self.model(input_ids=torch.tensor([[token]], device=dev), past_key_values=cache_of(res),
                                 use_cache=True)
            for u in until:
                text = text.split(u)[0]
            out.append(text)
        return out


def lm_eval_available() -> bool:
    try:
        import lm_eval  # noqa: F401
    except ImportError:
        return False
    return True


def require_lm_eval() -> type:
    """lm_eval's ``LM`` base class; an ImportError saying how to install lm_eval where it is missing."""
    try:
        from lm_eval.api.model import LM
    except ImportError as e:
        raise ImportError("foxformer eval harness needs lm-evaluation-harness: pip install lm_eval "
                          "(the GPU machine has no registry: install it on a machine that has one)") from e
    return LM


def make_lm(adapter: HarnessAdapter):
    """An ``lm_eval.api.model.LM`` delegating to ``adapter``. Raises ImportError without lm_eval."""
    LM = require_lm_eval()

    class FoxLM(LM):
        """foxformer model for lm-evaluation-harness (requests are lm_eval Instances with ``.args``)."""

        def __init__(self):
            super().__init__()
            self.adapter = adapter

        def loglikelihood(self, requests, disable_tqdm: bool = False):
            return self.adapter.loglikelihood([r.args for r in requests])

        def loglikelihood_rolling(self, requests, disable_tqdm: bool = False):
            return self.adapter.loglikelihood_rolling([r.args[0] for r in requests])

        def generate_until(self, requests, disable_tqdm: bool = False):
            return self.adapter.generate_until([(r.args[0], r.args[1]) for r in requests])

    return FoxLM()


def known_tasks(tasks: Sequence[str], include_path: Optional[str] = None, *, label: str = "{}"):
    """lm_eval's TaskManager over its tasks and ``include_path``'s, refusing a task it does not know (lm_eval's
    KeyError left a traceback, not a line naming the task). It reads every task YAML, seconds: the CLI makes it
    once, before any model loads, for every model's run_harness. ``label``: as check_max_length's."""
    require_lm_eval()
    from lm_eval.tasks import TaskManager

    manager = TaskManager(include_path=include_path)
    for task in tasks:
        if task in manager.all_tasks or os.path.exists(task) or ("*" in task and manager.match_tasks([task])):
            continue
        raise ValueError(f"{setting_name(label, 'tasks')}: lm_eval knows no task {task!r}"
                         f"{did_you_mean(task, manager.all_tasks)}; `lm_eval ls tasks` lists them, "
                         f"{setting_name(label, 'include_path')} adds a folder of task YAMLs")
    return manager


def run_harness(adapter: HarnessAdapter, tasks: Sequence[str], *, num_fewshot: Optional[int] = None,
                limit: Optional[float] = None, metadata: Optional[dict] = None, out_path: Optional[str] = None,
                include_path: Optional[str] = None, task_manager=None) -> dict:
    """``lm_eval.simple_evaluate`` on ``tasks``; returns (and writes to ``out_path``) its "results" part.

    ``include_path``: a folder of lm_eval task YAML files (for example tasks over local JSON files,
    which run offline) added to lm_eval's own tasks. ``task_manager``: what known_tasks returned for these
    tasks and include_path, to reuse (else it is made here)."""
    check_request(tasks, num_fewshot, limit)
    lm = make_lm(adapter)
    import lm_eval

    manager = task_manager if task_manager is not None else known_tasks(tasks, include_path)
    kwargs = dict(model=lm, tasks=list(tasks), num_fewshot=num_fewshot, limit=limit, task_manager=manager)
    if metadata:
        kwargs["metadata"] = metadata
    with _lm_eval_bars(adapter.progress), _offline_where_unreachable() as unreachable, _foxformers_commit() as commit:
        try:
            res = lm_eval.simple_evaluate(**kwargs)
        except ConnectionError as e:  # datasets' "Couldn't reach '...' on the Hub" said nothing of what to do
            where = f", which cannot be reached from here ({unreachable}), and it is not cached" if unreachable else ""
            raise ConnectionError(f"{e}: a task's data comes from the Hugging Face Hub{where}; connect to it, or "
                                  f"where the data is cached set HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1") from e
    results = {"results": res.get("results", {}), "versions": res.get("versions", {}),
               "n-shot": res.get("n-shot", {}), "config": {"tasks": list(tasks), "num_fewshot": num_fewshot,
                                                           "limit": limit, "max_length": adapter.max_length},
               "foxformer": {"version": __version__, "commit": commit}}
    if out_path:
        note_replacing(out_path)
        mark_output_folder(os.path.dirname(out_path) or os.curdir)
        # the earlier results stay until these are whole: a Ctrl-C mid-write left a truncated file
        write_text(out_path, json_text(results, indent=2, default=str))
    return results


@contextlib.contextmanager
def _foxformers_commit():
    """Yields foxformer's commit (provenance.code_version) and, for the block, gives it to lm_eval as the commit it
    records: lm_eval ran `git describe` in the working folder, whose "fatal: not a git repository" reached the
    user's terminal outside a checkout, and inside one named that checkout's commit, not foxformer's. Only that
    lookup is replaced, so no git runs there and nothing else on stderr is hidden; a release of lm_eval without
    the name runs as it would without this."""
    import lm_eval.evaluator

    commit = code_version()
    lookup = getattr(lm_eval.evaluator, "get_git_commit_hash", None)
    if lookup is None:
        yield commit
        return
    lm_eval.evaluator.get_git_commit_hash = lambda: commit
    try:
        yield commit
    finally:
        lm_eval.evaluator.get_git_commit_hash = lookup


def _hub_unreachable(timeout: float = 3.0) -> Optional[str]:
    """The Hugging Face Hub's address where one connection to it fails within ``timeout`` seconds, else None.
    Behind a proxy a direct connection tells nothing, so there the Hub counts as reachable."""
    from huggingface_hub import constants

    url = urllib.parse.urlsplit(constants.ENDPOINT)
    proxies = urllib.request.getproxies()
    if proxies.get(url.scheme) or proxies.get("all"):
        return None
    try:
        socket.create_connection((url.hostname, url.port or (443 if url.scheme == "https" else 80)),
                                 timeout=timeout).close()
    except OSError:
        return constants.ENDPOINT
    return None


@contextlib.contextmanager
def _offline_where_unreachable():
    """Hugging Face's offline mode for the block where the Hub cannot be reached (yields its address, else None):
    without it a task's data not in the local cache cost ~25 s of huggingface_hub's retries before the advice.
    Set in the libraries' constants, read once at their import
    from HF_HUB_OFFLINE / HF_DATASETS_OFFLINE; a user who set those is not second-guessed."""
    import datasets.config
    from huggingface_hub import constants

    # only the constants these versions have: a release that renames one then runs as it would without this
    owners = [(owner, name) for owner, name in ((constants, "HF_HUB_OFFLINE"), (datasets.config, "HF_HUB_OFFLINE"),
                                                (datasets.config, "HF_DATASETS_OFFLINE")) if hasattr(owner, name)]
    offline = any(getattr(owner, name) for owner, name in owners)
    unreachable = None if offline or not owners else _hub_unreachable()
    if unreachable is None:
        yield None
        return
    saved = [getattr(owner, name) for owner, name in owners]
    for owner, name in owners:
        setattr(owner, name, True)
    try:
        yield unreachable
    finally:
        for (owner, name), value in zip(owners, saved):
            setattr(owner, name, value)


@contextlib.contextmanager
def _lm_eval_bars(wanted: bool):
    """lm_eval's own bars (a task's documents as its requests are built, the bootstrap of a metric's stderr: plain
    tqdm, which no argument turns off) and those of the ``datasets`` it reads a task's data with, drawn only where
    bars_shown(wanted), as before after the block: `--no-progress` left them on, and off a terminal they wrote their
    frames into the log."""
    if bars_shown(wanted):
        yield
        return
    import datasets.utils as datasets_bars
    import lm_eval.api.task
    import tqdm

    datasets_were_off = datasets_bars.are_progress_bars_disabled()
    # the names lm_eval calls: its task module imported tqdm's class, its metrics import it as they run
    owners = [(lm_eval.api.task, lm_eval.api.task.tqdm), (tqdm, tqdm.tqdm)]
    for owner, bar in owners:
        owner.tqdm = functools.partial(bar, disable=True)
    datasets_bars.disable_progress_bars()
    try:
        yield
    finally:
        for owner, bar in owners:
            owner.tqdm = bar
        if not datasets_were_off:
            datasets_bars.enable_progress_bars()
