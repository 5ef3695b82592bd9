"""`foxformer bench-model` runs on CPU at tiny size and writes its JSON."""
import json

import pytest

from foxformer.bench.model import main


def test_bench_model_tiny_cpu(tmp_path, capsys):
    out = tmp_path / "bench.json"
    rc = main(["--presets", "fox-pro-tiny,transformer-llama-tiny", "--context", "32", "--tokens-per-step", "64",
               "--steps", "1", "--warmup", "0", "--dtype", "fp32", "--vocab-size", "97", "--device", "cpu",
               "--backend", "torch", "--out", str(out)])
    assert rc == 0
    payload = json.loads(out.read_text())
    assert payload["complete"] is True
    names = [r["name"] for r in payload["results"]]
    assert names == ["fox-pro-tiny", "transformer-llama-tiny", "hf-llama-sdpa-tiny"]
    for r in payload["results"]:
        assert r["tokens_per_s"] > 0 and r["batch"] == 2 and r["non_embedding_params"] > 0
    assert "tokens_per_s" in capsys.readouterr().out


def test_bench_model_no_progress_draws_no_bar(tmp_path, capsys):
    rc = main(["--presets", "fox-pro-tiny", "--context", "32", "--tokens-per-step", "64", "--steps", "1",
               "--warmup", "0", "--dtype", "fp32", "--vocab-size", "97", "--device", "cpu", "--backend", "torch",
               "--no-anchor", "--no-progress", "--out", str(tmp_path / "b.json")])
    assert rc == 0
    assert "fox-pro-tiny:" not in capsys.readouterr().err


def test_bench_model_profile_writes_operator_table(tmp_path):
    prof = tmp_path / "prof"
    rc = main(["--presets", "fox-pro-tiny", "--context", "32", "--tokens-per-step", "64", "--steps", "1",
               "--warmup", "0", "--dtype", "fp32", "--vocab-size", "97", "--device", "cpu", "--backend", "torch",
               "--no-anchor", "--profile", str(prof), "--out", str(tmp_path / "bench.json")])
    assert rc == 0
    table = (prof / "fox-pro-tiny.txt").read_text()
    assert "Self CPU" in table and "aten::" in table
    assert (prof / "fox-pro-tiny.trace.json.gz").stat().st_size > 0


TINY = ["--context", "32", "--tokens-per-step", "64", "--steps", "1", "--warmup", "0", "--dtype", "fp32",
        "--vocab-size", "97", "--device", "cpu", "--backend", "torch", "--no-anchor"]
BAD = {
    "unknown-preset-after-a-good-one": ["--presets", "fox-pro-tiny,bogus"],
    "tokens-not-a-multiple": ["--tokens-per-step", "48"],
    "backend-unknown": ["--backend", "bogus"],
    "device-unknown": ["--device", "nodevice"],
    "peak-flops-zero": ["--peak-flops", "0"],
    "override-unknown-key": ["--presets", "fox-pro-tiny:head_dims=32"],
    "override-not-key-value": ["--presets", "fox-pro-tiny:head_dim"],
    "override-not-dividing": ["--presets", "fox-pro-tiny:head_dim=48"],
    "row-named-twice": ["--presets", "fox-pro-tiny,fox-pro-tiny"],
    "override-not-a-number": ["--presets", "fox-pro-tiny:head_dim=abc"],
}


@pytest.mark.parametrize("bad", list(BAD.values()), ids=list(BAD))
def test_bad_value_is_an_error_before_anything_runs(bad, tmp_path, capsys):
    """Refused with 'error: ...' and exit 2 before any model is measured, not a traceback half-way."""
    rc = main(TINY + ["--presets", "fox-pro-tiny", "--out", str(tmp_path / "bench.json")] + bad)
    out, err = capsys.readouterr()
    assert rc == 2 and err.startswith("error:") and "tokens_per_s" not in out
    assert not (tmp_path / "bench.json").exists()


def test_unknown_preset_is_named_not_the_anchor_built_from_it(tmp_path, capsys):
    argv = [a for a in TINY if a != "--no-anchor"]
    assert main(argv + ["--presets", "bogus", "--out", str(tmp_path / "bench.json")]) == 2
    err = capsys.readouterr().err
    assert "'bogus'" in err and "transformer-llama-bogus" not in err


def test_json_goes_into_a_folder_that_does_not_exist_yet(tmp_path):
    """The results were measured, then lost to FileNotFoundError at the very end."""
    out = tmp_path / "results" / "bench.json"
    assert main(TINY + ["--presets", "fox-pro-tiny", "--out", str(out)]) == 0
    assert [r["name"] for r in json.loads(out.read_text())["results"]] == ["fox-pro-tiny"]


def test_json_holds_every_measured_row_while_later_ones_run(tmp_path, monkeypatch):
    """The JSON was written only after the last model: a run cut by a time limit lost every measured row."""
    import foxformer.bench.model as bench_model

    out = tmp_path / "bench.json"
    seen = []
    real_measure = bench_model.measure

    def measure_then_cut(*args, **kwargs):
        seen.append(json.loads(out.read_text())["results"] if out.exists() else None)
        if len(seen) == 2:
            raise KeyboardInterrupt  # the time limit
        return real_measure(*args, **kwargs)

    monkeypatch.setattr(bench_model, "measure", measure_then_cut)
    with pytest.raises(KeyboardInterrupt):
        main(TINY + ["--presets", "fox-pro-tiny,fox-llama-tiny", "--out", str(out)])
    assert seen[0] is None
    assert [r["name"] for r in seen[1]] == ["fox-pro-tiny"]
    cut = json.loads(out.read_text())
    assert [r["name"] for r in cut["results"]] == ["fox-pro-tiny"] and cut["complete"] is False
    assert [p.name for p in tmp_path.iterdir()] == ["bench.json"]  # no temp file left behind


def test_rows_carry_mfu_against_the_device_peak(tmp_path):
    """Rows had model TFLOP/s but no MFU. On CPU there is no known peak (None, as in the training logs);
    --peak-flops gives one."""
    out = tmp_path / "bench.json"
    assert main(TINY + ["--presets", "fox-pro-tiny", "--out", str(out)]) == 0
    assert json.loads(out.read_text())["results"][0]["mfu"] is None
    assert main(TINY + ["--presets", "fox-pro-tiny", "--peak-flops", "1e9", "--out", str(out)]) == 0
    row = json.loads(out.read_text())["results"][0]
    assert row["mfu"] == pytest.approx(row["model_tflops"] * 1e12 / 1e9)


@pytest.mark.parametrize("device_name, dtype, tf32, want", [
    pytest.param("NVIDIA H200", "bf16", False, ("bf16", 989e12), id="h200-bf16"),
    pytest.param("NVIDIA H200", "fp16", False, ("fp16", 989e12), id="h200-fp16"),
    pytest.param("NVIDIA H100 80GB HBM3", "fp32", True, ("tf32", 494.5e12), id="h100-fp32-with-tf32"),
    pytest.param("NVIDIA H100 80GB HBM3", "fp32", False, ("fp32", 67e12), id="h100-fp32-without-tf32"),
    pytest.param("NVIDIA A100-SXM4-80GB", "fp32", False, ("fp32", 19.5e12), id="a100-fp32"),
    pytest.param("NVIDIA A10", "fp16", False, ("fp16", 125e12), id="a10-is-not-a100"),
])
def test_mfu_peak_follows_the_dtype(device_name, dtype, tf32, want):
    """MFU was measured against the bf16 peak (989 TFLOP/s on H200) whatever --dtype ran: fp32 without TF32
    reported an MFU ~15x too low."""
    from foxformer.bench.model import mfu_peak

    peak, kind, note = mfu_peak(device_name, dtype, tf32=tf32)
    assert (kind, peak) == want and note is None


@pytest.mark.parametrize("device_name, dtype", [
    pytest.param("NVIDIA B200", "fp32", id="known-gpu-unknown-dtype"),
    pytest.param("Some Future GPU", "bf16", id="unknown-gpu"),
])
def test_mfu_is_null_with_a_note_where_the_peak_is_unknown(device_name, dtype):
    from foxformer.bench.model import mfu_peak

    peak, kind, note = mfu_peak(device_name, dtype, tf32=False)
    assert peak is None and kind == dtype
    assert device_name in note and dtype in note and "--peak-flops" in note
    assert mfu_peak(device_name, dtype, override=1e15, tf32=False) == (1e15, dtype, None)


def test_json_says_which_peak_the_mfu_is_against(tmp_path):
    out = tmp_path / "bench.json"
    assert main(TINY + ["--presets", "fox-pro-tiny", "--out", str(out)]) == 0
    payload = json.loads(out.read_text())
    assert payload["peak_flops"] is None and payload["peak_dtype"] == "fp32" and "cpu" in payload["mfu_note"]
    assert payload["results"][0]["mfu"] is None


def test_a_preset_row_takes_overrides_of_its_own(tmp_path):
    """`--presets fox-pro-tiny,fox-pro-tiny:head_dim=32` times the preset beside a variant of it (the head dim
    the Transformer presets use), each row naming its overrides; profile files get names without the colon."""
    out, prof = tmp_path / "bench.json", tmp_path / "prof"
    assert main(TINY + ["--presets", "fox-pro-tiny,fox-pro-tiny:head_dim=32", "--profile", str(prof),
                        "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["results"]
    assert [(r["name"], r["preset"], r["overrides"]) for r in rows] == [
        ("fox-pro-tiny", "fox-pro-tiny", {}), ("fox-pro-tiny:head_dim=32", "fox-pro-tiny", {"head_dim": 32})]
    assert rows[0]["non_embedding_params"] != rows[1]["non_embedding_params"]  # per-head weights: 4 heads, then 2
    assert (prof / "fox-pro-tiny_head_dim_32.txt").exists()


def test_a_row_override_wins_over_the_shared_option(tmp_path):
    """`:vocab_size=50` on a row beside --vocab-size 97: the row's own value, not a TypeError for the key given
    twice."""
    out = tmp_path / "bench.json"
    assert main(TINY + ["--presets", "fox-pro-tiny:vocab_size=50", "--out", str(out)]) == 0
    row = json.loads(out.read_text())["results"][0]
    assert row["overrides"] == {"vocab_size": 50}


def test_several_gluon_forward_settings_time_one_model_in_turn(tmp_path, monkeypatch):
    """`--gluon-fwd default --gluon-fwd 64:max_free=true --rounds 2`: each FoX row is built (and compiled) once and
    timed under the settings in turn, round after round, each setting in force while it is timed; rows without
    Forgetting Attention get one row; the configs are restored after; a bad setting stops the run first."""
    from foxformer.ops.forgetting_attn.hopper import compat

    if not compat.AVAILABLE:
        pytest.skip("no Gluon")
    import foxformer.bench.model as bench_model
    from foxformer.ops.forgetting_attn.hopper import launch as L

    before, calls, builds = dict(L.FWD_CONFIGS), [], []
    real_measure, real_build = bench_model.measure, bench_model.FoxForCausalLM

    def measure(model, *args, **kwargs):
        calls.append((args[7], L.FWD_CONFIGS[64].max_free))  # desc, the setting in force
        return real_measure(model, *args, **kwargs)

    monkeypatch.setattr(bench_model, "measure", measure)
    monkeypatch.setattr(bench_model, "FoxForCausalLM", lambda cfg: builds.append(cfg.attention) or real_build(cfg))
    monkeypatch.setattr(bench_model, "gluon_runs_on", lambda device: True)  # the settings' turns, timed on a CPU
    out = tmp_path / "bench.json"
    assert main(TINY + ["--presets", "fox-pro-tiny,transformer-pro-tiny", "--gluon-fwd", "default", "--gluon-fwd",
                        "64:max_free=true", "--rounds", "2", "--out", str(out)]) == 0
    fox, fox_max_free = "fox-pro-tiny [default]", "fox-pro-tiny [64:max_free=True]"
    assert calls == [(fox, False), (fox_max_free, True), (fox, False), (fox_max_free, True),
                     ("transformer-pro-tiny", False), ("transformer-pro-tiny", False)]
    assert builds == ["forgetting", "softmax"] and L.FWD_CONFIGS == before
    payload = json.loads(out.read_text())
    rows = payload["results"]
    assert [(r["name"], r["gluon_fwd"], r["rounds"]) for r in rows] == [
        (fox, "default", 2), (fox_max_free, "64:max_free=True", 2), ("transformer-pro-tiny", "default", 2)]
    assert payload["gluon_fwd"] == ["default", "64:max_free=True"]
    calls.clear()
    assert main(TINY + ["--presets", "fox-pro-tiny", "--gluon-fwd", "default", "--gluon-fwd", "64:max_freee=true",
                        "--out", str(tmp_path / "bad.json")]) == 2
    assert calls == [] and not (tmp_path / "bad.json").exists()


def test_a_cut_run_keeps_the_rounds_it_finished(tmp_path, monkeypatch):
    """Several rounds of one model: its rows are written after each round, so a time limit in round 2 leaves the
    first round's rows (rounds 1) in the JSON, not nothing."""
    import foxformer.bench.model as bench_model

    out, calls = tmp_path / "bench.json", []
    real_measure = bench_model.measure

    def measure_then_cut(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real_measure(*args, **kwargs)

    monkeypatch.setattr(bench_model, "measure", measure_then_cut)
    with pytest.raises(KeyboardInterrupt):
        main(TINY + ["--presets", "fox-pro-tiny", "--rounds", "3", "--out", str(out)])
    cut = json.loads(out.read_text())
    assert [(r["name"], r["rounds"]) for r in cut["results"]] == [("fox-pro-tiny", 1)] and cut["complete"] is False
