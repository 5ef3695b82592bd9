"""Shared by the training tests: a step hook that simulates a crash."""


class Crash(RuntimeError):
    pass


def crash_at(step):
    """A train() hook that raises Crash right after step ``step`` (what a kill at that moment leaves)."""
    def hook(s, rec):
        if s == step:
            raise Crash(f"simulated crash after step {s}")
    return hook
