"""The throttle rule (shared.cooling.throttle) as tables: margins, polls, evidence, load."""

from __future__ import annotations

import pytest

from shared.cooling import throttle
from shared.cooling.throttle import (
    CLOCK_MARGIN,
    POLLS,
    RATE_MARGIN,
    ThrottlePoll,
    ThrottleVerdict,
    ThrottleWatch,
    judge,
)

GHZ = 1e9


def busy(ghz: float, active: float = 0.95) -> ThrottlePoll:
    return ThrottlePoll(gpu_hz=ghz * GHZ, gpu_active=active)


def states(verdicts: list[ThrottleVerdict]) -> list[bool | None]:
    return [v.throttling for v in verdicts]


def test_the_documented_numbers() -> None:
    """docs/thermal.md states these; a change to one is a change to the doc."""
    assert (CLOCK_MARGIN, RATE_MARGIN, POLLS, throttle.EARLY_READINGS) == (0.10, 0.15, 3, 5)
    assert throttle.LOADED_GPU_ACTIVE == 0.5


@pytest.mark.parametrize(
    ("clock_ghz", "expected"),
    [
        (1.40, False),  # at the sustained clock
        (1.27, False),  # 9.3 % below: inside the margin
        (1.26, False),  # exactly 10 % below is not "more than"
        (1.25, True),  # 10.7 % below
        (1.10, True),
    ],
)
def test_clock_margin(clock_ghz: float, expected: bool) -> None:
    verdicts = judge([busy(clock_ghz)] * POLLS, calibrated_hz=1.40 * GHZ)
    assert verdicts[-1].throttling is expected


def test_clock_needs_polls_in_a_row() -> None:
    low, high = busy(1.10), busy(1.40)
    verdicts = judge([low, low, high, low, low, low, low], calibrated_hz=1.40 * GHZ)
    assert states(verdicts) == [False, False, False, False, False, True, True]
    assert [v.low for v in verdicts] == [True, True, False, True, True, True, True]


def test_evidence_text() -> None:
    verdicts = judge([busy(1.10)] * POLLS, calibrated_hz=1.40 * GHZ)
    assert verdicts[-1] == ThrottleVerdict(True, ("GPU 1.10 GHz of 1.40 sustained",), low=True)
    assert verdicts[-1].text == "GPU 1.10 GHz of 1.40 sustained"
    assert verdicts[0].text == "GPU 1.10 GHz of 1.40 sustained"  # shown before it counts


def test_no_load_no_verdict() -> None:
    """An idle GPU's low clock is its own choice; no rate and no busy GPU: no verdict."""
    idle = [busy(0.40, active=0.05), ThrottlePoll(), ThrottlePoll(gpu_hz=None, gpu_active=0.9)]
    verdicts = judge(idle * 3, calibrated_hz=1.40 * GHZ)
    assert states(verdicts) == [None] * 9
    assert all(v.evidence == () and v.text is None for v in verdicts)


def test_idle_poll_breaks_the_clock_count() -> None:
    low = busy(1.10)
    verdicts = judge([low, low, busy(0.3, active=0.1), low, low], calibrated_hz=1.40 * GHZ)
    assert states(verdicts) == [False, False, None, False, False]


def test_sustained_clock_without_calibration_is_the_highest_seen_under_load() -> None:
    polls = [busy(1.30), busy(1.40), busy(3.0, active=0.1)] + [busy(1.20)] * POLLS
    watch = ThrottleWatch.start()
    verdicts = []
    for poll in polls:
        watch, verdict = watch.observe(poll)
        verdicts.append(verdict)
    assert watch.sustained_hz == 1.40 * GHZ  # the idle 3 GHz spike is not under load
    assert watch.sustained_origin == throttle.SEEN_UNDER_LOAD
    assert states(verdicts) == [False, False, None, False, False, True]
    assert verdicts[-1].text == "GPU 1.20 GHz of 1.40 sustained"


def test_calibrated_clock_is_kept() -> None:
    """A run that never reaches its calibrated clock throttles from its first polls (the
    fallback would have taken its throttled clock as the sustained one)."""
    watch = ThrottleWatch.start(calibrated_hz=1.40 * GHZ)
    for _ in range(POLLS):
        watch, verdict = watch.observe(busy(1.50))
        watch, verdict = watch.observe(busy(1.10))
    assert watch.sustained_origin == throttle.CALIBRATED
    assert watch.sustained_hz == 1.40 * GHZ
    assert verdict.throttling is False  # the 1.50 between resets the count
    assert judge([busy(1.1)] * POLLS)[-1].throttling is False


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf"), None])
def test_calibration_that_is_no_clock_is_not_used(bad: float | None) -> None:
    watch = ThrottleWatch.start(bad)
    assert watch.sustained_hz is None and watch.sustained_origin is None


def rates(*values: float) -> list[ThrottlePoll]:
    return [ThrottlePoll(rate=v) for v in values]


def test_rate_against_the_early_best() -> None:
    early = rates(300, 402, 390, 395, 400)  # the best of the first 5 is 402
    verdicts = judge(early + rates(350, 312, 312, 312))
    assert states(verdicts) == [False] * 5 + [False, False, False, True]
    assert verdicts[-1].text == "312 tok/s of 402"
    assert verdicts[5].low is False  # 350 is 12.9 % below: inside the 15 % margin


def test_rate_margin_boundary() -> None:
    early = rates(*[400.0] * 5)
    assert judge(early + rates(341, 341, 341))[-1].throttling is False  # 14.75 % below
    assert judge(early + rates(339, 339, 339))[-1].throttling is True  # 15.25 % below


def test_early_readings_never_throttle_and_later_bests_do_not_move_the_bar() -> None:
    verdicts = judge(rates(400, 100, 100, 100, 100, 900, 330, 330, 330))
    assert states(verdicts)[:6] == [False] * 6
    assert verdicts[-1] == ThrottleVerdict(True, ("330 tok/s of 400",), low=True)


def test_rate_held_between_reports_and_counted_once() -> None:
    """mlx_lm reports every few steps: the polls between hold the last report, uncounted."""
    polls = rates(*[400.0] * 5)
    for _ in range(POLLS):
        polls += [ThrottlePoll(rate=300), ThrottlePoll(), ThrottlePoll()]
    verdicts = judge(polls)
    assert states(verdicts)[5:] == [False] * 6 + [True] * 3
    assert verdicts[-1].text == "300 tok/s of 400"


def test_rate_unit_and_small_figures() -> None:
    polls = [ThrottlePoll(rate=5.2, rate_unit="it/s")] * 5
    polls += [ThrottlePoll(rate=4.1, rate_unit="it/s")] * POLLS
    assert judge(polls)[-1].text == "4.1 it/s of 5.2"


@pytest.mark.parametrize("bad", [0.0, -3.0, float("nan"), True])
def test_a_rate_that_is_no_rate_is_no_reading(bad: float) -> None:
    assert judge([ThrottlePoll(rate=bad)]) == [ThrottleVerdict(None)]


def test_both_signals_evidence() -> None:
    polls = [ThrottlePoll(gpu_hz=1.4 * GHZ, gpu_active=1.0, rate=400)] * 5
    polls += [ThrottlePoll(gpu_hz=1.1 * GHZ, gpu_active=1.0, rate=300)] * POLLS
    verdicts = judge(polls)
    assert verdicts[-1].evidence == ("GPU 1.10 GHz of 1.40 sustained", "300 tok/s of 400")
    assert verdicts[4].evidence == ("GPU 1.40 GHz of 1.40 sustained", "400 tok/s of 400")
    # either signal is enough: a clock that holds does not clear a falling rate
    polls[-POLLS:] = [ThrottlePoll(gpu_hz=1.4 * GHZ, gpu_active=1.0, rate=300)] * POLLS
    assert judge(polls)[-1] == ThrottleVerdict(True, ("300 tok/s of 400",), low=True)


def test_first_throttled_is_where_the_first_throttling_stretch_began() -> None:
    ok, low, idle = busy(1.40), busy(1.10), busy(0.2, active=0.0)
    series = [ok, low, ok, low, idle, low, low, ok, low, low, low]
    verdicts = judge(series, calibrated_hz=1.40 * GHZ)
    assert throttle.first_throttled(verdicts) == 8  # the idle poll broke the stretch at 3
    assert throttle.first_throttled(judge([ok, low, low, ok], 1.40 * GHZ)) is None


def test_early_readings_is_the_number_of_readings_that_set_the_best() -> None:
    assert judge(rates(100, 80, 80, 80), early_readings=1)[-1].throttling is True
    assert judge(rates(100, 80, 80, 80), early_readings=0)[-1].throttling is True  # at least 1
    assert judge(rates(100, 80, 80, 80))[-1].throttling is False  # still the early five
