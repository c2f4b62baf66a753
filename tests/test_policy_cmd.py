"""`coordinator policy`: the local check of the thresholds given, and, against real agents, a
push applied on every host, refused with the agent's reason, shown, and unreachable hosts."""

from __future__ import annotations

import math

import pytest

from coordinator.policy_cmd import check_given


@pytest.mark.parametrize("given", [{}, {"pause_temp": 99.0}, {"max_speed_temp": 70.0,
                                                               "stop_temp": 90.0},
                                   {"max_speed_temp": 1.0, "pause_temp": 2.0, "stop_temp": 3.0,
                                    "hysteresis": 0.0}])
def test_thresholds_in_order_among_those_given_pass(given: dict[str, float]) -> None:
    check_given(given)


@pytest.mark.parametrize(("given", "named"), [
    ({"pause_temp": 90.0, "max_speed_temp": 95.0},
     "need --max-speed-temp < --pause-temp (max speed < pause < stop), got --max-speed-temp 95 "
     "--pause-temp 90"),
    ({"max_speed_temp": 80.0, "stop_temp": 80.0}, "need --max-speed-temp < --stop-temp"),
    ({"hysteresis": -1.0}, "--hysteresis must be >= 0 °C, got -1"),
    ({"pause_temp": math.nan}, "--pause-temp must be a finite number"),
])
def test_out_of_order_thresholds_are_named(given: dict[str, float], named: str) -> None:
    with pytest.raises(ValueError) as caught:
        check_given(given)
    assert named in str(caught.value)
