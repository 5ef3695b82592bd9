"""Spread over seeds: runs of one model trained with different seeds form a group, and every figure of a
comparison becomes a group mean with its standard deviation over seeds and a bootstrap interval that
resamples both the seeds and the evaluated sequences.

Runs are grouped by name: a run named ``fox-pro-small_s1`` (``reproduce.sh`` with SEEDS) belongs to
``fox-pro-small``, and labels given twice (``--names "FoX,FoX,FoX"``) are one group. The bootstrap of a
difference between two groups draws the same sequences for both (every model read the same ones, so their
shared difficulty cancels) and the seeds of each group independently (seed s of one model has nothing in
common with seed s of another).
"""
from __future__ import annotations

import math
import re
from typing import Optional, Sequence

import numpy as np

SEED_SUFFIX = re.compile(r"[_-]s(?:eed)?(\d+)$")


def group_name(name: str) -> str:
    """The model a run's name stands for: the name without a trailing seed tag (_s1, -seed2)."""
    return SEED_SUFFIX.sub("", name)


def groups(names: Sequence[str]) -> dict[str, list[int]]:
    """Group name -> indices of its members, in first-seen order."""
    out: dict[str, list[int]] = {}
    for i, n in enumerate(names):
        out.setdefault(group_name(n), []).append(i)
    return out


def bootstrap_draws(n_seqs: int, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """Sequence weights [n_boot, n_seqs] (each row: a resample with replacement, as a mean's weights)."""
    return rng.multinomial(n_seqs, np.full(n_seqs, 1.0 / n_seqs), size=n_boot) / n_seqs


def resampled_means(values: np.ndarray, weights: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Bootstrap replicates [n_boot, E] of a group's mean: values [seeds, seqs, E] (one row a sequence's
    figures), ``weights`` the sequence resamples; seeds are drawn with replacement for every replicate."""
    per_seed = np.einsum("sne,bn->bse", values, weights)  # [B, S, E]
    picks = rng.integers(values.shape[0], size=(weights.shape[0], values.shape[0]))
    return np.take_along_axis(per_seed, picks[:, :, None], axis=1).mean(axis=1)


def spread(values: np.ndarray, *, reference: Optional[np.ndarray] = None, n_boot: int = 2000,
           confidence: float = 0.95, seed: int = 0) -> dict:
    """Mean, std over seeds and bootstrap interval of a group's figures, or of their difference to a
    reference group (then ``values`` minus ``reference``, both [seeds, seqs, E] over the same sequences).

    Returns {"mean": [E], "std": [E] (over seed means, ddof 1; None with one seed), "lo", "hi": [E]}."""
    values = np.asarray(values, dtype=np.float64)
    rng = np.random.default_rng(seed)
    weights = bootstrap_draws(values.shape[1], n_boot, rng)
    reps = resampled_means(values, weights, rng)
    seed_means = values.mean(axis=1)
    mean = seed_means.mean(axis=0)
    std = seed_means.std(axis=0, ddof=1) if values.shape[0] > 1 else None
    if reference is not None:
        reference = np.asarray(reference, dtype=np.float64)
        if reference.shape[1:] != values.shape[1:]:
            raise ValueError(f"reference: figures of shape {reference.shape[1:]} cannot be paired with "
                             f"{values.shape[1:]} (not the same sequences)")
        reps = reps - resampled_means(reference, weights, rng)
        mean = mean - reference.mean(axis=(0, 1))
        std = None
    alpha = (1.0 - confidence) / 2
    lo, hi = np.quantile(reps, [alpha, 1 - alpha], axis=0)
    if values.shape[0] * values.shape[1] < 2:
        # one seed and one sequence: every resample is that sequence, a zero-width "interval" that excluded 0
        # and was printed in bold as a difference beyond the spread
        lo = hi = np.full_like(lo, np.nan)
    return {"mean": mean.tolist(), "std": None if std is None else std.tolist(), "lo": lo.tolist(),
            "hi": hi.tolist()}


def mean_std(values: Sequence[float]) -> tuple[float, Optional[float]]:
    """Mean and sample standard deviation (None for one value) of per-seed figures."""
    v = np.asarray(values, dtype=np.float64)
    return float(v.mean()), (float(v.std(ddof=1)) if v.size > 1 else None)


def fmt_spread(mean: Optional[float], std: Optional[float] = None, digits: int = 3) -> str:
    """"3.098 ± 0.012" ("3.098" with one seed, "-" for no value)."""
    if mean is None:
        return "-"
    return f"{mean:.{digits}f}" + ("" if std is None else f" ± {std:.{digits}f}")


def fmt_interval(mean: float, lo: Optional[float], hi: Optional[float], digits: int = 3) -> str:
    """"-0.028 [-0.051, -0.004]", in bold when the interval excludes 0 (the difference exceeds the spread);
    "-0.028 [no interval: 1 sequence]" where there is none (lo / hi None or NaN)."""
    if lo is None or hi is None or math.isnan(lo) or math.isnan(hi):
        return f"{mean:+.{digits}f} [no interval: 1 sequence]"
    text = f"{mean:+.{digits}f} [{lo:+.{digits}f}, {hi:+.{digits}f}]"
    return f"**{text}**" if lo > 0 or hi < 0 else text
