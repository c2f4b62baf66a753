"""A benchmark cell measured while the Mac throttles is `invalid: throttled`: the GPU clock the
agent read during it travels with the cell (ThermalGuard.record_clock, the record's
`gpu_clock`) and the verdict judges it by the throttle rule."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import zmq

from agent.cooling.scheduler import ThermalGuard
from agent.thermal import ThermalMonitor
from agent.thermal.plant import PLANT_STATE_ENV
from shared.benchmark import verdict
from shared.benchmark.matrix import Cell
from shared.benchmark.results import cell_record
from shared.cooling.policy import ThermalPolicy
from shared.stats import summarize_latencies
from tests.conftest import subprocess_env
from tests.fleet_support import AgentPool, connect, trusted_agent

CELL = Cell("small", 16, 32, 0, 0, 1)
STEADY = [0.100, 0.101, 0.0995, 0.1002, 0.1001]


def measured(report: object) -> dict:
    metrics = summarize_latencies(STEADY, CELL.tokens)
    metrics.update(warmup_iterations=2, rewarm_iterations=0, slept_s=0.0)
    return cell_record(CELL, metrics, thermal=vars(report))


def clock(ghz: float, active: float = 0.95) -> dict:
    return {"gpu_hz": ghz * 1e9, "gpu_active": active, "sustained_hz": 1.4e9}


def test_the_clock_read_during_a_cell_is_its_records_and_judges_it() -> None:
    with ThermalMonitor(source="none") as monitor:
        guard = ThermalGuard(monitor, ThermalPolicy())
        guard.record_clock(clock(0.2))  # between cells: not the cell's
        guard.begin_cell()
        for ghz in (1.4, 1.1, 1.1, 1.1):
            guard.record_clock(clock(ghz))
        throttled = guard.end_cell()
        guard.begin_cell()
        for ghz in (1.4, 1.38, 1.1, 1.39):
            guard.record_clock(clock(ghz))
        steady = guard.end_cell()
        guard.begin_cell()
        unclocked = guard.end_cell()
    assert throttled.gpu_clock == {
        "sustained_hz": 1.4e9,
        "samples": [[1.4e9, 0.95], [1.1e9, 0.95], [1.1e9, 0.95], [1.1e9, 0.95]],
    }
    record = measured(throttled)
    assert verdict.verdict_text(record) == "invalid: throttled"
    assert verdict.throttle_evidence(record) == "GPU 1.10 GHz of 1.40 sustained"
    assert verdict.verdict_text(measured(steady)) == "valid"
    assert "gpu_clock" not in measured(unclocked)  # no clock read: nothing claimed


HIGH = {"max_speed_temp": 120.0, "pause_temp": 130.0, "stop_temp": 140.0}
"""Thresholds above the plant's 105 °C limit: the firmware throttles, the policy never acts."""


@pytest.mark.slow
def test_a_cell_measured_on_a_throttling_plant_is_invalid_throttled(
    agents: AgentPool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real agent on the fanless plant (sim:plant:air at 60 plant seconds a wall second, 5 °C
    under its limit): its benchmark job's load heats the plant past 105 °C within seconds, the
    plant's firmware steps the GPU clock down, and the cells measured then are judged throttled
    by the agent's clock readings (their gpu_clock), evidence and all."""
    monkeypatch.delenv(PLANT_STATE_ENV, raising=False)
    agent = trusted_agent(
        agents, thermal="sim:plant:air,speed=60,start_c=100", options=["--poll-interval", "0.2"]
    )
    matrix = {"n_prompt": [128], "n_gen": [0], "models": ["small"], "warmup": 1,
              "iterations": 30}  # fmt: skip
    context = zmq.Context()
    try:
        client = connect(context, agent, timeout=60)
        client.request("policy.set", {"policy": HIGH})
        cells = 2
        records = []
        for _ in range(cells):
            stream = client.stream(client.send("bench.start", {"matrix": matrix}))
            records += [m.body["record"] for m in stream if m.type == "bench.cell"]
        history = client.request("history.get", {"samples_after": 0, "events_after": 0})
        client.close()
    finally:
        context.destroy(linger=0)
    throttled = [r for r in records if "throttled" in r["verdict_reasons"]]
    assert throttled, [(r.get("gpu_clock"), r["verdict_reasons"]) for r in records]
    record = throttled[-1]
    evidence = verdict.throttle_evidence(record) or ""
    # the clock's (this machine's CPU, shared with other work, may slow the iterations too)
    assert re.search(r"(^|; )GPU \d\.\d\d GHz of 1\.40 sustained$", evidence), evidence
    assert record["gpu_clock"]["sustained_hz"] == 1.398e9  # the plant's top state, seen first
    assert "simulated" in record["flags"]  # the plant is labelled: not a sensor
    said = [x["throttle_evidence"] for x in history["samples"] if x.get("throttling")]
    assert said and all(re.fullmatch(r"GPU \d\.\d\d GHz of 1\.40 sustained", e) for e in said)


def test_a_sustained_cell_keeps_no_clock_samples() -> None:
    """Its windows are its curve, and a day of polls would not fit a message."""
    with ThermalMonitor(source="none") as monitor:
        guard = ThermalGuard(monitor, ThermalPolicy())
        guard.begin_cell()
        guard.record_clock(clock(1.1))
        report = guard.end_cell()
    metrics = summarize_latencies(STEADY, CELL.tokens) | {"warmup_iterations": 1}
    sustain = {"windows": [], "window_s": 10.0}
    record = cell_record(CELL, metrics, thermal=vars(report), measured={"sustain": sustain})
    assert "gpu_clock" not in record


@pytest.mark.slow
def test_agent_bench_judges_its_cells_by_the_clock_it_reads(
    agent_cli: str, fleet_home: Path, tmp_path: Path
) -> None:
    """`agent bench` reading a capture (a real Mac's format, replayed) whose GPU runs flat out at
    1.00 GHz, on a Mac calibrated at a 1.40 GHz sustained clock (a calibration made with that
    source, as `agent calibrate` stores it): every cell it measures there carries the clock
    and is judged throttled; the capture's figures are labelled replayed."""
    from agent.cooling.calibration_file import save_calibration
    from shared.cooling.throttle_point import find_throttle_point
    from tests.test_clocks import clock_capture, states_row
    from tests.test_throttle_point import run_model

    fleet_home.mkdir(parents=True, exist_ok=True)
    point = find_throttle_point(run_model(), "capture", False, 1796515200.0)
    assert point.sustained_hz == 1.4e9
    save_calibration(point)
    polls = [
        {
            "t": step * 0.5,
            "iohid": {"PMU tdie1": 60.0},
            "ioreport_states": [states_row("GPUPH", [("OFF", 0), ("P1", step * 50), ("P2", 0)])],
        }
        for step in range(600)
    ]
    capture = clock_capture(tmp_path / "throttled.jsonl", polls)
    result = subprocess.run(
        [agent_cli, "bench", "--config-small", "-p", "64", "-n", "0", "-r", "40", "-w", "1",
         "--thermal-source", f"capture:{capture}", "--poll-interval", "0.2", "-o", "json"],
        capture_output=True, text=True, timeout=300, env=subprocess_env(),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    (cell,) = json.loads(result.stdout)["cells"]
    assert cell["gpu_clock"]["sustained_hz"] == 1.4e9
    assert "throttled" in cell["verdict_reasons"]
    assert "GPU 1.00 GHz of 1.40 sustained" in (verdict.throttle_evidence(cell) or "")
