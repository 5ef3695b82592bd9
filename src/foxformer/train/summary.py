"""What `train()` returns: one set of keys whether the run trained, stopped, or was already at its end, so that
a script reading the printed summary finds every key every time."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class RunSummary:
    out_dir: str
    step: int
    tokens: int
    train_loss: float | None
    val_loss: float | None
    tokens_per_s: float | None  # None where no step was timed
    resumed_from: str | None
    hf_dir: str | None
    params: int | None
    non_embedding_params: int | None
    world_size: int
    parallel: str
    device: str
    wall_s: float
    time_limit: bool = False  # stopped at max_minutes before the end of its schedule
    stopped_by: str | None = None  # the signal ("SIGTERM") that stopped the run before the end of its schedule
    trained: bool = True  # False: no step was taken (the run was at its end already, or a signal came first)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)
