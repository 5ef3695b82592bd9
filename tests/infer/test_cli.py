"""`foxformer generate`, `foxformer bias-shift` and `foxformer bench decode` / `bench-decode` end to end."""
import gzip
import io
import itertools
import json
import os
import re
import shutil
import sys

import pytest
import torch

from foxformer.cli import main
from foxformer.data import load_tokenizer
from foxformer.infer import generate
from tests.bars import Terminal

from .conftest import make_model


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("model")
    make_model("fox-pro-tiny", dtype=torch.float32, gate_bias=[-3.0, -3.0, 6.0, -3.0]).save_pretrained(path)
    return str(path)


def test_generate_streams_the_same_text_as_the_api(hf_dir, tmp_path, capsys):
    out = tmp_path / "gen.json"
    rc = main(["generate", "--model", hf_dir, "--tokenizer", "bytes", "--prompt", "Once upon", "--max-new-tokens",
               "12", "--temperature", "0", "--ignore-eos", "--evict-eps", "1e-4", "--fgate-bias-shift", "0.5",
               "--device", "cpu",
               "--out", str(out)])
    assert rc == 0
    printed = capsys.readouterr().out
    from foxformer.models import FoxForCausalLM
    model = FoxForCausalLM.from_pretrained(hf_dir).eval()
    want = "".join(generate(model, load_tokenizer("bytes"), "Once upon", max_new_tokens=12, temperature=0,
                            evict_eps=1e-4, fgate_bias_shift=0.5, ignore_eos=True))
    assert printed == want + "\n"
    data = json.loads(out.read_text())
    assert want and data["text"] == want and data["settings"]["evict_eps"] == 1e-4
    assert data["cache"]["kept_fraction"] < 1


@pytest.mark.parametrize("decode", ["auto", "static"])
def test_generate_says_in_one_line_when_it_decodes_without_cuda_graphs(hf_dir, tmp_path, capsys, decode):
    """On the CPU "auto" decodes eagerly and says so in the stats line; the static step (what graphs replay)
    gives the same text."""
    out = tmp_path / f"{decode}.json"
    assert main(["generate", "--model", hf_dir, "--tokenizer", "bytes", "--prompt", "Once upon", "--max-new-tokens",
                 "9", "--temperature", "0", "--ignore-eos", "--device", "cpu", "--decode", decode,
                 "--out", str(out)]) == 0
    err = capsys.readouterr().err
    data = json.loads(out.read_text())
    note = "decoding eagerly: CUDA graphs need a CUDA device"
    assert (note in err.splitlines()[-1] and data["decode_note"] == note) if decode == "auto" else note not in err
    assert data["text"] == "".join(generate(_load_model(hf_dir), load_tokenizer("bytes"), "Once upon",
                                            max_new_tokens=9, temperature=0, ignore_eos=True, decode="eager"))


def _load_model(path):
    from foxformer.models import FoxForCausalLM
    return FoxForCausalLM.from_pretrained(path).eval()


def test_generate_of_a_linear_attention_model_reports_its_state_not_kept_keys(tmp_path, capsys):
    """Its cache holds no keys: 'cache kept 100.0% of keys' (of none) read as if nothing had been evicted."""
    path = tmp_path / "linear"
    make_model("linear-pro-tiny", dtype=torch.float32).save_pretrained(path)
    out = tmp_path / "gen.json"
    assert main(["generate", "--model", str(path), "--tokenizer", "bytes", "--prompt", "Once upon",
                 "--max-new-tokens", "4", "--temperature", "0", "--ignore-eos", "--device", "cpu",
                 "--out", str(out)]) == 0
    err = capsys.readouterr().err
    cache = json.loads(out.read_text())["cache"]
    assert cache["kept_fraction"] is None and cache["total_keys"] == 0
    assert "of keys" not in err and f"recurrent state of {cache['allocated_bytes'] / 2**10:.1f} KiB" in err


def test_generate_reads_a_prompt_file_and_samples_with_a_seed(hf_dir, tmp_path, capsys):
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("abc")
    args = ["generate", "--model", hf_dir, "--tokenizer", "bytes", "--prompt-file", str(prompt), "--max-new-tokens",
            "8", "--top-k", "20", "--top-p", "0.9", "--seed", "3", "--device", "cpu", "--no-stream"]
    assert main(args) == 0
    first = capsys.readouterr().out
    assert main(args) == 0
    assert capsys.readouterr().out == first


def test_generate_says_the_out_file_it_replaces(hf_dir, tmp_path, capsys):
    """A second `generate --out FILE` replaced the first one's file without a word, as the eval commands do not."""
    out = tmp_path / "gen.json"
    args = ["generate", hf_dir, "--tokenizer", "bytes", "--prompt", "Once", "--max-new-tokens", "2", "--temperature",
            "0", "--device", "cpu", "--no-progress", "--out", str(out)]
    assert main(args) == 0
    assert "replacing" not in capsys.readouterr().err
    assert main(args) == 0
    assert f"note: replacing {out} (written " in capsys.readouterr().err


@pytest.mark.parametrize("flags, said", [(["--top-k", "5", "--seed", "3"], "--top-k, --seed have"),
                                         (["--top-p", "0.9"], "--top-p has"), ([], None)])
def test_generate_says_greedy_decoding_leaves_the_sampling_flags_without_effect(hf_dir, capsys, flags, said):
    """--temperature 0 with --top-k, --top-p or --seed decoded greedily and ignored them without a word."""
    args = ["generate", hf_dir, "--tokenizer", "bytes", "--prompt", "Once", "--max-new-tokens", "2", "--temperature",
            "0", "--device", "cpu", "--no-progress"]
    assert main(args + flags) == 0
    err = capsys.readouterr().err
    if said is None:
        assert "greedy" not in err
    else:
        assert f"note: {said} no effect under greedy decoding (--temperature 0 " in err
        assert err.count("no effect under greedy decoding") == 1  # not again as generate's warning


@pytest.mark.parametrize("command", ["generate", "bias-shift"])
def test_a_model_that_does_not_load_is_named_as_the_user_typed_it(tmp_path, capsys, command):
    """`--model X` was answered `model: ...`, a name the user never typed; MODEL typed positionally stays `model:`,
    as the eval commands say it."""
    missing = str(tmp_path / "missing")
    rest = ["--prompt", "x"] if command == "generate" else ["--source", "builtin:pydoc"]
    for given, said in ((["--model", missing], "--model"), ([missing], "model")):
        assert main([command, *given, *rest, "--device", "cpu", "--no-progress"]) == 2
        assert capsys.readouterr().err.splitlines()[-1].startswith(f"error: {said}: {missing!r} is not a directory")


def test_generate_errors_are_clear(hf_dir, capsys):
    assert main(["generate", "--model", hf_dir, "--tokenizer", "bytes", "--device", "cpu"]) == 2
    assert "--prompt" in capsys.readouterr().err
    assert main(["generate", "--model", hf_dir, "--prompt", "x", "--top-p", "2", "--tokenizer", "bytes",
                 "--device", "cpu"]) == 2
    assert "--top-p" in capsys.readouterr().err


@pytest.mark.parametrize("flag, value, said", [
    pytest.param("--top-p", "0", "--top-p: expected a number in (0, 1], got 0.0; leave it out (or 1) for no nucleus "
                 "sampling", id="top-p-zero"),
    pytest.param("--top-k", "-1", "--top-k: expected an integer >= 0, got -1; leave it out (or 0) to sample from "
                 "every token", id="top-k-negative"),
    pytest.param("--prefill-chunk", "0", "--prefill-chunk: expected a positive integer, got 0; leave it out to read "
                 "the prompt in one forward", id="prefill-chunk-zero"),
    pytest.param("--evict-eps", "2", "--evict-eps: expected a number in (0, 1), got 2.0", id="evict-eps-two"),
    pytest.param("--evict-qk-bound", "-1", "--evict-qk-bound: expected a finite number >= 0, got -1.0",
                 id="evict-qk-bound-negative"),
    # "--evict-max-len must be a positive int": the models layer's words, beside "--evict-max-len: expected ..."
    pytest.param("--evict-max-len", "0", "--evict-max-len: expected a positive integer, got 0",
                 id="evict-max-len-zero"),
])
def test_generate_names_a_bad_setting_by_its_flag_without_offering_none(tmp_path, capsys, flag, value, said):
    """`--top-p 0` said "top_p: expected a number in (0, 1] or None": a field name, and a value no flag takes.
    Refused before the model loads (the model here does not exist)."""
    assert main(["generate", str(tmp_path / "no-model"), "--prompt", "x", flag, value]) == 2
    assert capsys.readouterr().err.splitlines() == [f"error: {said}"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="asks for a GPU this machine lacks")
@pytest.mark.parametrize("device", ["cuda", "cuda:0"])
def test_generate_on_a_missing_gpu_is_a_one_line_error(hf_dir, capsys, device):
    assert main(["generate", "--model", hf_dir, "--prompt", "x", "--tokenizer", "bytes", "--device", device]) == 2
    assert "no GPU is visible on this machine" in capsys.readouterr().err


@pytest.mark.parametrize("device", ["meta", "mps"])
@pytest.mark.parametrize("command", ["generate", "bench-decode"])
def test_a_device_type_the_code_does_not_run_on_is_a_one_line_error(hf_dir, tmp_path, capsys, command, device):
    """torch knows these names, so they passed the device check: 'meta' ended in a traceback from the first value
    a forward read back, 'mps' in torch's 'not linked with support for mps devices'."""
    args = (["generate", hf_dir, "--prompt", "x", "--tokenizer", "bytes"] if command == "generate" else
            ["bench", "decode", "--preset", "fox-pro-tiny", "--out", str(tmp_path / "b.json")])
    assert main(args + ["--device", device]) == 2
    err = capsys.readouterr().err
    assert err.splitlines()[-1] == f"error: --device: expected 'auto', 'cpu', 'cuda' or 'cuda:N', got '{device}'", err


@pytest.mark.parametrize("flag, said", [
    ("--dtype", "--dtype: expected one of auto, fp32, float32, bf16, bfloat16, fp16, float16, fp64, got 'foo'"),
    ("--device", "--device: expected 'auto', 'cpu', 'cuda' or 'cuda:N', got 'foo'"),
    ("--attention-backend", "--attention-backend: expected one of auto, gluon, triton, torch, naive, got 'foo'"),
])
@pytest.mark.parametrize("command", [["generate", "--prompt", "x"], ["bias-shift", "--source", "builtin:pydoc"]],
                         ids=["generate", "bias-shift"])
def test_a_bad_model_loading_flag_is_named_by_its_flag_before_the_model_loads(tmp_path, capsys, command, flag, said):
    """They said "dtype:", "device:" and "FoxConfig.attention_backend", names the user never typed, and --dtype's
    and --attention-backend's only once the weights had loaded (the model here does not exist)."""
    assert main([*command, str(tmp_path / "no-model"), flag, "foo"]) == 2
    assert capsys.readouterr().err.splitlines() == [f"error: {said}"]


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    """Another library's model: a tiny Llama saved by transformers."""
    from transformers import LlamaConfig, LlamaForCausalLM

    path = tmp_path_factory.mktemp("llama")
    LlamaForCausalLM(LlamaConfig(vocab_size=257, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                 num_attention_heads=2, num_key_value_heads=2)).save_pretrained(path)
    return str(path)


@pytest.mark.parametrize("command", [["generate", "--prompt", "x"], ["bias-shift", "--source", "builtin:pydoc"],
                                     ["eval", "loss", "--source", "builtin:pydoc"]],
                         ids=["generate", "bias-shift", "eval-loss"])
def test_an_attention_backend_for_another_librarys_model_is_refused_before_its_weights_load(llama_dir, capsys,
                                                                                           monkeypatch, command):
    """It passed the value check and was then dropped: the Llama ran its own attention without a word. bias-shift
    refuses it from its config first, for its missing forget gates."""
    import transformers

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained",
                        lambda *a, **k: pytest.fail("the weights loaded"))
    assert main([*command, llama_dir, "--tokenizer", "bytes", "--device", "cpu", "--attention-backend", "torch"]) == 2
    said = (f"bias-shift needs a foxformer model with forget gates (FoX); {llama_dir} is a llama model "
            f"(LlamaForCausalLM)" if command[0] == "bias-shift" else
            f"--attention-backend: only foxformer models have attention backends; {llama_dir} is a llama model; "
            f"leave it out for it")
    assert capsys.readouterr().err.splitlines() == [f"error: {said}"]


def test_load_model_names_its_attention_backend_keyword_for_another_librarys_model(llama_dir):
    from foxformer.train.loading import load_model

    with pytest.raises(ValueError) as exc:
        load_model(llama_dir, device="cpu", attention_backend="torch", progress=False)
    assert str(exc.value) == (f"attention_backend: only foxformer models have attention backends; {llama_dir} is a "
                              f"llama model; None for it")
    assert type(load_model(llama_dir, device="cpu", progress=False).model).__name__ == "LlamaForCausalLM"


def test_models_compared_under_one_attention_backend_give_it_to_the_foxformer_ones(hf_dir, llama_dir):
    """eval loads several models under one --attention-backend: a Llama beside FoX keeps its own attention."""
    from foxformer.train.loading import load_model

    fox, llama = (load_model(path, device="cpu", attention_backend="torch", progress=False, label="--{}",
                             among_others=True) for path in (hf_dir, llama_dir))
    assert fox.model.config.attention_backend == "torch"
    assert type(llama.model).__name__ == "LlamaForCausalLM"


def test_bias_shift_asks_for_its_text_before_the_model_loads(tmp_path, capsys):
    assert main(["bias-shift", str(tmp_path / "no-model")]) == 2
    assert capsys.readouterr().err.splitlines() == ["error: pass exactly one of --data DIR (prepared dataset) and "
                                                    "--source SPEC (text)"]


def test_bias_shift_reads_the_runs_dataset_as_eval_loss_does(hf_dir, tmp_path, capsys):
    """`eval loss RUN` took the run's dataset when given no text; `bias-shift RUN` said to pass --data or --source."""
    from foxformer.data import PrepareConfig, prepare

    docs = tmp_path / "docs.jsonl"
    docs.write_text("".join(json.dumps({"text": f"doc {i}: " + "the quick brown fox " * 20}) + "\n" for i in range(20)))
    data = str(tmp_path / "data")
    prepare(PrepareConfig(sources=[str(docs)], out_dir=data, tokenizer="bytes", val_fraction=0.2), progress=False)
    run = tmp_path / "run"
    shutil.copytree(hf_dir, run / "hf")
    (run / "config.yaml").write_text(f"data_dir: {data}\ntokenizer: bytes\ncontext: 32\n")
    for model in (run, run / "hf"):
        out = tmp_path / f"{model.name}.json"
        assert main(["bias-shift", str(model), "--seq-len", "64", "--num-seqs", "2", "--shifts", "0,1", "--bins", "2",
                     "--device", "cpu", "--no-progress", "--out", str(out)]) == 0
        assert f"note: --data {data} (the dataset the run trained on; its val split)" in capsys.readouterr().err
        assert json.loads(out.read_text())["data"] == data
    assert main(["bias-shift", hf_dir, "--no-progress"]) == 2  # no run, so no dataset of its own
    assert capsys.readouterr().err.splitlines()[-1].startswith("error: pass exactly one of --data DIR")


def test_bias_shift_command(hf_dir, tmp_path, capsys):
    src = tmp_path / "doc.txt"
    src.write_text("The quick brown fox jumps over the lazy dog. " * 4)
    out = tmp_path / "shift.json"
    rc = main(["bias-shift", "--model", hf_dir, "--tokenizer", "bytes", "--source", str(src), "--seq-len", "64",
               "--num-seqs", "1", "--train-len", "32", "--shifts", "0,1", "--bins", "4", "--device", "cpu",
               "--no-progress", "--out", str(out)])
    assert rc == 0
    data = json.loads(out.read_text())
    assert data["shifts"] == [0.0, 1.0] and data["loss_beyond"][1] is not None
    assert (tmp_path / "shift.png").exists()


@pytest.mark.parametrize("option, value, said", [
    pytest.param("--train-len", "0", "--train-len: expected the training context, a positive number of tokens, "
                                     "got 0", id="train-len-zero"),
])
def test_bias_shift_refuses_settings_it_would_misread(hf_dir, tmp_path, capsys, option, value, said):
    """--bins 0 wrote a result and a plot without a single bin; --train-len 0 or -5 was read as no training length,
    every position counted as within it."""
    src = tmp_path / "doc.txt"
    src.write_text("The quick brown fox jumps over the lazy dog. " * 4)
    out = tmp_path / "shift.json"
    assert main(["bias-shift", hf_dir, "--tokenizer", "bytes", "--source", str(src), "--seq-len", "64", "--num-seqs",
                 "1", "--device", "cpu", "--no-progress", "--out", str(out), option, value]) == 2
    assert capsys.readouterr().err.splitlines()[-1] == f"error: {said}"
    assert not out.exists()


def test_bias_shift_takes_token_counts_as_eval_does(hf_dir, tmp_path, capsys):
    """--seq-len 4Ki, which eval loss takes, was refused: "invalid int value: '4Ki'"."""
    src = tmp_path / "doc.txt"
    src.write_text("The quick brown fox jumps over the lazy dog. " * 30)
    out = tmp_path / "shift.json"
    assert main(["bias-shift", hf_dir, "--tokenizer", "bytes", "--source", str(src), "--seq-len", "1Ki", "--num-seqs",
                 "1", "--train-len", "0.5Ki", "--shifts", "0", "--bins", "2", "--device", "cpu", "--no-progress",
                 "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["seq_len"] == 1024 and data["train_len"] == 512
    with pytest.raises(SystemExit):  # a negative count is refused as eval's --train-len refuses it, while parsed
        main(["bias-shift", hf_dir, "--train-len", "-5"])
    assert "argument --train-len: expected a token count such as 4096 or 4Ki, got '-5'" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["0", "-3", "two"])
def test_bias_shift_refuses_bins_as_the_flag_is_read(tmp_path, capsys, value):
    """--bins 0 was refused as "bins:" (the API's keyword), and only after the model and the data had loaded."""
    with pytest.raises(SystemExit) as e:
        main(["bias-shift", str(tmp_path / "no-model"), "--source", "builtin:pydoc", "--bins", value])
    assert e.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1].endswith(
        f"error: argument --bins: expected a positive integer, got '{value}'")


@pytest.mark.parametrize("value", ["nan", "0,inf", "0,-inf"])
def test_bias_shift_refuses_non_finite_shifts_as_the_flag_is_read(tmp_path, capsys, value):
    """--shifts nan was refused as "fgate_bias_shift must be finite", a name the user never typed, and only after the
    model and the data had loaded."""
    with pytest.raises(SystemExit) as e:
        main(["bias-shift", str(tmp_path / "no-model"), "--source", "builtin:pydoc", "--shifts", value])
    assert e.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1].endswith(
        f"error: argument --shifts: expected finite numbers, got '{value}'")


def test_a_per_layer_fgate_bias_shift_with_an_empty_item_is_refused_as_shifts_are(tmp_path, capsys):
    """"1,,2" read as [1, 2]: the value the typo lost went unnoticed wherever the model has two layers."""
    with pytest.raises(SystemExit):
        main(["generate", str(tmp_path / "no-model"), "--prompt", "x", "--fgate-bias-shift", "1,,2"])
    assert "argument --fgate-bias-shift: empty item in '1,,2'" in capsys.readouterr().err


def test_bias_shift_and_generate_take_the_model_as_eval_does_or_as_the_flag(hf_dir, tmp_path, capsys):
    """`eval loss RUN` and `analyze gates RUN` take the model positionally; bias-shift and generate took only
    --model RUN. Both forms work now; two different models are refused before the work."""
    src = tmp_path / "doc.txt"
    src.write_text("The quick brown fox jumps over the lazy dog. " * 4)
    common = ["--tokenizer", "bytes", "--source", str(src), "--seq-len", "64", "--num-seqs", "1", "--shifts", "0,1",
              "--bins", "2", "--device", "cpu", "--no-progress"]
    positional, flag = tmp_path / "positional.json", tmp_path / "flag.json"
    assert main(["bias-shift", hf_dir, *common, "--out", str(positional)]) == 0
    assert main(["bias-shift", *common, "--model", hf_dir, "--out", str(flag)]) == 0
    runs = [json.loads(path.read_text()) for path in (positional, flag)]
    assert runs[0]["model"] == runs[1]["model"] == hf_dir and runs[0]["loss_within"] == runs[1]["loss_within"]
    gen = ["--tokenizer", "bytes", "--prompt", "Once", "--max-new-tokens", "3", "--temperature", "0", "--device", "cpu"]
    assert main(["generate", hf_dir, *gen, "--model", hf_dir + os.sep]) == 0  # the same model twice: fine
    capsys.readouterr()
    assert main(["bias-shift", hf_dir, *common, "--model", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"error: two models given, {hf_dir} and --model {tmp_path}: pass one"
    assert main(["generate", *gen]) == 2
    assert capsys.readouterr().err.strip().startswith("error: no model given: pass MODEL")
    assert not (tmp_path / "bias_shift.json").exists()


def test_bias_shift_writes_under_runs_eval_unless_told(hf_dir, tmp_path, monkeypatch):
    """It wrote bias_shift.json and .png into the current folder, unlike every other eval command."""
    src = tmp_path / "doc.txt"
    src.write_text("The quick brown fox jumps over the lazy dog. " * 4)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    assert main(["bias-shift", "--model", hf_dir, "--tokenizer", "bytes", "--source", str(src), "--seq-len", "64",
                 "--num-seqs", "1", "--shifts", "0", "--bins", "2", "--device", "cpu", "--no-progress"]) == 0
    assert sorted(os.listdir(work)) == ["runs"]
    assert all((work / "runs" / "eval" / f"bias_shift.{ext}").exists() for ext in ("json", "png"))


def test_bias_shift_plot_keeps_its_legend_off_the_curves(monkeypatch, tmp_path):
    """The legend sat inside the axes, over the curves."""
    from foxformer.eval.plots import plt
    from foxformer.infer.cli import _plot_bias_shift

    figures = []
    monkeypatch.setattr("foxformer.eval.plots.save_figure", lambda fig, path: figures.append(fig))
    shifts = [0.0, 0.5, 1.0, 2.0]
    _plot_bias_shift({"shifts": shifts, "train_len": 256, "bin_edges": [0, 256, 512, 768, 1023],
                      "binned_loss": [[3.6 - s / 10, 3.3, 3.1, 3.0] for s in shifts]}, str(tmp_path / "shift.png"))
    (fig,) = figures
    fig.canvas.draw()
    (ax,) = fig.axes
    entries, legend = len(ax.get_legend().get_texts()), ax.get_legend().get_window_extent()
    inside, whole = ax.get_window_extent(), fig.get_window_extent()
    plt.close(fig)
    assert entries == len(shifts) + 1  # the training length too
    assert not legend.overlaps(inside)
    assert whole.contains(legend.x1, legend.y1)  # on the figure: drawn whole


def test_bias_shift_help_says_what_it_measures_and_writes(capsys):
    """Its help had a usage line and the flags, not a word on what the command does."""
    with pytest.raises(SystemExit) as e:
        main(["bias-shift", "--help"])
    assert e.value.code == 0
    text = capsys.readouterr().out
    description = " ".join(text.split("\n\n")[1].split())  # the paragraph between the usage and the arguments
    assert "shifting the forget-gate bias" in description and "loss" in description
    assert "Writes bias_shift.json" in description and "bias_shift.png" in description


@pytest.mark.parametrize("kind", ["transformer", "llama"])
def test_bias_shift_refuses_a_model_without_forget_gates_before_its_data_loads(llama_dir, tmp_path, monkeypatch,
                                                                               capsys, kind):
    """A Transformer failed as "fgate_bias_shift: layer 0 has no forget gate", after the data had loaded and the
    zero shift's pass had run."""
    if kind == "transformer":
        model = str(tmp_path / "transformer")
        make_model("transformer-pro-tiny", dtype=torch.float32).save_pretrained(model)
        said = (f"bias-shift needs a model with forget gates (FoX), whose bias it shifts; {model} is a Transformer "
                f"without them (attention='softmax', fgate='none')")
    else:
        model = llama_dir
        said = (f"bias-shift needs a foxformer model with forget gates (FoX); {model} is a llama model "
                f"(LlamaForCausalLM)")
    monkeypatch.setattr("foxformer.infer.cli._eval_tokens", lambda *a, **k: pytest.fail("the data loaded"))
    assert main(["bias-shift", model, "--tokenizer", "bytes", "--source", "builtin:pydoc", "--device", "cpu",
                 "--no-progress", "--out", str(tmp_path / "shift.json")]) == 2
    assert capsys.readouterr().err.splitlines()[-1] == f"error: {said}"
    assert not (tmp_path / "shift.json").exists()


@pytest.mark.parametrize("kind", ["transformer", "llama"])
@pytest.mark.parametrize("where", ["folder", "hub", "flag"])
def test_bias_shift_refuses_a_model_without_forget_gates_from_its_config(llama_dir, tmp_path, monkeypatch, capsys,
                                                                          kind, where):
    """The gates were checked once the model had loaded: a Hub id's weights downloaded first. Its config.json alone
    now tells (a Hub id's downloaded alone), and the weights are never read."""
    import foxformer.train.loading as loading

    folder = tmp_path / kind
    if kind == "transformer":
        make_model("transformer-pro-tiny", dtype=torch.float32).save_pretrained(folder)
    else:
        shutil.copytree(llama_dir, folder)
    asked = []

    def download(repo, files=None):
        asked.append((repo, files))
        hub = tmp_path / "hub"
        hub.mkdir(exist_ok=True)
        shutil.copy(folder / "config.json", hub)  # the config, and nothing the weights would need
        return str(hub)

    monkeypatch.setattr(loading, "download", download)
    monkeypatch.setattr(loading, "load_model", lambda *a, **k: pytest.fail("the model loaded"))
    monkeypatch.chdir(tmp_path)
    given = {"folder": str(folder), "hub": f"me/{kind}-no-such-folder", "flag": str(folder)}[where]
    said = {"transformer": f"bias-shift needs a model with forget gates (FoX), whose bias it shifts; {given} is a "
                           f"Transformer without them (attention='softmax', fgate='none')",
            "llama": f"bias-shift needs a foxformer model with forget gates (FoX); {given} is a llama model "
                     f"(LlamaForCausalLM)"}[kind]
    model = ["--model", given] if where == "flag" else [given]
    assert main(["bias-shift", *model, "--source", "builtin:pydoc", "--no-progress",
                 "--out", str(tmp_path / "shift.json")]) == 2
    assert capsys.readouterr().err.splitlines()[-1] == f"error: {said}"
    assert asked == ([(given, ["config.json"])] if where == "hub" else [])


@pytest.mark.parametrize("flag", [False, True])
def test_bias_shift_says_why_a_hub_ids_config_cannot_be_read_as_loading_does(tmp_path, monkeypatch, capsys, flag):
    import foxformer.train.loading as loading

    asked = []

    def download(repo, files=None):
        asked.append(files)
        raise OSError(f"the Hub download of {repo} failed (ConnectionError: no route)")

    monkeypatch.setattr(loading, "download", download)
    monkeypatch.setattr(loading, "load_model", lambda *a, **k: pytest.fail("the model loaded"))
    monkeypatch.chdir(tmp_path)
    assert main(["bias-shift", *(["--model"] if flag else []), "me/fox", "--source", "builtin:pydoc"]) == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"error: {'--model' if flag else 'model'}: 'me/fox' is no local folder, and the Hub download of me/fox failed "
        f"(ConnectionError: no route); download it where the Hub is reachable and pass its path")
    assert asked == [["config.json"]]


def test_bias_shift_checks_a_fox_config_and_leaves_the_rest_to_the_loaded_model(hf_dir, tmp_path):
    """What the config cannot tell is checked once the model loads: no config to read, one FoxConfig refuses."""
    from foxformer.infer.bias_shift import check_saved_forget_gates
    from foxformer.train.loading import saved_config

    saved = saved_config(hf_dir)
    assert (saved["model_type"], saved["attention"], saved["fgate"]) == ("foxformer", "forgetting", "data_dependent")
    check_saved_forget_gates(saved, "bias-shift")
    check_saved_forget_gates(None, "bias-shift")
    check_saved_forget_gates({**saved, "num_heads": 0}, "bias-shift")  # refused by FoxConfig: the load says so
    with pytest.raises(ValueError, match="the model is a Transformer without them"):
        check_saved_forget_gates({**saved, "attention": "softmax", "fgate": "none"}, "bias-shift")
    assert saved_config(str(tmp_path / "no-model")) is None


def test_a_runs_saved_config_is_its_model_config(tmp_path):
    """A run dir and its checkpoints: the FoxConfig fields the run saved (model_config.json), read without the
    checkpoint's weights; a run from before it saved them has none to read."""
    from foxformer.models import get_preset
    from foxformer.train.config import write_model_config
    from foxformer.train.loading import saved_config

    run = tmp_path / "run"
    step = run / "checkpoints" / "step_4"
    step.mkdir(parents=True)
    (run / "config.yaml").write_text("preset: transformer-pro-tiny\n")
    (step / "model.pt").write_text("")  # never read
    assert saved_config(str(run)) is None and saved_config(str(step)) is None
    write_model_config(str(run), get_preset("transformer-pro-tiny", vocab_size=257))
    for path in (run, step):
        saved = saved_config(str(path))
        assert (saved["model_type"], saved["attention"], saved["fgate"]) == ("foxformer", "softmax", "none")


def test_bias_shift_refuses_a_file_where_its_default_out_goes_before_the_sweep(hf_dir, tmp_path, monkeypatch,
                                                                                capsys):
    """runs/eval, known once the model loads, was found to be a file after the whole sweep."""
    src = tmp_path / "doc.txt"
    src.write_text("The quick brown fox jumps over the lazy dog. " * 4)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "eval").write_text("")
    monkeypatch.setattr("foxformer.infer.bias_shift.bias_shift_sweep", lambda *a, **k: pytest.fail("swept"))
    assert main(["bias-shift", "--model", hf_dir, "--tokenizer", "bytes", "--source", str(src), "--seq-len", "64",
                 "--num-seqs", "1", "--shifts", "0", "--bins", "2", "--device", "cpu", "--no-progress"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"error: --out: {str(tmp_path / 'runs' / 'eval')!r} is a file, not a folder: choose another location")


def test_bench_decode_tiny(tmp_path):
    out = tmp_path / "bench.json"
    rc = main(["bench", "decode", "--preset", "fox-pro-tiny", "--vocab-size", "257", "--contexts", "48",
               "--batches", "2", "--steps", "12", "--warmup", "1", "--prefill-chunk", "32", "--device", "cpu",
               "--out", str(out)])
    assert rc == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["model"] for r in rows] == ["fox", "fox+evict", "llama-sdpa"]
    evict = rows[1]
    assert evict["tokens_per_s"] > 0 and evict["kept_fraction"] < 1 and evict["max_logprob_diff"] < 1e-2
    assert rows[0]["kept_fraction"] == 1
    # 12 streamed steps: 10 intervals between 11 tokens (the first token's wait has no predecessor)
    assert all(r["ms_per_token_streamed"] > 0 and r["ms_per_token_streamed_p90"] >= r["ms_per_token_streamed"]
               for r in rows)


def test_bench_decode_no_progress_draws_no_bar(tmp_path, capsys):
    rc = main(["bench", "decode", "--preset", "fox-pro-tiny", "--vocab-size", "257", "--contexts", "48",
               "--batches", "1", "--steps", "2", "--warmup", "1", "--prefill-chunk", "32", "--device", "cpu",
               "--no-baseline", "--decode", "eager", "--no-progress", "--out", str(tmp_path / "b.json")])
    assert rc == 0
    assert "bench decode:" not in capsys.readouterr().err


def test_bench_decode_profile_writes_where_the_step_time_goes(tmp_path):
    """--profile: a few more steps per row under torch.profiler, their operator table in DIR; the timed steps and
    the row are those of a run without it."""
    args = ["bench", "decode", "--preset", "fox-pro-tiny", "--vocab-size", "257", "--contexts", "48", "--batches", "1",
            "--steps", "2", "--warmup", "1", "--prefill-chunk", "32", "--device", "cpu", "--no-baseline",
            "--decode", "eager", "--no-progress"]
    assert main(args + ["--profile", str(tmp_path / "prof"), "--out", str(tmp_path / "p.json")]) == 0
    tables = sorted(p.name for p in (tmp_path / "prof").iterdir())
    assert tables == ["fox_eager_48_b1.trace.json.gz", "fox_eager_48_b1.txt",
                      "fox_evict_eager_48_b1.trace.json.gz", "fox_evict_eager_48_b1.txt"]
    text = (tmp_path / "prof" / "fox_eager_48_b1.txt").read_text()
    assert "Self CPU" in text and "aten::" in text
    # the timeline beside the table: Chrome trace events of the same steps
    with gzip.open(tmp_path / "prof" / "fox_eager_48_b1.trace.json.gz", "rt") as f:
        events = json.load(f)["traceEvents"]
    assert any(str(e.get("name", "")).startswith("aten::") for e in events)
    assert main(args + ["--out", str(tmp_path / "plain.json")]) == 0
    with_profile, plain = (json.loads((tmp_path / f).read_text())["rows"][0] for f in ("p.json", "plain.json"))
    assert with_profile["decode"] == plain["decode"] == "eager" and with_profile["steps"] == plain["steps"] == 2


def test_bench_decode_profile_and_kernel_mode_do_not_mix(tmp_path, capsys):
    assert main(["bench", "decode", "--kernel", "--profile", str(tmp_path), "--device", "cpu",
                 "--out", str(tmp_path / "k.json")]) == 2
    assert "error: --profile" in capsys.readouterr().err


def test_bench_decode_is_also_top_level():
    from foxformer.cli import build_parser

    args = build_parser().parse_args(["bench-decode", "--contexts", "4096,65536", "--batches", "1,32"])
    assert args.contexts == [4096, 65536] and args.batches == [1, 32] and callable(args.func)


def test_bench_decode_kernel_mode(tmp_path):
    out = tmp_path / "k.json"
    assert main(["bench", "decode", "--kernel", "--preset", "fox-pro-tiny", "--contexts", "64", "--batches", "1",
                 "--num-splits", "2,4", "--device", "cpu", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert rows[0]["fox_ms"] > 0 and rows[0]["sdpa_ms"] > 0
    assert [r["splits"] for r in rows] == ["auto", 2, 4] and all(r["fox_ms"] > 0 for r in rows)


def test_bench_decode_kernel_mode_refuses_a_linear_preset(tmp_path):
    """--kernel times the FoX decode op over cached keys: for a linear-pro preset that is another model's op."""
    out = tmp_path / "k.json"
    with pytest.raises(SystemExit, match="--kernel.*linear-pro-tiny.*recurrent state"):
        main(["bench", "decode", "--kernel", "--preset", "linear-pro-tiny", "--contexts", "64", "--batches", "1",
              "--device", "cpu", "--out", str(out)])
    assert not out.exists()


@pytest.mark.parametrize("make_path", [pytest.param(lambda tmp: tmp, id="prompt-file-is-a-directory")])
def test_generate_unreadable_prompt_file_is_a_clear_error(hf_dir, tmp_path, capsys, make_path):
    rc = main(["generate", "--model", hf_dir, "--tokenizer", "bytes", "--prompt-file", str(make_path(tmp_path)),
               "--device", "cpu"])
    assert rc == 2
    assert capsys.readouterr().err.startswith("error: ")


@pytest.mark.parametrize("n", [pytest.param(0, id="zero-new-tokens"), pytest.param(3, id="three-new-tokens"),
                               pytest.param(9, id="nine-new-tokens")])
def test_generate_reports_the_number_of_tokens_generated(hf_dir, tmp_path, capsys, n):
    # an untrained byte-level model emits bytes that are not UTF-8: the text re-encodes to more tokens
    out = tmp_path / "gen.json"
    assert main(["generate", "--model", hf_dir, "--tokenizer", "bytes", "--prompt", "abc", "--max-new-tokens",
                 str(n), "--temperature", "1", "--seed", "0", "--ignore-eos", "--device", "cpu",
                 "--out", str(out)]) == 0
    assert json.loads(out.read_text())["new_tokens"] == n
    assert f"[{n} tokens in" in capsys.readouterr().err


@pytest.mark.parametrize("stream", [pytest.param([], id="streamed"), pytest.param(["--no-stream"], id="no-stream")])
def test_generate_of_no_new_tokens_prints_no_empty_line(hf_dir, capsys, stream):
    """`--max-new-tokens 0` printed a bare empty line, as if the model had written a line break."""
    assert main(["generate", "--model", hf_dir, "--tokenizer", "bytes", "--prompt", "abc", "--max-new-tokens", "0",
                 "--device", "cpu", *stream]) == 0
    captured = capsys.readouterr()
    assert captured.out == ""
    assert re.match(r"\[0 tokens in \d+\.\d\d s, as --max-new-tokens 0 asks\]", captured.err.splitlines()[-1])


class _Piped(io.StringIO):
    """One of the streams of `cmd 2>&1 | tee log`: its writes reach ``landed``, the pipe, in order. A buffered one
    (Python's stdout on a pipe) holds them until flushed; stderr passes each on at once."""

    def __init__(self, landed: list, buffered: bool):
        super().__init__()
        self.landed, self.buffered, self.held = landed, buffered, []

    def write(self, text):
        (self.held if self.buffered else self.landed).append(text)
        return len(text)

    def flush(self):
        self.landed += self.held
        self.held.clear()


@pytest.mark.parametrize("stream", [pytest.param([], id="streamed"), pytest.param(["--no-stream"], id="no-stream")])
def test_generate_piped_with_its_stderr_ends_the_text_before_the_summary(hf_dir, monkeypatch, stream):
    """`generate ... 2>&1 | tee log` glued the summary to the text's last line (the newline that ends it, and with
    --no-stream the whole text, still sat in stdout's buffer), and the newline came after it."""
    want = "".join(generate(_load_model(hf_dir), load_tokenizer("bytes"), "Once upon", max_new_tokens=6,
                            temperature=0, ignore_eos=True))
    landed = []
    monkeypatch.setattr(sys, "stdout", out := _Piped(landed, buffered=True))
    monkeypatch.setattr(sys, "stderr", _Piped(landed, buffered=False))
    assert main(["generate", "--model", hf_dir, "--tokenizer", "bytes", "--prompt", "Once upon", "--max-new-tokens",
                 "6", "--temperature", "0", "--ignore-eos", "--device", "cpu", "--no-progress", *stream]) == 0
    assert not out.held
    assert re.search(re.escape(want + "\n") + r"\[6 tokens in \d+\.\d\d s\][^\n]*\n$", "".join(landed))


@pytest.mark.parametrize("config_eps", [None, 0.5], ids=["config-without-evict-eps", "config-with-evict-eps"])
def test_bench_decode_plain_fox_row_keeps_every_key(config_eps):
    """The "fox" row (evict_eps None) is the no-eviction reference of max_logprob_diff; with evict_eps in the
    model config (a --model saved that way) it evicted as well."""
    from foxformer.bench.decode import measure_decode, realistic_gates

    model = make_model("fox-pro-tiny", dtype=torch.float32)
    realistic_gates(model, 2)  # every head forgets within a few tokens
    model.config.evict_eps = config_eps
    row = measure_decode(model, vocab=model.config.vocab_size, context=48, batch=1, steps=2, warmup=0,
                         evict_eps=None, prefill_chunk=32, device=torch.device("cpu"))
    assert row["kept_fraction"] == 1


@pytest.mark.parametrize("option, value", [
    pytest.param("--evict-eps", "0", id="evict-eps-zero"),
    pytest.param("--evict-eps", "1.5", id="evict-eps-above-one"),
    pytest.param("--evict-eps", "nan", id="evict-eps-nan"),
    pytest.param("--gate-tmax", "0", id="gate-tmax-zero"),
    pytest.param("--evict-qk-bound", "-1", id="evict-qk-bound-negative"),
])
def test_bench_decode_refuses_bad_numbers_up_front(tmp_path, capsys, option, value):
    """These ended in tracebacks after the models were built: 'evict_eps must be in (0, 1)' from
    eviction_delta, 'math domain error' from the realistic gates, IndexError on an empty batch."""
    args = ["bench", "decode", "--preset", "fox-pro-tiny", "--vocab-size", "257", "--contexts", "48",
            "--batches", "1", "--steps", "1", "--warmup", "0", "--device", "cpu", "--no-baseline",
            "--out", str(tmp_path / "b.json"), option, value]
    assert main(args) == 2
    assert f"error: {option}" in capsys.readouterr().err
    assert not (tmp_path / "b.json").exists()


@pytest.mark.parametrize("extra, said", [
    pytest.param(["--kernel", "--model", "MODEL"], "--kernel times the attention op at a preset's head shape",
                 id="kernel-with-a-model"),
    pytest.param(["--num-splits", "2"], "--num-splits sets the key splits of the decode op's rows under --kernel",
                 id="num-splits-without-kernel"),
    pytest.param(["--gates", "init", "--gate-tmax", "100"], "--gates init keeps the initial ones",
                 id="gate-tmax-with-init-gates"),
    pytest.param(["--model", "MODEL", "--gate-tmax", "100"], "a --model keeps its trained gates",
                 id="gate-tmax-with-a-model"),
])
def test_bench_decode_refuses_options_it_would_drop(hf_dir, tmp_path, capsys, extra, said):
    """Each was ignored without a word: --kernel with --model timed the op at the default preset's (125M) head shape,
    not the model's; --num-splits without --kernel and --gate-tmax on gates it does not set changed nothing."""
    args = ["bench", "decode", "--preset", "fox-pro-tiny", "--vocab-size", "257", "--contexts", "48", "--batches", "1",
            "--steps", "1", "--warmup", "0", "--device", "cpu", "--no-baseline", "--out", str(tmp_path / "b.json")]
    assert main(args + [hf_dir if a == "MODEL" else a for a in extra]) == 2
    assert said in capsys.readouterr().err.splitlines()[-1]
    assert not (tmp_path / "b.json").exists()


@pytest.mark.parametrize("extra, said", [
    pytest.param(["--vocab-size", "257"], "--vocab-size shapes the model built from a --preset; a --model keeps its "
                 "own vocabulary: leave it out", id="vocab-size"),
    pytest.param(["--gates", "init"], "--gates shapes the model built from a --preset; a --model keeps its trained "
                 "gates: leave it out", id="gates"),
    pytest.param(["--gates", "realistic", "--vocab-size", "257"], "--vocab-size and --gates shape the model built "
                 "from a --preset; a --model keeps its own vocabulary and its trained gates: leave them out",
                 id="both"),
    pytest.param(["--preset", "fox-pro-125m"], "--preset fox-pro-125m names the model to build, and --model MODEL is "
                 "the model to bench (the transformer baseline takes its block and size): pass one of them",
                 id="preset"),
])
def test_bench_decode_refuses_preset_settings_beside_a_model(hf_dir, tmp_path, capsys, extra, said):
    """--vocab-size and --gates (--gates init asked for the untrained gates) were dropped without a word beside
    --model, whose rows read as though they had been applied; --preset set only the block of the baseline, which
    follows the model's now."""
    args = ["bench", "decode", "--model", hf_dir, "--contexts", "48", "--batches", "1", "--steps", "1", "--warmup",
            "0", "--device", "cpu", "--no-baseline", "--out", str(tmp_path / "b.json")]
    assert main(args + extra) == 2
    assert capsys.readouterr().err.splitlines()[-1] == f"error: {said.replace('MODEL', hf_dir)}"
    assert not (tmp_path / "b.json").exists()


def test_bench_decode_records_the_preset_settings_it_filled_in(hf_dir, tmp_path):
    """--vocab-size and --gates default to None (so that a --model can tell them apart from given ones): a --preset
    run still records the values it ran with, a --model run none."""
    out = tmp_path / "b.json"
    common = ["bench", "decode", "--contexts", "32", "--batches", "1", "--steps", "1", "--warmup", "0",
              "--prefill-chunk", "32", "--device", "cpu", "--no-baseline", "--no-progress", "--out", str(out)]
    assert main(common + ["--preset", "fox-pro-tiny"]) == 0
    settings = json.loads(out.read_text())["settings"]
    assert settings["vocab_size"] == 50304 and settings["gates"] == "realistic"
    assert main(common + ["--model", hf_dir]) == 0
    settings = json.loads(out.read_text())["settings"]
    assert settings["vocab_size"] is None and settings["gates"] is None and settings["preset"] is None
    assert main(common) == 0  # --preset, like them, defaults to None: its default (a CPU's) is filled in
    assert json.loads(out.read_text())["settings"]["preset"] == "fox-pro-tiny"


def test_generate_with_a_tokenizer_larger_than_the_model_is_a_clear_error(hf_dir, capsys):
    # the byte-level model (257 ids) with GPT-2's tokenizer: "Hello" encodes to id 15496
    assert main(["generate", "--model", hf_dir, "--tokenizer", "gpt2", "--prompt", "Hello", "--max-new-tokens", "2",
                 "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert "error: input_ids: token id 15496" in err and "vocabulary of 257" in err


def test_an_evict_max_len_below_the_new_tokens_is_refused_before_the_model_loads(tmp_path, capsys):
    """It failed after the load, in the keyword's words ("evict_max_len: eviction is bounded for at most N = 2"):
    the cache is fed at least one prompt token and every new token but the last, so N < --max-new-tokens is
    wrong whatever the prompt (the model here does not exist)."""
    assert main(["generate", str(tmp_path / "no-model"), "--prompt", "x", "--evict-eps", "1e-4",
                 "--evict-max-len", "2"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "error: --evict-max-len: expected an integer >= 128, got 2; it bounds the tokens the cache holds: the prompt "
        "(at least one token) and every new token but the last (--max-new-tokens 128)"]


def test_generate_past_an_explicit_evict_max_len_is_a_clear_error(hf_dir, capsys):
    # "Once upon" is 9 byte tokens: with N = 5 the eviction bound was silently void
    assert main(["generate", "--model", hf_dir, "--tokenizer", "bytes", "--prompt", "Once upon", "--max-new-tokens",
                 "4", "--evict-eps", "1e-4", "--evict-max-len", "5", "--device", "cpu"]) == 2
    captured = capsys.readouterr()
    assert captured.err.splitlines()[-1] == (
        "error: --evict-max-len: expected an integer >= 12, got 5; it bounds the tokens the cache holds: the prompt "
        "(9 tokens) and every new token but the last (--max-new-tokens 4)") and captured.out == ""


def test_generate_with_a_huge_evict_max_len_sizes_the_cache_for_the_tokens_fed(hf_dir, tmp_path, capsys):
    """--evict-max-len 99999999999 sized each evicting layer's page table for N: memory grew until the process was
    killed. 12 tokens fed take one page per kv head and layer (tens of KiB); a table for N alone is GBs."""
    out = tmp_path / "gen.json"
    assert main(["generate", "--model", hf_dir, "--tokenizer", "bytes", "--prompt", "Once upon", "--max-new-tokens",
                 "4", "--evict-eps", "1e-4", "--evict-max-len", "99999999999", "--device", "cpu",
                 "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["settings"]["evict_max_len"] == 99999999999 and data["cache"]["allocated_bytes"] < 2**20


@pytest.mark.parametrize("option", ["--evict-qk-bound", "--evict-max-len"])
def test_an_eviction_bound_without_evict_eps_is_named_by_its_flag(hf_dir, capsys, option):
    """Said as "evict_max_len: it sets the bound ... give evict_eps (--evict-eps)": keywords the user did not type."""
    assert main(["generate", hf_dir, "--tokenizer", "bytes", "--prompt", "x", "--max-new-tokens", "2",
                 "--device", "cpu", option, "100"]) == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"error: {option}: it sets the bound of KV eviction, which runs only with --evict-eps (here or in the model's "
        f"config); give --evict-eps, e.g. 1e-3")


@pytest.mark.parametrize("preset, said", [
    pytest.param("transformer-pro-tiny", "KV eviction needs a forget gate (a FoX model); this model is a softmax "
                 "Transformer", id="softmax"),
    pytest.param("linear-pro-tiny", "KV eviction needs keys to evict; a gated linear attention model "
                 "(attention='linear') keeps a fixed-size recurrent state", id="linear"),
])
def test_evict_eps_on_a_model_that_cannot_evict_is_named_by_its_flag(tmp_path, capsys, preset, said):
    """The model's new_cache refused it as "evict_eps: ...", the keyword, to a user who typed --evict-eps; the Python
    API keeps naming the keyword."""
    path = tmp_path / preset
    make_model(preset, dtype=torch.float32).save_pretrained(path)
    assert main(["generate", str(path), "--tokenizer", "bytes", "--prompt", "x", "--max-new-tokens", "2",
                 "--device", "cpu", "--evict-eps", "1e-3"]) == 2
    assert capsys.readouterr().err.splitlines()[-1] == f"error: --evict-eps: {said}"
    with pytest.raises(ValueError) as caught:
        list(generate(_load_model(path), load_tokenizer("bytes"), "x", max_new_tokens=2, evict_eps=1e-3))
    assert str(caught.value) == f"evict_eps: {said}"


def test_evict_eps_on_fox_without_qk_norm_warns_in_the_flags_words(tmp_path, capsys):
    """The warning that no layer can evict told a `foxformer generate --evict-eps` user to pass evict_qk_bound, the
    keyword; the Python API keeps naming the keywords."""
    path = tmp_path / "fox-llama"
    make_model("fox-llama-tiny", dtype=torch.float32).save_pretrained(path)
    assert main(["generate", str(path), "--tokenizer", "bytes", "--prompt", "x", "--max-new-tokens", "2",
                 "--device", "cpu", "--no-progress", "--evict-eps", "1e-3"]) == 0
    assert ("warning: --evict-eps is set but no layer can evict: without QK-norm no bound on |q.k| is known; pass "
            "--evict-qk-bound (your bound on |q.k| * scale) to evict") in capsys.readouterr().err.splitlines()
    with pytest.warns(UserWarning, match=r"^evict_eps is set .* pass evict_qk_bound \("):
        list(generate(_load_model(path), load_tokenizer("bytes"), "x", max_new_tokens=2, evict_eps=1e-3))


def test_a_per_layer_fgate_bias_shift_of_the_wrong_length_is_named_by_its_flag(hf_dir, capsys):
    """Said as "fgate_bias_shift: expected ...", the keyword; the model (2 layers) is needed to tell."""
    assert main(["generate", hf_dir, "--tokenizer", "bytes", "--prompt", "x", "--device", "cpu",
                 "--fgate-bias-shift", "1,2,3"]) == 2
    assert capsys.readouterr().err.splitlines()[-1].startswith(
        "error: --fgate-bias-shift: expected a float, a list of 2 (one per layer)")


@pytest.mark.parametrize("value", ["nan", "0.5,inf"])
def test_a_non_finite_fgate_bias_shift_is_refused_as_the_flag_is_read(tmp_path, capsys, value):
    """"fgate_bias_shift must be finite" came from the gates, after the model loaded."""
    with pytest.raises(SystemExit) as e:
        main(["generate", str(tmp_path / "no-model"), "--prompt", "x", "--fgate-bias-shift", value])
    assert e.value.code == 2
    assert f"argument --fgate-bias-shift: expected finite numbers, got '{value}'" in capsys.readouterr().err


SHORT_N = {
    "max-position-embeddings-below-context": lambda cfg: setattr(cfg, "max_position_embeddings", 16),
    "config-evict-max-len-below-context": lambda cfg: setattr(cfg, "evict_max_len", 16),
}


@pytest.mark.parametrize("shorten", list(SHORT_N), ids=list(SHORT_N))
def test_bench_decode_evicts_for_the_length_it_decodes(shorten):
    """The fox+evict row took N from the model (max_position_embeddings or evict_max_len): a --model whose N is
    below context + steps evicted as if the sequence were N long, outside the eps tolerance it reports."""
    from foxformer.bench.decode import measure_decode, realistic_gates

    model = make_model("fox-pro-tiny", dtype=torch.float32, max_position_embeddings=80)
    realistic_gates(model, 48)
    run = dict(vocab=model.config.vocab_size, context=48, batch=1, steps=16, warmup=0, evict_eps=1e-3,
               prefill_chunk=32, device=torch.device("cpu"))
    want = measure_decode(model, **run)  # N = max_position_embeddings = 80 = context + 2 * steps (synced, streamed)
    SHORT_N[shorten](model.config)
    got = measure_decode(model, **run)
    assert got["evict_max_len"] == want["evict_max_len"] == 80
    assert 0 < got["kept_fraction"] == want["kept_fraction"] < 1


NO_OP_EVICTION = {
    "fox-without-qk-norm": ("fox-llama-tiny", "fox", "--evict-qk-bound"),
    "transformer-preset": ("transformer-pro-tiny", "transformer", "forget gate"),
    "linear-attention-preset": ("linear-pro-tiny", "linear", "recurrent state"),
}


@pytest.mark.parametrize("case", list(NO_OP_EVICTION), ids=list(NO_OP_EVICTION))
def test_bench_decode_marks_an_evict_row_that_cannot_evict(tmp_path, capsys, case):
    """With no bound on |q.k| (no QK-norm) or no forget gate the fox+evict row evicted nothing and reported
    kept_fraction 1 and max_logprob_diff 0 as if eviction were free."""
    preset, kind, reason = NO_OP_EVICTION[case]
    out = tmp_path / "bench.json"
    assert main(["bench", "decode", "--preset", preset, "--vocab-size", "257", "--contexts", "32", "--batches", "1",
                 "--steps", "2", "--warmup", "0", "--prefill-chunk", "32", "--device", "cpu", "--no-baseline",
                 "--out", str(out)]) == 0
    rows = {r["model"]: r for r in json.loads(out.read_text())["rows"]}
    assert rows[kind]["tokens_per_s"] > 0
    evict = rows[f"{kind}+evict"]
    assert reason in evict["skipped"] and "kept_fraction" not in evict and "max_logprob_diff" not in evict
    assert "tokens_per_s" not in evict and "ms_per_step" not in evict
    assert reason in capsys.readouterr().err


@pytest.mark.parametrize("preset, kind", [("fox-pro-tiny", "fox"), ("transformer-llama-tiny", "transformer"),
                                          ("linear-pro-tiny", "linear")])
def test_bench_decode_labels_rows_by_the_kind_of_model(tmp_path, preset, kind):
    """Every preset's rows were labelled "fox" / "fox+evict", Transformer and linear-attention ones too."""
    out = tmp_path / "bench.json"
    assert main(["bench", "decode", "--preset", preset, "--vocab-size", "257", "--contexts", "32", "--batches", "1",
                 "--steps", "2", "--warmup", "0", "--prefill-chunk", "32", "--device", "cpu",
                 "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["model"] for r in rows] == [kind, f"{kind}+evict", "llama-sdpa"]
    assert [r["preset"] for r in rows] == [preset, preset, "transformer-" + preset.split("-", 1)[1]]
    assert [r.get("evict_eps") for r in rows] == [None, 1e-3, None]
    assert ("skipped" in rows[1]) == (kind != "fox")


def test_bench_decode_evicts_without_qk_norm_given_a_bound(tmp_path):
    out = tmp_path / "bench.json"
    assert main(["bench", "decode", "--preset", "fox-llama-tiny", "--vocab-size", "257", "--contexts", "48",
                 "--batches", "1", "--steps", "4", "--warmup", "0", "--prefill-chunk", "32", "--device", "cpu",
                 "--no-baseline", "--evict-qk-bound", "1.0", "--out", str(out)]) == 0
    evict = json.loads(out.read_text())["rows"][1]
    assert evict["model"] == "fox+evict" and "skipped" not in evict and evict["kept_fraction"] < 1


def test_bench_decode_reports_the_median_step(monkeypatch):
    """One slow step (a host hiccup) must not move ms_per_step: it is the median of per-step times; the mean
    and the 90th percentile are reported beside it."""
    import foxformer.bench.decode_steps as bench
    from foxformer.models import FoxForCausalLM, get_preset

    durations = [0.010, 0.010, 0.010, 0.500, 0.010]
    # the prefill, then each step's start, the moment it is queued, and its end
    stamps = [0.0, 0.0] + [t for d in durations for t in (0.0, 0.004 if d < 0.1 else 0.3, d)]
    stamps += [1.0, 1.02, 1.04, 1.30]   # then tokens 1 to 4 of the streamed steps reaching the host
    monkeypatch.setattr(bench.time, "perf_counter", iter(stamps).__next__)
    model = FoxForCausalLM(get_preset("fox-pro-tiny", vocab_size=64)).eval()
    row = bench.measure_decode(model, vocab=64, context=8, batch=2, steps=5, warmup=1, evict_eps=None,
                               prefill_chunk=8, device=torch.device("cpu"))
    # the 90th percentile interpolates between the 4th and 5th of 5 (numpy's): the hiccup shows in the tail
    assert row["ms_per_step"] == pytest.approx(10.0) and row["ms_per_step_p90"] == pytest.approx(304.0)
    assert row["ms_per_step_mean"] == pytest.approx(108.0)
    assert row["tokens_per_s"] == pytest.approx(200.0)
    assert row["ms_host_per_step"] == pytest.approx(4.0)
    assert row["ms_per_token_streamed"] == pytest.approx(20.0)    # the 0.26 s hiccup does not move the median
    assert row["ms_per_token_streamed_p90"] == pytest.approx(212.0)  # but shows in the tail (20, 20, 260)


def test_bench_decode_anchor_matches_a_loaded_models_block_and_size():
    """With --model, the Llama anchor was built from --preset (fox-pro-125m by default) whatever the model's size;
    then from the model's size but still --preset's block: a FoX (LLaMA) model got a Transformer (Pro) baseline. It
    now takes the Transformer preset of the model's own block and (layers, hidden size), or none, saying why."""
    from foxformer.bench.decode import anchor_preset
    from foxformer.models import get_preset

    assert anchor_preset("fox-pro-760m") == ("transformer-pro-760m", None)
    assert anchor_preset("linear-pro-tiny") == ("transformer-pro-tiny", None)
    assert anchor_preset(None, get_preset("fox-llama-small")) == ("transformer-llama-small", None)
    assert anchor_preset(None, get_preset("fox-pro-360m")) == ("transformer-pro-360m", None)
    assert anchor_preset(None, get_preset("fox-pro-125m", num_layers=5)) == (None, "hidden_size 768 and 5 layers")
    assert anchor_preset(None, get_preset("fox-llama-tiny", qk_norm=True)) == (
        None, "a block with some of the Pro block's additions but not all")


def test_bench_decode_of_a_llama_block_model_runs_a_llama_block_baseline(tmp_path, capsys):
    """A FoX (LLaMA) --model was timed against a Transformer (Pro) baseline, the block of --preset's default."""
    model = tmp_path / "llama"
    make_model("fox-llama-tiny", dtype=torch.float32).save_pretrained(model)
    out = tmp_path / "bench.json"
    assert main(["bench", "decode", "--model", str(model), "--contexts", "32", "--batches", "1", "--steps", "2",
                 "--warmup", "0", "--prefill-chunk", "32", "--device", "cpu", "--no-progress", "--out",
                 str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [(r["model"], r["preset"]) for r in rows] == [("fox", None), ("fox+evict", None),
                                                         ("llama-sdpa", "transformer-llama-tiny")]
    odd = tmp_path / "odd"
    make_model("fox-llama-tiny", dtype=torch.float32, qk_norm=True).save_pretrained(odd)
    assert main(["bench", "decode", "--model", str(odd), "--contexts", "32", "--batches", "1", "--steps", "1",
                 "--warmup", "0", "--prefill-chunk", "32", "--device", "cpu", "--no-progress", "--out",
                 str(out)]) == 0
    assert [r["model"] for r in json.loads(out.read_text())["rows"]] == ["fox", "fox+evict"]
    assert (f"bench decode: {odd} has a block with some of the Pro block's additions but not all, which no "
            f"transformer preset has: no llama-sdpa anchor") in capsys.readouterr().err


@pytest.mark.parametrize("prompt", ["Hi", "a prompt of more than sixteen bytes"], ids=["decode-path", "prefill-path"])
@pytest.mark.parametrize("backend,said", [("bogus", "error: --attention-backend: expected one of auto, gluon, triton, "
                                                   "torch, naive, got 'bogus'"),
                                          ("triton", "error: backend='triton' needs CUDA tensors (or TRITON_INTERPRET=1 for CPU "
                                                      "tensors); use backend='torch' or 'auto'"),
                                          ("gluon", "error: backend='gluon': ")],
                         ids=["unknown", "triton-on-cpu", "gluon-on-cpu"])
def test_generate_checks_the_attention_backend_whatever_the_prompt_length(hf_dir, capsys, monkeypatch, prompt,
                                                                          backend, said):
    """Prompts of up to 16 tokens go through the decode op: an unknown backend ran the torch path silently and
    triton on CPU tensors ended in Triton's "0 active drivers" traceback, while longer prompts were refused. The
    refusal of triton on a CPU offered only Triton's interpreter (a debugging aid), not the backends a CPU runs.
    Gluon's short prompts (the decode op has no Gluon kernel: it decodes with the Triton one) were refused for
    triton, a backend the user never chose (under Triton's interpreter, which this suite runs in, they decoded).
    The interpreter stays on for Gluon: its module, imported after Triton's kernels were built under it, asserts."""
    if backend != "gluon":
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert main(["generate", "--model", hf_dir, "--tokenizer", "bytes", "--prompt", prompt, "--max-new-tokens", "2",
                 "--device", "cpu", "--dtype", "fp32" if backend == "bogus" else "bf16",
                 "--attention-backend", backend]) == 2
    err = capsys.readouterr().err
    assert said in err
    if backend == "gluon":  # the prefill's refusal, whatever the prompt's length
        assert "'triton'" not in err and err.rstrip().endswith("use backend='torch' or 'auto'"), err


def test_generate_checks_its_out_file_before_the_work(hf_dir, tmp_path, capsys):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    assert main(["generate", "--model", hf_dir, "--tokenizer", "bytes", "--prompt", "Hi", "--max-new-tokens", "2",
                 "--device", "cpu", "--out", str(blocker / "x.json")]) == 2
    captured = capsys.readouterr()
    assert "error: --out: " in captured.err and "is a file" in captured.err and captured.out == ""


def test_generate_records_the_stop_token_it_used_and_says_a_fallback_once(hf_dir, tmp_path, capsys):
    """--out said "stop_token": null for a run that stopped at the tokenizer's end of text; a fallback from CUDA
    graphs was printed twice (a UserWarning pointing into torch, then the summary line)."""
    out = tmp_path / "gen.json"
    assert main(["generate", "--model", hf_dir, "--tokenizer", "bytes", "--prompt", "Once", "--max-new-tokens", "3",
                 "--device", "cpu", "--decode", "auto", "--out", str(out)]) == 0
    assert json.loads(out.read_text())["settings"]["stop_token"] == 256
    assert capsys.readouterr().err.count("decoding eagerly") == 1


@pytest.mark.parametrize("decode", ["graphs", "compiled"])
def test_generate_refuses_cuda_graphs_on_a_cpu_before_the_model_loads(tmp_path, capsys, decode):
    """--decode graphs on a CPU decoded eagerly, said only on the summary line after the whole generation (the model
    here does not exist: the refusal comes first)."""
    assert main(["generate", str(tmp_path / "no-model"), "--prompt", "x", "--device", "cpu", "--decode",
                 decode]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"error: --decode: {decode!r} replays CUDA graphs, which need a CUDA device, and the model runs on cpu; use "
        f"'auto' (graphs where they can run, eager here), 'static' or 'eager'"]


def test_bias_shift_out_is_a_file_or_a_folder_checked_before_the_sweep(hf_dir, tmp_path, capsys):
    """A missing parent folder or a folder given as --out failed after the whole sweep."""
    src = tmp_path / "doc.txt"
    src.write_text("The quick brown fox jumps over the lazy dog. " * 4)
    common = ["bias-shift", "--model", hf_dir, "--tokenizer", "bytes", "--source", str(src), "--seq-len", "64",
              "--num-seqs", "3", "--train-len", "32", "--shifts", "0", "--bins", "4", "--device", "cpu",
              "--no-progress"]
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    assert main(common + ["--out", str(blocker / "x.json")]) == 2
    assert "error: --out: " in capsys.readouterr().err
    folder = tmp_path / "results"
    assert main(common + ["--out", str(folder)]) == 0
    data = json.loads((folder / "bias_shift.json").read_text())
    assert data["source"] == str(src) and data["num_seqs"] == 1
    assert (folder / "bias_shift.png").exists()
    out = capsys.readouterr()
    # as eval loss says it: in one word, where, and that a --source's documents give one window each
    assert (f"note: only 1 sequence of 64 tokens in {src} (--num-seqs 3); each document that long gives one; a "
            f"shorter --seq-len lets more documents in") in out.err
    assert f"wrote {folder / 'bias_shift.json'} and {folder / 'bias_shift.png'}" in out.out
    assert main(common + ["--out", str(folder)]) == 0
    assert f"note: replacing {folder / 'bias_shift.json'} (written " in capsys.readouterr().err


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "no-stream"])
def test_generate_interrupted_keeps_the_text_so_far(hf_dir, tmp_path, capsys, monkeypatch, stream):
    """Ctrl-C left the streamed line unended, printed no --no-stream text at all and wrote no --out: now the
    generation ends as it would at its end (text, newline, summary line, --out marked interrupted), exit code 130."""
    from foxformer.infer import generation as module
    real = module.generate

    def stopped(*args, **kwargs):
        for i, piece in enumerate(real(*args, **kwargs)):
            if i == 5:
                raise KeyboardInterrupt
            yield piece

    monkeypatch.setattr(module, "generate", stopped)
    out = tmp_path / "gen.json"
    args = ["generate", "--model", hf_dir, "--tokenizer", "bytes", "--prompt", "Once upon", "--max-new-tokens", "12",
            "--temperature", "0", "--ignore-eos", "--device", "cpu", "--out", str(out)]
    assert main(args + ([] if stream else ["--no-stream"])) == 130
    captured = capsys.readouterr()
    data = json.loads(out.read_text())
    whole = real(_load_model(hf_dir), load_tokenizer("bytes"), "Once upon", max_new_tokens=12, temperature=0,
                 ignore_eos=True)
    want = "".join(itertools.islice(whole, 5))
    assert captured.out == want + "\n" and data["text"] == want and data["interrupted"] is True
    lines = captured.err.splitlines()
    assert lines[-2].startswith(f"[{data['new_tokens']} tokens in") and lines[-1] == "interrupted"


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "no-stream"])
def test_generate_interrupted_prints_the_text_held_back_for_a_stop_string(hf_dir, tmp_path, capsys, monkeypatch,
                                                                          stream):
    """With a stop string, Ctrl-C dropped the text held back as it might begin one, though it was generated: now
    it is printed, the line ended, and the command exits as interrupted (130)."""
    from foxformer.infer import generation as module
    common = ["generate", "--model", hf_dir, "--tokenizer", "bytes", "--prompt", "Once upon", "--temperature", "0",
              "--ignore-eos", "--device", "cpu"]
    assert main(common + ["--max-new-tokens", "6", "--no-stream"]) == 0
    so_far = capsys.readouterr().out[:-1]
    real = module.stream_tokens

    def interrupted(*args, **kwargs):  # Ctrl-C while the seventh token is generated
        yield from itertools.islice(real(*args, **kwargs), 6)
        raise KeyboardInterrupt

    monkeypatch.setattr(module, "stream_tokens", interrupted)
    out = tmp_path / "gen.json"
    stop = so_far[-2:] + "\u2603"  # its start ends the text so far, so that is held back; it never completes
    args = common + ["--max-new-tokens", "12", "--stop", stop, "--out", str(out)]
    assert main(args + ([] if stream else ["--no-stream"])) == 130
    captured = capsys.readouterr()
    assert len(so_far) >= 2 and captured.out == so_far + "\n" and captured.err.splitlines()[-1] == "interrupted"
    data = json.loads(out.read_text())
    assert data["text"] == so_far and data["interrupted"] is True and data["new_tokens"] == 6


def test_generate_interrupted_while_printing_still_prints_the_text_held_back(hf_dir, capsys, monkeypatch):
    """Ctrl-C while a piece is printed (not while the stream runs): the interrupt is thrown into the stream, which
    hands out what it held back."""
    import sys

    from foxformer.infer import generation as module

    def scripted(*args, **kwargs):
        yield from (torch.tensor([byte]) for byte in b"Hello world")

    class Terminal:  # Ctrl-C right after the third piece is printed
        def __init__(self, real):
            self.real, self.pieces = real, 0

        def write(self, text):
            self.real.write(text)
            self.pieces += 1
            if self.pieces == 3:
                raise KeyboardInterrupt

        def flush(self):
            self.real.flush()

    monkeypatch.setattr(module, "stream_tokens", scripted)
    monkeypatch.setattr(sys, "stdout", Terminal(sys.stdout))
    assert main(["generate", "--model", hf_dir, "--tokenizer", "bytes", "--prompt", "x", "--max-new-tokens", "20",
                 "--device", "cpu", "--stop", "l!"]) == 130
    # "H", "e", then "l" as the second "l" came (which, held back, may begin "l!"), printed as "Hell" after Ctrl-C
    assert capsys.readouterr().out == "Hell\n"


def test_generate_interrupted_before_the_first_token_still_ends_as_interrupted(hf_dir, tmp_path, capsys,
                                                                              monkeypatch):
    """Ctrl-C while generate() sets up (before the stream is asked for a token): the summary, an --out marked
    interrupted and exit 130, as an interrupt later does."""
    from foxformer.infer import generation as module

    def setting_up(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(module, "generate", setting_up)
    out = tmp_path / "gen.json"
    assert main(["generate", "--model", hf_dir, "--tokenizer", "bytes", "--prompt", "x", "--max-new-tokens", "4",
                 "--device", "cpu", "--out", str(out)]) == 130
    data = json.loads(out.read_text())
    assert data["text"] == "" and data["interrupted"] is True
    assert capsys.readouterr().err.splitlines()[-1] == "interrupted"


def test_generate_top_k_0_and_top_p_1_sample_from_every_token_as_the_help_says(hf_dir, capsys):
    common = ["generate", "--model", hf_dir, "--tokenizer", "bytes", "--prompt", "abc", "--max-new-tokens", "8",
              "--temperature", "1", "--seed", "3", "--ignore-eos", "--device", "cpu", "--no-stream"]
    texts = []
    for extra in ([], ["--top-k", "0"], ["--top-k", "100000"], ["--top-p", "1"]):
        assert main(common + extra) == 0
        texts.append(capsys.readouterr().out)
    assert len(set(texts)) == 1 and texts[0].strip()
    assert main(common + ["--top-k", "1"]) == 0
    assert capsys.readouterr().out != texts[0]  # a filter that bites changes the text, so the comparison can tell


def test_generate_help_says_the_range_and_default_of_eviction_and_prefill_chunks(monkeypatch, capsys):
    """--evict-eps said neither its range nor that it falls back to the model config's; --prefill-chunk not that the
    prompt is read in one forward unless it is given, nor what chunks are for; --fgate-bias-shift not which way a
    positive shift goes."""
    monkeypatch.setenv("COLUMNS", "1000")  # one line per option: a hyphen at a wrap would split the words checked
    with pytest.raises(SystemExit):
        main(["generate", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert ("a number in (0, 1), e.g. 1e-3 (default: the model config's evict_eps; without one, every key is "
            "kept)") in text
    assert "prompt tokens per forward (default: the whole prompt in one); with --evict-eps, smaller chunks" in text
    assert "positive slows the decay, a longer memory (default: the model config's fgate_bias_shift" in text


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "no-stream"])
def test_generate_stops_at_the_first_stop_string_and_cuts_it_off(hf_dir, tmp_path, capsys, stream):
    common = ["generate", "--model", hf_dir, "--tokenizer", "bytes", "--prompt", "Once upon", "--max-new-tokens",
              "16", "--temperature", "0", "--ignore-eos", "--device", "cpu"]
    assert main(common + ["--no-stream"]) == 0
    free = capsys.readouterr().out[:-1]
    stops = [free[7:9], free[3:5]]  # the second comes first in the text
    out = tmp_path / "gen.json"
    args = common + [f"--stop={stops[0]}", f"--stop={stops[1]}", "--out", str(out)] + ([] if stream else
                                                                                         ["--no-stream"])
    assert main(args) == 0
    want = free[:min(free.index(stop) for stop in stops)]
    assert len(want) < len(free) - 2
    assert capsys.readouterr().out == want + "\n"
    data = json.loads(out.read_text())
    assert data["text"] == want and data["settings"]["stop"] == stops and data["new_tokens"] < 16


ESCAPES = {"newline": (r"\n", "\n"), "tab": (r"\t", "\t"), "carriage-return": (r"\r", "\r"),
           "backslash": (r"\\", "\\"), "backslash-then-n": (r"\\n", "\\n"), "hex": (r"\x41", "A"),
           "u4": (r"\u00e9", "\u00e9"), "U8": (r"\U0001F600", "\U0001F600"), "in-text": (r"Q:\tA\n\n", "Q:\tA\n\n"),
           "none": ("plain: text", "plain: text")}


@pytest.mark.parametrize("typed, stop", list(ESCAPES.values()), ids=list(ESCAPES))
def test_generate_stop_reads_backslash_escapes(typed, stop):
    """`--stop '\\n'` passed a backslash and an n, so a newline could not be a stop string without the shell's help."""
    from foxformer.cli import build_parser
    assert build_parser().parse_args(["generate", "m", "--stop", typed, "--stop", "x"]).stop == [stop, "x"]


BAD_ESCAPES = {"unknown": (r"a\qb", r'bad escape "\q" in "a\qb": \q is no escape; the escapes are \n, '),
               "short-hex": (r"\x4", r'bad escape "\x4" in "\x4": \x takes 2 hex digits; '),
               "short-u4": (r"\u12g4", r'bad escape "\u12g4" in "\u12g4": \u takes 4 hex digits; '),
               "lone-backslash-at-the-end": ("ab\\", r'bad escape "\" in "ab\": a lone backslash ends the text; '),
               "surrogate": (r"\ud83d", r'bad escape "\ud83d" in "\ud83d": U+D83D is no character ')}


@pytest.mark.parametrize("typed, error", list(BAD_ESCAPES.values()), ids=list(BAD_ESCAPES))
def test_generate_stop_refuses_a_malformed_escape_in_one_line(typed, error, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["generate", "m", "--stop", typed])
    assert exc.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith(f"foxformer generate: error: argument --stop: {error}")


def test_generate_stops_at_a_newline_typed_as_an_escape(hf_dir, capsys, monkeypatch):
    """End to end: `--stop '\\n'` ends the text at its first line; the Python API's stop strings stay literal."""
    from foxformer.infer import generation as module
    common = ["generate", "--model", hf_dir, "--tokenizer", "bytes", "--prompt", "Once upon", "--temperature", "0",
              "--ignore-eos", "--device", "cpu", "--max-new-tokens", "12"]
    assert main(common) == 0
    free = capsys.readouterr().out[:-1]
    assert main(common + ["--stop", f"\\U{ord(free[5]):08x}"]) == 0  # the tiny model's text, cut at its 6th character
    assert capsys.readouterr().out == free[:free.index(free[5])] + "\n"

    text = b"Once upon a time\nthere was\\n a fox"
    monkeypatch.setattr(module, "stream_tokens", lambda *args, **kwargs: (torch.tensor([b]) for b in text))
    assert main(common + ["--stop", r"\n"]) == 0
    assert capsys.readouterr().out == "Once upon a time\n"
    model = _load_model(hf_dir)
    assert "".join(generate(model, load_tokenizer("bytes"), "x", stop=[r"\n"], max_new_tokens=40)) == (
        "Once upon a time\nthere was")


@pytest.fixture(scope="module")
def bytes_dir(tmp_path_factory):
    """A model whose config records the tokenizer it trained with, as every export does."""
    path = tmp_path_factory.mktemp("bytes_model")
    make_model("fox-pro-tiny", dtype=torch.float32, tokenizer="bytes").save_pretrained(path)
    return str(path)


@pytest.mark.parametrize("command", [
    ["generate", "--prompt", "the cat", "--max-new-tokens", "2"],
    ["bias-shift", "--source", "builtin:pydoc", "--seq-len", "64", "--num-seqs", "1", "--shifts", "0"],
], ids=["generate", "bias-shift"])
def test_a_tokenizer_other_than_the_models_is_refused_by_name(bytes_dir, tmp_path, capsys, command):
    # generate fed a model the ids of another tokenizer and printed what they decoded to, with exit status 0;
    # eval loss refused it already
    out = tmp_path / "out.json"
    args = [command[0], bytes_dir, *command[1:], "--device", "cpu", "--out", str(out)]
    assert main([*args, "--tokenizer", "gpt2"]) == 2
    captured = capsys.readouterr()
    name = os.path.basename(bytes_dir)
    assert captured.err.splitlines()[-1] == (f"error: --tokenizer: 'gpt2' is not the tokenizer {name} trained with "
                                             f"('bytes'); leave --tokenizer out to use 'bytes'")
    assert captured.out == "" and not out.exists()
    if command[0] == "generate":  # its own tokenizer, named or not, is used
        assert main([*args, "--tokenizer", "bytes"]) == 0 and out.exists()


def test_generate_reads_a_long_prompt_under_a_bar_gone_before_the_text(hf_dir, monkeypatch):
    """A long prompt was read (minutes for 100K tokens on a CPU) with nothing on the screen: a bar over its tokens
    now, by prefill chunk, closed before the first token streams; a library call draws none unless asked."""
    import tqdm.std

    from foxformer.models import FoxForCausalLM

    import foxformer.infer.generation as generation

    model = FoxForCausalLM.from_pretrained(hf_dir).eval()
    err = Terminal()
    monkeypatch.setattr(sys, "stderr", err)
    bars = []
    made = generation.progress_bar
    monkeypatch.setattr(generation, "progress_bar", lambda **kw: bars.append(made(**kw)) or bars[-1])
    ids = list(range(1, 13))
    stream = generate(model, ids, max_new_tokens=3, temperature=0, prefill_chunk=4, progress=True)
    next(stream)
    bar, = bars
    assert (bar.total, bar.n) == (12, 12) and "\rprefill:" in err.getvalue() and not tqdm.std.tqdm._instances
    list(stream)
    err.seek(0), err.truncate()
    list(generate(model, ids, max_new_tokens=3, temperature=0, prefill_chunk=4))
    assert err.getvalue() == ""


def test_generate_off_a_terminal_says_how_far_the_prompt_was_read_in_plain_lines(hf_dir, monkeypatch):
    import foxformer.progress as progress
    from foxformer.models import FoxForCausalLM

    model = FoxForCausalLM.from_pretrained(hf_dir).eval()
    log = io.StringIO()
    monkeypatch.setattr(sys, "stderr", log)
    monkeypatch.setattr(progress, "LINE_EVERY_S", 0.0)
    list(generate(model, list(range(1, 13)), max_new_tokens=2, temperature=0, prefill_chunk=4, progress=True))
    lines = log.getvalue().splitlines()  # counted as 1.23M at real sizes; below 1000 as whole tokens
    said = [line.split(",")[0] for line in lines]
    assert said == ["prefill: tok 4/12 done", "prefill: tok 8/12 done"], lines


@pytest.mark.parametrize("flag, wanted", [([], True), (["--no-progress"], False)], ids=["default", "no-progress"])
def test_generate_no_progress_reaches_the_weights_loading_and_the_prefill(hf_dir, monkeypatch, capsys, flag, wanted):
    """generate had no --no-progress: transformers' loading bar and the prefill's were drawn whatever a script asked."""
    import foxformer.infer.generation as generation
    import foxformer.train.loading as loading

    seen = {}
    load, gen = loading.load_model, generation.generate
    monkeypatch.setattr(loading, "load_model", lambda *a, **kw: (seen.setdefault("load", kw["progress"]),
                                                                  load(*a, **kw))[1])
    monkeypatch.setattr(generation, "generate", lambda *a, **kw: (seen.setdefault("prefill", kw["progress"]),
                                                                   gen(*a, **kw))[1])
    assert main(["generate", hf_dir, "--tokenizer", "bytes", "--prompt", "Once", "--max-new-tokens", "2",
                 "--device", "cpu", *flag]) == 0
    assert seen == {"load": wanted, "prefill": wanted}
