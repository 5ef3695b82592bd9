"""`foxformer eval compare`: separately evaluated runs side by side."""
import json
import os
import re

import numpy as np
import pytest

from foxformer.cli import main
from foxformer.eval.compare import compare, log_bins, value_at

from .helpers import save_loss_unplotted


def _write_run(tmp_path, name, loss, *, seq_len=64, data="d", train_len=16):
    run = tmp_path / name / "eval"
    run.mkdir(parents=True)
    n = len(loss)
    model = {"name": name, "seq_len": seq_len, "n_sequences": 2, "train_len": train_len, "mean_loss": float(np.mean(loss)),
             "confidence": 0.95, "positions": list(range(1, n + 1)), "loss": list(loss), "smoothed": list(loss),
             "smoothed_lo": list(loss), "smoothed_hi": list(loss), "lengths": [1, 2, 4, 8, 16, 32, 63],
             "perplexity": [5.0] * 7, "perplexity_lo": [4.0] * 7, "perplexity_hi": [6.0] * 7}
    settings = {"data": data, "split": "val", "seq_len": seq_len, "num_seqs": 2}
    (run / "loss.json").write_text(json.dumps({"settings": settings, "models": [model]}))
    return str(tmp_path / name)


def test_table_is_the_octave_mean_and_figures_are_written(tmp_path):
    a = _write_run(tmp_path, "a", np.arange(63, dtype=float))
    b = _write_run(tmp_path, "b", np.full(63, 2.0))
    out = tmp_path / "out"
    res = compare([a, b], str(out), positions=(8, 32, 128))
    row_a = res["rows"][0]
    assert row_a["L@8"] == pytest.approx(np.mean(np.arange(4, 8)))   # positions 5..8 -> indices 4..7
    assert row_a["L@32"] == pytest.approx(np.mean(np.arange(16, 32)))
    assert row_a["L@128"] is None                                     # beyond the evaluated length
    assert res["reference"] == "b"
    for name in ("loss_curves.png", "loss_difference.png", "perplexity.png", "compare.md", "compare.json"):
        assert (out / name).stat().st_size > 0
    assert "| a | 16 |" in (out / "compare.md").read_text()


def test_log_bins_cover_every_position_once():
    loss = np.random.default_rng(0).random(1000)
    centres, means = log_bins(loss)
    assert np.all(np.diff(centres) > 0) and centres[0] == 1.0
    assert len(means) == len(centres) and np.isfinite(means).all()


@pytest.mark.parametrize("n", [1, 2, 5, 63, 1000], ids=["one", "two", "five", "sixty-three", "thousand"])
def test_log_bins_include_every_position_and_the_last(n):
    # the bins stopped before position n: the last point (the full evaluation length) was dropped
    for p in range(n):
        loss = np.zeros(n)
        loss[p] = 1.0
        centres, means = log_bins(loss)
        assert (means > 0).sum() == 1, p
    centres, _ = log_bins(np.ones(n))
    assert centres[0] == 1.0 and centres[-1] <= n and np.all(np.diff(centres) > 0)


@pytest.mark.parametrize("b_settings, said", [
    ({"data": "other", "tokens_sha256": "2"}, "(--data other against d)"),
    ({"seq_len": 128, "num_seqs": 4, "tokens_sha256": "2"}, "(--seq-len 128 against 64, --num-seqs 4 against 2)"),
    ({"tokens_sha256": "2"}, "(the same flags, but other tokens: the data changed between the evaluations)"),
], ids=["other-data", "other-length-and-count", "same-flags-other-tokens"])
def test_runs_that_measured_different_sequences_are_refused_naming_the_flags(tmp_path, capsys, b_settings, said):
    # the message held both evaluations' settings as two dicts of nine keys each, to be told apart by eye; the same
    # tokens (tokens_sha256) under other flags are the same sequences, so every case here reads other tokens
    a = _write_run(tmp_path, "a", np.ones(63))
    b = _write_run(tmp_path, "b", np.ones(63))
    for run, extra in ((a, {"tokens_sha256": "1"}), (b, b_settings)):
        path = os.path.join(run, "eval", "loss.json")
        data = json.load(open(path))
        data["settings"].update({"tokens_sha256": "1", **extra})
        open(path, "w").write(json.dumps(data))
    assert main(["eval", "compare", a, b, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"error: {b} and {a} measured different sequences {said}; "
                   f"compare only evaluations of the same sequences: run `foxformer eval loss` on each run with the "
                   f"same flags")
    assert not (tmp_path / "out").exists()


def test_cli_names_and_missing_run(tmp_path, capsys):
    a = _write_run(tmp_path, "a", np.ones(63))
    assert main(["eval", "compare", a, "--names", "FoX", "--out", str(tmp_path / "o")]) == 0
    out, err = capsys.readouterr()
    assert "| FoX |" in out and "replacing" not in err
    # a second comparison into the same folder replaced the first without a word, unlike the other eval commands
    assert main(["eval", "compare", a, "--out", str(tmp_path / "o")]) == 0
    assert f"note: replacing {tmp_path / 'o' / 'compare.json'} (written " in capsys.readouterr().err
    assert main(["eval", "compare", str(tmp_path / "nope"), "--out", str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err == f"error: {tmp_path / 'nope'}: no such run folder or loss.json\n"
    (tmp_path / "unevaluated").mkdir()
    assert main(["eval", "compare", str(tmp_path / "unevaluated"), "--out", str(tmp_path / "o")]) == 2
    run = tmp_path / "unevaluated"
    assert capsys.readouterr().err == (f"error: {run} has no loss.json (nor has {run / 'eval'}): run `foxformer eval "
                                       f"loss {run}` first\n")


def test_a_loss_json_in_a_run_folder_and_its_eval_folder_is_compared_from_the_run_folder_naming_both(tmp_path,
                                                                                                      capsys):
    """With RUN/loss.json beside RUN/eval/loss.json the comparison took the first without a word, perhaps the
    older; the run's niah.json likewise."""
    from foxformer.eval.niah import NiahResult
    from foxformer.eval.outputs import save_niah

    a = _write_run(tmp_path, "a", np.full(63, 7.75))
    os.replace(os.path.join(a, "eval", "loss.json"), os.path.join(a, "loss.json"))
    _write_run(tmp_path / "newer", "a", np.full(63, 1.25))
    os.replace(tmp_path / "newer" / "a" / "eval" / "loss.json", os.path.join(a, "eval", "loss.json"))
    for folder, hit in ((a, True), (os.path.join(a, "eval"), False)):
        records = [{"length": 32, "depth": 0.5, "mode": "standard", "needle": 0, "seed": 0, "value": "1",
                    "answer_logprob": -1.0, "ll_correct": hit, "found": hit}]
        save_niah([NiahResult(name="a", lengths=[32], depths=[0.5], modes=["standard"], train_len=16,
                              records=records)], folder)
    assert main(["eval", "compare", a, "--out", str(tmp_path / "out")]) == 0
    out, err = capsys.readouterr()
    notes = [line for line in err.splitlines() if line.startswith("note: ")]
    assert [re.sub(r" \(written [^)]+\)", "", line) for line in notes] == [
        f"note: {a}/{name} is used, not {a}/eval/{name}: a folder's own results come before its eval/ folder's"
        for name in ("loss.json", "niah.json")]
    assert "| a | 16 | 7.750 | 7.750 |" in out and "1.25" not in out
    assert "| a | standard | 1.00 |" in out and "| a | standard | 0.00 |" not in out


def test_value_at_the_last_position_uses_the_last_octave():
    from types import SimpleNamespace

    c = SimpleNamespace(seq_len=64, loss=list(np.arange(63.0)))
    assert value_at(c, 64) == pytest.approx(np.mean(np.arange(32, 63)))


def test_validation_curves_come_from_the_runs_metrics(tmp_path):
    a = _write_run(tmp_path, "a", np.ones(63))
    recs = [{"kind": "eval", "tokens": t, "val_loss": 5.0 - t / 1e6} for t in (1_000_000, 2_000_000)]
    (tmp_path / "a" / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    res = compare([a], str(tmp_path / "out"))
    assert "validation.png" in res["plots"]


def test_needle_results_are_drawn_together_and_tabulated(tmp_path):
    from foxformer.eval.niah import NiahResult
    from foxformer.eval.outputs import save_niah

    runs = []
    for name, hit in (("a", True), ("b", False)):
        run = _write_run(tmp_path, name, np.ones(63))
        records = [{"length": l, "depth": d, "mode": "standard", "needle": 0, "seed": 0, "value": "1",
                    "answer_logprob": -1.0, "ll_correct": hit, "found": hit or l == 32}
                   for l in (32, 64) for d in (0.0, 1.0)]
        save_niah([NiahResult(name=name, lengths=[32, 64], depths=[0.0, 1.0], modes=["standard"], train_len=32,
                              records=records)], str(tmp_path / name / "eval"))
        runs.append(run)
    res = compare(runs, str(tmp_path / "out"), names=["A", "B"])
    assert "niah.png" in res["plots"]
    text = (tmp_path / "out" / "compare.md").read_text()
    assert "| A | standard | 1.00 | 1.00 |" in text and "| B | standard | 1.00 | 0.00 |" in text


@pytest.mark.parametrize("a,b,said", [({"within_docs": True}, {"within_docs": False}, "same sequences"),
                                      ({"tokenizer": "gpt2"}, {"tokenizer": "bytes"}, "different tokenizers")],
                         ids=["within-docs-or-not", "source-tokenizers"])
def test_runs_that_cut_other_sequences_from_the_same_data_are_refused(tmp_path, a, b, said):
    runs = []
    for name, extra in (("a", a), ("b", b)):
        run = _write_run(tmp_path, name, np.ones(63))
        path = tmp_path / name / "eval" / "loss.json"
        data = json.loads(path.read_text())
        data["settings"].update(extra)
        path.write_text(json.dumps(data))
        runs.append(run)
    with pytest.raises(ValueError, match=said):
        compare(runs, str(tmp_path / "out"))


@pytest.mark.parametrize("setting", [{"within_docs": True}, {"tokenizer": "gpt2"}], ids=["within-docs", "tokenizer"])
def test_outputs_from_before_a_setting_was_recorded_still_compare(tmp_path, setting):
    """A --data evaluation records its dataset's tokenizer since eval compare names the tokenizers of evaluations
    it refuses; those from before are of the tokenizer they ran with."""
    a = _write_run(tmp_path, "a", np.ones(63))
    b = _write_run(tmp_path, "b", np.ones(63))
    path = tmp_path / "b" / "eval" / "loss.json"
    data = json.loads(path.read_text())
    data["settings"].update(setting)
    path.write_text(json.dumps(data))
    assert len(compare([a, b], str(tmp_path / "out"))["rows"]) == 2


@pytest.mark.parametrize("positions", [(0, 8), (-4, 8)], ids=["zero", "negative"])
def test_positions_before_the_first_are_refused(tmp_path, positions):
    # an empty octave: NaN in the table and a NaN literal in compare.json
    a = _write_run(tmp_path, "a", np.ones(63))
    with pytest.raises(ValueError, match="positions"):
        compare([a], str(tmp_path / "out"), positions=positions)


def test_positions_that_are_not_powers_of_two_are_refused_with_the_nearest_ones(tmp_path, capsys):
    """`--positions 24,40` gave the loss table its columns but dropped the difference table without a word: a
    loss.json keeps the sequences' losses only over the octaves ending at powers of two, which its intervals
    resample."""
    a, b = _seed_run(tmp_path, "a", 0.0, 0), _seed_run(tmp_path, "b", 0.1, 1)
    out = str(tmp_path / "out")
    assert main(["eval", "compare", a, b, "--out", out, "--positions", "24,40,1"]) == 2
    assert capsys.readouterr().err.strip() == ("error: --positions: expected powers of two >= 2 (the octaves whose "
                                               "per-sequence losses loss.json keeps), got [24, 40, 1]; e.g. 2,32")
    assert not os.path.exists(out)
    assert main(["eval", "compare", a, b, "--out", out, "--positions", "16,32"]) == 0
    assert [d["model"] for d in json.loads((tmp_path / "out" / "compare.json").read_text())["differences"]] == ["a"]


@pytest.mark.parametrize("flags, said", [
    pytest.param(["--names", "x,y,z"], "--names: 3 given for 2 models; give one name per model", id="names"),
    pytest.param(["--reference", "c"], "--reference: 'c' is none of the models ['a', 'b']", id="reference"),
])
def test_the_command_names_the_flag_the_api_its_keyword(tmp_path, capsys, flags, said):
    a, b = _write_run(tmp_path, "a", np.ones(63)), _write_run(tmp_path, "b", np.ones(63))
    assert main(["eval", "compare", a, b, "--out", str(tmp_path / "out"), *flags]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [f"error: {said}"]
    assert not (tmp_path / "out").exists()
    keyword = {flags[0].lstrip("-"): flags[1].split(",") if flags[0] == "--names" else flags[1]}
    with pytest.raises(ValueError, match=re.escape(said.lstrip("-"))):
        compare([a, b], str(tmp_path / "api"), **keyword)


def test_a_missing_difference_table_is_said_in_the_table(tmp_path):
    """loss.json files without per-sequence losses (written by older versions) have no interval to give: the
    difference table was missing with nothing saying why."""
    a = _write_run(tmp_path, "a", np.ones(63))
    b = _write_run(tmp_path, "b", np.full(63, 2.0))
    res = compare([a, b], str(tmp_path / "out"), positions=(8,))
    assert res["differences"] == []
    assert "No difference to b for a: a loss.json keeps no per-sequence losses" in (
        tmp_path / "out" / "compare.md").read_text()


def _write_models(tmp_path, run, loss_models, niah_models):
    """A run whose loss.json and niah.json hold the named models (NIAH accuracy 1 for every model)."""
    from foxformer.eval.niah import NiahResult
    from foxformer.eval.outputs import save_niah

    path = _write_run(tmp_path, run, np.ones(63))
    loss_json = tmp_path / run / "eval" / "loss.json"
    data = json.loads(loss_json.read_text())
    data["models"] = [{**data["models"][0], "name": m} for m in loss_models]
    loss_json.write_text(json.dumps(data))
    if niah_models:
        records = [{"length": 32, "depth": 0.0, "mode": "standard", "needle": 0, "seed": 0, "value": "1",
                    "answer_logprob": 0.0, "ll_correct": True, "found": True}]
        save_niah([NiahResult(name=m, lengths=[32], depths=[0.0], modes=["standard"], train_len=16, records=records)
                   for m in niah_models], str(tmp_path / run / "eval"))
    return path


# (loss models, niah models) of two runs, the --names of the loss models, and the NIAH labels expected
_NIAH_RENAMES = {
    # same number of NIAH results as models, but spread otherwise: by position z got y's label
    "other-counts-per-run": ((["x", "y"], ["x"]), (["z"], ["z", "w"]), ["X", "Y", "Z"], ["X", "Z", "w"]),
    "other-order-in-a-run": ((["x", "y"], ["y", "x"]), (["z"], []), ["X", "Y", "Z"], ["Y", "X"]),
    # fewer NIAH results than models (here and above): nothing was renamed
    "one-run-without-niah": ((["x"], []), (["z"], ["z"]), ["X", "Z"], ["Z"]),
}


@pytest.mark.parametrize("case", list(_NIAH_RENAMES))
def test_names_follow_each_needle_result_to_its_run(tmp_path, case):
    a, b, names, want = _NIAH_RENAMES[case]
    runs = [_write_models(tmp_path, "a", *a), _write_models(tmp_path, "b", *b)]
    compare(runs, str(tmp_path / "out"), names=names)
    niah_table = (tmp_path / "out" / "compare.md").read_text().split("Needle retrieval")[1]
    assert [line.split(" | ")[0].lstrip("| ") for line in niah_table.splitlines() if "| standard |" in line] == want


@pytest.mark.parametrize("figure", ["loss_curves.png", "loss_difference.png"], ids=["loss-curves", "loss-difference"])
def test_training_length_line_is_where_the_loss_plots_draw_it(tmp_path, monkeypatch, figure):
    # x is the position i of L(i), the loss with i tokens of context: a model trained on sequences of
    # train_len tokens saw contexts up to train_len - 1, where `eval loss` draws the line; compare drew it at train_len
    from foxformer.eval import plots

    figures, save = {}, plots.save_figure

    def capture(fig, path):
        figures[os.path.basename(path)] = fig
        return save(fig, path)

    monkeypatch.setattr(plots, "save_figure", capture)
    a = _write_run(tmp_path, "a", np.ones(63))                       # train_len 16
    compare([a], str(tmp_path / "out"))
    vertical = [line.get_xdata()[0] for line in figures[figure].axes[0].lines
                if len(line.get_xdata()) == 2 and line.get_xdata()[0] == line.get_xdata()[1]]
    assert vertical == [15]


@pytest.mark.parametrize("train_len", [16, None], ids=["known", "unknown"])
def test_an_unknown_training_length_is_a_dash_and_no_dashed_line_is_promised(tmp_path, monkeypatch, train_len):
    """An HF folder evaluated without --train-len: compare.md read "train length | None" and both loss plots'
    titles explained a dashed line they did not draw."""
    from foxformer.eval import plots

    figures, save = {}, plots.save_figure

    def capture(fig, path):
        figures[os.path.basename(path)] = fig
        return save(fig, path)

    monkeypatch.setattr(plots, "save_figure", capture)
    a = _write_run(tmp_path, "a", np.ones(63), train_len=train_len)
    b = _write_run(tmp_path, "b", np.full(63, 2.0), train_len=train_len)
    compare([a, b], str(tmp_path / "out"))
    table = (tmp_path / "out" / "compare.md").read_text()
    assert ("| a | 16 |" if train_len else "| a | - |") in table and "None" not in table
    for name in ("loss_curves.png", "loss_difference.png"):
        ax = figures[name].axes[0]
        vertical = [line for line in ax.lines if line.get_xdata()[0] == line.get_xdata()[-1]]
        assert bool(vertical) == ("dashed: train length" in ax.get_title()) == bool(train_len), name


def _seed_run(tmp_path, name, offset, seed):
    """A run dir with a real loss.json (per-sequence figures) and a metrics.jsonl, as training leaves them."""
    from foxformer.eval.loss import loss_curve

    rng = np.random.default_rng(seed)
    shared = np.random.default_rng(99).normal(0, 0.3, size=(6, 1))  # the sequences' own difficulty
    rows = 3.0 + offset + shared + rng.normal(0, 0.02, size=(6, 63))
    run = tmp_path / name
    save_loss_unplotted([loss_curve(rows, name=name, train_len=16, n_boot=50)], str(run / "eval"),
                        {"data": "d", "split": "val", "seq_len": 64, "num_seqs": 6})
    records = [{"kind": "train", "step": s, "tokens": 100 * s, "loss": 5.0 - s / 30 + offset, "grad_norm": 1.0,
                "lr": 1e-3} for s in range(1, 61)]
    records += [{"kind": "eval", "step": 60, "tokens": 6000, "val_loss": 3.0 + offset + seed / 100,
                 "gate_log_f": [[-0.1, -0.01]]}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(run)


def test_seeds_of_a_model_are_one_group_with_spread_and_intervals(tmp_path):
    runs = [_seed_run(tmp_path, f"fox_s{s}", 0.0, s) for s in range(3)]
    runs += [_seed_run(tmp_path, f"tfm_s{s}", 0.1, 10 + s) for s in range(3)]
    res = compare(runs, str(tmp_path / "out"), positions=(8, 32))
    fox, tfm = res["rows"]
    assert (fox["model"], fox["n_seeds"], tfm["model"]) == ("fox", 3, "tfm")
    assert fox["final_val_loss"] == pytest.approx(3.01) and fox["spread"]["final_val_loss"]["std"] == pytest.approx(0.01)
    assert tfm["mean_loss"] - fox["mean_loss"] == pytest.approx(0.1, abs=0.01)
    diff = res["differences"][0]
    assert (diff["model"], diff["reference"]) == ("fox", "tfm")
    # the sequences' shared difficulty (std 0.3) cancels in the paired difference: a narrow interval below 0
    assert diff["L@32"]["lo"] < diff["L@32"]["mean"] < diff["L@32"]["hi"] < 0 and diff["L@32"]["lo"] > -0.15
    md = (tmp_path / "out" / "compare.md").read_text()
    assert "| fox | 3 | 16 | 3.010 ± 0.010 |" in md and "**-0.1" in md
    assert {"training.png", "validation.png"} <= set(res["plots"])
    assert res["training"][0]["gate_median_timescale"] == pytest.approx(55.0)


def test_single_runs_get_a_sequence_bootstrap_of_their_difference(tmp_path):
    a, b = _seed_run(tmp_path, "a", 0.0, 0), _seed_run(tmp_path, "b", 0.0, 1)
    res = compare([a, b], str(tmp_path / "out"), positions=(8,))
    assert [r["n_seeds"] for r in res["rows"]] == [1, 1]
    d = res["differences"][0]["mean_loss"]
    assert d["lo"] <= d["mean"] <= d["hi"] and abs(d["mean"]) < 0.02


def test_default_columns_are_within_the_evaluated_length(tmp_path, capsys):
    """The default positions (512 ... 16384) left four of five columns empty for runs evaluated at 2048."""
    a = _write_run(tmp_path, "a", np.linspace(3, 2, 2047), seq_len=2048)
    b = _write_run(tmp_path, "b", np.full(2047, 2.5), seq_len=2048)
    assert main(["eval", "compare", a, b, "--out", str(tmp_path / "out")]) == 0
    res = json.loads((tmp_path / "out" / "compare.json").read_text())
    assert res["positions"] == [128, 256, 512, 1024, 2048]
    assert all(row[f"L@{p}"] is not None for row in res["rows"] for p in res["positions"])


def test_slim_entries_give_the_same_table_and_intervals(tmp_path):
    """slim_curve keeps a loss.json small enough for a repository: compared again, the table, the spreads and the
    bootstrap intervals are those of the full entries, and the binned curves of the figures are too."""
    import shutil

    from foxformer.eval.compare import _binned_mean, expand_curve, load_curves, slim_curve

    full = [_seed_run(tmp_path / "full", f"fox_s{s}", 0.0, s) for s in range(2)]
    full += [_seed_run(tmp_path / "full", f"tfm_s{s}", 0.1, 10 + s) for s in range(2)]
    slim = []
    for run in full:
        dst = tmp_path / "slim" / os.path.basename(run)
        shutil.copytree(run, dst)
        path = dst / "eval" / "loss.json"
        data = json.loads(path.read_text())
        data["models"] = [slim_curve(m) for m in data["models"]]
        path.write_text(json.dumps(data))
        slim.append(str(dst))
        model = json.loads((tmp_path / "full" / os.path.basename(run) / "eval" / "loss.json").read_text())["models"][0]
        assert len(data["models"][0]["loss"]) == len(data["models"][0]["bin_edges"]) - 1 < len(model["loss"])
        assert len(expand_curve(data["models"][0])["loss"]) == len(model["loss"])
    a = compare(full, str(tmp_path / "out_full"), positions=(8, 32))
    b = compare(slim, str(tmp_path / "out_slim"), positions=(8, 32))
    def flat(x, key=""):
        if isinstance(x, dict):
            return {k2: v for k, v in x.items() for k2, v in flat(v, f"{key}.{k}").items()}
        if isinstance(x, list):
            return {k2: v for i, v in enumerate(x) for k2, v in flat(v, f"{key}[{i}]").items()}
        return {key: x}
    for key in ("rows", "differences"):
        fa, fb = flat(a[key]), flat(b[key])
        assert fa.keys() == fb.keys()
        assert all(fa[k] == pytest.approx(fb[k], rel=0, abs=1e-12) if isinstance(fa[k], float) else fa[k] == fb[k]
                   for k in fa)
    xa, ya = _binned_mean(load_curves(full[:2]))
    xb, yb = _binned_mean(load_curves(slim[:2]))
    assert np.array_equal(xa, xb) and np.allclose(ya, yb, rtol=0, atol=1e-12)

    # at 16K positions (a 16K-token evaluation) an entry's per-position arrays shrink ~140-fold
    big = {k: list(np.linspace(3, 4, 16383)) for k in ("positions", "loss", "smoothed", "smoothed_lo", "smoothed_hi")}
    assert len(json.dumps(slim_curve(big))) * 100 < len(json.dumps(big))


def _configured_run(tmp_path, folder, preset, seed, offset=0.0):
    """A run named "model" (its folder's name) with the config.yaml training saves."""
    import yaml

    run = _seed_run(tmp_path / folder, "model", offset, seed)
    with open(os.path.join(run, "config.yaml"), "w") as f:
        yaml.safe_dump({"preset": preset, "model": {}, "seed": seed}, f)
    return run


@pytest.mark.parametrize("case", ["other-model", "same-seed", "same-run"])
def test_runs_that_are_not_seeds_of_one_model_are_not_pooled(tmp_path, case):
    """Two experiments' folders both named "model" (a FoX and a Transformer) were averaged as two seeds; a run
    given twice read as two seeds with a spread of 0."""
    a = _configured_run(tmp_path, "expA", "fox-pro-tiny", 0)
    if case == "same-run":
        b = a
    else:
        b = _configured_run(tmp_path, "expB", "transformer-pro-tiny" if case == "other-model" else "fox-pro-tiny",
                            0 if case == "same-seed" else 1, offset=0.1)
    said = {"other-model": "train different models", "same-seed": "share a seed",
            "same-run": f"^{re.escape(a)} is given more than once: 'model' would pool it as several seeds; give each "
                        f"run once$"}[case]
    with pytest.raises(ValueError, match=said):
        compare([a, b], str(tmp_path / "out"))
    if case != "same-run":  # named apart, they compare as two models
        res = compare([a, b], str(tmp_path / "out"), names=["A", "B"])
        assert [r["model"] for r in res["rows"]] == ["A", "B"]


@pytest.mark.parametrize("second", ["eval", "eval/loss.json"], ids=["its-eval-folder", "its-loss-json"])
def test_a_run_folder_and_its_own_evaluation_given_again_are_not_pooled_as_two_seeds(tmp_path, second):
    """`compare runs/x runs/x/eval` read x's eval/loss.json twice: two seeds of x with a spread of 0."""
    a = _configured_run(tmp_path, "expA", "fox-pro-tiny", 0)
    again = os.path.join(a, second)
    said = (f"{a} and {again} read one loss.json, {os.path.join(a, 'eval', 'loss.json')}: 'model' would pool it as "
            f"several seeds; give each run once")
    with pytest.raises(ValueError, match=f"^{re.escape(said)}$"):
        compare([a, again], str(tmp_path / "out"))


def test_a_run_folder_holding_another_models_evaluation_is_refused(tmp_path):
    a = _configured_run(tmp_path, "expA", "fox-pro-tiny", 0)
    other = tmp_path / "other_model"
    other.mkdir()
    loss = os.path.join(a, "eval", "loss.json")
    data = json.load(open(loss))
    data["settings"]["models"] = [str(other)]
    json.dump(data, open(loss, "w"))
    said = f"^{re.escape(a)}: its loss.json holds the evaluation of .*other_model, not of this run"
    with pytest.raises(ValueError, match=said):
        compare([a, _seed_run(tmp_path, "b", 0.1, 1)], str(tmp_path / "out"))


def test_one_sequence_gives_no_interval_rather_than_a_zero_width_one(tmp_path):
    from foxformer.eval.loss import loss_curve

    runs = []
    for name, level in (("a", 3.0), ("b", 3.5)):
        rows = np.full((1, 63), level) + np.random.default_rng(0).normal(0, 0.01, size=(1, 63))
        save_loss_unplotted([loss_curve(rows, name=name, train_len=16, n_boot=20)], str(tmp_path / name / "eval"),
                            {"data": "d", "split": "val", "seq_len": 64, "num_seqs": 1})
        runs.append(str(tmp_path / name))
    res = compare(runs, str(tmp_path / "out"), positions=(8,))
    d = res["differences"][0]["mean_loss"]
    assert d["mean"] == pytest.approx(-0.5, abs=0.01) and d["lo"] is None and d["hi"] is None
    md = (tmp_path / "out" / "compare.md").read_text()
    assert "[no interval: 1 sequence]" in md and "**" not in md.split("Difference")[1]


def test_a_needle_run_without_generation_removes_the_earlier_generation_heatmap(tmp_path):
    """`eval niah --no-generate` into a folder of an earlier NIAH kept its niah_heatmap.png (other models,
    other lengths) beside the new niah.json."""
    from foxformer.eval.niah import NiahResult
    from foxformer.eval.outputs import save_niah

    records = [{"length": 32, "depth": 0.0, "mode": "standard", "needle": 0, "seed": 0, "value": "1",
                "answer_logprob": -1.0, "ll_correct": True, "found": True}]
    result = NiahResult(name="a", lengths=[32], depths=[0.0], modes=["standard"], train_len=32, records=records)
    save_niah([result], str(tmp_path))
    assert (tmp_path / "niah_heatmap.png").exists()
    result.generate = False
    assert save_niah([result], str(tmp_path))["plots"] == ["niah_ll_heatmap.png"]
    assert not (tmp_path / "niah_heatmap.png").exists()


def test_the_summary_names_the_folder_it_wrote_as_the_other_eval_commands_do(tmp_path, capsys, monkeypatch):
    """It listed the plots by name alone, and the default runs/compare went unsaid."""
    a = _write_run(tmp_path, "a", np.ones(63))
    monkeypatch.chdir(tmp_path)
    assert main(["eval", "compare", a]) == 0
    out = capsys.readouterr().out
    summary = json.loads(out[out.index("\n{\n") + 1:])  # the table, then the summary
    assert summary["out"] == os.path.join("runs", "compare")
    assert all((tmp_path / "runs" / "compare" / plot).exists() for plot in summary["plots"])
