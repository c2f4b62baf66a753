"""The monitor's pure dashboard model: rows, sparkline buckets, alerts (pause, stop, silence,
unreachable, recovery), the JSON snapshot; fed plain message bodies and a fake clock."""

from __future__ import annotations

import re

import pytest
from rich.console import Console
from rich.text import Text

from coordinator.telemetry.dashboard import (
    COLUMNS,
    CRITICAL,
    INFO,
    MIN_SILENCE_S,
    MIN_SPARK_WIDTH,
    SPARK_WIDTH,
    WARNING,
    Dashboard,
    bucket_means,
    duration,
    fit_columns,
    host_snapshot,
    render,
    silent_after,
    snapshot,
)
from shared.wire.telemetry import CLOCK_COLUMNS
from tests.test_history_stats import POLICY, event, job, sample

INFO_OK = {
    "policy": POLICY,
    "policy_origin": "defaults for smc",
    "poll_interval": 0.1,
    "jobs": [job("running")],
}


def text_of(board: Dashboard, now: float) -> str:
    console = Console(width=200, record=True, color_system=None)
    console.print(render(board, now))
    return console.export_text()


def alerts(board: Dashboard) -> list[tuple[str, str]]:
    return [(alert.level, alert.text) for alert in board.alerts]


def test_silence_needs_five_intervals() -> None:
    assert silent_after(2.0) == 10.0
    assert silent_after(None) == 5.0  # an unknown interval counts as 1 s


def test_silence_never_needs_less_than_the_minimum() -> None:
    assert silent_after(0.1) == MIN_SILENCE_S


def window_buckets() -> list[float | None]:
    """30 buckets over the last 300 s: a reading before the window, two in the first bucket,
    a sample without a reading, two in the last bucket."""
    series = [(-5.0, 99.0), (0.0, 10.0), (1.0, 20.0), (250.0, None), (299.0, 40.0), (300.0, 60.0)]
    return bucket_means(series, 300.0, 300.0, 30)


def test_buckets_average_their_part_of_the_window() -> None:
    buckets = window_buckets()
    assert buckets[0] == 15.0 and buckets[-1] == 50.0


def test_buckets_without_a_reading_are_empty() -> None:
    assert window_buckets()[1:-1] == [None] * 28


def test_durations() -> None:
    assert [duration(s) for s in (0, 42.4, 185, 3720)] == ["0 s", "42 s", "3m 05s", "1h 02m"]


def rows_of_mac1_sampled_mac2_not_connected() -> list[str]:
    board = Dashboard(["mac1:5555", "mac2:5555"])
    board.connected("mac1:5555", "mac1", INFO_OK, now=100.0)
    body = sample(1000.0, 86.04, "pause", jobs=[job("paused")], pause_s_total=65.0)
    body["trend_c_per_min"] = 2.4
    body["source"] = "replay:/lab/[bold]curve.csv"  # an agent's text is shown, never markup
    board.sample("mac1:5555", body, now=100.5)
    return text_of(board, 100.6).splitlines()


def test_a_row_shows_the_latest_sample_of_its_host() -> None:
    row = next(line for line in rows_of_mac1_sampled_mac2_not_connected() if "mac1:5555" in line)
    for part in (
        "86.0 sim",
        "↑ +2.4/min",
        "pause",
        "run j1 paused",
        "1m 05s",
        "replay:/lab/[bold]curve.csv · replay",
    ):
        assert part in row, (part, row)


def test_a_host_not_yet_connected_shows_connecting() -> None:
    other = next(line for line in rows_of_mac1_sampled_mac2_not_connected() if "mac2:5555" in line)
    assert "connecting" in other


def test_backfill_fills_the_sparkline_but_only_live_samples_alert() -> None:
    board = Dashboard(["mac1:5555"])
    board.connected("mac1:5555", "mac1", INFO_OK, now=0.0)
    board.sample("mac1:5555", sample(1000.0, 70), now=1.0)
    for t, state in ((970.0, "pause"), (975.0, "stop")):
        board.sample("mac1:5555", sample(t, 90, state), now=1.0, live=False)
    view = board.hosts["mac1:5555"]
    assert view.sample["time"] == 1000.0  # the newest stays current
    assert view.spark()[-3:] == [90.0, None, 70.0] and len(view.spark()) == SPARK_WIDTH
    assert [at for at, _ in view.series] == [970.0, 975.0, 1000.0]
    board.sample("mac1:5555", sample(975.0, 90, "stop"), now=1.0, live=False)  # again: once
    assert len(view.series) == 3
    assert alerts(board) == []
    board.sample("mac1:5555", sample(1001.0, 86.5, "pause"), now=2.0)
    board.sample("mac1:5555", sample(1002.0, 86.0, "pause"), now=3.0)
    board.sample("mac1:5555", sample(1003.0, 95.5, "stop"), now=4.0)
    assert alerts(board) == [
        (WARNING, "reached pause at 86.5 °C"),
        (CRITICAL, "reached stop at 95.5 °C"),
    ]
    board.sample("mac1:5555", sample(1400.0, 60), now=5.0)
    assert [at for at, _ in view.series] == [1400.0]  # older than the window: dropped


def test_readings_from_another_source_or_sensor_are_said() -> None:
    """The sparkline and the record would mix them: a change of source or sensor is an alert,
    a poll without a reading (no sensor named) is not a change."""
    board = Dashboard(["mac1:5555"])
    board.connected("mac1:5555", "mac1", INFO_OK, now=0.0)
    for at, celsius, source, sensor in (
        (1000.0, 70.0, "smc", "TCMz"),
        (1001.0, None, "smc", None),
        (1002.0, 71.0, "smc", "TCMz"),
        (1003.0, 62.0, "iohid", "PMU tdie1"),
        (1004.0, 63.0, "iohid", "PMU TP1g"),
    ):
        board.sample("mac1:5555", sample(at, celsius, source=source, sensor=sensor), now=at)
    differ = "they may differ by tens of °C"
    assert alerts(board) == [
        (WARNING, f"readings now from iohid · PMU tdie1 (were smc · TCMz): {differ}"),
        (WARNING, f"readings now from iohid · PMU TP1g (were iohid · PMU tdie1): {differ}"),
    ]
    assert host_snapshot(board.hosts["mac1:5555"], 1005.0)["sensor"] == "PMU TP1g"


def test_job_events_alert_with_job_pid_and_temperature() -> None:
    board = Dashboard(["mac1:5555"])
    for body in (
        event(10, "start", detail="python -m mlx_lm lora"),
        event(11, "pause", 86.0),
        event(12, "resume", 82.0),
        event(13, "stop", 95.2),
        event(14, "kill", None, detail="ignored SIGTERM for 30 s"),
        event(15, "policy", None, name=None, pid=None, detail="75/85/99"),
    ):
        board.event("mac1:5555", body)
    assert alerts(board) == [
        (WARNING, "paused job j1 (pid 4242) at 86.0 °C"),
        (INFO, "resumed job j1 (pid 4242) at 82.0 °C"),
        (CRITICAL, "stopped job j1 (pid 4242) at 95.2 °C"),
        (CRITICAL, "killed job j1 (pid 4242): ignored SIGTERM for 30 s"),
        (INFO, "new policy: 75/85/99"),
    ]
    assert [alert.time for alert in board.alerts] == [11, 12, 13, 14, 15]


def test_a_silence_alerts_once_as_it_begins_once_as_it_ends() -> None:
    board = Dashboard(["mac1:5555"])
    board.connected("mac1:5555", "mac1", INFO_OK, now=0.0)
    board.sample("mac1:5555", sample(1000.0, 70), now=1.0)
    board.tick(1.0 + MIN_SILENCE_S)
    assert not board.hosts["mac1:5555"].silent
    board.tick(1.0 + MIN_SILENCE_S + 0.5)
    board.tick(20.0)
    assert board.hosts["mac1:5555"].silent
    assert "silent 19 s" in text_of(board, 20.0)
    board.sample("mac1:5555", sample(1020.0, 71), now=21.0)
    assert alerts(board) == [
        (WARNING, "silent: no sample for 4 s"),
        (INFO, "publishing again"),
    ]


def test_unreachability_alerts_once_as_it_begins_once_as_it_ends() -> None:
    board = Dashboard(["mac1:5555"])
    board.connected("mac1:5555", "mac1", INFO_OK, now=0.0)
    board.sample("mac1:5555", sample(1000.0, 70), now=1.0)
    board.unreachable("mac1:5555", "connection refused for 1 s", now=30.0)
    board.unreachable("mac1:5555", "connection refused for 1 s", now=35.0)
    assert "unreachable" in text_of(board, 36.0)
    board.connected("mac1:5555", "mac1", INFO_OK, now=40.0)
    assert alerts(board) == [
        (CRITICAL, "unreachable: connection refused for 1 s"),
        (INFO, "reachable again"),
    ]


def test_a_host_that_never_publishes_goes_silent_after_connecting() -> None:
    board = Dashboard(["mac1:5555"])
    board.connected("mac1:5555", "mac1", INFO_OK, now=0.0)
    board.tick(10.0)
    assert board.hosts["mac1:5555"].silent


def test_snapshot_for_scripts() -> None:
    board = Dashboard(["mac1:5555", "gone:5555"])
    board.connected("mac1:5555", "mac1", INFO_OK, now=0.0)
    board.sample("mac1:5555", sample(1000.0, 72.5, "ok", jobs=[job("running")]), now=1.0)
    board.unreachable("gone:5555", "connection refused for 1 s", now=1.0)
    data = snapshot(board, 1001.0)
    up, down = data["hosts"]
    assert up == {
        "host": "mac1:5555",
        "hostname": "mac1",
        "status": "up",
        "reachable": True,
        "error": None,
        "silent": False,
        "time": 1000.0,
        "celsius": 72.5,
        "pressure": None,
        "source": "replay:curve.csv",
        "sensor": "replay",
        "simulated": True,
        "state": "ok",
        "throttling": None,
        "throttle_evidence": None,
        "trend_c_per_min": None,
        "power_w": None,
        "energy_j": None,
        "power_source": None,
        "power_simulated": None,
        "pause_s_total": 0.0,
        "invalid_messages": 0,
        "jobs": [job("running")],
        "policy": POLICY,
        "policy_origin": "defaults for smc",
        "poll_interval": 0.1,
        "age_s": 1.0,
        **dict.fromkeys(CLOCK_COLUMNS),  # an older agent's sample: no clock
    }
    assert down["reachable"] is False and down["error"] == "connection refused for 1 s"
    assert down["status"] == "unreachable"
    assert down["celsius"] is None and down["jobs"] == []
    assert data["alerts"][0]["host"] == "gone:5555"


def test_recorded_samples_seed_the_sparkline_but_are_not_a_current_reading() -> None:
    board = Dashboard(["mac1:5555"])
    board.seed("mac1:5555", [(700.0 + t, 60.0 + t / 10) for t in range(0, 300, 30)])
    view = board.hosts["mac1:5555"]
    assert view.sample is None and view.spark() == []
    assert "connecting" in text_of(board, 0.0)
    board.connected("mac1:5555", "mac1", INFO_OK, now=0.0)
    board.sample("mac1:5555", sample(1000.0, 75.0), now=1.0)
    seeded = [60.0 + t / 10 for t in range(0, 300, 30)]
    assert [v for v in view.spark() if v is not None] == [*seeded, 75.0]


def test_alert_lines_are_shown_in_time_order_whatever_the_arrival() -> None:
    board = Dashboard(["mac1:5555"])
    board.event("mac1:5555", event(200.0, "stop", 95.5))
    board.event("mac1:5555", event(100.0, "pause", 86.0))  # backfilled after the stop
    lines = text_of(board, 300.0).splitlines()
    paused = next(i for i, line in enumerate(lines) if "paused job" in line)
    stopped = next(i for i, line in enumerate(lines) if "stopped job" in line)
    assert paused < stopped


def test_a_host_not_reached_yet_says_connecting_in_json() -> None:
    board = Dashboard(["mac1:5555"])
    (host,) = snapshot(board, 1.0)["hosts"]
    assert host["status"] == "connecting" and host["reachable"] is False and host["error"] is None


def test_cooling_through_a_state_raises_no_alert_entering_it_does() -> None:
    board = Dashboard(["mac1:5555"])
    board.connected("mac1:5555", "mac1", INFO_OK, now=0.0)
    for t, celsius, state in (
        (1000.0, 80.0, "reduce_batch"),
        (1001.0, 96.0, "stop"),
        (1002.0, 90.0, "pause"),  # cooling from stop: passes through pause
        (1003.0, 80.0, "reduce_batch"),
        (1004.0, 86.0, "pause"),  # rising again: entered
    ):
        board.sample("mac1:5555", sample(t, celsius, state), now=t - 999.0)
    assert alerts(board) == [
        (CRITICAL, "reached stop at 96.0 °C"),
        (WARNING, "reached pause at 86.0 °C"),
    ]


def lab() -> Dashboard:
    """Two hosts with a few minutes of samples and a job each, one not reached yet."""
    names = ["127.0.0.1:6110", "mac-studio-2.lab.example:5555", "10.0.0.3:5555"]
    board = Dashboard(names)
    for name in names[:2]:
        board.connected(name, "mac", INFO_OK, now=0.0)
        for i in range(60):
            body = sample(1000.0 + 5 * i, 60.0 + i % 20, "ok", jobs=[job("running")])
            board.sample(name, body, now=float(i))
    board.unreachable(names[2], "cannot resolve host 10.0.0.3", now=60.0)
    return board


def drawn(board: Dashboard, width: int) -> list[str]:
    """The dashboard as a terminal `width` columns wide shows it (Rich's own capture)."""
    console = Console(width=width, record=True, color_system=None)
    console.print(render(board, 400.0, width))
    return console.export_text().splitlines()


@pytest.mark.parametrize("width", [80, 100, 120, 200])
def test_the_dashboard_fits_the_terminal_without_breaking_a_row(width: int) -> None:
    lines = drawn(lab(), width)
    assert all(Text(line).cell_len <= width for line in lines)
    for name in lab().hosts:
        rows = [line for line in lines if name in line and line.startswith("│")]
        assert len(rows) == 1, (name, lines)  # whole, on one line: never broken
    table_rows = [line for line in lines if line.startswith("│")]
    assert len(table_rows) == 3  # no row wrapped onto a second line
    sparks = [re.findall(r"[▁▂▃▄▅▆▇█]+", row) for row in table_rows[:2]]
    assert all(len(found) == 1 for found in sparks), sparks  # one run of blocks, unbroken
    header = next(line for line in lines if line.startswith("┃"))
    assert "host" in header and "SoC °C" in header and "state" in header


def test_a_narrow_terminal_narrows_the_sparkline_then_drops_columns() -> None:
    widths = {name: 10 for name in COLUMNS}
    assert fit_columns(widths, None) == (list(COLUMNS), SPARK_WIDTH)
    everything = sum(widths.values()) - 10 + SPARK_WIDTH + 3 * len(COLUMNS) + 1
    assert fit_columns(widths, everything) == (list(COLUMNS), SPARK_WIDTH)
    shown, spark = fit_columns(widths, everything - 5)
    assert shown == list(COLUMNS) and spark == SPARK_WIDTH - 5
    shown, spark = fit_columns(widths, 80)
    assert shown == ["host", "SoC °C", "GPU GHz", "last 5 min", "state", "jobs"]
    assert MIN_SPARK_WIDTH <= spark < SPARK_WIDTH
    assert fit_columns(widths, 20)[0] == ["host", "SoC °C"]
    header = drawn(lab(), 100)[1:4]
    assert any("last 5 min" in line for line in header)  # never cut to "last 5 …"


def test_a_terminal_too_short_for_every_host_draws_the_rows_that_fit_and_says_so() -> None:
    names = [f"mac{i:02d}:5555" for i in range(40)]
    board = Dashboard(names)
    for name in names:
        board.connected(name, name, INFO_OK, now=100.0)  # one job each: one line a row
    console = Console(width=200, height=20, record=True, color_system=None)
    console.print(render(board, 100.5, 200, console.size.height))
    lines = console.export_text().splitlines()
    shown = [name for name in names if any(name in line for line in lines)]
    assert shown == names[: len(shown)] and 0 < len(shown) < len(names)
    assert len(lines) <= 20
    assert f"{len(names) - len(shown)} more hosts below" in lines[-1]
    assert "more hosts" not in text_of(board, 100.5)  # no height given: every host


def test_an_agents_escape_sequences_and_markup_never_reach_the_terminal() -> None:
    """A hostile agent's source, sensor and pressure (docs: shared/safe_text.py) are shown
    escaped, as text: no ESC, no forged row, no markup parsed, and a source change's alert too."""
    board = Dashboard(["mac1:5555"])
    board.connected("mac1:5555", "mac1", INFO_OK, now=0.0)
    board.sample("mac1:5555", sample(1000.0, 70, source="smc", sensor="TCMz"), now=1.0)
    hostile = sample(1001.0, 70, source="\x1b]0;owned\x07[/]", sensor="x\nmac2 ok")
    board.sample("mac1:5555", {**hostile, "pressure": "\x9b2J"}, now=2.0)
    text = text_of(board, 2.0)
    assert "\x1b" not in text and "\x9b" not in text
    assert "\\x1b]0;owned\\x07[/]" in text and "\\x9b2J" in text
    assert not [line for line in text.splitlines() if line.startswith("mac2")]


def test_throttling_is_shown_beside_the_state_and_the_jobs_work_rate_beside_the_job() -> None:
    """A sample that says the Mac throttles (the throttle rule, docs/thermal.md): the state
    cell says so, the job its rate and verdict, one alert as it starts, and the job's own
    throttling events get a line."""
    board = Dashboard(["mac1:5555"])
    board.connected("mac1:5555", "mac1", INFO_OK, now=0.0)
    work = {"rate": 402.4, "unit": "tok/s", "time": 999.0, "throttling": False,
            "evidence": "402 tok/s of 402"}  # fmt: skip
    running = job("running") | {"work": work}
    board.sample("mac1:5555", sample(1000.0, 70, jobs=[running]) | {"throttling": False}, now=1.0)
    slow = running | {"work": work | {"rate": 312.0, "throttling": True,
                                      "evidence": "312 tok/s of 402"}}  # fmt: skip
    throttled = sample(1001.0, 71, jobs=[slow]) | {
        "throttling": True,
        "throttle_evidence": "job j1: 312 tok/s of 402",
    }
    board.sample("mac1:5555", throttled, now=2.0)
    board.sample("mac1:5555", throttled | {"time": 1002.0}, now=3.0)  # said once
    board.event("mac1:5555", event(1001.0, "throttling", detail="312 tok/s of 402"))
    text = text_of(board, 3.0)
    assert "ok throttling" in text
    assert "run j1 running 312 tok/s throttling" in text
    assert alerts(board) == [
        (WARNING, "throttling: job j1: 312 tok/s of 402"),
        (WARNING, "throttling: job j1 (pid 4242): 312 tok/s of 402"),
    ]
    assert host_snapshot(board.hosts["mac1:5555"], 3.0)["throttle_evidence"] == (
        "job j1: 312 tok/s of 402"
    )


def test_prometheus_throttling_is_one_zero_or_absent() -> None:
    from prometheus_client import generate_latest

    from shared.io.metrics import TelemetryMetrics

    metrics = TelemetryMetrics()

    def exported(throttling: bool | None) -> str:
        metrics.observe_sample(sample(1000.0, 70) | {"throttling": throttling})
        return generate_latest(metrics.registry).decode()

    assert 'mlx_fleet_throttling{host="mac1"} 1.0' in exported(True)
    assert 'mlx_fleet_throttling{host="mac1"} 0.0' in exported(False)
    assert "mlx_fleet_throttling{" not in exported(None)  # no verdict: no number
    exported(True)
    metrics.observe_sample(sample(1001.0, 70))  # an older agent's sample, without the field
    assert "mlx_fleet_throttling{" not in generate_latest(metrics.registry).decode()
