"""Shared by the training tests: a step hook that simulates a crash."""


class Crash(RuntimeError):
    pass


def crash_at(step):
    """A train() hook that raises Crash right after step ``step`` (what a kill at that moment leaves)."""
    def hook(s, rec):
        if s == step:
            raise Crash(f"simulated crash after step {s}")
    return hook


def signal_once(proc, path, sig, timeout=240.0):
    """Send ``sig`` to the running ``proc`` as soon as ``path`` exists (e.g. a checkpoint folder)."""
    import os
    import time

    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        if os.path.exists(path):
            proc.send_signal(sig)
            return
        time.sleep(0.01)
