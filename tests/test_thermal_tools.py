"""Sources that run a tool or read /sys, and `agent temp`, against real processes and files.

The tools are fake executables placed first on PATH (tests/fixtures/fake_tool.py streaming the
captured output); /sys is a tree built in tmp_path and named by MLX_FLEET_SYSFS_ROOT.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from agent.sensors.base import Backoff
from agent.sensors.process import powermetrics_command
from agent.thermal import SourceUnavailable, ThermalMonitor, open_source
from agent.thermal.base import NoneSource, ThermalReading, ThermalSource
from agent.thermal.linux import LinuxSysfsSource
from agent.thermal.process import MacmonSource, PowermetricsSource, powermetrics_samplers
from tests.sysfs_support import build_sysfs

FIXTURES = Path(__file__).parent / "fixtures"
FAST = {"interval_s": 0.05, "startup_s": 5.0}


def starts(log: Path) -> list[list[str]]:
    """Each start of a fake tool: [pid, tool, arguments...]."""
    return [line.split() for line in log.read_text().splitlines()] if log.exists() else []


def read_until(
    source: ThermalSource, done: Callable[[ThermalReading | None], bool], timeout: float = 10.0
) -> tuple[ThermalReading | None, list[str]]:
    """Read every 20 ms until `done` holds; returns the last reading and every reason seen."""
    reasons: list[str] = []
    deadline = time.monotonic() + timeout
    while True:
        reading = source.read()
        if source.last_error:
            reasons.append(source.last_error)
        if done(reading) or time.monotonic() > deadline:
            return reading, reasons
        time.sleep(0.02)


def alive(pid: str) -> bool:
    try:
        return psutil.Process(int(pid)).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


# --- macmon -------------------------------------------------------------------------------------


def test_macmon_streams_from_one_long_lived_process(tool_log: Path) -> None:
    with MacmonSource(**FAST) as source:
        readings = [source.read() for _ in range(5)]
        time.sleep(0.2)
        readings.append(source.read())
    assert all(r is not None and r.celsius == 43.73614 for r in readings)
    first = readings[0]
    assert first is not None
    assert first.sensors == {"cpu_temp_avg": 43.73614, "gpu_temp_avg": 36.95167}
    assert (first.source, first.simulated, first.pressure) == ("macmon", False, None)
    assert [start[1:] for start in starts(tool_log)] == [["macmon", "-i", "50", "pipe"]]


def test_the_macmon_command_works_on_macmon_0_4(
    tool_log: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`macmon pipe -i MS` fails on macmon <= 0.4.2; `macmon -i MS pipe` works everywhere."""
    monkeypatch.setenv("FAKE_MACMON_OLD", "1")
    with MacmonSource(**FAST) as source:
        reading, _ = read_until(source, lambda r: r is not None)
    assert reading is not None and reading.sensor == "cpu_temp_avg"


def test_a_dying_macmon_is_restarted_with_backoff(
    tool_log: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_MACMON_MODE", "die:2")
    with MacmonSource(**FAST, backoff=Backoff(initial=0.05, maximum=0.1)) as source:
        _, reasons = read_until(source, lambda _: len(starts(tool_log)) >= 3)
        reading, _ = read_until(source, lambda r: r is not None)
    assert len(starts(tool_log)) >= 3
    assert any("exited with code 3" in reason for reason in reasons)
    assert reading is not None and reading.celsius == 43.73614


def test_a_silent_macmon_is_killed_and_restarted(
    tool_log: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_MACMON_MODE", "silent:1")
    source = MacmonSource(**FAST, silence_s=0.3, backoff=Backoff(initial=0.05, maximum=0.1))
    _, reasons = read_until(source, lambda _: len(starts(tool_log)) >= 2)
    pids = [start[0] for start in starts(tool_log)]
    assert len(pids) >= 2
    assert any("silent" in reason for reason in reasons)
    assert not alive(pids[0])
    source.close()
    source.close()
    assert not any(alive(pid) for pid in [start[0] for start in starts(tool_log)])


def test_garbage_from_macmon_reads_none_with_the_reason_and_the_monitor_goes_on(
    tool_log: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_MACMON_MODE", "garbage")
    source = MacmonSource(interval_s=0.05, startup_s=0.5)  # no sample will ever come
    with ThermalMonitor(poll_interval=0.05, source=source) as monitor:
        monitor.start()
        time.sleep(0.3)
        assert monitor.running
        assert monitor.temperature is None
        assert "not a sample" in (monitor.last_error or "")
        assert "this is not a sample" in (monitor.last_error or "")
    source.close()


@pytest.mark.parametrize(
    ("where", "name", "hint"),
    [
        ("PATH", "macmon", "brew install macmon"),
        ("PATH", "powermetrics", "powermetrics not found"),
        ("MLX_FLEET_SYSFS_ROOT", "linux", "no thermal zone or hwmon"),
    ],
)
def test_a_source_with_no_tool_or_sensor_is_unavailable_with_a_hint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str, name: str, hint: str
) -> None:
    """`where` (PATH for a tool, the sysfs root for sensors) names an empty folder."""
    monkeypatch.setenv(where, str(tmp_path))
    with pytest.raises(SourceUnavailable, match=hint):
        open_source(name)


# --- powermetrics -------------------------------------------------------------------------------


def test_powermetrics_samplers_follow_the_architecture() -> None:
    assert powermetrics_samplers("arm64") == ("thermal",)
    assert powermetrics_samplers("x86_64") == ("smc", "thermal")


def test_powermetrics_command_runs_the_sampler_at_the_interval() -> None:
    assert powermetrics_command("/usr/bin/powermetrics", "smc", 1000, None) == [
        "/usr/bin/powermetrics",
        "--samplers",
        "smc",
        "-i",
        "1000",
        "-b",
        "1",
    ]


def test_powermetrics_command_runs_under_sudo_without_a_prompt() -> None:
    assert powermetrics_command("/usr/bin/powermetrics", "thermal", 500, "/usr/bin/sudo")[:3] == [
        "/usr/bin/sudo",
        "-n",
        "/usr/bin/powermetrics",
    ]


def test_powermetrics_on_intel_gives_die_degrees(tool_log: Path) -> None:
    with PowermetricsSource(use_sudo=False, machine="x86_64", **FAST) as source:
        reading, _ = read_until(source, lambda r: r is not None)
    assert reading is not None
    assert reading.celsius == 47.42
    assert reading.sensors == {"CPU die temperature": 47.42, "GPU die temperature": 41.0}
    assert reading.pressure is None
    assert [start[1:] for start in starts(tool_log)] == [
        ["powermetrics", "--samplers", "smc", "-i", "50", "-b", "1"]
    ]


@pytest.mark.parametrize(
    ("machine", "samplers"),
    [("arm64", ["thermal"]), ("x86_64", ["smc", "thermal"])],
    ids=["apple-silicon", "rosetta"],
)
def test_powermetrics_on_apple_silicon_gives_the_pressure_level(
    tool_log: Path, monkeypatch: pytest.MonkeyPatch, machine: str, samplers: list[str]
) -> None:
    """An x86 Python under Rosetta on Apple Silicon believes it is on Intel: it asks for the
    smc sampler, is refused, and falls back to thermal."""
    monkeypatch.setenv("FAKE_POWERMETRICS_MODEL", "apple")
    with PowermetricsSource(use_sudo=False, machine=machine, **FAST) as source:
        reading = source.read()
    assert reading is not None
    assert (reading.celsius, reading.pressure, dict(reading.sensors)) == (None, "Nominal", {})
    assert [start[2:4] for start in starts(tool_log)] == [["--samplers", s] for s in samplers]


def test_powermetrics_runs_through_sudo_n_when_not_root(tool_log: Path) -> None:
    with PowermetricsSource(use_sudo=True, machine="x86_64", **FAST) as source:
        reading = source.read()
    assert reading is not None and reading.celsius == 47.42
    sudo, tool = starts(tool_log)
    assert sudo[1:3] == ["sudo", "-n"] and sudo[3].endswith("/powermetrics")
    assert tool[1:] == ["powermetrics", "--samplers", "smc", "-i", "50", "-b", "1"]


def test_sudo_without_sudoers_entry_reads_none_with_the_reason(
    tool_log: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_SUDO_DENY", "1")
    with PowermetricsSource(use_sudo=True, **FAST) as source:
        assert source.read() is None
        assert "a password is required" in (source.last_error or "")


# --- Linux sysfs --------------------------------------------------------------------------------


SYSFS = {
    "class/thermal/thermal_zone0/type": "x86_pkg_temp\n",
    "class/thermal/thermal_zone0/temp": "58000\n",
    "class/hwmon/hwmon0/name": "k10temp\n",
    "class/hwmon/hwmon0/temp1_label": "Tctl\n",
    "class/hwmon/hwmon0/temp1_input": "63250\n",
    "class/hwmon/hwmon1/name": "nvme\n",
    "class/hwmon/hwmon1/temp1_input": "71000\n",
}


@pytest.fixture
def sysfs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = build_sysfs(tmp_path / "sys", SYSFS)
    monkeypatch.setenv("MLX_FLEET_SYSFS_ROOT", str(root))
    return root


def test_linux_reads_the_tree_named_by_the_environment(sysfs: Path) -> None:
    with open_source("linux") as source:
        assert isinstance(source, LinuxSysfsSource)
        reading = source.read()
        assert reading is not None
        assert reading.celsius == 63.25
        assert reading.sensors["hwmon1/nvme/temp1"] == 71.0
        (sysfs / "class/hwmon/hwmon0/temp1_input").write_text("88000\n")
        hotter = source.read()
        assert hotter is not None and hotter.celsius == 88.0


@pytest.mark.skipif(platform.system() != "Linux", reason="auto's Linux order")
def test_auto_on_linux_picks_sysfs_or_says_why_not(
    sysfs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with open_source("auto") as source:
        assert source.name == "linux"
    monkeypatch.setenv("MLX_FLEET_SYSFS_ROOT", str(sysfs / "empty"))
    with open_source("auto") as source:
        assert isinstance(source, NoneSource)
        assert "linux: no thermal zone" in (source.last_error or "")


# --- agent temp ---------------------------------------------------------------------------------


def agent_temp(
    agent_cli: str, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [agent_cli, "temp", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "120", **(env or {})},
    )


def temp_json(agent_cli: str, *args: str, env: dict[str, str] | None = None) -> dict:
    result = agent_temp(agent_cli, "--format", "json", "--interval", "0.1", *args, env=env)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_agent_temp_powermetrics_intel_reports_degrees(tool_log: Path, agent_cli: str) -> None:
    data = temp_json(agent_cli, "--source", "powermetrics")
    assert (data["source"], data["kind"], data["simulated"]) == ("powermetrics", "sensor", False)
    assert data["celsius"] == 47.42
    assert data["sensors"] == {"CPU die temperature": 47.42, "GPU die temperature": 41.0}
    assert data["state"] == "ok"


def test_agent_temp_powermetrics_apple_silicon_reports_the_pressure_level(
    tool_log: Path, agent_cli: str
) -> None:
    data = temp_json(
        agent_cli, "--source", "powermetrics", env={"FAKE_POWERMETRICS_MODEL": "apple"}
    )
    assert (data["celsius"], data["pressure"], data["kind"]) == (None, "Nominal", "sensor")
    assert data["state"] == "ok"


def test_agent_temp_macmon_reports_degrees_and_policy_state(tool_log: Path, agent_cli: str) -> None:
    data = temp_json(agent_cli, "--source", "macmon", "--max-speed-temp", "40")
    assert data["celsius"] == 43.73614
    assert data["state"] == "reduce_batch"
    assert data["policy"]["max_speed_temp"] == 40.0


def test_agent_temp_linux_reads_the_fake_tree(sysfs: Path, agent_cli: str) -> None:
    data = temp_json(agent_cli, "--source", "linux")
    assert data["celsius"] == 63.25
    table = agent_temp(agent_cli, "--source", "linux")
    assert table.returncode == 0
    assert "63.2" in table.stdout and "hwmon0/k10temp/Tctl" in table.stdout
    assert "SIMULATED" not in table.stdout


def test_agent_temp_labels_replay_as_not_a_sensor(tmp_path: Path, agent_cli: str) -> None:
    curve = tmp_path / "curve.csv"
    curve.write_text("0,91\n")
    data = temp_json(agent_cli, "--source", f"replay:{curve}")
    assert (data["kind"], data["simulated"], data["celsius"]) == ("simulated", True, 91.0)
    assert data["state"] == "pause"
    table = agent_temp(agent_cli, "--source", f"replay:{curve}")
    assert "SIMULATED: not a sensor" in table.stdout


@pytest.mark.slow
def test_agent_temp_without_a_sensor_says_unavailable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, agent_cli: str
) -> None:
    data = temp_json(agent_cli, "--source", "none")
    assert (data["celsius"], data["kind"], data["state"]) == (None, "unavailable", None)
    assert data["reason"]
    table = agent_temp(agent_cli, "--source", "none")
    assert table.returncode == 0 and "unavailable" in table.stdout


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--source", "nvidia-smi"], "known: auto, none, smc, iohid, macmon, powermetrics, linux"),
        (["--pause-temp", "70"], "max_speed_temp"),
        (["--stop-temp", "80", "--pause-temp", "85"], "stop_temp"),
        (["--format", "xml"], "table, json"),
    ],
)
def test_agent_temp_bad_input_exits_2_with_one_line(
    agent_cli: str, args: list[str], needle: str
) -> None:
    result = agent_temp(agent_cli, *args)
    assert result.returncode == 2
    assert result.stdout == ""
    assert len(result.stderr.splitlines()) == 1
    assert needle in result.stderr


def test_agent_temp_bad_replay_row_names_file_and_line(tmp_path: Path, agent_cli: str) -> None:
    curve = tmp_path / "curve.csv"
    curve.write_text("0,70\n1,warm\n")
    result = agent_temp(agent_cli, "--source", f"replay:{curve}")
    assert result.returncode == 2
    assert f"{curve}:2:" in result.stderr


@pytest.mark.skipif(sys.platform == "darwin", reason="iohid and smc exist on macOS")
@pytest.mark.parametrize("source", ["iohid", "smc"])
def test_agent_temp_unavailable_source_exits_1_with_the_reason(agent_cli: str, source: str) -> None:
    result = agent_temp(agent_cli, "--source", source)
    assert result.returncode == 1
    assert len(result.stderr.splitlines()) == 1
    assert "needs macOS" in result.stderr and "this machine offers: auto, none" in result.stderr


def test_agent_temp_watch_json_streams_one_object_per_reading(
    tmp_path: Path, agent_cli: str
) -> None:
    curve = tmp_path / "curve.csv"
    curve.write_text("0,70\n0.25,90\n")
    result = agent_temp(
        agent_cli,
        "--source",
        f"replay:{curve}",
        "--watch",
        "-o",
        "json",
        "--interval",
        "0.1",
        "--count",
        "5",
    )
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(lines) == 5
    assert lines[0]["celsius"] == 70.0 and lines[-1]["celsius"] == 90.0
    assert lines[-1]["state"] == "pause"
    assert all(line["simulated"] for line in lines)


@pytest.mark.slow
def test_agent_temp_watch_table_shows_trend_and_history(tmp_path: Path, agent_cli: str) -> None:
    curve = tmp_path / "curve.csv"
    curve.write_text("0,60\n0.1,62\n0.2,64\n0.3,66\n0.4,68\n")
    result = agent_temp(
        agent_cli,
        *("--source", f"replay:{curve}", "--watch", "--interval", "0.1", "--count", "6"),
        env={"COLUMNS": "250"},  # the curve's path (longer under xdist's popen-gwN) on one line
    )
    assert result.returncode == 0, result.stderr
    assert "Trend" in result.stdout and "↑" in result.stdout
    assert "History" in result.stdout and "█" in result.stdout
    assert "SIMULATED: not a sensor" in result.stdout
