"""Stopping a run on a signal: what a scheduler sends before it kills a job, and Ctrl-C.

SIGTERM (SLURM's scancel, its time limit, and most schedulers' preemption) and SIGUSR1 (SLURM's ``--signal``
warning before the time limit) ask for a stop: the loop finishes the step in progress, the ranks agree at the
step's end, save a checkpoint and ``foxformer train`` exits with :func:`exit_status`. A second one later than
:data:`REPEAT_WINDOW_S` ends the process at once: by the signal itself, without a checkpoint, while the stop's
checkpoint is not yet committed; with :func:`exit_status` once it is (nothing is lost then, and a teardown that
hangs, such as a process group's destroy, needs no SIGKILL). Ctrl-C (SIGINT) abandons the step in progress
(KeyboardInterrupt), as in any Python program.

torchrun passes on to its workers only the signals of its ``--signals-to-handle`` (SIGTERM, SIGINT, SIGHUP,
SIGQUIT by default) and dies of any other at once: :func:`launcher_note` says so where a stop signal would be lost.

One signal often arrives twice: SLURM signals every process of a job step and torchrun forwards what it got to
its workers again, a few milliseconds apart. A repeat within the window is that one request, not a second.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

# Signals that ask for a stop at the end of the step in progress.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
REPEAT_WINDOW_S = 2.0


def exit_status(name: str) -> int:
    """What `foxformer train` exits with after a stop on the signal ``name`` ("SIGTERM"): 128 + its number (143
    for SIGTERM, 138 for SIGUSR1), what a shell reports for a process that signal ended, so job scripts that
    treat 143 as "preempted" (requeue, resume) keep working."""
    return 128 + signal.Signals[name]


class StopSignals:
    """While the ``with`` block runs: :attr:`signum` is the first stop signal received (None until then), and
    SIGINT raises KeyboardInterrupt once per :data:`REPEAT_WINDOW_S`; a signal ignored before stays ignored.
    The previous handlers come back at its end; with ``exiting`` (the block ends the process), after a stop that
    is :meth:`done` the stop signals keep ending the process at once to its end. Outside the main thread (where Python lets no handler be
    installed) it installs nothing."""

    def __init__(self, exiting: bool = False) -> None:
        self.signum: int | None = None
        self.exiting = exiting
        self._done = False
        self._stop_at = 0.0
        self._interrupt_at: float | None = None
        self._previous: dict = {}
        self.ignored: tuple[int, ...] = ()  # what the process was started to ignore, left ignored (__enter__)

    @property
    def requested(self) -> bool:
        return self.signum is not None

    @property
    def name(self) -> str | None:
        return None if self.signum is None else signal.Signals(self.signum).name

    def done(self) -> None:
        """The stop's checkpoint is committed: from now on a stop signal (but the first one's copy) ends the
        process at once with :func:`exit_status`. Under torchrun the launcher signals the ranks still running once
        one has exited, so rank 0 says where the run stopped before any rank may exit (train.cli)."""
        self._done = True

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            handlers = {**{sig: self._stop for sig in STOP_SIGNALS}, signal.SIGINT: self._interrupt}
            self.ignored = tuple(sig for sig in handlers if signal.getsignal(sig) is signal.SIG_IGN)
            for sig, handler in handlers.items():
                # a signal the process was started to ignore (`nohup`, a background job's SIGINT) stays ignored:
                # the shell ignored it so that a Ctrl-C meant for its foreground command spares this one
                if sig not in self.ignored:
                    self._previous[sig] = signal.signal(sig, handler)
        return self

    def interrupt_note(self, environ=os.environ) -> str | None:
        """A one-line note where the process was started with SIGINT ignored (a background job of a script, `cmd
        &` in a non-interactive shell), so that Ctrl-C and `kill -INT` do nothing at all, else None. It names the
        stop signal that does stop the run, and the process to send it to."""
        if signal.SIGINT not in self.ignored:
            return None
        left = [sig for sig in STOP_SIGNALS if sig not in self.ignored]
        if not left:
            return ("train: note: this process ignores SIGINT, SIGTERM and SIGUSR1 (so its parent started it), so "
                    "no signal but SIGKILL stops it, without a checkpoint of the steps since the last one; "
                    "--max-minutes bounds it")
        # torchrun passes a SIGTERM on to its workers; a worker signalled alone leaves the others waiting
        target = "torchrun's process" if "TORCHELASTIC_RUN_ID" in environ else str(os.getpid())
        name = left[0].name.removeprefix("SIG")
        return (f"train: note: this process was started with SIGINT ignored (a background job, `... &` in a "
                f"script), so Ctrl-C and kill -INT will not stop this run; stop it with `kill -{name} {target}`, "
                f"which ends it after the step in progress with a checkpoint")

    def __exit__(self, *exc) -> None:
        for sig, previous in self._previous.items():
            if not (self._done and self.exiting and sig in STOP_SIGNALS):
                signal.signal(sig, previous if previous is not None else signal.SIG_DFL)
        self._previous = {}

    def _stop(self, signum: int, frame) -> None:
        now = time.monotonic()
        if self.signum is None:
            self.signum, self._stop_at = signum, now
        elif now - self._stop_at < REPEAT_WINDOW_S:
            return  # the first one's copy: the stop is under way
        elif self._done:
            # the checkpoint is on disk: end with the stop's own status, whatever the teardown is waiting on
            _flush_output()
            os._exit(exit_status(self.name))
        else:
            self.end_by_signal(signum)

    def end_by_signal(self, signum: int | None = None) -> None:
        """End the process by ``signum`` (default: the stop signal received), as without this handler: a shell
        shows 128 + its number and no cleanup delays it."""
        signum = self.signum if signum is None else signum
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    def _interrupt(self, signum: int, frame) -> None:
        now = time.monotonic()
        if self._interrupt_at is not None and now - self._interrupt_at < REPEAT_WINDOW_S:
            return  # the launcher's copy of the Ctrl-C being handled: it would cut that handling short
        self._interrupt_at = now
        raise KeyboardInterrupt


def launcher_note(environ=os.environ) -> str | None:
    """A one-line note where the torchrun that started this process will not pass a stop signal on to it, else
    None. Its workers' environment holds its --signals-to-handle (TORCHELASTIC_SIGNALS_TO_HANDLE, with
    TORCHELASTIC_RUN_ID; a torchrun without the option sets neither, and then nothing is said). SIGUSR1 counts
    only in a SLURM job, where ``--signal=USR1@S`` sends it; elsewhere nothing sends it unasked."""
    handled = environ.get("TORCHELASTIC_SIGNALS_TO_HANDLE")
    if handled is None or "TORCHELASTIC_RUN_ID" not in environ:
        return None
    names = [name.strip() for name in handled.split(",") if name.strip()]
    lost = [sig.name for sig in STOP_SIGNALS
            if sig.name not in names and (sig != signal.SIGUSR1 or "SLURM_JOB_ID" in environ)]
    if not lost:
        return None
    lost_said = " and ".join(lost)
    return (f"train: note: torchrun passes on to its workers only {','.join(names) or 'no signal'} (its "
            f"--signals-to-handle), and {lost_said} sent to it ends it at once; for {lost_said} to stop the run with "
            f"a checkpoint, launch with torchrun --signals-to-handle {','.join(names + lost)}")


def _flush_output() -> None:
    """What the process printed so far (the summary, the note on where it stopped), before an ``os._exit`` that
    skips Python's own flush; a stream the interrupted code was writing to at that moment is left as it is."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, RuntimeError, AttributeError):  # closed, reentrant, or None
            pass
