"""Streaming generation: ``foxformer.generate(model, tokenizer_or_ids, ...)`` yields tokens as they come.

One forward over the prompt (optionally in chunks), then one token per step on top of the model's
cache (FoxCache for foxformer models: preallocated, optionally evicting, its one-token steps replayed as
CUDA graphs on a GPU; any other Hugging Face causal LM uses its own cache). Sampling on the device:
temperature (0 = greedy), top-k, top-p, seeded.
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
import warnings
from dataclasses import dataclass
from typing import Iterator, Optional, Sequence

import numpy as np
import torch

from foxformer.argtypes import did_you_mean, setting_name, unset_said
from foxformer.data.tokenizer import start_ids
from foxformer.models.calls import backbone, cache_keyword, cache_of, fresh_cache, model_device
from foxformer.models.kvcache import EvictionPolicy, FoxCache, check_eviction
from foxformer.models.loss import check_token_ids
from foxformer.models.trained_length import warn_past_train_len
from foxformer.progress import progress_bar, working
from foxformer.train.loading import LoadedModel

from .bias_shift import HeldShift


class GreedyNote(UserWarning):
    """generate's warning that greedy decoding leaves sampling settings without effect (GenerationConfig.greedy_note):
    a command that says it in a line of its own, before the model loads, leaves this one out."""


@dataclass
class GenerationConfig:
    """Options of :func:`generate` / :func:`stream_tokens`.

    temperature: 0 means greedy. top_k / top_p: None or 0 / 1.0 disable them.
    seed: seeds a private generator (the global RNG is untouched); None draws from the global RNG.
    evict_eps, evict_qk_bound, evict_max_len: KV eviction (foxformer models; see models/kvcache/policy.py);
        None falls back to the model config's values.
    fgate_bias_shift: added to the forget-gate logits while generating (float, [L] or [L][H]); None
        keeps the model's own setting.
    prefill_chunk: prompt tokens per forward (None: the whole prompt at once). Smaller chunks let
        eviction bound the memory of long prompts.
    stop_token: stop a row once it emits this id (None: never stop early, or with a tokenizer that has an
        end-of-text id, stop there). ignore_eos: with a tokenizer, do not stop at its end-of-text id.
    stop: stop strings (one str or a list of them; with a tokenizer only, as they are found in the decoded text):
        a row ends once its text contains one of them, and its text is cut before it (the stop string is not
        part of the output, as the stop token is not; a stream holds back text that may begin one until the next
        token tells). Each row of a batch ends at its own.
    decode: how foxformer models run one-token steps: "auto" (CUDA graphs where possible, else eager),
        "graphs" (the same, with a one-line note where they are not possible; refused for a model off CUDA),
        "compiled" (graphs of the torch.compile'd step; likewise), "static" (the graph-safe step without
        capture), "eager".
    """

    max_new_tokens: int = 64
    temperature: float = 1.0
    top_k: Optional[int] = None
    top_p: Optional[float] = None
    seed: Optional[int] = None
    evict_eps: Optional[float] = None
    evict_qk_bound: Optional[float] = None
    evict_max_len: Optional[int] = None
    fgate_bias_shift: Optional[float | list] = None
    prefill_chunk: Optional[int] = None
    stop_token: Optional[int] = None
    stop: Optional[str | Sequence[str]] = None
    ignore_eos: bool = False
    decode: str = "auto"

    def __post_init__(self):
        # NumPy scalars (a sweep's np.arange / np.linspace values) as the Python numbers they hold: np.int64 top_k or
        # seed, np.float32 temperature were refused as "expected an integer / a number" (np.float64, a float, passed)
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if isinstance(value, np.generic) and isinstance(value.item(), (bool, int, float)):
                setattr(self, field.name, value.item())

    def validate(self, label: str = "{}", device: Optional[torch.device | str] = None) -> None:
        """ValueError naming the first bad setting; ``label`` formats its name (argtypes.setting_name): the
        keyword by default, "--{}" for the CLI's flags. ``device``: where the model runs, if known (a decode mode
        asks for CUDA graphs: FoxCache.check_decode)."""
        unset = unset_said(label)

        def refuse(field: str, expected: str, unset_for: str = "") -> None:
            value = getattr(self, field)
            hint = f"; {unset} {unset_for}" if unset_for else ""
            raise ValueError(f"{setting_name(label, field)}: expected {expected}, got {value!r}{hint}")

        if isinstance(self.max_new_tokens, bool) or not isinstance(self.max_new_tokens, int) or \
                self.max_new_tokens < 0:
            refuse("max_new_tokens", "an integer >= 0")
        # NaN passes `< 0` (and fails in multinomial after the prefill); inf makes every logit 0, so
        # top-k / top-p would keep the whole vocabulary.
        if isinstance(self.temperature, bool) or not isinstance(self.temperature, (int, float)) or \
                not math.isfinite(self.temperature) or self.temperature < 0:
            refuse("temperature", "a finite number >= 0 (0 = greedy)")
        if self.top_k is not None and (isinstance(self.top_k, bool) or not isinstance(self.top_k, int)
                                       or self.top_k < 0):
            refuse("top_k", "an integer >= 0", "(or 0) to sample from every token")
        if self.top_p is not None and (isinstance(self.top_p, bool) or not isinstance(self.top_p, (int, float))
                                       or not 0 < self.top_p <= 1):
            refuse("top_p", "a number in (0, 1]", "(or 1) for no nucleus sampling")
        # True is an int (1): prefill_chunk=True, read as "chunk the prompt", fed it one token per forward
        if self.prefill_chunk is not None and (isinstance(self.prefill_chunk, bool) or
                                               not isinstance(self.prefill_chunk, int) or self.prefill_chunk < 1):
            refuse("prefill_chunk", "a positive integer", "to read the prompt in one forward")
        check_eviction(self.evict_eps, self.evict_qk_bound, self.evict_max_len, label=label)
        check_evict_len(self.evict_max_len, self.max_new_tokens, label=label)
        # torch.Generator.manual_seed's range: past it a bare "Overflow when unpacking long long" after the load
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)
                                      or not -2**63 <= self.seed < 2**64):
            refuse("seed", "an integer in [-2**63, 2**64)", "for a new draw each time")
        stop = self.stop_token
        if stop is not None and (isinstance(stop, bool) or not isinstance(stop, int) or stop < 0):
            refuse("stop_token", "a token id (an integer >= 0)", "to stop at the tokenizer's end of text")
        _stop_strings(self.stop, label)
        FoxCache.check_decode(self.decode, device, label)

    def greedy_note(self, label: str = "{}") -> str:
        """What says which sampling settings greedy decoding (temperature 0) leaves without effect, or "" when none
        is set: --temperature 0 --top-k 5 --seed 3 decoded greedily without a word. A note (the CLI's line, and
        generate's GreedyNote warning), not a refusal: the settings are harmless there, and a sweep over
        temperatures down to 0 keeps its others. ``label``: as validate's."""
        if self.temperature != 0:
            return ""
        set_ = [f for f, on in (("top_k", bool(self.top_k)), ("top_p", self.top_p is not None and self.top_p < 1),
                                ("seed", self.seed is not None)) if on]
        if not set_:
            return ""
        names = ", ".join(setting_name(label, f) for f in set_)
        return (f"{names} {'has' if len(set_) == 1 else 'have'} no effect under greedy decoding "
                f"({setting_name(label, 'temperature')} 0 takes the most likely token)")


def check_evict_len(max_len: Optional[int], max_new_tokens: int, prompt_tokens: Optional[int] = None,
                    label: str = "{}") -> None:
    """ValueError unless N = ``max_len`` (None passes) covers what the cache is fed: the prompt (None: not read yet,
    so its least, one token) and every new token but the last, which is never fed back. Past N the model refuses
    to go (the eps bound no longer holds), so a short N is caught here, before any model loads or token streams.
    ``label``: as GenerationConfig.validate's."""
    fed = (prompt_tokens or 1) + max(max_new_tokens - 1, 0)
    if max_len is None or max_len >= fed:
        return
    flag = label.startswith("--")
    new = f"{setting_name(label, 'max_new_tokens')}{' ' if flag else '='}{max_new_tokens}"
    prompt = "at least one token" if prompt_tokens is None else f"{prompt_tokens} tokens"
    raise ValueError(f"{setting_name(label, 'evict_max_len')}: expected an integer >= {fed}, got {max_len}; it bounds "
                     f"the tokens the cache holds: the prompt ({prompt}) and every new token but the last ({new})")


_NO_TEXT = ("stop: stop strings are found in the decoded text, which token ids alone do not give; pass a tokenizer and "
            "the prompt text (generate(model, tokenizer, prompt, stop=[...])) or use stop_token")


def _stop_strings(stop, label: str = "{}") -> tuple[str, ...]:
    """GenerationConfig.stop as a tuple of stop strings (a str alone is one), checked (``label``: as validate's)."""
    strings = (stop,) if isinstance(stop, str) else () if stop is None else stop
    if not isinstance(strings, (list, tuple)) or not all(isinstance(x, str) and x for x in strings):
        raise ValueError(f"{setting_name(label, 'stop')}: expected a stop string or a list of them (each non-empty), "
                         f"got {stop!r}; {unset_said(label)} for none")
    return tuple(strings)


def sample_next(logits: torch.Tensor, cfg: GenerationConfig, generator: Optional[torch.Generator]) -> torch.Tensor:
    """Next token ids [B] from last-position logits [B, V]."""
    logits = logits.float()
    if cfg.temperature == 0:
        return logits.argmax(-1)
    # From the best logit down, and by no less than float32's smallest normal number: a tiny temperature then
    # tends to greedy (0 for the best, -inf for the rest) instead of overflowing (inf - inf: NaN in the softmax).
    logits = (logits - logits.amax(-1, keepdim=True)) / max(cfg.temperature, torch.finfo(torch.float32).tiny)
    if cfg.top_k and cfg.top_k < logits.shape[-1]:
        kth = torch.topk(logits, cfg.top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if cfg.top_p is not None and cfg.top_p < 1:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        # Drop a token when the more likely ones already reach top_p (the first always stays).
        drop = probs.cumsum(-1) - probs >= cfg.top_p
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)
    probs = torch.softmax(logits, dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def to_host_async(t: torch.Tensor):
    """Start copying ``t`` to the host without waiting for the device; returns a function that waits for this
    copy only (not for work queued after it) and returns the host tensor. On the CPU, ``t`` itself."""
    if t.device.type != "cuda":
        return lambda: t
    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    host.copy_(t, non_blocking=True)              # queued on t's device's current stream
    copied = torch.cuda.Event()
    copied.record(torch.cuda.current_stream(t.device))  # that stream, also when another device is the current one

    def wait() -> torch.Tensor:
        copied.synchronize()
        return host
    return wait


def _unwrap(model):
    model = model.model if isinstance(model, LoadedModel) else model
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model: expected a causal LM (torch.nn.Module) or a LoadedModel, got {type(model).__name__}")
    return model


def _train_len(model) -> Optional[int]:
    """The tokens ``model`` was trained on: a LoadedModel's (which reads older runs' from their config.yaml), else a
    foxformer config's train_len; None where unknown (other Hugging Face models)."""
    if isinstance(model, LoadedModel) and model.train_len:
        return model.train_len
    return getattr(getattr(_unwrap(model), "config", None), "train_len", None)


@contextlib.contextmanager
def _turn(model, shift: Optional[HeldShift]):
    """The model as one generation's forward runs it: in eval mode, with that generation's gate shift (None: the
    model's own). Only for the forward: between tokens the model is the caller's again, so a training loop that
    samples text goes on in its mode (also after a stream closed early), and streams of one model with different
    shifts can alternate (zip(plain, shifted) gave the plain one the shift, and left a training model in eval mode)."""
    was_training = model.training
    if was_training:
        model.eval()
    try:
        with shift if shift is not None else contextlib.nullcontext():
            yield
    finally:
        if was_training:
            model.train()


def _new_cache(model, cfg: GenerationConfig, fed: int, label: str = "{}"):
    """The model's cache for a generation that feeds it ``fed`` tokens (None: the model builds its own)."""
    body = backbone(model)
    if not hasattr(body, "new_cache"):
        if cfg.evict_eps is not None:
            raise ValueError(f"{setting_name(label, 'evict_eps')}: KV eviction needs a foxformer FoX model")
        return None
    settings = (cfg.evict_eps, cfg.evict_qk_bound, cfg.evict_max_len)
    policy = EvictionPolicy.resolve(body.config, *settings) if any(x is not None for x in settings) else "config"
    if policy is None:
        # evict_qk_bound / evict_max_len alone kept every key without a word: they only shape eps's bound
        given = [setting_name(label, n) for n in ("evict_qk_bound", "evict_max_len") if getattr(cfg, n) is not None]
        eps = setting_name(label, "evict_eps")
        raise ValueError(f"{' and '.join(given)}: {'they set' if len(given) > 1 else 'it sets'} the bound of KV "
                         f"eviction, which runs only with {eps} (here or in the model's config); give {eps}, e.g. 1e-3")
    return fresh_cache(model, fed, policy, decode=cfg.decode, label=label)


@torch.no_grad()
def stream_tokens(model, input_ids: torch.Tensor, cfg: Optional[GenerationConfig] = None,
                  state: Optional[dict] = None, *, vocab_limit: Optional[int] = None,
                  attention_mask: Optional[torch.Tensor] = None, label: str = "{}",
                  progress: bool = False) -> Iterator[torch.Tensor]:
    """Yield the next token ids [B] (host tensors) one step at a time for prompts input_ids [B, T]. On a GPU the
    model's next step is queued before each token is copied out, so the host's share of a step (taking the token,
    preparing the next step) overlaps the device's instead of adding to it.

    ``state`` (a dict), if given, receives "cache" (the live cache) so callers can inspect memory.
    ``vocab_limit``: sample only ids below it (a tokenizer's vocabulary when the model's is padded past it).
    ``attention_mask``: [B, T], 0 on left padding (prompts of different lengths in one batch).
    ``label``: how errors name the settings (argtypes.setting_name): the keywords, or "--{}" the CLI's flags.
    ``progress``: a bar over the prompt's tokens while they are read (progress.progress_bar), gone before the first
    token comes; off by default, as a library call draws nothing of its own.

    A prompt and new tokens that may run past the length the model was trained on (a LoadedModel's train_len, else
    its config's) are allowed, and warned of once per model and length (models.trained_length.PastTrainLen).
    """
    cfg = cfg or GenerationConfig()
    train_len = _train_len(model)
    model = _unwrap(model)
    dev = model_device(model)
    cfg.validate(label, dev)
    if cfg.stop:
        raise ValueError(_NO_TEXT)
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2 or input_ids.shape[1] < 1:
        raise ValueError(f"input_ids: expected a LongTensor [batch, seq] with seq >= 1, got "
                         f"{getattr(input_ids, 'shape', type(input_ids).__name__)}")
    embed = model.get_input_embeddings() if callable(getattr(model, "get_input_embeddings", None)) else None
    vocab = getattr(embed, "num_embeddings", None)
    # .long() below would truncate float ids (1.7 -> token 1); the prompt's values are read once, on any device.
    check_token_ids(input_ids, vocab, "input_ids", values=True)
    if cfg.stop_token is not None and vocab is not None and cfg.stop_token >= vocab:
        raise ValueError(f"stop_token: {cfg.stop_token} is outside the model's vocabulary of {vocab}, so no row "
                         f"would ever stop at it")
    ids = input_ids.to(dev).long()
    mask = None
    if attention_mask is not None:
        if not isinstance(attention_mask, torch.Tensor) or attention_mask.shape != ids.shape:
            raise ValueError(f"attention_mask: expected a tensor of the prompts' shape {tuple(ids.shape)}, got "
                             f"{getattr(attention_mask, 'shape', type(attention_mask).__name__)}")
        # As given: the model refuses values other than 0 and 1, which a cast here would have rounded away.
        mask = attention_mask.to(dev)
        pad = mask == 0
        # One read of the prompt's mask, as for its ids: (0, row) for a row of padding alone, (1, row) for a row
        # that ends in padding (an empty row comes first). Right padding gave a first token sampled after a pad
        # (max_new_tokens=1, silently), and then the model's refusal of "a 0 between two real tokens".
        problem, row = (torch.stack((pad.all(1), pad[:, -1])).nonzero().tolist() or [(None, None)])[0]
        if problem == 0:
            raise ValueError(f"attention_mask: row {row} has no real token (every entry 0): give it a prompt "
                             f"or leave the row out")
        if problem == 1:
            raise ValueError(f"attention_mask: row {row} ends in padding (a 0 last: right padding), so its first new "
                             f"token would follow a pad, not its prompt; pad each prompt on the left (0s before its "
                             f"tokens; a Hugging Face tokenizer: padding_side='left')")
    # before the prefill, which may take minutes
    warn_past_train_len(model, ids.shape[1] + cfg.max_new_tokens, train_len)
    generator = None
    if cfg.seed is not None:
        generator = torch.Generator(device=dev).manual_seed(int(cfg.seed))
    shift = HeldShift(model, cfg.fgate_bias_shift, label) if cfg.fgate_bias_shift is not None else None
    # The last new token is never fed back, so the cache sees prompt + max_new_tokens - 1 tokens.
    fed = ids.shape[1] + max(cfg.max_new_tokens - 1, 0)
    cache = _new_cache(model, cfg, fed, label)
    # Refused up front rather than by the model after some tokens were streamed; N may be the model config's.
    check_evict_len(getattr(cache, "max_len", None), cfg.max_new_tokens, ids.shape[1], label)
    cache_kw = cache_keyword(model)
    chunk = cfg.prefill_chunk or ids.shape[1]
    out = None
    # A 100K-token prompt is read for minutes on a CPU before the first token: the bar (not left behind, as the
    # text streams on the line below it) or, off a terminal, plain lines say so. Closed in any case before the first
    # token or an error's line.
    bar = progress_bar(total=ids.shape[1], desc="prefill", unit="tok", unit_scale=True, wanted=progress, leave=False)
    try:
        for s in range(0, ids.shape[1], chunk):
            masked = {} if mask is None else {"attention_mask": mask[:, :s + chunk]}
            piece = ids[:, s:s + chunk]
            with _turn(model, shift), working(bar, f"{piece.shape[1]:,} prompt tokens from token {s:,}",
                                                 piece.shape[1]):
                out = model(input_ids=piece, use_cache=True, logits_to_keep=1, **{cache_kw: cache}, **masked)
            cache = cache_of(out)
            bar.update(piece.shape[1])
    finally:
        bar.close()
    if state is not None:
        state["cache"] = cache
    done = torch.zeros(ids.shape[0], dtype=torch.bool, device=dev)
    for step in range(cfg.max_new_tokens):
        logits = out.logits[:, -1]
        if vocab_limit is not None:
            logits = logits[:, :vocab_limit]  # ids past it (a padded vocabulary) have no text
        nxt = sample_next(logits, cfg, generator)
        if cfg.stop_token is not None:
            nxt = torch.where(done, torch.full_like(nxt, cfg.stop_token), nxt)
            done = done | (nxt == cfg.stop_token)
        token = to_host_async(nxt)
        if step + 1 < cfg.max_new_tokens:
            # The next step is queued before this token is awaited: on a GPU it runs while the host takes
            # the token, hands it out and prepares the step after (once every row has stopped, that one
            # step is wasted, never wrong).
            if mask is not None:  # the padding stays hidden (and sets the positions) for every later token
                mask = torch.cat((mask, mask.new_ones(mask.shape[0], 1)), 1)
                masked = {"attention_mask": mask}
            with _turn(model, shift):
                out = model(input_ids=nxt[:, None], use_cache=True, logits_to_keep=1, **{cache_kw: cache},
                            **masked)
            cache = cache_of(out)
            if state is not None:
                state["cache"] = cache
        nxt = token()
        yield nxt
        # A stopped row keeps emitting stop_token, so every row has stopped when every token is stop_token.
        if cfg.stop_token is not None and bool((nxt == cfg.stop_token).all()):
            break


def _is_tokenizer(obj) -> bool:
    return callable(getattr(obj, "encode", None)) and callable(getattr(obj, "decode", None))


class _TextDecoder:
    """Decodes one row's ids incrementally, so that the pieces add up to the text of all the ids.

    A token's text can depend on the ids around it: a SentencePiece decoder drops the space that starts a text's
    first word, a cleanup joins " ," to the word before it, a gpt2-json escape spans several tokens. So each
    step decodes a window that starts at the last piece's ids and hands out what its text adds to that piece's;
    ids whose text may still change with the next ones (an unfinished UTF-8 character, shown as a final U+FFFD,
    or a tokenizer's ``ends_open``) wait for them."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.ends_open = getattr(tokenizer, "ends_open", None)
        self.window: list[int] = []  # the last piece's ids, then the ids not handed out yet
        self.shown = 0               # how many of window are the last piece's
        self.head = ""               # their text

    def _added(self, text: str) -> str:
        # the new ids changed the last piece's text, which is out: theirs alone
        return text[len(self.head):] if text.startswith(self.head) else self.tokenizer.decode(self.window[self.shown:])

    def add(self, token: int) -> str:
        """The text ``token`` adds ("" while it waits for the ids after it)."""
        self.window.append(token)
        text = self.tokenizer.decode(self.window)
        if text.endswith("\ufffd") or (self.ends_open is not None and self.ends_open(self.window)):
            return ""
        piece = self._added(text)
        if piece:
            self.window = self.window[self.shown:]
            self.shown = len(self.window)
            self.head = self.tokenizer.decode(self.window)
        return piece

    def finish(self) -> str:
        """The text of the ids still waiting (the row has no more)."""
        piece = self._added(self.tokenizer.decode(self.window)) if len(self.window) > self.shown else ""
        self.shown = len(self.window)
        return piece


class _StopText:
    """One row's text cut before the first of the stop strings: the text up to it is handed out, the stop string and
    what follows are not. Text that may be the start of a stop string (a suffix that is a prefix of one) is held back
    until the next piece tells, so a stop string is found whole and cut even when tokens split it, also in a stream
    (the text already handed out never holds the start of a stop string)."""

    def __init__(self, stops: Sequence[str]):
        self.stops = stops
        self.held = ""
        self.stopped = False

    def add(self, piece: str) -> str:
        """The text ``piece`` releases; after a stop string, "" (and ``stopped`` is True)."""
        if self.stopped:
            return ""
        text = self.held + piece
        found = [i for i in (text.find(stop) for stop in self.stops) if i >= 0]
        if found:
            self.stopped, self.held = True, ""
            return text[:min(found)]
        keep = max((k for stop in self.stops for k in range(min(len(stop) - 1, len(text)), 0, -1)
                    if text.endswith(stop[:k])), default=0)
        self.held = text[len(text) - keep:]
        return text[:len(text) - keep]

    def finish(self) -> str:
        """The text held back (the row has no more, so it began no stop string)."""
        held, self.held = self.held, ""
        return "" if self.stopped else held


def _row_texts(tokens: Iterator[torch.Tensor], tokenizer, stop_token: Optional[int], stops: Sequence[str],
               state: Optional[dict], single: bool) -> Iterator:
    """The text pieces of each row ([B] strs per step, "" where a row adds none; for a ``single`` row its str
    alone, and only where it adds text) from the token stream ([B] per step). A row ends at stop_token (not decoded)
    or at a stop string (cut before it), each row when it comes; the stream is left once every row has ended.
    state["new_tokens"]: the tokens of each row that made its text (an int for a ``single`` row).

    A KeyboardInterrupt, raised by the token stream or thrown in at a yield, ends the rows as the stream's end
    would: the text not handed out yet (held back as it may have begun a stop string, though none came) comes out
    as one more piece, then the interrupt goes on."""
    rows, counts, ended = [], [], []
    pieces: list[str] = []  # the step's pieces so far, until handed out
    if state is not None and single:
        state["new_tokens"] = 0
    interrupted = None
    try:
        for step in tokens:
            if not rows:
                rows = [(_TextDecoder(tokenizer), _StopText(stops)) for _ in range(step.shape[0])]
                counts, ended = [0] * len(rows), [False] * len(rows)
            for i, (decoder, stop) in enumerate(rows):
                token = int(step[i])
                if ended[i]:
                    pieces.append("")
                    continue
                if token == stop_token:
                    ended[i] = True
                    pieces.append(stop.add(decoder.finish()) + stop.finish())
                    continue
                counts[i] += 1
                pieces.append(stop.add(decoder.add(token)))
                ended[i] = stop.stopped
            if state is not None:
                state["new_tokens"] = counts[0] if single else list(counts)
            out, pieces = pieces, []
            if not single or out[0]:
                yield out[0] if single else out
            if all(ended):
                return
    except KeyboardInterrupt as e:
        interrupted = e
    pieces += [""] * (len(rows) - len(pieces))
    rest = [piece + (stop.add(decoder.finish()) + stop.finish() if not done else "")
            for piece, (decoder, stop), done in zip(pieces, rows, ended)]
    if any(rest):
        yield rest[0] if single else rest
    if interrupted is not None:
        raise interrupted


def end_of_text_id(tokenizer) -> Optional[int]:
    """The tokenizer's end-of-text id: ours name it ``eot_id``, a Hugging Face tokenizer (an export's own, loaded
    by AutoTokenizer) ``eos_token_id``; generation with the latter ran past its end marker into junk."""
    for name in ("eot_id", "eos_token_id"):
        value = getattr(tokenizer, name, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def generate(model, tokenizer_or_ids, prompt: Optional[str | Sequence[str]] = None, *,
             config: Optional[GenerationConfig] = None, state: Optional[dict] = None,
             attention_mask: Optional[torch.Tensor] = None, label: str = "{}", progress: bool = False,
             **options) -> Iterator:
    """Stream a continuation.

    Args:
        model: a foxformer FoxForCausalLM (or any Hugging Face causal LM; or a LoadedModel). Where the prompt
            and max_new_tokens may run past the length it was trained on, a PastTrainLen warning says so (once
            per model and length: again only for a generation that may run further).
        tokenizer_or_ids: a tokenizer (``encode``/``decode``; or a spec string such as "gpt2") together
            with ``prompt`` text: yields text pieces. Or prompt token ids (list of ints or a LongTensor
            [T]): yields ints; a LongTensor [B, T]: yields LongTensors [B].
        prompt: the prompt text (with a tokenizer only); a list of texts generates them as one batch (left-padded),
            yielding per step a list with each row's piece ("" where a row adds none, or has ended).
        config / options: a GenerationConfig, or its fields as keywords (max_new_tokens, temperature,
            top_k, top_p, seed, evict_eps, evict_qk_bound, evict_max_len, fgate_bias_shift,
            prefill_chunk, stop_token, stop, ignore_eos, decode). stop_token defaults to the tokenizer's end-of-text
            id (``eot_id``, or a Hugging Face tokenizer's ``eos_token_id``). stop (stop strings) needs a tokenizer:
            each row's text ends before the first stop string in it.
        state: optional dict that receives the live cache under "cache" (and, with a tokenizer, the number
            of tokens generated so far under "new_tokens": a list of each row's for a list of prompts).
        attention_mask: with token ids [B, T] only: 0 on each row's left padding.
        label: how errors name the settings (argtypes.setting_name): the keywords, or "--{}" the CLI's flags.
        progress: a progress bar while the prompt is read (see stream_tokens).

    Example::

        for piece in foxformer.generate(model, load_tokenizer("gpt2"), "Once upon a time", max_new_tokens=50,
                                        stop=["\\n\\n"]):
            print(piece, end="", flush=True)
    """
    if config is not None and options:
        raise TypeError("pass either config=GenerationConfig(...) or keyword options, not both")
    if config is None:
        # GenerationConfig's own TypeError named its __init__ and offered no spelling
        known = [f.name for f in dataclasses.fields(GenerationConfig)]
        if unknown := [key for key in options if key not in known]:
            raise TypeError(f"generate: unknown option {unknown[0]!r}{did_you_mean(unknown[0], known)}; the options: "
                            f"{', '.join(known)}")
        config = GenerationConfig(**options)
    config.validate(label, model_device(_unwrap(model)))
    if note := config.greedy_note(label):
        warnings.warn(note, GreedyNote, stacklevel=2)
    tokenizer = tokenizer_or_ids
    if isinstance(tokenizer, str):
        if prompt is None:
            raise TypeError("generate: a string second argument is a tokenizer spec (e.g. 'gpt2'); pass the "
                            "prompt text as prompt=...")
        from foxformer.data import load_tokenizer
        tokenizer = load_tokenizer(tokenizer)
    if _is_tokenizer(tokenizer):
        if attention_mask is not None:
            raise TypeError("attention_mask: only for a batch of token ids [B, T] (left-padded prompts); with a "
                            "tokenizer, pass the prompts as a list of texts")
        single = isinstance(prompt, str)
        texts = [prompt] if single else prompt
        if not isinstance(texts, (list, tuple)) or not texts or not all(isinstance(t, str) for t in texts):
            raise TypeError(f"prompt: expected the prompt text (str) or a non-empty list of them with a tokenizer, "
                            f"got {type(prompt).__name__}")
        rows = [start_ids(tokenizer) + tokenizer.encode(text) for text in texts]
        empty = [i for i, row in enumerate(rows) if not row]
        if empty:
            name = setting_name(label, "prompt")
            raise ValueError(f"{name}: encodes to no tokens; give at least one character" if single else
                             f"{name}: row {empty[0]} encodes to no tokens; give it at least one character")
        end = end_of_text_id(tokenizer)
        if config.stop_token is None and not config.ignore_eos and end is not None:
            config = dataclasses.replace(config, stop_token=end)
        # A model's vocabulary is often padded past the tokenizer's (50304 for GPT-2's 50257): ids there
        # cannot be decoded (tiktoken raises KeyError), so they are never sampled.
        # (A raw Hugging Face tokenizer's vocab_size leaves out its added tokens; its len() counts them.)
        limit = len(tokenizer) if hasattr(tokenizer, "__len__") else getattr(tokenizer, "vocab_size", None)
        # Left padding, hidden by the mask (its id is never read: 0 lies in every vocabulary).
        pads = [max(map(len, rows)) - len(row) for row in rows]
        ids = torch.tensor([[0] * pad + row for pad, row in zip(pads, rows)])
        mask = torch.tensor([[0] * pad + [1] * len(row) for pad, row in zip(pads, rows)]) if any(pads) else None
        stream = stream_tokens(model, ids, dataclasses.replace(config, stop=None), state, attention_mask=mask,
                               vocab_limit=int(limit) if isinstance(limit, int) and limit > 0 else None, label=label,
                               progress=progress)
        return _row_texts(stream, tokenizer, config.stop_token, _stop_strings(config.stop), state, single)
    if prompt is not None:
        raise TypeError("prompt: only used with a tokenizer; pass token ids as the second argument instead")
    if config.stop:
        raise ValueError(_NO_TEXT)
    ids = tokenizer_or_ids
    if isinstance(ids, Sequence) and not isinstance(ids, torch.Tensor):
        if not ids or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
            raise TypeError("tokenizer_or_ids: expected a tokenizer, a non-empty list of int token ids, or a "
                            "LongTensor")
        ids = torch.tensor(ids)
    if not isinstance(ids, torch.Tensor) or ids.dtype in (torch.float16, torch.bfloat16, torch.float32,
                                                           torch.float64) or ids.dim() not in (1, 2):
        raise TypeError("tokenizer_or_ids: expected a tokenizer, a list of int ids, or an integer tensor [T] or [B, T]")
    if attention_mask is not None and ids.dim() != 2:
        raise TypeError("attention_mask: only for a batch of token ids [B, T] (left-padded prompts)")
    if ids.dim() == 1:
        return (int(t[0]) for t in stream_tokens(model, ids[None], config, state, label=label, progress=progress))
    return stream_tokens(model, ids, config, state, attention_mask=attention_mask, label=label, progress=progress)
