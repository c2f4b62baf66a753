"""A benchmark cell measured while the Mac throttles is `invalid: throttled`: the GPU clock the
agent read during it travels with the cell (ThermalGuard.record_clock, the record's
`gpu_clock`) and the verdict judges it by the throttle rule."""

from __future__ import annotations

from agent.cooling.scheduler import ThermalGuard
from agent.thermal import ThermalMonitor
from shared.benchmark import verdict
from shared.benchmark.matrix import Cell
from shared.benchmark.results import cell_record
from shared.cooling.policy import ThermalPolicy
from shared.stats import summarize_latencies

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
