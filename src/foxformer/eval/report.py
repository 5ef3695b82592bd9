"""`foxformer report RUN_DIR...`: one Markdown or HTML page with training curves and the eval / analyze outputs.

Each RUN_DIR (a training run or any folder) is searched for the outputs of ``foxformer eval loss`` (loss.json),
``eval niah`` (niah.json), ``eval harness`` (harness.json, or harness_<model>.json for each of several models
evaluated together), ``analyze gates`` (gates.json), ``eval eviction`` (eviction.json), ``bias-shift``
(bias_shift.json), ``eval compare`` (compare.json) and ``eval mqar`` (mqar.json), in the folder itself and in its
``eval/`` sub-folder (the commands' default output for a run dir; where both hold one, the folder's own, and the
page and stderr name both files), plus the run's metrics.jsonl. Plots are copied next to the page, so the report
folder can be moved as a whole; a rerun into the same folder replaces the page and the images it copied there
(listed in .report_assets.json; in a folder written before that list, the images its page links), and leaves any
other file alone.
"""
from __future__ import annotations

import html
import json
import os
import re
import shutil
import sys
from dataclasses import dataclass, field

from ..paths import write_json, write_text
from . import plots
from .compare import difference_rows, dynamics_rows, loss_rows, run_settings
from .gates import SUMMARY_COLUMNS
from .mqar import MqarConfig, stopped_note, table_caption, table_rows
from .outputs import (Found, at_least_one, locate_model_outputs, locate_output, mark_output_folder, markdown_table,
                      model_tag, note_replacing, safe_name)

OUTPUTS = ("loss.json", "niah.json", "gates.json", "harness[_MODEL].json", "eviction.json", "bias_shift.json",
           "compare.json", "mqar.json")


LOOKED_FOR = f"looked for metrics.jsonl and {', '.join(OUTPUTS)} in it and in its eval/ folder"


def has_results(run_dir: str) -> bool:
    """Whether ``run_dir`` holds anything a report shows (what :func:`collect` looks for)."""
    if os.path.exists(os.path.join(run_dir, "metrics.jsonl")) or locate_model_outputs(run_dir, "harness").paths:
        return True
    return any(locate_output(run_dir, name).paths for name in OUTPUTS if "[" not in name)


@dataclass
class Block:
    kind: str  # "h2" | "h3" | "p" | "img" | "table"
    text: str = ""
    rows: list = field(default_factory=list)


def _read_json(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"report: cannot read {path} ({e})") from e


def _fmt(x) -> str:
    if isinstance(x, float):
        return f"{x:.4g}"
    return "" if x is None else str(x)


def _assets(out_dir: str) -> None:
    """Make ``out_dir``/assets for an image, the page's folder marked first (mark_output_folder): the images come
    before the page, and a report cut short between them left a folder of results unmarked."""
    mark_output_folder(out_dir)
    os.makedirs(os.path.join(out_dir, "assets"), exist_ok=True)


def _copy_image(src: str, out_dir: str, tag: str) -> str:
    _assets(out_dir)
    rel = os.path.join("assets", f"{tag}_{os.path.basename(src)}")
    shutil.copyfile(src, os.path.join(out_dir, rel))
    return rel


def _images(data: dict, base: str, out_dir: str, tag: str) -> list[Block]:
    blocks = []
    for rel in data.get("plots", []):
        src = rel if os.path.isabs(rel) else os.path.join(base, rel)
        if os.path.exists(src):
            blocks.append(Block("img", _copy_image(src, out_dir, tag)))
    return blocks


def _training_blocks(run_dir: str, out_dir: str, tag: str) -> list[Block]:
    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.exists(path):
        return []
    train, val = [], []
    with open(path) as f:
        for line in f:
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut by a crash
            if rec.get("kind") == "train" and rec.get("loss") is not None:
                train.append((rec["tokens"], rec["loss"]))
            elif rec.get("kind") == "eval" and rec.get("val_loss") is not None:
                val.append((rec["tokens"], rec["val_loss"]))
    if not train and not val:
        return []
    # what the losses are of: the page named neither the data nor its tokenizer (nats per byte or per token)
    try:
        config = run_settings(run_dir)
    except (OSError, ValueError):  # the page without those rows rather than none
        config = None
    config = config if isinstance(config, dict) else {}
    unit = _loss_unit(config.get("tokenizer"))
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    # in millions: matplotlib's own ticks for a million tokens were 0.2 ... 1.0 with a "1e6" in the corner
    if train:
        ax.plot([t / 1e6 for t, _ in train], [loss for _, loss in train], lw=0.8, label="train loss")
    if val:
        ax.plot([t / 1e6 for t, _ in val], [loss for _, loss in val], "o-", ms=3, label="validation loss")
    ax.set_xlabel("training tokens [M]")
    ax.set_ylabel(f"loss [{unit}]")
    ax.set_title(f"Training: {os.path.basename(os.path.normpath(run_dir))}", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    _assets(out_dir)
    rel = os.path.join("assets", f"{tag}_training.png")
    plots.save_figure(fig, os.path.join(out_dir, rel))
    rows = [[f"last train loss [{unit}]", _fmt(train[-1][1]) if train else ""],
            [f"last validation loss [{unit}]", _fmt(val[-1][1]) if val else ""],
            ["tokens", f"{(train or val)[-1][0]:,}"]]
    rows += [[label, _fmt(config[key])] for label, key in (("model", "preset"), ("data", "data_dir"),
                                                          ("tokenizer", "tokenizer")) if config.get(key)]
    return [Block("h3", "Training"), Block("table", rows=[["metric", "value"]] + rows), Block("img", rel)]


def _loss_blocks(data: dict, base: str, out_dir: str, tag: str) -> list[Block]:
    rows = [["model", "seq_len [tokens]", "train_len [tokens]", "sequences", "mean loss", "loss < train_len",
             "loss >= train_len"]]
    for m in data.get("models", []):
        s = m.get("summary", {})
        rows.append([s.get("name"), s.get("seq_len"), s.get("train_len"), s.get("n_sequences"), s.get("mean_loss"),
                     s.get("loss_within_train_len"), s.get("loss_beyond_train_len")])
    ppl_rows = []
    for m in data.get("models", []):
        ppl = m.get("summary", {}).get("perplexity", {})
        if not ppl_rows:
            ppl_rows.append(["model"] + list(ppl))
        ppl_rows.append([m.get("summary", {}).get("name")] + list(ppl.values()))
    out = [Block("h3", "Per-position loss")] + _evaluated_on(data.get("settings") or {}) + [Block("table", rows=rows)]
    if ppl_rows:
        out += [Block("p", "Perplexity P(l) at context length l:"), Block("table", rows=ppl_rows)]
    return out + _images(data, base, out_dir, tag)


def _evaluated_on(settings: dict) -> list[Block]:
    """The text an evaluation read, as a paragraph (none where its output does not record it): the page named
    neither the dataset nor the tokenizer, whose tokens its losses are per."""
    if settings.get("data"):
        where = f"the {settings.get('split') or 'val'} split of {settings['data']}"
        where += f", documents of {settings['data_source']}" if settings.get("data_source") else ""
        where += ", windows inside one document" if settings.get("within_docs") else ""
    elif settings.get("source"):
        where = settings["source"]
    else:
        return []
    tokenizer = settings.get("tokenizer")
    unit = f"; losses in {_loss_unit(tokenizer)}" if tokenizer else ""
    return [Block("p", f"Evaluated on {where}{unit}.")]


def _loss_unit(tokenizer: str | None) -> str:
    """What a loss is in: nats per byte or per token of ``tokenizer`` (nats where it is not known)."""
    if not tokenizer:
        return "nats"
    return f"nats per {'byte' if tokenizer == 'bytes' else f'{tokenizer} token'}"


# NiahResult.summary()'s numbers that have a unit, as gates.SUMMARY_COLUMNS: "max_depth_shift | 0.02381" did not
# say that it is a share of the context
NIAH_COLUMNS = {"train_len": ("train_len", "tokens"),
                "max_depth_shift": ("max needle depth shift", "share of the context")}


def summary_headings(columns: dict) -> dict:
    """{summary key: its column's heading, the words with the unit} of ``columns`` ({key: (words, unit)})."""
    return {key: f"{words} [{unit}]" for key, (words, unit) in columns.items()}


def _summary_blocks(title: str, data: dict, base: str, out_dir: str, tag: str, columns: dict) -> list[Block]:
    """A heading, one table row per model from its "summary" dict, then the plots."""
    summaries = [m.get("summary", {}) for m in data.get("models", [])]
    # every model's keys, not the first one's: a Transformer listed first (its summary only name and has_gate)
    # left the FoX models after it without their statistics
    keys = list(dict.fromkeys(k for s in summaries for k in s))
    headings = summary_headings(columns)
    out = [Block("h3", title)]
    if keys:
        out.append(Block("table", rows=[[headings.get(k, k) for k in keys]] + [[s.get(k) for k in keys]
                                                                               for s in summaries]))
    return out + _images(data, base, out_dir, tag)


def _niah_blocks(data: dict, base: str, out_dir: str, tag: str) -> list[Block]:
    return _summary_blocks("Needle in a haystack", data, base, out_dir, tag, NIAH_COLUMNS)


def _gate_blocks(data: dict, base: str, out_dir: str, tag: str) -> list[Block]:
    return _summary_blocks("Forget gates", data, base, out_dir, tag, SUMMARY_COLUMNS)


def _beside(path: str, out_dir: str, tag: str) -> list[Block]:
    """The figure a command drew next to its JSON (eviction.png, bias_shift.png), when it is there."""
    png = path.rsplit(".", 1)[0] + ".png"
    return [Block("img", _copy_image(png, out_dir, tag))] if os.path.exists(png) else []


def _eviction_blocks(data: dict, path: str, out_dir: str, tag: str) -> list[Block]:
    keys = [("model", "name"), ("sequences", "n_sequences"), ("seq_len", "seq_len"), ("evict_eps", "evict_eps"),
            ("loss", "loss"), ("loss with eviction", "loss_evicted"), ("mean absolute loss change", "mean_abs_diff"),
            ("largest absolute loss change", "max_abs_diff"), ("keys kept", "kept_fraction"),
            ("peak memory ratio", "allocated_ratio")]
    rows = [["metric", "value"]] + [[label, data.get(k)] for label, k in keys if k in data]
    return [Block("h3", "KV eviction"), Block("table", rows=rows)] + _beside(path, out_dir, tag)


def _bias_shift_blocks(data: dict, path: str, out_dir: str, tag: str) -> list[Block]:
    train_len = data.get("train_len")
    rows = [["shift", "mean loss", f"loss < {train_len}", f"loss >= {train_len}"]]
    rows += [list(r) for r in zip(data.get("shifts", []), data.get("mean_loss", []), data.get("loss_within", []),
                                  data.get("loss_beyond", []))]
    return [Block("h3", "Forget-gate bias shift"), Block("table", rows=rows)] + _beside(path, out_dir, tag)


def _harness_blocks(data: dict, model: str | None) -> list[Block]:
    rows = [["task", "metric", "value"]]
    for task, metrics in (data.get("results") or {}).items():
        for k, v in metrics.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                rows.append([task, k, v])
    return [Block("h3", "lm-evaluation-harness" + (f": {model}" if model else "")), Block("table", rows=rows)]


def _compare_blocks(data: dict, base: str, out_dir: str, tag: str) -> list[Block]:
    positions = data.get("positions", [])
    out = [Block("h3", f"Comparison (reference: {data.get('reference')})"),
           Block("table", rows=loss_rows(data.get("rows", []), positions))]
    if data.get("differences"):
        out += [Block("p", "Difference to the reference, nats, with a 95% bootstrap interval (bold: the interval "
                           "excludes 0):"), Block("table", rows=difference_rows(data["differences"], positions))]
    dynamics = dynamics_rows(data.get("training") or [])
    if len(dynamics) > 1:
        out += [Block("p", "Training dynamics:"), Block("table", rows=dynamics)]
    return out + _images(data, base, out_dir, tag)


def _mqar_blocks(data: dict, base: str, out_dir: str, tag: str) -> list[Block]:
    cfg = MqarConfig(**data.get("task", {}))
    results = data.get("models", [])
    out = [Block("h3", "MQAR (multi-query associative recall)"), Block("p", table_caption(cfg)),
           Block("table", rows=table_rows(results, cfg))]
    note = stopped_note(results, cfg)
    return out + ([Block("p", note)] if note else []) + _images(data, base, out_dir, tag)


def check_run_dirs(run_dirs: list[str]) -> None:
    """Refuse before anything is written: the checks ran as each folder came, after the output folder and the
    earlier folders' images were made."""
    at_least_one(run_dirs, "report", "RUN_DIR")
    missing = [d for d in run_dirs if not os.path.isdir(d)]
    if missing:  # a typo made (and left behind) an empty folder with a page saying "No results found"
        raise ValueError(f"report: no run folder {', '.join(map(repr, missing))}; give the folders training or the "
                         f"eval commands wrote")
    # One folder named twice ("runs/x runs/x/", a link to it, a glob that also matched it) wrote its section twice.
    # Refused rather than dropped: a page with one section fewer than folders given is easily taken for complete
    # when the second name was a typo for another run; the options taking several values refuse repeats alike.
    seen = {}
    for run_dir in run_dirs:
        st = os.stat(run_dir)
        first = seen.get((st.st_dev, st.st_ino))
        if first is not None:
            same = f"{first!r} is given twice" if first == run_dir else f"{first!r} and {run_dir!r} are one folder"
            raise ValueError(f"report: {same}; give each run folder once (its section would show twice)")
        seen[st.st_dev, st.st_ino] = run_dir


def _noted(part: list[Block], lines: list[str]) -> list[Block]:
    """``part`` (its heading first) with ``lines`` as paragraphs right under the heading."""
    return part[:1] + [Block("p", line) for line in lines] + part[1:]


def collect(run_dirs: list[str], out_dir: str) -> list[Block]:
    """Blocks of the page for ``run_dirs``; copies or draws the images into ``out_dir``/assets."""
    check_run_dirs(run_dirs)
    blocks: list[Block] = []
    # each output shown (its real path): the run folder whose section showed it first. `report runs/x runs/x/eval`
    # showed x's eval/ outputs in both sections without a word; noted, not refused: the two sections differ where
    # x holds outputs of its own, or a training curve
    shown: dict[str, str] = {}
    for n, run_dir in enumerate(run_dirs):
        # the tag names image files: Markdown link targets cannot hold spaces
        tag = f"{n}_{safe_name(os.path.basename(os.path.abspath(run_dir)))}"
        section = _training_blocks(run_dir, out_dir, tag)
        again: dict[str, list[str]] = {}  # {earlier run folder: the outputs its section showed too}

        def lines(found: Found, path: str) -> list[str]:
            """What the page says under an output's heading: a file of its kind passed over (the first file of
            the kind only), the section of another run folder showing it too."""
            said = [f"{found.note}."] if found.note and path == found.path else []
            earlier = shown.setdefault(os.path.realpath(path), run_dir)
            if earlier != run_dir:
                again.setdefault(earlier, []).append(path)
                said.append(f"{path} is shown above too, in the section of {os.path.abspath(earlier)}.")
            return said

        for name, fn in (("loss.json", _loss_blocks), ("niah.json", _niah_blocks), ("gates.json", _gate_blocks),
                         ("compare.json", _compare_blocks), ("mqar.json", _mqar_blocks)):
            found = locate_output(run_dir, name).tell()
            if found.path:
                section += _noted(fn(_read_json(found.path), os.path.dirname(found.path), out_dir, tag),
                                  lines(found, found.path))
        found = locate_model_outputs(run_dir, "harness").tell()
        for path in found.paths:
            section += _noted(_harness_blocks(_read_json(path), model_tag("harness", path)), lines(found, path))
        for name, fn in (("eviction.json", _eviction_blocks), ("bias_shift.json", _bias_shift_blocks)):
            found = locate_output(run_dir, name).tell()
            if found.path:
                section += _noted(fn(_read_json(found.path), found.path, out_dir, tag), lines(found, found.path))
        for earlier, paths in again.items():
            print(f"note: the section of {run_dir} shows {', '.join(paths)} again, as the section of {earlier} does",
                  file=sys.stderr)
        if not section:
            section = [Block("p", f"No results found in {run_dir} ({LOOKED_FOR}).")]
        blocks += [Block("h2", os.path.abspath(run_dir))] + section
    return blocks


def _md_table(rows: list) -> str:
    return markdown_table([[_fmt(c) for c in r] for r in rows])


def render_markdown(blocks: list[Block], title: str) -> str:
    parts = [f"# {title}"]
    for b in blocks:
        if b.kind == "h2":
            parts.append(f"## {b.text}")
        elif b.kind == "h3":
            parts.append(f"### {b.text}")
        elif b.kind == "p":
            parts.append(b.text)
        elif b.kind == "img":
            parts.append(f"![{os.path.basename(b.text)}]({b.text})")
        elif b.kind == "table":
            parts.append(_md_table(b.rows))
    return "\n\n".join(parts) + "\n"


# The Markdown that compare's and mqar's texts hold (fmt_interval's bold intervals, stopped_note, code spans): a
# lone "*" stays text, as in "2@64*" and "* beyond training"
_INLINE_MARKDOWN = re.compile(r"\*\*(.+?)\*\*|`([^`]+)`")


def _inline_html(text) -> str:
    """A paragraph's or table cell's Markdown text as HTML: **bold** and `code` rendered, the rest escaped."""
    text, parts, done = _fmt(text), [], 0
    for m in _INLINE_MARKDOWN.finditer(text):
        tag, inner = ("strong", m[1]) if m[1] is not None else ("code", m[2])
        parts += [html.escape(text[done:m.start()]), f"<{tag}>{html.escape(inner)}</{tag}>"]
        done = m.end()
    return "".join(parts) + html.escape(text[done:])


def render_html(blocks: list[Block], title: str) -> str:
    esc = html.escape
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{esc(title)}</title>",
             "<style>body{font-family:sans-serif;max-width:1100px;margin:auto}table{border-collapse:collapse}"
             "td,th{border:1px solid #ccc;padding:2px 8px}img{max-width:100%}</style></head><body>",
             f"<h1>{esc(title)}</h1>"]
    for b in blocks:
        if b.kind in ("h2", "h3"):
            parts.append(f"<{b.kind}>{esc(b.text)}</{b.kind}>")
        elif b.kind == "p":
            parts.append(f"<p>{_inline_html(b.text)}</p>")
        elif b.kind == "img":
            parts.append(f"<p><img src='{esc(b.text)}' alt='{esc(os.path.basename(b.text))}'></p>")
        elif b.kind == "table":
            head, *body = b.rows
            parts.append("<table><tr>" + "".join(f"<th>{_inline_html(c)}</th>" for c in head) + "</tr>")
            parts += ["<tr>" + "".join(f"<td>{_inline_html(c)}</td>" for c in r) + "</tr>" for r in body]
            parts.append("</table>")
    parts.append("</body></html>")
    return "\n".join(parts)


def build_report(run_dirs: list[str], out_dir: str, *, fmt: str = "md", title: str = "foxformer report") -> str:
    """Write ``out_dir``/report.md (or report.html) and its assets; returns the page's path."""
    if fmt not in ("md", "html"):
        raise ValueError(f"format: expected 'md' or 'html', got {fmt!r}")
    # collect checks the run folders first; each write below makes the folders it writes into
    blocks = collect(list(run_dirs), out_dir)
    page = render_markdown(blocks, title) if fmt == "md" else render_html(blocks, title)
    path = os.path.join(out_dir, f"report.{fmt}")
    pages = _recorded_assets(out_dir)  # before the page is replaced: an earlier one's links may be the record
    note_replacing(path)
    # its report.md was read as a document of a source folder holding it; marked already where it has images
    mark_output_folder(out_dir)
    write_text(path, page)
    _drop_stale_assets(out_dir, os.path.basename(path), [b.text for b in blocks if b.kind == "img"], pages)
    return path


# Which assets each page of the folder wrote: a rerun left the earlier report's images in assets/, unlinked but
# shipped with the folder. Only files a report recorded here are ever removed, never others a user put there.
ASSETS_MANIFEST = ".report_assets.json"
# An image as each page links it (render_markdown, render_html), on a line of its own
_LINKED = {"report.md": re.compile(r"^!\[[^\]\n]*\]\((assets/[^)\s]+)\)$", re.MULTILINE),
           "report.html": re.compile(r"^<p><img src='(assets/[^'\n]+)' alt='[^'\n]*'></p>$", re.MULTILINE)}


def _recorded_assets(out_dir: str) -> dict:
    """{page: the assets it wrote} as the folder's manifest records them. A folder written before the manifest
    existed has none: there each page this command wrote (report.md, report.html) owns the images it links, so
    its first rerun replaces them too; any other file in the folder is no page's."""
    manifest = os.path.join(out_dir, ASSETS_MANIFEST)
    if os.path.exists(manifest):
        try:
            with open(manifest, encoding="utf-8") as f:
                pages = json.load(f)
        except (OSError, json.JSONDecodeError):
            return {}
        return pages if isinstance(pages, dict) else {}
    pages = {}
    for name, linked in _LINKED.items():
        try:
            with open(os.path.join(out_dir, name), encoding="utf-8") as f:
                text = f.read()
        except (OSError, UnicodeDecodeError):
            continue
        links = {m[1] for m in linked.finditer(text)}
        pages[name] = sorted({html.unescape(rel) for rel in links} if name.endswith(".html") else links)
    return pages


def _drop_stale_assets(out_dir: str, page: str, written: list[str], pages: dict) -> None:
    """Record ``written`` (paths under ``out_dir``) as ``page``'s assets in ``pages`` (_recorded_assets) and remove
    those it had before that no page of the folder links now. Run after the page is written: a failed rerun keeps
    the earlier page's images."""
    manifest = os.path.join(out_dir, ASSETS_MANIFEST)
    earlier = pages.get(page, [])
    pages[page] = sorted(set(written))
    in_use = {rel for rels in pages.values() for rel in rels}
    for rel in earlier:
        # the manifest is a plain file in the folder: whatever it names, only a plain file in assets/ is removed
        target = os.path.join(out_dir, rel)
        if (rel not in in_use and os.path.dirname(os.path.normpath(rel)) == "assets"
                and os.path.isfile(target) and not os.path.islink(target)):
            os.remove(target)
    write_json(manifest, pages)
