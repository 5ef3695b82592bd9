"""docs/results.md's issue-20 section (seeds, other domains, leave-one-domain-out, recall) from the GPU
calls' outputs, so that no figure in it is typed by hand:

    python scripts/issue20_doc.py BUNDLE_DIR...     # each: an unpacked repro_bundle.tgz of scripts/issue20.sh

Finds the runs (runs/NAME_sN with their eval folders) and mqar/ in the bundles, runs `eval compare` per
block and per text into docs/results/issue20/, compares the forget gates on the training mix with those on
the other texts, and replaces the text between the issue20 markers of docs/results.md. A part that the given
bundles do not cover keeps its text from the document (each part sits between unit markers): a later call's
bundle updates its own parts only. A part that no bundle ever gave is marked pending. What the comparisons read
from the bundles is kept, slimmed, in docs/results/issue20/inputs/ (commit it: the bundles go with the machine),
and read again by later runs, so that seeds evaluated in different sessions are compared together. Each
comparison's part names the runs it read; when a new comparison does not read all of them (their inputs were
never kept), the part it replaces stays beside it as an earlier call's result, not pooled.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shutil
import sys

import numpy as np

from foxformer.eval.compare import compare, slim_curve
from foxformer.eval.mqar import LABELS, seed_table
from foxformer.eval.seeds import SEED_SUFFIX, fmt_interval
from foxformer.train.config import load_config
from foxformer.train.metrics import read_metrics

DOC, OUT = "docs/results.md", "docs/results/issue20"
BEGIN, END = "<!-- issue20:begin -->", "<!-- issue20:end -->"
BLOCKS = {"pro": ("fox-pro", "transformer-pro"), "llama": ("fox-llama", "transformer-llama")}
TEXTS = {"eval": "held-out documents of the training mix", "eval_ood_austen": "Jane Austen's novels (not in the mix)",
         "eval_ood_go": "Go source (not in the mix)", "eval_src_prose": "the mix's held-out prose documents"}


def find_runs(bundles: list[str]) -> dict[str, list[str]]:
    """Model kind -> run folders, over every bundle. The kind is the preset without its size for the `small` presets
    of every seed call ("fox-pro"), the whole preset for another size ("fox-pro-125m"), then
    its model overrides as in MQAR's specs (":fgate=fixed", the gate ablations), then "@lr=..." for a learning rate
    other than the recipe's, then "/noprose" for runs trained without the prose. Each kind's runs are in seed order,
    whichever bundles were given and in whatever order: the bootstrap's draws follow the runs' order, so a comparison
    read back from the kept inputs gives the same figures."""
    import yaml

    out: dict[str, list[str]] = {}
    for b in bundles:
        for run in sorted(glob.glob(os.path.join(b, "runs", "*"))):
            with open(os.path.join(run, "config.yaml"), encoding="utf-8") as f:
                cfg = yaml.safe_load(f)
            preset = cfg.get("preset") or SEED_SUFFIX.sub("", os.path.basename(run))
            base, _, size = preset.rpartition("-")
            kind = base if size == "small" else preset
            overrides = cfg.get("model") or {}
            if overrides:
                kind += ":" + ",".join(f"{k}={v}" for k, v in sorted(overrides.items()))
            lr = cfg.get("lr")
            if lr is not None and not np.isclose(float(lr), RECIPE_LR, rtol=1e-9, atol=0):
                kind += f"@lr={float(lr):g}"
            if "noprose" in str(cfg.get("data_dir", "")):
                kind += "/noprose"
            out.setdefault(kind, []).append(run)
    return {kind: sorted(found, key=_seed_order) for kind, found in out.items()}


def _seed_order(run: str) -> tuple[int, str]:
    """A run folder's seed (its name's _sN; -1 without one), then BUNDLE/RUN (the same given or kept)."""
    m = SEED_SUFFIX.search(os.path.basename(os.path.normpath(run)))
    return (int(m.group(1)) if m else -1, _run_id(run))


def _loss_files(runs: list[str], text: str) -> list[str]:
    """The runs' loss.json of one text; for the held-out mix ("eval") the run folders themselves, so that
    compare also reads their training metrics (final validation loss, training.png)."""
    found = [r for r in runs if os.path.exists(os.path.join(r, text, "loss.json"))]
    return found if text == "eval" else [os.path.join(r, text, "loss.json") for r in found]


def _sequences(path: str) -> str:
    """What an evaluation read (the hash of its token sequences): only evaluations of the same sequences
    are compared."""
    loss = path if path.endswith(".json") else os.path.join(path, "eval", "loss.json")
    with open(loss, encoding="utf-8") as f:
        return str(json.load(f).get("settings", {}).get("tokens_sha256"))


def run_compare(groups: list[tuple[str, list[str]]], text: str, reference: str, out: str, dropped: list[str]):
    """`eval compare` of one text over labelled groups of runs; None when a group has no output. Where the
    evaluations read different sequences (an earlier call's number of sequences), the most common set is
    kept and the others are named in ``dropped``."""
    found = [(label, f) for label, runs in groups for f in _loss_files(runs, text)]
    keys = [_sequences(f) for _, f in found]
    keep = max(set(keys), key=keys.count) if keys else None
    dropped += [f for (_, f), key in zip(found, keys) if key != keep]
    found = [(label, f) for (label, f), key in zip(found, keys) if key == keep]
    if {g for g, _ in groups} - {label for label, _ in found}:
        return None
    return compare([f for _, f in found], out, names=[label for label, _ in found], reference=reference)


def _bundle(path: str) -> str:
    """The bundle folder (absolute) of a run folder or of a file inside it."""
    return os.path.abspath(os.path.dirname(os.path.dirname(_run_dir(path))))


def _reads(groups: list[tuple[str, list[str]]], text: str, fresh: set[str]) -> bool:
    """Whether a comparison of ``text`` over ``groups`` reads a run of the ``fresh`` bundles (those given, not kept):
    one that reads kept inputs only is what the document already shows (and slim inputs kept twice over by the
    twentieth session's run, bins of bins, break its figure), so its part keeps its published text."""
    return any(_bundle(f) in fresh for _, runs in groups for f in _loss_files(runs, text))


def tried(runs: list[str], text: str) -> bool:
    """Whether the call of any of ``runs`` set out to evaluate ``text``: reproduce.sh's step writes its log
    (eval_loss_RUN.log for the mix, TEXT_RUN.log for the others) even when the deadline skips it. A call that
    never planned the text (`issue20.sh seed-ood`: no mix, no prose) leaves none, and its runs are not missing it."""
    for run in runs:
        name = os.path.basename(os.path.normpath(run))
        log = f"eval_loss_{name}.log" if text == "eval" else f"{text}_{name}.log"
        if os.path.exists(os.path.join(_bundle(run), log)):
            return True
    return False


def _run_dir(path: str) -> str:
    """BUNDLE/runs/RUN of a run folder or of a file inside it."""
    head, _, tail = os.path.normpath(path).partition(os.sep + "runs" + os.sep)
    return os.path.join(head, "runs", tail.split(os.sep)[0])


def _run_id(path: str) -> str:
    """BUNDLE/RUN of a run folder or of a file inside it: the same name whether the bundle was given or read
    back from the kept inputs."""
    run = _run_dir(path)
    return f"{os.path.basename(os.path.dirname(os.path.dirname(run)))}/{os.path.basename(run)}"


def stopped_early(paths: list[str]) -> list[str]:
    """"RUN (steps of planned)" for each run among ``paths`` whose training ended before its planned steps (the
    call's time guard, --max-minutes): its learning rate never finished decaying, so it is not the recipe's model."""
    out = []
    for run in sorted({_run_dir(p) for p in paths}):
        ends = [r for r in read_metrics(run) if r.get("kind") == "end"]
        try:
            planned = load_config(os.path.join(run, "config.yaml")).total_steps
        except (OSError, ValueError):
            continue  # a run without its plan says nothing either way
        if ends and ends[-1]["step"] < planned:
            out.append(f"{os.path.basename(run)} ({ends[-1]['step']} of {planned} steps)")
    return out


def _compare_body(heading: str, out: str, res: dict) -> list[str]:
    """A comparison's part: heading, tables, difference figure, the runs a time guard stopped early, and the runs
    it read (``INPUTS``)."""
    body = [heading, "", open(os.path.join(out, "compare.md"), encoding="utf-8").read(),
            f"![loss difference]({out[5:]}/loss_difference.png)", ""]
    early = stopped_early(res["runs"])
    if early:
        body += ["Stopped by the call's time guard before their planned tokens, the learning rate not fully decayed: "
                 + ", ".join(early) + ".", ""]
    return body + [INPUTS.format(" ".join(sorted({_run_id(r) for r in res["runs"]})))]


def _seeds(n: int) -> str:
    return f"{n} seed{'s' if n > 1 else ''}"


def _interval_line(diff: dict, key: str) -> str:
    d = diff.get(key)
    return "-" if d is None else fmt_interval(d["mean"], d["lo"], d["hi"])


def gate_timescales(path: str) -> np.ndarray:
    with open(path, encoding="utf-8") as f:
        model = json.load(f)["models"][0]
    return np.asarray(model["timescale"], dtype=np.float64)  # [layers, heads]; inf: no forgetting measured


def gates_section(runs_by_preset: dict) -> tuple[str, list[str], list[str]]:
    """Median per-head timescale of each FoX model on the training mix and on the other texts, a scatter of one
    against the other, and the runs read."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows, read, fig, axes = [], [], None, None
    texts = [("eval", "mix"), ("gates_ood_austen", "novels"), ("gates_ood_go", "Go")]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.4), layout="constrained")
    for ax, preset in zip(axes, ("fox-pro", "fox-llama")):
        for run in runs_by_preset.get(preset, []):
            found = {tag: os.path.join(run, d, "gates.json") for d, tag in texts}
            if not all(os.path.exists(p) for p in found.values()):
                continue
            ts = {tag: gate_timescales(p) for tag, p in found.items()}
            read.append(run)
            rows.append([os.path.basename(run)] + [f"{np.median(ts[t]):.1f}" for _, t in texts]
                        + [f"{np.mean(ts[t] < 10):.2f}" for _, t in texts])
            for tag, marker in (("novels", "o"), ("Go", "x")):
                ax.scatter(ts["mix"].ravel(), ts[tag].ravel(), s=10, marker=marker, alpha=0.6,
                           label=f"{tag} ({os.path.basename(run)})")
        ax.plot([1, 1e5], [1, 1e5], color="0.4", lw=0.8)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("head timescale on the training mix [tokens]")
        ax.set_ylabel("on the other text [tokens] (below the line: forgets faster)")
        ax.set_title(LABELS[preset], fontsize=9)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=6)
    if not rows:
        plt.close(fig)
        return "", [], []
    path = os.path.join(OUT, "gates_domains.png")
    fig.savefig(path, dpi=120)
    plt.close(fig)
    head = ("| run | median timescale: mix | novels | Go | heads < 10 tokens: mix | novels | Go |\n"
            "|---|---|---|---|---|---|---|\n")
    return head + "".join("| " + " | ".join(r) + " |\n" for r in rows), [path], read


def _lodo(runs: dict, units: dict, dropped: list[str], fresh: set[str]) -> None:
    """The no-prose pair on every text it read, and the held-out prose beside the full-mix pair (when the
    seed calls' runs are there): one unit per text into ``units``."""
    nop = [(f"{LABELS[p]}, no prose", runs[p + "/noprose"]) for p in BLOCKS["pro"]]
    full = [(LABELS[p], runs.get(p, [])) for p in BLOCKS["pro"]]
    for text, what in TEXTS.items():
        with_full = text == "eval_src_prose" and all(g for _, g in full)
        out = os.path.join(OUT, f"lodo_{text}")
        if not _reads(full + nop if with_full else nop, text, fresh):
            continue
        res = run_compare(full + nop if with_full else nop, text, "Transformer (Pro), no prose", out, dropped)
        if res is None:
            continue
        where = "the mix without prose (held out)" if text == "eval" else what
        if with_full:
            where += ", beside the models trained on the whole mix (4K-token windows)"
        body = _compare_body(f"#### {where}", out, res)
        # seeds that reached this evaluation (a call cut by its deadline leaves some texts with fewer)
        n = min(r["n_seeds"] for r in res["rows"])
        summary = [f"- {where.split(',')[0]}, trained without prose, FoX (Pro) - Transformer (Pro) ({_seeds(n)}): "
                   f"mean loss {_interval_line(r, 'mean_loss')}" for r in res["differences"]
                   if r["model"].startswith("FoX (Pro), no prose")]
        units[f"lodo_{text}"] = (body, summary)


# Comparisons of runs trained in their own calls against a reference trained beside them, each kind named so that
# these runs stay apart from the seed calls' runs of the same preset (an override in the spec, or a learning rate
# other than the recipe's): unit id -> (heading, summary prefix, pending note, {kind: label}, the reference first).
# `issue20.sh ablation N`: FoX (LLaMA)'s data-dependent gate, a learned per-head bias and the fixed (ALiBi-like) decay.
# `issue20.sh headdim SEEDS`: FoX (Pro) at the preset's head dim and at the Transformer presets' 128, the shape that
# trains 1.15x faster at 125M (docs/benchmarks.md, "Whole models").
# `issue20.sh headdim125 N`: the same two head dims at 125M, the paper's smallest size, where the presets' choice costs
# FoX (Pro) its throughput target (docs/benchmarks.md, "Whole models").
# `issue20.sh lr 1e-3 SEEDS`: the Pro pair at the rate the fifth session's one-seed sweep found best for FoX (Pro):
# is FoX (Pro)'s seed spread at the recipe's 2e-3 the rate's doing?
# `issue20.sh lr 4e-3 SEEDS`: the Pro pair at twice the recipe's rate, the sweep's third point (one seed in the fifth
# session): is FoX (Pro)'s seed spread as large above 2e-3 as at it, or as small as at 1e-3?
# `issue20.sh lr 1e-3 SEEDS llama`: the LLaMA pair at the same half rate (one seed each in the fifth session's sweep):
# does FoX (LLaMA)'s lead over the Transformer (LLaMA) at 2e-3 hold at the sweep's other rate?
# `issue20.sh proablation N`: FoX (Pro) without each of its four additions, at lr 1e-3, against the `lr` calls' FoX
# (Pro) (at 1e-3 its seeds agree; at 2e-3 their spread is larger than the differences to be read).
ABLATIONS = {
    "ablation_llama": (
        "Gate ablations (LLaMA block)", "gate ablations (LLaMA block)",
        "`bash scripts/issue20.sh ablation 0`, `ablation 1`, `ablation 2` (one GPU call each: FoX (LLaMA) with its "
        "data-dependent gate, a data-independent gate and a fixed gate, side by side, and their loss on the mix; the "
        "single-seed run is in \"Gate ablations (LLaMA block)\" among the single-seed runs).",
        {"fox-llama:fgate=data_dependent": "FoX (LLaMA), data-dependent gate",
         "fox-llama:fgate=data_independent": "FoX (LLaMA), data-independent gate",
         "fox-llama:fgate=fixed": "FoX (LLaMA), fixed gate"}),
    "headdim_pro": (
        "Head dim (Pro block)", "head dim (Pro block)",
        "`bash scripts/issue20.sh headdim \"0 1\"`, then `headdim 2` (one GPU call each: FoX (Pro) at head dim 64, "
        "the preset's, and at 128, which trains faster, side by side, and their loss on the mix).",
        {"fox-pro:head_dim=64": "FoX (Pro), head dim 64 (the preset)",
         "fox-pro:head_dim=128": "FoX (Pro), head dim 128"}),
    "headdim_pro_125m": (
        "Head dim at 125M (Pro block)", "head dim at 125M (Pro block)",
        "`bash scripts/issue20.sh headdim125 0`, `headdim125 1`, `headdim125 2` (one GPU call each: FoX (Pro) 125M at "
        "head dim 64, the preset's, and at 128 side by side, 36M tokens at 4K context, and their loss on the mix).",
        {"fox-pro-125m:head_dim=64": "FoX (Pro) 125M, head dim 64 (the preset)",
         "fox-pro-125m:head_dim=128": "FoX (Pro) 125M, head dim 128"}),
    "lr_pro": (
        "FoX (Pro) against Transformer (Pro) at lr 1e-3", "lr 1e-3",
        "`bash scripts/issue20.sh lr 1e-3 \"0 1\"`, then `lr 1e-3 2` (one GPU call each: the Pro pair at half the "
        "recipe's learning rate, and their loss on the mix: whether FoX (Pro)'s seed spread at 2e-3 is the rate's).",
        {"transformer-pro@lr=0.001": "Transformer (Pro), lr 1e-3", "fox-pro@lr=0.001": "FoX (Pro), lr 1e-3"}),
    "lr4_pro": (
        "FoX (Pro) against Transformer (Pro) at lr 4e-3", "lr 4e-3",
        "`bash scripts/issue20.sh lr 4e-3 \"0 1\"`, then `lr 4e-3 2` (one GPU call each: the Pro pair at twice the "
        "recipe's learning rate, and their loss on the mix: whether FoX (Pro)'s seed spread at 2e-3 grows or shrinks "
        "above it).",
        {"transformer-pro@lr=0.004": "Transformer (Pro), lr 4e-3", "fox-pro@lr=0.004": "FoX (Pro), lr 4e-3"}),
    "lr_llama": (
        "FoX (LLaMA) against Transformer (LLaMA) at lr 1e-3", "lr 1e-3 (LLaMA block)",
        "`bash scripts/issue20.sh lr 1e-3 \"0 1\" llama`, then `lr 1e-3 2 llama` (one GPU call each: the LLaMA pair at "
        "half the recipe's learning rate, and their loss on the mix: whether FoX (LLaMA)'s lead at 2e-3 holds at "
        "another rate).",
        {"transformer-llama@lr=0.001": "Transformer (LLaMA), lr 1e-3", "fox-llama@lr=0.001": "FoX (LLaMA), lr 1e-3"}),
    "lr4_llama": (
        "FoX (LLaMA) against Transformer (LLaMA) at lr 4e-3", "lr 4e-3 (LLaMA block)",
        "`bash scripts/issue20.sh lr 4e-3 2 llama`, then `lr 4e-3 \"0 1\" llama` (one GPU call each: the LLaMA pair "
        "at twice the recipe's learning rate, and their loss on the mix).",
        {"transformer-llama@lr=0.004": "Transformer (LLaMA), lr 4e-3", "fox-llama@lr=0.004": "FoX (LLaMA), lr 4e-3"}),
    "ablation_pro": (
        "Pro-block ablations at lr 1e-3", "Pro-block ablations at lr 1e-3",
        "`bash scripts/issue20.sh proablation 0`, `proablation 1`, `proablation 2` (one GPU call each: FoX (Pro) "
        "at lr 1e-3 without its QK-norm, output gate, output norm or key/value shift, side by side, and their loss "
        "on the mix, against the `lr 1e-3` calls' FoX (Pro) of the same seeds).",
        {"fox-pro@lr=0.001": "FoX (Pro), lr 1e-3",
         "fox-pro:qk_norm=False@lr=0.001": "FoX (Pro) without QK-norm",
         "fox-pro:output_gate=False@lr=0.001": "FoX (Pro) without the output gate",
         "fox-pro:output_norm=False@lr=0.001": "FoX (Pro) without the output norm",
         "fox-pro:kv_shift=False@lr=0.001": "FoX (Pro) without the key/value shift"}),
}
RECIPE_LR = 2e-3  # the seed calls' rate: runs at another one get "@lr=..." in their kind


def _ablations(runs: dict, units: dict, dropped: list[str], fresh: set[str]) -> None:
    """Each of ABLATIONS against its reference on the mix's held-out documents: one unit each."""
    for uid, (heading, prefix, _, kinds) in ABLATIONS.items():
        if not all(runs.get(kind) for kind in kinds):
            continue
        groups = [(label, runs[kind]) for kind, label in kinds.items()]
        if not _reads(groups, "eval", fresh):
            continue
        out = os.path.join(OUT, uid)
        res = run_compare(groups, "eval", groups[0][0], out, dropped)
        if res is None:
            continue
        body = _compare_body(f"### {heading}: held-out documents of the training mix", out, res)
        body[-1:-1] = [f"![training by seed]({out[5:]}/training.png)", ""]
        n = min(r["n_seeds"] for r in res["rows"])
        units[uid] = (body, [
            f"- {prefix}, {d['model']} - {d['reference']} ({_seeds(n)}): mean loss over 16K tokens "
            f"{_interval_line(d, 'mean_loss')}" for d in res["differences"]])


OOD_TAGS = {"go": "Go source", "austen": "Jane Austen's novels"}
# The bias-shift sweeps a run's folder may hold: unit id -> (folder glob, heading, figure, whether the table splits
# each loss at the training length). `BIAS_SHIFT_OOD=1` (lodo-rest) writes RUN/bias_shift_ood_TAG; reproduce.sh's
# in-mix sweep (BIAS_SHIFT=1, `issue20.sh bias125`) RUN/bias_shift_mix, whose question is the training length.
SHIFT_UNITS = {
    "bias_shift_ood": ("bias_shift_ood_*", "The gate-bias shift on the texts from outside the mix", "bias_shift_ood",
                       False),
    "bias_shift_mix": ("bias_shift_mix", "The gate-bias shift on the mix's held-out documents", "bias_shift_mix",
                       True),
}


def _kind_label(kind: str) -> str:
    base, _, data = kind.partition("/")
    size = re.fullmatch(r"(.*)-(\d+m)", base)
    ablated = {k: label for _, _, _, kinds in ABLATIONS.values() for k, label in kinds.items()}
    label = LABELS.get(base) or ablated.get(base) or (f"{LABELS[size.group(1)]} {size.group(2).upper()}"
                                 if size and size.group(1) in LABELS else base)
    return label + (", no prose" if data == "noprose" else "")


def _shift_text(folder: str) -> str:
    name = os.path.basename(folder)
    if name == "bias_shift_mix":
        return "the mix's held-out documents"
    tag = name[len("bias_shift_ood_"):]
    return OOD_TAGS.get(tag, tag)


def _bias_shifts(runs: dict, units: dict, fresh: set[str] | None = None) -> None:
    """Each of SHIFT_UNITS found in the runs' folders: per run the mean loss at each shift (with a split at the
    training length, within / beyond, where the unit asks), per model and text the seeds' mean change from shift 0,
    and a figure."""
    for uid, (pattern, heading, fig_name, split) in SHIFT_UNITS.items():
        found = {}  # (kind, text) -> [(run, result)]
        for kind, kind_runs in runs.items():
            for run in kind_runs:
                for path in sorted(glob.glob(os.path.join(run, pattern, "bias_shift.json"))):
                    found.setdefault((kind, _shift_text(os.path.dirname(path))), []).append((run, _read(path)))
        if found and (fresh is None or any(_bundle(r) in fresh for got in found.values() for r, _ in got)):
            _bias_shift_unit(found, units, uid, heading, fig_name, split)


def _bias_shift_unit(found: dict, units: dict, uid: str, heading: str, fig_name: str, split: bool) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shifts = next(iter(found.values()))[0][1]["shifts"]
    if 0.0 not in shifts:
        return
    found = {key: [(r, res) for r, res in got if res["shifts"] == shifts] for key, got in found.items()}
    zero = shifts.index(0.0)
    cols = " | ".join(f"{s:+g}" if s else "0" for s in shifts)
    first = next(iter(found.values()))[0][1]
    read = (f"{first['num_seqs']} sequences of {first['seq_len']} tokens per text" if "seq_len" in first
            else "per text")
    if split:
        read += f"; each cell: loss within / beyond the training length of {first['train_len']} tokens"
    table = [f"| model | text | run | {cols} |", "|---" * (3 + len(shifts)) + "|"]
    summary = []
    fig, axes = plt.subplots(1, len(found), figsize=(4.2 * len(found), 3.4), layout="constrained", squeeze=False)
    for ax, ((kind, text), got) in zip(axes[0], sorted(found.items())):
        key = "loss_beyond" if split else "mean_loss"
        change = np.array([np.asarray(res[key]) - res[key][zero] for _, res in got])
        for (run, res), ch in zip(got, change):
            best = int(np.argmin(res["mean_loss"]))
            cells = ([f"{a:.3f} / {b:.3f}" for a, b in zip(res["loss_within"], res["loss_beyond"])] if split
                     else [f"{v:.3f}" for v in res["mean_loss"]])
            table.append(f"| {_kind_label(kind)} | {text} | {os.path.basename(run)} | "
                         + " | ".join(f"**{c}**" if i == best else c for i, c in enumerate(cells)) + " |")
            ax.plot(shifts, ch, marker="o", label=os.path.basename(run))
        mean, std = change.mean(0), change.std(0, ddof=1) if len(got) > 1 else np.zeros(len(shifts))
        what = "loss beyond the training length" if split else "mean loss"
        summary.append(f"- gate-bias shift on {text}, {_kind_label(kind)} ({_seeds(len(got))}): {what} change from "
                       "shift 0 at " + ", ".join(f"{s:+g}: {m:+.3f} ± {d:.3f}" for s, m, d in zip(shifts, mean, std)
                                                  if s != 0))
        ax.axhline(0, color="0.4", lw=0.8)
        # two-line labels: on a one-panel figure the one-line ones ran past its edges
        ax.set_xlabel("forget-gate bias shift\n(positive: remembers longer)")
        ax.set_ylabel(f"{what}\nchange from shift 0 [nats]")
        ax.set_title(f"{_kind_label(kind)}: {text}", fontsize=9)
        ax.legend(fontsize=6, title="run", title_fontsize=6)
    path = os.path.join(OUT, fig_name + ".png")
    os.makedirs(OUT, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    units[uid] = ([f"### {heading}", "", "Mean loss at each shift of every forget gate's bias (`foxformer bias-shift`, "
                   f"{read}; bold: the run's lowest mean):", "", *table, "", f"![bias shift by text]({path[5:]})", ""],
                  summary)


def _in_bundle(path: str, bundles: list[str]) -> str:
    """path as BUNDLE_FOLDER/..., the way the provenance lines name the bundles."""
    b = next(b for b in bundles if os.path.abspath(path).startswith(os.path.abspath(b) + os.sep))
    return os.path.relpath(path, os.path.dirname(os.path.abspath(b)))


# The section's units in the order they appear: each generated part sits between UNIT markers and its summary
# lines end with its id, so that a later run keeps the units its bundles do not cover (an earlier session's bundles
# may be gone with its machine; the figures they gave stay as generated).
MAIN_UNITS = [f"{text}_{block}" for text in TEXTS if text != "eval_src_prose" for block in BLOCKS]
ORDER = (MAIN_UNITS + ["missing", "lodo"] + [f"lodo_{text}" for text in TEXTS]
         + list(ABLATIONS) + ["dropped", "gates"] + list(SHIFT_UNITS) + ["mqar"])
UNIT, UNIT_END = "<!-- issue20:unit {} -->", "<!-- /issue20:unit -->"
INPUTS, EARLIER = "<!-- issue20:inputs {} -->", "@earlier"
_INPUTS_RE = re.compile(r"^<!-- issue20:inputs (.*) -->$", re.M)
_UNIT_RE = re.compile(r"<!-- issue20:unit (\S+) -->\n(.*?)\n<!-- /issue20:unit -->", re.S)
_TAGGED_RE = re.compile(r"^(- .*) <!-- (\S+) -->$", re.M)
_BUNDLE_RE = re.compile(r"^- (\S+) \(bundle folder\): .*$", re.M)


def old_units(doc: str) -> tuple[dict, dict, dict]:
    """(unit id -> body, unit id -> summary lines, bundle name -> provenance line) of the section in ``doc``."""
    sec = doc[doc.index(BEGIN):doc.index(END)] if BEGIN in doc and END in doc else ""
    bodies = {uid: body.split("\n") for uid, body in _UNIT_RE.findall(sec)}
    summary: dict = {}
    for line, uid in _TAGGED_RE.findall(sec):
        summary.setdefault(uid, []).append(line)
    return bodies, summary, {m.group(1): m.group(0) for m in _BUNDLE_RE.finditer(sec)}


def section(bundles: list[str], old: tuple[dict, dict, dict] = ({}, {}, {}), given: list[str] | None = None) -> str:
    """The section from ``bundles``, with the units of ``old`` (``old_units``) that they do not cover. ``given``: the
    bundles of this run (the others are kept inputs, read to pool their seeds with these); every bundle by default.
    Only the parts that read a run of ``given`` are generated again."""
    os.makedirs(OUT, exist_ok=True)
    runs = find_runs(bundles)
    fresh = {os.path.abspath(b) for b in (bundles if given is None else given)}
    units: dict = {}  # unit id -> (body lines, summary lines), what these bundles give
    missing = []  # comparisons whose runs are there but whose evaluations are not (cut by a call's time limit)
    dropped: list[str] = []  # evaluations of other sequences than the rest of their comparison
    for text, what in TEXTS.items():
        if text == "eval_src_prose":
            continue
        for block, (fox, tfm) in BLOCKS.items():
            groups = [(LABELS[fox], runs.get(fox, [])), (LABELS[tfm], runs.get(tfm, []))]
            if not all(g for _, g in groups):
                continue
            new = [r for _, g in groups for r in g if _bundle(r) in fresh]
            out = os.path.join(OUT, f"{text}_{block}")
            res = run_compare(groups, text, LABELS[tfm], out, dropped) if _reads(groups, text, fresh) else None
            if res is None:
                if tried(new, text):
                    missing.append(f"{LABELS[fox]} against {LABELS[tfm]} on {what}")
                continue
            body = _compare_body(f"### {LABELS[fox]} against {LABELS[tfm]}: {what}", out, res)
            if text == "eval":
                body[-1:-1] = [f"![training by seed]({out[5:]}/training.png)", ""]
            d = res["differences"][0] if res["differences"] else {}
            n = res["rows"][0]["n_seeds"]
            units[f"{text}_{block}"] = (body, [
                f"- {what}, {LABELS[fox]} - {LABELS[tfm]} ({_seeds(n)}): mean loss over 16K tokens "
                f"{_interval_line(d, 'mean_loss')}, 8K..16K {_interval_line(d, 'L@16384')}."])
    if missing:
        units["missing"] = (["Not evaluated in these bundles (the runs are there, their evaluations are not: cut by "
                             "the GPU call's time limit, see the bundle's logs): " + "; ".join(missing) + ".", ""], [])
    if all(runs.get(p + "/noprose") for p in BLOCKS["pro"]):
        _lodo(runs, units, dropped, fresh)
    _ablations(runs, units, dropped, fresh)
    if dropped:
        names = ", ".join(_in_bundle(f, bundles) for f in sorted(set(dropped)))
        units["dropped"] = (["Left out of their comparisons (they read other sequences than the rest, e.g. an earlier "
                             f"number of sequences per text): {names}.", ""], [])
    _bias_shifts(runs, units, fresh)
    table, figs, read = gates_section(runs)
    if table and any(_bundle(r) in fresh for r in read):
        # the runs read: a table from runs whose inputs were never kept (the eleventh session's seed 2) stays
        # beside a new one as an earlier call's (_superseded)
        units["gates"] = (["### Forget gates on the mix and on the other texts", "",
                           "Per-head timescale 1 / -mean(log f) (`analyze gates`, 4 sequences of 1024 tokens per "
                           "text):", "", table, f"![gates by text]({figs[0][5:]})", "",
                           INPUTS.format(" ".join(sorted(_run_id(r) for r in read)))], [])
    # one folder per seed: mqar/ (the twelfth session's seed 0) or mqar_sN/ (MQAR_SEED=N)
    seeds = {os.path.join(b, d): _read(os.path.join(b, d, "mqar.json"))["task"]["seed"]
             for b in bundles if os.path.isdir(b) for d in os.listdir(b)
             if re.fullmatch(r"mqar(_s\d+)?", d) and os.path.exists(os.path.join(b, d, "mqar.json"))}
    seed_dirs = sorted(seeds, key=seeds.get)
    if seed_dirs:
        # the detailed seed's figures go to a folder of its own: the published unit's (the twelfth session's seed 0,
        # in mqar/) stay for the unit kept beside a new one whose seeds it did not read (_superseded)
        mqar = seed_dirs[0]
        figs = os.path.join(OUT, f"mqar_s{seeds[mqar]}")
        shutil.copytree(mqar, figs, dirs_exist_ok=True)
        body = ["### Multi-query associative recall", "",
                "`MQAR_SEED=N bash scripts/issue20.sh mqar` (the `small` preset; why FoX's gate start matters here: "
                "section \"Associative recall (MQAR) and the forget gate's start\" below).", ""]
        if len(seed_dirs) > 1:
            body += [seed_table(seed_dirs), "", "One seed in detail (its steps and the gates' reach):", ""]
        read = sorted(f"{os.path.basename(os.path.dirname(os.path.abspath(d)))}/{os.path.basename(d)}"
                      for d in seed_dirs)
        mqar_table = open(os.path.join(mqar, "mqar.md"), encoding="utf-8").read()
        units["mqar"] = (body + [mqar_table, f"![MQAR]({figs[5:]}/mqar.png)", "",
                                 f"![MQAR training]({figs[5:]}/mqar_training.png)", "", INPUTS.format(" ".join(read))],
                         [])
    return _assemble(bundles, units, old)


def _assemble(bundles: list[str], units: dict, old: tuple[dict, dict, dict]) -> str:
    """The section's text: these bundles' units, the old units they do not cover, pending notes for the rest."""
    old_bodies, old_summary, provenance = old[0], old[1], dict(old[2])
    kept = {uid: (body, old_summary.get(uid, [])) for uid, body in old_bodies.items() if uid not in units}
    have = {**kept, **_superseded(units, old), **units}
    if any(uid.startswith("lodo_") for uid in have):  # the heading of the leave-one-domain-out parts
        have["lodo"] = (["### Leave one domain out: prose", "",
                         "Trained on the mix without its prose (`data prepare --leave-out`). The pair against each "
                         "other on each text it read, and (with the seed calls' full-mix models beside it) on the "
                         "held-out prose:", ""], [])
    for b in bundles:  # where each figure comes from
        prov = [open(os.path.join(b, f), encoding="utf-8").read().strip() for f in ("commit.txt", "env.txt")
                if os.path.exists(os.path.join(b, f))]
        if prov:
            name = os.path.basename(os.path.normpath(b))
            provenance[name] = f"- {name} (bundle folder): commit {'; '.join(prov)}"
    parts = [BEGIN, "## Seeds, other domains and recall (issue 20)", "",
             "Generated by `python scripts/issue20_doc.py` from the outputs of `bash scripts/issue20.sh seed 0|1|2`, "
             "`seed-ood 0|1|2`, `lodo`, `lodo-rest`, `ablation` and `mqar` (commands and timings in the script). "
             "Cells: mean ± standard deviation over seeds; differences: 95% bootstrap interval over seeds and "
             "sequences, **bold** where it excludes 0.",
             ""]
    parts += list(provenance.values()) + [""]
    order = [u for uid in ORDER for u in (uid, uid + EARLIER)]
    summary = [f"{line} <!-- {uid} -->" for uid in order if uid in have for line in have[uid][1]]
    if summary:
        parts += ["What the intervals say (generated):", ""] + summary + [""]
    if not any(uid in have for uid in MAIN_UNITS):
        parts += ["### Seeds and other domains", "",
                  "Pending: `bash scripts/issue20.sh seed 0`, `seed 1`, `seed 2` (one GPU call each; the four models "
                  "of both blocks, their per-position loss on the mix, the novels and the Go source, and their "
                  "gates).", ""]
    for uid in order:
        if uid in have:
            parts += [UNIT.format(uid), *have[uid][0], UNIT_END]
        elif uid == "lodo":
            parts += ["### Leave one domain out: prose", "", "Pending: `bash scripts/issue20.sh lodo`.", ""]
        elif uid in ABLATIONS:
            parts += [f"### {ABLATIONS[uid][0]}, three seeds", "", f"Pending: {ABLATIONS[uid][2]}", ""]
        elif uid == "mqar":
            parts += ["### Multi-query associative recall", "", "Pending: `bash scripts/issue20.sh mqar`.", ""]
    return "\n".join(parts) + "\n" + END


def archive(bundles: list[str]) -> None:
    """Keep what the comparisons read from ``bundles`` under OUT/inputs/<bundle>/, slimmed (a bundle does not outlive
    the machine it was unpacked on; these folders are committed): each run's config.yaml and metrics.jsonl, per
    text its loss.json (per-position arrays binned by compare.slim_curve, ~20 KB a model), its gates'
    timescales and its bias-shift means, commit.txt and env.txt, and each MQAR seed's mqar.json and mqar.md. Later runs of this script
    read them as bundles."""
    for b in bundles:
        dst = os.path.join(OUT, "inputs", os.path.basename(os.path.normpath(b)))
        if os.path.abspath(b) == os.path.abspath(dst):
            continue
        os.makedirs(dst, exist_ok=True)
        for f in ("commit.txt", "env.txt"):
            if os.path.exists(os.path.join(b, f)):
                shutil.copy(os.path.join(b, f), dst)
        for run in sorted(glob.glob(os.path.join(b, "runs", "*"))):
            out = os.path.join(dst, "runs", os.path.basename(run))
            os.makedirs(out, exist_ok=True)
            for f in ("config.yaml", "metrics.jsonl"):
                if os.path.exists(os.path.join(run, f)):
                    shutil.copy(os.path.join(run, f), out)
            for text in sorted(os.listdir(run)):
                src = os.path.join(run, text)
                if os.path.exists(os.path.join(src, "loss.json")):
                    data = _read(os.path.join(src, "loss.json"))
                    # a kept input given again is slim already (slim_curve leaves it; the twentieth session's
                    # lodo_rest_s1/s2 inputs were binned twice: 39 bins over positions 1..104)
                    data["models"] = [slim_curve(m) for m in data["models"]]
                    _write(os.path.join(out, text, "loss.json"), data)
                if os.path.exists(os.path.join(src, "bias_shift.json")):
                    data = _read(os.path.join(src, "bias_shift.json"))
                    _write(os.path.join(out, text, "bias_shift.json"),
                           {k: data[k] for k in ("shifts", "train_len", "mean_loss", "loss_within", "loss_beyond",
                                                 "seq_len", "num_seqs") if k in data})
                if os.path.exists(os.path.join(src, "gates.json")):
                    models = _read(os.path.join(src, "gates.json"))["models"]
                    _write(os.path.join(out, text, "gates.json"),
                           {"models": [{"name": m.get("name"), "timescale": m["timescale"]} for m in models]})
        for d in sorted(os.listdir(b)):
            if re.fullmatch(r"mqar(_s\d+)?", d) and os.path.exists(os.path.join(b, d, "mqar.json")):
                os.makedirs(os.path.join(dst, d), exist_ok=True)
                for f in ("mqar.json", "mqar.md"):
                    if os.path.exists(os.path.join(b, d, f)):
                        shutil.copy(os.path.join(b, d, f), os.path.join(dst, d))


def _read(path: str) -> dict:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _write(path: str, data: dict) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f)


def _inputs(body: list[str]) -> set[str] | None:
    found = _INPUTS_RE.search("\n".join(body))
    return set(found.group(1).split()) if found else None


def _superseded(units: dict, old: tuple[dict, dict, dict]) -> dict:
    """The old comparisons that ``units`` replace without reading all their runs (an earlier call whose inputs were
    never kept): each stays as UID@earlier, its figure dropped (the new one overwrote it), its summary lines marked.
    """
    out = {}
    for uid, (body, _) in units.items():
        before, new_runs = old[0].get(uid), _inputs(body)
        if before is None or new_runs is None or (_inputs(before) or {""}) <= new_runs:
            continue
        head, *rest = [line for line in before if not line.startswith("![")]
        rest = [line for i, line in enumerate(rest) if line or i == 0 or rest[i - 1]]  # the figure's blank line
        out[uid + EARLIER] = (
            [f"{head}: an earlier call, not pooled with the rows above (its inputs were not kept)"]
            + rest + old[0].get(uid + EARLIER, []),
            [f"- earlier call, not pooled: {line[2:]}" for line in old[1].get(uid, [])] + old[1].get(uid + EARLIER, []))
    return out


def with_archive(bundles: list[str]) -> list[str]:
    """``bundles`` and the kept ones (OUT/inputs/*) of other names: a new call's seeds join the earlier calls'."""
    names = {os.path.basename(os.path.normpath(b)) for b in bundles}
    kept = sorted(glob.glob(os.path.join(OUT, "inputs", "*")))
    return list(bundles) + [k for k in kept if os.path.isdir(k) and os.path.basename(k) not in names]


def update(text: str, bundles: list[str]) -> str:
    """``text`` (docs/results.md) with its issue-20 section rebuilt from ``bundles`` and the kept inputs; the given
    bundles are kept (``archive``) for later runs."""
    section_text = section(with_archive(bundles), old_units(text), given=bundles)
    archive(bundles)
    return text[:text.index(BEGIN)] + section_text + text[text.index(END) + len(END):]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("bundles", nargs="+", help="unpacked repro_bundle.tgz folders of scripts/issue20.sh")
    args = p.parse_args()
    missing = [b for b in args.bundles if not os.path.isdir(b)]
    if missing:
        print(f"error: bundles: {missing} are not folders (unpack each repro_bundle.tgz into one)", file=sys.stderr)
        return 2
    text = open(DOC, encoding="utf-8").read()
    if BEGIN not in text or END not in text:
        print(f"error: {DOC} has no {BEGIN} ... {END} section", file=sys.stderr)
        return 2
    new = update(text, args.bundles)
    with open(DOC, "w", encoding="utf-8") as f:
        f.write(new)
    print(f"wrote {DOC} and {OUT}/ (the bundles' inputs kept in {OUT}/inputs/: commit them)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
