"""The pace tier's pure parts: the controller (shared.cooling.pace), its place in the one cooling
rule (shared.cooling.policy.react) and the policy's pace parameters."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from agent.cooling.scheduler import CoolingScheduler
from agent.thermal import ThermalMonitor, ThermalReading
from coordinator.telemetry.dashboard import UP, HostView, _state_cell
from coordinator.telemetry.gang_rows import gang_rows
from shared.cooling.gang import Enforced, MemberState, gang_reason, steer, verdict
from shared.cooling.pace import (
    PACE_GAIN_I,
    PACE_GAIN_P,
    PACE_HOLD_POLLS,
    PACE_MARGIN_C,
    PACE_MIN_DUTY,
    PaceSettings,
    Pacing,
    advance,
    slice_phase,
)
from shared.cooling.policy import (
    Action,
    CoolingGate,
    CoolingState,
    JobState,
    Supervision,
    ThermalPolicy,
    react,
    updated_policy,
)
from shared.io.metrics import TelemetryMetrics
from tests.conftest import run_cli

CAP = 80.0
SETTINGS = PaceSettings(CAP, 0.2, 0.2)
POLICY = ThermalPolicy(70.0, 85.0, 95.0, pace_temp=CAP)
WARM = CAP - PACE_MARGIN_C + 0.5
"""Half a degree over the set point: paced, not yet at the lowest duty."""


def run(pacing: Pacing, temps: list[float], start: float = 0.0, **kw: float | None) -> Pacing:
    for i, celsius in enumerate(temps):
        pacing = advance(pacing, SETTINGS, celsius, start + i, **kw)  # type: ignore[arg-type]
    return pacing


def test_well_below_the_cap_the_job_runs_at_full_speed_and_the_integral_stays_empty() -> None:
    pacing = run(Pacing(), [60.0] * 50)
    assert (pacing.duty, pacing.integral, pacing.paced) == (1.0, 0.0, False)


def test_above_the_set_point_the_duty_falls_and_keeps_falling_while_it_stays_there() -> None:
    one = run(Pacing(), [WARM])
    assert one.duty == pytest.approx(1 - PACE_GAIN_P * 0.5)
    later = run(Pacing(), [WARM] * 5)
    assert later.duty < one.duty
    assert later.paced


def test_the_duty_never_leaves_its_bounds_and_the_integral_does_not_wind_up() -> None:
    hot = run(Pacing(), [CAP + 10] * 500)
    assert hot.duty == SETTINGS.min_duty
    assert hot.integral >= SETTINGS.min_duty - 1.0
    # no windup: once it is cool again the job is back at full speed within a few polls
    cooled = run(hot, [CAP - 20] * 10, start=500)
    assert cooled.duty == 1.0


def test_at_the_set_point_the_integral_holds_the_duty_it_found() -> None:
    found = run(Pacing(), [CAP] * 30)
    held = run(found, [SETTINGS.set_point] * 30, start=30)
    assert held.duty == pytest.approx(1.0 + found.integral)
    assert held.integral == found.integral


def test_a_polls_step_past_the_lowest_duty_stops_the_integral_there_instead_of_refusing_it():
    # a coarse poll (5 s) near the lowest duty: the whole step would take the duty below it
    near_floor = Pacing(duty=0.25, integral=-0.2, at=0.0)
    stepped = advance(near_floor, SETTINGS, SETTINGS.set_point + 1.0, 5.0)
    assert stepped.duty == pytest.approx(SETTINGS.min_duty)
    assert stepped.integral == pytest.approx(SETTINGS.min_duty - 1.0 + PACE_GAIN_P * 1.0)


def test_the_rule_integrates_in_the_dies_time_where_a_reading_has_one() -> None:
    """A plant run ten times faster than a Mac: its readings 0.1 s apart on the wall are a
    Mac's second apart for the die, and the integral counts that second."""
    wall, die = CoolingGate(), CoolingGate()
    for i in range(2):
        wall.observe(POLICY, ThermalReading(WARM, "sim:plant", time=i * 0.1))
        die.observe(POLICY, ThermalReading(WARM, "sim:plant", time=i * 0.1, die_time=float(i)))
    assert die.supervision.pacing.integral == pytest.approx(-PACE_GAIN_I * 0.5 * 1.0)
    assert wall.supervision.pacing.integral == pytest.approx(-PACE_GAIN_I * 0.5 * 0.1)


def test_a_clock_below_the_sustained_one_cuts_the_duty_even_below_the_cap() -> None:
    cool = run(Pacing(), [CAP - 5] * 3)
    throttled = run(Pacing(), [CAP - 5] * 3, clock_ratio=0.85)
    within_margin = run(Pacing(), [CAP - 5] * 3, clock_ratio=0.99)
    assert cool.duty == within_margin.duty == 1.0
    assert throttled.duty < 1.0


def test_a_gap_between_readings_is_integrated_as_at_most_ten_seconds() -> None:
    first = advance(Pacing(), SETTINGS, CAP - 1, 0.0)
    after_gap = advance(first, SETTINGS, CAP - 1, 3600.0)
    after_ten = advance(first, SETTINGS, CAP - 1, 10.0)
    assert after_gap == Pacing(after_ten.duty, after_ten.integral, 3600.0, 0, False)


def test_the_minimum_duty_that_cannot_hold_the_cap_hands_over_to_a_pause_until_the_set_point() -> (
    None
):
    pacing = run(Pacing(), [CAP + 3] * (PACE_HOLD_POLLS + 30))
    assert pacing.holding
    still = advance(pacing, SETTINGS, CAP - 0.5, 1000.0, paused=True)
    assert still.holding and still.integral == pacing.integral  # frozen while paused
    done = advance(still, SETTINGS, SETTINGS.set_point, 1001.0, paused=True)
    assert not done.holding


@pytest.mark.parametrize("duty", [0.2, 0.5, 0.9])
def test_slices_are_aligned_on_the_wall_clock_and_run_first(duty: float) -> None:
    slice_s = 0.2
    base = 1_700_000_000.0
    running, until = slice_phase(base + 0.01, slice_s, duty)
    assert running and until == pytest.approx(base + duty * slice_s)
    running, until = slice_phase(base + duty * slice_s + 0.001, slice_s, duty)
    assert not running and until == pytest.approx(base + slice_s)
    # the share of time running over many slices is the duty
    steps = [base + i * 0.001 for i in range(2000)]
    share = sum(slice_phase(t, slice_s, duty)[0] for t in steps) / len(steps)
    assert share == pytest.approx(duty, abs=0.01)


# --- the pace tier in the one rule ------------------------------------------------------------


def test_the_rule_paces_between_reduce_batch_and_pause_and_says_why() -> None:
    decision = react(Supervision(), POLICY, WARM, at=0.0)
    assert decision.cooling is CoolingState.PACE
    assert decision.actions == (Action.REDUCE_BATCH, Action.PACE)
    assert decision.reason is not None and "cap 80 °C" in decision.reason
    assert decision.state.duty is not None and decision.state.duty < 1.0
    again = react(decision.state, POLICY, WARM, at=1.0)
    assert again.actions == () and again.state.duty < decision.state.duty  # type: ignore[operator]


def test_pacing_ends_once_the_controller_gives_back_full_speed() -> None:
    state = react(Supervision(), POLICY, CAP, at=0.0).state
    for i in range(1, 200):
        decision = react(state, POLICY, 50.0, at=float(i))
        state = decision.state
        if Action.PACE_END in decision.actions:
            break
    assert state.duty is None and not state.paced
    assert CoolingState.PACE is not decision.cooling


def test_pause_temp_still_pauses_a_paced_job_and_the_resume_paces_again() -> None:
    state = react(Supervision(), POLICY, CAP, at=0.0).state
    paused = react(state, POLICY, 86.0, at=1.0)
    assert paused.actions == (Action.PAUSE,) and paused.state.job is JobState.PAUSED
    resumed = react(paused.state, POLICY, CAP, at=2.0)
    assert resumed.actions == (Action.RESUME, Action.PACE)


def test_a_pace_that_cannot_hold_pauses_the_job_and_says_so() -> None:
    state = Supervision()
    decisions = []
    for i in range(PACE_HOLD_POLLS + 40):
        decision = react(state, POLICY, CAP + 3, at=float(i))
        state = decision.state
        decisions.append(decision)
    pauses = [d for d in decisions if Action.PAUSE in d.actions]
    assert len(pauses) == 1
    assert pauses[0].reason is not None and "pacing cannot hold 80 °C" in pauses[0].reason
    assert state.job is JobState.PAUSED
    cooled = react(state, POLICY, SETTINGS.set_point - 0.5, at=1000.0)
    assert cooled.actions[0] is Action.RESUME and cooled.state.paced


def test_without_a_pace_tier_the_rule_is_the_seeds() -> None:
    plain = ThermalPolicy(70.0, 85.0, 95.0)
    decision = react(Supervision(), plain, CAP, at=0.0)
    assert decision.cooling is CoolingState.REDUCE_BATCH
    assert decision.actions == (Action.REDUCE_BATCH,)


# --- the policy's pace parameters -------------------------------------------------------------


def test_a_policy_without_a_pace_tier_is_the_map_older_peers_know() -> None:
    assert set(ThermalPolicy().to_dict()) == {
        "max_speed_temp",
        "pause_temp",
        "stop_temp",
        "pause_duration",
        "hysteresis",
    }
    paced = ThermalPolicy(pace_temp=80.0, pace_slice=0.1)
    assert paced.to_dict()["pace_temp"] == 80.0
    assert ThermalPolicy.from_dict(paced.to_dict()) == paced


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"pace_temp": 85.5}, "pace_temp must be above 2 °C and at most pause_temp 85 °C"),
        ({"pace_temp": 1.0}, "pace_temp must be above"),
        ({"pace_slice": 1.0}, "pace_slice must be 0.05 to 0.5 seconds, got 1$"),
        ({"pace_slice": 0.0}, "pace_slice must be 0.05 to 0.5 seconds"),
        ({"pace_min_duty": 0.0}, "pace_min_duty must be 0.05 to 0.9, got 0$"),
        ({"pace_min_duty": 1.0}, "pace_min_duty must be 0.05 to 0.9"),
        ({"pace_temp": "hot"}, "pace_temp must be a finite number"),
    ],
)
def test_pace_parameters_out_of_range_are_one_line_naming_them(
    changes: dict[str, object], words: str
) -> None:
    with pytest.raises(ValueError, match=words) as caught:
        updated_policy(ThermalPolicy(), changes)
    assert "\n" not in str(caught.value)


def test_a_nil_pace_temp_turns_the_pace_tier_off() -> None:
    paced = updated_policy(ThermalPolicy(), {"pace_temp": 80.0})
    assert paced.pace == PaceSettings(80.0)
    assert updated_policy(paced, {"pace_temp": None}).pace is None


# --- the pace state everywhere a policy state is shown ----------------------------------------


def test_prometheus_has_the_pace_state_between_reduce_and_pause_and_its_duty() -> None:
    metrics = TelemetryMetrics()
    sample = {"host": "mac1", "celsius": 81.0, "source": "smc", "sensor": "Tg0k",
              "state": "pace", "duty": 0.4, "pause_s_total": 0.0, "storage_error": None,
              "power_w": None, "energy_j": None, "power": None}  # fmt: skip
    metrics.observe_sample(sample)
    metrics.set_policy("mac1", POLICY.to_dict())
    text = generate_latest(metrics.registry).decode()
    assert 'mlx_fleet_cooling_state{host="mac1"} 1.5' in text
    assert 'mlx_fleet_pace_duty_ratio{host="mac1"} 0.4' in text
    assert 'mlx_fleet_policy_threshold_celsius{host="mac1",level="pace"} 80.0' in text
    metrics.observe_sample(sample | {"state": "ok", "duty": None})
    metrics.set_policy("mac1", ThermalPolicy(70.0, 85.0, 95.0).to_dict())
    text = generate_latest(metrics.registry).decode()
    assert 'mlx_fleet_cooling_state{host="mac1"} 0.0' in text
    assert "mlx_fleet_pace_duty_ratio{" not in text and 'level="pace"' not in text


def test_the_monitor_and_a_gang_row_show_the_duty() -> None:
    view = HostView("mac1", status=UP, sample={"state": "pace", "duty": 0.46})
    assert _state_cell(view, 0.0).plain == "pace 46 %"
    rows = gang_rows([("mac1", [{"job": "j", "state": "running", "gang": {
        "group": "ring-1", "rank": 0, "world": 2, "backend": "ring", "state": "pace",
        "duty": 0.3, "cause": None}}], None)])  # fmt: skip
    assert rows[0].duty == 0.3 and rows[0].to_dict()["state"] == "pace"


def test_a_gang_paces_at_the_lowest_duty_any_member_asks_for_with_its_slice() -> None:
    def member(rank: int, state: CoolingState, duty: float | None) -> MemberState:
        slice_s = None if duty is None else 0.1 * (rank + 1)
        return MemberState(rank, f"mac{rank}", state, state, 80.0, "smc", "TCMz", 100.0,
                           "job", 100.0, duty, slice_s)  # fmt: skip

    paced = verdict({0: member(0, CoolingState.PACE, 0.7), 1: member(1, CoolingState.PACE, 0.4),
                     2: member(2, CoolingState.OK, None)}, 100.0, 10.0)  # fmt: skip
    assert (paced.state, paced.duty, paced.slice_s) == (CoolingState.PACE, 0.4, 0.2)
    assert paced.cause is not None and paced.cause.rank == 1
    enforced, actions = steer(Enforced(), CoolingState.PACE)
    assert actions == (Action.PACE,) and enforced.paced
    paused, actions = steer(enforced, CoolingState.PAUSE)
    assert actions == (Action.PAUSE,)
    back, actions = steer(paused, CoolingState.PACE)
    assert actions == (Action.RESUME, Action.PACE)
    assert steer(back, CoolingState.OK)[1] == (Action.PACE_END,)
    assert gang_reason(Action.PACE_END, 2, None, 0).startswith("ended the pacing of all 2 ranks")


@pytest.mark.slow
def test_agent_temp_shows_the_pace_state_and_its_duty(tmp_path: Path) -> None:
    curve = tmp_path / "warm.csv"
    curve.write_text("seconds,celsius\n0,84\n1000,84\n")
    done = run_cli("agent", "temp", "--thermal-source", f"replay:{curve}", "--pace-temp", "80",
                   "-o", "json")  # fmt: skip
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["state"] == "pace" and data["duty"] == PACE_MIN_DUTY
    table = run_cli("agent", "temp", "--thermal-source", f"replay:{curve}", "--pace-temp", "80")
    assert "pace 20 %" in table.stdout and "paced under 80 °C" in table.stdout


def test_a_loop_gated_by_the_scheduler_rests_the_duty_s_share_beside_one_that_is_not(
    tmp_path: Path,
) -> None:
    curve = tmp_path / "warm.csv"
    curve.write_text("seconds,celsius\n0,84\n1000,84\n")

    def loop(policy: ThermalPolicy) -> tuple[float, float]:
        """(busy seconds, wall seconds) of ten 10 ms steps gated by the seed's scheduler."""
        with ThermalMonitor(0.02, source=f"replay:{curve}") as monitor:
            scheduler = CoolingScheduler(monitor, policy)
            monitor.start()
            busy, began = 0.0, time.monotonic()
            for step in range(10):
                scheduler.check_before_step(step)
                start = time.monotonic()
                while time.monotonic() - start < 0.01:
                    pass
                busy += time.monotonic() - start
            return busy, time.monotonic() - began

    plain_busy, plain_wall = loop(ThermalPolicy(75.0, 85.0, 95.0, pause_duration=0.02))
    paced_busy, paced_wall = loop(ThermalPolicy(75.0, 85.0, 95.0, 0.02, pace_temp=80.0))
    assert plain_busy / plain_wall > 0.8  # the same loop, not paced: it runs all along
    assert paced_busy / paced_wall < 0.5  # paced (84 °C over a 78 °C set point: the lowest duty)
