"""Matplotlib figures (Agg backend, PNG) for loss curves, needle heatmaps and forget-gate analyses."""
from __future__ import annotations

import os
import textwrap
import warnings
from typing import Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from ..paths import replaced_atomically  # noqa: E402


def save_figure(fig, path: str) -> str:
    """``fig`` as ``path`` (its extension: the format), written whole or not at all: a Ctrl-C while savefig wrote
    left a truncated PNG under the final name, which the report then showed."""
    try:
        with replaced_atomically(path) as tmp:
            fig.savefig(tmp, format=os.path.splitext(path)[1][1:] or "png", dpi=150, bbox_inches="tight")
    finally:
        plt.close(fig)
    if not os.path.exists(path) or os.path.getsize(path) == 0:
        raise OSError(f"plot: {path} was not written")
    return path


def _banded(curve) -> bool:
    """Whether a curve has a bootstrap band: resampling one sequence gives that sequence, a zero-width band that
    reads as a certain curve."""
    return curve.n_sequences > 1


def _mark_train_lengths(ax, curves: Sequence, *, labelled: bool) -> None:
    """A dashed line at T_train - 1 for each training length, once: in its model's colour, grey where models
    share it. One line per model drew them on top of each other, the last model's colour showing while the
    legend's entry had the first's."""
    lengths = [c.train_len for c in curves]
    for n, length in enumerate(lengths):
        if length and lengths.index(length) == n:
            ax.axvline(length - 1, color="0.35" if lengths.count(length) > 1 else f"C{n}", ls="--", lw=1.0,
                       alpha=0.8, label=f"trained length ({length} tokens)" if labelled else "_")


def dashes_note(train_lens) -> str:
    """"dashed: train length" for a title where some curve has a training length to draw, else "": an HF folder
    evaluated without --train-len has none, and its title told of a line that was not there."""
    return "dashed: train length" if any(train_lens) else ""


def plot_loss_curves(curves: Sequence, path: str, *, title: str = "Per-position loss") -> str:
    """Smoothed L(i) with bootstrap bands (none for one sequence), one line per model; dashed vertical lines at
    training lengths."""
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for n, c in enumerate(curves):
        color = f"C{n}"
        x = np.asarray(c.positions)
        ax.plot(x, c.smoothed, color=color, lw=1.4, label=f"{c.name} (mean {c.mean_loss:.3f})")
        if _banded(c):
            ax.fill_between(x, c.smoothed_lo, c.smoothed_hi, color=color, alpha=0.2, lw=0)
    _mark_train_lengths(ax, curves, labelled=False)
    ax.set_xlabel("token position i (context length)")
    ax.set_ylabel("loss L(i) [nats]")
    if max(len(c.positions) for c in curves) > 64:
        ax.set_xscale("log")
    band = (f"{int(100 * curves[0].confidence)}% bootstrap band" if any(map(_banded, curves))
            else "no interval: 1 sequence")
    dashes = dashes_note(c.train_len for c in curves)
    ax.set_title(f"{title} (smoothed, {band}" + (f"; {dashes})" if dashes else ")"), fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return save_figure(fig, path)


def plot_perplexity(curves: Sequence, path: str, *, title: str = "Perplexity vs context length") -> str:
    """P(l) = exp(mean L(1..l)) with bootstrap bands (none for one sequence); log-log axes."""
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for n, c in enumerate(curves):
        color = f"C{n}"
        ax.plot(c.lengths, c.perplexity, "o-", color=color, ms=3, lw=1.4,
                label=c.name if _banded(c) else f"{c.name} (1 sequence: no interval)")
        if _banded(c):
            ax.fill_between(c.lengths, c.perplexity_lo, c.perplexity_hi, color=color, alpha=0.2, lw=0)
    # labelled: this plot's title does not say what dashes mean as the loss curve's does
    _mark_train_lengths(ax, curves, labelled=True)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("context length l")
    ax.set_ylabel("perplexity P(l)")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    return save_figure(fig, path)


# What each NIAH metric's colour bar shows: its key alone ("ll_accuracy") did not say what was counted.
NIAH_METRIC_LABELS = {"accuracy": "greedy answer holds the value [share of trials]",
                      "ll_accuracy": "every answer token is the top-1 [share of trials]"}


def plot_niah_heatmaps(results: Sequence, path: str, *, metric: str = "accuracy") -> str:
    """One heatmap per model and mode: rows = needle depth, columns = context length (paper figure 4)."""
    panels = [(r, mode) for r in results for mode in r.modes]
    cols = min(len(panels), 2)
    rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 3.8 * rows), squeeze=False, layout="constrained")
    cmap = matplotlib.colors.LinearSegmentedColormap.from_list("niah", ["#d7301f", "#fdae61", "#1a9850"])
    im = None
    for ax, (r, mode) in zip(axes.flat, panels):
        # Columns in ascending length whatever the order of --lengths: the training-length line below
        # separates the first `inside` columns from the rest, which is right only for sorted lengths.
        order = np.argsort(r.lengths, kind="stable")
        lengths = [r.lengths[i] for i in order]
        grid = np.asarray(r.grid(mode, metric))[:, order]  # [depths, lengths]
        im = ax.imshow(grid, cmap=cmap, vmin=0.0, vmax=1.0, aspect="auto")
        ax.set_xticks(range(len(lengths)), [str(l) for l in lengths], rotation=45, fontsize=7)
        # rows are the requested depths; where the needles moved to sentence ends, the mean actual depth too
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # a row without actual depths (older niah.json)
            actual = np.nanmean(np.asarray(r.grid(mode, "actual_depth"), dtype=float), axis=1)
        ax.set_yticks(range(len(r.depths)), [f"{100 * d:.0f}%" + (f" (at {100 * a:.0f}%)" if np.isfinite(a) and
                                             round(100 * a) != round(100 * d) else "")
                                             for d, a in zip(r.depths, actual)], fontsize=7)
        inside = sum(1 for l in lengths if r.train_len and l <= r.train_len)
        if 0 < inside < len(lengths):  # dashed line between lengths within training and beyond it
            ax.axvline(inside - 0.5, color="white", ls="--", lw=1.2)
        beyond = " (right of the dashes: beyond train length)" if 0 < inside < len(lengths) else ""
        ax.set_xlabel(f"context length [tokens]{beyond}")
        ax.set_ylabel("needle depth [% of the context]")
        ax.set_title(f"{r.name}: {mode} (mean {np.nanmean(grid):.2f})", fontsize=9)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    if im is not None:
        fig.colorbar(im, ax=axes.ravel().tolist(), shrink=0.8, label=NIAH_METRIC_LABELS.get(metric, metric))
    return save_figure(fig, path)


def plot_matrices(panels: Sequence[tuple[str, np.ndarray]], path: str, *, label: str, ncols: int = 4,
                  log_scale: bool = False) -> str:
    return save_figure(matrices_figure(panels, label=label, ncols=ncols, log_scale=log_scale), path)


def matrices_figure(panels: Sequence[tuple[str, np.ndarray]], *, label: str, ncols: int = 4,
                    log_scale: bool = False):
    """A grid of lower-triangular matrices (decay F or attention A), key position on x, query on y; ``label``:
    what the colour shows, with its unit (log10 is added for ``log_scale``)."""
    cols = min(ncols, len(panels))
    rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(2.8 * cols, 2.8 * rows), squeeze=False, layout="constrained")
    for ax, (title, m) in zip(axes.flat, panels):
        m = np.asarray(m, dtype=np.float64)
        if log_scale:
            shown = np.log10(np.clip(m, 1e-6, None))
            # up to 0 (a probability or a fraction kept), or to the largest where weights exceed 1 (|A| of gated
            # linear attention), which a top of 0 showed as one colour
            im = ax.imshow(np.where(np.tril(np.ones_like(m)) > 0, shown, np.nan), cmap="viridis", vmin=-6,
                           vmax=max(0.0, float(np.nanmax(shown))))
        else:
            im = ax.imshow(np.where(np.tril(np.ones_like(m)) > 0, m, np.nan), cmap="viridis", vmin=0.0,
                           vmax=max(float(np.nanmax(m)), 1e-12))
        ax.set_title(title, fontsize=8)
        ax.set_xlabel("key position j", fontsize=7)
        ax.set_ylabel("query position i", fontsize=7)
        # a few token positions: without them nothing said how far apart two tokens of a panel are
        for axis in (ax.xaxis, ax.yaxis):
            axis.set_major_locator(MaxNLocator(nbins=3, integer=True))
        ax.tick_params(labelsize=6)
        fig.colorbar(im, ax=ax, fraction=0.046, pad=0.02).set_label(f"log10 {label}" if log_scale else label,
                                                                    fontsize=7)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    return fig


def plot_head_grid(values: np.ndarray, path: str, *, title: str, label: str, log: bool = False,
                   annotate: bool = True) -> str:
    return save_figure(head_grid_figure(values, title=title, label=label, log=log, annotate=annotate), path)


def head_grid_figure(values: np.ndarray, *, title: str, label: str, log: bool = False, annotate: bool = True):
    """Layers x heads heatmap of one per-head statistic (e.g. timescale, effective context length); ``label``:
    the statistic with its unit."""
    v = np.asarray(values, dtype=np.float64)
    fig, ax = plt.subplots(figsize=(max(3.0, 0.5 * v.shape[1] + 2), max(2.5, 0.35 * v.shape[0] + 1.5)))
    shown = np.log10(np.clip(v, 1e-12, None)) if log else v
    im = ax.imshow(shown, cmap="magma", aspect="auto")
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.set_xticks(range(v.shape[1]))
    ax.set_yticks(range(v.shape[0]))
    if annotate and v.size <= 400:
        for (i, j), x in np.ndenumerate(v):
            txt = "inf" if not np.isfinite(x) else (f"{x:.0f}" if abs(x) >= 10 else f"{x:.2f}")
            # one colour on every cell was unreadable on some: cyan vanished on magma's pale yellow end
            r, g, b, _ = im.cmap(im.norm(shown[i, j]))
            ax.text(j, i, txt, ha="center", va="center", fontsize=6,
                    color="black" if 0.299 * r + 0.587 * g + 0.114 * b > 0.5 else "white")
    fig.colorbar(im, ax=ax, label=f"log10 {label}" if log else label)
    # a title longer than a few heads' width ran over the colour bar's label
    ax.set_title(textwrap.fill(title, width=max(30, int(9 * fig.get_figwidth()))), fontsize=9)
    return fig


def plot_decay_curves(distances: np.ndarray, decay: np.ndarray, path: str, *, title: str,
                      groups: Sequence[str]) -> str:
    return save_figure(decay_curves_figure(distances, decay, title=title, groups=groups), path)


def decay_curves_figure(distances: np.ndarray, decay: np.ndarray, *, title: str, groups: Sequence[str]):
    """Mean decay D(d) per head (lines) against distance d, with the 1/e threshold. ``groups``: one name per line;
    the lines of a name (a layer's heads) share its colour and its entry in the legend, which every head having
    its own would make unreadable."""
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    d = np.asarray(decay)
    names = list(dict.fromkeys(groups))
    colors = dict(zip(names, [f"C{i}" for i in range(len(names))] if len(names) <= 10
                      else matplotlib.colormaps["viridis"](np.linspace(0, 1, len(names)))))
    labelled = set()
    for row, group in zip(d, groups):
        ax.plot(distances, row, lw=0.8, alpha=0.7, color=colors[group],
                label=None if group in labelled else group)
        labelled.add(group)
    ax.axhline(np.exp(-1.0), color="k", ls="--", lw=1.0, label="1/e")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_ylim(1e-6, 1.5)
    ax.set_xlabel("distance d [tokens]")
    ax.set_ylabel("mean decay prod f over d steps [fraction kept]")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=6, ncol=1 + len(names) // 12)
    return fig


def plot_eviction(res: dict, path: str) -> str:
    """Loss change that KV eviction caused, by position (``eviction_loss``'s log-spaced bins): the mean over
    sequences and the largest at any token."""
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    bins = res["by_position"]
    ax.plot(bins["position"], bins["max_abs_diff"], "-", color="C3", lw=1.2, label="largest |change| at a token")
    ax.plot(bins["position"], bins["mean_diff"], "-", color="C0", lw=1.5, label="mean change")
    ax.set_xscale("log")
    ax.set_yscale("symlog", linthresh=1e-7)
    ax.set_xlabel("token position i")
    ax.set_ylabel("loss with eviction - loss without [nats]")
    ax.set_title(f"KV eviction at eps {res['evict_eps']:g}: kept {res['kept_fraction']:.1%} of keys, peak cache "
                 f"{res['allocated_ratio']:.2f}x", fontsize=9)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    return save_figure(fig, path)
