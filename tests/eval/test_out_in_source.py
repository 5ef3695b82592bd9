"""An eval's output folder inside its source folder: `eval loss --source d2 --out d2/ev`, run again, read d2/ev/loss.json
as a document and failed with a JSON Lines error. The reading passes over that folder, as `data prepare` passes over its
own, and an older output folder (marked as one by the eval that wrote it before its first file, or, written before
the mark, told by its results' JSON), and says so; an output folder that is the source folder itself is refused before
the models load."""
import json
import os

import pytest

from foxformer.cli import main
from foxformer.data.layout import EVAL_MARK
from foxformer.data.preparation import read_manifest
from foxformer.eval.outputs import mark_output_folder

from .helpers import tiny_model

TEXT = "The tide came in over the flat grey sand, and the gulls rose from it. " * 12


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    folder = tmp_path_factory.mktemp("model") / "hf"
    tiny_model("fox-pro-tiny", vocab=50304, seed=1).save_pretrained(str(folder))
    return str(folder)


@pytest.fixture
def d2(tmp_path, monkeypatch) -> str:
    """A folder of three documents; the tests run from its parent folder."""
    monkeypatch.chdir(tmp_path)
    os.mkdir("d2")
    for i in range(3):
        with open(os.path.join("d2", f"doc{i}.txt"), "w") as f:
            f.write(f"Document {i}. {TEXT}")
    return "d2"


# each command's arguments after the model, reading ``source`` and writing into ``out`` (bias-shift's --out is its
# JSON file there), and the file of results it writes
COMMANDS = {
    "eval-loss": (["eval", "loss"], lambda source, out: ["--source", source, "--seq-len", "24", "--num-seqs", "8",
                                                         "--n-boot", "10", "--out", out], "loss.json"),
    "eval-niah": (["eval", "niah"], lambda source, out: ["--haystack", source, "--lengths", "96", "--depths", "0",
                                                         "--needles", "1", "--modes", "standard", "--no-generate",
                                                         "--out", out], "niah.json"),
    "bias-shift": (["bias-shift"], lambda source, out: ["--source", source, "--shifts", "0", "--seq-len", "24",
                                                        "--num-seqs", "8", "--out", os.path.join(out, "shift.json")],
                   "shift.json"),
}


@pytest.mark.parametrize("command", COMMANDS)
def test_an_output_folder_inside_the_source_is_passed_over_and_said(model, d2, capsys, command):
    before, after, results = COMMANDS[command]
    argv = before + [model] + after(d2, os.path.join(d2, "ev")) + ["--device", "cpu", "--no-progress"]
    for run in ("first", "again"):  # said also the first time, before the folder is there to be passed over
        assert main(argv) == 0, run
        err = capsys.readouterr().err.splitlines()
        assert "note: d2: the output folder d2/ev in it is not read as documents" in err, (run, err)
        # its plots were counted among the files of other kinds left out
        assert not [line for line in err if "left out" in line], (run, err)
    with open(os.path.join(d2, "ev", results)) as f:
        data = json.load(f)
    if command != "eval-niah":
        assert (data.get("settings") or data)["num_seqs"] == 3  # the three documents, none of the results


@pytest.mark.parametrize("command", ["eval-loss", "eval-niah"])
def test_an_output_folder_that_is_the_source_folder_is_refused_before_the_models_load(d2, capsys, command):
    """Its results would be read as documents by the next run; the model named here does not exist."""
    before, after, _ = COMMANDS[command]
    flag = "--haystack" if command == "eval-niah" else "--source"
    assert main(before + ["no-such-run"] + after(d2, "./d2/")) == 2
    assert capsys.readouterr().err.strip() == (
        f"error: --out: './d2/' is the {flag} folder itself, every file of which is read: the results written there "
        f"would be read as its documents by the next run; name a folder inside it (the reading passes over that) or "
        f"elsewhere")


@pytest.mark.parametrize("out", ["d2/shift.json", "./d2/", "shift.json"], ids=["a-file-in-it", "the-folder",
                                                                           "a-bare-file-name"])
def test_bias_shift_refuses_a_json_file_written_into_the_source_folder_before_the_model_loads(d2, capsys, out):
    """Its --out names the file, whose folder was found to be the source only as the source was read, after the
    model had loaded; the model named here does not exist."""
    source = "." if out == "shift.json" else d2
    assert main(["bias-shift", "no-such-run", "--source", source, "--shifts", "0", "--seq-len", "24", "--out", out,
                 "--device", "cpu", "--no-progress"]) == 2
    folder = {"d2/shift.json": "d2", "./d2/": "./d2/", "shift.json": "."}[out]
    assert capsys.readouterr().err.strip() == (
        f"error: --out: {folder!r} is the --source folder itself, every file of which is read: the results written "
        f"there would be read as its documents by the next run; name a folder inside it (the reading passes over "
        f"that) or elsewhere")
    assert sorted(os.listdir(".")) == ["d2"] and sorted(os.listdir(d2)) == ["doc0.txt", "doc1.txt", "doc2.txt"]


def _notes(err: str) -> list[str]:
    return [line for line in err.splitlines() if "not read as documents" in line or "left out" in line]


@pytest.mark.parametrize("first", COMMANDS)
@pytest.mark.parametrize("then", COMMANDS)
def test_an_older_output_folder_inside_the_source_is_passed_over_and_said(model, d2, capsys, first, then):
    """d2/ev1 is another run's output folder, no longer the one written: told by the mark its eval left there, as its
    results' names (bias-shift's --out names its file as the user likes) could not tell it."""
    def run(command: str, out: str) -> list[str]:
        before, after, _ = COMMANDS[command]
        assert main(before + [model] + after(d2, out) + ["--device", "cpu", "--no-progress"]) == 0
        return _notes(capsys.readouterr().err)

    run(first, os.path.join(d2, "ev1"))
    assert run(then, os.path.join(d2, "ev2")) == [
        "note: d2: the output folder d2/ev2 in it is not read as documents",
        "note: d2: 1 eval output folder(s) in it not read as documents (d2/ev1)"]
    with open(os.path.join(d2, "ev2", COMMANDS[then][2])) as f:
        data = json.load(f)
    if then != "eval-niah":
        assert (data.get("settings") or data)["num_seqs"] == 3


def test_a_folder_of_documents_is_read_whatever_its_files_are_named(model, d2, capsys):
    """Only the mark tells an output folder: a folder of the user's holding a loss.json of their own is read."""
    os.mkdir(os.path.join(d2, "runs"))
    with open(os.path.join(d2, "runs", "loss.json"), "w") as f:
        f.write(json.dumps({"text": f"A document named loss. {TEXT}"}) + "\n")
    before, after, results = COMMANDS["eval-loss"]
    assert main(before + [model] + after(d2, "ev") + ["--device", "cpu", "--no-progress"]) == 0
    assert _notes(capsys.readouterr().err) == []
    with open(os.path.join("ev", results)) as f:
        assert json.load(f)["settings"]["num_seqs"] == 4


def test_prepare_passes_over_an_eval_output_folder_and_says_it(model, d2, capsys):
    """`data prepare` reads the same walk: d2/ev/loss.json was refused as a JSON Lines file of no 'text' field."""
    before, after, _ = COMMANDS["eval-loss"]
    assert main(before + [model] + after(d2, os.path.join(d2, "ev")) + ["--device", "cpu", "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["data", "prepare", "--source", d2, "--out", "tokens", "--tokenizer", "bytes", "--no-progress"]) == 0
    assert _notes(capsys.readouterr().err) == ["note: d2: 1 eval output folder(s) in it not read as documents (d2/ev)"]
    assert read_manifest("tokens")["docs"] == 3


def test_a_source_of_nothing_but_output_folders_says_them(d2, capsys):
    """The refusal of a folder of no documents named the prepared datasets it passed over, not the output folders."""
    for i in range(3):
        os.remove(os.path.join(d2, f"doc{i}.txt"))
    mark_output_folder(os.path.join(d2, "ev"))
    assert main(["data", "prepare", "--source", d2, "--out", "tokens", "--tokenizer", "bytes", "--no-progress"]) == 2
    assert capsys.readouterr().err.strip().startswith(
        "error: --source: directory 'd2' holds no file of a kind read as documents outside the eval output folders "
        "in it ('d2/ev'): ")


@pytest.mark.parametrize("already", ["new-folder", "empty-folder", "marked-folder"])
def test_a_folder_the_command_makes_or_owns_is_marked(tmp_path, already):
    folder = tmp_path / "ev"
    if already != "new-folder":
        folder.mkdir()
    if already == "marked-folder":
        mark_output_folder(str(folder))
    mark_output_folder(str(folder))
    assert (folder / EVAL_MARK).is_file()


def test_a_folder_holding_files_from_before_the_command_is_not_marked(tmp_path, monkeypatch):
    """`--out .` or bias-shift's `--out shift.json` in a folder of documents: marked, the folder would be passed over
    whole by every later walk of a source holding it."""
    import foxformer.eval.outputs as outputs

    (tmp_path / "notes.txt").write_text("the user's own document")
    monkeypatch.setattr(outputs, "_STARTED", os.path.getmtime(tmp_path / "notes.txt") + 1.0)
    mark_output_folder(str(tmp_path))
    assert not (tmp_path / EVAL_MARK).exists()


def _old_style(folder: str) -> None:
    """``folder`` as an eval wrote it before the mark existed."""
    os.remove(os.path.join(folder, EVAL_MARK))


@pytest.mark.parametrize("first", COMMANDS)
def test_an_older_output_folder_without_the_mark_is_told_by_its_results_and_said(model, d2, capsys, first):
    """Folders an eval wrote before it left its mark were read as documents of a source folder holding them: told by
    what their JSON holds (never by the files' names), they are passed over with the marked ones' note."""
    os.mkdir(os.path.join(d2, "docs"))
    for i in range(3):
        os.replace(os.path.join(d2, f"doc{i}.txt"), os.path.join(d2, "docs", f"doc{i}.txt"))
    before, after, results = COMMANDS[first]
    assert main(before + [model] + after(os.path.join(d2, "docs"), os.path.join(d2, "old"))
                + ["--device", "cpu", "--no-progress"]) == 0
    _old_style(os.path.join(d2, "old"))
    capsys.readouterr()
    said = (f"note: d2: 1 eval output folder(s) in it not read as documents (d2/old); d2/old ({results}) recognised "
            f"by its files of eval results, written before eval marked its output folders")
    assert main(["data", "prepare", "--source", d2, "--out", "tokens", "--tokenizer", "bytes", "--no-progress"]) == 0
    assert _notes(capsys.readouterr().err) == [said]
    assert read_manifest("tokens")["docs"] == 3
    before, after, _ = COMMANDS["eval-loss"]
    assert main(before + [model] + after(d2, "ev") + ["--device", "cpu", "--no-progress"]) == 0
    assert _notes(capsys.readouterr().err) == [said]
    with open(os.path.join("ev", "loss.json")) as f:
        assert json.load(f)["settings"]["num_seqs"] == 3


def _mqar_result(cfg) -> dict:
    """A model's MQAR result as run_model returns it, without its training."""
    return {"model": "transformer-pro", "label": "Transformer (Pro)", "non_embedding_params": 1e5,
            "steps_done": cfg.steps, "train_s": 1.0,
            "accuracy": [[0.5] * len(cfg.eval_lengths) for _ in cfg.eval_pairs],
            "history": [{"step": cfg.steps, "loss": 1.0, "accuracy": 0.5, "pairs": 2}]}


def _evaluated(model: str, d2: str) -> str:
    """A folder of eval loss's results (loss.json and its plots), as `eval compare` and `report` read them."""
    before, after, _ = COMMANDS["eval-loss"]
    assert main(before + [model] + after(d2, "run") + ["--device", "cpu", "--no-progress"]) == 0
    return "run"


def test_older_compare_and_mqar_folders_are_told_with_their_tables_and_models(model, d2, monkeypatch):
    """compare.md beside compare.json, mqar.md beside mqar.json and mqar's models/ folder are the results' own."""
    from foxformer.data.layout import eval_results_in
    from foxformer.data.sources import left_out_of
    from foxformer.eval import mqar

    assert main(["eval", "compare", _evaluated(model, d2), "--out", os.path.join(d2, "cmp")]) == 0
    monkeypatch.setattr(mqar, "run_model", lambda spec, cfg, *args, **kwargs: _mqar_result(cfg))
    out = os.path.join(d2, "mqar")
    assert main(["eval", "mqar", "--models", "transformer-pro", "--out", out, "--no-progress"]) == 0
    for folder in ("cmp", "mqar", os.path.join("mqar", "models")):
        _old_style(os.path.join(d2, folder))
    assert left_out_of(d2)["outputs_by_files"] == {
        "d2/cmp": ["compare.json"], "d2/mqar": ["mqar.json", os.path.join("models", "transformer-pro.json")]}
    # a table without its JSON, or a document beside the results, may be the user's: the folder is read
    os.remove(os.path.join(d2, "cmp", "compare.json"))
    with open(os.path.join(d2, "mqar", "notes.txt"), "w") as f:
        f.write(TEXT)
    documents = lambda name: name.endswith((".json", ".md", ".txt"))  # noqa: E731
    assert eval_results_in(os.path.join(d2, "cmp"), documents) == []
    assert eval_results_in(os.path.join(d2, "mqar"), documents) == []
    assert eval_results_in(os.path.join(d2, "mqar", "models"), documents) == ["transformer-pro.json"]


@pytest.mark.parametrize("content", [
    '{\n  "command": "eval loss",\n  "models": []\n}\n',
    '{"command": "eval loss", "models": [], "plots": []}\n',
    '{\n  "command": "eval loss", "models": [], "plots": [\n',
], ids=["not-every-key", "json-lines", "cut-short"])
def test_a_json_file_not_of_eval_results_leaves_its_folder_read(tmp_path, content):
    """Only the keys of eval's results, in the indented JSON eval writes, tell a folder: one JSON Lines line of
    documents is never taken for them."""
    from foxformer.data.layout import eval_results_in

    (tmp_path / "loss.json").write_text(content)
    assert eval_results_in(str(tmp_path), lambda name: True) == []
    (tmp_path / "loss.json").write_text('{\n  "command": "eval loss",\n  "models": [],\n  "plots": []\n}\n')
    assert eval_results_in(str(tmp_path), lambda name: True) == ["loss.json"]


class _CutShort:
    """Every file an eval command writes under ``folder`` (its atomic writes end in os.replace, report's copied
    images in shutil.copyfile) is stopped at the ``at``-th, as a Ctrl-C between two files would; ``marked``: whether
    the folder held the mark as each was written."""

    def __init__(self, folder: str, monkeypatch, at: int = 2):
        import shutil

        self.folder, self.at, self.written, self.marked = os.path.abspath(folder), at, [], []
        for module, name in ((os, "replace"), (shutil, "copyfile")):
            monkeypatch.setattr(module, name, self._stopping(getattr(module, name)))

    def _stopping(self, write):
        def stopping(src, dst, *args, **kwargs):
            path = os.path.abspath(dst)
            if os.path.commonpath([path, self.folder]) == self.folder and os.path.basename(path) != EVAL_MARK:
                self.marked.append(os.path.isfile(os.path.join(self.folder, EVAL_MARK)))
                self.written.append(os.path.relpath(path, self.folder))
                if len(self.written) == self.at:
                    raise KeyboardInterrupt
            return write(src, dst, *args, **kwargs)
        return stopping


# each command of several files: its arguments, writing into ``out``, given the model, the folder of documents and
# the test's monkeypatch (which may stand in for what it needs), and the first two files it writes
SEVERAL_FILES = {
    "eval-loss": (lambda model, d2, out, patch: ["eval", "loss", model] + COMMANDS["eval-loss"][1](d2, out),
                  ["loss_curve.png", "perplexity.png"]),
    "eval-niah": (lambda model, d2, out, patch: ["eval", "niah", model] + COMMANDS["eval-niah"][1](d2, out),
                  ["niah_ll_heatmap.png", "niah.json"]),
    "analyze-gates": (lambda model, d2, out, patch: ["analyze", "gates", model, "--source", d2, "--seq-len", "24",
                                                     "--num-seqs", "2", "--matrix-len", "16", "--names", "fox", "--out", out],
                      ["gates_fox_decay.png", "gates_fox_attention.png"]),
    "eval-eviction": (lambda model, d2, out, patch: ["eval", "eviction", model, "--source", d2, "--seq-len", "48",
                                                     "--evict-eps", "1e-3", "--out", out],
                      ["eviction.png", "eviction.json"]),
    "eval-compare": (lambda model, d2, out, patch: ["eval", "compare", _evaluated(model, d2), "--out", out],
                     ["loss_curves.png", "loss_difference.png"]),
    "report": (lambda model, d2, out, patch: ["report", _evaluated(model, d2), "--out", out],
               [os.path.join("assets", "0_run_loss_curve.png"), os.path.join("assets", "0_run_perplexity.png")]),
    "eval-mqar": (lambda model, d2, out, patch: (
        patch.setattr("foxformer.eval.mqar.run_model", lambda spec, cfg, *args, **kwargs: _mqar_result(cfg)),
        ["eval", "mqar", "--models", "transformer-pro", "--out", out])[1],
        [os.path.join("models", "transformer-pro.json"), "mqar.md"]),
}


@pytest.mark.parametrize("command", SEVERAL_FILES)
def test_a_command_of_several_files_marks_its_folder_before_the_first(model, d2, capsys, monkeypatch, command):
    """`eval compare` wrote compare.md, and `eval mqar` mqar.md, before the JSON that marked their folder: cut short
    between the two, a folder of results was left unmarked, and read as documents by a walk of a source holding it."""
    argv, first_two = SEVERAL_FILES[command]
    argv = argv(model, d2, "ev", monkeypatch)
    cut = _CutShort("ev", monkeypatch)
    assert main(argv + ([] if command == "eval-mqar" else ["--no-progress"]) +
                (["--device", "cpu"] if command in ("analyze-gates", "eval-eviction") else [])) == 130
    assert capsys.readouterr().err.splitlines()[-1] == "interrupted"
    assert cut.written == first_two and cut.marked == [True, True]
    assert os.path.isfile(os.path.join("ev", first_two[0])) and not os.path.exists(os.path.join("ev", first_two[1]))
    assert os.path.isfile(os.path.join("ev", EVAL_MARK))
