"""`agent doctor --load`: the verdict over plain numbers (moved, did not move, no reading), and
real `agent doctor --load` runs against fake /sys trees: a sensor and a RAPL counter that stay
put under load fail as unable to tell load from idle; sources that are not there are reported
unavailable with their reason, never given a number."""

from __future__ import annotations

import json
import platform
import socket
from pathlib import Path

import pytest

from agent.doctor.load import (
    CANNOT_TELL,
    POWER_MARGIN_W,
    THERMAL_RISE_C,
    power_verdict,
    thermal_verdict,
    window_watts,
)
from tests.fleet_support import cli
from tests.sysfs_support import build_sysfs

# --- the verdicts -------------------------------------------------------------------------------


def test_a_thermal_source_that_rises_under_load_moved() -> None:
    found = thermal_verdict([50.0, 50.5, 50.0], [51.0, 53.0, 54.0])
    assert found.ok
    assert found.detail == "idle 50.2 °C -> end 54.0 °C, peak 54.0 °C: +3.8 °C"


def test_a_thermal_source_that_stays_put_cannot_tell_load_from_idle() -> None:
    found = thermal_verdict([58.0, 58.0], [58.0, 58.0, 58.0])
    assert not found.ok and found.detail.endswith(CANNOT_TELL)
    assert f"under {THERMAL_RISE_C:g} °C" in found.detail
    barely = thermal_verdict([58.0], [58.0 + THERMAL_RISE_C * 0.9])
    assert not barely.ok and CANNOT_TELL in barely.detail


def test_a_rise_within_idles_own_jitter_is_not_a_move() -> None:
    found = thermal_verdict([50.0, 52.0, 50.0], [52.0, 52.0])
    assert not found.ok and "within idle's 2.0" in found.detail and CANNOT_TELL in found.detail


def test_a_thermal_source_without_readings_says_which_window_and_why() -> None:
    neither = thermal_verdict([], [], "linux: no readable temperature under /sys")
    assert not neither.ok
    assert neither.detail == (
        "no reading at idle or under load: linux: no readable temperature under /sys"
    )
    assert "°C" not in neither.detail
    under_load = thermal_verdict([50.0], [], None)
    assert not under_load.ok and under_load.detail.startswith("no reading under load")


def test_a_power_source_that_draws_more_under_load_moved() -> None:
    found = power_verdict(3.0, 9.5)
    assert found.ok and found.detail == "idle 3.00 W -> load 9.50 W: +6.50 W"


@pytest.mark.parametrize(
    ("idle_w", "load_w"),
    [(10.0, 10.9), (0.0, POWER_MARGIN_W * 0.9), (5.0, 5.0), (8.0, 6.0)],
    ids=["under 10 percent", "under the floor", "flat", "lower"],
)
def test_a_power_source_within_the_margin_cannot_tell_load_from_idle(
    idle_w: float, load_w: float
) -> None:
    found = power_verdict(idle_w, load_w)
    assert not found.ok and found.detail.endswith(CANNOT_TELL)


def test_a_power_source_without_readings_is_given_no_watts() -> None:
    found = power_verdict(None, 12.0, "rapl: cannot read energy_uj")
    assert not found.ok
    assert found.detail == "no reading at idle: rapl: cannot read energy_uj"
    assert power_verdict(4.0, None).detail == "no reading under load: the source gave none"


def test_window_watts_is_the_energy_over_the_time_between_readings_with_joules() -> None:
    assert window_watts([(0.0, 10.0), (1.0, None), (2.0, 30.0)]) == 10.0
    assert window_watts([(0.0, None), (1.0, 5.0)]) is None
    assert window_watts([(1.0, 5.0), (1.0, 9.0)]) is None
    assert window_watts([]) is None


# --- agent doctor --load ------------------------------------------------------------------------


ON_LINUX = pytest.mark.skipif(platform.system() != "Linux", reason="Linux's sources")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("0.0.0.0", 0))
        return sock.getsockname()[1]


def doctor_load(seconds: str, sysfs: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, dict]:
    """`agent doctor --load SECONDS --format json` over the fake /sys `sysfs`; its checks by
    name. The load's rows fail on this machine, but none is required: exit 0."""
    monkeypatch.setenv("MLX_FLEET_SYSFS_ROOT", str(sysfs))
    result = cli(
        "agent", "doctor", "--load", seconds, "--format", "json", "--bind", f"0.0.0.0:{free_port()}"
    )
    assert result.returncode == 0, result.stdout + result.stderr
    checks = {check["name"]: check for check in json.loads(result.stdout)["checks"]}
    assert (
        checks["load"]["ok"] and f"{seconds} s of 512x512 fp32 matmuls" in checks["load"]["detail"]
    )
    assert not any(check["required"] for name, check in checks.items() if name.startswith("load"))
    return checks


@ON_LINUX
@pytest.mark.slow
def test_sources_that_stay_put_under_a_real_load_fail(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sysfs = build_sysfs(
        tmp_path / "sys",
        {
            "class/thermal/thermal_zone0/type": "x86_pkg_temp\n",
            "class/thermal/thermal_zone0/temp": "58000\n",
            "class/powercap/intel-rapl:0/name": "package-0\n",
            "class/powercap/intel-rapl:0/energy_uj": "1000000\n",
            "class/powercap/intel-rapl:0/max_energy_range_uj": "262143328850\n",
        },
    )
    checks = doctor_load("2", sysfs, monkeypatch)
    thermal, power = checks["load: thermal linux"], checks["load: power rapl"]
    assert not thermal["ok"] and CANNOT_TELL in thermal["detail"]
    assert thermal["detail"].startswith("idle 58.0 °C -> end 58.0 °C, peak 58.0 °C: +0.0 °C")
    assert "--thermal-source" in thermal["fix"]
    assert not power["ok"] and CANNOT_TELL in power["detail"]
    assert power["detail"].startswith("idle 0.00 W -> load 0.00 W")
    assert "sim" not in " ".join(checks) and "replay" not in " ".join(checks)


@ON_LINUX
@pytest.mark.slow
def test_sources_that_are_not_there_are_unavailable_with_their_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    checks = doctor_load("1", tmp_path / "empty", monkeypatch)
    thermal, power = checks["load: thermal linux"], checks["load: power rapl"]
    assert not thermal["ok"] and thermal["detail"].startswith("unavailable: linux: no thermal zone")
    assert not power["ok"] and power["detail"].startswith("unavailable: rapl: no powercap RAPL")
    assert "°C" not in thermal["detail"] and " W" not in power["detail"]


@pytest.mark.parametrize("seconds", ["0", "-1", "abc", "nan"])
def test_a_bad_load_is_one_line_exit_2(seconds: str) -> None:
    result = cli("agent", "doctor", "--load", seconds)
    assert result.returncode == 2, result.stdout + result.stderr
    assert len(result.stderr.splitlines()) == 1 and "--load" in result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""
