"""A command's error under torchrun: said by rank 0, and each failed rank's entry in torchrun's summary."""
import json

import pytest
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

from foxformer.train import elastic

LINE = "error: --data (data_dir): 'nope' does not exist"


@pytest.mark.parametrize("rank", ["0", "1"])
def test_the_line_is_said_by_rank_0_and_is_every_ranks_entry_in_torchruns_summary(monkeypatch, tmp_path, capsys,
                                                                                    rank):
    """torchrun's summary said "error_file: <N/A>" and "To enable traceback see: ..." for an error the command
    turned into its exit status, and gave record's traceback where one escaped it."""
    path = tmp_path / "error.json"
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", rank)
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(path))
    elastic.say_error(LINE)
    assert capsys.readouterr().err == (LINE + "\n" if rank == "0" else "")
    # read back as torchrun reads a failed worker's file
    failure = ProcessFailure(local_rank=int(rank), pid=1, exitcode=2, error_file=str(path))
    summary = ChildFailedError("foxformer.cli", {int(rank): failure}).format_msg()
    assert f"  traceback : {LINE}\n" in summary and "<N/A>" not in summary and "To enable" not in summary
    assert json.loads(path.read_text())["message"]["message"] == LINE


def test_a_process_of_its_own_says_it_and_leaves_no_file(monkeypatch, tmp_path, capsys):
    """Without WORLD_SIZE a RANK left in the environment (a container's, another launcher's) silences nothing."""
    for name in ("WORLD_SIZE", "TORCHELASTIC_ERROR_FILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("RANK", "3")
    monkeypatch.chdir(tmp_path)
    elastic.say_error(LINE)
    assert capsys.readouterr().err == LINE + "\n" and not list(tmp_path.iterdir())
    assert not elastic.one_of_several()
