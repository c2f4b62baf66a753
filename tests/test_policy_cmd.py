"""`coordinator policy`: the local check of the thresholds given, and, against real agents, a
push applied on every host, refused with the agent's reason, shown, and unreachable hosts."""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path
from typing import Any

import pytest

from coordinator.telemetry.store import TelemetryStore
from shared.cooling.calibration import check_given
from tests.fleet_support import AgentPool, cli
from tests.test_monitor import known_agent

pytestmark = pytest.mark.timeout(90)


@pytest.mark.parametrize(
    "given",
    [
        {},
        {"pause_temp": 99.0},
        {"max_speed_temp": 70.0, "stop_temp": 90.0},
        {"max_speed_temp": 1.0, "pause_temp": 2.0, "stop_temp": 3.0, "hysteresis": 0.0},
    ],
)
def test_thresholds_in_order_among_those_given_pass(given: dict[str, float]) -> None:
    check_given(given)


@pytest.mark.parametrize(
    ("given", "named"),
    [
        (
            {"pause_temp": 90.0, "max_speed_temp": 95.0},
            "need --max-speed-temp < --pause-temp (max speed < pause < stop), "
            "got --max-speed-temp 95 --pause-temp 90",
        ),
        ({"max_speed_temp": 80.0, "stop_temp": 80.0}, "need --max-speed-temp < --stop-temp"),
        ({"hysteresis": -1.0}, "--hysteresis must be >= 0 °C, got -1"),
        ({"pause_temp": math.nan}, "--pause-temp must be a finite number"),
    ],
)
def test_out_of_order_thresholds_are_named(given: dict[str, float], named: str) -> None:
    with pytest.raises(ValueError) as caught:
        check_given(given)
    assert named in str(caught.value)


def policy(*args: str) -> subprocess.CompletedProcess[str]:
    return cli("coordinator", "policy", "--format", "json", "--connect-timeout", "1", *args)


def by_host(result: subprocess.CompletedProcess[str]) -> dict[str, dict[str, Any]]:
    return {row["host"]: row for row in json.loads(result.stdout)}


@pytest.mark.slow
def test_a_push_is_applied_shown_refused_with_the_reason_and_recorded(
    agents: AgentPool, tmp_path: Path
) -> None:
    first, second = (known_agent(agents, name, 60.0, tmp_path) for name in ("mac1", "mac2"))
    hosts = f"{first.address},{second.address}"
    pushed = policy("--hosts", hosts, "--pause-temp", "88", "--hysteresis", "2")
    assert pushed.returncode == 0, pushed.stderr
    for row in by_host(pushed).values():
        assert row["result"] == "applied" and row["error"] is None
        assert row["policy"] == {
            "max_speed_temp": 75.0,
            "pause_temp": 88.0,
            "stop_temp": 95.0,
            "pause_duration": 0.5,
            "hysteresis": 2.0,
        }
    refused = policy("--hosts", hosts, "--pause-temp", "99")  # above each host's stop, 95
    assert refused.returncode == 1
    for row in by_host(refused).values():
        assert row["result"] == "refused" and row["policy"] is None
        assert "out of order" in row["error"] and "stop_temp=95" in row["error"]
    shown = policy("--hosts", hosts)
    assert shown.returncode == 0, shown.stderr
    assert {row["result"] for row in by_host(shown).values()} == {"shown"}
    assert {row["policy"]["pause_temp"] for row in by_host(shown).values()} == {88.0}
    with TelemetryStore() as store:  # what `coordinator history` measures time above against
        learned = store.policies()
    assert [p["pause_temp"] for _, p in learned[first.address]] == [88.0]
    table = cli("coordinator", "policy", "--hosts", first.address)
    row = next(line for line in table.stdout.splitlines() if first.address in line)
    for part in ("shown", "75", "88", "95", "2", "0.5"):
        assert part in row


@pytest.mark.slow
def test_an_unreachable_host_fails_the_push_and_others_apply_it(
    agents: AgentPool, tmp_path: Path
) -> None:
    live, gone = (known_agent(agents, name, 60.0, tmp_path) for name in ("live", "gone"))
    gone.kill()
    result = policy("--hosts", f"{live.address},{gone.address}", "--stop-temp", "97")
    assert result.returncode == 1
    rows = by_host(result)
    assert rows[live.address]["result"] == "applied"
    assert rows[live.address]["policy"]["stop_temp"] == 97.0
    assert rows[gone.address]["result"] == "unreachable"
    assert "connection refused" in rows[gone.address]["error"]


@pytest.mark.slow
def test_thresholds_out_of_order_exit_2_before_any_host_is_asked() -> None:
    result = cli(
        "coordinator",
        "policy",
        "--hosts",
        "127.0.0.1:9",
        "--pause-temp",
        "90",
        "--max-speed-temp",
        "95",
    )
    assert result.returncode == 2
    assert "--max-speed-temp < --pause-temp" in result.stderr
