"""`foxformer bench attention`: bad values are refused while parsing ('error: ...', exit 2), on any machine; the CPU
run's defaults and rows."""
import io
import json

import pytest

from foxformer.bench.cli import PROVIDERS, attention_defaults
from foxformer.cli import build_parser, main
from tests.bars import BARS_BY_PLACE, Terminal

BAD = {
    "gqa-hq-not-multiple-of-hkv": ["--configs", "64x24x5"],
    "config-four-parts": ["--configs", "64x24x2x1"],
    "config-one-part": ["--configs", "64"],
    "config-not-a-number": ["--configs", "64xabc"],
    "config-zero-heads": ["--configs", "64x0"],
    "seqlen-zero": ["--seqlens", "0"],
    "seqlen-negative": ["--seqlens", "2048,-8"],
    "seqlen-empty-entry": ["--seqlens", "2048,,4096"],
    "provider-unknown": ["--providers", "foxformer,bogus"],
    "tokens-zero": ["--tokens", "0"],
    "prune-eps-one": ["--prune", "--prune-eps", "1"],
    "qk-bound-negative": ["--qk-bound", "-1"],
    "qk-bound-nan": ["--qk-bound", "nan"],
    "rounds-zero": ["--rounds", "0"],
    "provider-twice": ["--providers", "sdpa,foxformer,sdpa"],
    "seqlen-twice": ["--seqlens", "64,64"],
    "config-twice-spelled-two-ways": ["--configs", "64x24,64x24x24"],
}


@pytest.mark.parametrize("argv", list(BAD.values()), ids=list(BAD))
def test_bad_value_is_an_error_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as e:
        main(["bench", "attention", *argv, "--out", "/nonexistent/never.json"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "error:" in err and "Traceback" not in err


def test_values_parse_into_shapes():
    args = build_parser().parse_args(["bench", "attention", "--configs", "64x24,128x12x2", "--seqlens", "16, 32",
                                      "--providers", "foxformer,sdpa_flash", "--qk-bound", "25"])
    assert args.configs == [(64, 24, 24), (128, 12, 2)] and args.seqlens == [16, 32]
    assert args.providers == ["foxformer", "sdpa_flash"] and args.qk_bound == 25.0
    defaults = attention_defaults(build_parser().parse_args(["bench", "attention", "--device", "cuda"]))
    assert defaults.configs == [(64, 24, 24), (128, 12, 12), (128, 12, 2)] and defaults.qk_bound is None
    assert defaults.providers == list(PROVIDERS) and defaults.tokens == 32768 and defaults.prune_eps is None
    pruned = attention_defaults(build_parser().parse_args(["bench", "attention", "--device", "cuda", "--prune"]))
    assert pruned.qk_bound == "auto" and pruned.prune_eps == 1e-3


def test_a_cpu_run_defaults_to_what_a_cpu_times_in_seconds():
    args = attention_defaults(build_parser().parse_args(["bench", "attention", "--device", "cpu", "--tokens", "256"]))
    assert args.providers == ["foxformer", "sdpa"] and args.seqlens == [512, 2048] and args.tokens == 256


def test_a_cpu_run_times_the_torch_backend_against_sdpa(tmp_path, capsys):
    """`--device cpu`: both CPU paths timed in float32, a table printed and the rows written as JSON."""
    out = tmp_path / "cpu.json"
    assert main(["bench", "attention", "--device", "cpu", "--seqlens", "64", "--configs", "16x2", "--tokens", "128",
                 "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["provider"] for r in rows] == ["foxformer", "sdpa"]
    assert [r["backend"] for r in rows] == ["torch", "flash"]  # "auto" and torch's own SDPA pick, as they ran
    assert all(r["B"] == 2 and r["fwd_ms"] > 0 and r["fwd_bwd_ms"] > 0 and "error" not in r for r in rows)
    assert "sdpa" in capsys.readouterr().out


def test_a_provider_that_is_not_installed_gets_a_row_saying_so(monkeypatch):
    import sys

    from foxformer.bench.attention import bench_case

    monkeypatch.setitem(sys.modules, "fla", None)  # `import fla...` now raises ImportError, installed or not
    row = bench_case("fla", 1, 64, 2, 2, 64, device="cpu")
    assert row["provider"] == "fla" and row["error"].startswith("not installed:") and "fwd_ms" not in row


def test_rounds_give_medians_and_keep_every_round():
    from foxformer.bench.attention import merge_rounds

    shape = dict(provider="gluon", gate="realistic", T=1024, B=2, Hq=4, Hkv=4, D=64, peak_gib=1.0)
    flops = 2.0 * 2 * 4 * 1024 * 1024 * 64
    per_round = [dict(shape, fwd_ms=ms, fwd_bwd_ms=3 * ms, fwd_tflops=flops / ms / 1e9,
                      fwd_bwd_tflops=3.5 * flops / (3 * ms) / 1e9) for ms in (2.0, 1.0, 4.0)]
    row = merge_rounds(per_round)
    assert row["fwd_ms"] == 2.0 and row["fwd_bwd_ms"] == 6.0
    assert row["fwd_ms_rounds"] == [2.0, 1.0, 4.0] and row["fwd_bwd_ms_rounds"] == [6.0, 3.0, 12.0]
    assert row["fwd_tflops"] == pytest.approx(flops / 2.0 / 1e9)
    assert row["fwd_bwd_tflops"] == pytest.approx(3.5 * flops / 6.0 / 1e9)
    assert per_round[0]["fwd_ms"] == 2.0 and "fwd_ms_rounds" not in per_round[0]  # inputs untouched
    assert merge_rounds(per_round[:1]) == per_round[0]
    failed = [dict(shape, error="OutOfMemoryError: ..."), per_round[1]]
    assert merge_rounds(failed) == failed[0]


def test_rounds_interleave_the_providers(monkeypatch, tmp_path):
    """Every provider once per round, each round starting one provider later, one merged row per provider (no GPU:
    the timing is replaced by a counter)."""
    import json

    import torch

    from foxformer.bench import attention

    calls = []

    def fake_case(provider, B, T, Hq, Hkv, D, **kw):
        calls.append(provider)
        ms = float(len(calls))
        flops = 2.0 * B * Hq * T * T * D
        return dict(provider=provider, gate="realistic", T=T, B=B, Hq=Hq, Hkv=Hkv, D=D, fwd_ms=ms, fwd_bwd_ms=2 * ms,
                    fwd_tflops=flops / ms / 1e9, fwd_bwd_tflops=3.5 * flops / (2 * ms) / 1e9)

    monkeypatch.setattr(attention, "bench_case", fake_case)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(attention, "environment", lambda device: {"device": "NVIDIA H100 80GB HBM3"})
    out = tmp_path / "a.json"
    args = build_parser().parse_args(["bench", "attention", "--providers", "foxformer,sdpa_cudnn", "--configs", "64x2",
                                      "--seqlens", "128", "--rounds", "3", "--out", str(out)])
    assert attention.run(args) == 0
    assert calls == ["foxformer", "sdpa_cudnn", "sdpa_cudnn", "foxformer", "foxformer", "sdpa_cudnn"]
    rows = json.loads(out.read_text())["rows"]
    assert [r["provider"] for r in rows] == ["foxformer", "sdpa_cudnn"]
    assert rows[0]["fwd_ms_rounds"] == [1.0, 4.0, 5.0] and rows[0]["fwd_ms"] == 4.0
    assert rows[1]["fwd_ms_rounds"] == [2.0, 3.0, 6.0] and rows[1]["fwd_ms"] == 3.0


def test_a_row_names_the_kernels_that_ran_not_the_ones_asked_for(monkeypatch):
    """The gluon provider on tensors TMA cannot address runs the Triton kernels: its row says triton (the op
    falls back inside; the row said gluon). No GPU: the resolved backend is made "gluon" and q is a strided
    slice."""
    import torch

    from foxformer.bench.attention import _ran_on
    from foxformer.ops.forgetting_attn import interface

    q = torch.randn(1, 8, 2, 128)[..., :64]
    k = v = torch.randn(1, 8, 2, 64)
    monkeypatch.setattr(interface, "resolve_backend", lambda backend, q: "gluon")
    assert _ran_on("gluon", None, q, k, v) == "triton"
    assert _ran_on("gluon", None, q.contiguous(), k, v) == "gluon"
    assert _ran_on("sdpa_cudnn", None, q, k, v) == "cudnn" and _ran_on("fla", None, q, k, v) == "fla"


@BARS_BY_PLACE
def test_a_bar_counts_every_timing_above_the_per_case_lines(monkeypatch, tmp_path, capsys, terminal, flag, shown):
    """bench attention printed a line per case and nothing else: no total, no ETA, no --no-progress, as bench model
    and bench decode have. A bar over shapes x seqlens x rounds x cases now, the lines written above it; off a
    terminal (a log) the lines alone, no carriage-return frames. No GPU: the timing is replaced."""
    import sys

    import torch

    from foxformer.bench import attention

    def fake_case(provider, B, T, Hq, Hkv, D, gate="realistic", prune_eps=None, **kw):
        return dict(provider=provider if prune_eps is None else f"{provider}+prune", gate=gate, T=T, B=B, Hq=Hq,
                    Hkv=Hkv, D=D, fwd_ms=1.0, fwd_bwd_ms=2.0, fwd_tflops=1.0, fwd_bwd_tflops=1.0)

    monkeypatch.setattr(attention, "bench_case", fake_case)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(attention, "environment", lambda device: {"device": "NVIDIA H100 80GB HBM3"})
    err = Terminal() if terminal else io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    bars = []

    class Recorded(attention.tqdm):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            bars.append(self)

    monkeypatch.setattr(attention, "tqdm", Recorded)
    args = build_parser().parse_args(["bench", "attention", "--providers", "sdpa_cudnn", "--prune", "--configs",
                                      "64x2,128x2", "--seqlens", "128", "--rounds", "2", "--out",
                                      str(tmp_path / "a.json"), *flag])
    assert attention.run(args) == 0
    bar, = bars
    # sdpa_cudnn, the unpruned foxformer row --prune compares with, and the three --prune cases: 2 shapes, 2 rounds
    assert bar.total == 2 * 1 * 2 * 5 and bar.n == (bar.total if shown else 0)
    assert ("\rbench attention:" in err.getvalue()) is shown and ("\r" in err.getvalue()) is shown
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("{'round'")]
    assert len(lines) == 20


def test_an_unknown_provider_is_answered_with_the_closest_one(capsys):
    with pytest.raises(SystemExit):
        main(["bench", "attention", "--device", "cpu", "--providers", "foxfromer,sdpa"])
    assert ("argument --providers: unknown provider(s) 'foxfromer' (did you mean 'foxformer'?); choose from "
            in capsys.readouterr().err)


@pytest.fixture
def never_times(monkeypatch):
    from foxformer.bench import attention

    monkeypatch.setattr(attention, "bench_case", lambda *a, **k: pytest.fail("a case was timed"))


@pytest.mark.parametrize("provider", ["gluon", "triton", "sdpa_cudnn", "fla", "flex"])
@pytest.mark.parametrize("device", ["cpu", "auto"])
def test_a_provider_no_cpu_runs_is_refused_on_one_before_any_timing(provider, device, monkeypatch, capsys, tmp_path,
                                                                     never_times):
    """Each made a row of its error under --device cpu, and the run exited 0 as if it had timed what was asked (flex
    a forward time, then its backward's NotImplementedError where the others have forward+backward)."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    out = tmp_path / "a.json"
    assert main(["bench", "attention", "--device", device, "--providers", f"sdpa,{provider}", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: --providers {provider}: ")
    # the flag that took the run to the CPU, as typed: auto (the default) is not "--device cpu"
    said = "--device cpu" if device == "cpu" else "--device auto, and no GPU is visible"
    assert f"; on the CPU ({said}) choose from foxformer, sdpa, sdpa_flash" in err
    assert not out.exists()


def test_device_auto_takes_the_cpu_where_there_is_no_gpu(monkeypatch, tmp_path):
    """--device cuda's error on such a machine says "use 'cpu' or 'auto'", and auto was refused."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    out = tmp_path / "a.json"
    assert main(["bench", "attention", "--device", "auto", "--seqlens", "16", "--configs", "16x2", "--tokens", "16",
                 "--providers", "sdpa", "--no-progress", "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["settings"]["device"] == "cpu" and data["dtype"] == "float32"


@pytest.mark.parametrize("argv", [["--prune-eps", "0.01"], ["--qk-bound", "5"], ["--qk-bound", "auto"]])
def test_pruning_settings_without_prune_are_refused(argv, capsys, never_times):
    """They were unused without a word, and the JSON recorded a prune_eps for a run that pruned nothing."""
    assert main(["bench", "attention", "--device", "cpu", *argv]) == 2
    assert capsys.readouterr().err.startswith(f"error: {argv[0]} sets the pruned rows of --prune: add --prune")


def test_each_case_line_keeps_a_small_rate_s_digits(monkeypatch, tmp_path, capsys):
    """The line after each case rounded to three decimals: a CPU's 0.0004 TFLOP/s read 0.0."""
    from foxformer.bench import attention

    def fake_case(provider, B, T, Hq, Hkv, D, **kw):
        return dict(provider=provider, gate="realistic", T=T, B=B, Hq=Hq, Hkv=Hkv, D=D, fwd_ms=123.456789,
                    fwd_bwd_ms=400.0, fwd_tflops=0.000412345, fwd_bwd_tflops=0.00123456)

    monkeypatch.setattr(attention, "bench_case", fake_case)
    assert main(["bench", "attention", "--device", "cpu", "--providers", "sdpa", "--seqlens", "16", "--configs",
                 "16x2", "--no-progress", "--out", str(tmp_path / "a.json")]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("{'round'"))
    assert "'fwd_tflops': 0.0004123," in line and "'fwd_bwd_tflops': 0.001235}" in line
    assert "'fwd_ms': 123.5," in line


@pytest.mark.parametrize("value, said", [("64x8,64x", "config '64x': expected a positive integer, got ''"),
                                         ("64xabc", "config '64xabc': expected a positive integer, got 'abc'")])
def test_a_config_s_bad_number_names_the_config(value, said, capsys):
    """"expected a positive integer, got ''" named neither the config nor which part of it."""
    with pytest.raises(SystemExit):
        main(["bench", "attention", "--configs", value])
    assert capsys.readouterr().err.splitlines()[-1].endswith(f"argument --configs: {said}")


@pytest.mark.parametrize("argv, bad, smallest", [(["--seqlens", "64", "--tokens", "16"], "64", "--seqlens 64 is 64"),
                                                 (["--seqlens", "64,48", "--tokens", "100"], "64,48",
                                                  "--seqlens 64,48 is 192"),
                                                 (["--seqlens", "16,64", "--tokens", "48"], "64",
                                                  "--seqlens 16,64 is 64")])
def test_tokens_that_are_no_whole_number_of_sequences_are_refused_before_any_timing(argv, bad, smallest, capsys,
                                                                                      tmp_path, never_times):
    """--tokens 16 at T 64 ran B = 1, 64 tokens a call, and --tokens 100 at T 48 two sequences, 96: other calls than
    asked, without a word."""
    out = tmp_path / "a.json"
    assert main(["bench", "attention", "--device", "cpu", "--configs", "16x2", *argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: --tokens {argv[-1]} is not a whole number of sequences of --seqlens {bad} ")
    assert f"the smallest --tokens for {smallest}" in err
    assert not out.exists()


def test_tokens_left_out_run_whole_sequences_with_a_note(monkeypatch, tmp_path, capsys):
    """The default (a CPU's 4096) against a longer T runs one sequence, as the GPU's 32768 runs T 65536: said on
    stderr, and each row's B is what ran."""
    from foxformer.bench import attention

    def fake_case(provider, B, T, Hq, Hkv, D, **kw):
        return dict(provider=provider, gate="realistic", T=T, B=B, Hq=Hq, Hkv=Hkv, D=D, fwd_ms=1.0, fwd_bwd_ms=2.0,
                    fwd_tflops=1.0, fwd_bwd_tflops=1.0)

    monkeypatch.setattr(attention, "bench_case", fake_case)
    out = tmp_path / "a.json"
    assert main(["bench", "attention", "--device", "cpu", "--providers", "sdpa", "--seqlens", "1024,8192,3000",
                 "--configs", "16x2", "--no-progress", "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert ("note: --tokens left out (4096 a call), which --seqlens 8192,3000 do not divide: T 8192 runs B = 1, "
            "8192 tokens a call; T 3000 runs B = 1, 3000 tokens a call (the rows' B)") in err
    data = json.loads(out.read_text())
    assert [(r["T"], r["B"]) for r in data["rows"]] == [(1024, 4), (8192, 1), (3000, 1)]
    assert data["settings"]["tokens"] == 4096 and data["settings"]["tokens_given"] is False
