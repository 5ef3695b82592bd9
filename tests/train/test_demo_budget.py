"""How the demo spends --minutes, on a fake clock: each fake step moves it by the time the step is said to take."""

import json

import pytest

from foxformer import demo
from foxformer.demo import budget


class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def fake_steps(clock: FakeClock, durations: dict[str, list[float]], order: list[str], tokens: int = 8192):
    """Steps that take the given seconds in turn (the last one repeats), recording which model stepped."""
    def step_of(name):
        left = list(durations[name])

        def step():
            order.append(name)
            clock.now += left.pop(0) if len(left) > 1 else left[0]
            return tokens
        return step
    return {name: step_of(name) for name in durations}


def test_the_speed_is_measured_after_warm_up_and_a_burst_of_load_does_not_set_it():
    """A 1-minute demo on a loaded 2-core machine planned 4 steps from 1,426 tok/s measured in FoX's first steps,
    where its training then ran at 5-14K tok/s."""
    clock, order = FakeClock(), []
    steps = fake_steps(clock, {"fox": [6.0, 6.0, 0.5, 3.0, 0.5, 0.5], "tf": [0.25]}, order)
    speeds = budget.measure_speeds(steps, clock, seconds=0.0)
    assert speeds == {"fox": 8192 / 0.5, "tf": 8192 / 0.25}
    # rounds of one step each, warm-up included: load falls on both models alike
    assert order == ["fox", "tf"] * (budget.WARMUP_ROUNDS + budget.TIMED_ROUNDS[0])


@pytest.mark.parametrize("seconds, rounds", [(0.0, 3), (4.0, 4), (1e9, 12)], ids=["at-least", "for-its-time", "at-most"])
def test_the_measurement_runs_for_its_time_within_its_rounds(seconds, rounds):
    clock, order = FakeClock(), []
    budget.measure_speeds(fake_steps(clock, {"fox": [0.5], "tf": [0.25]}, order), clock, seconds)
    # 2 warm-up rounds of 0.75 s, then timed ones until 4 s have passed: 3.75 s after the third, 4.5 after the fourth
    assert len(order) == 2 * (budget.WARMUP_ROUNDS + rounds)


def test_the_shares_fill_what_is_left_and_each_model_gets_its_own():
    speeds = {"fox": 20_000.0, "tf": 40_000.0}
    left, batch, evals = 150.0, 8192, 2**17 + 7 * 16384
    shares = budget.share_out(left, speeds, batch, evals)
    spent = budget.REPORT_S + sum(60 * m for m in shares.minutes.values())
    assert 0.9 * left <= spent <= left
    for name, s in speeds.items():  # half the speed, twice the time
        assert 60 * shares.run_minutes[name] == pytest.approx((shares.steps * batch + evals * budget.FORWARD_SHARE) / s)
        assert 60 * shares.minutes[name] == pytest.approx(60 * shares.run_minutes[name] + budget.FIXED_S_PER_MODEL)
    assert not shares.overrun


def test_a_models_limit_is_what_the_later_work_leaves_and_at_least_a_margin_over_its_plan():
    """Each model's limit was 1.5 * minutes + 0.25 (a 1-minute demo: "at most 1.75 minutes" for each)."""
    shares = budget.share_out(150.0, {"fox": 20_000.0, "tf": 40_000.0}, 8192, 2**17)
    fox, tf = shares.run_minutes["fox"], shares.run_minutes["tf"]
    # on plan: the margin; the last model: all that is left but the report and its own evaluation
    assert budget.run_limit("fox", 150.0, shares) == pytest.approx(budget.LIMIT_FACTOR * fox, abs=0.01)
    on_time = 60 * shares.minutes["tf"] + budget.REPORT_S
    assert budget.run_limit("tf", on_time, shares) == pytest.approx(budget.LIMIT_FACTOR * tf, abs=0.01)
    # FoX trained faster than planned: the transformer may use the time it left
    early = on_time + 30.0
    assert budget.run_limit("tf", early, shares) == pytest.approx(tf + 0.5, abs=0.01)


def test_too_little_time_left_trains_the_minimum_without_a_limit():
    shares = budget.share_out(2.0, {"fox": 20_000.0, "tf": 40_000.0}, 8192, 2**17)
    assert shares.steps == budget.MIN_STEPS and shares.overrun
    # a limit would cut the minimum short
    assert budget.run_limit("fox", 2.0, shares) is None and budget.run_limit("tf", 1.0, shares) is None


def test_the_plan_fits_the_whole_demo_in_its_minutes(tmp_path, monkeypatch):
    """--minutes was the training time of the two models alone, with a time limit of 1.5 * minutes + 0.25 for each:
    a 1-minute demo took 2.6 minutes, and each model's line said "at most 1.75 minutes". Now the data preparation and
    the measurement count, and the plan shares what they leave."""
    clock = FakeClock()
    clocked = budget.Clocked.starting(1.0, clock)
    clock.now += 7.0  # the data preparation
    speeds = {"fox-pro-tiny": 20_000.0, "transformer-pro-tiny": 40_000.0}

    def measure(geo, device, vocab_size, seconds):
        assert seconds == pytest.approx(budget.MEASURE_SHARE * 60)
        clock.now += 5.0
        return speeds

    monkeypatch.setattr(demo, "_measure", measure)
    said = []
    geo = demo._device_defaults("cpu")
    plan = demo._plan(str(tmp_path), clocked, "cpu", geo, 320, said.append)
    assert plan["total_tokens"] % geo["batch_tokens"] == 0 and plan["total_tokens"] > 40 * geo["batch_tokens"]
    spent = 12.0 + budget.REPORT_S + sum(60 * m for m in plan["shares"]["minutes"].values())
    assert 0.9 * 60 <= spent <= 60
    assert list(plan["shares"]["minutes"]) == list(demo.MODELS)  # the order they train in: run_limit reads it
    assert json.loads((tmp_path / "demo_plan.json").read_text())["total_tokens"] == plan["total_tokens"]
    # a rerun keeps the plan without measuring again
    monkeypatch.setattr(demo, "_measure", lambda *a: pytest.fail("measured again"))
    assert demo._plan(str(tmp_path), clocked, "cpu", geo, 320, said.append)["total_tokens"] == plan["total_tokens"]


def test_demo_help_says_what_minutes_count(capsys):
    from foxformer.cli import build_parser

    with pytest.raises(SystemExit):
        build_parser().parse_args(["demo", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "minutes the whole demo takes" in text and "not counted: Python loading torch" in text
