"""The eval commands' errors name the flag to fix (`--seq-len: ...`), not the keyword the check has in the Python
API (`seq_len: ...`), which the API's own errors keep. These are refused before any model loads: the model
named here does not exist."""
import pytest

from foxformer.cli import main
from foxformer.eval.harness import check_max_length, check_request, known_tasks
from foxformer.eval.loss import check_curve_args
from foxformer.eval.mqar import MqarConfig, config_from, parse_model, seed_table
from foxformer.eval.niah import check_grid
from foxformer.eval.sequences import check_sequences

LOSS = ["eval", "loss", "no-such-run"]
NIAH = ["eval", "niah", "no-such-run"]
GATES = ["analyze", "gates", "no-such-run"]
# the settings are checked before lm_eval is looked for: these need no lm_eval
HARNESS = ["eval", "harness", "no-such-run", "--tasks", "lambada_openai"]


@pytest.mark.parametrize("argv, said", [
    pytest.param([*LOSS, "--seq-len", "1"], "--seq-len: expected an integer >= 2 (tokens per evaluation sequence), "
                                            "got 1", id="loss-seq-len"),
    pytest.param([*LOSS, "--num-seqs", "0"], "--num-seqs: expected a positive integer, got 0", id="loss-num-seqs"),
    pytest.param([*LOSS, "--smooth", "0"], "--smooth: expected a positive integer (1: no smoothing), got 0",
                 id="loss-smooth"),
    pytest.param([*LOSS, "--n-boot", "0"], "--n-boot: expected a positive integer, got 0", id="loss-n-boot"),
    pytest.param([*LOSS, "--confidence", "1.5"], "--confidence: expected a number in (0, 1), got 1.5",
                 id="loss-confidence"),
    pytest.param([*LOSS, "--seed", "-1"], "--seed: expected a non-negative integer, got -1", id="loss-seed"),
    pytest.param([*LOSS, "--batch-size", "0"], "--batch-size: expected a positive integer, got 0",
                 id="loss-batch-size"),
    pytest.param([*LOSS, "--seq-len", "512", "--lengths", "256,1Ki"],
                 "--lengths: context lengths must lie in [1, 511] (--seq-len - 1), got [1024]", id="loss-lengths"),
    pytest.param([*NIAH, "--lengths", "1"], "--lengths: expected a non-empty list of integer context lengths >= 2, "
                                            "got [1]", id="niah-lengths"),
    pytest.param([*NIAH, "--depths", "0,1.5"], "--depths: expected a non-empty list of numbers in [0, 1], got "
                                               "[0.0, 1.5]", id="niah-depths"),
    pytest.param([*NIAH, "--modes", "hard"], "--modes: expected a non-empty subset of ('standard', 'easy'), got "
                                             "'hard'", id="niah-modes"),
    pytest.param([*NIAH, "--needles", "0"], "--needles: expected a positive integer (needles per cell), got 0",
                 id="niah-needles"),
    pytest.param([*NIAH, "--seeds", "-1"], "--seeds: expected non-negative integers, got [-1]", id="niah-seeds"),
    pytest.param([*NIAH, "--max-new-tokens", "0"], "--max-new-tokens: expected a positive integer, got 0",
                 id="niah-max-new-tokens"),
    pytest.param([*GATES, "--num-seqs", "0"], "--num-seqs: expected a positive integer, got 0", id="gates-num-seqs"),
    pytest.param([*GATES, "--batch-size", "0"], "--batch-size: expected a positive integer, got 0",
                 id="gates-batch-size"),
    pytest.param([*GATES, "--heads", "0-1"], "--heads: expected 'layer:head[,layer:head...]' such as '0:1,3:2', "
                                             "got '0-1'", id="gates-heads"),
    pytest.param(["eval", "compare", "no-such-run", "--positions", "24"],
                 "--positions: expected powers of two >= 2 (the octaves whose per-sequence losses loss.json keeps), "
                 "got [24]; e.g. 32", id="compare-positions"),
    pytest.param([*HARNESS, "--max-length", "1"], "--max-length: expected an integer >= 2, got 1",
                 id="harness-max-length"),
    # 0 was no error: `--max-length 0 or the training length` took the training length
    pytest.param([*HARNESS, "--max-length", "0"], "--max-length: expected an integer >= 2, got 0",
                 id="harness-max-length-zero"),
    pytest.param([*HARNESS, "--batch_size", "0"], "--batch-size: expected a positive integer, got 0",
                 id="harness-batch-size"),
    pytest.param([*HARNESS, "--num-fewshot", "-1"], "--num-fewshot: expected an integer >= 0, got -1; leave it out "
                                                    "for each task's own", id="harness-num-fewshot"),
    pytest.param([*HARNESS, "--limit", "0"], "--limit: expected a whole number of examples per task or a fraction "
                                             "in (0, 1), got 0.0; leave it out for all of them", id="harness-limit"),
    pytest.param([*HARNESS, "--limit", "2.5"], "--limit: expected a whole number of examples per task or a fraction "
                                               "in (0, 1), got 2.5; leave it out for all of them",
                 id="harness-limit-not-whole"),
    pytest.param([*LOSS, "--dtype", "foo"], "--dtype: expected one of auto, fp32, float32, bf16, bfloat16, fp16, "
                                            "float16, fp64, got 'foo'", id="loss-dtype"),
    pytest.param([*NIAH, "--device", "foo"], "--device: expected 'auto', 'cpu', 'cuda' or 'cuda:N', got 'foo'",
                 id="niah-device"),
    pytest.param([*GATES, "--attention-backend", "tritn"], "--attention-backend: expected one of auto, gluon, "
                 "triton, torch, naive, got 'tritn' (did you mean 'triton'?)", id="gates-attention-backend"),
])
def test_an_error_names_the_flag(argv, said, capsys):
    assert main([*argv, "--no-progress"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [f"error: {said}"]


@pytest.mark.parametrize("argv", [
    pytest.param(LOSS, id="loss"), pytest.param(NIAH, id="niah"), pytest.param(GATES, id="gates"),
    pytest.param(["eval", "eviction", "no-such-run"], id="eviction"), pytest.param(HARNESS, id="harness"),
    pytest.param(["eval", "compare", "no-such-run"], id="compare"), pytest.param(["eval", "mqar"], id="mqar"),
    pytest.param(["report", "no-such-run"], id="report"),
])
def test_an_out_that_is_a_file_is_refused_by_the_flag_before_the_work(argv, tmp_path, capsys):
    """It was found once the work was done, as 'file exists (...)' naming no flag."""
    taken = tmp_path / "notes.txt"
    taken.write_text("mine")
    assert main([*argv, "--out", str(taken), "--no-progress"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"error: --out: {str(taken)!r} is a file, not a folder: choose another location"]
    assert taken.read_text() == "mine"


@pytest.mark.parametrize("check, said", [
    pytest.param(lambda: check_sequences(1, 4), "seq_len: expected an integer >= 2", id="seq-len"),
    pytest.param(lambda: check_sequences(8, 0), "num: expected a positive integer, got 0", id="num"),
    pytest.param(lambda: check_curve_args(0, 10, 0.9, 0), "smooth_window: expected a positive integer",
                 id="smooth-window"),
    pytest.param(lambda: check_grid([8], [0.0], ["easy"], 1, [0], 0), "max_new_tokens: expected a positive integer",
                 id="max-new-tokens"),
])
def test_the_python_api_names_its_keyword(check, said):
    with pytest.raises(ValueError) as exc:
        check()
    assert str(exc.value).startswith(said)


@pytest.mark.parametrize("setting, said", [
    (dict(dtype="foo"), "dtype: expected one of auto, "),
    (dict(device="foo"), "device: expected 'auto', "),
    (dict(attention_backend="foo"), "attention_backend: expected one of auto, gluon, triton, torch, naive, got 'foo'"),
])
def test_load_model_names_its_keywords(setting, said, tmp_path):
    from foxformer.train.loading import load_model

    with pytest.raises(ValueError) as exc:
        load_model(str(tmp_path / "no-model"), **setting)
    assert str(exc.value).startswith(said)


def test_the_harness_api_names_its_keywords():
    for check, said in [(lambda: check_max_length(1), "max_length: expected an integer >= 2, got 1"),
                        (lambda: check_request([]), "tasks: expected at least one lm_eval task name"),
                        (lambda: check_request(["x"], num_fewshot=-1), "num_fewshot: expected an integer >= 0, got -1; "
                                                                       "None for each task's own"),
                        (lambda: check_request(["x"], limit=-1), "limit: expected a whole number of examples per "
                                                                 "task or a fraction in (0, 1), got -1; None for all")]:
        with pytest.raises(ValueError) as exc:
            check()
        assert str(exc.value).startswith(said)


def test_an_unknown_harness_task_is_named_by_the_flag_before_any_model_loads(capsys):
    pytest.importorskip("lm_eval")
    assert main(["eval", "harness", "no-such-run", "--tasks", "lambada_opnai", "--no-progress"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "error: --tasks: lm_eval knows no task 'lambada_opnai' (did you mean 'lambada_openai'?); `lm_eval ls tasks` "
        "lists them, --include-path adds a folder of task YAMLs"]
    with pytest.raises(ValueError, match="^tasks: lm_eval knows no task 'lambada_opnai' .*, include_path adds"):
        known_tasks(["lambada_opnai"])


MQAR = ["eval", "mqar", "--no-progress"]


@pytest.mark.parametrize("argv, said", [
    pytest.param(["--steps", "0"], "--steps: expected a positive integer, got 0", id="steps"),
    pytest.param(["--batch-size", "0"], "--batch-size: expected a positive integer, got 0", id="batch-size"),
    pytest.param(["--seed", "-1"], "--seed: expected a non-negative integer, got -1", id="seed"),
    pytest.param(["--lr", "0"], "--lr: expected a positive learning rate, got 0.0", id="lr"),
    pytest.param(["--max-minutes", "0"], "--max-minutes: expected a positive number, got 0.0; leave it out for no "
                                         "time limit", id="max-minutes"),
    pytest.param(["--preset", "tyo"], "--preset: unknown MQAR preset 'tyo' (did you mean 'toy'?); expected one of "
                                      "['mid', 'small', 'toy']", id="preset"),
    pytest.param(["--models", "fox-pro,fox-pro"], "--models: 'fox-pro' is given more than once", id="models-twice"),
    pytest.param(["--models", "fox-pro:fgate"], "--models: expected key=value after ':' in 'fox-pro:fgate', got "
                                                "'fgate'", id="models-no-value"),
    pytest.param(["--models", "transformer-pro,fox-pro:fgate=fixd"],
                 "--models fox-pro:fgate=fixd: fgate must be one of ('data_dependent', 'data_independent', 'fixed', "
                 "'none'), got 'fixd' (did you mean 'fixed'?)", id="models-bad-value"),
    pytest.param(["--models", "fox-pro:num_heads=3"], "--models fox-pro:num_heads=3: num_heads (3) must divide "
                 "hidden_size (64); give both num_heads and head_dim to decouple the attention width from hidden_size",
                 id="models-heads-not-dividing"),
    pytest.param(["--models", "fox-pro:num_layers=0"], "--models fox-pro:num_layers=0: num_layers must be a positive "
                                                       "int, got 0", id="models-depth"),
    pytest.param(["--models", "fox-pro:max_position_embeddings=64"],
                 "--models fox-pro:max_position_embeddings=64: max_position_embeddings is the task's (the longest of "
                 "eval_lengths and train_len: 128); leave it out", id="models-task-field"),
])
def test_an_mqar_error_names_the_flag(argv, said, tmp_path, capsys):
    out = tmp_path / "mqar"
    assert main([*MQAR, *argv, "--out", str(out)]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [f"error: {said}"]
    assert not out.exists()


def test_an_unknown_key_in_an_mqar_model_names_the_flag_and_the_model(tmp_path, capsys):
    assert main([*MQAR, "--models", "fox-pro:fgate_bias=1", "--out", str(tmp_path / "mqar")]) == 2
    assert capsys.readouterr().err.startswith("error: --models fox-pro:fgate_bias=1: unknown model key 'fgate_bias' "
                                              "(did you mean ")


def test_mqar_pool_errors_name_the_flag(tmp_path, capsys):
    assert main(["eval", "mqar", "--steps", "12", "--models", "fox-pro:fgate=fixed", "--out", str(tmp_path / "a"),
                 "--no-progress"]) == 0
    capsys.readouterr()
    assert main([*MQAR, "--pool", str(tmp_path / "a"), str(tmp_path / "a"), "--out", str(tmp_path / "p")]) == 2
    assert capsys.readouterr().err.strip() == "error: --pool: seeds [0, 0] repeat; give one folder per seed"
    with pytest.raises(ValueError, match=r"^out_dirs: seeds \[0, 0\] repeat"):
        seed_table([str(tmp_path / "a")] * 2)


@pytest.mark.parametrize("check, said", [
    pytest.param(lambda: MqarConfig(steps=0), "steps: expected a positive integer, got 0", id="steps"),
    pytest.param(lambda: MqarConfig(max_minutes=0), "max_minutes: expected a positive number, got 0; None for no time "
                                                    "limit", id="max-minutes"),
    pytest.param(lambda: MqarConfig(models=["fox-pro:fgate_bias=1"]), "models fox-pro:fgate_bias=1: unknown model "
                                                                      "key 'fgate_bias'", id="model-key"),
    pytest.param(lambda: config_from("tyo"), "preset: unknown MQAR preset 'tyo'", id="preset"),
    pytest.param(lambda: parse_model("fox-por"), "models: unknown model kind 'fox-por'", id="model-kind"),
])
def test_the_mqar_api_names_its_keywords(check, said):
    with pytest.raises(ValueError) as exc:
        check()
    assert str(exc.value).startswith(said)


@pytest.mark.parametrize("model", ["given", "run", "hf"], ids=["tokenizer-given", "run-config", "hf-config"])
def test_niah_lengths_too_short_for_the_needle_are_refused_before_the_models_load(model, tmp_path, capsys):
    """They were refused once the models had loaded and the haystack was read. The needle's tokens are its
    tokenizer's: --tokenizer, or the one the run's config.yaml or the model's config.json names, loaded first. No
    model here has weights: loading one would fail."""
    if model == "given":
        argv, tokens = ["no-such-run", "--tokenizer", "gpt2"], 49
    elif model == "run":
        (tmp_path / "config.yaml").write_text("tokenizer: bytes\n")
        argv, tokens = [str(tmp_path)], 229
    else:
        (tmp_path / "config.json").write_text('{"model_type": "foxformer", "tokenizer": "bytes"}')
        argv, tokens = [str(tmp_path)], 229
    assert main(["eval", "niah", *argv, "--lengths", f"{tokens},4Ki", "--haystack", str(tmp_path / "none"),
                 "--no-progress"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"error: --lengths: context length {tokens} is too short for the needle and question ({tokens} tokens); use "
        f"--lengths > {tokens}"]
