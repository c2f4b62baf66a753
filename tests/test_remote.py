"""Local jobs on one sensor reader: `agent run` registered with a real `agent serve` (its readings,
its policy, its listing and publishing; a fallback to its own sensor once the daemon is
SIGKILLed), and a CoolingScheduler over a RemoteMonitor driven by the daemon's replayed curve and
pushed policies. Real processes, real sockets, real signals."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
import zmq

from agent import RemoteMonitor
from agent.cooling import CoolingScheduler, ThermalShutdownError
from agent.daemon_address import STATE_FILE
from shared.cooling.policy import ThermalPolicy
from shared.exit_codes import EXIT_THERMAL_STOP
from shared.wire import protocol as p
from tests.conftest import subprocess_env
from tests.fleet_support import (
    AgentPool,
    AgentProcess,
    connect,
    exchange_keys,
    receive,
    subscriber,
    trusted_agent,
)
from tests.test_monitor import monitor_once
from tests.test_run_cli import (
    events,
    group_members,
    heartbeat_args,
    state,
    wait_for_pid,
    write_curve,
)

pytestmark = pytest.mark.timeout(90)


def wait_until(condition: Callable[[], object], timeout: float = 10.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what or condition}"
        time.sleep(0.01)


def is_event(action: str) -> Callable[[p.Message], bool]:
    return lambda m: m.type == "telemetry.event" and m.body["action"] == action


@pytest.mark.slow
def test_agent_run_uses_the_daemons_readings_and_policy_and_goes_on_alone_when_it_dies(
    ctx: zmq.Context, agents: AgentPool, agent_cli: str, tmp_path: Path
) -> None:
    agent = trusted_agent(
        agents,
        thermal=write_curve(tmp_path / "cool.csv", [(0, 60.0)]),
        options=["--poll-interval", "0.1"],
    )
    sub = subscriber(ctx, agent)
    receive(sub, lambda m: m.type == "telemetry.sample")
    # agent run's own source would pause at once: it is opened only if the daemon goes away
    own = write_curve(tmp_path / "hot.csv", [(0, 90.0), (1.0, 97.0)])
    pidfile, beats = tmp_path / "pid", tmp_path / "beats"
    run = subprocess.Popen(
        [agent_cli, "run", *heartbeat_args(own, pidfile, beats)],
        stderr=subprocess.PIPE,
        text=True,
        env=subprocess_env(MLX_FLEET_HOME=str(agent.home)),
    )
    try:
        pid = wait_for_pid(pidfile, run)
        started = receive(sub, is_event("start"))
        job = started.body["job"]
        assert started.body["pid"] == pid and "-c" in started.body["detail"]
        client = connect(ctx, agent)
        listed = client.request("info")["jobs"]
        for entry in listed:  # its work rate, once a poll read agent run's state (§10): no rate
            assert entry.pop("work", {"rate": None})["rate"] is None  # the heartbeat states none
        assert listed == [
            {
                "job": job,
                "pid": pid,
                "command": started.body["detail"],
                "state": "running",
                "kind": "run",
            }
        ]
        time.sleep(0.5)
        assert state(pid) != psutil.STATUS_STOPPED, "paused on a reading not the daemon's"

        client.request("policy.set", {"policy": {"max_speed_temp": 50, "pause_temp": 55}})
        assert receive(sub, is_event("pause")).body["job"] == job
        wait_until(lambda: state(pid) == psutil.STATUS_STOPPED, what="SIGSTOP")
        client.request("policy.set", {"policy": {"max_speed_temp": 75, "pause_temp": 85}})
        assert receive(sub, is_event("resume")).body["celsius"] == 60.0
        sample = receive(
            sub, lambda m: m.type == "telemetry.sample" and m.body["jobs"][0]["state"] == "running"
        )
        assert sample.body["pause_s_total"] > 0
        stored = client.request("history.get", {"samples_after": 0, "events_after": 0})["events"]
        assert [e["action"] for e in stored if e["job"] == job] == ["start", "pause", "resume"]
        client.close()

        agent.kill()  # SIGKILL: no goodbye
        _, stderr = run.communicate(timeout=20)
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode == EXIT_THERMAL_STOP, stderr
    assert "registered with agent serve" in stderr
    mine = [e for e in events(agent.home) if e.job == job]
    assert [e.action for e in mine] == [
        "start",
        "pause",
        "resume",
        "fallback",
        "pause",
        "stop",
        "summary",
        "exit",
    ]
    fallback = mine[3]
    assert "is gone" in (fallback.detail or "") and own in (fallback.detail or "")
    assert all(e.source == own for e in mine[3:]) and mine[4].celsius == 90.0
    assert group_members(pid) == []


@pytest.mark.slow
def test_a_cooling_scheduler_on_a_remote_monitor_follows_the_daemon(
    ctx: zmq.Context, agents: AgentPool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The daemon replays a curve rising 1 °C/s from 60 °C; pushed policies put the scheduler in
    reduce, then pause, then stop, relative to the temperature at the time."""
    rising = write_curve(tmp_path / "rising.csv", [(i / 20, 60 + i / 20) for i in range(1200)])
    agent = trusted_agent(agents, thermal=rising, options=["--poll-interval", "0.1"])
    client = connect(ctx, agent)
    fallback = write_curve(tmp_path / "fallback.csv", [(0, 42.0)])
    monkeypatch.setenv("MLX_FLEET_HOME", str(agent.home))  # a process of the agent's user
    monitor = RemoteMonitor(source=fallback)
    try:
        assert monitor.remote and monitor.source.name == rising and monitor.poll_interval == 0.1
        monitor.start()
        assert monitor.temperature is not None  # start() took the daemon's latest reading
        scheduler = CoolingScheduler(monitor)
        wait_until(lambda: len(monitor.get_history()) >= 6, what="samples")
        assert monitor.is_rising() and monitor.reading is not None
        assert monitor.reading.simulated and monitor.get_soc_temperature() is not None
        assert scheduler.policy == ThermalPolicy() and not scheduler.should_reduce_batch()

        def push(**changes: float) -> None:
            client.request("policy.set", {"policy": changes})
            wait_until(
                lambda: all(getattr(monitor.policy, k) == v for k, v in changes.items()),
                what=f"policy {changes}",
            )

        celsius = monitor.temperature or 0.0
        push(
            max_speed_temp=celsius - 5,
            pause_temp=celsius + 50,
            stop_temp=celsius + 60,
            pause_duration=0.1,
        )
        assert scheduler.should_reduce_batch() and scheduler.policy is monitor.policy
        scheduler.check_before_step(0)  # reduce_batch never waits

        push(pause_temp=(monitor.temperature or 0.0) - 2)
        outcome: list[BaseException] = []
        stepping = threading.Thread(target=lambda: outcome.extend(_step(scheduler, 1)))
        stepping.start()
        time.sleep(0.5)
        assert stepping.is_alive() and not outcome, "did not pause"
        push(stop_temp=(monitor.temperature or 0.0) - 1)
        stepping.join(timeout=10)
        assert len(outcome) == 1 and isinstance(outcome[0], ThermalShutdownError)
        assert scheduler.total_pause_time >= 0.4 and scheduler.pauses[0].step == 1

        agent.kill()  # the monitor goes on with its own source and the daemon's last policy
        wait_until(lambda: not monitor.remote, what="the fallback")
        wait_until(lambda: monitor.temperature == 42.0, what="a local reading")
        assert monitor.source.name == fallback and monitor.policy is not None
        assert scheduler.policy.stop_temp == monitor.policy.stop_temp != 95.0
    finally:
        monitor.close()
        client.close()


def _step(scheduler: CoolingScheduler, step: int) -> list[BaseException]:
    try:
        scheduler.check_before_step(step)
    except ThermalShutdownError as exc:
        return [exc]
    return []


def test_without_a_daemon_a_remote_monitor_reads_the_sensor_itself(
    fleet_home: Path, tmp_path: Path
) -> None:
    """No daemon at all, then only the state file of a dead one: a plain local monitor."""
    source = write_curve(tmp_path / "curve.csv", [(0, 71.0)])
    gone = psutil.Popen(["true"])
    gone.wait()
    fleet_home.mkdir(parents=True, exist_ok=True)
    (fleet_home / STATE_FILE).write_text(
        json.dumps(
            {
                "pid": gone.pid,
                "endpoint": "127.0.0.1:9",
                "telemetry": "127.0.0.1:10",
                "public_key": None,
            }
        )
    )
    began = time.monotonic()
    monitor = RemoteMonitor(poll_interval=0.1, source=source)
    with monitor:
        assert time.monotonic() - began < 1.0, "waited for a dead daemon"
        assert not monitor.remote and monitor.policy is None
        monitor.start()
        assert monitor.temperature == 71.0 and monitor.source.name == source
        assert CoolingScheduler(monitor).policy == ThermalPolicy()


def monitored_jobs(agent: AgentProcess) -> list[dict[str, object]]:
    """The jobs `coordinator monitor --once --format json` shows on `agent`."""
    result = monitor_once(agent.address)
    hosts = json.loads(result.stdout)["hosts"] if result.stdout else []
    return list(hosts[0]["jobs"]) if hosts else []


@pytest.mark.slow
def test_agent_run_shows_up_again_under_a_restarted_daemon(
    ctx: zmq.Context, agents: AgentPool, agent_cli: str, tmp_path: Path
) -> None:
    """The daemon is SIGKILLed: agent run supervises with its own source, then joins the new
    daemon on the same data directory, which lists the job again (as the monitor shows it)."""
    agent = agents.start("agent", options=["--poll-interval", "0.1"])
    exchange_keys(agent)
    run = subprocess.Popen(
        [agent_cli, "run", "--thermal-source", "none", "--grace", "1", "--", "sleep", "300"],
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env=subprocess_env(MLX_FLEET_HOME=str(agent.home)),
    )
    try:
        wait_until(lambda: monitored_jobs(agent), timeout=30, what="the job in the monitor")
        (job,) = monitored_jobs(agent)
        agent.kill()
        again = agents.start("agent", options=["--poll-interval", "0.1"])
        exchange_keys(again)
        restarted = time.monotonic()
        wait_until(lambda: monitored_jobs(again), timeout=60, what="the job under the new daemon")
        print(f"listed again {time.monotonic() - restarted:.1f} s after the restart")
        (listed,) = monitored_jobs(again)
        assert (listed["job"], listed["pid"], listed["state"]) == (
            job["job"],
            job["pid"],
            "running",
        )
        run.send_signal(signal.SIGTERM)
        _, stderr = run.communicate(timeout=30)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
    mine = [e.action for e in events(agent.home) if e.job == job["job"]]
    assert mine[:3] == ["start", "fallback", "rejoin"], mine
    assert re.search(r" rejoin job \S+ pid \d+: agent serve \(pid \d+\) answers", stderr)


@pytest.mark.slow
def test_agent_run_started_before_its_daemon_joins_it(
    agents: AgentPool, agent_cli: str, tmp_path: Path
) -> None:
    home = agents.root / "agent"
    home.mkdir(parents=True)
    run = subprocess.Popen(
        [agent_cli, "run", "--thermal-source", "none", "--grace", "1", "--", "sleep", "300"],
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env=subprocess_env(MLX_FLEET_HOME=str(home)),
    )
    try:
        wait_until(lambda: [e for e in events(home) if e.action == "start"], timeout=30)
        agent = agents.start("agent", options=["--poll-interval", "0.1"])
        exchange_keys(agent)
        wait_until(lambda: monitored_jobs(agent), timeout=60, what="the job under the daemon")
        assert monitored_jobs(agent)[0]["pid"] == run_child_pid(run)
    finally:
        os.killpg(run.pid, signal.SIGKILL)
        run.wait(timeout=10)


def run_child_pid(run: subprocess.Popen[str]) -> int:
    (cmd,) = [c for c in psutil.Process(run.pid).children() if c.cmdline()[0] == "sleep"]
    return cmd.pid
