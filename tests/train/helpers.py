"""Shared by the training tests: a step hook that simulates a crash."""


class Crash(RuntimeError):
    pass


def crash_at(step):
    """A train() hook that raises Crash right after step ``step`` (what a kill at that moment leaves)."""
    def hook(s, rec):
        if s == step:
            raise Crash(f"simulated crash after step {s}")
    return hook


def signal_once(proc, path, sig, timeout=240.0, children=False):
    """Send ``sig`` to the running ``proc`` as soon as ``path`` exists (e.g. a checkpoint folder); ``children``:
    to its child processes too (torchrun's workers), as SLURM signals every process of a job step."""
    import os
    import time

    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        if os.path.exists(path):
            for pid in child_pids(proc.pid) if children else ():
                os.kill(pid, sig)
            proc.send_signal(sig)
            return
        time.sleep(0.01)


def child_pids(pid):
    """The processes whose parent is ``pid`` (Linux: read from /proc)."""
    import os

    found = []
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{name}/stat") as f:
                # "pid (command) state ppid ...": the command may hold spaces and parentheses
                if int(f.read().rpartition(")")[2].split()[1]) == pid:
                    found.append(int(name))
        except (OSError, IndexError, ValueError):  # the process ended meanwhile
            pass
    return found
