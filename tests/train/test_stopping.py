"""StopSignals: what one signal, its copy, and a second one do (the loop's use of it is in test_loop.py, a job's
in test_user_path.py and test_distributed.py)."""
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from foxformer.train.stopping import StopSignals, exit_status, launcher_note

SRC = os.path.join(os.path.dirname(__file__), "..", "..", "src")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGUSR1], ids=lambda s: s.name)
def test_a_stop_signal_is_recorded_and_its_copy_is_the_same_request(sig):
    with StopSignals() as stop:
        os.kill(os.getpid(), sig)
        os.kill(os.getpid(), sig)  # the launcher's copy, milliseconds later: no second request, the process lives
        assert (stop.requested, stop.name) == (True, sig.name)
    assert exit_status(stop.name) == 128 + sig


def test_sigint_raises_once_for_a_ctrl_c_and_its_copy():
    # Python's own handler, as in a terminal: a shell starts a background job (`pytest ... &`) with SIGINT
    # ignored, which StopSignals rightly leaves ignored, and the Ctrl-C would raise nothing
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with StopSignals() as stop:
            with pytest.raises(KeyboardInterrupt):
                os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGINT)  # torchrun's copy of the same Ctrl-C: the handling it would cut goes on
            assert not stop.requested
    finally:
        signal.signal(signal.SIGINT, before)


def test_the_handlers_before_come_back_and_an_ignored_signal_stays_ignored():
    def mine(*args):
        pass

    previous = signal.signal(signal.SIGTERM, mine)
    ignored = signal.signal(signal.SIGUSR1, signal.SIG_IGN)  # as `nohup` or a parent may leave a signal
    try:
        with StopSignals() as stop:
            os.kill(os.getpid(), signal.SIGUSR1)
            assert not stop.requested
        assert signal.getsignal(signal.SIGTERM) is mine and signal.getsignal(signal.SIGUSR1) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGUSR1, ignored)



@pytest.mark.parametrize("ignored, said", [
    ((), None),
    ((signal.SIGINT, signal.SIGTERM), f"stop it with `kill -USR1 {os.getpid()}`, which ends it after the step"),
    ((signal.SIGINT, signal.SIGTERM, signal.SIGUSR1), "no signal but SIGKILL stops it")],
    ids=["sigint-handled", "sigterm-ignored-too", "every-stop-signal-ignored"])
def test_the_note_on_an_ignored_sigint_names_a_signal_that_stops_the_run(ignored, said):
    before = {sig: signal.signal(sig, signal.SIG_IGN if sig in ignored else signal.default_int_handler)
              for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)}
    try:
        with StopSignals() as stop:
            note = stop.interrupt_note(environ={})
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
    assert note is None if said is None else said in note, note


# A process asked to stop by SIGTERM, then signalled again WAIT seconds later; the window is shortened to 0.2 s.
_TWICE = textwrap.dedent("""
    import os, signal, sys, time
    from foxformer.train import stopping
    stopping.REPEAT_WINDOW_S = 0.2
    with stopping.StopSignals(exiting=True) as stop:
        os.kill(os.getpid(), signal.SIGUSR1)
        time.sleep(0.3)
        if sys.argv[1] != "saving":
            print("said where it stopped", end="")  # no newline: a pipe's buffer holds it until the exit
            stop.done()
        if sys.argv[1] != "after-the-block":
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.1)
        print(" in the block", end="")
    os.kill(os.getpid(), signal.SIGTERM)  # the process's last moments (a teardown that hangs), the stop done
    print(" after the block", flush=True)
""")


@pytest.mark.parametrize("when, status, said", [
    ("saving", -signal.SIGTERM, ""),
    ("done", 128 + signal.SIGUSR1, "said where it stopped"),
    ("after-the-block", 128 + signal.SIGUSR1, "said where it stopped in the block")],
    ids=["second-while-saving-ends-it-by-the-signal", "after-the-checkpoint-ends-it-with-the-stops-status",
         "after-the-block-too"])
def test_a_second_signal_ends_the_process_at_once(when, status, said):
    """A second signal (later than a launcher's copy) ends the process at once: by the signal, without a
    checkpoint, while the stop's checkpoint is being saved; once it is committed, with the stop's own status (a
    SIGUSR1 stop: 138) and what the process printed, also after the block, where a teardown may hang."""
    proc = subprocess.run([sys.executable, "-c", _TWICE, when], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": SRC})
    assert (proc.returncode, proc.stdout) == (status, said), proc.stderr


def test_a_copy_of_the_first_signal_does_not_end_a_stop_that_is_done():
    """A run stopped while it loads is done milliseconds after the signal: the launcher's copy of it, arriving
    then, is the same request, not a second one."""
    with StopSignals() as stop:
        os.kill(os.getpid(), signal.SIGTERM)
        stop.done()
        os.kill(os.getpid(), signal.SIGTERM)  # within the window: the process lives
        assert stop.name == "SIGTERM"


_TORCHRUN = {"TORCHELASTIC_RUN_ID": "r1", "TORCHELASTIC_SIGNALS_TO_HANDLE": "SIGTERM,SIGINT,SIGHUP,SIGQUIT"}


@pytest.mark.parametrize("environ, lost", [
    ({**_TORCHRUN, "SLURM_JOB_ID": "7"}, "SIGUSR1"),
    (_TORCHRUN, None),  # outside SLURM nothing sends SIGUSR1 unasked
    ({**_TORCHRUN, "SLURM_JOB_ID": "7", "TORCHELASTIC_SIGNALS_TO_HANDLE": "SIGTERM,SIGINT,SIGUSR1"}, None),
    ({**_TORCHRUN, "TORCHELASTIC_SIGNALS_TO_HANDLE": "SIGINT"}, "SIGTERM"),
    ({"TORCHELASTIC_RUN_ID": "r1", "SLURM_JOB_ID": "7"}, None),  # a torchrun without the option: it cannot tell
    ({"TORCHELASTIC_SIGNALS_TO_HANDLE": "SIGTERM", "SLURM_JOB_ID": "7"}, None),  # set by hand, no torchrun
], ids=["slurm-default-torchrun", "default-torchrun-outside-slurm", "slurm-sigusr1-handled", "sigterm-not-handled",
        "torchrun-without-the-option", "no-torchrun"])
def test_the_launcher_note_names_a_stop_signal_torchrun_will_not_pass_on(environ, lost):
    note = launcher_note(environ)
    if lost is None:
        assert note is None
    else:
        handled = environ["TORCHELASTIC_SIGNALS_TO_HANDLE"]
        assert f"and {lost} sent to it ends it at once" in note
        assert note.endswith(f"launch with torchrun --signals-to-handle {handled},{lost}")


def test_a_torchrun_worker_in_a_slurm_job_is_told_to_have_sigusr1_passed_on():
    """What a worker of the installed torchrun sees, with its default signals and with SIGUSR1 added."""
    code = "from foxformer.train.stopping import launcher_note; print(launcher_note())"
    said = []
    for extra in ([], ["--signals-to-handle", "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1"]):
        proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                               "1", *extra, "--no-python", sys.executable, "-c", code], capture_output=True,
                              text=True, timeout=120, env={**os.environ, "PYTHONPATH": SRC, "SLURM_JOB_ID": "7"})
        assert proc.returncode == 0, proc.stderr
        said.append(proc.stdout.strip())
    assert said[0].endswith("launch with torchrun --signals-to-handle SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1")
    assert said[1] == "None"
