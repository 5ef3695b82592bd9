"""`foxformer bench attention`: bad values are refused while parsing ('error: ...', exit 2), on any machine."""
import pytest

from foxformer.cli import build_parser, main

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
    defaults = build_parser().parse_args(["bench", "attention"])
    assert defaults.configs == [(64, 24, 24), (128, 12, 12), (128, 12, 2)] and defaults.qk_bound == "auto"


def test_a_provider_that_is_not_installed_gets_a_row_saying_so(monkeypatch):
    import sys

    from foxformer.bench.attention import bench_case

    monkeypatch.setitem(sys.modules, "fla", None)  # `import fla...` now raises ImportError, installed or not
    row = bench_case("fla", 1, 64, 2, 2, 64, device="cpu")
    assert row["provider"] == "fla" and row["error"].startswith("not installed:") and "fwd_ms" not in row
