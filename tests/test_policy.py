"""The pure cooling policy: thresholds, states, hysteresis, pressure levels, round trips."""

from __future__ import annotations

import msgpack
import pytest

from agent.thermal import ThermalReading
from shared.cooling.calibration import (
    SET_BY_COORDINATOR,
    origin_in_detail,
    origin_told,
    policy_event_detail,
    with_given,
)
from shared.cooling.policy import (
    HOT_POLLS_TO_STOP,
    MISSING_POLLS_TO_RESUME,
    PRESSURE_STATES,
    STUCK_POLLS_TO_STOP,
    Action,
    CoolingGate,
    CoolingState,
    Decision,
    JobState,
    Supervision,
    ThermalPolicy,
    decide,
    react,
)

OK, REDUCE, PAUSE, STOP = (
    CoolingState.OK,
    CoolingState.REDUCE_BATCH,
    CoolingState.PAUSE,
    CoolingState.STOP,
)


def test_defaults_are_the_seeds() -> None:
    policy = ThermalPolicy()
    assert (policy.max_speed_temp, policy.pause_temp, policy.stop_temp) == (75.0, 85.0, 95.0)
    assert policy.pause_duration == 0.5
    assert policy.hysteresis == 0.0


@pytest.mark.parametrize(
    ("max_speed", "pause", "stop"),
    [(85, 85, 95), (90, 85, 95), (75, 95, 95), (75, 96, 95)],
)
def test_thresholds_out_of_order_name_all_three(
    max_speed: float, pause: float, stop: float
) -> None:
    with pytest.raises(ValueError) as excinfo:
        ThermalPolicy(max_speed_temp=max_speed, pause_temp=pause, stop_temp=stop)
    message = str(excinfo.value)
    for name in ("max_speed_temp", "pause_temp", "stop_temp"):
        assert name in message


@pytest.mark.parametrize("name", ["max_speed_temp", "pause_temp", "stop_temp"])
def test_a_threshold_that_is_not_a_number_is_named_not_out_of_order(name: str) -> None:
    """Issue 42: NaN compares false, so it was told "out of order"; it is not a number."""
    with pytest.raises(ValueError, match=f"^{name} must be a finite number"):
        ThermalPolicy(**{name: float("nan")})


@pytest.mark.parametrize("field", ["pause_duration", "hysteresis"])
def test_a_negative_pause_duration_or_hysteresis_is_refused(field: str) -> None:
    with pytest.raises(ValueError, match=field):
        ThermalPolicy(**{field: -1.0})


@pytest.mark.parametrize(
    ("celsius", "expected"),
    [
        (None, OK),
        (20.0, OK),
        (74.99, OK),
        (75.0, REDUCE),
        (84.9, REDUCE),
        (85.0, PAUSE),
        (94.9, PAUSE),
        (95.0, STOP),
        (120.0, STOP),
    ],
)
def test_temperature_bands(celsius: float | None, expected: CoolingState) -> None:
    assert decide(ThermalPolicy(), celsius) is expected


def test_without_hysteresis_a_pause_ends_below_pause_temp() -> None:
    policy = ThermalPolicy()
    assert decide(policy, 84.9, currently_paused=True) is REDUCE


def test_hysteresis_holds_a_pause_until_below_pause_minus_hysteresis() -> None:
    policy = ThermalPolicy(hysteresis=3.0)
    assert policy.resume_temp == 82.0
    assert decide(policy, 83.0, currently_paused=True) is PAUSE
    assert decide(policy, 82.0, currently_paused=True) is PAUSE
    assert decide(policy, 81.9, currently_paused=True) is REDUCE
    # Hysteresis only delays the end of a pause; it never starts one early.
    assert decide(policy, 83.0, currently_paused=False) is REDUCE
    assert decide(policy, 96.0, currently_paused=True) is STOP


@pytest.mark.parametrize(
    ("pressure", "expected"),
    [
        ("Nominal", OK),
        ("fair", OK),
        ("Moderate", REDUCE),
        ("Heavy", PAUSE),
        ("serious", PAUSE),
        ("Trapping", STOP),
        ("Sleeping", STOP),
        ("CRITICAL", STOP),
        (" heavy ", PAUSE),
    ],
)
def test_pressure_levels_without_degrees(pressure: str, expected: CoolingState) -> None:
    assert decide(ThermalPolicy(), None, pressure) is expected


def test_unknown_pressure_level_is_no_information() -> None:
    assert decide(ThermalPolicy(), None, "Toasty") is OK
    assert decide(ThermalPolicy(), 80.0, "Toasty") is REDUCE


def test_the_more_severe_of_degrees_and_pressure_wins() -> None:
    policy = ThermalPolicy()
    assert decide(policy, 60.0, "Heavy") is PAUSE
    assert decide(policy, 90.0, "Nominal") is PAUSE  # "Nominal" has been seen at 95-105 °C
    assert decide(policy, 96.0, "Nominal") is STOP
    assert decide(policy, 80.0, "Trapping") is STOP


def test_every_pressure_level_maps_to_a_state() -> None:
    assert set(PRESSURE_STATES.values()) <= set(CoolingState)
    assert {"nominal", "fair", "heavy", "serious", "trapping", "sleeping", "critical"} <= set(
        PRESSURE_STATES
    )


def test_states_are_ordered_by_severity() -> None:
    pace = CoolingState.PACE
    assert [state.severity for state in (OK, REDUCE, pace, PAUSE, STOP)] == [0, 1, 2, 3, 4]
    assert [state.value for state in CoolingState] == [
        "ok",
        "reduce_batch",
        "pace",
        "pause",
        "stop",
    ]


def test_dict_round_trip_survives_msgpack() -> None:
    policy = ThermalPolicy(70.0, 80.0, 90.0, pause_duration=2.0, hysteresis=1.5)
    wire = msgpack.packb(policy.to_dict())
    assert ThermalPolicy.from_dict(msgpack.unpackb(wire)) == policy


def test_from_dict_fills_defaults() -> None:
    assert ThermalPolicy.from_dict({"stop_temp": 99}) == ThermalPolicy(stop_temp=99.0)


def test_from_dict_refuses_unknown_keys() -> None:
    with pytest.raises(ValueError, match="pause_tmp"):
        ThermalPolicy.from_dict({"pause_tmp": 80})


def test_from_dict_checks_the_thresholds_against_the_defaults() -> None:
    with pytest.raises(ValueError, match="max_speed_temp"):
        ThermalPolicy.from_dict({"max_speed_temp": 90})  # above the default pause_temp, 85


def test_a_hysteresis_that_would_never_end_a_pause_is_refused() -> None:
    with pytest.raises(ValueError, match="hysteresis 85.0 °C must be below pause_temp 85.0"):
        ThermalPolicy(hysteresis=85.0)
    assert ThermalPolicy(hysteresis=84.0).resume_temp == 1.0


@pytest.mark.parametrize(
    ("values", "valid"),
    [
        ({"hysteresis": 0.0}, True),
        ({"hysteresis": 84.9}, True),
        ({"hysteresis": 85.0}, False),
        ({"hysteresis": -0.1}, False),
        ({"pause_duration": 0.0}, False),
        ({"pause_duration": 1e-9}, True),
        ({"max_speed_temp": -20.0, "pause_temp": -10.0, "stop_temp": 5.0}, False),
        ({"max_speed_temp": -20.0, "pause_temp": 0.0, "stop_temp": 5.0}, False),
        ({"max_speed_temp": -20.0, "pause_temp": 0.5, "stop_temp": 5.0}, True),
        ({"pause_temp": 75.0}, False),
        ({"pause_temp": 95.0}, False),
    ],
)
def test_the_bounds_docs_protocol_states_are_the_ones_enforced(
    values: dict[str, float], valid: bool
) -> None:
    """docs/protocol.md §11: max_speed_temp < pause_temp < stop_temp, pause_duration > 0,
    0 <= hysteresis < pause_temp (so pause_temp > 0), each finite; nothing else."""
    if valid:
        ThermalPolicy(**values)
    else:
        with pytest.raises(ValueError):
            ThermalPolicy(**values)


POLICY = ThermalPolicy(max_speed_temp=75, pause_temp=85, stop_temp=95)
RUNNING, PAUSED, STOPPING = JobState.RUNNING, JobState.PAUSED, JobState.STOPPING


# --- the one cooling rule for a supervised job -------------------------------------------------


@pytest.mark.parametrize(
    ("job", "reduced", "celsius", "expected_job", "expected_reduced", "actions"),
    [
        (RUNNING, False, 60.0, RUNNING, False, ()),
        (RUNNING, False, 80.0, RUNNING, True, (Action.REDUCE_BATCH,)),
        (RUNNING, True, 80.0, RUNNING, True, ()),
        (RUNNING, True, 60.0, RUNNING, False, (Action.RESTORE_BATCH,)),
        (RUNNING, False, 86.0, PAUSED, False, (Action.PAUSE,)),
        (RUNNING, True, 86.0, PAUSED, True, (Action.PAUSE,)),
        (PAUSED, False, 90.0, PAUSED, False, ()),
        (PAUSED, False, 70.0, RUNNING, False, (Action.RESUME,)),
        (PAUSED, False, 80.0, RUNNING, True, (Action.RESUME, Action.REDUCE_BATCH)),
        (PAUSED, True, 60.0, RUNNING, False, (Action.RESUME, Action.RESTORE_BATCH)),
        (RUNNING, False, 95.0, PAUSED, False, (Action.PAUSE,)),  # one poll: a spike pauses
        (PAUSED, True, 99.0, PAUSED, True, ()),
        (STOPPING, False, 20.0, STOPPING, False, ()),
    ],
)
def test_react_takes_the_job_where_the_policy_asks(
    job: JobState,
    reduced: bool,
    celsius: float,
    expected_job: JobState,
    expected_reduced: bool,
    actions: tuple[Action, ...],
) -> None:
    decision = react(Supervision(job, reduced), POLICY, celsius)
    assert (decision.state.job, decision.state.reduced) == (expected_job, expected_reduced)
    assert decision.actions == actions


def polls(readings: list[tuple[float | None, str | None]]) -> list[Decision]:
    """The rule applied to each poll in turn, from a running job."""
    state, decisions = Supervision(), []
    for celsius, pressure in readings:
        decisions.append(react(state, POLICY, celsius, pressure))
        state = decisions[-1].state
    return decisions


def test_a_spike_above_stop_temp_pauses_and_only_a_lasting_one_stops() -> None:
    spike = polls([(80.0, None), (113.0, None), (80.0, None)])
    assert [d.actions for d in spike] == [
        (Action.REDUCE_BATCH,),
        (Action.PAUSE,),
        (Action.RESUME,),  # still reduced: the pause kept it so
    ]
    lasting = polls([(96.0, None)] * HOT_POLLS_TO_STOP)
    assert [d.actions for d in lasting][-2:] == [(), (Action.STOP,)]
    assert lasting[-1].state.job is STOPPING and lasting[-1].cooling is CoolingState.STOP
    assert (
        lasting[-1].reason == f"96.0 °C, at or above stop_temp 95 °C for {HOT_POLLS_TO_STOP} polls"
    )


def test_a_poll_below_stop_temp_restarts_the_count_and_a_missing_one_does_not() -> None:
    broken = polls([(96.0, None), (96.0, None), (90.0, None), (96.0, None), (96.0, None)])
    assert Action.STOP not in {action for d in broken for action in d.actions}
    gap = polls([(96.0, None), (None, None), (96.0, None), (96.0, None)])
    assert gap[-1].actions == (Action.STOP,)


def test_a_pause_that_does_not_cool_the_machine_stops_the_job() -> None:
    stuck = polls([(90.0, None)] * STUCK_POLLS_TO_STOP + [(90.0, None)])
    assert stuck[0].actions == (Action.PAUSE,)
    assert all(d.actions == () for d in stuck[1:-1])
    assert stuck[-1].actions == (Action.STOP,)
    assert f"after {STUCK_POLLS_TO_STOP} polls of pause" in (stuck[-1].reason or "")
    # a pause that once brings the reading below pause_temp starts its count again
    cooled = [(90.0, None)] * (STUCK_POLLS_TO_STOP - 1) + [(84.0, None)]
    policy = ThermalPolicy(max_speed_temp=75, pause_temp=85, stop_temp=95, hysteresis=3)
    state = Supervision()
    for celsius, pressure in cooled + [(90.0, None)] * 10:
        decision = react(state, policy, celsius, pressure)
        assert Action.STOP not in decision.actions
        state = decision.state
    assert state.job is PAUSED


@pytest.mark.parametrize("level", ["Trapping", "Sleeping", "Critical"])
def test_pressure_that_means_stop_stops_at_once_however_cool_the_degrees(level: str) -> None:
    decision = polls([(60.0, level)])[0]
    assert decision.actions == (Action.STOP,)
    assert decision.reason == f"thermal pressure {level}"


def test_a_pause_lasts_until_below_pause_temp_minus_the_hysteresis() -> None:
    policy = ThermalPolicy(max_speed_temp=75, pause_temp=85, stop_temp=95, hysteresis=3)
    paused = react(Supervision(), policy, 85.0).state
    assert react(paused, policy, 82.5).actions == ()
    assert react(paused, policy, 81.9).actions == (Action.RESUME, Action.REDUCE_BATCH)
    # a running job below pause_temp is not paused by the hysteresis band
    assert react(Supervision(), policy, 84.0).actions == (Action.REDUCE_BATCH,)


@pytest.mark.parametrize("pressure", [None, "unheard-of"])
def test_without_a_reading_a_pause_holds_then_resumes_after_the_missing_polls(
    pressure: str | None,
) -> None:
    """decide() calls 'nothing known' OK; resuming on a sensor hiccup would be the wrong default,
    and parking the job for ever on a dead one too."""
    state = Supervision(PAUSED, True)
    for missing in range(1, MISSING_POLLS_TO_RESUME):
        decision = react(state, POLICY, None, pressure)
        assert (decision.cooling, decision.actions) == (None, ())
        state = decision.state
        assert state == Supervision(PAUSED, True, missing)
    last = react(state, POLICY, None, pressure)
    assert last.actions == (Action.RESUME,) and last.state == Supervision(RUNNING, True, 0)
    assert f"no reading for {MISSING_POLLS_TO_RESUME} polls" in (last.reason or "")


def test_a_reading_ends_the_count_of_missing_polls() -> None:
    state = react(react(Supervision(PAUSED), POLICY, None).state, POLICY, 90.0).state
    assert (state.job, state.missing) == (PAUSED, 0)
    running = react(Supervision(RUNNING, True), POLICY, None)
    assert running.actions == () and running.state == Supervision(RUNNING, True, 1)


def test_the_gate_applies_the_rule_poll_after_poll() -> None:
    gate = CoolingGate()
    hot = ThermalReading(celsius=90.0, source="test")
    assert gate.observe(POLICY, hot).actions == (Action.PAUSE,) and gate.state is CoolingState.PAUSE
    assert gate.observe(POLICY, None).actions == ()
    assert gate.state is CoolingState.PAUSE
    too_hot = ThermalReading(celsius=96.0, source="test")
    assert [gate.observe(POLICY, too_hot).actions for _ in range(HOT_POLLS_TO_STOP)][-1] == (
        Action.STOP,
    )
    assert gate.state is CoolingState.STOP


def test_a_pressure_level_alone_drives_the_job() -> None:
    decision = react(Supervision(), POLICY, None, "Heavy")
    assert (decision.cooling, decision.actions) == (CoolingState.PAUSE, (Action.PAUSE,))
    assert react(decision.state, POLICY, None, "Nominal").actions == (Action.RESUME,)


def test_a_coordinators_thresholds_sit_on_the_defaults_of_the_scale_they_apply_to() -> None:
    """Only what a coordinator set is kept (policy.json): on a source of another scale the
    rest are that source's defaults, never the numbers of the one it was set on."""
    on_smc = with_given("smc", {"hysteresis": 2.0}, SET_BY_COORDINATOR)
    assert on_smc.policy == ThermalPolicy(95, 114, 120, hysteresis=2.0)
    assert on_smc.origin == "set by coordinator policy, the rest defaults for smc"
    on_sim = with_given(None, {"hysteresis": 2.0}, SET_BY_COORDINATOR)
    assert on_sim.policy == ThermalPolicy(hysteresis=2.0)
    every = {"max_speed_temp": 90.0, "pause_temp": 100.0, "stop_temp": 110.0}
    assert with_given("smc", every, SET_BY_COORDINATOR).origin == SET_BY_COORDINATOR
    with pytest.raises(ValueError, match="thresholds out of order"):
        with_given(None, {"max_speed_temp": 90.0}, SET_BY_COORDINATOR)  # above sim's pause


def test_a_policy_events_detail_says_its_origin_and_a_peers_words_are_checked() -> None:
    in_force = with_given("smc", {"pause_temp": 110.0}, SET_BY_COORDINATOR)
    detail = policy_event_detail(in_force)
    assert detail.endswith("(set by coordinator policy, the rest defaults for smc)")
    assert origin_in_detail(detail) == in_force.origin
    assert origin_in_detail("max_speed_temp=75 pause_temp=85") is None  # an older agent
    assert origin_in_detail("x (rm -rf /)") is None and origin_in_detail(7) is None
    assert origin_told("defaults for smc") == "defaults for smc"
    for told in (None, 3, "", "a\x1b[31mred", "x" * 301):
        assert origin_told(told) is None
