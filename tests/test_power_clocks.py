"""scripts/power_clocks.py: each phase's clock and power from nvidia-smi's samples, its busy samples only."""
import datetime
import json

import pytest


@pytest.fixture(scope="module")
def script(load_script):
    return load_script("power_clocks")


def _stamp(t: float) -> str:
    return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).strftime("%Y/%m/%d %H:%M:%S.%f")[:-3]


def test_each_phase_keeps_its_busy_samples_only(script, tmp_path, monkeypatch, capsys):
    t0 = 1_800_000_000.0
    lines = ["timestamp, clocks.current.sm [MHz], power.draw [W], temperature.gpu"]
    # phase a: compiling (120 W at 1980 MHz), then steps at 1800-1900 MHz; phase b: steps at 1600-1700; a sample
    # between the phases and a cut last line belong to neither
    lines += [f"{_stamp(t0 + i * 0.1)}, 1980, 120.0, 40" for i in range(5)]
    lines += [f"{_stamp(t0 + 0.5 + i * 0.1)}, {1800 + 50 * i}, {680.0 + i}, 60" for i in range(3)]
    lines += [f"{_stamp(t0 + 1.05)}, 1200, 690.0, 61"]
    lines += [f"{_stamp(t0 + 1.2 + i * 0.1)}, {1600 + 50 * i}, 690.0, 62" for i in range(3)]
    lines += ["2026/12/08 00:00:0"]
    (tmp_path / "smi.csv").write_text("\n".join(lines) + "\n")
    (tmp_path / "phases.txt").write_text(f"a start {t0}\na end {t0 + 1.0}\nb start {t0 + 1.1}\nb end {t0 + 2.0}\n")
    out = tmp_path / "power.json"
    monkeypatch.setattr("sys.argv", ["power_clocks.py", str(tmp_path / "smi.csv"), str(tmp_path / "phases.txt"),
                                     "--json", str(out)])
    assert script.main() == 0
    got = json.loads(out.read_text())["phases"]
    assert got["a"]["samples"] == 3 and got["a"]["mhz_median"] == 1850 and got["a"]["mhz_min"] == 1800
    assert got["a"]["watts_max"] == 682.0 and got["a"]["celsius_max"] == 60
    assert got["b"]["samples"] == 3 and got["b"]["mhz_median"] == 1650 and got["b"]["celsius_max"] == 62
    assert "a | 3 | " in capsys.readouterr().out
