"""Progress bars off a terminal: `cmd 2> run.log` (nohup, a pipe) got a carriage-return frame at every update of
every bar, all on one endless line of the log. Only `train` had stopped drawing there; every bar follows
foxformer.progress.bars_shown now, and --no-progress still turns them off on a terminal."""
import io
import sys

import pytest
import torch
import tqdm.std

from foxformer.data.preparation import PrepareConfig, prepare
from foxformer.eval.gates import gate_stats
from foxformer.eval.loss import per_token_loss
from foxformer.models.calls import hf_progress
from foxformer.progress import bars_shown
from tests.bars import Terminal
from tests.eval.helpers import tiny_model


@pytest.mark.parametrize("wanted, terminal, shown", [(True, True, True), (True, False, False),
                                                     (False, True, False), (False, False, False)],
                         ids=["wanted-on-a-terminal", "wanted-into-a-log", "no-progress-on-a-terminal",
                              "no-progress-into-a-log"])
def test_a_bar_is_drawn_only_where_wanted_and_on_a_terminal(monkeypatch, wanted, terminal, shown):
    monkeypatch.setattr(sys, "stderr", Terminal() if terminal else io.StringIO())
    assert bars_shown(wanted) is shown


def _prepare(tmp_path):
    tmp_path.mkdir()
    book = tmp_path / "book.txt"
    book.write_text("A short book. " * 50 + "\n\n" + "Another part. " * 30, encoding="utf-8")
    prepare(PrepareConfig(sources=[str(book)], out_dir=str(tmp_path / "data"), val_fraction=0.0), progress=True)


def _loss(tmp_path):
    per_token_loss(tiny_model(), torch.randint(0, 97, (3, 16)), progress=True)


def _gates(tmp_path):
    gate_stats(tiny_model(), torch.randint(0, 97, (3, 16)), batch_size=1, progress=True)


@pytest.mark.parametrize("run", [_prepare, _loss, _gates], ids=["data-prepare", "eval-loss", "eval-gates"])
def test_a_log_gets_no_bar_frames_and_a_terminal_gets_the_bar(tmp_path, monkeypatch, run):
    log = io.StringIO()
    monkeypatch.setattr(sys, "stderr", log)
    run(tmp_path / "log")
    assert "\r" not in log.getvalue() and "|" not in log.getvalue()
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    run(tmp_path / "terminal")
    assert "\r" in terminal.getvalue() and "%|" in terminal.getvalue()


def test_transformers_loading_bars_follow_the_same_rule(monkeypatch):
    from transformers.utils import logging

    monkeypatch.setattr(sys, "stderr", io.StringIO())
    with hf_progress(True):
        assert not logging.is_progress_bar_enabled()
    monkeypatch.setattr(sys, "stderr", Terminal())
    with hf_progress(True):
        assert logging.is_progress_bar_enabled()
    with hf_progress(False):
        assert not logging.is_progress_bar_enabled()


def test_where_no_bar_is_drawn_a_long_loop_says_how_far_it_got_in_plain_lines(monkeypatch):
    """Off a terminal (or with --no-progress) `eval loss` and `eval niah` said nothing while they ran: a 100K-token
    needle grid ran ten minutes and more in silence on a CPU. Now a line comes at most every LINE_EVERY_S seconds,
    none after the last step (the command's own output follows), and a short loop prints nothing."""
    import foxformer.progress as progress

    log = io.StringIO()
    monkeypatch.setattr(sys, "stderr", log)
    per_token_loss(tiny_model(), torch.randint(0, 97, (3, 16)), progress=False)
    assert log.getvalue() == ""
    monkeypatch.setattr(progress, "LINE_EVERY_S", 0.0)
    per_token_loss(tiny_model(), torch.randint(0, 97, (3, 16)), progress=False)
    lines = log.getvalue().splitlines()
    assert [line.split(",")[0] for line in lines] == ["loss: batch 1/3 done", "loss: batch 2/3 done"], lines
    assert all(line.endswith(" elapsed") and "\r" not in line for line in lines)
    monkeypatch.setattr(sys, "stderr", Terminal())  # a bar on a terminal, no plain lines
    bar = progress.progress_bar(range(2), desc="x", unit="y", wanted=True)
    assert isinstance(bar, tqdm.std.tqdm)
    bar.close()


def test_plain_lines_stand_in_for_the_bar_methods_the_loops_call(monkeypatch):
    """mqar's set_postfix, the source fingerprint's `with` and its bytes as 1.23M: the loops call progress_bar
    alone, with no tqdm of their own beside it for these."""
    import foxformer.progress as progress

    log = io.StringIO()
    monkeypatch.setattr(sys, "stderr", log)
    monkeypatch.setattr(progress, "LINE_EVERY_S", 0.0)
    with progress.progress_bar(total=3_000_000, desc="fingerprint sources", unit="B", unit_scale=True, delay=2.0,
                               wanted=False) as bar:
        bar.update(1_500_000)
        bar.set_postfix(loss="0.123", refresh=False)
        bar.update(1_500_000)
    assert log.getvalue().startswith("fingerprint sources: B 1.50M/3.00M done, "), log.getvalue()
    assert len(log.getvalue().splitlines()) == 1


@pytest.mark.parametrize("wanted", [True, False], ids=["into-a-log", "no-progress"])
def test_a_single_long_item_says_what_it_computes_while_it_runs(monkeypatch, wanted):
    """The plain lines came as items ended: one long loss batch (or needle trial) was silent until it ended. Now a
    line comes at most every LINE_EVERY_S while an item runs, saying which one and its size."""
    import time

    import foxformer.progress as progress

    log = io.StringIO()
    monkeypatch.setattr(sys, "stderr", log)
    monkeypatch.setattr(progress, "LINE_EVERY_S", 0.2)
    model = tiny_model()
    model.model.register_forward_pre_hook(lambda *_: time.sleep(0.5))  # the one batch outlasts the interval
    start = time.monotonic()
    per_token_loss(model, torch.randint(0, 97, (2, 16)), batch_size=2, progress=wanted)
    took = time.monotonic() - start
    lines = log.getvalue().splitlines()
    assert lines and all(line.startswith("loss: batch 1/1 running (2 sequence(s) of 16 tokens), ") and
                         line.endswith(" elapsed") for line in lines), lines
    assert len(lines) <= took / 0.2  # one a LINE_EVERY_S at most, and none once the batch is done
    time.sleep(0.3)
    assert log.getvalue().splitlines() == lines


def test_an_item_of_many_units_says_the_units_done_before_it(monkeypatch):
    """A 21,229-token prompt read in one forward said "prefill: tok 1.00/21.2k running" (the item's number, as for a
    needle trial, in a bar that counts tokens); it says the tokens read so far, and the chunk it reads."""
    import time

    import foxformer.progress as progress

    log = io.StringIO()
    monkeypatch.setattr(sys, "stderr", log)
    monkeypatch.setattr(progress, "LINE_EVERY_S", 0.05)
    bar = progress.progress_bar(total=21_229, desc="prefill", unit="tok", unit_scale=True, wanted=False)
    with progress.working(bar, "21,229 prompt tokens from token 0", 21_229):
        time.sleep(0.3)
    bar.update(21_229)
    lines = log.getvalue().splitlines()
    assert lines and all(line.startswith("prefill: tok 0/21.2k done, running (21,229 prompt tokens from token 0), ")
                         for line in lines), lines


def test_a_drawn_bar_gets_no_plain_lines_while_an_item_runs(monkeypatch):
    import time

    import foxformer.progress as progress

    monkeypatch.setattr(sys, "stderr", Terminal())
    monkeypatch.setattr(progress, "LINE_EVERY_S", 0.01)
    bar = progress.progress_bar(total=1, desc="x", unit="y", wanted=True, delay=10.0)
    with progress.working(bar, "an item"):
        time.sleep(0.1)
    assert "running" not in sys.stderr.getvalue()
    bar.close()
