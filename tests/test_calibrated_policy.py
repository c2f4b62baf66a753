"""A calibrated policy's place (issue 41, Build 4): operator-set thresholds over this Mac's
calibration over the source's table; the calibration kept in calibration.json, applied only
to the source it was made with, and named wherever the policy is."""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import replace

import pytest

from agent.cooling.calibration_file import (
    calibration_path,
    load_calibration,
    policy_defaults,
    save_calibration,
)
from agent.cooling.events import EventLog
from agent.cooling.policy_file import save_policy
from agent.daemon.history import TelemetryHistory
from agent.daemon.policy import EnforcedPolicy
from agent.daemon.storage import StorageHealth
from agent.daemon.telemetry import sample
from agent.daemon.throttle import LogThrottle
from agent.sensors.base import SourceInfo
from agent.thermal.base import ThermalReading
from shared.cooling.calibration import (
    SET_BY_COORDINATOR,
    calibrated_defaults,
    origin_in_detail,
    policy_event_detail,
    with_given,
)
from shared.cooling.throttle import ThrottleVerdict
from shared.cooling.throttle_point import (
    ThrottlePoint,
    find_throttle_point,
    passive_onsets,
    stale_note,
)
from tests.test_throttle_point import run_model

DAY = 1796515200.0  # 2026-12-06


@pytest.fixture(scope="module")
def point() -> ThrottlePoint:
    return find_throttle_point(run_model(), "smc", False, DAY)


def test_a_calibration_pauses_at_its_onset_for_its_own_source_only(point: ThrottlePoint) -> None:
    onset = round(point.onset_c, 1)
    calibrated = calibrated_defaults("smc", "smc", point)
    assert calibrated.policy.pause_temp == onset
    assert calibrated.policy.stop_temp == 120.0  # the table's safety limit stays
    assert calibrated.origin == f"calibrated on this Mac 2026-12-06: onset {onset} °C (smc · Tg0k)"
    assert calibrated_defaults("iohid", "iohid", point).origin == "defaults for iohid"
    assert calibrated_defaults("smc", "smc", None).origin == "defaults for smc"


def test_operator_thresholds_win_over_the_calibration(point: ThrottlePoint) -> None:
    base = calibrated_defaults("smc", "smc", point)
    in_force = with_given("smc", {"pause_temp": 99.0}, SET_BY_COORDINATOR, base)
    assert in_force.policy.pause_temp == 99.0
    assert in_force.policy.max_speed_temp == base.policy.max_speed_temp
    assert in_force.origin == f"{SET_BY_COORDINATOR}, the rest {base.origin}"
    assert origin_in_detail(policy_event_detail(base)) == base.origin


def test_the_file_round_trips_and_a_broken_one_is_none(
    point: ThrottlePoint, caplog: pytest.LogCaptureFixture
) -> None:
    assert load_calibration() is None
    save_calibration(point)
    assert load_calibration() == point
    assert policy_defaults("smc", "smc").origin == point.origin()
    calibration_path().write_text(json.dumps({**point.to_dict(), "onset_c": "hot"}))
    with caplog.at_level(logging.ERROR):
        assert load_calibration() is None
    assert "cannot use the calibration" in caplog.text
    assert policy_defaults("smc", "smc").origin == "defaults for smc"


def test_the_daemon_enforces_it_under_the_coordinator_and_sees_a_new_one(
    point: ThrottlePoint,
) -> None:
    storage = StorageHealth(LogThrottle(logging.getLogger("test")))
    enforced = EnforcedPolicy(storage)
    enforced.on_scale("smc", "smc")
    assert enforced.origin == "defaults for smc"
    save_calibration(point)
    os.utime(calibration_path(), ns=(1, 1))  # a stamp of its own, whatever the clock's grain
    assert enforced.recalibrated()
    assert enforced.origin == point.origin()
    assert not enforced.recalibrated()  # unchanged file: nothing read
    save_policy({"stop_temp": 118.0})
    restarted = EnforcedPolicy(storage)
    restarted.on_scale("smc", "smc")
    assert restarted.policy.stop_temp == 118.0
    assert restarted.policy.pause_temp == round(point.onset_c, 1)
    assert restarted.origin == f"{SET_BY_COORDINATOR}, the rest {point.origin()}"


def test_where_ordinary_work_began_to_throttle_is_learned() -> None:
    polls = [(90.0, False), (99.0, True), (99.5, True), (None, None), (97.0, True), (96.0, None)]
    assert passive_onsets(polls) == [99.0, 97.0]
    assert stale_note(101.5, [100.0, 99.9]) is None  # within STALE_MARGIN_C: it holds
    assert stale_note(101.5, [98.0]) is None  # once could be a neighbour's heat
    assert stale_note(101.5, [98.0, 97.0, 101.0]) == (
        "looks stale: throttling began at 97.5 °C (2 times since)"
    )


def test_throttling_under_its_onset_makes_the_calibration_look_stale_and_a_restart_remembers(
    point: ThrottlePoint,
) -> None:
    """From the daemon's own history: live samples, then a new daemon reading them back."""
    stored = replace(point, source="smc", calibrated_at=time.time() - 60)
    save_calibration(stored)
    storage = StorageHealth(LogThrottle(logging.getLogger("test")))
    enforced = EnforcedPolicy(storage)
    enforced.on_scale("smc", "smc")
    history = TelemetryHistory("mac", EventLog())
    enforced.learn_from(history)
    assert enforced.origin == stored.origin()
    under = stored.onset_c - 5.0
    changed = []
    for celsius, throttling in [(under, True), (under, True), (60.0, False), (under, True)]:
        taken = sample(
            time.time(),
            ThermalReading(celsius, "smc", sensor="Tg0k"),
            SourceInfo("smc", False),
            None,
            None,
            0.0,
            [],
            throttle=ThrottleVerdict(throttling),
        )
        changed.append(enforced.observe(taken.celsius, taken.throttling))
        history.add_sample(taken)
    assert changed == [False, False, False, True]
    assert enforced.origin.startswith(f"{stored.origin()}; looks stale: throttling began at ")
    history.close()
    restarted = EnforcedPolicy(storage)
    restarted.on_scale("smc", "smc")
    reopened = TelemetryHistory("mac", EventLog())
    restarted.learn_from(reopened)
    assert restarted.origin == enforced.origin
    reopened.close()
