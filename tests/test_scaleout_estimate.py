"""scripts/scaleout_estimate.py: the formulas docs/architecture.md writes out, checked on one row by hand."""
import pytest

from foxformer.models import get_preset
from foxformer.models.presets import count_embedding, count_non_embedding


@pytest.fixture(scope="module")
def script(load_script):
    return load_script("scaleout_estimate")


def test_fsdp2_bytes_and_overlap_follow_the_written_formulas(script):
    cfg = get_preset("fox-pro-760m", vocab_size=50304)
    n = count_non_embedding(cfg) + count_embedding(cfg)
    row = script.estimate("fox-pro-760m", 32768.0, 8)  # 8 micro-batches of one 16K sequence, 0.5 s each
    assert row["compute_s"] == pytest.approx(4.0)
    assert row["bytes_per_gpu"] == pytest.approx((8 * 2 * 2 * n + 4 * n) * 7 / 8)
    assert row["comm_s"] == pytest.approx(row["bytes_per_gpu"] / 450e9)
    assert row["step_s"] == pytest.approx(4.0 + row["comm_s"] / 24)
    far = script.estimate("fox-pro-760m", 32768.0, 64)  # 8 nodes: InfiniBand, one micro-batch
    assert far["link"] == "InfiniBand" and far["micro_batches"] == 1
    assert far["bytes_per_gpu"] == pytest.approx((2 * 2 * n + 4 * n) * 63 / 64)


def test_the_script_prints_the_four_rows_of_the_doc(script, capsys, monkeypatch):
    monkeypatch.setattr("sys.argv", ["scaleout_estimate.py"])
    script.main()
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| fox-pro")]
    assert [r.split(" | ")[:2] for r in rows] == [["| fox-pro-760m", "8"], ["| fox-pro-760m", "64"],
                                                  ["| fox-pro-1.3b", "8"], ["| fox-pro-1.3b", "64"]]
