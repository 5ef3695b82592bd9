"""The batch geometry of a step: how its sequences split over ranks and micro-batches."""

from __future__ import annotations

from dataclasses import dataclass

from .config import TrainConfig


@dataclass
class Plan:
    """Batch geometry derived from the config and the world size."""

    seqs_per_step: int   # S, all ranks
    seqs_per_rank: int
    micro_batch: int     # sequences per forward
    accum: int           # micro-batches per step per rank


def make_plan(cfg: TrainConfig, world: int, device_type: str) -> Plan:
    seqs = cfg.batch_tokens // cfg.context
    if seqs % world:
        unit = world * cfg.context
        near = " or ".join(f"{n:,}" for n in (seqs // world * unit, (seqs // world + 1) * unit) if n)
        # batch_tokens may not change on resume (it is what a step computes): there, the process count is the fix
        counts = ", ".join(str(d) for d in range(1, seqs + 1) if seqs % d == 0)
        raise ValueError(f"batch_tokens: {cfg.batch_tokens:,} tokens = {seqs} sequences of {cfg.context} cannot be "
                         f"split evenly over {world} ranks: give {near} (multiples of {world} ranks x {cfg.context}), "
                         f"or launch a number of processes that divides {seqs} ({counts})")
    per_rank = seqs // world
    mbs = cfg.micro_batch_size
    if mbs == 0:  # largest divisor of per_rank within a token budget per forward
        budget = max(1, (32768 if device_type == "cuda" else 8192) // cfg.context)
        mbs = max(d for d in range(1, per_rank + 1) if per_rank % d == 0 and d <= budget)
    if per_rank % mbs:
        fits = ", ".join(str(d) for d in range(1, per_rank + 1) if per_rank % d == 0)
        raise ValueError(f"micro_batch_size: {mbs} does not divide the {per_rank} sequences per rank and step "
                         f"({seqs} sequences of {cfg.context} over {world} rank{'s' * (world > 1)}): give one that "
                         f"does ({fits}), or 0 to let the run choose")
    return Plan(seqs_per_step=seqs, seqs_per_rank=per_rank, micro_batch=mbs, accum=per_rank // mbs)
