"""Write results of several models as one JSON file plus PNG plots into an output folder.

JSON layout shared by every command: {"command", "settings", "models": [{"summary": {...}, ...}], "plots": [...]},
plot paths relative to the JSON file (``foxformer report`` reads them).
"""
from __future__ import annotations

import contextlib
import math
import os
import re
import sys
import time
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

from ..argtypes import setting_name
from ..data.layout import EVAL_MARK
from ..paths import write_json as atomic_json, write_text
from . import plots
from .gates import SUMMARY_UNITS, GateStats, choose_heads, head_matrices, is_linear


# Where a run dir's outputs are looked for, in this order: the folder given, then its eval/ sub-folder (the commands'
# default output for a run dir). Where both hold an output, the folder's own is used: it is there because an --out
# named that folder, on purpose, while eval/ is where outputs land unasked. Newest-first was not taken: copies
# (cp, rsync without -t, a run fetched from a GPU host) reset the times, so one folder would show different
# results on two machines. Either way the other file is named (Found.note), with both write times.
def _output_folders(run_dir: str) -> tuple[str, str]:
    return run_dir, os.path.join(run_dir, "eval")


@dataclass(frozen=True)
class Found:
    """Eval outputs of one kind in a run dir: ``paths`` those used (from the first folder of ``_output_folders``
    holding any), ``passed_over`` the same kind's in the other folder, not used."""
    paths: tuple[str, ...] = ()
    passed_over: tuple[str, ...] = ()

    @property
    def path(self) -> Optional[str]:
        return self.paths[0] if self.paths else None

    @property
    def note(self) -> Optional[str]:
        """Which files were used and which passed over, with their write times; None where none was: a run dir
        holding loss.json beside eval/loss.json showed the first without a word, perhaps the older result."""
        if not self.passed_over:
            return None
        return (f"{_dated(self.paths)} {'is' if len(self.paths) == 1 else 'are'} used, not "
                f"{_dated(self.passed_over)}: a folder's own results come before its eval/ folder's")

    def tell(self) -> "Found":
        """Print ``note`` on stderr (when there is one); returns self."""
        if self.note:
            print(f"note: {self.note}", file=sys.stderr)
        return self


def _dated(paths) -> str:
    return ", ".join(f"{p} (written {written_at(p)})" for p in paths)


def _locate(run_dir: str, files) -> Found:
    """Found of the files ``files(folder)`` names (paths) in each of ``_output_folders(run_dir)``."""
    holding = [paths for paths in map(files, _output_folders(run_dir)) if paths]
    if not holding:
        return Found()
    return Found(tuple(holding[0]), tuple(p for paths in holding[1:] for p in paths))


def locate_output(run_dir: str, name: str) -> Found:
    """The eval output ``name`` (loss.json, niah.json, ...) of a run dir (_output_folders), not yet told about."""
    return _locate(run_dir, lambda folder: [p for p in [os.path.join(folder, name)] if os.path.exists(p)])


def find_output(run_dir: str, name: str) -> Optional[str]:
    """Path of the eval output ``name`` of a run dir (locate_output), or None; a file passed over is told on
    stderr."""
    return locate_output(run_dir, name).tell().path


def locate_model_outputs(run_dir: str, prefix: str) -> Found:
    """Every ``model_outputs`` file of a run dir, PREFIX.json and PREFIX_<tag>.json, in name order (model_tag
    gives each one's model); those of the other folder passed over, as locate_output's."""
    def files(folder: str) -> list[str]:
        names = sorted(os.listdir(folder)) if os.path.isdir(folder) else []
        return [os.path.join(folder, f) for f in names
                if f == f"{prefix}.json" or (f.startswith(f"{prefix}_") and f.endswith(".json"))]
    return _locate(run_dir, files)


def model_tag(prefix: str, path: str) -> Optional[str]:
    """The model tag of a ``model_outputs`` file (PREFIX_<tag>.json), None for PREFIX.json (a single model's)."""
    name = os.path.basename(path)
    return None if name == f"{prefix}.json" else name[len(prefix) + 1:-len(".json")]


def written_at(path: str) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(os.path.getmtime(path)))


def note_replacing(*paths: str, elsewhere: str = "--out DIR") -> None:
    """Tell the user which of ``paths`` (an earlier run's loss.json, ...) the write about to happen replaces: a
    second `eval loss` on other data silently took the first one's place. Called right before the write: told
    earlier, a check that then failed announced a replacement that never happened. ``elsewhere``: the option that
    writes elsewhere (a command whose --out names the file: "--out FILE")."""
    for path in paths:
        if os.path.exists(path):
            print(f"note: replacing {path} (written {written_at(path)}); {elsewhere} writes elsewhere", file=sys.stderr)


def written(out: str, files: Sequence[str], plots: Sequence[str] = ()) -> dict:
    """The head of every eval command's printed summary: its folder and the files it wrote there, by their names in
    it as the JSON files list the plots. The plots alone were listed: loss.json, compare.md, ... went unsaid."""
    return {"out": out, "files": list(files), "plots": list(plots)}


def at_least_one(items: Sequence, what: str, kind: str = "model's results") -> None:
    """Refuse an empty ``items``: save_loss failed on max() of an empty sequence, save_niah divided by zero,
    save_gates wrote a gates.json of no model."""
    if len(items) == 0:
        raise ValueError(f"{what}: expected at least one {kind}")


def markdown_table(rows: Sequence[Sequence[str]]) -> str:
    """``rows`` (the header first, cells as text) as a Markdown table, without a final newline."""
    head, *body = rows
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in body])


def default_out_dir(models) -> str:
    """Where an eval command writes unless told: RUN/eval for one model loaded from a run dir (or one of its
    checkpoints), runs/eval otherwise. models: train.loading.LoadedModel objects."""
    if len(models) == 1 and models[0].source in ("run", "checkpoint"):
        run = models[0].path if models[0].source == "run" else os.path.dirname(os.path.dirname(models[0].path))
        return os.path.join(run, "eval")
    return os.path.join("runs", "eval")


def _clean(obj):
    """JSON without NaN/inf (they become null), numpy scalars as Python numbers."""
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    if isinstance(obj, (np.floating, float)):
        return float(obj) if math.isfinite(obj) else None
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, np.bool_):
        return bool(obj)
    return obj


def write_json(path: str, data: dict) -> str:
    """``data`` with numpy scalars and arrays as plain JSON (paths.write_json: atomic); returns ``path``. Its folder
    is marked as an eval output folder first (mark_output_folder)."""
    mark_output_folder(os.path.dirname(path) or os.curdir)
    atomic_json(path, _clean(data))
    return path


# When this command began (this module loads before its work): what a folder held from before is not its output
_STARTED = time.time()


def mark_output_folder(folder: str) -> None:
    """Leave the mark (data.layout.EVAL_MARK) by which a source folder's walk passes over ``folder``: an older
    `eval loss --out d2/ev1`'s loss.json was read as a document of `--source d2` by the next run. Each command
    leaves it before its first file (its plots, a table, its JSON), after its checks: `eval compare` wrote
    compare.md before the JSON that marked its folder, and a command cut short between the two left a folder of
    results unmarked. The folder is made where it is missing. Only in a folder that holds nothing from before this
    command (new, empty, or already marked): an --out naming the user's own folder (`--out .`, bias-shift's
    `--out shift.json` in a folder of documents) would have had it passed over whole by later walks."""
    mark = os.path.join(folder, EVAL_MARK)
    if os.path.exists(mark):
        return
    with os.scandir(folder) if os.path.isdir(folder) else contextlib.nullcontext(()) as entries:
        if any(e.stat(follow_symlinks=False).st_mtime < _STARTED for e in entries):
            return
    write_text(mark, "Results of an eval command of foxformer: a source folder's walk passes over this folder\n")


def safe_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_") or "model"


def plot_tags(names: Sequence[str], prefix: str = "gates_", suffix: str = "_*.png", *,
              label: str = "{}") -> list[str]:
    """The file-name tag of each model's files PREFIX<tag>SUFFIX (``safe_name`` of its label). Labels that differ
    only in what safe_name replaces ("a b", "a_b") would write the same files, one model's results silently
    overwriting the other's: that is a ValueError naming the labels' setting as ``label`` has it
    (argtypes.setting_name: "--{}" for the flag --names)."""
    tags = [safe_name(n) for n in names]
    for i, tag in enumerate(tags):
        first = tags.index(tag)
        if first != i:
            raise ValueError(f"{setting_name(label, 'names')}: models {names[first]!r} and {names[i]!r} would get "
                             f"the same file names ({prefix}{tag}{suffix}); label them apart in letters, digits, "
                             f"'.', '-' or '_'")
    return tags


def model_outputs(prefix: str, names: Sequence[str], *, label: str = "{}") -> list[str]:
    """File names of the results of the models ``names`` that one command evaluates into one folder: PREFIX.json
    for a single model, PREFIX_<tag>.json each for several (``plot_tags``: labels that would share one refused)."""
    if len(names) == 1:
        return [f"{prefix}.json"]
    return [f"{prefix}_{tag}.json" for tag in plot_tags(names, prefix=f"{prefix}_", suffix=".json", label=label)]


def save_loss(curves: Sequence, out_dir: str, settings: Optional[dict] = None) -> dict:
    """loss.json, loss_curve.png and perplexity.png for LossCurve results of one or more models."""
    at_least_one(curves, "save_loss")
    mark_output_folder(out_dir)
    files = [os.path.basename(plots.plot_loss_curves(curves, os.path.join(out_dir, "loss_curve.png"))),
             os.path.basename(plots.plot_perplexity(curves, os.path.join(out_dir, "perplexity.png")))]
    data = {"command": "eval loss", "settings": settings or {}, "plots": files,
            "models": [{"summary": c.summary(), **c.to_dict()} for c in curves]}
    write_json(os.path.join(out_dir, "loss.json"), data)
    return data


def save_niah(results: Sequence, out_dir: str, settings: Optional[dict] = None) -> dict:
    """niah.json, niah_heatmap.png (generation accuracy, or LL accuracy without generation), niah_ll_heatmap.png."""
    at_least_one(results, "save_niah")
    mark_output_folder(out_dir)
    files = []
    if all(r.generate for r in results):
        files.append(os.path.basename(plots.plot_niah_heatmaps(results, os.path.join(out_dir, "niah_heatmap.png"))))
    else:  # an earlier run's generation heatmap (other models, other lengths) would sit beside this niah.json
        with contextlib.suppress(FileNotFoundError):
            os.remove(os.path.join(out_dir, "niah_heatmap.png"))
    files.append(os.path.basename(plots.plot_niah_heatmaps(results, os.path.join(out_dir, "niah_ll_heatmap.png"),
                                                           metric="ll_accuracy")))
    data = {"command": "eval niah", "settings": settings or {}, "plots": files,
            "models": [{"summary": r.summary(), **r.to_dict()} for r in results]}
    write_json(os.path.join(out_dir, "niah.json"), data)
    return data


def save_gates(analyses: Sequence[tuple[GateStats, object, object]], out_dir: str,
               settings: Optional[dict] = None, heads: Optional[list] = None, matrix_len: int = 256,
               label: str = "{}", attention_scale: str = "log") -> dict:
    """gates.json and per model: decay / attention matrix grids, timescale and effective-context heatmaps and
    mean-decay curves. ``analyses``: (stats, model, tokens) per model. ``label``: as head_matrices'.
    ``attention_scale``: the attention matrices' colours, log (log10 from 1e-6) or linear (from 0): on a linear
    scale the weight off the diagonal, where a few tokens take nearly all of it, was one dark colour."""
    at_least_one(analyses, "save_gates")
    files, models = [], []
    tags = plot_tags([stats.name for stats, _, _ in analyses], label=label)
    mark_output_folder(out_dir)
    for (stats, model, tokens), tag in zip(analyses, tags):
        chosen = heads or choose_heads(stats)
        mats = head_matrices(model, tokens, chosen, max_len=matrix_len, label=label)
        labels = [f"L{m['layer']} H{m['head']}" for m in mats]
        if stats.has_gate:
            files.append(plots.plot_matrices([(f"F {lab}", m["decay"]) for lab, m in zip(labels, mats)],
                                             os.path.join(out_dir, f"gates_{tag}_decay.png"), log_scale=True,
                                             label="decay F [fraction kept]"))
        # Gated linear attention weighs values with signed q . k, which a colour scale starting at 0 would hide.
        linear = is_linear(model)
        files.append(plots.plot_matrices([(f"|A| {lab}" if linear else f"A {lab}",
                                           np.abs(m["attention"]) if linear else m["attention"])
                                          for lab, m in zip(labels, mats)],
                                         os.path.join(out_dir, f"gates_{tag}_attention.png"),
                                         label="|weight| of the value [unnormalised]" if linear
                                         else "attention weight [probability]",
                                         log_scale=attention_scale == "log"))
        if stats.has_gate:
            files.append(plots.plot_head_grid(np.asarray(stats.timescale), os.path.join(out_dir, f"gates_{tag}_timescale.png"),
                                              title=f"{stats.name}: timescale 1 / -mean(log f)", label="timescale [tokens]",
                                              log=True))
            eff = np.asarray([[np.inf if e is None else e for e in row] for row in stats.eff_context])
            files.append(plots.plot_head_grid(np.where(np.isinf(eff), stats.max_distance, eff),
                                              os.path.join(out_dir, f"gates_{tag}_eff_context.png"),
                                              title=f"{stats.name}: effective context length (decay < 1/e; "
                                                    f"{stats.max_distance} = beyond the text)",
                                              label="effective context [tokens]", log=True))
            decay = np.concatenate([np.asarray(d).T for d in stats.decay], axis=0)  # [L*H, distances]
            files.append(plots.plot_decay_curves(np.asarray(stats.distances), decay,
                                                 os.path.join(out_dir, f"gates_{tag}_decay_curves.png"),
                                                 title=f"{stats.name}: mean decay per head vs distance",
                                                 groups=[f"layer {layer}" for layer, d in enumerate(stats.decay)
                                                         for _ in np.asarray(d).T]))
        models.append({"summary": stats.summary(), "heads_plotted": [list(h) for h in chosen], **stats.to_dict()})
    data = {"command": "analyze gates", "settings": settings or {}, "units": SUMMARY_UNITS, "models": models,
            "plots": [os.path.basename(f) for f in files]}
    write_json(os.path.join(out_dir, "gates.json"), data)
    return data
