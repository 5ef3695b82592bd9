"""Per-position loss L(i), perplexity over context length P(l) and bootstrap bands over sequences.

Position convention: L(i), i = 1 .. T-1, is the loss of predicting token i (0-based) from the i tokens before it,
so L(i) is read at "context length i" and the training length T_train is a vertical line at i = T_train - 1.
P(l) = exp(mean(L(1..l))).
"""
from __future__ import annotations

import numbers
from dataclasses import asdict, dataclass, field
from typing import Optional, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from foxformer.argtypes import setting_name
from foxformer.models.calls import backbone, model_device, vocab_size_of
from foxformer.progress import progress_bar, working


def check_tokens(tokens, model: Optional[torch.nn.Module] = None, name: str = "tokens") -> torch.Tensor:
    """Validate and return int64 [N, T] (a 1-D input becomes one row)."""
    if isinstance(tokens, np.ndarray):
        tokens = torch.from_numpy(np.asarray(tokens, dtype=np.int64))
    if not isinstance(tokens, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor or numpy array of token ids, got {type(tokens).__name__}")
    if tokens.dtype.is_floating_point or tokens.dtype == torch.bool:
        raise TypeError(f"{name}: expected integer token ids, got dtype {tokens.dtype}")
    if tokens.dim() == 1:
        tokens = tokens[None]
    if tokens.dim() != 2:
        raise ValueError(f"{name}: expected shape [batch, seq] or [seq], got {tuple(tokens.shape)}")
    if tokens.shape[1] < 2:
        raise ValueError(f"{name}: sequence length must be at least 2 (one prediction), got {tokens.shape[1]}")
    # none: eval_loss failed inside torch.cat, and gate_stats reported a FoX model as having no forget gate
    if tokens.shape[0] == 0:
        raise ValueError(f"{name}: no sequences (shape {tuple(tokens.shape)}); give at least one")
    if tokens.numel() and int(tokens.min()) < 0:
        raise ValueError(f"{name}: token ids must be non-negative, got {int(tokens.min())}")
    vocab = vocab_size_of(model) if model is not None else None
    if vocab is not None and tokens.numel() and int(tokens.max()) >= vocab:
        raise ValueError(f"{name}: token id {int(tokens.max())} is outside the model's vocabulary of {vocab}; "
                         f"was the data tokenized with another tokenizer?")
    return tokens.long()


def check_finite(values, what: str) -> None:
    """Refuse NaN or inf in a model's outputs (``values``: a tensor or array of its logits or losses). Every
    instrument turns them into a number that reads as a result: an accuracy of 0, a null loss in the JSON."""
    finite = torch.isfinite(values).all() if isinstance(values, torch.Tensor) else np.isfinite(values).all()
    if not bool(finite):
        raise ValueError(f"{what}: the model's outputs contain NaN or inf; check its weights (a diverged "
                         f"checkpoint?) or evaluate in fp32 (--dtype fp32)")


@torch.no_grad()
def _row_losses(model: torch.nn.Module, ids: torch.Tensor, chunk: int) -> torch.Tensor:
    """fp32 [B, T-1] next-token losses; the LM head runs on ``chunk`` positions at a time so that long
    sequences never materialise [B, T, V] logits."""
    body, head = backbone(model), getattr(model, "lm_head", None)
    targets = ids[:, 1:]
    if body is model or head is None:  # any other HF causal LM
        logits = model(input_ids=ids).logits[:, :-1]
        return F.cross_entropy(logits.float().transpose(1, 2), targets, reduction="none")
    hidden = body(input_ids=ids, use_cache=False).last_hidden_state[:, :-1]
    return head_losses(hidden, targets, *fp32_head(head), chunk)


def fp32_head(head: torch.nn.Module) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """The LM head's weight and bias in fp32: bf16 logits would cost ~1e-2 nats of loss resolution."""
    bias = None if getattr(head, "bias", None) is None else head.bias.float()
    return head.weight.float(), bias


def head_losses(hidden: torch.Tensor, targets: torch.Tensor, weight: torch.Tensor,
                bias: Optional[torch.Tensor] = None, chunk: int = 2048) -> torch.Tensor:
    """fp32 [B, n] cross-entropy of hidden [B, n, d] through the head (weight [V, d], from ``fp32_head``)
    against targets [B, n]; ``chunk`` positions at a time, so that [B, n, V] logits never exist."""
    parts = []
    for s in range(0, hidden.shape[1], chunk):
        logits = F.linear(hidden[:, s:s + chunk].float(), weight, bias)
        parts.append(F.cross_entropy(logits.transpose(1, 2), targets[:, s:s + chunk], reduction="none"))
    return torch.cat(parts, dim=1)


def check_batch_size(batch_size, *, label: str = "{}") -> None:
    """``label`` names the setting as argtypes.setting_name does: the keyword, or "--{}" a command's flag."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"{setting_name(label, 'batch_size')}: expected a positive integer, got {batch_size!r}")


def per_token_loss(model: torch.nn.Module, tokens, *, batch_size: int = 1, chunk: int = 2048,
                   progress: bool = False) -> torch.Tensor:
    """Next-token cross-entropy of every position: fp32 [N, T-1] on the CPU for tokens [N, T] (or [T]).

    Row n, column i is -log p(tokens[n, i+1] | tokens[n, :i+1]). Runs under no_grad on the model's device.
    """
    tokens = check_tokens(tokens, model)
    check_batch_size(batch_size)
    dev = model_device(model)
    out = []
    bar = progress_bar(range(0, tokens.shape[0], batch_size), desc="loss", unit="batch", wanted=progress)
    for s in bar:
        batch = tokens[s:s + batch_size]
        with working(bar, f"{batch.shape[0]} sequence(s) of {batch.shape[1]:,} tokens"):
            out.append(_row_losses(model, batch.to(dev), chunk).cpu())
    return torch.cat(out, dim=0)


def smooth(x: np.ndarray, window: int) -> np.ndarray:
    """Centered moving average along the last axis, fp64, shrinking at the end. Around index i (position i + 1)
    the window reaches at most (i + 1) // 4 either side: loss_curve.png draws L(i) on a log axis, where a full
    window at the start averaged its first octaves into one flat value (a 16K evaluation's curve read 3.47 from
    position 1 to 128, where L(1) was 6.95), hiding how the loss falls with context."""
    x = np.asarray(x, dtype=np.float64)
    if window <= 1:
        return x.copy()
    n = x.shape[-1]
    c = np.concatenate([np.zeros(x.shape[:-1] + (1,)), np.cumsum(x, axis=-1)], axis=-1)
    i = np.arange(n)
    reach = (i + 1) // 4
    lo = np.clip(i - np.minimum(window // 2, reach), 0, n)
    hi = np.clip(i + np.minimum(window - window // 2, reach + 1), 0, n)
    return (c[..., hi] - c[..., lo]) / (hi - lo)


def bootstrap_mean_bands(rows: np.ndarray, *, n_boot: int = 1000, confidence: float = 0.95,
                         seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Percentile bootstrap band of the mean over rows. rows fp64 [N, K] -> (lo [K], hi [K]).

    Each resample draws N rows with replacement; its mean is ``counts @ rows / N``, one matmul for all.
    With one row the band collapses to that row.
    """
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence: expected a number in (0, 1), got {confidence!r}")
    if isinstance(n_boot, bool) or not isinstance(n_boot, int) or n_boot < 1:
        raise ValueError(f"n_boot: expected a positive integer, got {n_boot!r}")
    rows = np.asarray(rows, dtype=np.float64)
    n = rows.shape[0]
    rng = np.random.default_rng(seed)
    counts = rng.multinomial(n, np.full(n, 1.0 / n), size=n_boot).astype(np.float64)
    means = counts @ rows / n
    alpha = (1.0 - confidence) / 2.0
    lo, hi = np.quantile(means, [alpha, 1.0 - alpha], axis=0)
    mean = rows.mean(axis=0)  # keep the point estimate inside its band despite float rounding
    return np.minimum(lo, mean), np.maximum(hi, mean)


def default_context_lengths(max_len: int) -> list[int]:
    lengths = [2 ** k for k in range(0, 64) if 2 ** k < max_len]
    return lengths + [max_len]


def context_lengths(lengths: Optional[Sequence[int]], num_positions: int, *, label: str = "{}") -> list[int]:
    """The context lengths l of P(l) in ascending order (None: powers of 2 and num_positions), each within
    1 .. num_positions (seq_len - 1: the contexts the evaluated sequences have). ``label``: as check_batch_size's."""
    lengths = sorted({int(l) for l in (lengths or default_context_lengths(num_positions))})
    bad = [l for l in lengths if not 1 <= l <= num_positions]
    if bad:
        raise ValueError(f"{setting_name(label, 'lengths')}: context lengths must lie in [1, {num_positions}] "
                         f"({setting_name(label, 'seq_len')} - 1), got {bad}")
    return lengths


@dataclass
class LossCurve:
    """Result of :func:`loss_curve` for one model (every array has one value per position or length).

    positions: i = 1 .. T-1; loss: mean L(i) (fp64); smoothed, smoothed_lo, smoothed_hi: moving average of
    L (narrower at the first positions: see smooth) and its bootstrap band; lengths: context lengths l;
    perplexity, perplexity_lo, perplexity_hi: P(l).
    Per sequence (so that a comparison can resample sequences, and seeds, later): seq_octaves [N][E], the
    mean of L(i) over the octave p/2 < i <= p for each p in octave_ends (powers of 2), and seq_mean [N].
    """

    name: str
    seq_len: int
    n_sequences: int
    train_len: Optional[int]
    mean_loss: float
    smooth_window: int
    confidence: float
    positions: list = field(default_factory=list)
    loss: list = field(default_factory=list)
    smoothed: list = field(default_factory=list)
    smoothed_lo: list = field(default_factory=list)
    smoothed_hi: list = field(default_factory=list)
    lengths: list = field(default_factory=list)
    perplexity: list = field(default_factory=list)
    perplexity_lo: list = field(default_factory=list)
    perplexity_hi: list = field(default_factory=list)
    octave_ends: list = field(default_factory=list)
    seq_octaves: list = field(default_factory=list)
    seq_mean: list = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)

    def summary(self) -> dict:
        """Scalars worth printing: overall loss, P at each length, loss before/after the training length."""
        out = {"name": self.name, "seq_len": self.seq_len, "n_sequences": self.n_sequences,
               "train_len": self.train_len, "mean_loss": self.mean_loss,
               "perplexity": {str(l): p for l, p in zip(self.lengths, self.perplexity)}}
        if self.train_len and self.train_len - 1 < len(self.loss):
            loss = np.asarray(self.loss)
            out["loss_within_train_len"] = float(loss[: self.train_len - 1].mean())
            out["loss_beyond_train_len"] = float(loss[self.train_len - 1:].mean())
        return out


def check_curve_args(smooth_window, n_boot, confidence, seed, *, positions: Optional[int] = None,
                     label: str = "{}") -> None:
    """Checked before any model runs: numpy's own error for a negative seed names no argument. ``positions``: of
    L(i), T - 1 for sequences of T tokens, where known. ``label``: as check_batch_size's (``--smooth`` sets
    smooth_window)."""
    def name(field: str, flag: Optional[str] = None) -> str:
        return setting_name(label, field, flag)

    if smooth_window is not None and (isinstance(smooth_window, bool) or not isinstance(smooth_window, int)
                                      or smooth_window < 1):
        raise ValueError(f"{name('smooth_window', 'smooth')}: expected a positive integer (1: no smoothing), got "
                         f"{smooth_window!r}")
    # a window past the curve averages every point over most of it (past twice its length, all to one value)
    if smooth_window is not None and positions is not None and smooth_window > positions:
        raise ValueError(f"{name('smooth_window', 'smooth')}: a window of {smooth_window} is wider than the "
                         f"{positions} positions of L(i) ({name('seq_len')} {positions + 1} gives {positions}) and "
                         f"flattens it; give at most {positions}")
    if isinstance(n_boot, bool) or not isinstance(n_boot, int) or n_boot < 1:
        raise ValueError(f"{name('n_boot')}: expected a positive integer, got {n_boot!r}")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"{name('confidence')}: expected a number in (0, 1), got {confidence!r}")
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0:
        raise ValueError(f"{name('seed')}: expected a non-negative integer, got {seed!r}")


def octave_ends(num_positions: int) -> list[int]:
    """Powers of 2 p >= 2 whose octave p/2 < i <= p starts inside positions 1 .. num_positions (the last one
    may end beyond them: its mean covers the positions there are, as for the training length's octave)."""
    return [2 ** k for k in range(1, 64) if 2 ** (k - 1) < num_positions]


def octave_means(rows: np.ndarray, ends: Sequence[int]) -> np.ndarray:
    """Mean of each row over each octave p/2 < i <= p (1-based positions): fp64 [N, len(ends)]."""
    k = rows.shape[1]
    return np.stack([rows[:, p // 2:min(p, k)].mean(axis=1) for p in ends], axis=1)


def loss_curve(per_seq, *, name: str = "model", train_len: Optional[int] = None,
               lengths: Optional[Sequence[int]] = None, smooth_window: Optional[int] = None, n_boot: int = 1000,
               confidence: float = 0.95, seed: int = 0) -> LossCurve:
    """Curves and bands from per-sequence, per-position losses [N, T-1] (accumulated in fp64)."""
    rows = np.asarray(per_seq.double().numpy() if isinstance(per_seq, torch.Tensor) else per_seq, dtype=np.float64)
    if rows.ndim != 2 or rows.shape[0] < 1 or rows.shape[1] < 1:
        raise ValueError(f"per_seq: expected losses [num_sequences, positions], got shape {rows.shape}")
    check_finite(rows, "per_seq")
    n, k = rows.shape
    check_curve_args(smooth_window, n_boot, confidence, seed, positions=k)
    window = smooth_window if smooth_window is not None else max(1, k // 64)
    lengths = context_lengths(lengths, k)
    sm = smooth(rows, window)
    cum = np.cumsum(rows, axis=1)[:, np.asarray(lengths) - 1] / np.asarray(lengths, dtype=np.float64)
    sm_lo, sm_hi = bootstrap_mean_bands(sm, n_boot=n_boot, confidence=confidence, seed=seed)
    cum_lo, cum_hi = bootstrap_mean_bands(cum, n_boot=n_boot, confidence=confidence, seed=seed + 1)
    mean = rows.mean(axis=0)
    ends = octave_ends(k)
    return LossCurve(
        name=name, seq_len=k + 1, n_sequences=n, train_len=train_len, mean_loss=float(mean.mean()),
        smooth_window=int(window), confidence=confidence, positions=list(range(1, k + 1)), loss=mean.tolist(),
        smoothed=sm.mean(axis=0).tolist(), smoothed_lo=sm_lo.tolist(), smoothed_hi=sm_hi.tolist(),
        lengths=lengths, perplexity=np.exp(cum.mean(axis=0)).tolist(), perplexity_lo=np.exp(cum_lo).tolist(),
        perplexity_hi=np.exp(cum_hi).tolist(), octave_ends=ends, seq_octaves=octave_means(rows, ends).tolist(),
        seq_mean=rows.mean(axis=1).tolist())


def eval_loss(model: torch.nn.Module, tokens, *, name: str = "model", train_len: Optional[int] = None,
              batch_size: int = 1, lengths: Optional[Sequence[int]] = None, smooth_window: Optional[int] = None,
              n_boot: int = 1000, confidence: float = 0.95, seed: int = 0, progress: bool = True) -> LossCurve:
    """per_token_loss + loss_curve in one call. tokens int64 [N, T_eval]; T_eval may exceed train_len."""
    check_curve_args(smooth_window, n_boot, confidence, seed)
    tokens = check_tokens(tokens, model)
    context_lengths(lengths, tokens.shape[1] - 1)  # before the model reads every sequence, not after
    losses = per_token_loss(model, tokens, batch_size=batch_size, progress=progress)
    return loss_curve(losses, name=name, train_len=train_len, lengths=lengths, smooth_window=smooth_window,
                      n_boot=n_boot, confidence=confidence, seed=seed)
