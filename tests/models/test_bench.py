"""`foxformer bench-model` runs on CPU at tiny size and writes its JSON."""
import json

from foxformer.bench.model import main


def test_bench_model_tiny_cpu(tmp_path, capsys):
    out = tmp_path / "bench.json"
    rc = main(["--presets", "fox-pro-tiny,transformer-llama-tiny", "--context", "32", "--tokens-per-step", "64",
               "--steps", "1", "--warmup", "0", "--dtype", "fp32", "--vocab-size", "97", "--device", "cpu",
               "--backend", "torch", "--out", str(out)])
    assert rc == 0
    payload = json.loads(out.read_text())
    names = [r["name"] for r in payload["results"]]
    assert names == ["fox-pro-tiny", "transformer-llama-tiny", "hf-llama-sdpa-tiny"]
    for r in payload["results"]:
        assert r["tokens_per_s"] > 0 and r["batch"] == 2 and r["non_embedding_params"] > 0
    assert "tokens_per_s" in capsys.readouterr().out


def test_bench_model_profile_writes_operator_table(tmp_path):
    prof = tmp_path / "prof"
    rc = main(["--presets", "fox-pro-tiny", "--context", "32", "--tokens-per-step", "64", "--steps", "1",
               "--warmup", "0", "--dtype", "fp32", "--vocab-size", "97", "--device", "cpu", "--backend", "torch",
               "--no-anchor", "--profile", str(prof), "--out", str(tmp_path / "bench.json")])
    assert rc == 0
    table = (prof / "fox-pro-tiny.txt").read_text()
    assert "Self CPU" in table and "aten::" in table
