"""A calibrated policy's place (issue 41, Build 4): operator-set thresholds over this Mac's
calibration over the source's table; the calibration kept in calibration.json, applied only
to the source it was made with, and named wherever the policy is."""

from __future__ import annotations

import json
import logging
import os

import pytest

from agent.cooling.calibration_file import (
    calibration_path,
    load_calibration,
    policy_defaults,
    save_calibration,
)
from agent.cooling.policy_file import save_policy
from agent.daemon.policy import EnforcedPolicy
from agent.daemon.storage import StorageHealth
from agent.daemon.throttle import LogThrottle
from shared.cooling.calibration import (
    SET_BY_COORDINATOR,
    calibrated_defaults,
    origin_in_detail,
    policy_event_detail,
    with_given,
)
from shared.cooling.throttle_point import ThrottlePoint, find_throttle_point
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
