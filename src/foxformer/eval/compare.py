"""`foxformer eval compare RUN_DIR...`: put the ``eval loss`` outputs of separately evaluated runs side by side.

Models trained and evaluated on different machines (or GPU sessions) each leave a loss.json; this reads
them back, checks that they measured the same thing (same sequences: data, split, length, count), and
draws the per-position loss, the loss difference to a reference model (the sequences are shared, so
their noise cancels there), the perplexity, and a table of the loss at chosen positions.

Loss at position p in the table: the mean of L(i) over p/2 < i <= p (an octave ending at p), which is
stable where single positions are noisy. The figures average L(i) in log-spaced bins for the same reason.
Seeds of one model are grouped (seeds.py): the table then shows mean ± standard deviation over seeds, and
the differences to the reference come with a bootstrap interval over seeds and sequences.
"""
from __future__ import annotations

import json
import math
import numbers
import os
from types import SimpleNamespace
from typing import Optional

import numpy as np

from foxformer.argtypes import setting_name
from foxformer.paths import write_text
from foxformer.train.config import SAVED_CONFIG, read_yaml
from foxformer.train.metrics import read_metrics

from . import plots
from .outputs import at_least_one, find_output, mark_output_folder, markdown_table, note_replacing, write_json
from .seeds import SEED_SUFFIX, fmt_interval, fmt_spread, group_name, groups, mean_std, spread
from .training import plot_training, summarize

# Columns of the table when none are asked for: the octaves ending at the last powers of two within the runs'
# evaluated length (fixed positions up to 16384 left four empty columns for runs evaluated at 2048).
DEFAULT_COLUMNS = 5


def default_positions(seq_len: int, columns: int = DEFAULT_COLUMNS) -> list[int]:
    """The last ``columns`` powers of two <= seq_len (the table's positions when none are given)."""
    powers = [2 ** k for k in range(1, max(1, int(seq_len)).bit_length()) if 2 ** k <= seq_len]
    return powers[-columns:] or [max(1, int(seq_len))]


def _loss_json(run_dir: str) -> str:
    path = run_dir if os.path.isfile(run_dir) else find_output(run_dir, "loss.json")
    if not os.path.exists(run_dir):
        raise ValueError(f"{run_dir}: no such run folder or loss.json")
    if path is None:
        raise ValueError(f"{run_dir} has no loss.json (nor has {os.path.join(run_dir, 'eval')}): run `foxformer eval "
                         f"loss {run_dir}` first")
    return path


# What fixes the sequences: windows inside documents or not, and the tokenizer of a text source, cut
# different sequences from the same data.
MEASURED = ("data", "source", "split", "seq_len", "num_seqs", "within_docs", "tokenizer", "data_source")
# unknown (None) in loss.json files written before they were recorded: within_docs, and a --data dataset's tokenizer
_RECORDED_LATER = ("within_docs", "tokenizer")


def tokens_fingerprint(tokens) -> str:
    """sha256 (16 hex digits) of the evaluated token ids [N, T]: equal exactly when two evaluations read the
    same sequences, wherever their dataset lay (a leave-one-domain-out dataset has the full mix's
    validation split under another path)."""
    import hashlib

    return hashlib.sha256(np.ascontiguousarray(np.asarray(tokens, dtype=np.int64)).tobytes()).hexdigest()[:16]


def _same_sequences(a: dict, b: dict) -> bool:
    if a.get("tokens_sha256") and b.get("tokens_sha256"):
        return a["tokens_sha256"] == b["tokens_sha256"]
    return all(a[k] == b[k] or (k in _RECORDED_LATER and None in (a[k], b[k])) for k in MEASURED)


def _how_measured_differently(a: dict, b: dict) -> str:
    """The `eval loss` flags (each setting of MEASURED is one) whose values differ, in words."""
    def said(value) -> str:
        return ("given" if value else "not given") if isinstance(value, bool) else "unset" if value is None \
            else str(value)

    flags = [f"--{k.replace('_', '-')} {said(a[k])} against {said(b[k])}" for k in MEASURED
             if a[k] != b[k] and not (k in _RECORDED_LATER and None in (a[k], b[k]))]
    return ", ".join(flags) or "the same flags, but other tokens: the data changed between the evaluations"


def _different_sequences(run_dir: str, measured: dict, reference_dir: str, reference: dict) -> str:
    """Why two evaluations do not compare, and what would. Under different tokenizers no `eval loss` flags
    would: each loss is per token of its own tokenizer (a byte, a GPT-2 token of about four bytes), and no
    evaluation here measures per byte, where they would meet."""
    from foxformer.data.tokenizer import same_tokenizer

    tokenizers = measured["tokenizer"], reference["tokenizer"]
    if None not in tokenizers and not same_tokenizer(*tokenizers):
        return (f"{run_dir} and {reference_dir} were evaluated on text tokenized by different tokenizers "
                f"({tokenizers[0]} against {tokenizers[1]}): losses per token under different tokenizers cannot be "
                f"compared (their tokens cover different amounts of text); compare only runs trained with the same "
                f"tokenizer")
    return (f"{run_dir} and {reference_dir} measured different sequences "
            f"({_how_measured_differently(measured, reference)}); compare only evaluations of the same sequences: "
            f"run `foxformer eval loss` on each run with the same flags")


# The per-position arrays of a loss.json model entry: what slim_curve reduces to log-spaced bins.
PER_POSITION = ("loss", "smoothed", "smoothed_lo", "smoothed_hi")


def slim_curve(model: dict) -> dict:
    """A loss.json model entry for keeping in a repository (19 KB where the entry is 1.3 MB, 32 sequences of 16K):
    the per-position arrays become their means over ``bin_edges`` split at the table's octaves (what the figures
    and the table average), the rest stays (the per-sequence octave losses behind every interval included).
    ``expand_curve`` turns it back into full-length arrays, constant within each bin: a comparison of slim
    entries gives the same table, intervals and binned figures; only the per-position loss curves show steps.
    An entry slim already is returned as it is (binning its bins again would average bins of bins)."""
    if "bin_edges" in model:
        return model
    n = len(model["loss"])
    # the figures' bins, split where an octave p/2 < i <= p of the table starts, so that both stay exact
    starts = [2 ** k + 1 for k in range(n.bit_length()) if 2 ** k + 1 <= n]
    edges = np.unique(np.concatenate([bin_edges(n), starts]))
    out = {k: v for k, v in model.items() if k not in PER_POSITION + ("positions",)}
    out["bin_edges"] = edges.tolist()
    for k in PER_POSITION:
        values = np.asarray(model[k], dtype=np.float64)
        out[k] = [float(values[a - 1:b - 1].mean()) for a, b in zip(edges[:-1], edges[1:])]
    return out


def expand_curve(model: dict) -> dict:
    """A model entry with full-length per-position arrays (a ``slim_curve`` entry expanded; others as they are)."""
    if "bin_edges" not in model:
        return model
    edges = np.asarray(model["bin_edges"])
    widths = np.diff(edges)
    out = {k: v for k, v in model.items() if k != "bin_edges"}
    out["positions"] = list(range(1, int(edges[-1])))
    for k in PER_POSITION:
        out[k] = np.repeat(np.asarray(model[k], dtype=np.float64), widths).tolist()
    return out


def _check_evaluated_here(run_dir: str, path: str, models: list) -> None:
    """A run folder's loss.json must be of that run: `eval loss OTHER --out RUN/eval` put OTHER's curve under
    RUN's name (and RUN's validation loss beside it). Paths that do not exist from here are not judged."""
    if run_settings(run_dir) is None or len(models) != 1 or not os.path.exists(str(models[0])):
        return  # an evaluation's own folder, or one whose model is not on this machine
    run, model = os.path.realpath(run_dir), os.path.realpath(str(models[0]))
    if model != run and not model.startswith(run + os.sep):
        raise ValueError(f"{run_dir}: its {os.path.basename(path)} holds the evaluation of {models[0]}, not of this "
                         f"run; compare {models[0]} itself, or evaluate {run_dir} into its own folder")


def load_curves(run_dirs: list[str]) -> list[SimpleNamespace]:
    """One curve per model found in the runs' loss.json files (attributes as ``plots`` expects, ``run_index``: the
    position in ``run_dirs`` of the run it came from, and ``source``: the loss.json it was read from)."""
    curves, reference = [], None
    for i, run_dir in enumerate(run_dirs):
        path = _loss_json(run_dir)
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        s = data.get("settings", {})
        _check_evaluated_here(run_dir, path, s.get("models") or [])
        measured = {k: s.get(k) for k in MEASURED + ("tokens_sha256",)}
        if reference is None:
            reference = (run_dir, measured)
        elif not _same_sequences(measured, reference[1]):
            raise ValueError(_different_sequences(run_dir, measured, *reference))
        curves += [SimpleNamespace(**expand_curve(m), run_index=i, source=path) for m in data["models"]]
    return curves


def run_settings(run_dir: str) -> Optional[dict]:
    """The training config a run folder saved (None for a loss.json given alone or a folder without one); a file that
    is no YAML is a ValueError."""
    path = os.path.join(run_dir, SAVED_CONFIG)
    if not os.path.isfile(path):
        return None
    return read_yaml(path) or {}  # a syntax error: read_yaml's ValueError, naming the file, line and column


def check_seed_groups(members: dict, run_dirs: list[str]) -> None:
    """Runs pooled as seeds of one model must be that: the same preset and model settings, different seeds, each
    loss.json read once. Runs are grouped by their models' names, and two experiments' folders both named "model" (a FoX
    and a Transformer) were averaged as two seeds, a run given twice as two seeds with a spread of 0."""
    for name, group in members.items():
        runs = [c.run_index for c in group]
        if len(set(runs)) < len(runs) or len(group) < 2:
            continue  # one loss.json holding a model twice is its own business (names say which)
        # by the file read: `compare runs/x runs/x/eval` read x's eval/loss.json twice, two seeds of spread 0
        where = [os.path.realpath(c.source) for c in group]
        if len(set(where)) < len(where):
            twice = next(w for w in where if where.count(w) > 1)
            first, second = [c for c, w in zip(group, where) if w == twice][:2]
            one, other = run_dirs[first.run_index], run_dirs[second.run_index]
            repeated = (f"{one} is given more than once" if os.path.realpath(one) == os.path.realpath(other)
                        else f"{one} and {other} read one loss.json, {first.source}")
            raise ValueError(f"{repeated}: {name!r} would pool it as several seeds; give each run once")
        saved = [(run_dirs[i], run_settings(run_dirs[i])) for i in runs]
        saved = [(r, cfg) for r, cfg in saved if cfg is not None]
        for (r0, a), (r1, b) in zip(saved, saved[1:]):
            if (a.get("preset"), a.get("model") or {}) != (b.get("preset"), b.get("model") or {}):
                raise ValueError(f"{r0} and {r1} are grouped as seeds of {name!r} (their models share the "
                                 f"name) but train different models (preset {a.get('preset')!r}, model "
                                 f"{a.get('model') or {}} against {b.get('preset')!r}, {b.get('model') or {}}); "
                                 f"tell them apart with --names")
        seeds = [cfg.get("seed") for _, cfg in saved]  # train writes it; a config without one is not judged
        if None not in seeds and len(set(seeds)) < len(seeds):
            raise ValueError(f"the runs grouped as seeds of {name!r} ({', '.join(r for r, _ in saved)}) "
                             f"share a seed ({seeds}); give --names to compare them as different models")


def value_at(curve: SimpleNamespace, position: int) -> float | None:
    """Mean L(i) over p/2 < i <= p (positions 1-based); None beyond the evaluated length, whose last
    position stands for ``seq_len`` itself."""
    if position > curve.seq_len:
        return None
    loss = np.asarray(curve.loss, dtype=np.float64)
    hi = min(position, loss.size)
    return float(loss[position // 2:hi].mean())


def bin_edges(n: int, bins_per_octave: int = 8) -> np.ndarray:
    """Edges of the log-spaced bins [a, b) over 1-based positions 1 .. n (the last edge is n + 1)."""
    edges = np.unique(np.round(2.0 ** np.arange(0, np.log2(n) + 1e-9, 1 / bins_per_octave)).astype(int))
    return np.append(edges[edges <= n], n + 1)  # position n needs the end n + 1


def log_bins(loss: np.ndarray, bins_per_octave: int = 8) -> tuple[np.ndarray, np.ndarray]:
    """(centres, means) of L(i) over log-spaced position bins; positions are 1-based."""
    edges = bin_edges(loss.size, bins_per_octave)
    centres = np.sqrt(edges[:-1] * np.maximum(edges[1:] - 1, edges[:-1]))
    means = np.array([loss[a - 1:b - 1].mean() if b > a else loss[a - 1] for a, b in zip(edges[:-1], edges[1:])])
    return centres, means


def _binned_mean(members) -> tuple[np.ndarray, np.ndarray]:
    """Positions and the mean over a group's members of their binned L(i) (every member read the same
    sequences to the same length)."""
    binned = [log_bins(np.asarray(c.loss, dtype=np.float64)) for c in members]
    return binned[0][0], np.mean([y for _, y in binned], axis=0)


def _plot_binned(members: dict, path: str, *, reference: Optional[str] = None) -> str:
    """One line per group (the mean over its seeds) and a band from its lowest to its highest seed;
    ``reference``: the group whose mean L(i) is subtracted from every curve."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    ref = None if reference is None else np.mean([c.loss for c in members[reference]], axis=0)
    for n, (name, group) in enumerate(members.items()):
        rows = []
        for c in group:
            loss = np.asarray(c.loss, dtype=np.float64)
            if ref is not None:
                m = min(loss.size, ref.size)
                loss = loss[:m] - ref[:m]
            x, y = log_bins(loss)
            rows.append(y)
        rows = np.asarray(rows)
        label = name if len(group) == 1 else f"{name} ({len(group)} seeds, band: min..max)"
        ax.plot(x, rows.mean(axis=0), "-", color=f"C{n}", lw=1.5, label=label)
        if len(group) > 1:
            ax.fill_between(x, rows.min(axis=0), rows.max(axis=0), color=f"C{n}", alpha=0.2, lw=0)
        if group[0].train_len:
            # x is i of L(i) (i tokens of context, loss.py): training reached i = train_len - 1, as in plots.py
            ax.axvline(group[0].train_len - 1, color="0.4", ls="--", lw=1.0)
    if ref is not None:
        ax.axhline(0.0, color="0.2", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("token position i (1/8-octave bins)")
    ax.set_ylabel("loss L(i) [nats]" if ref is None else f"L(i) - L_ref(i) [nats], ref = {reference}")
    what = "Per-position loss" if ref is None else "Per-position loss difference to the reference"
    dashes = plots.dashes_note(group[0].train_len for group in members.values())
    ax.set_title(what + (f" ({dashes})" if dashes else ""), fontsize=9)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    return plots.save_figure(fig, path)


def _plot_validation(run_dirs: list[str], names: list[str], path: str) -> str | None:
    """Validation loss against training tokens from each run's metrics.jsonl (None when no run has one);
    the seeds of one model share its colour."""
    import matplotlib.pyplot as plt

    series = []
    for run_dir, name in zip(run_dirs, names):
        evals = [(r["tokens"], r["val_loss"]) for r in read_metrics(run_dir) if r.get("kind") == "eval"]
        if evals:
            series.append((name, *zip(*evals)))
    if not series:
        return None
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    colour = {g: f"C{n}" for n, g in enumerate(groups(names))}
    for name, tokens, loss in series:
        ax.plot(np.asarray(tokens) / 1e6, loss, "o-", color=colour[group_name(name)], ms=3, lw=1.4, label=name)
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
        with open(path, encoding="utf-8") as f:
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


def _seed_tag(run_dir: str, name: str) -> str:
    """"_s1" for a run folder named like fox-pro-small_s1 whose label has no seed tag of its own."""
    m = SEED_SUFFIX.search(os.path.basename(os.path.normpath(run_dir)))
    return m.group(0) if m and not SEED_SUFFIX.search(name) else ""


def final_val_loss(run_dir: str) -> Optional[float]:
    """The run's last validation loss (its "end" record, else its last evaluation); None without metrics."""
    records = read_metrics(run_dir)
    ends = [r["val_loss"] for r in records if r.get("kind") == "end" and r.get("val_loss") is not None]
    evals = [r["val_loss"] for r in records if r.get("kind") == "eval" and r.get("val_loss") is not None]
    return (ends or evals or [None])[-1]


def _figures(curve, positions) -> tuple[list, Optional[np.ndarray]]:
    """The table's figures of one model (mean loss, then the octaves ending at ``positions``) and its
    per-sequence figures [N, 1 + len(positions)] when its loss.json has them (older ones do not)."""
    values = [curve.mean_loss] + [value_at(curve, p) for p in positions]
    ends = getattr(curve, "octave_ends", None) or []
    per_seq = getattr(curve, "seq_octaves", None)
    if not per_seq or not getattr(curve, "seq_mean", None) or any(
            v is not None and p not in ends for v, p in zip(values[1:], positions)):
        return values, None
    octs = np.asarray(per_seq, dtype=np.float64)
    cols = [np.asarray(curve.seq_mean, dtype=np.float64)]
    cols += [octs[:, ends.index(p)] if v is not None else np.full(len(octs), np.nan)
             for v, p in zip(values[1:], positions)]
    # The octaves as the sequences' mean (the curve's octave mean, exactly, for sequences of equal length): a
    # slimmed curve kept in a repository (compare.slim_curve) may have lost its octave bins, the sequences have not.
    values = values[:1] + [float(c.mean()) if v is not None else None for v, c in zip(values[1:], cols[1:])]
    return values, np.stack(cols, axis=1)


def _group_rows(members: dict, positions, val_losses: Optional[list]) -> list[dict]:
    rows = []
    for name, group in members.items():
        figures = [_figures(c, positions)[0] for c in group]
        keys = ["mean_loss"] + [f"L@{p}" for p in positions]
        row = {"model": name, "train_len": group[0].train_len, "n_seeds": len(group), "spread": {}}
        if val_losses is not None:
            keys.append("final_val_loss")
            figures = [f + [val_losses[c.run_index]] for f, c in zip(figures, group)]
        for k, column in zip(keys, zip(*figures)):
            if any(v is None for v in column):
                row[k] = None
                continue
            row[k], std = mean_std(column)
            row["spread"][k] = {"std": std}
        rows.append(row)
    return rows


def _differences(members: dict, reference: str, positions, n_boot: int = 2000) -> list[dict]:
    """Each group minus the reference group, with the bootstrap interval over seeds and sequences; empty
    where a member's loss.json has no per-sequence figures."""
    def stack(group):
        per_seq = [_figures(c, positions)[1] for c in group]
        return None if any(v is None for v in per_seq) else np.stack(per_seq)

    ref = stack(members[reference])
    out = []
    for name, group in members.items():
        values = stack(group)
        if name == reference or values is None or ref is None or values.shape[1:] != ref.shape[1:]:
            continue
        s = spread(values, reference=ref, n_boot=n_boot)
        keys = ["mean_loss"] + [f"L@{p}" for p in positions]
        out.append({"model": name, "reference": reference,
                    **{k: None if np.isnan(m) else {"mean": m, "lo": None if np.isnan(lo) else lo,
                                                      "hi": None if np.isnan(hi) else hi}
                       for k, m, lo, hi in zip(keys, s["mean"], s["lo"], s["hi"])}})
    return out


def loss_rows(rows: list[dict], positions) -> list[list[str]]:
    """compare.json's "rows" as table rows, the header first: each model (group)'s losses, ± the standard
    deviation over seeds where a group has several."""
    seeded = any(r["n_seeds"] > 1 for r in rows)
    has_val = any(r.get("final_val_loss") is not None for r in rows)
    header = (["model"] + (["seeds"] if seeded else []) + ["train length"] + (["final val loss"] if has_val else [])
              + ["mean loss"] + [f"L({p // 2}..{p}]" for p in positions])
    table = [header]
    for r in rows:
        def cell(k):
            return fmt_spread(r.get(k), r["spread"].get(k, {}).get("std"))
        # an HF folder evaluated without --train-len has none: "-" as the other tables' missing cells, not "None"
        train_len = "-" if r["train_len"] is None else str(r["train_len"])
        cells = [r["model"]] + ([str(r["n_seeds"])] if seeded else []) + [train_len]
        cells += ([cell("final_val_loss")] if has_val else []) + [cell("mean_loss")]
        cells += [cell(f"L@{p}") for p in positions]
        table.append(cells)
    return table


def difference_rows(diffs: list[dict], positions) -> list[list[str]]:
    """compare.json's "differences" as table rows, the header first: each group minus the reference, with its
    bootstrap interval."""
    table = [["model - reference", "mean loss"] + [f"L({p // 2}..{p}]" for p in positions]]
    for d in diffs:
        cells = [f"{d['model']} - {d['reference']}"]
        cells += ["-" if d[k] is None else fmt_interval(d[k]["mean"], d[k]["lo"], d[k]["hi"])
                  for k in ["mean_loss"] + [f"L@{p}" for p in positions]]
        table.append(cells)
    return table


def dynamics_rows(dynamics: list[dict]) -> list[list[str]]:
    """compare.json's "training" as table rows, the header first; only the header where no run has steps."""
    table = [["run", "steps", "loss spikes (> 0.1 nats)", "grad norm median", "grad norm max, 2nd half",
              "gate timescale median"]]
    if not any(d["steps"] for d in dynamics):
        return table
    for d in dynamics:
        table.append([d["run"], str(d["steps"]), str(d["loss_spikes"]), fmt_spread(d["grad_norm_median"]),
                      fmt_spread(d["grad_norm_max_late"]), fmt_spread(d["gate_median_timescale"], digits=1)])
    return table


def _tables(rows: list[dict], diffs: list[dict], positions) -> str:
    seeded = any(r["n_seeds"] > 1 for r in rows)
    text = ("Mean ± standard deviation over seeds:\n\n" if seeded else "") + markdown_table(
        loss_rows(rows, positions)) + "\n"
    if diffs:
        what = "seeds and sequences" if seeded else "sequences"
        text += (f"\nDifference to the reference, nats, with a 95% bootstrap interval over {what} (bold: the "
                 f"interval excludes 0):\n\n" + markdown_table(difference_rows(diffs, positions)) + "\n")
    return text


def _dynamics_table(dynamics: list[dict]) -> str:
    table = dynamics_rows(dynamics)
    if len(table) == 1:
        return ""
    return "\nTraining dynamics (training.png):\n\n" + markdown_table(table) + "\n"


def compare(run_dirs: list[str], out_dir: str, positions=None, names: list[str] | None = None,
            reference: str | None = None, label: str = "{}") -> dict:
    """Figures (loss_curves.png, loss_difference.png, perplexity.png, validation.png and training.png when
    the runs have metrics.jsonl, niah.png when they have niah.json) and compare.json / compare.md in
    ``out_dir``. Runs of one model with different seeds (names that differ only in a seed tag, or equal
    ``names``) are one group: mean ± standard deviation over seeds, and differences to the reference group
    with a bootstrap interval over seeds and sequences (seeds.py). ``reference``: the model (group) name the
    differences are taken to (default: the last). ``positions``: the table's columns (None: see
    default_positions). ``label`` names those settings in errors as argtypes.setting_name does ("--{}": the
    flags of `eval compare`)."""
    # A loss.json keeps each sequence's loss only over the octaves ending at powers of two from 2 (loss.octave_ends),
    # which the difference table resamples: at other positions it was left out without a word (and a slim entry's
    # bins do not even give their table value exactly).
    at_least_one(run_dirs, "compare", "RUN_DIR")
    bad = [p for p in positions or () if isinstance(p, bool) or not isinstance(p, numbers.Integral) or p < 2
           or p & (p - 1)]
    if bad:
        near = sorted({1 << max(1, round(math.log2(p))) for p in bad if isinstance(p, numbers.Real) and p >= 1})
        raise ValueError(f"{setting_name(label, 'positions')}: expected powers of two >= 2 (the octaves whose "
                         f"per-sequence losses loss.json keeps), got {bad}" + (f"; e.g. {','.join(map(str, near))}" if near else ""))
    curves = load_curves(run_dirs)
    if positions is None:
        positions = default_positions(max(c.seq_len for c in curves))
    # A run's niah.json need not hold the models of its loss.json, nor in their order: NIAH results take
    # the new name of the model of the same name in the same run, not the name at their position.
    renamed = {}
    if names:
        if len(names) != len(curves):
            raise ValueError(f"{setting_name(label, 'names')}: {len(names)} given for {len(curves)} models; give "
                             f"one name per model")
        for c, n in zip(curves, names):
            renamed[(c.run_index, c.name)] = n
            c.name = n
    members = {g: [curves[i] for i in idx] for g, idx in groups([c.name for c in curves]).items()}
    check_seed_groups(members, run_dirs)
    if reference is not None and group_name(reference) not in members:
        raise ValueError(f"{setting_name(label, 'reference')}: {reference!r} is none of the models {sorted(members)}")
    mark_output_folder(out_dir)  # after the checks: a refused comparison leaves no folder
    ref = group_name(reference) if reference is not None else list(members)[-1]
    note_replacing(os.path.join(out_dir, "compare.json"))
    figs = [_plot_binned(members, os.path.join(out_dir, "loss_curves.png")),
            _plot_binned(members, os.path.join(out_dir, "loss_difference.png"), reference=ref),
            plots.plot_perplexity(curves, os.path.join(out_dir, "perplexity.png"))]
    val_losses, dynamics = None, []
    if len(curves) == len(run_dirs):  # one model per run: the runs' training logs can be labelled
        # a run's seed tag stays on its label (the seeds of a renamed group keep apart in the plots and table)
        labels = [c.name + _seed_tag(r, c.name) for c, r in zip(curves, run_dirs)]
        val = _plot_validation(run_dirs, labels, os.path.join(out_dir, "validation.png"))
        dynamics = plot_training(run_dirs, labels, os.path.join(out_dir, "training.png"))
        figs += [f for f in (val, dynamics) if f]
        val_losses = [final_val_loss(r) for r in run_dirs]
        val_losses = None if all(v is None for v in val_losses) else val_losses
        dynamics = [{"run": label, **summarize(read_metrics(r))} for r, label in zip(run_dirs, labels)]
    rows = _group_rows(members, positions, val_losses)
    diffs = _differences(members, ref, positions)
    table = _tables(rows, diffs, positions)
    lacking = [g for g in members if g != ref and g not in {d["model"] for d in diffs}]
    if lacking:  # loss.json files written before the per-sequence losses were kept: nothing to resample
        table += (f"\nNo difference to {ref} for {', '.join(lacking)}: a loss.json keeps no per-sequence losses; "
                  f"evaluate again with `foxformer eval loss` for one.\n")
    table += _dynamics_table(dynamics)
    niah = []
    for i, run_dir in enumerate(run_dirs):
        for r in load_niah([run_dir]):
            r.name = renamed.get((i, r.name), r.name)
            niah.append(r)
    if niah:
        figs.append(plots.plot_niah_heatmaps(niah, os.path.join(out_dir, "niah.png")))
        table += "\nNeedle retrieval accuracy by context length (mean over depths):\n\n" + _niah_table(niah)
    write_text(os.path.join(out_dir, "compare.md"), table)
    result = {"runs": run_dirs, "positions": list(positions), "reference": ref, "rows": rows,
              "differences": diffs, "training": dynamics, "members": {g: [c.name for c in m] for g, m in members.items()},
              "plots": [os.path.basename(p) for p in figs]}
    write_json(os.path.join(out_dir, "compare.json"), result)
    print(table, end="")
    return result
