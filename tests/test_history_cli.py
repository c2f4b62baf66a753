"""`coordinator history` on a recorded store (the real console script, real SQLite): statistics
per host, --hosts and --since windows, the plot, and its errors."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from coordinator.telemetry.store import TelemetryStore
from tests.conftest import subprocess_env
from tests.fleet_support import cli
from tests.test_history_stats import POLICY, event, job, sample

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def recorded() -> float:
    """Ten minutes of two hosts, one second apart, recorded as the monitor would: mac1 warms
    past pause (a job paused for 60 s) and cools; mac2 stays at 50 °C. Returns the start."""
    start = time.time() - 600
    with TelemetryStore() as store:
        store.record_policy("mac1:5555", POLICY, start - 10)
        store.record_policy("mac2:5555", POLICY, start - 10)
        rows = []
        for t in range(600):
            hot = 300 <= t < 360
            rows.append(
                (
                    "mac1:5555",
                    sample(
                        start + t,
                        88.0 if hot else 70.0,
                        "pause" if hot else "ok",
                        jobs=[job("paused" if hot else "running")],
                    ),
                )
            )
            rows.append(("mac2:5555", sample(start + t, 50.0, source="iohid")))
        store.add(
            rows,
            [
                ("mac1:5555", event(start + 300, "pause", 88.0)),
                ("mac1:5555", event(start + 360, "resume", 70.0)),
            ],
        )
    return start


def history(*args: str) -> subprocess.CompletedProcess[str]:
    return cli("coordinator", "history", *args)


@pytest.mark.slow
def test_statistics_per_host_from_the_record(recorded: float) -> None:
    result = history("--since", "1h", "--format", "json")
    assert result.returncode == 0, result.stderr
    hosts = {row["host"]: row for row in json.loads(result.stdout)["hosts"]}
    assert list(hosts) == ["mac1:5555", "mac2:5555"]
    hot, cool = hosts["mac1:5555"], hosts["mac2:5555"]
    assert hot["samples"] == 600 and hot["first"] == pytest.approx(recorded)
    assert (hot["min_c"], hot["max_c"]) == (70.0, 88.0)
    assert hot["mean_c"] == pytest.approx(70 + 18 * 60 / 600)
    assert hot["seconds_above"] == {"max_speed_temp": 60.0, "pause_temp": 60.0, "stop_temp": 0.0}
    assert hot["seconds_paused"] == 60.0 and (hot["pauses"], hot["stops"]) == (1, 0)
    assert hot["simulated"] and hot["policy"] == POLICY
    assert cool["max_c"] == 50.0 and cool["seconds_above"]["max_speed_temp"] == 0.0
    assert not cool["simulated"] and cool["sources"] == ["iohid"]
    assert hot["read_from"] == [{"source": "replay:curve.csv", "sensor": "replay", "readings": 600}]
    assert cool["read_from"] == [{"source": "iohid", "sensor": None, "readings": 600}]
    table = history("--since", "1h")
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    at = next(index for index, line in enumerate(lines) if "mac1:5555" in line)
    for part in ("(simulated)", "600", "70.0", "71.8", "88.0", "75/85/95", "1m 00s"):
        assert part in lines[at], (part, lines[at])
    under = " ".join(line.split("│")[1].strip() for line in lines[at + 1 : at + 3])
    assert under.startswith("replay:curve.csv · replay")  # where its readings came from
    assert "combine readings" not in table.stdout  # one source and sensor per host


@pytest.mark.slow
def test_readings_of_several_sensors_are_said_to_be_mixed(tmp_path: Path) -> None:
    """A host whose agent changed source (or sensor) within the window: its figures combine
    readings that may differ by tens of °C, and the table says so under the table."""
    start = time.time() - 60
    rows = [
        ("mac1:5555", sample(start + t, 60.0 + t / 10, source="iohid", sensor="PMU tdie1"))
        for t in range(20)
    ] + [("mac1:5555", sample(start + t, 80.0, source="smc", sensor="TCMz")) for t in range(20, 30)]
    rows.append(("mac1:5555", sample(start + 30, None, None, source="smc")))  # no reading
    with TelemetryStore() as store:
        store.add(rows)
    data = json.loads(history("--since", "1h", "--format", "json").stdout)["hosts"][0]
    assert data["samples"] == 31 and data["sources"] == ["iohid", "smc"]
    assert data["read_from"] == [
        {"source": "iohid", "sensor": "PMU tdie1", "readings": 20},
        {"source": "smc", "sensor": "TCMz", "readings": 10},
    ]
    table = history("--since", "1h")
    assert table.returncode == 0, table.stderr
    text = " ".join(table.stdout.split())  # the note may wrap
    assert "iohid · PMU tdie1 (20)" in text and "smc · TCMz (10)" in text
    assert (
        "mac1:5555: min/mean/max and the times above thresholds combine readings of 2 "
        "sources/sensors (iohid · PMU tdie1 (20), smc · TCMz (10)), which may differ by tens of °C"
    ) in text


@pytest.mark.slow
def test_hosts_narrow_the_window(recorded: float) -> None:
    only = json.loads(history("--hosts", "mac2", "--format", "json").stdout)["hosts"]
    assert [row["host"] for row in only] == ["mac2:5555"]


@pytest.mark.slow
def test_since_narrows_the_window(recorded: float) -> None:
    recent = json.loads(history("--since", "2m", "--format", "json").stdout)["hosts"]
    assert 110 <= recent[0]["samples"] <= 120 and recent[0]["pauses"] == 0
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(recorded + 590))
    late = json.loads(history("--since", stamp, "--format", "json").stdout)["hosts"]
    assert 9 <= late[0]["samples"] <= 10


@pytest.mark.slow
def test_plot_writes_a_png_of_the_record(recorded: float, tmp_path: Path) -> None:
    out = tmp_path / "out.png"
    result = history("--since", "1h", "--plot", str(out))
    assert result.returncode == 0, result.stderr
    assert f"wrote {out}" in result.stderr
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


@pytest.mark.slow
def test_nothing_recorded(tmp_path: Path) -> None:
    empty = history("--since", "1h")
    assert empty.returncode == 0 and "no telemetry recorded since" in empty.stderr
    plot = history("--plot", str(tmp_path / "out.png"))
    assert plot.returncode == 1 and "nothing to plot" in plot.stderr
    assert not (tmp_path / "out.png").exists()


@pytest.mark.slow
def test_bad_input_exits_2() -> None:
    assert "expected a duration such as 30m" in history("--since", "soon").stderr
    assert history("--since", "soon").returncode == 2
    assert history("--format", "csv").returncode == 2


def test_plot_without_matplotlib_names_the_extra(tmp_path: Path) -> None:
    blocked = (
        "import sys; sys.modules['matplotlib'] = None; "
        "sys.argv = ['coordinator', 'history', '--plot', sys.argv[1]]; "
        "from coordinator.cli import main; main()"
    )
    result = subprocess.run(
        [sys.executable, "-c", blocked, str(tmp_path / "out.png")],
        capture_output=True,
        text=True,
        env=subprocess_env(),
        timeout=60,
    )
    assert result.returncode == 2
    assert "pip install 'mlx-fleet[plot]'" in result.stderr


def test_a_table_wider_than_the_pipe_width_is_not_folded() -> None:
    """Piped, history's table keeps its natural width, one line per row, however long a host's
    name and source line make it (folded, a host cell spans several lines)."""
    host = "a-mac-with-a-rather-long-name.lab.example.org:5555"
    source = "replay:/srv/lab/curves/a-long-recorded-fine-tune-curve.csv"
    start = time.time() - 60
    with TelemetryStore() as store:
        store.record_policy(host, POLICY, start - 10)
        store.add([(host, sample(start + t, 70.0, source=source)) for t in range(30)])
    result = history("--since", "1h")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    widths = {len(line) for line in lines if line.startswith(("┏", "┃", "┡", "│", "└"))}
    assert len(widths) == 1 and widths.pop() > 200  # every border and row the same width
    row = next(line for line in lines if host in line)
    assert "70.0" in row  # the host's whole name and its figures on one line
    assert any(source in line for line in lines)
