"""The throttle point's analysis (shared.cooling.throttle_point) on series of known answer: a
first-order heat model whose firmware drops the clock above a limit, run as `agent calibrate`
runs a Mac (idle, flat out, then held at the onset by switching the load)."""

from __future__ import annotations

import math

import pytest

from shared.cooling.throttle import ThrottleVerdict, first_throttled
from shared.cooling.throttle_point import (
    CalibrationSample,
    NoThrottle,
    ThrottlePoint,
    calibrated_thresholds,
    find_throttle_point,
    hold_step,
)

OK, THROTTLING = ThrottleVerdict(False), ThrottleVerdict(True, ("GPU 0.80 GHz of 1.40",), True)

AMBIENT, FULL_RISE, TAU_S, LIMIT = 30.0, 90.0, 60.0, 95.0
"""Flat out at full clock the die settles FULL_RISE above ambient; the firmware throttles above
LIMIT. The duty that holds it at LIMIT: (LIMIT - AMBIENT) / FULL_RISE."""
CLOCK, THROTTLED = 1.4e9, 0.8e9
WORK_PER_HZ_S = 1e-7


def run_model(
    sustained_s: float = 300.0,
    held_s: float = 600.0,
    dt: float = 0.5,
    limit: float | None = LIMIT,
    clocks: bool = True,
    hysteresis: float = 2.0,
) -> list[CalibrationSample]:
    """Idle 5 s, flat out for `sustained_s`, then held at the onset as `agent calibrate` holds
    it (hold_step, given the true limit): heat follows the clock (here ∝ f², so the throttled
    clock heats less, as the plant's f·V² does); the firmware restores the clock below the
    limit less `hysteresis`."""
    celsius, t, samples = AMBIENT, 0.0, []
    throttled, recovered = False, False
    for phase, seconds in (("idle", 5.0), ("sustained", sustained_s), ("held", held_s)):
        end = t + seconds
        while t < end - 1e-9:
            running = 0.0 if phase == "idle" else 1.0
            shown = phase
            if phase == "held":
                run, recovered = hold_step(celsius, limit or math.inf, recovered)
                running, shown = float(run), "held" if recovered else "recovering"
            if limit is not None:
                throttled = celsius > limit or (throttled and celsius > limit - hysteresis)
            hz = THROTTLED if throttled else CLOCK
            heat = running * FULL_RISE * (hz / CLOCK) ** 2
            target = AMBIENT + heat
            celsius = target + (celsius - target) * math.exp(-dt / TAU_S)
            t += dt
            samples.append(
                CalibrationSample(
                    time=t,
                    phase=shown,
                    celsius=celsius,
                    sensor="Tg0k",
                    sensors={"Tg0k": celsius, "TCMz": celsius - 4.0},
                    gpu_hz=hz if clocks else None,
                    work=running * hz * WORK_PER_HZ_S * dt,
                    running=running,
                )
            )
    return samples


def test_it_finds_the_onset_the_duty_and_both_operating_points() -> None:
    point = find_throttle_point(run_model(), "smc", simulated=False, calibrated_at=1.8e9)
    assert abs(point.onset_c - LIMIT) < 1.0
    assert abs(point.sensor_onsets["TCMz"] - (LIMIT - 4.0)) < 1.0
    assert point.sensor == "Tg0k" and point.signal == "gpu clock"
    assert point.sustained_hz == CLOCK and point.evidence == "GPU 0.80 GHz of 1.40 sustained"
    expected_ttt = -TAU_S * math.log(1 - (LIMIT - AMBIENT) / FULL_RISE)
    assert abs(point.time_to_throttle_s - expected_ttt) < 2.0
    sustainable = (LIMIT - AMBIENT) / FULL_RISE
    assert point.duty_cycle is not None and abs(point.duty_cycle - sustainable) < 0.05
    assert point.throttled is not None and point.held is not None
    assert point.throttled.clock_hz is not None
    assert THROTTLED <= point.throttled.clock_hz < CLOCK * 0.95
    assert point.throttled.duty == 1.0
    assert point.held.clock_hz == pytest.approx(CLOCK)
    assert point.held.celsius is not None and point.held.celsius < LIMIT


def test_without_a_clock_the_work_rate_tells_the_onset() -> None:
    point = find_throttle_point(run_model(clocks=False), "sim", True, 1.8e9)
    assert point.signal == "work rate"
    assert abs(point.onset_c - LIMIT) < 1.0
    assert point.reference == pytest.approx(CLOCK * WORK_PER_HZ_S)


def test_a_load_that_never_throttles_is_said_so() -> None:
    with pytest.raises(NoThrottle, match="never dropped and stayed down"):
        find_throttle_point(run_model(limit=None, held_s=0), "smc", False, 1.8e9)


def test_too_few_polls_under_load_cannot_say() -> None:
    with pytest.raises(ValueError, match="too few"):
        find_throttle_point(run_model(sustained_s=2.0, held_s=0), "smc", False, 1.8e9)


def test_the_onset_is_the_first_poll_of_the_first_drop_that_lasted() -> None:
    low = ThrottleVerdict(False, low=True)
    assert first_throttled([OK, low, OK, low, low, THROTTLING, THROTTLING]) == 3
    assert first_throttled([OK, THROTTLING]) == 1
    assert first_throttled([OK, low, low, OK]) is None


def test_the_record_round_trips_and_refuses_what_it_does_not_write() -> None:
    point = find_throttle_point(run_model(), "smc", False, 1.8e9)
    assert ThrottlePoint.from_dict(point.to_dict()) == point
    for broken in ({**point.to_dict(), "onset_c": math.nan}, {**point.to_dict(), "x": 1}):
        with pytest.raises(ValueError):
            ThrottlePoint.from_dict(broken)


def test_the_origin_names_the_day_the_reading_and_a_simulation() -> None:
    point = find_throttle_point(run_model(), "smc", False, 1796515200.0)  # 2026-12-06
    assert point.origin() == (
        f"calibrated on this Mac 2026-12-06: onset {point.onset_c:.1f} °C (smc · Tg0k)"
    )
    simulated = find_throttle_point(run_model(), "sim:plant", True, 1796515200.0)
    assert simulated.origin().endswith("(sim:plant · Tg0k, simulated)")


def test_the_thresholds_pause_at_the_onset_and_keep_the_source_stop() -> None:
    point = find_throttle_point(run_model(), "smc", False, 1.8e9)
    onset = round(point.onset_c, 1)
    assert calibrated_thresholds(point, 120.0) == {
        "max_speed_temp": onset - 5.0,
        "pause_temp": onset,
        "stop_temp": 120.0,
    }
    assert calibrated_thresholds(point, 90.0)["stop_temp"] == onset + 5.0


def test_a_hold_that_finds_its_clock_lowered_rests_until_it_recovers() -> None:
    assert hold_step(103.0, 105.0, recovered=False) == (False, False)  # not cool enough yet
    assert hold_step(100.0, 105.0, recovered=False) == (True, True)  # recovered: run
    assert hold_step(104.5, 105.0, recovered=True) == (False, True)  # at the cap: rest
    assert hold_step(103.0, 105.0, recovered=True, throttled=True) == (False, False)
    assert hold_step(None, 105.0, recovered=True) == (False, True)  # no reading: rest
