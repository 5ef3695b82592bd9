"""The lm-evaluation-harness adapter (lm_eval itself is optional: a stand-in module checks the wrapper class)."""
import io
import sys
import types
import warnings
from types import SimpleNamespace

import pytest
import torch

from foxformer.eval import HarnessAdapter, make_lm, per_token_loss
from foxformer.infer import GenerationConfig, stream_tokens
from tests.bars import Terminal

from .helpers import WordTokenizer, copy_model, tiny_model


@pytest.fixture()
def tok():
    t = WordTokenizer(64)
    t.encode("a b c d e f g h i j k l m n o p")  # fixed ids for the words used below
    return t


def test_loglikelihood_equals_per_token_loss(tok):
    model = tiny_model("fox-pro-tiny", vocab=64).double()
    adapter = HarnessAdapter(model, tok, max_length=64, batch_size=2, progress=False)
    pairs = [("a b c d", " e f"), ("g h", " i"), ("", " j k l"), ("m n o ", "p")]
    got = adapter.loglikelihood(pairs)
    for (ctx, cont), (ll, greedy) in zip(pairs, got):
        ids = [tok.eot_id] + tok.encode(ctx + " " + cont)
        n_cont = len(tok.encode(cont))
        losses = per_token_loss(model, torch.tensor(ids))[0]
        assert ll == pytest.approx(-float(losses[-n_cont:].sum()), rel=1e-6)
        assert isinstance(greedy, bool)


def test_rolling_loglikelihood_covers_every_token_once(tok):
    model = tiny_model("fox-llama-tiny", vocab=64).double()
    text = "a b c d e f g h i j k l m n o p a b c"
    ids = [tok.eot_id] + tok.encode(text)
    full = -float(per_token_loss(model, torch.tensor(ids)).sum())
    assert HarnessAdapter(model, tok, max_length=64, progress=False).loglikelihood_rolling([text])[0] == \
        pytest.approx(full, rel=1e-6)
    windowed = HarnessAdapter(model, tok, max_length=6, progress=False).loglikelihood_rolling([text])[0]
    # windows of 6 tokens: the first window equals the full pass, the rest see less context
    first = -float(per_token_loss(model, torch.tensor(ids[:7])).sum())
    assert windowed < first and windowed != pytest.approx(full)


def test_copy_model_is_greedy_on_a_repeat_and_generates_until_stop(tok):
    adapter = HarnessAdapter(copy_model(64), tok, max_length=64, progress=False)
    (ll, greedy), (ll_bad, greedy_bad) = adapter.loglikelihood([("a b c d a", " b c"), ("a b c d a", " c b")])
    assert greedy and ll > -1e-3 and not greedy_bad and ll_bad < -10
    assert adapter.generate_until([("a b c d e a", {"until": ["e"], "max_gen_toks": 10})]) == ["b c d "]
    assert adapter.generate_until([("a b c d e a", {"until": [], "max_gen_toks": 2})]) == ["b c"]


def test_generation_past_the_context_announces_its_length_to_an_evicting_cache(tok):
    """A config evict_eps derives the eviction bound for the tokens the cache is told of: generate_until tells it
    the whole length (it warned once decoding passed max_position_embeddings) and decodes as generate does."""
    model = tiny_model("fox-pro-tiny", vocab=64, max_position_embeddings=16, evict_eps=1e-3).double()
    context, new = "a b c d e f g h i j k l m n", 10
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        text, = HarnessAdapter(model, tok, max_length=64, progress=False).generate_until(
            [(context, {"until": [], "max_gen_toks": new})])
        ids = torch.tensor([[tok.eot_id] + tok.encode(context)])
        greedy = [int(t) for t in stream_tokens(model, ids, GenerationConfig(max_new_tokens=new, temperature=0))]
    assert text == tok.decode(greedy[:greedy.index(tok.eot_id)] if tok.eot_id in greedy else greedy)


def test_lm_eval_wrapper_delegates(tok, monkeypatch):
    """make_lm subclasses lm_eval.api.model.LM; a stand-in module checks the plumbing without lm_eval."""
    class LM:
        def __init__(self):
            self.initialised = True

    api = types.ModuleType("lm_eval.api")
    model_mod = types.ModuleType("lm_eval.api.model")
    model_mod.LM = LM
    monkeypatch.setitem(sys.modules, "lm_eval", types.ModuleType("lm_eval"))
    monkeypatch.setitem(sys.modules, "lm_eval.api", api)
    monkeypatch.setitem(sys.modules, "lm_eval.api.model", model_mod)
    adapter = HarnessAdapter(copy_model(64), tok, max_length=64, progress=False)
    lm = make_lm(adapter)
    assert isinstance(lm, LM) and lm.initialised
    req = SimpleNamespace(args=("a b c d a", " b c"))
    assert lm.loglikelihood([req]) == adapter.loglikelihood([req.args])
    assert lm.loglikelihood_rolling([SimpleNamespace(args=("a b a b",))]) == \
        adapter.loglikelihood_rolling(["a b a b"])
    assert lm.generate_until([SimpleNamespace(args=("a b c a", {"until": ["c"], "max_gen_toks": 4}))]) == ["b "]


def test_make_lm_without_lm_eval_explains(tok, monkeypatch):
    # submodules an earlier test imported (the eval CLI's harness tests) would still import from sys.modules
    for name in [m for m in sys.modules if m.startswith("lm_eval.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "lm_eval", None)  # import fails as if not installed
    with pytest.raises(ImportError, match="pip install lm_eval"):
        make_lm(HarnessAdapter(copy_model(64), tok, progress=False))


@pytest.mark.parametrize("kwargs, match", [(dict(max_length=1), "max_length"), (dict(batch_size=0), "batch_size")],
                         ids=["max-length", "batch-size"])
def test_bad_adapter_arguments(tok, kwargs, match):
    with pytest.raises(ValueError, match=match):
        HarnessAdapter(copy_model(64), tok, **kwargs)


LOCAL_TASKS = {
    "fox_copy_mc.yaml": """task: fox_copy_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{prompt}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{answer}}}}"
metric_list:
  - metric: acc
""",
    "fox_copy_gen.yaml": """task: fox_copy_gen
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: generate_until
doc_to_text: "{{{{prompt}}}}"
doc_to_target: "{{{{target}}}}"
generation_kwargs:
  until: ["e"]
  max_gen_toks: 8
  do_sample: false
metric_list:
  - metric: exact_match
""",
}


def test_real_lm_eval_runs_local_tasks_offline(tok, tmp_path, monkeypatch, capfd):
    """The real lm_eval (when installed) scores our model on tasks over local JSON files. Run from a folder that is
    not a git checkout (one run of lm_eval, ~15 s, serves both): lm_eval's `git describe` there wrote git's "fatal:
    not a git repository" to the terminal, and the results record foxformer's version and commit instead."""
    pytest.importorskip("lm_eval")
    import json
    import subprocess

    from foxformer import __version__
    from foxformer.eval import run_harness
    from foxformer.provenance import code_version

    # git looks no higher than tmp_path for a repository, wherever the temporary folders are
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))
    monkeypatch.chdir(tmp_path)
    assert subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True).returncode != 0  # not a checkout

    data = tmp_path / "copy.jsonl"
    # the copy model continues a repeat: after "... e a" it writes "b c d " and stops at "e"
    docs = [{"prompt": "a b c d e a", "choices": [" b", " c", " d"], "answer": 0, "target": "b c d "},
            {"prompt": "f g h e f", "choices": [" h", " g"], "answer": 1, "target": "g h "}]
    data.write_text("\n".join(json.dumps(d) for d in docs))
    for name, text in LOCAL_TASKS.items():
        (tmp_path / name).write_text(text.format(data=data))
    adapter = HarnessAdapter(copy_model(64), tok, max_length=64, progress=False)
    res = run_harness(adapter, ["fox_copy_mc", "fox_copy_gen"], include_path=str(tmp_path),
                      out_path=str(tmp_path / "harness.json"))
    assert res["results"]["fox_copy_mc"]["acc,none"] == 1.0
    assert res["results"]["fox_copy_gen"]["exact_match,none"] == 1.0
    assert "not a git repository" not in capfd.readouterr().err
    mine = {"version": __version__, "commit": code_version()}
    assert res["foxformer"] == mine and json.loads((tmp_path / "harness.json").read_text())["foxformer"] == mine


# two real lm_eval runs (~15 s each on CI's CPU): --no-progress on a terminal takes the same branch as a log, whose
# choice tests/test_progress.py checks for every place
@pytest.mark.parametrize("terminal, wanted, drawn", [(True, True, True), (False, True, False)],
                         ids=["on-a-terminal", "into-a-log"])
def test_lm_evals_own_bars_follow_no_progress_and_the_terminal(tok, tmp_path, monkeypatch, terminal, wanted, drawn):
    """lm_eval's "building contexts" bar (its own tqdm, over each task's documents) and the datasets' bars stayed
    on under `eval harness --no-progress`, and off a terminal wrote their frames into the log."""
    pytest.importorskip("lm_eval")
    import json

    import datasets.utils as datasets_bars
    import tqdm

    from foxformer.eval import run_harness

    data = tmp_path / "copy.jsonl"
    data.write_text(json.dumps({"prompt": "a b c d e a", "choices": [" b", " c"], "answer": 0, "target": "b"}))
    (tmp_path / "fox_copy_mc.yaml").write_text(LOCAL_TASKS["fox_copy_mc.yaml"].format(data=data))
    err = Terminal() if terminal else io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    tqdm_class = tqdm.tqdm
    run_harness(HarnessAdapter(copy_model(64), tok, max_length=64, progress=wanted), ["fox_copy_mc"],
                include_path=str(tmp_path))
    assert ("%|" in err.getvalue()) is drawn and ("\r" in err.getvalue()) is drawn, err.getvalue()
    assert tqdm.tqdm is tqdm_class and not datasets_bars.are_progress_bars_disabled()  # as they were after it


def test_sequences_start_with_the_tokenizers_bos(tok):
    """A tokenizer with a BOS (gpt2-json) starts every scored sequence with it, others with their end of text."""
    class BosTok(WordTokenizer):
        bos_id = 63

    bos = BosTok(64)
    bos.encode("a b c d e f g h i j k l m n o p")
    model = tiny_model("fox-pro-tiny", vocab=64).double()
    assert HarnessAdapter(model, bos, progress=False)._split("a b", " c") == ([63] + bos.encode("a b"), bos.encode("c"))
    assert HarnessAdapter(model, tok, progress=False)._split("a b", " c")[0][0] == tok.eot_id


@pytest.mark.parametrize("pairs", [pytest.param([("", "")], id="empty-context-and-continuation-alone"),
                                   pytest.param([("", ""), ("a", " b")], id="empty-pair-in-a-batch")])
def test_empty_continuation_scores_zero(tok, pairs):
    adapter = HarnessAdapter(tiny_model("fox-pro-tiny", vocab=64).double(), tok, max_length=4, progress=False)
    assert adapter.loglikelihood(pairs)[0] == (0.0, True)


@pytest.mark.parametrize("cont", [pytest.param(" c d e f g", id="continuation-one-longer-than-max-length"),
                                  pytest.param(" c d e f g h i", id="continuation-much-longer")])
def test_continuation_longer_than_max_length_is_a_clear_error(tok, cont):
    adapter = HarnessAdapter(tiny_model("fox-pro-tiny", vocab=64).double(), tok, max_length=4, progress=False)
    with pytest.raises(ValueError, match="max_length"):
        adapter.loglikelihood([("a b", cont)])


JSON_TASK = LOCAL_TASKS["fox_copy_mc.yaml"].replace("task: fox_copy_mc", "task: fox_json_mc")


def test_lm_eval_hf_on_an_export_scores_as_eval_harness(tmp_path, capsys):
    """`lm_eval --model hf` on a save_pretrained folder, where foxformer cannot be imported, gives the
    log-likelihoods `foxformer eval harness` gives (gpt2-json text: BOS first, JSON-escaped)."""
    pytest.importorskip("lm_eval")
    pytest.importorskip("accelerate")  # lm_eval's hf model (pip install "lm_eval[hf]")
    import json

    from foxformer.cli import main
    from foxformer.data import load_tokenizer
    from foxformer.train.loading import load_model

    from ..standalone_run import run_as_user

    folder = str(tmp_path / "export")
    tiny_model("fox-pro-tiny", vocab=50257, tokenizer="gpt2-json").save_pretrained(folder)
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    docs = [{"prompt": 'She said "yes"\nand', "choices": [" left", " stayed"], "answer": 0},
            {"prompt": "Café in Zürich:", "choices": [" open", " closed 😀"], "answer": 1}]
    (tasks / "data.jsonl").write_text("\n".join(json.dumps(d) for d in docs))
    (tasks / "fox_json_mc.yaml").write_text(JSON_TASK.format(data=tasks / "data.jsonl"))
    theirs = run_as_user(tmp_path, "lm_eval", {
        "model_args": f"pretrained={folder},trust_remote_code=True,add_bos_token=True,dtype=float32",
        "tasks": ["fox_json_mc"], "include_path": str(tasks)})
    assert theirs["imported"] == []
    loaded = load_model(folder, device="cpu", dtype="fp32")
    adapter = HarnessAdapter(loaded.model, load_tokenizer(loaded.tokenizer), progress=False)
    for sample in theirs["samples"]["fox_json_mc"]:
        ours = adapter.loglikelihood([tuple(a) for a in sample["arguments"]])
        assert [ll for ll, _ in ours] == pytest.approx([r[0][0] for r in sample["resps"]], abs=1e-4)
    # the command line takes lm_eval's spellings of its arguments
    out = tmp_path / "ours"
    assert main(["eval", "harness", folder, "--tasks", "fox_json_mc", "--include_path", str(tasks), "--num_fewshot",
                 "0", "--batch_size", "2", "--device", "cpu", "--out", str(out), "--no-progress"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["results"]["export"]["fox_json_mc"]["acc,none"] == theirs["results"]["fox_json_mc"]["acc,none"]


def test_an_unknown_task_is_one_line_naming_it(tmp_path, capsys):
    """lm_eval's KeyError for a misspelled task ended the command in a traceback."""
    pytest.importorskip("lm_eval")
    from foxformer.cli import main

    hf = tmp_path / "hf"
    tiny_model("fox-pro-tiny", vocab=320).save_pretrained(str(hf))
    capsys.readouterr()
    assert main(["eval", "harness", str(hf), "--tasks", "lambada_opnai", "--tokenizer", "bytes", "--device", "cpu",
                 "--out", str(tmp_path / "out"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "no task 'lambada_opnai' (did you mean 'lambada_openai'?)" in err, err


def test_a_task_whose_data_cannot_be_downloaded_says_how_to_run_offline(tok, monkeypatch, online_by_default):
    """datasets' "Couldn't reach 'EleutherAI/lambada_openai' on the Hub (LocalEntryNotFoundError)" ended the
    command with no way on."""
    import lm_eval

    from foxformer.eval import run_harness

    _probes(monkeypatch, reachable=True)  # the Hub answered the probe, then failed the download

    def offline(**kwargs):
        raise ConnectionError("Couldn't reach 'EleutherAI/lambada_openai' on the Hub (LocalEntryNotFoundError)")

    monkeypatch.setattr(lm_eval, "simple_evaluate", offline)
    adapter = HarnessAdapter(copy_model(64), tok, max_length=64, progress=False)
    with pytest.raises(ConnectionError, match=r"on the Hub \(LocalEntryNotFoundError\): a task's data comes from the "
                                              r"Hugging Face Hub; connect to it, or where the data is cached set "
                                              r"HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1"):
        run_harness(adapter, ["lambada_openai"], task_manager=object())


@pytest.fixture()
def online_by_default(monkeypatch):
    """Neither library in offline mode and no proxy, whatever this machine's environment says."""
    pytest.importorskip("lm_eval")
    import datasets.config
    from huggingface_hub import constants

    from foxformer.eval import harness

    flags = [(constants, "HF_HUB_OFFLINE"), (datasets.config, "HF_HUB_OFFLINE"),
             (datasets.config, "HF_DATASETS_OFFLINE")]
    for owner, name in flags:
        monkeypatch.setattr(owner, name, False)
    monkeypatch.setattr(harness.urllib.request, "getproxies", dict)
    return lambda: [getattr(owner, name) for owner, name in flags]


class _Connection:
    def close(self):
        pass


def _probes(monkeypatch, reachable: bool) -> list:
    """The Hub probes run_harness makes, each answered as ``reachable`` says, without the network."""
    from foxformer.eval import harness

    probes = []

    def connect(address, timeout):
        probes.append((address, timeout))
        if not reachable:
            raise OSError("[Errno -2] Name or service not known")
        return _Connection()

    monkeypatch.setattr(harness.socket, "create_connection", connect)
    return probes


def test_an_unreachable_hub_gives_the_offline_advice_at_once(tok, monkeypatch, online_by_default):
    """Without network a task's data not in the cache cost ~25 s of huggingface_hub's retries before the advice:
    one probe finds the Hub unreachable, and datasets, in offline mode, refuses at once."""
    import time

    import datasets
    import lm_eval

    from foxformer.eval import run_harness

    probes = _probes(monkeypatch, reachable=False)
    seen = []

    def evaluate(**kwargs):
        seen.append(online_by_default())
        datasets.load_dataset("foxformer-tests/no-such-dataset")  # never cached: needs the Hub

    monkeypatch.setattr(lm_eval, "simple_evaluate", evaluate)
    adapter = HarnessAdapter(copy_model(64), tok, max_length=64, progress=False)
    start = time.perf_counter()
    with pytest.raises(ConnectionError, match=r"a task's data comes from the Hugging Face Hub, which cannot be "
                                              r"reached from here \(https://.*\), and it is not cached; connect to "
                                              r"it, or where the data is cached set HF_DATASETS_OFFLINE=1 "
                                              r"HF_HUB_OFFLINE=1"):
        run_harness(adapter, ["lambada_openai"], task_manager=object())
    assert time.perf_counter() - start < 10
    assert len(probes) == 1 and probes[0][1] <= 5 and seen == [[True, True, True]]
    assert online_by_default() == [False, False, False]  # offline for the run only


def test_a_reachable_hub_or_a_chosen_offline_mode_is_left_as_it_is(tok, monkeypatch, online_by_default):
    import lm_eval
    from huggingface_hub import constants

    from foxformer.eval import run_harness

    probes = _probes(monkeypatch, reachable=True)
    seen = []

    def evaluate(**kwargs):
        seen.append(online_by_default())
        return {"results": {"task": {"acc": 1.0}}}

    monkeypatch.setattr(lm_eval, "simple_evaluate", evaluate)
    adapter = HarnessAdapter(copy_model(64), tok, max_length=64, progress=False)
    assert run_harness(adapter, ["task"], task_manager=object())["results"] == {"task": {"acc": 1.0}}
    assert len(probes) == 1 and seen == [[False, False, False]]
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)  # the user's HF_HUB_OFFLINE=1: no probe
    run_harness(adapter, ["task"], task_manager=object())
    assert len(probes) == 1 and seen[-1] == [True, False, False]
