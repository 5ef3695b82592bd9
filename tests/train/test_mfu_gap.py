"""scripts/train_mfu_gap.py compares the training loop's MFU with `foxformer bench model`'s (issue 17: within 2
points on the H200). The comparison means something only if both count the same FLOPs a token against the same
peak: a tiny CPU run with a given peak checks that, and the script's reading of both files."""
import json
import os

import pytest

from foxformer.models import get_preset, training_flops_per_token
from foxformer.train.loop import train

PEAK = 1e12


@pytest.fixture(scope="module")
def gap_script(load_script):
    return load_script("train_mfu_gap")


def test_the_loop_counts_the_bench_flops_and_the_script_reads_both(make_cfg, gap_script, tmp_path, capsys,
                                                                    monkeypatch):
    cfg = make_cfg(peak_flops=PEAK, max_steps=6)
    train(cfg)
    metrics = os.path.join(cfg.out_dir, "metrics.jsonl")
    recs = [json.loads(line) for line in open(metrics)]
    start = recs[0]
    model_cfg = get_preset(cfg.preset, vocab_size=start["vocab_size"])
    assert start["flops_per_token"] == pytest.approx(training_flops_per_token(model_cfg, cfg.context), rel=1e-12)
    steps = [r for r in recs if r["kind"] == "train"]
    for r in steps:
        assert r["mfu"] == pytest.approx(r["tokens_per_s"] * start["flops_per_token"] / PEAK, rel=1e-9)

    steady = sorted(r["mfu"] for r in steps if r["step"] > 3)
    bench_mfu = steady[1] + 0.015  # the median of steps 4-6, 1.5 points below the bench
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps({"results": [{"preset": "transformer-llama-tiny", "mfu": 0.9},
                                             {"preset": cfg.preset, "mfu": bench_mfu}]}))
    monkeypatch.setattr("sys.argv", ["train_mfu_gap", metrics, str(bench), "--preset", cfg.preset])
    gap_script.main()
    out = capsys.readouterr().out
    assert "median of 3 steps" in out and "gap +1.5 points, within 2" in out

    monkeypatch.setattr("sys.argv", ["train_mfu_gap", metrics, str(bench), "--preset", cfg.preset, "--points", "1"])
    gap_script.main()
    assert "outside 1" in capsys.readouterr().out
    monkeypatch.setattr("sys.argv", ["train_mfu_gap", metrics, str(bench), "--preset", "fox-llama-tiny"])
    with pytest.raises(SystemExit, match="no row with an MFU for fox-llama-tiny"):
        gap_script.main()
