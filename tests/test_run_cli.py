"""`agent run` through the console script: real commands, real signals, a replayed curve.

No daemon and no coordinator runs in any of these tests: every one is the self-supervising agent.
Reaction is measured from the replay's own clock: `agent run` records its start event before it
opens the replay, so start + row time is never later than the real crossing, and a measured
latency is never shorter than the real one. Process states are read the way /proc/PID/stat says
them (psutil: "stopped" is state T).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import psutil
import pytest

from agent.cooling.events import EventLog
from shared.cooling.policy import HOT_POLLS_TO_STOP
from shared.exit_codes import EXIT_THERMAL_STOP
from shared.wire.telemetry import Event

POLL_S = 0.1
# The Done-when bound is poll interval + 100 ms. This slow shared 2-core machine gets this much
# more for scheduling noise (the watcher, agent run and CMD compete for the cores).
SLACK_S = 0.1
BOUND_S = POLL_S + 0.1 + SLACK_S

# Writes its pid, then the time of every beat, 50 a second, until it is killed.
HEARTBEAT = r"""
import os, sys, time
open(sys.argv[1] + ".tmp", "w").write(str(os.getpid()))
os.replace(sys.argv[1] + ".tmp", sys.argv[1])
with open(sys.argv[2], "a", buffering=1) as beats:
    while True:
        beats.write(f"{time.time()}\n")
        time.sleep(0.02)
"""


def run_args(source: str, *command: str, grace: str = "") -> list[str]:
    """`agent run`'s arguments: `command` under thermal source `source`, read every POLL_S,
    with `--grace` where one is given."""
    graced = ["--grace", grace] if grace else []
    return ["--thermal-source", source, "--poll-interval", str(POLL_S), *graced, "--", *command]


def heartbeat_args(source: str, pidfile: Path, beats: Path) -> list[str]:
    """`agent run`'s arguments for the HEARTBEAT job (its pid to `pidfile`, its beats to
    `beats`) under thermal source `source`."""
    return run_args(source, sys.executable, "-c", HEARTBEAT, str(pidfile), str(beats))


def write_curve(path: Path, rows: Sequence[tuple[float, float]]) -> str:
    path.write_text("seconds,celsius\n" + "".join(f"{t},{c}\n" for t, c in rows))
    return f"replay:{path}"


Start = Callable[..., "subprocess.Popen[str]"]


@pytest.fixture
def agent_run(agent_cli: str) -> Iterator[Start]:
    """Starts `agent run ARGS` (after `prefix`, if any). One that a failed test left running gets
    SIGTERM (forwarded to its group) and then a second one (SIGKILL to the group at once), so a
    failure never leaves a paused group behind."""
    started: list[subprocess.Popen[str]] = []

    def start(*args: str, prefix: Sequence[str] = ()) -> subprocess.Popen[str]:
        agent = subprocess.Popen(
            [*prefix, agent_cli, "run", *args], stderr=subprocess.PIPE, text=True
        )
        started.append(agent)
        return agent

    yield start
    for agent in started:
        if agent.returncode is not None:  # the test saw it finish
            continue
        for _ in range(2):
            if agent.poll() is None:
                agent.terminate()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    agent.wait(timeout=2)
        agent.communicate(timeout=10)


def finish(agent: subprocess.Popen[str], timeout: float = 60.0) -> tuple[int, str]:
    """agent run's exit code and stderr once it ends; one still running after `timeout` is
    killed and the test fails with what it had said (which step of its way out it reached)."""
    try:
        _, stderr = agent.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        agent.kill()
        _, stderr = agent.communicate()
        raise AssertionError(f"agent run still running after {timeout:g} s:\n{stderr}") from None
    return agent.returncode, stderr


def wait_for_pid(path: Path, agent: subprocess.Popen[str], timeout: float = 10.0) -> int:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert agent.poll() is None, f"agent run ended early: {agent.communicate()[1]}"
        assert time.monotonic() < deadline, "CMD never started"
        time.sleep(0.005)
    return int(path.read_text())


def state(pid: int) -> str | None:
    """The process state (psutil names), None once it is gone or a zombie."""
    try:
        status = psutil.Process(pid).status()
    except psutil.NoSuchProcess:
        return None
    return None if status == psutil.STATUS_ZOMBIE else status


Sample = tuple[float, float, "str | None"]  # (time before the read, time after it, the state)


def watch(pid: int, timeout: float = 15.0) -> list[Sample]:
    """The process state every 2 ms until the process is gone; each read bracketed by its times."""
    samples: list[Sample] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        before = time.time()
        current = state(pid)
        samples.append((before, time.time(), current))
        if current is None:
            return samples
        time.sleep(0.002)
    raise AssertionError(f"pid {pid} still there after {timeout} s")


def first(samples: list[Sample], after: float, stopped: bool) -> int:
    """The index of the first read after `after` that saw the process stopped (stopped=False:
    not stopped)."""
    for index, (before, _, current) in enumerate(samples):
        if before >= after and (current == psutil.STATUS_STOPPED) == stopped:
            return index
    raise AssertionError(f"never {'stopped' if stopped else 'running'} after {after}")


def group_members(pgid: int, born_before: float | None = None) -> list[int]:
    """Live (non-zombie) processes in the group, found independently of agent.cooling.supervise;
    with `born_before` (a time.time()), only those started before it: once the group is gone
    its number may be a new group's (pids wrap, at 32768 on Linux by default, within minutes
    when tests run in parallel)."""
    members = []
    for proc in psutil.process_iter(["status", "create_time"]):
        try:
            if os.getpgid(proc.pid) != pgid or proc.info["status"] == psutil.STATUS_ZOMBIE:
                continue
        except ProcessLookupError:
            continue
        if born_before is None or proc.info["create_time"] < born_before:
            members.append(proc.pid)
    return members


def events(home: Path) -> list[Event]:
    log = EventLog(home / "agent-events.sqlite")
    try:
        return log.since()
    finally:
        log.close()


@pytest.mark.slow
def test_pause_resume_and_stop_follow_a_replayed_curve_within_the_poll_interval(
    agent_run: Start, fleet_home: Path, tmp_path: Path
) -> None:
    """Done when: stopped (T) within poll + 100 ms of the pause crossing, running again after the
    fall, stopped again at the stop crossing and gone once it has lasted HOT_POLLS_TO_STOP polls;
    exit code = the thermal-stop code."""
    # The sampler ticks every 0.1 s from about when the replay opens: 10 ms past a tick is close
    # to the worst phase, where a crossing waits almost a whole interval for its sample.
    pause_at, resume_at, stop_at = 0.81, 1.61, 2.41
    source = write_curve(
        tmp_path / "curve.csv", [(0, 60.0), (pause_at, 86.0), (resume_at, 70.0), (stop_at, 96.0)]
    )
    pidfile, beats = tmp_path / "pid", tmp_path / "beats"
    agent = agent_run(*heartbeat_args(source, pidfile, beats))
    pid = wait_for_pid(pidfile, agent)
    samples = watch(pid)
    code, stderr = finish(agent)

    assert code == EXIT_THERMAL_STOP, stderr
    recorded = events(fleet_home)
    actions = ["start", "pause", "resume", "pause", "stop", "summary", "exit"]
    assert [e.action for e in recorded] == actions
    origin = recorded[0].time  # taken before the replay opened: crossings are no later than this
    paused = first(samples, origin, stopped=True)
    resumed = first(samples, samples[paused][0], stopped=False)
    paused_again = first(samples, samples[resumed][0], stopped=True)
    # Latencies run to the end of the read that saw the change: never shorter than the real ones.
    latencies = {
        "pause": samples[paused][1] - (origin + pause_at),
        "resume": samples[resumed][1] - (origin + resume_at),
        "pause at the stop crossing": samples[paused_again][1] - (origin + stop_at),
    }
    for name, latency in latencies.items():
        assert 0 <= latency <= BOUND_S, f"{name} took {latency:.3f} s: {latencies}"
    lasting = samples[-1][1] - (origin + stop_at)
    assert lasting <= BOUND_S + (HOT_POLLS_TO_STOP - 1) * POLL_S, f"the stop took {lasting:.3f} s"

    # Certainly stopped from the end of the first read that saw T to the start of the last one.
    stopped_from, stopped_until = samples[paused][1], samples[resumed - 1][0]
    times = [float(line) for line in beats.read_text().split()]
    assert not [t for t in times if stopped_from < t < stopped_until], "CMD beat while stopped"
    assert [t for t in times if t > samples[resumed][1]], "CMD did not continue after the resume"
    assert group_members(pid) == []
    said = [line for line in stderr.splitlines() if line.startswith("[mlx-fleet]")]
    policy = "policy 75/85/95 °C (the seed's defaults)"  # a replay: no Mac calibrates it
    assert said[0] == f"[mlx-fleet] supervising with {source} here, {policy}"
    lines = [line for line in said[1:] if line[12:14].isdigit()]  # the events' (timed) lines
    assert len(lines) == 6
    assert all(line.endswith(f"({source}, simulated)") for line in lines)
    assert "pause at 86.0 °C" in lines[1] and "pause at 96.0 °C" in lines[3]
    assert "stop at 96.0 °C" in lines[4]
    assert all(e.simulated and e.source == source and e.pid == pid for e in recorded)


def unshare_net() -> list[str]:
    """A prefix that runs a command in a new network namespace (loopback down), when allowed."""
    unshare = shutil.which("unshare")
    if unshare and subprocess.run([unshare, "--net", "true"], capture_output=True).returncode == 0:
        return [unshare, "--net"]
    pytest.skip("cannot create a network namespace here (needs unshare and privileges)")


@pytest.mark.slow
def test_enforces_the_policy_with_nothing_reachable(
    agent_run: Start, fleet_home: Path, tmp_path: Path
) -> None:
    """The agent keeps enforcing its policy when the coordinator is unreachable: here nothing is
    reachable at all, not even loopback."""
    source = write_curve(tmp_path / "curve.csv", [(0, 60.0), (0.8, 90.0), (1.2, 97.0)])
    pidfile, beats = tmp_path / "pid", tmp_path / "beats"
    agent = agent_run(*heartbeat_args(source, pidfile, beats), prefix=unshare_net())
    pid = wait_for_pid(pidfile, agent)
    samples = watch(pid)
    code, stderr = finish(agent)
    assert code == EXIT_THERMAL_STOP, stderr
    assert psutil.STATUS_STOPPED in [current for _, _, current in samples]
    assert [e.action for e in events(fleet_home)] == ["start", "pause", "stop", "summary", "exit"]


@pytest.mark.parametrize(
    ("cmd", "code"),
    [
        (["sh", "-c", "exit 3"], 3),
        (["--", "sh", "-c", "exit 0"], 0),
        (["--", "sh", "-c", "kill -KILL $$"], 128 + signal.SIGKILL),
        (["--", sys.executable, "-c", "import sys; sys.exit(42)", "--pause-temp", "1"], 42),
    ],
)
@pytest.mark.slow
def test_cmds_exit_code_is_agent_runs(agent_cli: str, cmd: list[str], code: int) -> None:
    """With or without --, and whatever options follow CMD (they are CMD's, not ours)."""
    result = subprocess.run(
        [agent_cli, "run", "--thermal-source", "none", *cmd],
        capture_output=True,
        text=True,
        timeout=15,
    )
    assert result.returncode == code, result.stderr
    assert "no thermal source selected; CMD runs without thermal enforcement" in result.stderr


def test_a_command_that_does_not_exist_exits_127_naming_it(agent_cli: str) -> None:
    result = subprocess.run(
        [agent_cli, "run", "--thermal-source", "none", "--", "no-such-trainer-xyz", "--lr", "1e-4"],
        capture_output=True,
        text=True,
        timeout=15,
    )
    assert result.returncode == 127
    assert "no-such-trainer-xyz" in result.stderr


@pytest.mark.parametrize(
    ("options", "named"),
    [
        (["--pause-temp", "99"], ["max_speed_temp", "pause_temp", "stop_temp", "99"]),
        (["--max-speed-temp", "90", "--pause-temp", "80"], ["--max-speed-temp 90 --pause-temp 80"]),
        (["--thermal-source", "thermocouple"], ["thermocouple", "auto", "sim", "replay:PATH"]),
        (["--poll-interval", "0"], ["--poll-interval"]),
        (["--grace", "-1"], ["--grace"]),
        (["--pause-tmp", "90"], ["--pause-tmp"]),
    ],
)
@pytest.mark.slow
def test_bad_input_exits_2_naming_the_problem_and_runs_nothing(
    agent_cli: str, tmp_path: Path, options: list[str], named: list[str]
) -> None:
    marker = tmp_path / "ran"
    result = subprocess.run(
        [agent_cli, "run", *options, "--", "touch", str(marker)],
        capture_output=True,
        text=True,
        timeout=15,
    )
    assert result.returncode == 2
    for text in named:
        assert text in result.stderr
    assert not marker.exists()


@pytest.mark.slow
def test_a_job_that_ignores_sigterm_is_killed_after_the_grace(
    agent_run: Start, fleet_home: Path, tmp_path: Path
) -> None:
    """The thermal stop's SIGTERM is ignored by CMD and by the child it forked (the ignore is
    inherited); SIGKILL after the 0.5 s grace takes both."""
    source = write_curve(tmp_path / "curve.csv", [(0, 60.0), (0.5, 99.0)])
    pidfile = tmp_path / "pid"
    script = f"trap '' TERM; sleep 30 & echo $$ > {pidfile}.tmp; mv {pidfile}.tmp {pidfile}; wait"
    agent = agent_run(*run_args(source, "sh", "-c", script, grace="0.5"))
    pid = wait_for_pid(pidfile, agent)
    code, stderr = finish(agent)
    assert code == EXIT_THERMAL_STOP, stderr
    assert group_members(pid) == []
    recorded = {e.action: e for e in events(fleet_home)}
    assert recorded["stop"].celsius == 99.0
    assert 0.45 <= recorded["kill"].time - recorded["stop"].time < 3.0  # stop is logged after
    assert "kill job" in stderr and "after SIGTERM" in stderr


def test_what_cmd_forked_does_not_outlive_agent_run(agent_cli: str, tmp_path: Path) -> None:
    """CMD exits at once, leaving a grandchild in its group; agent run ends it and exits with
    CMD's code, without waiting for the grandchild's 30 s."""
    grandchild = tmp_path / "grandchild"
    script = f"sleep 30 & echo $! > {grandchild}; exit 3"
    started = time.monotonic()
    result = subprocess.run(
        [agent_cli, "run", "--thermal-source", "none", "--", "sh", "-c", script],
        capture_output=True,
        text=True,
        timeout=15,
    )
    assert result.returncode == 3, result.stderr
    assert time.monotonic() - started < 10
    assert state(int(grandchild.read_text())) is None
    assert " cleanup " in result.stderr


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
@pytest.mark.slow
def test_a_signal_to_agent_run_ends_the_paused_group_too(
    agent_run: Start, tmp_path: Path, signum: signal.Signals
) -> None:
    """agent run is told to go while its job is paused: SIGCONT, the signal, and nothing is left;
    the exit code is CMD's (killed by that signal: 128 + N). sh's background sleep ignores SIGINT
    (POSIX, without job control), so for SIGINT it is SIGKILL after the 1 s grace that ends it."""
    source = write_curve(tmp_path / "curve.csv", [(0, 60.0), (0.5, 90.0)])
    pidfile = tmp_path / "pid"
    script = f"sleep 30 & echo $$ > {pidfile}.tmp; mv {pidfile}.tmp {pidfile}; wait"
    agent = agent_run(*run_args(source, "sh", "-c", script, grace="1"))
    pid = wait_for_pid(pidfile, agent)
    deadline = time.monotonic() + 60
    while state(pid) != psutil.STATUS_STOPPED:
        assert time.monotonic() < deadline, "never paused"
        time.sleep(0.01)
    agent.send_signal(signum)
    code, stderr = finish(agent)
    assert code == 128 + signum, stderr
    assert group_members(pid) == []
    assert "forward job" in stderr and signal.Signals(signum).name in stderr


def test_a_second_signal_kills_the_group_without_waiting_for_the_grace(
    agent_run: Start, tmp_path: Path
) -> None:
    pidfile = tmp_path / "pid"
    script = f"trap '' TERM; echo $$ > {pidfile}.tmp; mv {pidfile}.tmp {pidfile}; sleep 30"
    agent = agent_run("--thermal-source", "none", "--", "sh", "-c", script)  # grace: 30 s
    pid = wait_for_pid(pidfile, agent)
    started = time.monotonic()
    agent.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    assert agent.poll() is None and state(pid) is not None, "SIGTERM is ignored: still there"
    agent.send_signal(signal.SIGTERM)
    code, stderr = finish(agent)
    assert code == 128 + signal.SIGKILL, stderr
    assert time.monotonic() - started < 15  # well inside the 30 s grace: it did not wait it out
    assert group_members(pid) == []


@pytest.mark.skipif(sys.platform == "darwin", reason="iohid works on macOS")
def test_a_source_this_machine_cannot_read_exits_125_and_runs_nothing(
    agent_cli: str, tmp_path: Path
) -> None:
    marker = tmp_path / "ran"
    result = subprocess.run(
        [agent_cli, "run", "--thermal-source", "iohid", "--", "touch", str(marker)],
        capture_output=True,
        text=True,
        timeout=15,
    )
    assert result.returncode == 125
    assert "iohid" in result.stderr and "macOS" in result.stderr
    assert not marker.exists()


@pytest.mark.slow
def test_a_sigkilled_agent_run_leaves_no_process_of_its_command(
    agent_cli: str, tmp_path: Path
) -> None:
    """Its guardian ends CMD's group: CMD and what it forked, even when CMD ignores SIGTERM
    (SIGKILL after the grace)."""
    children = tmp_path / "children"
    script = f"trap '' TERM; sleep 300 & echo $! > {children}; sleep 300 & wait"
    run = subprocess.Popen(
        [agent_cli, "run", "--thermal-source", "none", "--grace", "1", "--", "sh", "-c", script],
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    deadline = time.monotonic() + 30
    while not children.exists() or not children.read_text().strip():
        assert time.monotonic() < deadline and run.poll() is None, "CMD did not start"
        time.sleep(0.05)
    (cmd,) = [c for c in psutil.Process(run.pid).children() if c.cmdline()[0] == "sh"]
    pgid = os.getpgid(cmd.pid)
    assert len(group_members(pgid)) >= 2
    killed = time.time()
    run.kill()
    run.wait(timeout=10)
    deadline = time.monotonic() + 60
    while group_members(pgid, born_before=killed):
        assert time.monotonic() < deadline, f"left running: {group_members(pgid, killed)}"
        time.sleep(0.1)
    assert run.stderr is not None
    assert "agent run is gone: ending its command" in run.stderr.read()
