"""Training dynamics of several runs side by side, to tell seed noise from unstable training: smoothed
training loss, gradient norm, validation loss and forget-gate timescales against tokens, from each run's
metrics.jsonl (``foxformer eval compare`` draws them as training.png).

Seeds that differ only by noise show curves that run parallel and gradient norms of one size; an unstable
run shows loss spikes with gradient-norm spikes, or gates that drift away from the other seeds'.
"""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from foxformer.train.metrics import read_metrics

from . import plots
from .seeds import group_name, groups

# Exponential smoothing of the per-step training loss: 0.05 averages about 20 steps, the scale of the
# step-to-step noise of a 128Ki-token batch in the docs/results.md runs (344 steps).
SMOOTHING = 0.05
# A spike: a step's loss above the mean of the 20 steps before it by this many nats. The step-to-step
# spread of those runs after warm-up is about 0.03 nats; 0.1 stands out of it.
SPIKE_NATS = 0.1
SPIKE_WINDOW = 20


def _ema(values: Sequence[float], alpha: float = SMOOTHING) -> np.ndarray:
    out, acc = [], None
    for v in values:
        acc = v if acc is None else (1 - alpha) * acc + alpha * v
        out.append(acc)
    return np.asarray(out)


def gate_timescales(record: dict) -> Optional[np.ndarray]:
    """Per-head timescales 1 / -mean(log f), [layers, heads], of an eval record (None without gates)."""
    log_f = record.get("gate_log_f")
    if not log_f:
        return None
    lf = np.asarray(log_f, dtype=np.float64)
    return np.where(lf < 0, 1.0 / np.maximum(-lf, 1e-12), np.inf)


def summarize(records: list[dict]) -> dict:
    """Spikes, gradient norms and gates of one run's metrics."""
    train = [r for r in records if r.get("kind") == "train" and r.get("loss") is not None]
    loss = np.asarray([r["loss"] for r in train], dtype=np.float64)
    grad = np.asarray([r.get("grad_norm", np.nan) for r in train], dtype=np.float64)
    spikes = [int(train[i]["step"]) for i in range(SPIKE_WINDOW, len(loss))
              if loss[i] - loss[i - SPIKE_WINDOW:i].mean() > SPIKE_NATS]
    late = grad[len(grad) // 2:]  # after warm-up and the first fast descent
    evals = [r for r in records if r.get("kind") == "eval"]
    ts = next((gate_timescales(r) for r in reversed(evals) if gate_timescales(r) is not None), None)
    return {"steps": len(train), "loss_spikes": len(spikes), "spike_steps": spikes[:10],
            "grad_norm_median": float(np.nanmedian(grad)) if grad.size else None,
            "grad_norm_max_late": float(np.nanmax(late)) if late.size else None,
            "gate_median_timescale": None if ts is None else float(np.median(ts[np.isfinite(ts)]))
            if np.isfinite(ts).any() else None}


def plot_training(run_dirs: list[str], labels: list[str], path: str) -> Optional[str]:
    """training.png: four panels against training tokens, one colour per model and one line style per seed;
    None when no run has a metrics.jsonl."""
    import matplotlib.pyplot as plt

    runs = [(label, read_metrics(d)) for d, label in zip(run_dirs, labels)]
    runs = [(label, recs) for label, recs in runs if any(r.get("kind") == "train" for r in recs)]
    if not runs:
        return None
    colour = {g: f"C{n}" for n, g in enumerate(groups([label for label, _ in runs]))}
    seen: dict[str, int] = {}
    fig, axes = plt.subplots(2, 2, figsize=(11, 7), layout="constrained")
    (ax_loss, ax_grad), (ax_val, ax_gate) = axes
    styles = ("-", "--", ":", "-.")
    for label, records in runs:
        group = group_name(label)
        style = styles[seen.get(group, 0) % len(styles)]
        seen[group] = seen.get(group, 0) + 1
        kw = dict(color=colour[group], ls=style, lw=1.1, label=label)
        train = [r for r in records if r.get("kind") == "train" and r.get("loss") is not None]
        tokens = np.asarray([r["tokens"] for r in train]) / 1e6
        ax_loss.plot(tokens, _ema([r["loss"] for r in train]), **kw)
        ax_grad.plot(tokens, [r.get("grad_norm", np.nan) for r in train], **{**kw, "lw": 0.7})
        evals = [r for r in records if r.get("kind") == "eval" and r.get("val_loss") is not None]
        ax_val.plot([r["tokens"] / 1e6 for r in evals], [r["val_loss"] for r in evals], marker="o", ms=3, **kw)
        gated = [(r["tokens"] / 1e6, gate_timescales(r)) for r in evals if gate_timescales(r) is not None]
        if gated:
            x = [t for t, _ in gated]
            ax_gate.plot(x, [np.median(ts) for _, ts in gated], marker="o", ms=3, **kw)
            ax_gate.plot(x, [np.percentile(ts, 90) for _, ts in gated], **{**kw, "lw": 0.6, "label": None})
    ax_loss.set_ylabel(f"training loss (EMA {SMOOTHING})")
    ax_grad.set_ylabel("gradient norm (before clipping)")
    ax_grad.set_yscale("log")
    ax_val.set_ylabel("validation loss")
    ax_gate.set_ylabel("gate timescale 1/-mean(log f): median, 90th pct")
    ax_gate.set_yscale("log")
    if not ax_gate.lines:
        ax_gate.text(0.5, 0.5, "no gate statistics in these runs' metrics", ha="center", va="center",
                     transform=ax_gate.transAxes, fontsize=9)
    for ax in axes.flat:
        ax.set_xlabel("training tokens [M]")
        ax.grid(alpha=0.3, which="both")
    ax_loss.legend(fontsize=7)
    fig.suptitle("Training dynamics by seed (colour: model, line style: seed)", fontsize=10)
    return plots.save_figure(fig, path)
