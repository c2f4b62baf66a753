"""`coordinator monitor` against real agents (replayed curves at a 0.1 s poll, CURVE, real SUB
sockets, the real console script and SQLite): the --once snapshot, an unreachable host, backfill
after a late connect, what is recorded, `coordinator history` on that record, and a host that
dies and comes back on the same port (with a new telemetry port, learned again)."""

from __future__ import annotations

import json
import os
import signal
import socket
import sqlite3
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from agent.cooling.events import EventLog
from coordinator.hosts.keys import add_host_key
from coordinator.hosts.link import Settings, Target
from coordinator.telemetry.dashboard import UNREACHABLE, UP
from coordinator.telemetry.monitor import Monitor
from coordinator.telemetry.store import TelemetryStore
from shared.io.keys import own_keypair
from shared.wire.telemetry import Event
from tests.conftest import console_script, subprocess_env
from tests.fleet_support import AgentPool, AgentProcess, cli, trusted_agent

pytestmark = pytest.mark.timeout(90)
POLL = ["--poll-interval", "0.1"]


def known_agent(
    agents: AgentPool, name: str, celsius: float, tmp_path: Path, options: tuple[str, ...] = ()
) -> AgentProcess:
    """An agent replaying a flat curve at `celsius`, trusting this test's coordinator, whose
    key the coordinator knows (what `agent keys trust` / `coordinator keys add` do)."""
    curve = tmp_path / f"{name}.csv"
    curve.write_text(f"seconds,celsius\n0,{celsius}\n3600,{celsius}\n")
    agent = trusted_agent(agents, name, thermal=f"replay:{curve}", options=[*POLL, *options])
    add_host_key(agent.address, agent.key)
    return agent


@pytest.fixture
def supervised() -> Iterator[list[subprocess.Popen[str]]]:
    """`agent run` processes a test starts; their groups are killed after it."""
    started: list[subprocess.Popen[str]] = []
    yield started
    for process in started:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)


def run_job(supervised: list[subprocess.Popen[str]], agent: AgentProcess) -> None:
    """`agent run -- sleep 60` on the agent's machine: registered with it, so its telemetry
    lists the job, paused when the agent's curve is at or above pause."""
    process = subprocess.Popen(
        [console_script("agent"), "run", "--", "sleep", "60"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env=subprocess_env(MLX_FLEET_HOME=str(agent.home)),
    )
    supervised.append(process)


def monitor_once(*hosts: str, timeout: float = 5.0) -> subprocess.CompletedProcess[str]:
    return cli(
        "coordinator",
        "monitor",
        "--hosts",
        ",".join(hosts),
        "--once",
        "--format",
        "json",
        "--connect-timeout",
        str(timeout),
    )


def wait_for_job_state(agent: AgentProcess, state: str) -> None:
    """Until the agent's telemetry shows a job in `state` (as the monitor itself sees it)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        result = monitor_once(agent.address)
        hosts = json.loads(result.stdout)["hosts"] if result.stdout else []
        if hosts and [job["state"] for job in hosts[0]["jobs"]] == [state]:
            return
        time.sleep(0.2)
    raise AssertionError(f"no {state} job on {agent.address}:\n{agent.log_text()}")


@pytest.mark.slow
def test_once_json_gives_every_hosts_reading_source_state_and_jobs(
    agents: AgentPool, supervised: list[subprocess.Popen[str]], tmp_path: Path
) -> None:
    hot = known_agent(agents, "hot", 88.0, tmp_path)
    cool = known_agent(agents, "cool", 60.0, tmp_path)
    run_job(supervised, hot)
    wait_for_job_state(hot, "paused")
    result = monitor_once(hot.address, cool.address)
    assert result.returncode == 0, result.stderr
    rows = {row["host"]: row for row in json.loads(result.stdout)["hosts"]}
    assert list(rows) == [hot.address, cool.address]
    for agent, celsius, state in ((hot, 88.0, "pause"), (cool, 60.0, "ok")):
        row = rows[agent.address]
        assert row["reachable"] and not row["silent"] and row["error"] is None
        assert row["celsius"] == celsius and row["state"] == state
        assert row["source"] == f"replay:{tmp_path / agent.home.name}.csv"
        assert row["sensor"] == "replay"  # the replay source's sensor: labelled as a replay
        assert row["simulated"] is True and row["poll_interval"] == 0.1
        assert row["policy"]["pause_temp"] == 85.0 and 0 <= row["age_s"] < 2
    (job,) = rows[hot.address]["jobs"]
    assert job["kind"] == "run" and job["state"] == "paused" and "sleep 60" in job["command"]
    assert rows[cool.address]["jobs"] == []
    with TelemetryStore() as store:  # the monitor recorded what it heard, events included
        samples = store.samples(0)
        assert {s["celsius"] for s in samples[hot.address]} == {88.0}
        assert {s["sensor"] for s in samples[hot.address]} == {"replay"}
        assert {s["state"] for s in samples[cool.address]} == {"ok"}
        actions = [e["action"] for e in store.events(0)[hot.address]]
        assert actions[:2] == ["start", "pause"]
        assert set(store.policies()) == {hot.address, cool.address}
    table = cli("coordinator", "monitor", "--hosts", hot.address, "--once")
    assert table.returncode == 0, table.stderr
    row = next(line for line in table.stdout.splitlines() if hot.address in line)
    for part in ("88.0 sim", "pause", "run ", "paused"):
        assert part in row, (part, row)
    recorded = cli("coordinator", "history", "--hosts", hot.address, "--format", "json")
    (read_from,) = json.loads(recorded.stdout)["hosts"][0]["read_from"]
    assert (read_from["source"], read_from["sensor"]) == (rows[hot.address]["source"], "replay")


@pytest.mark.slow
def test_an_unreachable_host_is_reported_within_the_connect_timeout(
    agents: AgentPool, tmp_path: Path
) -> None:
    live, gone = (
        known_agent(agents, "live", 60.0, tmp_path),
        known_agent(agents, "gone", 60.0, tmp_path),
    )
    gone.kill()
    began = time.monotonic()
    result = monitor_once(live.address, gone.address, timeout=1.0)
    assert time.monotonic() - began < 15
    assert result.returncode == 1
    rows = {row["host"]: row for row in json.loads(result.stdout)["hosts"]}
    assert rows[live.address]["reachable"] and rows[live.address]["celsius"] == 60.0
    down = rows[gone.address]
    assert not down["reachable"] and "connection refused" in down["error"]
    assert down["celsius"] is None and down["jobs"] == []


@pytest.mark.slow
def test_a_late_monitor_backfills_what_it_missed_and_history_reads_it(
    agents: AgentPool, supervised: list[subprocess.Popen[str]], tmp_path: Path
) -> None:
    agent = known_agent(agents, "mac1", 88.0, tmp_path)
    run_job(supervised, agent)
    time.sleep(2.0)  # twenty samples and the job's pause go by with nobody listening
    connected = time.time()
    result = monitor_once(agent.address)
    assert result.returncode == 0, result.stderr
    with TelemetryStore() as store:
        times = [s["time"] for s in store.samples(0)[agent.address]]
        events = store.events(0)[agent.address]
    before = [t for t in times if t < connected]
    assert len(before) >= 15, len(before)
    assert times == sorted(set(times))
    assert [e["action"] for e in events if e["time"] < connected][:2] == ["start", "pause"]
    history = cli("coordinator", "history", "--since", "5m", "--format", "json")
    (row,) = json.loads(history.stdout)["hosts"]
    assert row["host"] == agent.address and row["samples"] == len(times)
    assert row["min_c"] == row["max_c"] == 88.0 and row["pauses"] == 1
    assert row["seconds_above"]["pause_temp"] > 1.5
    assert row["seconds_above"]["stop_temp"] == 0.0 and row["seconds_paused"] > 1.0
    out = tmp_path / "out.png"
    plot = cli("coordinator", "history", "--since", "5m", "--plot", str(out))
    assert plot.returncode == 0, plot.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.slow
def test_a_host_that_dies_and_returns_is_reconnected_and_recorded_again(
    agents: AgentPool, tmp_path: Path
) -> None:
    port = free_port()
    fixed = ("--bind", f"127.0.0.1:{port}", "--telemetry-port", "0")  # the last --bind wins
    agent = known_agent(agents, "mac1", 70.0, tmp_path, fixed)
    with (
        TelemetryStore() as store,
        Monitor(
            [Target(agent.address, agent.address, agent.key)], Settings(own_keypair(), 1.0), store
        ) as running,
    ):
        view = running.board.hosts[agent.address]

        def until(condition: str, check: Callable[[], bool]) -> None:
            deadline = time.monotonic() + 30
            while not check():
                assert time.monotonic() < deadline, f"never {condition}: {running.board.alerts}"
                running.step(0.1)

        until("live", lambda: view.status == UP and view.live)
        agent.kill()
        until("unreachable", lambda: view.status == UNREACHABLE)
        died = time.time()
        # the same home (so the same key and trust), the same command port, a new PUB port
        back = known_agent(agents, "mac1", 75.0, tmp_path, fixed)
        assert back.address == agent.address
        until("back", lambda: view.status == UP and view.live and view.sample["celsius"] == 75.0)
        texts = [alert.text for alert in running.board.alerts]
        assert texts[0].startswith("silent") and "reachable again" in texts
        assert any(text.startswith("unreachable") for text in texts)
        recorded = store.samples(died)[agent.address]
        assert recorded and {s["celsius"] for s in recorded} == {75.0}


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM])
@pytest.mark.slow
def test_json_lines_until_ctrl_c_or_sigterm(
    agents: AgentPool, tmp_path: Path, stop: signal.Signals
) -> None:
    agent = known_agent(agents, "mac1", 72.0, tmp_path)
    process = subprocess.Popen(
        [console_script("coordinator"), "monitor", "--hosts", agent.address, "--format", "json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=subprocess_env(),
    )
    try:
        assert process.stdout is not None
        lines = [json.loads(process.stdout.readline())]
        while lines[-1]["hosts"][0]["celsius"] is None and len(lines) < 20:
            lines.append(json.loads(process.stdout.readline()))
        lines.append(json.loads(process.stdout.readline()))
        process.send_signal(stop)
        _, err = process.communicate(timeout=15)
    finally:
        process.kill()
    assert process.returncode == (130 if stop == signal.SIGINT else 143), err  # README
    assert lines[-1]["hosts"][0]["celsius"] == 72.0 and lines[-1]["hosts"][0]["reachable"]
    assert [line["time"] for line in lines] == sorted({line["time"] for line in lines})


def late_event(agent: AgentProcess, at: float) -> int:
    """Record an `agent run` job's start in the agent's event log as `agent run` itself does,
    stamped `at` (before samples the coordinator already holds): an event delivered late.
    Returns its number."""
    log = EventLog(agent.home / "agent-events.sqlite")
    try:
        event = Event(time=at, job="late", pid=4242, action="start", source="none", detail="sleep")
        seq = log.record(event).seq
    finally:
        log.close()
    assert seq is not None
    return seq


def recorded_jobs(address: str) -> list[str | None]:
    with TelemetryStore() as store:
        return [e["job"] for e in store.events(0).get(address, [])]


@pytest.mark.slow
def test_an_event_stamped_before_the_newest_recorded_sample_is_still_backfilled(
    agents: AgentPool, tmp_path: Path
) -> None:
    """The backfill follows the agent's numbers, not the clock: an event stamped earlier than
    samples the coordinator already recorded, but recorded by the agent after them, reaches
    the coordinator's record, at its next connect and, while it watches, at the next live event
    (whose number shows the gap)."""
    agent = known_agent(agents, "mac1", 70.0, tmp_path)
    first = monitor_once(agent.address)
    assert first.returncode == 0, first.stderr
    with TelemetryStore() as store:
        newest = max(s["time"] for s in store.samples(0)[agent.address])
    late_event(agent, newest - 5.0)
    again = monitor_once(agent.address)
    assert again.returncode == 0, again.stderr
    assert recorded_jobs(agent.address) == ["late"]

    target = Target(agent.address, agent.address, agent.key)
    with (
        TelemetryStore() as store,
        Monitor([target], Settings(own_keypair(), 5.0), store) as running,
    ):
        view = running.board.hosts[agent.address]
        deadline = time.monotonic() + 30
        while not view.live:
            assert time.monotonic() < deadline, running.board.alerts
            running.step(0.1)
        late_event(agent, newest - 4.0)
        policy = cli("coordinator", "policy", "--hosts", agent.address, "--pause-temp", "84")
        assert policy.returncode == 0, policy.stderr  # a live `policy` event, numbered after it
        deadline = time.monotonic() + 30
        while recorded_jobs(agent.address) != ["late", "late", None]:
            assert time.monotonic() < deadline, recorded_jobs(agent.address)
            running.step(0.1)


def test_the_monitor_prunes_past_the_retention_while_it_runs(tmp_path: Path) -> None:
    from coordinator.telemetry.monitor import PRUNE_EVERY_S, Arrivals
    from tests.test_history_stats import sample

    now = time.time()
    host = f"127.0.0.1:{free_port()}"  # nobody listens: the link only retries
    with TelemetryStore() as store:
        store.add([(host, sample(now - 3500, 60.0)), (host, sample(now - 4000, 60.0))])
        with Monitor([Target(host, host, None)], Settings(None, 1.0), store, None, 3600.0) as mon:
            assert [s["time"] for s in store.samples(0)[host]] == [now - 3500]  # at start
            mon.apply(Arrivals(), now + PRUNE_EVERY_S / 2)
            assert len(store.samples(0)[host]) == 1  # not due yet
            mon.apply(Arrivals(), now + PRUNE_EVERY_S + 1)  # due: the retention has passed it
            assert host not in store.samples(0)


def test_an_error_applying_a_new_session_ends_the_monitor_with_it_not_a_hang(
    agents: AgentPool, tmp_path: Path
) -> None:
    """The store refuses writes (SQLite's own read-only switch, as a full disk would) when the
    first session's report is applied: the error reaches the caller and close() still ends,
    closing the SUB that report carried (ZeroMQ's term would wait for it for ever)."""
    agent = known_agent(agents, "mac1", 60.0, tmp_path)
    target = Target(agent.address, agent.address, agent.key)
    with TelemetryStore() as store:
        store.conn.execute("PRAGMA query_only = 1")
        with (
            pytest.raises(sqlite3.OperationalError, match="readonly"),
            Monitor([target], Settings(own_keypair(), 5.0), store) as running,
        ):
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                running.step(0.5)


@pytest.mark.slow
def test_a_plants_simulated_clock_reaches_the_monitor_history_and_their_labels(
    agents: AgentPool, tmp_path: Path
) -> None:
    """An agent on the thermal plant: its clock (the plant's own, agent.clocks.registry) in
    every sample, shown `sim` by `monitor --once` and `history`, simulated in their JSON."""
    agent = trusted_agent(agents, "plant", thermal="sim:plant:air", options=POLL)
    add_host_key(agent.address, agent.key)
    result = monitor_once(agent.address)
    assert result.returncode == 0, result.stderr
    (row,) = json.loads(result.stdout)["hosts"]
    assert row["gpu_hz"] > 0 and 0 <= row["gpu_active"] <= 1
    assert row["clock_simulated"] is True and row["clock_source"].startswith("plant")
    assert "simulated" in row["clock_note"]
    table = cli("coordinator", "monitor", "--hosts", agent.address, "--once")
    assert "GPU GHz" in table.stdout and " sim" in table.stdout, table.stdout
    recorded = json.loads(
        cli("coordinator", "history", "--hosts", agent.address, "--format", "json").stdout
    )["hosts"][0]
    assert recorded["gpu_max_hz"] == pytest.approx(row["gpu_hz"], rel=0.5)
    assert recorded["clock_simulated"] is True
