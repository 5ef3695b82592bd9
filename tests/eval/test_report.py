"""`foxformer report` finds every command's output in a run folder: eviction and bias-shift included."""
import json
import os

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
    assert "eviction.json, bias_shift.json" in page


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
