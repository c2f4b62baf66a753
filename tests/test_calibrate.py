"""`agent calibrate` end to end (issue 41, Build 4): the real command, its real MLX load in a
child process, on the thermal plant (`sim:plant:air`, run faster than the wall clock): it finds
the preset's throttle onset within 1 °C and its sustainable duty within 5 %, stores it, and a
real `agent serve` started afterwards (twice) enforces it and names its origin. Bad input and
interrupted runs store nothing and keep the previous policy."""

from __future__ import annotations

import json
import math
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import zmq

from agent.cooling.calibration_file import calibration_path, load_calibration, save_calibration
from shared.cooling.plant import PRESETS, unthrottled_optimum
from shared.cooling.throttle_point import ThrottlePoint, find_throttle_point
from shared.io.keys import own_keypair
from shared.io.transport import AgentClient, AgentError
from tests.conftest import console_script, piped, run_cli, subprocess_env
from tests.fakes.hostile_agent import HostileAgent
from tests.fleet_support import AgentPool, cli, exchange_keys
from tests.test_hostile_agent import check, coordinator, hostile_output
from tests.test_throttle_point import run_model

PLANT = "sim:plant:air,speed=120"
"""The fanless preset, 2 minutes of a Mac per wall second: it throttles about 5 s in."""
PRECISE_PLANT = "sim:plant:air,speed=60"
"""Half as fast, for the figures the issue holds it to: a poll the busy test machine makes
late lets the die warm twice as much in plant time at 120 (the onset is read between two)."""
AIR = PRESETS["air"]


def earlier_calibration() -> ThrottlePoint:
    """A calibration this Mac kept from 2026-12-05, made on the plant source the tests use."""
    point = find_throttle_point(run_model(), PLANT, True, 1796428800.0)
    save_calibration(point)
    return point


@pytest.mark.slow
@pytest.mark.parametrize(
    ("minutes", "said"),
    [
        ("0", "--minutes must be > 0 minutes, got 0"),
        ("-1", "--minutes must be > 0 minutes, got -1"),
        ("1e9", "--minutes must be at most 600 minutes, got 1e+09"),
        ("nan", "--minutes must be a finite number, got nan"),
    ],
)
def test_minutes_out_of_range_is_one_line(minutes: str, said: str) -> None:
    done = run_cli("agent", "calibrate", "--minutes", minutes, "--thermal-source", PLANT)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [f"error: {said}"]
    assert not calibration_path().exists()


@pytest.mark.slow
def test_no_sensor_is_one_line_and_nothing_stored() -> None:
    kept = earlier_calibration()
    done = run_cli("agent", "calibrate", "--thermal-source", "none", "--minutes", "1")
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1
    assert done.stderr.startswith("error: no sensor: none:")
    assert load_calibration() == kept


@pytest.mark.slow
def test_no_mlx_device_is_one_line(tmp_path: Path) -> None:
    """MLX as a Mac with no Metal device leaves it: the device's first use fails (a fake mlx
    package, first on the load child's path; ml-explore/mlx#3428's RuntimeError)."""
    fake = tmp_path / "fake" / "mlx"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "core.py").write_text(
        "def default_device():\n    raise RuntimeError('No Metal device available')\n"
    )
    done = run_cli(
        "agent",
        "calibrate",
        "--thermal-source",
        PLANT,
        "--minutes",
        "1",
        env={"PYTHONPATH": str(tmp_path / "fake")},
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        "error: no MLX load can run here: RuntimeError: No Metal device available"
    ]
    assert not calibration_path().exists()


@pytest.mark.slow
def test_a_running_job_refuses_it(agents: AgentPool, fleet_home: Path) -> None:
    """A job `agent run` supervises under this Mac's daemon: the calibration would measure it."""
    agents.start(home=fleet_home)
    job = piped(
        [console_script("agent"), "run", "--", sys.executable, "-c", "input()"],
        stdin=subprocess.PIPE,
    )
    try:
        assert job.stderr is not None
        for line in job.stderr:  # the daemon lists it from its start event on
            if "start job" in line:
                break
        done = run_cli("agent", "calibrate", "--thermal-source", PLANT, "--minutes", "1")
        assert done.returncode == 2, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1
        assert done.stderr.startswith("error: a job is running (agent run job ")
        assert not calibration_path().exists()
    finally:
        job.kill()
        job.communicate()


@pytest.mark.slow
@pytest.mark.xdist_group("plant")  # beside the other closed loops on the plant, one at a time
def test_on_the_plant_it_finds_the_presets_onset_and_duty_and_a_restart_keeps_it(
    agents: AgentPool, fleet_home: Path
) -> None:
    done = run_cli(
        "agent", "calibrate", "--thermal-source", PRECISE_PLANT, "--minutes", "1", "-o", "json"
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    point = ThrottlePoint.from_dict(report["calibration"])
    assert abs(point.onset_c - AIR.limit_c) <= 1.0, point
    sustainable = unthrottled_optimum(AIR, AIR.limit_c)
    assert point.duty_cycle is not None and abs(point.duty_cycle - sustainable) <= 0.05, (
        point.held,
        point.throttled,
        done.stderr,
    )
    assert point.simulated and point.signal == "gpu clock"
    assert point.throttled is not None and point.held is not None
    assert report["policy"]["pause_temp"] == round(point.onset_c, 1)
    assert report["policy_origin"] == point.origin()
    assert point.origin().startswith("calibrated on this Mac ")
    assert f"({PRECISE_PLANT} · plant die, simulated)" in point.origin()
    assert "calibrate:" in done.stderr and "flat out" in done.stderr
    assert load_calibration() == point
    polls = [
        json.loads(line)
        for line in (fleet_home / "calibration-polls.jsonl").read_text().splitlines()
    ]
    phases = [p["phase"] for p in polls]
    assert phases[:2] == ["idle", "idle"] and {"sustained", "held"} <= set(phases)
    assert all(p["gpu_hz"] for p in polls) and {"plant die"} == {p["sensor"] for p in polls}
    for _ in range(2):  # started, then started again: the stored policy survives
        agent = agents.start(home=fleet_home, thermal=PRECISE_PLANT)
        deadline = time.monotonic() + 30
        while point.origin() not in agent.log_text():
            assert time.monotonic() < deadline, agent.log_text()
            time.sleep(0.1)
        agent.kill()
    shown = run_cli("agent", "temp", "--thermal-source", PRECISE_PLANT, "-o", "json")
    assert json.loads(shown.stdout)["policy_origin"] == point.origin()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("how", "code", "said"),
    [(signal.SIGTERM, 143, "interrupted"), (signal.SIGINT, 130, "interrupted")],
)
def test_interrupted_it_stores_nothing_and_says_the_previous_policy_stays(
    how: signal.Signals, code: int, said: str
) -> None:
    kept = earlier_calibration()
    run = piped([console_script("agent"), "calibrate", "--thermal-source", PLANT, "--minutes", "1"])
    assert run.stderr is not None
    for line in run.stderr:  # interrupted under load, not while starting
        if "flat out" in line:
            break
    run.send_signal(how)
    _, err = run.communicate(timeout=60)
    assert run.returncode == code, err
    assert f"calibrate: {said}; nothing stored, the previous policy stays" in err
    assert kept.origin() in err
    assert load_calibration() == kept


@pytest.mark.slow
def test_a_thermal_stop_ends_it_and_stores_nothing() -> None:
    done = run_cli(
        "agent", "calibrate", "--thermal-source", PLANT, "--minutes", "1", "--stop-temp", "80"
    )
    assert done.returncode == 75, done.stderr
    assert "calibrate: stopped by the heat: " in done.stderr
    assert "at or above 80 °C for 3 polls; nothing stored" in done.stderr
    assert not calibration_path().exists()


@pytest.mark.slow
def test_coordinator_calibrate_follows_each_host_and_its_policy_names_the_calibration(
    agents: AgentPool,
) -> None:
    agent = agents.start(thermal=PLANT)
    exchange_keys(agent)
    run = piped(
        [console_script("coordinator"), "calibrate", "--hosts", agent.address]
        + ["--minutes", "0.5", "-o", "json"]
    )
    assert run.stderr is not None
    progress = []
    for line in run.stderr:  # a benchmark beside it would heat what it measures
        progress.append(line)
        if "flat out" in line:
            break
    bench = cli("coordinator", "benchmark", "--hosts", agent.address, "--config-small")
    assert bench.returncode != 0
    assert "busy: a calibration is running (0.5 min)" in bench.stdout + bench.stderr
    out, err = run.communicate(timeout=120)
    assert run.returncode == 0, err + agent.log_text()
    done = subprocess.CompletedProcess(run.args, run.returncode, out, "".join(progress) + err)
    (row,) = json.loads(done.stdout)
    assert row["result"] == "calibrated", row
    point = ThrottlePoint.from_dict(row["calibration"])
    assert abs(point.onset_c - AIR.limit_c) <= 3.0, point  # the precision: the test above
    assert f"{agent.address}: " in done.stderr and "flat out" in done.stderr
    deadline = time.monotonic() + 30  # in force from the agent's next poll
    while True:
        shown = cli("coordinator", "policy", "--hosts", agent.address, "-o", "json")
        (policy,) = json.loads(shown.stdout)
        if policy["origin"] == point.origin():
            break
        assert time.monotonic() < deadline, policy
        time.sleep(0.5)
    assert policy["policy"]["pause_temp"] == round(point.onset_c, 1)


@pytest.mark.slow
def test_coordinator_calibrate_is_refused_by_a_busy_host(agents: AgentPool) -> None:
    agent = agents.start(thermal=PLANT)
    exchange_keys(agent)
    ctx = zmq.Context()
    client = AgentClient(ctx, agent.address, agent.key, own_keypair(), 5.0)
    try:  # what no coordinator sends: refused by the agent itself, nothing started
        client.connect()
        for minutes in (0, -1, 1e9, math.nan):
            with pytest.raises(AgentError, match="minutes must be above 0 and at most 600"):
                client.request("calibrate.start", {"minutes": minutes})
        assert client.request("calibrate.get")["state"] == "none"
    finally:
        client.close()
        ctx.term()
    job = subprocess.Popen(  # beside the agent: its data directory
        [console_script("agent"), "run", "--", sys.executable, "-c", "input()"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=subprocess_env(MLX_FLEET_HOME=str(agent.home)),
    )
    try:
        assert job.stderr is not None
        for line in job.stderr:
            if "start job" in line:
                break
        done = cli("coordinator", "calibrate", "--hosts", agent.address, "--minutes", "1")
        assert done.returncode == 1, done.stderr
        assert "refused" in done.stdout and "cannot calibrate now: agent run job" in done.stdout
    finally:
        job.kill()
        job.communicate()


@pytest.mark.slow
def test_agent_run_without_a_daemon_enforces_the_calibration_made_with_its_source() -> None:
    kept = earlier_calibration()
    done = run_cli("agent", "run", "--thermal-source", PLANT, "--", sys.executable, "-c", "pass")
    assert done.returncode == 0, done.stderr
    onset = round(kept.onset_c, 1)
    assert f"policy {onset - 5:g}/{onset:g}/" in done.stderr
    assert f"({kept.origin()})" in done.stderr
    other = run_cli("agent", "run", "--thermal-source", "sim", "--", sys.executable, "-c", "pass")
    assert "(the seed's defaults)" in other.stderr  # made with another source: not this one's


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["reply-invalid", "reply-garbage", "strings", "reply-error"])
def test_coordinator_calibrate_trusts_no_reply(mode: str, fleet_home: Path) -> None:
    """A broken or hostile agent (tests/fakes/hostile_agent.py): an invalid calibrate.start.ok,
    garbage, an error whose message is terminal escapes and markup. One line naming the host,
    exit 1, nothing of it reaching the terminal raw."""
    with HostileAgent(mode, name="mac3") as agent:
        run = coordinator(
            "calibrate",
            "--hosts",
            agent.address,
            "--insecure",
            "--connect-timeout",
            "3",
            "--minutes",
            "1",
            home=fleet_home,
        )
        asked = list(agent.requests)
    problems = hostile_output(run)
    assert "calibrate.start" in asked
    assert run.returncode == 1, run.text
    if mode == "reply-invalid":
        assert "answered calibrate.start with an invalid reply" in run.text, run.text
    check(run, problems)
