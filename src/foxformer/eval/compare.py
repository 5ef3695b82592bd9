"""`foxformer eval compare RUN_DIR...`: put the ``eval loss`` outputs of separately evaluated runs side by side.

Models trained and evaluated on different machines (or GPU sessions) each leave a loss.json; this reads
them back, checks that they measured the same thing (same sequences: data, split, length, count), and
draws the per-position loss, the loss difference to a reference model (the sequences are shared, so
their noise cancels there), the perplexity, and a table of the loss at chosen positions.

Loss at position p in the table: the mean of L(i) over p/2 < i <= p (an octave ending at p), which is
stable where single positions are noisy. The figures average L(i) in log-spaced bins for the same reason.
"""
from __future__ import annotations

import json
import numbers
import os
from types import SimpleNamespace

import numpy as np

from . import plots
from .outputs import find_output

DEFAULT_POSITIONS = (512, 2048, 4096, 8192, 16384)


def _loss_json(run_dir: str) -> str:
    path = run_dir if os.path.isfile(run_dir) else find_output(run_dir, "loss.json")
    if path is None:
        raise ValueError(f"run_dirs: {run_dir!r} has no loss.json (run `foxformer eval loss {run_dir}` first)")
    return path


# What fixes the sequences: windows inside documents or not, and the tokenizer of a text source, cut
# different sequences from the same data.
MEASURED = ("data", "source", "split", "seq_len", "num_seqs", "within_docs", "tokenizer")


def _same_sequences(a: dict, b: dict) -> bool:
    # loss.json files written before within_docs was recorded leave it unknown (None)
    return all(a[k] == b[k] or (k == "within_docs" and None in (a[k], b[k])) for k in MEASURED)


def load_curves(run_dirs: list[str]) -> list[SimpleNamespace]:
    """One curve per model found in the runs' loss.json files (attributes as ``plots`` expects, and
    ``run_index``: the position in ``run_dirs`` of the run it came from)."""
    curves, reference = [], None
    for i, run_dir in enumerate(run_dirs):
        path = _loss_json(run_dir)
        with open(path) as f:
            data = json.load(f)
        s = data.get("settings", {})
        measured = {k: s.get(k) for k in MEASURED}
        if reference is None:
            reference = (path, measured)
        elif not _same_sequences(measured, reference[1]):
            raise ValueError(f"run_dirs: {path} measured {measured}, but {reference[0]} measured {reference[1]}; "
                             f"compare only evaluations of the same sequences")
        curves += [SimpleNamespace(**m, run_index=i) for m in data["models"]]
    return curves


def value_at(curve: SimpleNamespace, position: int) -> float | None:
    """Mean L(i) over p/2 < i <= p (positions 1-based); None beyond the evaluated length, whose last
    position stands for ``seq_len`` itself."""
    if position > curve.seq_len:
        return None
    loss = np.asarray(curve.loss, dtype=np.float64)
    hi = min(position, loss.size)
    return float(loss[position // 2:hi].mean())


def log_bins(loss: np.ndarray, bins_per_octave: int = 8) -> tuple[np.ndarray, np.ndarray]:
    """(centres, means) of L(i) over log-spaced position bins; positions are 1-based."""
    n = loss.size
    edges = np.unique(np.round(2.0 ** np.arange(0, np.log2(n) + 1e-9, 1 / bins_per_octave)).astype(int))
    edges = np.append(edges[edges <= n], n + 1)  # bins are [a, b): position n needs the end n + 1
    centres = np.sqrt(edges[:-1] * np.maximum(edges[1:] - 1, edges[:-1]))
    means = np.array([loss[a - 1:b - 1].mean() if b > a else loss[a - 1] for a, b in zip(edges[:-1], edges[1:])])
    return centres, means


def _plot_binned(curves, path: str, *, reference: SimpleNamespace | None) -> str:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    ref = None if reference is None else np.asarray(reference.loss, dtype=np.float64)
    for n, c in enumerate(curves):
        loss = np.asarray(c.loss, dtype=np.float64)
        if ref is not None:
            m = min(loss.size, ref.size)
            loss = loss[:m] - ref[:m]
        x, y = log_bins(loss)
        ax.plot(x, y, "-", color=f"C{n}", lw=1.5, label=c.name)
        if c.train_len:
            # x is i of L(i) (i tokens of context, loss.py): training reached i = train_len - 1, as in plots.py
            ax.axvline(c.train_len - 1, color="0.4", ls="--", lw=1.0)
    if ref is not None:
        ax.axhline(0.0, color="0.2", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("token position i (1/8-octave bins)")
    ax.set_ylabel("loss L(i) [nats]" if ref is None else f"L(i) - L_ref(i) [nats], ref = {reference.name}")
    what = "Per-position loss" if ref is None else "Per-position loss difference to the reference"
    ax.set_title(f"{what} (dashed: training length)", fontsize=9)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    return plots.save_figure(fig, path)


def _plot_validation(run_dirs: list[str], names: list[str], path: str) -> str | None:
    """Validation loss against training tokens from each run's metrics.jsonl (None when no run has one)."""
    import matplotlib.pyplot as plt

    from foxformer.train.metrics import read_metrics

    series = []
    for run_dir, name in zip(run_dirs, names):
        evals = [(r["tokens"], r["val_loss"]) for r in read_metrics(run_dir) if r.get("kind") == "eval"]
        if evals:
            series.append((name, *zip(*evals)))
    if not series:
        return None
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for n, (name, tokens, loss) in enumerate(series):
        ax.plot(np.asarray(tokens) / 1e6, loss, "o-", color=f"C{n}", ms=3, lw=1.4, label=name)
    ax.set_xlabel("training tokens [M]")
    ax.set_ylabel("validation loss [nats]")
    ax.set_title("Validation loss during training", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return plots.save_figure(fig, path)


def load_niah(run_dirs: list[str]) -> list:
    """NiahResult of every model in the runs' niah.json files (runs without one are skipped)."""
    from .niah import NiahResult

    out = []
    for path in filter(None, (find_output(run_dir, "niah.json") for run_dir in run_dirs)):
        with open(path) as f:
            out += [NiahResult.from_dict(m) for m in json.load(f)["models"]]
    return out


def _niah_table(results: list) -> str:
    modes = sorted({mode for r in results for mode in r.modes})
    lengths = sorted({l for r in results for l in r.lengths})
    header = ["model", "mode"] + [f"{l}" for l in lengths]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in results:
        for mode in modes:
            if mode not in r.modes:
                continue
            grid = np.asarray(r.grid(mode, "accuracy"), dtype=float)   # [depths, lengths]
            cells = [f"{np.nanmean(grid[:, r.lengths.index(l)]):.2f}" if l in r.lengths else "-" for l in lengths]
            lines.append("| " + " | ".join([r.name, mode] + cells) + " |")
    return "\n".join(lines) + "\n"


def compare(run_dirs: list[str], out_dir: str, positions=DEFAULT_POSITIONS, names: list[str] | None = None,
            reference: str | None = None) -> dict:
    """Figures (loss_curves.png, loss_difference.png, perplexity.png, validation.png when the runs have
    metrics.jsonl, niah.png when they have niah.json) and compare.json / compare.md in ``out_dir``. ``reference``: the model name the differences are taken to (default: the last model)."""
    # positions are 1-based: p <= 0 has an empty octave, a NaN in the table and in compare.json
    bad = [p for p in positions if isinstance(p, bool) or not isinstance(p, numbers.Integral) or p < 1]
    if bad:
        raise ValueError(f"positions: expected token positions >= 1, got {bad}")
    curves = load_curves(run_dirs)
    # A run's niah.json need not hold the models of its loss.json, nor in their order: NIAH results take
    # the new name of the model of the same name in the same run, not the name at their position.
    renamed = {}
    if names:
        if len(names) != len(curves):
            raise ValueError(f"names: {len(names)} given for {len(curves)} models")
        for c, n in zip(curves, names):
            renamed[(c.run_index, c.name)] = n
            c.name = n
    os.makedirs(out_dir, exist_ok=True)
    by_name = {c.name: c for c in curves}
    if reference is not None and reference not in by_name:
        raise ValueError(f"reference: {reference!r} is none of the models {sorted(by_name)}")
    ref = by_name[reference] if reference is not None else curves[-1]
    figs = [_plot_binned(curves, os.path.join(out_dir, "loss_curves.png"), reference=None),
            _plot_binned(curves, os.path.join(out_dir, "loss_difference.png"), reference=ref),
            plots.plot_perplexity(curves, os.path.join(out_dir, "perplexity.png"))]
    if len(curves) == len(run_dirs):  # one model per run: the runs' training logs can be labelled
        val = _plot_validation(run_dirs, [c.name for c in curves], os.path.join(out_dir, "validation.png"))
        figs += [val] if val else []
    rows = [{"model": c.name, "train_len": c.train_len, "mean_loss": c.mean_loss,
             **{f"L@{p}": value_at(c, p) for p in positions}} for c in curves]
    header = ["model", "train length", "mean loss"] + [f"L({p // 2}..{p}]" for p in positions]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in rows:
        cells = [r["model"], str(r["train_len"]), f"{r['mean_loss']:.3f}"]
        cells += ["-" if r[f"L@{p}"] is None else f"{r[f'L@{p}']:.3f}" for p in positions]
        lines.append("| " + " | ".join(cells) + " |")
    table = "\n".join(lines) + "\n"
    niah = []
    for i, run_dir in enumerate(run_dirs):
        for r in load_niah([run_dir]):
            r.name = renamed.get((i, r.name), r.name)
            niah.append(r)
    if niah:
        figs.append(plots.plot_niah_heatmaps(niah, os.path.join(out_dir, "niah.png")))
        table += "\nNeedle retrieval accuracy by context length (mean over depths):\n\n" + _niah_table(niah)
    with open(os.path.join(out_dir, "compare.md"), "w") as f:
        f.write(table)
    result = {"runs": run_dirs, "positions": list(positions), "reference": ref.name, "rows": rows,
              "plots": [os.path.basename(p) for p in figs]}
    with open(os.path.join(out_dir, "compare.json"), "w") as f:
        json.dump(result, f, indent=2)
    print(table, end="")
    return result
