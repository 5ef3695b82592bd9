"""An eval's output folder inside its source folder: `eval loss --source d2 --out d2/ev`, run again, read d2/ev/loss.json
as a document and failed with a JSON Lines error. The reading passes over that folder, as `data prepare` passes over its
own, and says so; an output folder that is the source folder itself is refused before the models load."""
import json
import os

import pytest

from foxformer.cli import main

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


def test_bias_shift_refuses_a_json_file_written_into_the_source_folder(model, d2, capsys):
    """Its --out names the file: its folder is known to be the source only as the source is read."""
    assert main(["bias-shift", model, "--source", d2, "--shifts", "0", "--seq-len", "24", "--out",
                 os.path.join(d2, "shift.json"), "--device", "cpu", "--no-progress"]) == 2
    assert "error: --out: 'd2' is the --source folder itself" in capsys.readouterr().err
    assert not os.path.exists(os.path.join(d2, "shift.json"))
