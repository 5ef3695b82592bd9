"""scripts/step_breakdown.py on the committed FoX (Pro) table: the figures docs/benchmarks.md gives for it."""
from pathlib import Path

import pytest

TABLE = Path(__file__).resolve().parents[2] / "docs/bench/profile_model_joint_b4e0df1_h100/fox-pro-125m.txt"


def test_categories_match_the_published_split_and_sum_to_the_table_total(load_script):
    r = load_script("step_breakdown").parse(str(TABLE))
    # Operator rows (foxformer::forgetting_attention_bwd: 127.5 ms) would double the attention if counted.
    assert r["attention fwd"] + r["attention bwd"] == pytest.approx(174.2, abs=0.1)
    assert r["Pro ops"] == pytest.approx(12.2, abs=0.1)
    assert r["total"] == pytest.approx(301.181)
    assert sum(v for k, v in r.items() if k != "total") == pytest.approx(r["total"])
