"""How the demo's --minutes are spent: measuring the models' speed, then sharing what is left between them.

--minutes is the whole demo from run_demo's start: data preparation, this measurement, both models' training,
validation, export and final evaluation, the plot and the report. Only Python loading torch before the demo starts
is outside it. The clock is a parameter so the arithmetic is tested without waiting.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Callable

# The first steps of a fresh model ran 4-10x slower than training later did on a loaded 2-core machine (a 1-minute
# demo planned 4 steps from 1,426 tok/s where training ran at 5-14K): they warm up untimed.
WARMUP_ROUNDS = 2
TIMED_ROUNDS = (3, 12)      # at least, at most; between them the measurement runs for its share of the budget
MEASURE_SHARE = 0.04        # of the budget
FORWARD_SHARE = 1 / 3       # an evaluation token costs about a third of a training token (no backward, no update)
FIXED_S_PER_MODEL = 2.0     # checkpoints, the Hugging Face export and loading it back (tiny models: seconds)
REPORT_S = 2.0              # the plot and the report
SAFETY = 0.96               # step time varies on a shared machine; the time limit catches the rest
LIMIT_FACTOR = 1.25         # a model's time limit over its planned training run, at least
MIN_STEPS = 4               # fewer steps show no learning curve


@dataclass(frozen=True)
class Clocked:
    """The demo's deadline on ``clock`` (seconds), started when made."""

    minutes: float
    clock: Callable[[], float]
    start: float

    @classmethod
    def starting(cls, minutes: float, clock: Callable[[], float]) -> "Clocked":
        return cls(minutes, clock, clock())

    def elapsed_s(self) -> float:
        return self.clock() - self.start

    def left_s(self) -> float:
        return 60 * self.minutes - self.elapsed_s()


def measure_speeds(steps: dict[str, Callable[[], int]], clock: Callable[[], float], seconds: float) -> dict[str, float]:
    """Tokens/s of each model's training step; ``steps[name]()`` takes one step and returns its tokens.

    Rounds of one step per model, so that a burst of other load falls on both alike; after WARMUP_ROUNDS untimed
    ones, timed rounds go on until ``seconds`` have passed (warm-up included), within TIMED_ROUNDS. Each model's
    lower quartile of step times: other load only slows a step, and a burst of it over half the measurement
    set the median (in a 3-minute demo, 4,924 tok/s for FoX, which then trained at 17K); the single fastest
    step overstates what training keeps up."""
    times: dict[str, list[float]] = {name: [] for name in steps}
    begun = clock()
    for _ in range(WARMUP_ROUNDS):
        for step in steps.values():
            step()
    lo, hi = TIMED_ROUNDS
    rounds = 0
    tokens = {}
    while rounds < lo or (rounds < hi and clock() - begun < seconds):
        for name, step in steps.items():
            t0 = clock()
            tokens[name] = step()
            times[name].append(clock() - t0)
        rounds += 1
    # a clock too coarse for one step (Windows' 16 ms) would divide by zero
    return {name: tokens[name] / max(statistics.quantiles(ts, n=4, method="inclusive")[0], 1e-6)
            for name, ts in times.items()}


def eval_tokens_per_model(final_tokens: int, during_tokens: int, evals_during: int) -> int:
    """The tokens a model's evaluations read: ``evals_during`` validations of ``during_tokens`` while it trains,
    then the demo's own of ``final_tokens``."""
    return final_tokens + evals_during * during_tokens


@dataclass(frozen=True)
class Shares:
    """The steps each model trains (the same for both: they see the same tokens), each one's share of the demo in
    minutes (its training run, then evaluating and saving) and of that its training run's."""

    steps: int
    minutes: dict[str, float]
    run_minutes: dict[str, float]
    overrun: bool  # what was left could not hold MIN_STEPS of each model with its evaluation


def share_out(left_s: float, speeds: dict[str, float], batch_tokens: int, eval_tokens: int) -> Shares:
    """Split ``left_s`` seconds between the models, which train in the order of ``speeds``: each one's evaluation
    (``eval_tokens`` read per model) and fixed costs and the report come off first, the rest is training."""
    evaluating = {name: eval_tokens * FORWARD_SHARE / s for name, s in speeds.items()}
    reserve = REPORT_S + sum(FIXED_S_PER_MODEL + e for e in evaluating.values())
    step_pair_s = sum(batch_tokens / s for s in speeds.values())
    fit = int(SAFETY * (left_s - reserve) / step_pair_s) if left_s > reserve else 0
    steps = max(MIN_STEPS, fit)
    run_s = {name: steps * batch_tokens / s + evaluating[name] for name, s in speeds.items()}
    return Shares(steps, {name: (s + FIXED_S_PER_MODEL) / 60 for name, s in run_s.items()},
                  {name: s / 60 for name, s in run_s.items()}, overrun=fit < MIN_STEPS)


def run_limit(name: str, left_s: float, shares: Shares) -> float | None:
    """The time limit in minutes of ``name``'s training run, starting with ``left_s`` seconds of the demo left: what
    the models after it and the report leave, at least LIMIT_FACTOR times its planned run (a model that trained
    faster than planned leaves its time to the next). None for a plan of MIN_STEPS: a limit would cut the least
    that shows a learning curve."""
    if shares.steps <= MIN_STEPS:
        return None
    names = list(shares.minutes)
    later = REPORT_S + 60 * sum(shares.minutes[n] for n in names[names.index(name) + 1:])
    after_run = 60 * (shares.minutes[name] - shares.run_minutes[name])
    limit = max(LIMIT_FACTOR * shares.run_minutes[name], (left_s - later - after_run) / 60)
    return math.ceil(limit * 100) / 100  # hundredths, rounded up: the run's start line prints it as it is
