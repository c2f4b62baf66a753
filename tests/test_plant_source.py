"""The thermal plant as a source (agent.thermal.plant), driven by real processes: a busy job heats
it at full duty even on a crowded machine, a stopped (SIGSTOP) one adds no heat, the reader's own
work is not the job, and the clock reaches a load through the state file and the clock source."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.sensors.job_load import JobLoad
from agent.thermal import open_source
from agent.thermal.plant import PLANT_STATE_ENV, PlantSource, read_plant_state
from shared.cooling.clocks import ClockReading
from shared.cooling.plant import PRESETS
from tests.conftest import console_script, subprocess_env
from tests.fleet_support import AgentPool

pytestmark = pytest.mark.xdist_group("plant")
"""The closed loops on the thermal plant run one at a time on one worker: each drives a real
busy load whose CPU share the others would take."""

SPIN = "while True: pass"


@pytest.fixture
def busy() -> Iterator[subprocess.Popen[bytes]]:
    process = subprocess.Popen([sys.executable, "-c", SPIN])
    yield process
    process.send_signal(signal.SIGCONT)
    process.kill()
    process.wait()


@pytest.fixture
def state_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "plant.json"
    monkeypatch.setenv(PLANT_STATE_ENV, str(path))
    return path


def read_until(source: PlantSource, condition, deadline_s: float = 30.0) -> None:  # type: ignore[no-untyped-def]
    """Reads every 0.3 s until `condition(source)` holds."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        time.sleep(0.3)
        source.read()
        if condition(source):
            return
    pytest.fail(f"plant never got there: duty {source.plant.duty:.3f}")


def demand_over(load: JobLoad, seconds: float) -> float:
    load()
    began = time.monotonic()
    time.sleep(seconds)
    return load() / (time.monotonic() - began)


@pytest.mark.slow
def test_a_busy_job_heats_the_plant_and_a_stopped_one_adds_no_heat(
    busy: subprocess.Popen[bytes], state_file: Path
) -> None:
    source = open_source("sim:plant:air,speed=60")
    assert isinstance(source, PlantSource)
    assert source.name == "sim:plant:air,speed=60" and source.simulated
    start = source.plant.celsius
    read_until(source, lambda s: s.plant.duty >= 0.9)
    warm = source.read()
    assert warm is not None and warm.simulated and warm.celsius > start
    busy.send_signal(signal.SIGSTOP)
    source.read()  # the interval that held the stop
    read_until(source, lambda s: s.plant.duty <= 0.02)
    peak = source.plant.celsius
    read_until(source, lambda s: s.plant.celsius < peak - 0.5)
    assert source.plant.duty <= 0.02
    state = json.loads(state_file.read_text())
    assert state["simulated"] is True and state["clock_factor"] == 1.0
    assert state["speed"] == 60.0 and state["preset"] == "air"
    clock = source.clock_source.read()
    assert isinstance(clock, ClockReading)
    assert (clock.source, clock.simulated, clock.gpu_hz) == ("plant:air", True, 1398e6)
    assert clock.note is not None and "x60" in clock.note
    source.close()
    assert state_file.exists()  # the caller named it, the caller keeps it


@pytest.mark.slow
def test_the_job_is_the_readers_descendants_and_the_named_roots_never_the_reader(
    busy: subprocess.Popen[bytes],
) -> None:
    idle = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert demand_over(JobLoad(roots=lambda: [busy.pid], own_pid=idle.pid), 0.6) >= 0.9
        assert demand_over(JobLoad(own_pid=idle.pid), 0.6) <= 0.02
        assert demand_over(JobLoad(), 0.6) >= 0.9  # busy is this process's child
        own = JobLoad(own_pid=idle.pid)  # this process spinning is not idle's job
        own()
        began = time.monotonic()
        while time.monotonic() - began < 0.5:
            pass
        assert own() <= 0.02
    finally:
        idle.kill()
        idle.wait()


@pytest.mark.slow
def test_a_started_process_finds_the_plants_state_in_its_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(PLANT_STATE_ENV, raising=False)
    source = PlantSource(PRESETS["mini"])
    path = os.environ[PLANT_STATE_ENV]
    monkeypatch.setenv(PLANT_STATE_ENV, path)  # restored after the test
    assert Path(path) == source.state_path and source.state_path.exists()
    child = subprocess.run(
        [
            sys.executable,
            "-c",
            "from agent.thermal.plant import read_plant_state; "
            "print(read_plant_state()['clock_factor'])",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert float(child.stdout) == 1.0
    source.close()
    assert not source.state_path.exists() and read_plant_state(path) is None


@pytest.mark.slow
def test_the_daemons_plant_heats_from_the_jobs_agent_run_supervises(
    agents: AgentPool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(PLANT_STATE_ENV, raising=False)
    agent = agents.start(thermal="sim:plant:air,speed=60", options=["--poll-interval", "0.2"])
    states = agent.home / "plant"
    run = subprocess.Popen(
        [console_script("agent"), "run", "--", sys.executable, "-c", SPIN],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        env=subprocess_env(MLX_FLEET_HOME=str(agent.home)),
    )
    try:
        daemon_state = wait_for_state(states, lambda state: state["duty"] >= 0.9)
        assert daemon_state["simulated"] is True
        run.send_signal(signal.SIGTERM)  # agent run ends CMD, then itself
        run.wait(timeout=30)
        wait_for_state(states, lambda state: state["duty"] <= 0.02)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait()


def wait_for_state(folder: Path, condition, deadline_s: float = 30.0) -> dict:  # type: ignore[no-untyped-def]
    """The agent daemon's plant state (its one file in `folder`) once `condition` holds."""
    deadline = time.monotonic() + deadline_s
    state: dict | None = None  # type: ignore[type-arg]
    while time.monotonic() < deadline:
        for path in folder.glob("*.json"):
            state = read_plant_state(path)
            if state is not None and condition(state):
                return state
        time.sleep(0.1)
    pytest.fail(f"the daemon's plant never got there: {state}")


@pytest.mark.slow
def test_agent_run_heats_its_own_plant_with_cmd_which_sees_the_plants_clock(
    tmp_path: Path,
) -> None:
    state = tmp_path / "plant.json"
    follower = (
        "import time; from agent.thermal.plant import read_plant_state\n"
        "print('clock', read_plant_state()['clock_factor'], flush=True)\n"
        "t = time.monotonic()\n"
        "while time.monotonic() - t < 3: pass\n"
    )
    result = subprocess.run(
        [
            *(console_script("agent"), "run", "--thermal-source", "sim:plant:air,speed=60"),
            *("--poll-interval", "0.2", "--", sys.executable, "-c", follower),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=subprocess_env(**{PLANT_STATE_ENV: str(state)}),
    )
    assert result.returncode == 0, result.stderr
    assert "clock 1.0" in result.stdout
    plant = read_plant_state(state)
    assert plant is not None and plant["plant_time_s"] > 0
    # CMD spun for 3 s of the run: the plant did that work (its start and end aside)
    assert plant["work"] / plant["plant_time_s"] >= 0.6
    assert plant["celsius"] > PRESETS["air"].steady_c(7, 0.0) + 5


def test_the_wall_interval_ends_where_the_demand_sampling_does(tmp_path: Path) -> None:
    """Listing the job's processes takes a varying while on a crowded machine: a job busy all
    along gives each poll as much demand as wall time, so it heats at duty 1 and no demand is
    clipped away (a full-speed job would otherwise do work the die never felt)."""
    clock = [0.0]
    sampled_at = [0.0]
    sampling_s = iter([0.001, 0.03, 0.002, 0.025, 0.001, 0.04] * 5)

    def load() -> float:
        clock[0] += next(sampling_s, 0.001)  # the demand is read at the sampling's end
        demand, sampled_at[0] = clock[0] - sampled_at[0], clock[0]
        return demand

    params = PRESETS["air"].__class__(**{**PRESETS["air"].__dict__, "start_c": 40.0})
    source = PlantSource(params, load=load, monotonic=lambda: clock[0], state_path=tmp_path / "p")
    try:
        began = source.plant.time_s
        for _ in range(20):
            clock[0] += 0.1  # the poll's sleep
            reading = source.read()
            assert source.plant.duty == pytest.approx(1.0)
        assert source.plant.work == pytest.approx(source.plant.time_s - began)
        assert reading is not None and reading.die_time == source.plant.time_s
    finally:
        source.close()
