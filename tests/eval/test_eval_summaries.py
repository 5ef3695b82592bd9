"""What `foxformer eval` tells its user: every file in the printed summary (and none left out), labels of a run and
its export apart, the training-length line in the perplexity legend, a run folder given as --haystack."""
import contextlib
import io
import json
import os
import shutil
from types import SimpleNamespace

import pytest
import yaml

from foxformer.cli import main
from foxformer.data.layout import EVAL_MARK
from foxformer.eval import plots
from foxformer.train.loading import distinct_names

from .test_cli import workspace  # noqa: F401 (the fixture: a run dir and an HF folder of tiny models)


def _summary(argv) -> dict:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(argv) == 0
    text = out.getvalue()
    return json.loads(text[text.find("\n{") + 1:])  # after the table compare prints first


@pytest.fixture(scope="module")
def run_and_export(workspace, tmp_path_factory):  # noqa: F811
    """`eval loss RUN RUN/hf` (a run beside its own export) without --names, and its summary."""
    root = tmp_path_factory.mktemp("run_and_export")
    run = root / "run"
    shutil.copytree(workspace["run"], run)
    shutil.copytree(workspace["hf"], run / "hf")
    out = str(root / "loss_out")
    summary = _summary(["eval", "loss", str(run), str(run / "hf"), "--data", workspace["data"], "--seq-len", "64",
                        "--num-seqs", "2", "--n-boot", "10", "--device", "cpu", "--out", out, "--no-progress"])
    return {"root": root, "out": out, "summary": summary}


def test_eval_loss_summary_lists_its_json_as_it_lists_its_plots(run_and_export):
    summary = run_and_export["summary"]
    assert summary["files"] == ["loss.json"] and summary["plots"] == ["loss_curve.png", "perplexity.png"]
    for name in summary["files"] + summary["plots"]:
        assert os.path.isfile(os.path.join(run_and_export["out"], name)), name


def test_eval_compare_summary_lists_its_json_and_markdown(run_and_export):
    out = str(run_and_export["root"] / "compare_out")
    summary = _summary(["eval", "compare", run_and_export["out"], "--out", out])
    assert summary["out"] == out and summary["files"] == ["compare.json", "compare.md"]
    for name in summary["files"] + summary["plots"]:
        assert os.path.isfile(os.path.join(out, name)), name


def _lists_every_file(summary: dict, out: str) -> None:
    """The summary's files and plots are in ``out``, and nothing else is (sub-folders' files by their paths in it)
    but the mark of an eval output folder, no result of the user's."""
    listed = summary["files"] + summary["plots"]
    assert summary["out"] == out and len(set(listed)) == len(listed)
    for name in listed:
        assert os.path.isfile(os.path.join(out, name)), name
    assert os.path.isfile(os.path.join(out, EVAL_MARK))
    found = sorted(os.path.relpath(os.path.join(folder, f), out) for folder, _, files in os.walk(out) for f in files
                   if f != EVAL_MARK)
    assert found == sorted(listed)


def test_eval_mqar_summary_lists_its_report_and_each_models_result(tmp_path):
    out = str(tmp_path / "mqar")
    summary = _summary(["eval", "mqar", "--steps", "12", "--models", "fox-pro:fgate=fixed", "--device", "cpu",
                        "--out", out, "--no-progress"])
    assert any(name.startswith("models" + os.sep) for name in summary["files"])
    _lists_every_file(summary, out)


def test_eval_harness_summary_lists_each_models_results(workspace, tmp_path):  # noqa: F811
    pytest.importorskip("lm_eval")
    from .test_harness import LOCAL_TASKS

    data = tmp_path / "copy.jsonl"
    data.write_text(json.dumps({"prompt": "a b c", "choices": [" d", " e"], "answer": 0, "target": "d"}))
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "fox_copy_mc.yaml").write_text(LOCAL_TASKS["fox_copy_mc.yaml"].format(data=data))
    out = str(tmp_path / "harness")
    summary = _summary(["eval", "harness", workspace["hf"], "--tasks", "fox_copy_mc", "--include_path", str(tasks),
                        "--device", "cpu", "--out", out, "--no-progress"])
    _lists_every_file(summary, out)


def test_analyze_gates_summary_lists_its_json_and_plots(workspace, tmp_path):  # noqa: F811
    out = str(tmp_path / "gates")
    summary = _summary(["analyze", "gates", workspace["run"], workspace["hf"], "--data", workspace["data"],
                        "--seq-len", "64", "--num-seqs", "2", "--device", "cpu", "--out", out, "--no-progress"])
    _lists_every_file(summary, out)


def test_eval_eviction_summary_lists_its_json_and_plot(workspace, tmp_path):  # noqa: F811
    out = str(tmp_path / "eviction")
    summary = _summary(["eval", "eviction", workspace["hf"], "--data", workspace["data"], "--seq-len", "64",
                        "--num-seqs", "2", "--evict-eps", "1e-3", "--device", "cpu", "--out", out, "--no-progress"])
    _lists_every_file(summary, out)


def test_a_run_and_its_export_get_labels_from_their_paths(run_and_export):
    assert [m["name"] for m in run_and_export["summary"]["models"]] == ["run", "run/hf"]


@pytest.mark.parametrize("paths, names", [
    (["runs/a", "runs/a/hf"], ["a", "a/hf"]),
    (["x/a", "y/a"], ["x/a", "y/a"]),
    (["x/a/checkpoints/step_1", "y/a/checkpoints/step_1"], ["x/a@step_1", "y/a@step_1"]),
    (["a", "b/hf"], ["a", "b"]),
    (["a", "a"], ["a#0", "a#1"]),
], ids=["run-and-its-export", "runs-of-one-name-in-two-folders", "checkpoints-of-two-runs-of-one-name",
        "names-apart-stay-short", "one-path-twice"])
def test_default_labels_of_models_evaluated_together_are_distinct(paths, names):
    assert distinct_names(paths) == names


def test_the_perplexity_plot_legend_names_the_trained_length(tmp_path, monkeypatch):
    legends = []
    monkeypatch.setattr(plots, "save_figure", lambda fig, path: legends.append(
        [t.get_text() for t in fig.axes[0].get_legend().get_texts()]) or path)
    curve = SimpleNamespace(name="m", lengths=[1, 2, 4, 8], perplexity=[9.0, 8.0, 7.0, 7.5], n_sequences=1,
                            train_len=4)
    plots.plot_perplexity([curve, SimpleNamespace(**{**vars(curve), "name": "n"})], str(tmp_path / "p.png"))
    assert legends[0].count("trained length (4 tokens)") == 1


@pytest.mark.parametrize("train_lens, colours", [((4, 4), ["0.35"]), ((4, 8), ["C0", "C1"])],
                         ids=["shared", "apart"])
@pytest.mark.parametrize("plot", ["plot_perplexity", "plot_loss_curves"])
def test_a_trained_length_is_drawn_once_in_the_colour_it_means(plot, train_lens, colours, tmp_path, monkeypatch):
    """One dashed line per model put the last model's colour on a length they shared, while the perplexity
    legend showed the first's: the line now reads as belonging to no single model."""
    drawn = []
    monkeypatch.setattr(plots, "save_figure", lambda fig, path: drawn.extend(
        line for line in fig.axes[0].get_lines() if line.get_linestyle() == "--") or path)
    curves = [SimpleNamespace(name=name, lengths=[1, 2, 4, 8], perplexity=[9.0, 8.0, 7.0, 7.5], n_sequences=1,
                              train_len=t, positions=list(range(1, 9)), smoothed=[3.0] * 8, mean_loss=3.0,
                              confidence=0.95) for name, t in zip("mn", train_lens)]
    getattr(plots, plot)(curves, str(tmp_path / "p.png"))
    assert [line.get_color() for line in drawn] == colours
    assert [line.get_xdata()[0] for line in drawn] == [t - 1 for t in dict.fromkeys(train_lens)]


def test_a_run_folder_given_as_haystack_is_said_to_be_a_run_not_text(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(yaml.safe_dump({"preset": "fox-pro-tiny", "context": 32}))
    (run / "metrics.jsonl").write_text(json.dumps({"kind": "train", "step": 1, "loss": 9.0}) + "\n")
    assert main(["eval", "niah", str(tmp_path / "no-such-model"), "--haystack", str(run), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert f"--haystack: {str(run)!r} is a training run" in err and "builtin:pydoc" in err and "text field" not in err


@pytest.mark.parametrize("save", ["save_loss", "save_niah", "save_gates"])
def test_saving_the_results_of_no_model_is_refused(save, tmp_path):
    """save_loss failed on max() of an empty sequence, save_niah divided by zero, save_gates wrote a gates.json of
    no model."""
    from foxformer.eval import outputs

    with pytest.raises(ValueError, match=f"^{save}: expected at least one model's results$"):
        getattr(outputs, save)([], str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()


def test_comparing_no_runs_is_refused(tmp_path):
    from foxformer.eval.compare import compare

    with pytest.raises(ValueError, match="^compare: expected at least one RUN_DIR$"):  # was max()'s own error
        compare([], str(tmp_path / "cmp"))
