"""Supervision: the event record and log, the local
feed's pacing, and the Supervisor shell in-process with real child processes and real signals
(the reduce_batch state file and its opt-in SIGUSR1). The console script is in test_run_cli.py."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from agent.cooling.events import EventLog, format_line
from agent.cooling.supervise import (
    COOPERATIVE_ENV,
    LaunchError,
    LocalFeed,
    Supervisor,
    group_alive,
    shell_code,
    signal_group,
)
from agent.thermal import ThermalMonitor, ThermalReading
from shared.cooling.policy import ThermalPolicy
from shared.exit_codes import EXIT_NOT_FOUND, EXIT_THERMAL_STOP
from shared.wire.telemetry import Event

POLICY = ThermalPolicy(max_speed_temp=75, pause_temp=85, stop_temp=95)


def reading(celsius: float | None, pressure: str | None = None) -> ThermalReading:
    return ThermalReading(celsius=celsius, source="test", pressure=pressure)


@pytest.mark.parametrize(("returncode", "code"), [(0, 0), (3, 3), (-9, 137), (-15, 143)])
def test_shell_code_reports_a_signal_as_128_plus_n(returncode: int, code: int) -> None:
    assert shell_code(returncode) == code


# --- events -----------------------------------------------------------------------------------


def test_every_event_line_says_when_its_source_is_simulated() -> None:
    event = Event(time.time(), "job1", 42, "pause", "replay:curve.csv", True, 86.0)
    line = format_line(event)
    assert line.startswith("[mlx-fleet] ")
    assert line.endswith("pause at 86.0 °C job job1 pid 42 (replay:curve.csv, simulated)")
    sensor = Event(time.time(), "job1", 42, "exit", "iohid", detail="code 0")
    assert format_line(sensor).endswith("exit job job1 pid 42: code 0 (iohid)")
    script = Event(time.time(), "job1", 42, "start", "sim", True, detail="sh -c 'a\nb'")
    assert format_line(script).endswith("start job job1 pid 42: sh -c 'a\\nb' (sim, simulated)")


def test_event_log_round_trip_in_order_by_job(tmp_path: Path) -> None:
    log = EventLog(tmp_path / "events.sqlite")
    first = Event(100.0, "a", 1, "start", "sim", True, detail="sleep 1")
    second = Event(101.0, "b", 2, "pause", "linux", False, 86.5)
    third = Event(102.0, "a", 1, "stop", "sim", True, 96.0)
    third, first, second = (log.record(event) for event in (third, first, second))
    assert (third.seq, first.seq, second.seq) == (1, 2, 3)  # numbered as recorded
    assert log.since() == [first, second, third]
    assert log.since(101.0) == [second, third]
    assert log.since(job="a") == [first, third]
    assert log.after(1, 0.0, 10) == [first, second]  # a page after a cursor, in number order
    log.close()


# --- the local feed ---------------------------------------------------------------------------


def test_local_feed_samples_on_the_poll_grid_with_its_policy() -> None:
    feed = LocalFeed(ThermalMonitor(poll_interval=0.05, source=lambda: 70.0), POLICY)
    started = time.monotonic()
    samples = [feed.next() for _ in range(5)]
    elapsed = time.monotonic() - started
    feed.close()
    assert all(s is not None and s.reading and s.reading.celsius == 70.0 for s in samples)
    assert all(s is not None and s.policy == POLICY for s in samples)
    assert 0.19 <= elapsed < 1.0  # the first at once, then four intervals
    assert feed.source.startswith("callable:") and feed.simulated is False


def test_closing_the_feed_wakes_a_waiting_next() -> None:
    feed = LocalFeed(ThermalMonitor(poll_interval=30.0, source=lambda: 70.0), POLICY)
    assert feed.next() is not None
    threading.Timer(0.1, feed.close).start()
    started = time.monotonic()
    assert feed.next() is None
    assert time.monotonic() - started < 2.0


# --- the process group ------------------------------------------------------------------------


def test_a_zombie_does_not_keep_a_group_alive() -> None:
    sleeper = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        assert group_alive(sleeper.pid)
        signal_group(sleeper.pid, signal.SIGKILL)
        time.sleep(0.2)  # dead but not reaped: a zombie, still a member of the group
        assert signal_group(sleeper.pid, 0)
        assert not group_alive(sleeper.pid)
    finally:
        sleeper.wait()
    assert not signal_group(sleeper.pid, 0)


# --- the shell, in-process ----------------------------------------------------------------------

# A job that says when it is ready and, when it opted in, records the state file at each SIGUSR1.
JOB = r"""
import json, os, signal, sys, time
def record(*_):
    with open(os.environ["MLX_FLEET_COOLING_STATE"]) as f:
        value = json.load(f)["reduce_batch"]
    with open(sys.argv[1], "a") as out:
        out.write(f"{value}\n")
if os.environ.get("MLX_FLEET_COOPERATIVE") == "1":
    signal.signal(signal.SIGUSR1, record)
open(sys.argv[2], "w").close()
while True:
    time.sleep(0.01)
"""


def after_ready(ready: Path, values: Sequence[float]) -> Callable[[], float]:
    """A source: 60 °C until the job is ready, then one value per read, the last for ever."""
    script = iter(values)

    def read() -> float:
        return next(script, values[-1]) if ready.exists() else 60.0

    return read


def supervise(tmp_path: Path, values: Sequence[float]) -> tuple[int, list[Event], Path]:
    ready, seen = tmp_path / "ready", tmp_path / "seen"
    events: list[Event] = []
    supervisor = Supervisor(
        [sys.executable, "-c", JOB, str(seen), str(ready)], grace=2.0, sinks=[events.append]
    )
    feed = LocalFeed(ThermalMonitor(poll_interval=0.05, source=after_ready(ready, values)), POLICY)
    before = signal.getsignal(signal.SIGTERM)
    code = supervisor.run(feed)
    assert signal.getsignal(signal.SIGTERM) is before
    assert not supervisor.state_file.exists()
    return code, events, seen


REDUCE_THEN_RESTORE_THEN_STOP = [80.0] * 4 + [60.0] * 4 + [96.0]


def test_a_cooperative_job_gets_sigusr1_and_reads_reduce_batch_from_the_state_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(COOPERATIVE_ENV, "1")
    code, events, seen = supervise(tmp_path, REDUCE_THEN_RESTORE_THEN_STOP)
    assert code == EXIT_THERMAL_STOP
    assert seen.read_text().split() == ["True", "False"]
    actions = [event.action for event in events]
    assert actions == ["start", "reduce_batch", "restore_batch", "pause", "stop", "summary", "exit"]
    assert events[1].celsius == 80.0 and events[3].celsius == events[4].celsius == 96.0


def test_a_job_that_did_not_opt_in_gets_no_signal_that_would_kill_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(COOPERATIVE_ENV, raising=False)
    code, events, seen = supervise(tmp_path, REDUCE_THEN_RESTORE_THEN_STOP)
    assert code == EXIT_THERMAL_STOP  # SIGUSR1 would have killed it first: 138
    assert not seen.exists()
    assert [event.action for event in events][1:3] == ["reduce_batch", "restore_batch"]


def launch_a_missing_command() -> tuple[Supervisor, LocalFeed, LaunchError]:
    supervisor = Supervisor(["no-such-command-mlx-fleet"])
    feed = LocalFeed(ThermalMonitor(poll_interval=0.05, source=lambda: 60.0), POLICY)
    with pytest.raises(LaunchError, match="no-such-command-mlx-fleet") as excinfo:
        supervisor.run(feed)
    return supervisor, feed, excinfo.value


def test_a_missing_command_is_a_launch_error_with_code_127() -> None:
    _, _, error = launch_a_missing_command()
    assert error.code == EXIT_NOT_FOUND


def test_a_missing_command_leaves_nothing() -> None:
    supervisor, feed, _ = launch_a_missing_command()
    assert feed.next() is None  # closed
    assert not supervisor.state_file.exists()


def test_the_job_sees_its_id_and_the_state_file_while_it_runs(tmp_path: Path) -> None:
    out = tmp_path / "env.json"
    script = (
        "import json, os, sys; "
        "state = json.load(open(os.environ['MLX_FLEET_COOLING_STATE'])); "
        "json.dump({'job': os.environ['MLX_FLEET_JOB'], 'state': state}, open(sys.argv[1], 'w'))"
    )
    supervisor = Supervisor([sys.executable, "-c", script, str(out)], job="job-42")
    feed = LocalFeed(ThermalMonitor(poll_interval=0.05, source=lambda: 60.0), POLICY)
    assert supervisor.run(feed) == 0
    seen = json.loads(out.read_text())
    assert seen["job"] == "job-42"
    assert seen["state"]["job"] == "job-42" and seen["state"]["reduce_batch"] is False
