"""`foxformer report` finds every command's output in a run folder: eviction and bias-shift included."""
import json
import os

import pytest

from foxformer.cli import main
from foxformer.eval.gates import SUMMARY_UNITS, GateStats
from foxformer.eval.report import build_report

PNG = b"\x89PNG\r\n\x1a\n" + b"\0" * 64  # report copies figures byte for byte


def test_report_shows_eviction_and_bias_shift_with_their_figures(tmp_path):
    run = tmp_path / "run"
    (run / "eval").mkdir(parents=True)
    (run / "eval" / "eviction.json").write_text(json.dumps(
        {"name": "fox", "n_sequences": 2, "seq_len": 64, "evict_eps": 4.54e-5, "loss": 3.25, "loss_evicted": 3.2501,
         "mean_abs_diff": 0.0026, "max_abs_diff": 0.01, "kept_fraction": 0.077, "allocated_ratio": 0.08,
         "by_position": {"position": [1.0], "mean_diff": [0.0], "max_abs_diff": [0.0]}}))
    (run / "eval" / "eviction.png").write_bytes(PNG)
    # bias-shift --out FOLDER writes bias_shift.json and its figure beside it, in the run folder itself here
    (run / "bias_shift.json").write_text(json.dumps(
        {"shifts": [0.0, 1.0], "train_len": 32, "mean_loss": [2.5, 2.75], "loss_within": [2.4, 2.7],
         "loss_beyond": [2.6, 2.8]}))
    (run / "bias_shift.png").write_bytes(PNG)
    page = open(build_report([str(run)], str(tmp_path / "report"))).read()
    assert "### KV eviction" in page and "| keys kept | 0.077 |" in page and "| mean absolute loss change | 0.0026 |" in page
    assert "### Forget-gate bias shift" in page and "| shift | mean loss | loss < 32 | loss >= 32 |" in page
    assert "| 1 | 2.75 | 2.7 | 2.8 |" in page
    assets = sorted(os.listdir(tmp_path / "report" / "assets"))
    assert assets == ["0_run_bias_shift.png", "0_run_eviction.png"]
    assert all(f"(assets/{a})" in page for a in assets)


def test_a_folder_without_outputs_names_every_output_looked_for(tmp_path):
    page = open(build_report([str(tmp_path)], str(tmp_path / "report"))).read()
    assert "eviction.json, bias_shift.json, compare.json, mqar.json" in page


def test_report_shows_the_harness_results_of_every_model_evaluated_together(tmp_path):
    """`eval harness A B` writes one file per model, and the report, which looked for harness.json only, said
    "No results found" for the folder."""
    from foxformer.eval.outputs import model_outputs

    run = tmp_path / "run"
    (run / "eval").mkdir(parents=True)
    for file, acc in zip(model_outputs("harness", ["fox", "tf"]), (0.75, 0.5)):
        (run / "eval" / file).write_text(json.dumps({"results": {"my_mc": {"acc,none": acc}}}))
    page = open(build_report([str(run)], str(tmp_path / "report"))).read()
    fox, tf = page.index("### lm-evaluation-harness: fox"), page.index("### lm-evaluation-harness: tf")
    assert fox < page.index("| my_mc | acc,none | 0.75 |") < tf < page.index("| my_mc | acc,none | 0.5 |")
    assert "No results found" not in page


def test_report_shows_a_comparison_with_its_tables_and_figures(tmp_path, capsys):
    """A compare output folder got "No results found": the report did not look for compare.json."""
    import numpy as np

    from foxformer.eval.compare import compare
    from tests.eval.test_compare import _write_run

    a = _write_run(tmp_path, "a", np.arange(63, dtype=float))
    b = _write_run(tmp_path, "b", np.full(63, 2.0))
    out = tmp_path / "cmp"
    result = compare([a, b], str(out), positions=(8, 32))
    capsys.readouterr()
    page = open(build_report([str(out)], str(tmp_path / "report"))).read()
    assert "No results found" not in page and "### Comparison (reference: b)" in page
    assert "| model | train length | mean loss | L(4..8] | L(16..32] |" in page
    assert f"| a | 16 | {result['rows'][0]['mean_loss']:.3f} | 5.500 | 23.500 |" in page
    assert sorted(os.listdir(tmp_path / "report" / "assets")) == [f"0_cmp_{p}" for p in sorted(result["plots"])]


def test_report_shows_an_mqar_table_and_its_figures(tmp_path, capsys):
    """An `eval mqar` output folder got "No results found": the report did not look for mqar.json."""
    from foxformer.eval import mqar

    cfg = mqar.MqarConfig(eval_lengths=[32], eval_pairs=[2])
    (tmp_path / "mqar" / "models").mkdir(parents=True)
    for label, done, acc in (("A", cfg.steps, 0.75), ("B", 54, 0.25)):
        result = {"model": label, "label": label, "non_embedding_params": 1e5, "steps_done": done, "train_s": 1.0,
                  "accuracy": [[acc]], "history": [{"step": done, "loss": 1.0, "accuracy": acc, "pairs": 2}]}
        (tmp_path / "mqar" / "models" / f"{label}.json").write_text(json.dumps({"task": cfg.task(),
                                                                                "result": result}))
    mqar.report(str(tmp_path / "mqar"), cfg)
    capsys.readouterr()
    page = open(build_report([str(tmp_path / "mqar")], str(tmp_path / "report"), fmt="html")).read()
    assert "No results found" not in page and "<h3>MQAR (multi-query associative recall)</h3>" in page
    assert f"<td>A</td><td>0.10M</td><td>{cfg.steps}</td><td>-</td><td>0.75</td>" in page
    assert f"<td>B</td><td>0.10M</td><td>54 of {cfg.steps} (stopped)</td>" in page and "Stopped early" in page
    assert sorted(os.listdir(tmp_path / "report" / "assets")) == ["0_mqar_mqar.png", "0_mqar_mqar_training.png"]


def test_the_html_report_renders_the_bold_of_compare_and_mqar_texts(tmp_path, capsys):
    """Their texts are Markdown: the HTML page showed "**-0.100 [...]**" and "**Stopped early**" literally."""
    from foxformer.eval import mqar
    from foxformer.eval.compare import compare
    from tests.eval.test_compare import _seed_run

    runs = [_seed_run(tmp_path, "fox", 0.0, 0), _seed_run(tmp_path, "tfm", 0.1, 1)]
    diff = compare(runs, str(tmp_path / "cmp"), positions=(8, 32))["differences"][0]["L@32"]
    assert diff["hi"] < 0  # an interval that excludes 0: bold in compare.md
    cfg = mqar.MqarConfig(eval_lengths=[32, 64], eval_pairs=[2])
    (tmp_path / "mqar" / "models").mkdir(parents=True)
    result = {"model": "B", "label": "B", "non_embedding_params": 1e5, "steps_done": 54, "train_s": 1.0,
              "accuracy": [[0.25, 0.5]], "history": [{"step": 54, "loss": 1.0, "accuracy": 0.25, "pairs": 2}]}
    (tmp_path / "mqar" / "models" / "B.json").write_text(json.dumps({"task": cfg.task(), "result": result}))
    mqar.report(str(tmp_path / "mqar"), cfg)
    capsys.readouterr()
    assert "**" in (tmp_path / "cmp" / "compare.md").read_text() + (tmp_path / "mqar" / "mqar.md").read_text()
    page = open(build_report([str(tmp_path / "cmp"), str(tmp_path / "mqar")], str(tmp_path / "report"),
                             fmt="html")).read()
    assert "**" not in page
    assert f"<td><strong>{diff['mean']:+.3f} [{diff['lo']:+.3f}, {diff['hi']:+.3f}]</strong></td>" in page
    assert "<p><strong>Stopped early</strong> by max_minutes" in page
    assert "<th>2@64*</th>" in page and "; * beyond training" in page  # a lone "*" marks a cell, not emphasis
    md = open(build_report([str(tmp_path / "cmp")], str(tmp_path / "report_md"))).read()
    assert f"| **{diff['mean']:+.3f} [" in md  # the Markdown page keeps its Markdown


def test_inline_markdown_in_html_is_rendered_and_the_rest_escaped():
    from foxformer.eval.report import _inline_html

    assert _inline_html("see `eval loss` <here> & **a < b**") == \
        "see <code>eval loss</code> &lt;here&gt; &amp; <strong>a &lt; b</strong>"
    assert _inline_html(0.5) == "0.5" and _inline_html(None) == ""


def test_an_interrupted_report_keeps_the_earlier_page_and_leaves_no_temporary(tmp_path, monkeypatch):
    """report.md was opened with open(path, "w"): a Ctrl-C while it was written left it empty or cut short."""
    out = tmp_path / "report"
    out.mkdir()
    (out / "report.md").write_text("earlier, complete")
    (tmp_path / "run").mkdir()
    monkeypatch.setattr(os, "fsync", lambda fd: (_ for _ in ()).throw(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        build_report([str(tmp_path / "run")], str(out))
    assert (out / "report.md").read_text() == "earlier, complete"
    assert not [n for n in os.listdir(out) if ".tmp-" in n]


def _run_with_eviction(root, name):
    run = root / name
    run.mkdir()
    (run / "eviction.json").write_text(json.dumps({"name": name, "loss": 3.0}))
    (run / "eviction.png").write_bytes(PNG)
    return str(run)


def test_a_rerun_replaces_its_own_assets_keeps_the_users_and_says_so(tmp_path, capsys):
    """A second report into the same folder left the first one's images in assets/, unlinked but shipped."""
    out = tmp_path / "report"
    build_report([_run_with_eviction(tmp_path, "a")], str(out))
    build_report([_run_with_eviction(tmp_path, "b")], str(out), fmt="html")  # another page: its images are its own
    (out / "assets" / "notes.txt").write_text("mine")
    assert "replacing" not in capsys.readouterr().err
    page = open(build_report([_run_with_eviction(tmp_path, "c")], str(out))).read()
    assert f"replacing {out / 'report.md'}" in capsys.readouterr().err
    assert sorted(os.listdir(out / "assets")) == ["0_b_eviction.png", "0_c_eviction.png", "notes.txt"]
    assert "(assets/0_c_eviction.png)" in page


def test_a_rerun_into_a_folder_written_before_the_manifest_replaces_the_images_its_pages_link(tmp_path):
    """A folder written before .report_assets.json existed kept its old images on the first rerun: nothing said
    they were the report's."""
    out = tmp_path / "report"
    build_report([_run_with_eviction(tmp_path, "a")], str(out))
    build_report([_run_with_eviction(tmp_path, "b")], str(out), fmt="html")
    os.remove(out / ".report_assets.json")  # as an earlier version left the folder
    (out / "assets" / "mine.png").write_bytes(PNG)  # a user's image, linked by no page of the report
    (out / "notes.md").write_text("![mine](assets/mine.png)\n")  # nor by a page the report did not write
    build_report([_run_with_eviction(tmp_path, "c")], str(out))
    assert sorted(os.listdir(out / "assets")) == ["0_b_eviction.png", "0_c_eviction.png", "mine.png"]
    assert json.loads((out / ".report_assets.json").read_text()) == {
        "report.html": ["assets/0_b_eviction.png"], "report.md": ["assets/0_c_eviction.png"]}
    build_report([_run_with_eviction(tmp_path, "d")], str(out), fmt="html")
    assert sorted(os.listdir(out / "assets")) == ["0_c_eviction.png", "0_d_eviction.png", "mine.png"]
    assert (out / "notes.md").exists()


@pytest.mark.parametrize("run_dirs", [[], ["missing"]])
def test_a_refused_report_makes_no_output_folder(tmp_path, run_dirs):
    with pytest.raises(ValueError):
        build_report([str(tmp_path / d) for d in run_dirs], str(tmp_path / "report"))
    assert not (tmp_path / "report").exists()


@pytest.mark.parametrize("settings, said", [
    ({"data": "data_cache/my data", "split": "val", "within_docs": False, "tokenizer": "bytes"},
     "Evaluated on the val split of data_cache/my data; losses in nats per byte."),
    ({"data": "data_cache/mix", "split": "train", "within_docs": True, "data_source": "prose", "tokenizer": "gpt2"},
     "Evaluated on the train split of data_cache/mix, documents of prose, windows inside one document; losses in "
     "nats per gpt2 token."),
    ({"source": "notes/held out.jsonl", "tokenizer": "gpt2"},
     "Evaluated on notes/held out.jsonl; losses in nats per gpt2 token."),
], ids=["data", "data-source-within-docs", "source"])
def test_the_report_names_the_data_a_run_trained_and_was_evaluated_on(tmp_path, settings, said):
    """The page named neither the dataset nor its tokenizer: a loss of 1.2 read the same in nats per byte and per
    GPT-2 token, on the training data or another text."""
    run = tmp_path / "run"
    (run / "eval").mkdir(parents=True)
    (run / "config.yaml").write_text("preset: fox-pro-tiny\ndata_dir: data_cache/my data\ntokenizer: bytes\n")
    (run / "metrics.jsonl").write_text(json.dumps({"kind": "train", "step": 1, "tokens": 4096, "loss": 2.5}) + "\n"
                                       + json.dumps({"kind": "eval", "step": 1, "tokens": 4096, "val_loss": 2.4})
                                       + "\n")
    summary = {"name": "run", "seq_len": 64, "train_len": 32, "n_sequences": 2, "mean_loss": 1.25,
               "perplexity": {"1": 9.0, "63": 3.5}}
    (run / "eval" / "loss.json").write_text(json.dumps({"settings": settings, "plots": ["loss_curve.png"],
                                                        "models": [{"summary": summary}]}))
    (run / "eval" / "loss_curve.png").write_bytes(PNG)
    page = open(build_report([str(run)], str(tmp_path / "report"))).read()
    assert "| model | fox-pro-tiny |\n| data | data_cache/my data |\n| tokenizer | bytes |" in page
    assert f"### Per-position loss\n\n{said}\n\n| model | seq_len [tokens] | train_len [tokens] | sequences |" in page
    assert sorted(os.listdir(tmp_path / "report" / "assets")) == ["0_run_loss_curve.png", "0_run_training.png"]


@pytest.mark.parametrize("config, unit", [("tokenizer: gpt2\n", "nats per gpt2 token"), ("", "nats")],
                         ids=["tokenizer", "unknown"])
def test_the_training_table_and_curve_give_their_units(tmp_path, monkeypatch, config, unit):
    """The training plot's axes read "loss" and "tokens" (with matplotlib's "1e6" in the corner), its table
    "tokens | 1048576" and losses without the unit the report gives evaluations."""
    from foxformer.eval import plots

    figures, save = [], plots.save_figure
    monkeypatch.setattr(plots, "save_figure", lambda fig, path: (figures.append(fig), save(fig, path))[1])
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("preset: fox-pro-tiny\n" + config)
    (run / "metrics.jsonl").write_text("".join(
        json.dumps({"kind": "train", "step": s, "tokens": s * 524288, "loss": 3.0 - s / 10}) + "\n" for s in (1, 2))
        + json.dumps({"kind": "eval", "step": 2, "tokens": 1048576, "val_loss": 2.9}) + "\n")
    page = open(build_report([str(run)], str(tmp_path / "report"))).read()
    assert (f"| last train loss [{unit}] | 2.8 |\n| last validation loss [{unit}] | 2.9 |\n| tokens | 1,048,576 |"
            in page)
    (ax,) = figures[0].axes
    assert (ax.get_xlabel(), ax.get_ylabel(), ax.get_title()) == ("training tokens [M]", f"loss [{unit}]",
                                                                   "Training: run")
    assert list(ax.get_lines()[1].get_xdata()) == [1.048576]


def test_gate_and_niah_tables_give_the_units_of_their_numbers(tmp_path):
    """The tables headed the summaries' keys: "median_timescale | 0.7954" said no tokens, "max_depth_shift |
    0.02381" not that it is a share of the context."""
    run = tmp_path / "run"
    run.mkdir()
    gates = {"name": "fox", "has_gate": True, "tokens": 4096, "median_timescale": 0.8, "min_timescale": 0.5,
             "heads_beyond_text": 0, "median_eff_context": 1.0}
    (run / "gates.json").write_text(json.dumps({"models": [{"summary": gates}]}))
    niah = {"name": "fox", "train_len": 256, "trials": 24, "standard_accuracy": 0.5, "max_depth_shift": 0.02}
    (run / "niah.json").write_text(json.dumps({"models": [{"summary": niah}]}))
    page = open(build_report([str(run)], str(tmp_path / "report"))).read()
    assert ("| name | has_gate | text analysed [tokens] | median timescale [tokens] | min timescale [tokens] | "
            "heads with effective context beyond the text [heads (of all layers)] | median effective context [tokens] "
            "|\n|---|---|---|---|---|---|---|\n| fox | True | 4096 | 0.8 | 0.5 | 0 | 1 |") in page
    assert ("| name | train_len [tokens] | trials | standard_accuracy | max needle depth shift [share of the context] "
            "|\n|---|---|---|---|---|\n| fox | 256 | 24 | 0.5 | 0.02 |") in page


def _gate_table_head(page: str) -> list[str]:
    head = page.split("### Forget gates\n\n", 1)[1].split("\n", 1)[0]
    return [cell.strip() for cell in head.strip("|").split("|")]


def test_the_gate_table_heads_each_number_of_a_gate_summary_with_the_unit_gates_json_gives_it(tmp_path):
    """The report kept its own list of the gate summary's headings and units beside gates.SUMMARY_UNITS, and the two
    had drifted: heads_beyond_text had a unit in gates.json and a bare key for a heading in the report."""
    stats = GateStats(name="fox", num_layers=1, num_heads=2, tokens=64, has_gate=True, max_distance=31,
                      timescale=[[2.0, 8.0]], eff_context=[[3.5, None]])
    summary = stats.summary()
    numbers = [k for k, v in summary.items() if isinstance(v, (int, float)) and not isinstance(v, bool)]
    assert numbers == list(SUMMARY_UNITS)
    run = tmp_path / "run"
    run.mkdir()
    (run / "gates.json").write_text(json.dumps({"units": SUMMARY_UNITS, "models": [{"summary": summary}]}))
    head = _gate_table_head(open(build_report([str(run)], str(tmp_path / "report"))).read())
    assert head[:2] == ["name", "has_gate"] and len(head) == len(summary)
    for key, heading in zip(numbers, head[2:]):
        assert heading.endswith(f" [{SUMMARY_UNITS[key]}]") and "_" not in heading, (key, heading)


def test_a_transformer_listed_first_leaves_the_gate_statistics_of_the_models_after_it(tmp_path):
    """The table took its columns from the first model's summary: `analyze gates TRANSFORMER FOX` made a table of
    name and has_gate alone, the FoX model's statistics left out without a word."""
    run = tmp_path / "run"
    run.mkdir()
    fox = {"name": "fox", "has_gate": True, "tokens": 64, "median_timescale": 2.5, "min_timescale": 2.0,
           "heads_beyond_text": 1, "median_eff_context": 3.5}
    (run / "gates.json").write_text(json.dumps({"models": [{"summary": {"name": "tf", "has_gate": False}},
                                                           {"summary": fox}]}))
    page = open(build_report([str(run)], str(tmp_path / "report"))).read()
    assert len(_gate_table_head(page)) == 7
    assert "| tf | False |  |  |  |  |  |\n| fox | True | 64 | 2.5 | 2 | 1 | 3.5 |" in page


@pytest.mark.parametrize("second, said", [
    ("{run}", "'{run}' is given twice"),
    ("{run}/", "'{run}' and '{run}/' are one folder"),
    ("{tmp}/link", "'{run}' and '{tmp}/link' are one folder"),
    ("{tmp}/other/../run", "'{run}' and '{tmp}/other/../run' are one folder"),
], ids=["same-name", "trailing-slash", "symlink", "dot-dot"])
def test_a_folder_named_twice_is_refused_naming_both_and_writes_nothing(tmp_path, capsys, second, said):
    """`report runs/x runs/x/` (or a link to runs/x, or a glob matching it again) wrote runs/x's section twice."""
    run = tmp_path / "run"
    run.mkdir()
    (tmp_path / "other").mkdir()
    (tmp_path / "link").symlink_to(run)
    (run / "metrics.jsonl").write_text(json.dumps({"kind": "train", "step": 1, "tokens": 8, "loss": 3.0}) + "\n")
    names = {"run": str(run), "tmp": str(tmp_path)}
    assert main(["report", str(run), second.format(**names), "--out", str(tmp_path / "report")]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"error: report: {said.format(**names)}; give each run folder once (its section would show twice)"]
    assert not (tmp_path / "report").exists()


def _written(path, when: str) -> str:
    """Set ``path``'s modification time to ``when`` (local "YYYY-MM-DD HH:MM"), as the notes print it."""
    import time

    stamp = time.mktime(time.strptime(when, "%Y-%m-%d %H:%M"))
    os.utime(path, (stamp, stamp))
    return when


# One output of each kind in the run folder and in its eval/ folder, their contents told apart by a number in it
OUTPUT_OF = {
    "loss.json": (lambda x: {"models": [{"summary": {"name": "fox", "mean_loss": x}}]}, "### Per-position loss"),
    "niah.json": (lambda x: {"models": [{"summary": {"name": "fox", "standard_accuracy": x}}]},
                  "### Needle in a haystack"),
    "gates.json": (lambda x: {"models": [{"summary": {"name": "fox", "has_gate": True, "median_timescale": x}}]},
                   "### Forget gates"),
    "eviction.json": (lambda x: {"name": "fox", "loss": x}, "### KV eviction"),
    "bias_shift.json": (lambda x: {"shifts": [0.0], "train_len": 32, "mean_loss": [x], "loss_within": [x],
                                   "loss_beyond": [x]}, "### Forget-gate bias shift"),
}


@pytest.mark.parametrize("name", list(OUTPUT_OF), ids=[n.split(".")[0] for n in OUTPUT_OF])
def test_an_output_in_a_run_folder_and_its_eval_folder_is_shown_from_the_run_folder_naming_both(tmp_path, capsys,
                                                                                                 name):
    """With RUN/loss.json beside RUN/eval/loss.json the report showed the first without a word, perhaps the older."""
    content, heading = OUTPUT_OF[name]
    run = tmp_path / "run"
    (run / "eval").mkdir(parents=True)
    own, other = run / name, run / "eval" / name
    own.write_text(json.dumps(content(1.25)))
    other.write_text(json.dumps(content(7.75)))
    said = (f"{own} (written {_written(own, '2024-03-01 09:30')}) is used, not {other} (written "
            f"{_written(other, '2024-05-02 17:05')}): a folder's own results come before its eval/ folder's")
    assert main(["report", str(run), "--out", str(tmp_path / "report")]) == 0
    assert capsys.readouterr().err.splitlines() == [f"note: {said}"]
    page = (tmp_path / "report" / "report.md").read_text()
    assert f"{heading}\n\n{said}.\n\n" in page
    assert "1.25" in page and "7.75" not in page


def test_harness_results_in_a_run_folder_and_its_eval_folder_come_from_the_run_folder_naming_all(tmp_path, capsys):
    from foxformer.eval.outputs import model_outputs

    run = tmp_path / "run"
    (run / "eval").mkdir(parents=True)
    (run / "harness.json").write_text(json.dumps({"results": {"my_mc": {"acc,none": 0.25}}}))
    for file in model_outputs("harness", ["fox", "tf"]):
        (run / "eval" / file).write_text(json.dumps({"results": {"my_mc": {"acc,none": 0.875}}}))
    own, fox, tf = run / "harness.json", run / "eval" / "harness_fox.json", run / "eval" / "harness_tf.json"
    said = (f"{own} (written {_written(own, '2024-03-01 09:30')}) is used, not {fox} (written "
            f"{_written(fox, '2024-05-02 17:05')}), {tf} (written {_written(tf, '2024-05-02 17:06')}): a folder's "
            f"own results come before its eval/ folder's")
    page = open(build_report([str(run)], str(tmp_path / "report"))).read()
    assert capsys.readouterr().err.splitlines() == [f"note: {said}"]
    assert f"### lm-evaluation-harness\n\n{said}.\n\n| task | metric | value |" in page
    assert "| my_mc | acc,none | 0.25 |" in page and "0.875" not in page and "harness: fox" not in page


def test_an_output_in_one_folder_only_is_shown_without_a_note(tmp_path, capsys):
    run = tmp_path / "run"
    (run / "eval").mkdir(parents=True)
    (run / "eval" / "niah.json").write_text(json.dumps(OUTPUT_OF["niah.json"][0](0.5)))
    page = open(build_report([str(run)], str(tmp_path / "report"))).read()
    assert "### Needle in a haystack\n\n| name | standard_accuracy |" in page
    assert "note" not in capsys.readouterr().err


@pytest.mark.parametrize("order", ["run-first", "eval-first"])
def test_a_run_folder_and_its_eval_folder_given_together_say_which_outputs_show_twice(tmp_path, capsys, order):
    """`report runs/x runs/x/eval` showed x's eval/ outputs in both sections without a word."""
    run = tmp_path / "run"
    (run / "eval").mkdir(parents=True)
    (run / "eval" / "niah.json").write_text(json.dumps(OUTPUT_OF["niah.json"][0](0.5)))
    first, second = (run, run / "eval") if order == "run-first" else (run / "eval", run)
    assert main(["report", str(first), str(second), "--out", str(tmp_path / "report")]) == 0
    niah = run / "eval" / "niah.json"
    assert capsys.readouterr().err.splitlines() == [
        f"note: the section of {second} shows {niah} again, as the section of {first} does"]
    page = (tmp_path / "report" / "report.md").read_text()
    assert page.count("### Needle in a haystack") == 2
    again = f"### Needle in a haystack\n\n{niah} is shown above too, in the section of {first}.\n\n"
    assert page.count(again) == 1 and page.index(f"## {second}") < page.index(again)


def test_a_run_folder_with_outputs_of_its_own_beside_its_eval_folder_given_too_shows_each_once(tmp_path, capsys):
    """The two sections differ where the run folder holds its own output: only the passed-over file is noted."""
    run = tmp_path / "run"
    (run / "eval").mkdir(parents=True)
    (run / "niah.json").write_text(json.dumps(OUTPUT_OF["niah.json"][0](0.25)))
    (run / "eval" / "niah.json").write_text(json.dumps(OUTPUT_OF["niah.json"][0](0.75)))
    page = open(build_report([str(run), str(run / "eval")], str(tmp_path / "report"))).read()
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"note: {run / 'niah.json'} (written ")
    assert "shown above too" not in page
    own, other = page.split(f"## {run / 'eval'}")
    assert "| fox | 0.25 |" in own and "| fox | 0.75 |" in other
