"""The thermal plant's model (shared.cooling.plant): its steady states and RC time constant, the
firmware's throttling with hysteresis, power that falls faster than the clock, the analytic
optima against the simulated plant, and the spec's bad input."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from shared.cooling.plant import (
    PRESETS,
    Plant,
    PlantSpecError,
    best_work_rate,
    parse_plant_spec,
    plant_spec,
    time_to_limit,
    unthrottled_optimum,
)
from shared.cooling.sources import SourceSpecError, parse_sim_spec, parse_source_name

AIR = PRESETS["air"]
MINI = PRESETS["mini"]
TOP = len(AIR.states) - 1


def settle(plant: Plant, duty: float, seconds: float) -> tuple[float, float]:
    """(work rate, share of time throttled) over `seconds` of plant time after the call."""
    work, throttled = plant.work, plant.throttled_s
    plant.advance(seconds, duty)
    return (plant.work - work) / seconds, (plant.throttled_s - throttled) / seconds


@pytest.mark.parametrize("duty", [0.0, 0.4, 1.0])
def test_a_held_duty_settles_at_ambient_plus_r_times_power(duty: float) -> None:
    plant = Plant(MINI)
    plant.advance(20 * MINI.tau_s, duty)
    expected = MINI.ambient_c + MINI.r_c_per_w * (MINI.static_w + duty * MINI.dynamic_w)
    assert plant.celsius == pytest.approx(expected, abs=1e-6)
    assert not plant.throttled  # a mini never reaches its limit


def test_the_die_covers_63_percent_of_a_step_in_one_time_constant() -> None:
    plant = Plant(MINI)
    start, target = plant.celsius, MINI.steady_c(TOP, 1.0)
    plant.advance(MINI.tau_s, 1.0)
    assert (plant.celsius - start) / (target - start) == pytest.approx(1 - math.exp(-1), abs=1e-9)


def test_the_idle_start_and_the_air_throttling_about_ten_minutes_in() -> None:
    assert Plant(AIR).celsius == pytest.approx(AIR.ambient_c + AIR.r_c_per_w * AIR.static_w)
    took = time_to_limit(AIR)
    assert took is not None and 540 <= took <= 660
    assert time_to_limit(MINI) is None
    plant = Plant(AIR)
    plant.advance(took - 5, 1.0)
    assert not plant.throttled
    plant.advance(10, 1.0)
    assert plant.throttled


def test_the_firmware_holds_the_limit_with_hysteresis_one_state_at_a_time() -> None:
    plant = Plant(AIR)
    plant.advance(900, 1.0)
    levels, temperatures = [], []
    for _ in range(3000):
        before = plant.level
        plant.advance(AIR.step_s, 1.0)
        assert abs(plant.level - before) <= 1
        levels.append(plant.level)
        temperatures.append(plant.celsius)
    assert max(temperatures) <= AIR.limit_c + 1.0
    assert min(temperatures) >= AIR.limit_c - AIR.hysteresis_c - 1.0
    assert min(levels) > 0 and max(levels) < TOP  # dithers between mid states
    # stopped, the die cools; the clock comes back up only below limit - hysteresis
    while plant.throttled:
        level = plant.level
        plant.advance(AIR.step_s, 0.0)  # the firmware looks at the end of each step
        if plant.level > level:
            assert plant.celsius < AIR.limit_c - AIR.hysteresis_c
    assert plant.celsius < AIR.limit_c - AIR.hysteresis_c


def test_dynamic_power_goes_as_f_v_squared_and_falls_faster_than_the_clock() -> None:
    top = AIR.top
    for level, state in enumerate(AIR.states):
        ratio = (state.hz * state.volts**2) / (top.hz * top.volts**2)
        assert AIR.dynamic_at(level) == pytest.approx(AIR.dynamic_w * ratio)
        if level < TOP:
            assert AIR.dynamic_at(level) / AIR.dynamic_w < AIR.clock_factor(level)
    # the lowest state: a third of the clock for an eighth of the switching power
    assert AIR.clock_factor(0) == pytest.approx(444 / 1398)
    assert AIR.dynamic_at(0) / AIR.dynamic_w == pytest.approx(0.128, abs=0.001)
    assert AIR.power(0, 0.0) == AIR.power(TOP, 0.0) == AIR.static_w


def test_the_firmwares_steady_work_is_the_analytic_best_and_beats_stopping() -> None:
    plant = Plant(AIR)
    plant.advance(3000, 1.0)
    rate, throttled = settle(plant, 1.0, 20_000)
    best, clock = best_work_rate(AIR, AIR.limit_c)
    assert rate == pytest.approx(best, rel=0.02)
    assert throttled == 1.0 and clock < 1.0
    # a duty-cycled job at the top clock cannot do as well: the price of never throttling
    assert unthrottled_optimum(AIR, AIR.limit_c) < 0.75 * best
    assert best_work_rate(MINI, MINI.limit_c) == (1.0, 1.0)


@pytest.mark.parametrize("cap", [95.0, 101.0, 104.0])
def test_the_unthrottled_optimum_holds_the_cap_at_the_top_clock(cap: float) -> None:
    duty = unthrottled_optimum(AIR, cap)
    plant = Plant(AIR)
    plant.advance(20 * AIR.tau_s, duty)
    assert plant.celsius == pytest.approx(cap, abs=1e-6)
    assert plant.throttled_s == 0
    assert settle(plant, duty, 1000)[0] == pytest.approx(duty)
    assert unthrottled_optimum(AIR, 200.0) == unthrottled_optimum(AIR, AIR.limit_c)
    assert unthrottled_optimum(AIR, 20.0) == 0.0


def test_a_stopped_job_does_no_work_and_cools_toward_idle() -> None:
    plant = Plant(replace(AIR, start_c=100.0))
    plant.advance(5 * AIR.tau_s, 0.0)
    assert plant.work == 0.0
    assert plant.celsius == pytest.approx(AIR.steady_c(TOP, 0.0), abs=0.5)


def test_specs_name_a_preset_and_overrides_and_round_trip() -> None:
    assert parse_plant_spec("") == AIR
    assert parse_plant_spec(":mini") == MINI
    fast = parse_plant_spec(":air,speed=60, ambient_c=30")
    assert (fast.speed, fast.ambient_c, fast.tau_s) == (60.0, 30.0, AIR.tau_s)
    assert plant_spec(fast) == "sim:plant:air,ambient_c=30,speed=60"
    assert parse_sim_spec("plant:air,speed=60") == replace(AIR, speed=60.0)
    assert parse_source_name("sim:plant:mini") == ("sim", "plant:mini")


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (":pro", "no preset 'pro'; presets: air, mini"),
        (":air,speed=0", "speed=0.0 is out of range"),
        (":air,speed=fast", "speed must be a number, got 'fast'"),
        (":air,tau_s=nan", "tau_s must be a finite number"),
        (":air,tau_s=-1", "tau_s=-1.0 is out of range"),
        (":air,ambient_c=110", "ambient_c=110.0 is out of range"),
        (":air,watts=3", "bad parameter 'watts=3'"),
        (":air,speed", "bad parameter 'speed'"),
        ("x", "expected sim:plant[:PRESET][,k=v...], got 'plantx'"),
    ],
)
def test_bad_specs_say_what_is_wrong_in_one_line(spec: str, message: str) -> None:
    with pytest.raises(PlantSpecError) as excinfo:
        parse_plant_spec(spec)
    assert message in str(excinfo.value) and "\n" not in str(excinfo.value)
    with pytest.raises(SourceSpecError):
        parse_source_name(f"sim:plant{spec}")
