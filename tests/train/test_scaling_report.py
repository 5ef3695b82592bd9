"""`foxformer bench scaling`: step-by-step loss comparison and scaling efficiency of training runs."""
import json

import pytest

from foxformer.bench import scaling
from foxformer.cli import main
from foxformer.train.loop import train


def test_regrouped_batches_match_and_report_efficiency(make_cfg, tmp_path):
    """Same token batches, different micro-batching: the losses agree and the report says so."""
    ref = train(make_cfg(out_dir=str(tmp_path / "mb1"), micro_batch_size=1, max_steps=4))
    other = train(make_cfg(out_dir=str(tmp_path / "mb2"), micro_batch_size=2, max_steps=4))
    out = tmp_path / "scaling.json"
    assert main(["bench", "scaling", ref["out_dir"], other["out_dir"], "--skip", "1", "--out", str(out),
                 "--strict"]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["accum"] for r in rows] == [4, 2]
    assert rows[0]["max_dloss"] == 0.0 and rows[0]["efficiency"] == pytest.approx(1.0)
    assert rows[1]["steps"] == 4 and rows[1]["max_dloss"] < 1e-4 and rows[1]["loss_match"]


def _start(world, step=0):
    return {"kind": "start", "step": step, "world_size": world, "parallel": "fsdp" if world > 1 else "none",
            "grad_accum": 1, "micro_batch_size": 1}


def _fake_run(path, world, losses, tps, resumed_on=None):
    """A run's folder; resumed_on: the world size it was resumed on after its first half."""
    path.mkdir()
    recs = [_start(world)]
    for i, l in enumerate(losses):
        if resumed_on is not None and i == len(losses) // 2:
            recs.append(_start(resumed_on, step=i))
        recs.append({"kind": "train", "step": i + 1, "loss": l, "tokens_per_s": tps, "mfu": None})
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    return str(path)


def test_efficiency_is_per_gpu_and_mismatch_is_flagged(tmp_path):
    ref = scaling.summarize(_fake_run(tmp_path / "one", 1, [5.0, 4.0, 3.0], 100.0), skip=0)
    two = scaling.summarize(_fake_run(tmp_path / "two", 2, [5.0, 4.1, 3.0], 180.0), skip=0)
    rows = scaling.compare([ref, two], tolerance=0.02)
    assert rows[1]["tok_s_per_gpu"] == 90.0 and rows[1]["efficiency"] == pytest.approx(0.9)
    assert rows[1]["max_dloss"] == pytest.approx(0.1) and rows[1]["max_rel"] == pytest.approx(0.025)
    assert not rows[1]["loss_match"] and scaling.compare([ref, two], tolerance=0.03)[1]["loss_match"]
    assert main(["bench", "scaling", ref["run"], two["run"], "--tolerance", "0.02", "--strict"]) == 1


def test_run_without_training_records_is_an_error(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no training records"):
        scaling.summarize(str(tmp_path / "empty"), skip=0)


@pytest.mark.parametrize("change", [dict(context=16, batch_tokens=64), dict(seed=1), dict(preset="fox-llama-tiny"),
                                    dict(batch_tokens=256)],
                         ids=["other-context", "other-seed", "other-preset", "other-batch-tokens"])
def test_runs_of_another_setup_are_flagged_not_compared_silently(make_cfg, tmp_path, capsys, change):
    """A run with another context, seed, model or batch is no scaling measurement of the reference: the report
    names what differs and --strict fails, even where the losses happen to be close."""
    ref = train(make_cfg(out_dir=str(tmp_path / "ref"), max_steps=2))
    other = train(make_cfg(out_dir=str(tmp_path / "other"), max_steps=2, **change))
    out = tmp_path / "scaling.json"
    rc = main(["bench", "scaling", ref["out_dir"], other["out_dir"], "--skip", "0", "--tolerance", "1",
               "--out", str(out), "--strict"])
    rows = json.loads(out.read_text())["rows"]
    assert rows[0]["differs"] is None
    for key in change:
        assert key in rows[1]["differs"]
    text = capsys.readouterr().out
    assert "not comparable" in text and rc == 1


@pytest.mark.parametrize("bad", [["{missing}"], ["{empty}"], ["{ref}", "--tolerance", "-0.01"],
                                 ["{ref}", "--tolerance", "nan"]],
                         ids=["missing-folder", "folder-without-metrics", "tolerance-negative", "tolerance-nan"])
def test_bad_input_is_an_error_exit_2(tmp_path, capsys, bad):
    (tmp_path / "empty").mkdir()
    ref = _fake_run(tmp_path / "ref", 1, [5.0, 4.0], 100.0)
    names = {"missing": str(tmp_path / "missing"), "empty": str(tmp_path / "empty"), "ref": ref}
    assert main(["bench", "scaling", ref, *(a.format(**names) for a in bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and "Traceback" not in err


def test_a_negative_skip_is_refused_as_it_is_parsed(tmp_path, capsys):
    """It said "--skip must be >= 0" once parsed, where bench decode's counts say "argument --warmup: expected a
    non-negative integer"."""
    ref = _fake_run(tmp_path / "ref", 1, [5.0, 4.0], 100.0)
    with pytest.raises(SystemExit) as exit_:
        main(["bench", "scaling", ref, "--skip", "-1"])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == ("foxformer bench scaling: error: argument --skip: expected a "
                                                         "non-negative integer, got '-1'")


def test_a_run_resumed_on_another_world_size_has_no_efficiency(tmp_path, capsys):
    """A run resumed on 4 GPUs after 2 got an 'efficiency' from its first world size and a throughput median over
    both segments: a number that measures neither. Its losses still compare (the data order is the step's)."""
    ref = _fake_run(tmp_path / "one", 1, [5.0, 4.0, 3.0, 2.0], 100.0)
    mixed = _fake_run(tmp_path / "two-then-four", 2, [5.0, 4.0, 3.0, 2.0], 180.0, resumed_on=4)
    rows = scaling.compare([scaling.summarize(d, skip=0) for d in (ref, mixed)], tolerance=0.01)
    assert rows[0]["efficiency"] == pytest.approx(1.0) and rows[0]["note"] is None
    assert rows[1]["segments"] == "2,4" and rows[1]["efficiency"] is None and rows[1]["tok_s_per_gpu"] is None
    assert "world size changed" in rows[1]["note"] and rows[1]["loss_match"]
    assert main(["bench", "scaling", ref, mixed, "--skip", "0", "--strict"]) == 0
    assert "two-then-four: world size changed" in capsys.readouterr().out


def test_a_reference_resumed_on_another_world_size_gives_no_efficiency_at_all(tmp_path):
    """Every efficiency divides by the reference's tokens/s per GPU, which a mixed reference does not have."""
    ref = _fake_run(tmp_path / "one-then-two", 1, [5.0, 4.0, 3.0, 2.0], 100.0, resumed_on=2)
    two = _fake_run(tmp_path / "two", 2, [5.0, 4.0, 3.0, 2.0], 180.0)
    rows = scaling.compare([scaling.summarize(d, skip=0) for d in (ref, two)], tolerance=0.01)
    assert [r["efficiency"] for r in rows] == [None, None]
    assert rows[1]["tok_s_per_gpu"] == 90.0 and "reference" in rows[1]["note"]
