"""What every `foxformer bench` subcommand checks before it times anything."""
import importlib

import pytest

from foxformer.cli import main

SUBCOMMANDS = {
    "attention": ["bench", "attention", "--device", "cpu"],
    "model": ["bench", "model", "--presets", "fox-pro-tiny"],
    "bench-model": ["bench-model", "--presets", "fox-pro-tiny"],
    "decode": ["bench", "decode", "--preset", "fox-pro-tiny"],
    "bench-decode": ["bench-decode", "--preset", "fox-pro-tiny"],
    "scaling": ["bench", "scaling", "."],
}
MODULES = {"bench-model": "model", "bench-decode": "decode"}


@pytest.fixture
def never_runs(monkeypatch):
    def refuse(args):
        raise AssertionError("the benchmark ran")
    for module in {"attention", "model", "decode", "scaling"}:
        monkeypatch.setattr(importlib.import_module(f"foxformer.bench.{module}"), "run", refuse)


@pytest.mark.parametrize("name", list(SUBCOMMANDS))
def test_out_naming_a_folder_is_refused_before_the_run(name, tmp_path, capsys, never_runs):
    assert main([*SUBCOMMANDS[name], "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --out:") and "is a folder" in err
    assert list(tmp_path.parent.glob(f"{tmp_path.name}.tmp-*")) == []


@pytest.mark.parametrize("name", list(SUBCOMMANDS))
def test_out_inside_a_file_is_refused_before_the_run(name, tmp_path, capsys, never_runs):
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert main([*SUBCOMMANDS[name], "--out", str(blocker / "x.json")]) == 2
    assert capsys.readouterr().err.startswith("error: --out:")


@pytest.mark.parametrize("name", ["attention", "model", "decode"])
def test_profile_folder_inside_a_file_is_refused_before_the_run(name, tmp_path, capsys, never_runs):
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert main([*SUBCOMMANDS[name], "--profile", str(blocker / "prof")]) == 2
    assert capsys.readouterr().err.startswith("error: --profile:")


@pytest.mark.parametrize("argv", [["--contexts", "64,128,64"], ["--batches", "1,1"], ["--decode", "eager,eager"],
                                  ["--kernel", "--num-splits", "2,2"]])
def test_decode_refuses_a_list_entry_given_twice(argv, capsys, never_runs):
    with pytest.raises(SystemExit) as e:
        main([*SUBCOMMANDS["decode"], *argv])
    assert e.value.code == 2 and "more than once" in capsys.readouterr().err


def test_decode_refuses_an_anchor_given_twice(capsys, never_runs):
    assert main([*SUBCOMMANDS["decode"], "--anchors", "sdpa,sdpa"]) == 2
    assert "more than once" in capsys.readouterr().err


TINY_RUNS = {
    "attention": ["--seqlens", "16", "--configs", "16x2", "--tokens", "16", "--providers", "foxformer"],
    "model": ["--context", "16", "--tokens-per-step", "16", "--steps", "1", "--warmup", "0", "--no-anchor",
              "--no-progress", "--backend", "torch", "--dtype", "fp32"],
    "decode": ["--contexts", "16", "--batches", "1", "--steps", "1", "--warmup", "0", "--prefill-chunk", "16",
               "--decode", "eager", "--no-baseline", "--no-progress"],
}


@pytest.mark.parametrize("name", list(TINY_RUNS))
def test_the_json_says_how_and_where_it_was_measured(name, tmp_path):
    """Versions, device and commit (env), the command, and every setting as it ran, defaults filled in: a model run
    with --backend torch read like one with auto."""
    import json

    out = tmp_path / "r.json"
    assert main([*SUBCOMMANDS[name], *TINY_RUNS[name], "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["command"] == f"foxformer bench {name}"
    assert {"torch", "python", "device", "commit"} <= set(data["env"])
    settings = data["settings"]
    assert settings["out"] == str(out) and "func" not in settings
    if name == "attention":
        assert settings["providers"] == ["foxformer"] and settings["device"] == "cpu" and data["dtype"] == "float32"
    if name == "model":
        assert settings["backend"] == "torch" and settings["presets"] == "fox-pro-tiny"
    if name == "decode":
        assert settings["contexts"] == [16] and settings["decode"] == ["eager"]


CPU_RUNS = {"attention": [*SUBCOMMANDS["attention"], *TINY_RUNS["attention"]],
            "model": [*SUBCOMMANDS["model"], "--device", "cpu", *TINY_RUNS["model"]],
            "decode": [*SUBCOMMANDS["decode"], "--device", "cpu", *TINY_RUNS["decode"]],
            "decode-kernel": [*SUBCOMMANDS["decode"], "--device", "cpu", "--kernel", "--contexts", "16", "--batches",
                              "1"]}


@pytest.mark.parametrize("name", list(CPU_RUNS))
def test_a_cpu_run_on_a_machine_with_a_gpu_records_and_times_the_cpu(name, tmp_path, monkeypatch):
    """A --device cpu run's JSON named the machine's GPU, its CUDA version and SM count, none of which it used, and
    --kernel timed the CPU op with triton's do_bench (CUDA events). The CPU's record names the processor and torch's
    thread count, which CPU timings scale with."""
    import json

    import torch

    testing = pytest.importorskip("triton.testing")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(testing, "do_bench", lambda *a, **k: pytest.fail("a CPU call timed by CUDA events"))
    out = tmp_path / "r.json"
    assert main([*CPU_RUNS[name], "--out", str(out)]) == 0
    env = json.loads(out.read_text())["env"]
    assert env["device"] == "cpu" and "cuda" not in env and "sm_count" not in env
    assert env["threads"] == torch.get_num_threads() and "cpu" in env


TIMED = ("attention", "model", "decode")


@pytest.mark.parametrize("name", TIMED)
def test_every_timing_command_defaults_to_auto(name):
    """bench attention alone defaulted to cuda: on a machine without a GPU its first run was refused with "use 'cpu',
    or 'auto'", where bench model and decode took the CPU."""
    from foxformer.cli import build_parser

    assert build_parser().parse_args(["bench", name]).device == "auto"


@pytest.mark.parametrize("name", TIMED)
def test_a_run_left_to_auto_without_a_gpu_times_the_cpu_and_says_so(name, tmp_path, monkeypatch, capsys):
    """Its JSON records the CPU, and the table is headed by the device, with the note that CPU timings check the code
    path and are not comparable with the GPU figures."""
    import json

    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    out = tmp_path / "r.json"
    assert main(["bench", name, *TINY_RUNS[name], "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["env"]["device"] == "cpu" and data["complete"]
    heading = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("device: "))
    assert heading.startswith("device: cpu (") and heading.endswith(
        f"{torch.get_num_threads()} thread{'s' if torch.get_num_threads() != 1 else ''}); CPU timings check the code "
        "path and are not comparable with the GPU figures")
    if name == "attention":
        assert data["settings"]["device"] == "cpu" and data["table"].startswith(heading)


DEVICES = [("attention", "cuda"), ("model", "cuda"), ("model", "cuda:1"), ("model", "gpu"), ("decode", "cuda"),
           ("decode", "cuda:0"), ("decode", "gpu"), ("decode", "meta"), ("model", "mps")]


@pytest.mark.parametrize("name,device", DEVICES)
def test_a_device_this_machine_lacks_is_one_error_line(name, device, monkeypatch, capsys):
    """Not a traceback (a CPU-only torch's AssertionError, torch.device's RuntimeError, a meta tensor's value read
    back), and before any model is built."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main([*SUBCOMMANDS[name], "--device", device]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --device") and "Traceback" not in err


def test_every_decode_path_is_compared_with_eager_whichever_runs_first(tmp_path):
    import json

    out = tmp_path / "d.json"
    argv = [a if a != "eager" else "static,eager" for a in TINY_RUNS["decode"]]
    assert main([*SUBCOMMANDS["decode"], *argv, "--out", str(out)]) == 0
    rows = {(r["model"], r["decode"]): r for r in json.loads(out.read_text())["rows"]}
    assert rows[("fox", "static")]["logprob_diff_vs_eager"] < 1e-4
    assert rows[("fox+evict", "static")]["logprob_diff_vs_eager"] < 1e-4
    assert "logprob_diff_vs_eager" not in rows[("fox", "eager")]


def test_gpu_only_providers_on_a_cpu_say_they_need_cuda(monkeypatch):
    """On a CPU the cuDNN row ended in torch's message cut at 120 characters (before the reason), and the triton
    row blamed the dtype (fp32), which was not what to change."""
    import torch

    from foxformer.bench.attention import bench_case

    monkeypatch.setenv("TRITON_INTERPRET", "0")  # the suite's interpreter would run Triton on CPU tensors
    for provider in ("sdpa_cudnn", "triton"):
        row = bench_case(provider, 1, 16, 2, 2, 16, dtype=torch.float32, device="cpu")
        assert "CUDA" in row["error"] and "float16" not in row["error"], row


UNKNOWN = "unknown preset 'nope': expected one of ['fox-llama-1.3b', "


@pytest.mark.parametrize("argv, said", [
    (["--presets", "fox-pro-125m:num_heads=5"], "--presets fox-pro-125m:num_heads=5: num_heads (5) must divide "
                                                "hidden_size (768); give both num_heads and head_dim"),
    (["--presets", "fox-pro-tiny:num_kv_heads=3"], "--presets fox-pro-tiny:num_kv_heads=3: num_heads (4) must be a "
                                                   "multiple of num_kv_heads (3)"),
    (["--presets", "fox-pro-tiny:vocab_size=x"], "--presets fox-pro-tiny:vocab_size=x: vocab_size must be a positive "
                                                 "int, got 'x'"),
    (["--presets", "fox-pro-tiny,fox-pro-tiny:bogus=1"], "--presets fox-pro-tiny:bogus=1: unknown model key 'bogus'; "),
    (["--presets", "fox-pro-tiny:num_heads"], "--presets fox-pro-tiny:num_heads: expected key=value, got 'num_heads'"),
    (["--presets", "fox-pro-tiny,nope"], f"--presets nope: {UNKNOWN}"),
    (["--presets", "fox-pro-tiny", "--backend", "foo"], "--backend: expected one of auto, gluon, triton, torch, "
                                                        "naive, got 'foo'"),
    # the row's own backend wins over --backend, whose value the anchor still takes
    (["--presets", "fox-pro-tiny:attention_backend=torch", "--backend", "foo"], "--backend: expected one of "),
    (["--presets", "fox-pro-tiny:attention_backend=foo", "--backend", "torch"], "--presets "
     "fox-pro-tiny:attention_backend=foo: expected one of auto, gluon, triton, torch, naive, got 'foo'"),
    # every row's own backend won and no anchor took the flag's: it was unused without a word
    (["--presets", "fox-pro-tiny:attention_backend=naive,fox-pro-tiny:attention_backend=torch", "--no-anchor",
      "--backend", "torch"], "--backend: every --presets row sets its own attention_backend and --no-anchor leaves "
                             "no anchor to take it; leave --backend out"),
], ids=["heads-not-dividing", "kv-heads", "not-a-number", "unknown-key", "not-key-value", "unknown-preset",
        "backend", "backend-of-the-anchor", "backend-of-the-row", "backend-no-row-takes"])
def test_bench_model_names_the_preset_or_flag_typed_before_any_model_is_built(argv, said, monkeypatch, capsys,
                                                                              tmp_path):
    """They began "get_preset: ..." or "FoxConfig.num_kv_heads ...": a function and a field, not what was typed."""
    import foxformer.bench.model as bench_model

    monkeypatch.setattr(bench_model, "FoxForCausalLM", lambda cfg: pytest.fail("a model was built"))
    assert main(["bench", "model", "--device", "cpu", *argv, "--out", str(tmp_path / "b.json")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {said}"), err


@pytest.mark.parametrize("argv", [[], ["--no-anchor"], ["--backend", "torch"]], ids=["left-out", "left-out-no-anchor",
                                                                                   "taken-by-the-anchor"])
def test_bench_model_takes_rows_of_their_own_backends_with_backend_left_out_or_taken(argv, monkeypatch, tmp_path):
    import foxformer.bench.model as bench_model

    seen = {}
    monkeypatch.setattr(bench_model, "_run", lambda args, specs, overrides: seen.update(args=args, specs=specs) or 0)
    assert main(["bench", "model", "--device", "cpu", "--presets", "fox-pro-tiny:attention_backend=naive", *argv,
                 "--out", str(tmp_path / "b.json")]) == 0
    assert [cfg.attention_backend for *_, cfg in seen["specs"]] == ["naive"]
    assert seen["args"].backend == ("torch" if argv[-1:] == ["torch"] else "auto")  # as the record says it ran


@pytest.mark.parametrize("argv, said", [
    (["--preset", "nope"], f"--preset: {UNKNOWN}"),
    (["--preset", "nope", "--kernel"], f"--preset: {UNKNOWN}"),
], ids=["unknown-preset", "unknown-preset-kernel"])
def test_bench_decode_names_the_flag_typed_before_any_model_is_built(argv, said, capsys, tmp_path, never_runs):
    assert main(["bench", "decode", "--device", "cpu", *argv, "--out", str(tmp_path / "b.json")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {said}"), err


@pytest.mark.parametrize("command, option, value, expected", [
    pytest.param("decode", "--contexts", "0", "comma-separated positive integers", id="decode-context-zero"),
    pytest.param("decode", "--contexts", "48,-5", "comma-separated positive integers", id="decode-context-negative"),
    pytest.param("decode", "--batches", "0", "comma-separated positive integers", id="decode-batch-zero"),
    pytest.param("decode", "--num-splits", "0", "comma-separated positive integers", id="decode-num-splits-zero"),
    pytest.param("decode", "--steps", "0", "a positive integer", id="decode-steps-zero"),
    pytest.param("decode", "--prefill-chunk", "-1", "a positive integer", id="decode-prefill-chunk-negative"),
    pytest.param("decode", "--warmup", "-3", "a non-negative integer", id="decode-warmup-negative"),
    pytest.param("decode", "--vocab-size", "0", "a positive integer", id="decode-vocab-zero"),
    pytest.param("model", "--context", "0", "a positive integer", id="model-context-zero"),
    pytest.param("model", "--tokens-per-step", "-64", "a positive integer", id="model-tokens-negative"),
    pytest.param("model", "--steps", "0", "a positive integer", id="model-steps-zero"),
    pytest.param("model", "--warmup", "-1", "a non-negative integer", id="model-warmup-negative"),
    pytest.param("model", "--vocab-size", "0", "a positive integer", id="model-vocab-zero"),
    pytest.param("model", "--rounds", "0", "a positive integer", id="model-rounds-zero"),
])
def test_bench_counts_are_refused_as_they_are_parsed(tmp_path, capsys, command, option, value, expected):
    """They said "--steps must be >= 1" (and "must all be >= 1, got [0]") once parsed, where every other flag says
    "--rounds: expected a positive integer": typed through the shared argtypes now, refused as they are parsed."""
    out = tmp_path / "b.json"
    with pytest.raises(SystemExit) as exit_:
        main([*SUBCOMMANDS[command], "--device", "cpu", "--out", str(out), option, value])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (f"foxformer bench {command}: error: argument {option}: "
                                                         f"expected {expected}, got {value!r}")
    assert not out.exists()


@pytest.mark.parametrize("name", list(TINY_RUNS))
def test_an_earlier_out_is_said_to_be_replaced_once(name, tmp_path, capsys):
    """A second run took the first one's file without a word, where every other command's --out notes it."""
    import json

    out = tmp_path / "r.json"
    out.write_text("{}\n")
    assert main([*SUBCOMMANDS[name], *TINY_RUNS[name], "--out", str(out)]) == 0
    notes = [line for line in capsys.readouterr().err.splitlines() if line.startswith("note: replacing")]
    assert len(notes) == 1 and notes[0].startswith(f"note: replacing {out} (written ")
    assert notes[0].endswith("--out FILE writes elsewhere")
    assert json.loads(out.read_text())["complete"] is True


@pytest.mark.parametrize("name", list(TINY_RUNS))
def test_an_empty_out_writes_no_file(name, tmp_path, monkeypatch):
    """bench model and decode took --out '' for no file; bench attention failed after its first case, on the
    temporary file of a path without a name."""
    monkeypatch.chdir(tmp_path)
    assert main([*SUBCOMMANDS[name], *TINY_RUNS[name], "--out", ""]) == 0
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name, module, timed", [("attention", "attention", "bench_case"),
                                                 ("decode", "decode", "measure_decode")])
def test_a_run_cut_short_leaves_a_whole_file_that_says_so(name, module, timed, tmp_path, monkeypatch):
    """Ctrl-C after the first row: the JSON written after that row stays, whole, and says it is not complete (it
    read like a finished run with fewer rows; bench model's said so already); no temporary file is left."""
    import json

    bench = importlib.import_module(f"foxformer.bench.{module}")
    real, calls = getattr(bench, timed), []

    def once(*args, **kwargs):
        calls.append(1)
        if len(calls) > 1:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(bench, timed, once)
    out = tmp_path / "r.json"
    argv = {"attention": ["--seqlens", "16,32", "--tokens", "32"], "decode": ["--contexts", "16,32"]}[name]
    assert main([*SUBCOMMANDS[name], *TINY_RUNS[name], *argv, "--out", str(out)]) == 130
    data = json.loads(out.read_text())
    assert data["complete"] is False and len(data["rows"]) == 1
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]


@pytest.mark.parametrize("argv, said", [
    (["--peak-flops", "inf"], "error: --peak-flops must be a finite number > 0, got inf"),
    (["--gluon-fwd", "max_free=true"], "error: --gluon-fwd sets the Gluon forward kernels, which run on an sm_90 GPU"),
], ids=["peak-flops-inf", "gluon-fwd-on-a-cpu"])
def test_bench_model_refuses_what_a_cpu_run_would_misreport(argv, said, monkeypatch, capsys, tmp_path):
    """--peak-flops inf gave every row an MFU of 0; --gluon-fwd on a CPU named each FoX row after a Gluon setting
    that no kernel of the run applied."""
    import foxformer.bench.model as bench_model

    monkeypatch.setattr(bench_model, "FoxForCausalLM", lambda cfg: pytest.fail("a model was built"))
    assert main(["bench", "model", "--device", "cpu", "--presets", "fox-pro-tiny", *argv, "--out",
                 str(tmp_path / "b.json")]) == 2
    assert capsys.readouterr().err.startswith(said)


def test_bench_model_refuses_an_empty_preset_entry_as_it_is_parsed(capsys, never_runs):
    with pytest.raises(SystemExit) as e:
        main(["bench", "model", "--presets", "fox-pro-tiny,"])
    assert e.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1].endswith("argument --presets: empty item in 'fox-pro-tiny,': "
                                                              "separate the values with single commas")


def test_bench_model_table_lines_up_its_columns(tmp_path, capsys):
    """Its cells were joined by ' | ' at whatever width each had, unlike the other benchmarks' tables."""
    argv = [*SUBCOMMANDS["model"], "--device", "cpu", *TINY_RUNS["model"], "--presets",
            "fox-pro-tiny,transformer-llama-tiny"]
    assert main([*argv, "--out", str(tmp_path / "m.json")]) == 0
    lines = capsys.readouterr().out.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("name "))
    table = lines[head:head + 4]
    bars = {tuple(i for i, ch in enumerate(line) if ch in "|+") for line in table}
    assert len(bars) == 1 and len(next(iter(bars))) >= 4 and table[2].startswith("fox-pro-tiny ")


@pytest.mark.parametrize("argv", [[], ["--kernel"]], ids=["models", "kernel"])
def test_bench_decode_records_the_dtype_that_ran(argv, tmp_path):
    """--dtype auto was all the JSON said: bf16 on a GPU, fp32 on the CPU, which the reader had to know."""
    import json

    out = tmp_path / "d.json"
    assert main([*SUBCOMMANDS["decode"], "--device", "cpu", *TINY_RUNS["decode"], *argv, "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["settings"]["dtype"] == "auto" and data["dtype"] == "float32"


@pytest.mark.parametrize("argv, said", [
    (["--decode", "eager,egaer"], "error: --decode: expected comma-separated decode paths from auto, graphs, "
                                  "compiled, static, eager, got 'egaer' (did you mean 'eager'?)"),
    (["--anchors", "sdpa,static-compile"], "error: --anchors must be auto or comma-separated from sdpa, "
                                           "static-compiled, got 'static-compile' (did you mean 'static-compiled'?)"),
], ids=["decode", "anchors"])
def test_bench_decode_answers_an_unknown_name_with_the_closest_one(argv, said, capsys, never_runs):
    assert main([*SUBCOMMANDS["decode"], *argv]) == 2
    assert capsys.readouterr().err.strip() == said


def _sizes(argv, cuda, monkeypatch):
    """bench model's or decode's arguments once its check filled what was left out, on a machine with a GPU (cuda)
    or without one; no run."""
    import torch

    from foxformer.bench import cli as bench_cli
    from foxformer.bench.model import _check
    from foxformer.cli import build_parser

    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: int(cuda))
    args = build_parser().parse_args(argv)
    (_check if args.bench_command == "model" else bench_cli._check_decode)(args)
    return args


@pytest.mark.parametrize("device, cuda", [("auto", True), ("cuda", True), ("auto", False), ("cpu", True)])
def test_bench_model_and_decode_fill_the_sizes_left_out_for_their_device(device, cuda, monkeypatch):
    """A CPU ran the GPU's 125M models at 16384 tokens of context (bench model --device cpu --presets fox-pro-tiny:
    killed by the OOM killer on a 23 GB machine, no message) and bench decode's 65536-token caches at batch 32."""
    gpu = device == "cuda" or (device == "auto" and cuda)
    model = _sizes(["bench", "model", "--device", device], cuda, monkeypatch)
    assert (model.presets, model.context, model.tokens_per_step) == (
        ("fox-pro-125m,fox-llama-125m,transformer-llama-125m", 16384, 65536) if gpu else
        ("fox-pro-tiny,fox-llama-tiny,transformer-llama-tiny", 512, 1024))
    decode = _sizes(["bench", "decode", "--device", device], cuda, monkeypatch)
    assert (decode.preset, decode.contexts, decode.batches) == (
        ("fox-pro-125m", [4096, 8192, 16384, 32768, 65536], [1, 32]) if gpu else ("fox-pro-tiny", [512, 2048], [1, 4]))
    assert model.device == decode.device == device  # as typed: a cuda:N or auto is recorded so


@pytest.mark.parametrize("cuda", [True, False], ids=["gpu", "cpu"])
def test_bench_model_and_decode_keep_the_sizes_given(cuda, monkeypatch):
    model = _sizes(["bench", "model", "--presets", "fox-llama-small", "--context", "64", "--tokens-per-step", "128"],
                   cuda, monkeypatch)
    assert (model.presets, model.context, model.tokens_per_step) == ("fox-llama-small", 64, 128)
    decode = _sizes(["bench", "decode", "--preset", "fox-llama-small", "--contexts", "64", "--batches", "2"], cuda,
                    monkeypatch)
    assert (decode.preset, decode.contexts, decode.batches) == ("fox-llama-small", [64], [2])
    one = _sizes(["bench", "model", "--context", "64"], cuda, monkeypatch)  # the others still filled in
    assert one.context == 64 and one.tokens_per_step == (65536 if cuda else 1024)


def test_bench_decode_refuses_a_preset_beside_a_model_whatever_its_default(tmp_path, capsys, never_runs):
    assert main(["bench", "decode", "--device", "cpu", "--preset", "fox-pro-tiny", "--model", str(tmp_path)]) == 2
    assert "pass one of them" in capsys.readouterr().err


@pytest.mark.parametrize("name, argv, filled", [
    ("model", ["--context", "16", "--steps", "1", "--warmup", "0", "--no-anchor", "--no-progress"],
     {"presets": "fox-pro-tiny,fox-llama-tiny,transformer-llama-tiny", "tokens_per_step": 1024, "context": 16}),
    ("decode", ["--contexts", "16", "--steps", "1", "--warmup", "0", "--prefill-chunk", "16", "--decode", "eager",
                "--no-baseline", "--no-progress"], {"preset": "fox-pro-tiny", "batches": [1, 4], "contexts": [16]}),
])
def test_a_cpu_run_records_the_sizes_it_filled_in(name, argv, filled, tmp_path):
    import json

    out = tmp_path / "r.json"
    assert main(["bench", name, "--device", "cpu", *argv, "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert {key: data["settings"][key] for key in filled} == filled
    if name == "model":
        assert [row["name"] for row in data["results"]] == filled["presets"].split(",")
        assert {row["batch"] for row in data["results"]} == {1024 // 16}
