"""CoolingScheduler and ThermalGuard driven by real monitor threads over replayed curves."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from agent.cooling.guard import CellGuard, GuardReport
from agent.cooling.scheduler import CoolingScheduler, ThermalGuard, ThermalShutdownError
from agent.thermal import ThermalMonitor, ThermalReading, ThermalSource
from shared.cooling.policy import (
    HOT_POLLS_TO_STOP,
    MISSING_POLLS_TO_RESUME,
    Action,
    CoolingState,
    ThermalPolicy,
)

POLL = 0.02
FAST_POLICY = ThermalPolicy(pause_duration=POLL)


def replay(tmp_path: Path, rows: str) -> str:
    curve = tmp_path / "curve.csv"
    curve.write_text("seconds,celsius\n" + rows)
    return f"replay:{curve}"


class ScriptedSource(ThermalSource):
    """Readings from a list, one per read, the last repeated: for pressure-only cases."""

    name = "scripted"

    def __init__(self, readings: list[tuple[float | None, str | None]]) -> None:
        super().__init__()
        self._readings = readings

    def read(self) -> ThermalReading | None:
        celsius, pressure = self._readings.pop(0) if len(self._readings) > 1 else self._readings[0]
        return self._reading(celsius, pressure=pressure)


@pytest.mark.slow
def test_replayed_curve_drives_reduce_pause_resume_and_shutdown(tmp_path: Path) -> None:
    """70 -> 90 -> 70 -> 96 °C through a real monitor thread: the lasting 96 °C pauses first,
    and stops once it has lasted HOT_POLLS_TO_STOP polls."""
    source = replay(tmp_path, "0,70\n0.2,78\n0.4,82\n0.6,90\n1.1,70\n1.6,96\n")
    seen: list[tuple[int, CoolingState, bool, float | None]] = []
    with ThermalMonitor(poll_interval=POLL, source=source) as monitor:
        monitor.start()
        scheduler = CoolingScheduler(monitor, FAST_POLICY)
        with pytest.raises(ThermalShutdownError) as excinfo:
            for step in range(10_000):
                scheduler.check_before_step(step)
                seen.append(
                    (step, scheduler.state, scheduler.should_reduce_batch(), monitor.temperature)
                )
                time.sleep(POLL)

    reduced = [step for step, _, reduce, _ in seen if reduce]
    assert reduced, "78 and 82 °C ask for a smaller batch"
    assert len(scheduler.pauses) == 2, "70-90-70, then the pause the stop ends"
    pause, last = scheduler.pauses
    assert pause.peak_celsius == 90.0
    assert pause.step > max(reduced)
    assert pause.duration_s > 0
    assert scheduler.total_pause_time == pytest.approx(pause.duration_s + last.duration_s, abs=0.05)
    resumed = [entry for entry in seen if entry[0] == pause.step]
    assert resumed and resumed[0][1] is CoolingState.OK and resumed[0][3] == 70.0
    error = excinfo.value
    assert (error.temperature, error.threshold) == (96.0, 95.0)
    assert error.step == last.step > pause.step and last.peak_celsius == 96.0
    message = str(error)
    assert "96.0" in message and "95.0" in message and f"step {error.step}" in message
    assert f"for {HOT_POLLS_TO_STOP} polls" in message


def test_a_stop_reached_during_a_pause_raises(tmp_path: Path) -> None:
    with ThermalMonitor(POLL, source=replay(tmp_path, "0,88\n0.1,97\n")) as monitor:
        monitor.start()
        scheduler = CoolingScheduler(monitor, FAST_POLICY)
        with pytest.raises(ThermalShutdownError, match="97.0"):
            scheduler.check_before_step(3)
    assert len(scheduler.pauses) == 1
    assert scheduler.pauses[0].peak_celsius == 97.0
    assert scheduler.total_pause_time > 0


def test_a_pause_holds_without_a_reading_then_resumes_after_the_missing_polls(
    tmp_path: Path,
) -> None:
    """The one cooling rule (shared.cooling.policy.react), as `agent run` applies it."""
    actions: list[tuple[Action, ThermalReading | None, str | None]] = []
    with ThermalMonitor(POLL, source=replay(tmp_path, "0,90\n0.1,\n")) as monitor:
        monitor.start()
        scheduler = CoolingScheduler(
            monitor, FAST_POLICY, on_action=lambda *heard: actions.append(heard)
        )
        scheduler.check_before_step(0)
        assert monitor.temperature is None
    assert len(scheduler.pauses) == 1
    (pause, hot, _), (resume, missing, why) = actions
    assert (pause, hot.celsius if hot else None) == (Action.PAUSE, 90.0)
    assert (resume, missing) == (Action.RESUME, None)
    assert why == f"no reading for {MISSING_POLLS_TO_RESUME} polls: resuming without a sensor"


@pytest.mark.parametrize(("hysteresis", "resumed_at"), [(0.0, 83.0), (5.0, 79.0)])
def test_hysteresis_holds_the_pause_until_below_pause_minus_hysteresis(
    tmp_path: Path, hysteresis: float, resumed_at: float
) -> None:
    policy = ThermalPolicy(pause_duration=POLL, hysteresis=hysteresis)
    with ThermalMonitor(POLL, source=replay(tmp_path, "0,90\n0.2,83\n0.5,79\n")) as monitor:
        monitor.start()
        CoolingScheduler(monitor, policy).check_before_step(0)
        assert monitor.temperature == resumed_at


def test_no_reading_never_blocks_or_raises() -> None:
    with ThermalMonitor(source="none") as monitor:
        monitor.start()
        scheduler = CoolingScheduler(monitor)
        scheduler.check_before_step(0)
        assert not scheduler.should_reduce_batch()
        assert scheduler.total_pause_time == 0.0
        assert scheduler.policy == ThermalPolicy()


def test_pressure_level_alone_can_stop_and_the_message_says_so() -> None:
    source = ScriptedSource([(None, "Trapping")])
    with ThermalMonitor(POLL, source=source) as monitor:
        monitor.start()
        with pytest.raises(ThermalShutdownError) as excinfo:
            CoolingScheduler(monitor).check_before_step(12)
    message = str(excinfo.value)
    assert "step 12" in message and "Trapping" in message
    assert "unknown" in message and "95.0" in message


def test_pressure_level_alone_pauses_until_it_eases() -> None:
    source = ScriptedSource([(None, "Heavy")] * 5 + [(None, "Nominal")])
    with ThermalMonitor(POLL, source=source) as monitor:
        monitor.start()
        scheduler = CoolingScheduler(monitor, FAST_POLICY)
        scheduler.check_before_step(0)
    assert len(scheduler.pauses) == 1 and scheduler.pauses[0].peak_celsius is None


# --- ThermalGuard -------------------------------------------------------------------------------


def run_cell(guard: ThermalGuard, iterations: int) -> None:
    guard.begin_cell()
    for step in range(iterations):
        guard.before_iteration(step)
        time.sleep(POLL)


def guarded_cells(
    source: str, *iterations: int, enabled: bool = True
) -> tuple[ThermalGuard, list[GuardReport]]:
    """A ThermalGuard under FAST_POLICY, its monitor reading `source`, through one cell of each
    count of `iterations`: the guard and each cell's report."""
    with ThermalMonitor(POLL, source=source) as monitor:
        guard = ThermalGuard(monitor, FAST_POLICY, enabled=enabled)
        reports = []
        for count in iterations:
            run_cell(guard, count)
            reports.append(guard.end_cell())
    return guard, reports


def test_thermal_guard_is_a_cell_guard() -> None:
    with ThermalMonitor(source="none") as monitor:
        guard: CellGuard = ThermalGuard(monitor, FAST_POLICY)
        guard.begin_cell()
        report = guard.end_cell()
    assert (report.soc_temp_start_c, report.soc_temp_end_c, report.pause_s) == (None, None, 0.0)
    assert (report.flags, report.thermal_source) == ([], "none")


def test_cool_cell_reports_temperatures_and_the_simulated_source(tmp_path: Path) -> None:
    source = replay(tmp_path, "0,60\n0.1,64\n")
    _, (report,) = guarded_cells(source, 15)
    assert (report.soc_temp_start_c, report.soc_temp_end_c) == (60.0, 64.0)
    assert report.pause_s == 0.0
    assert report.flags == ["simulated"]
    assert report.thermal_source == source


def test_hot_cell_that_paused_is_flagged_and_pause_time_stays_in_its_cell(tmp_path: Path) -> None:
    guard, (first, second) = guarded_cells(replay(tmp_path, "0,80\n0.2,88\n0.5,70\n"), 30, 3)
    assert first.soc_temp_start_c == 80.0 and first.soc_temp_end_c == 70.0
    assert first.flags == ["paused", "hot", "simulated"]
    assert first.pause_s > 0
    assert first.pause_s == pytest.approx(guard.scheduler.total_pause_time)
    assert second.pause_s == 0.0
    assert second.flags == ["simulated"]


def test_a_spike_between_iterations_still_marks_the_cell_hot(tmp_path: Path) -> None:
    source = replay(tmp_path, "0,60\n0.1,80\n0.25,60\n")
    with ThermalMonitor(POLL, source=source) as monitor:
        guard = ThermalGuard(monitor, FAST_POLICY, enabled=False)
        guard.begin_cell()
        time.sleep(0.5)
        report = guard.end_cell()
    assert report.soc_temp_end_c == 60.0
    assert "hot" in report.flags


def test_disabled_guard_only_observes(tmp_path: Path) -> None:
    _, (report,) = guarded_cells(replay(tmp_path, "0,90\n0.1,97\n"), 15, enabled=False)
    assert report.pause_s == 0.0
    assert report.flags == ["hot", "simulated"]
    assert (report.soc_temp_start_c, report.soc_temp_end_c) == (90.0, 97.0)


def test_enabled_guard_raises_at_stop_and_still_reports_the_cell(tmp_path: Path) -> None:
    with ThermalMonitor(POLL, source=replay(tmp_path, "0,96\n")) as monitor:
        guard = ThermalGuard(monitor, FAST_POLICY)
        guard.begin_cell()
        with pytest.raises(ThermalShutdownError, match="step 0"):
            guard.before_iteration(0)
        report = guard.end_cell()
    assert report.soc_temp_start_c == 96.0
    assert "hot" in report.flags and "paused" in report.flags, "a stop comes after a pause"


@pytest.mark.slow
def test_a_spike_inside_one_long_iteration_still_marks_the_cell_hot() -> None:
    """The monitor keeps only 2 readings, and the spike is hundreds of polls before the cell
    ends: the guard must see every reading as it is polled, not what history still holds."""
    source = ScriptedSource([(70.0, None)] * 5 + [(80.0, None)] + [(70.0, None)])
    with ThermalMonitor(0.005, history_size=2, source=source) as monitor:
        guard = ThermalGuard(monitor, enabled=False)
        guard.begin_cell()
        guard.before_iteration(0)
        time.sleep(1.0)  # one long iteration: ~200 polls, the 80 °C one long gone from history
        report = guard.end_cell()
    assert max(monitor.get_history()) == 70.0
    assert "hot" in report.flags


def test_a_pressure_only_source_is_recorded_per_cell() -> None:
    source = ScriptedSource([(None, "Nominal")] * 3 + [(None, "Moderate")])
    with ThermalMonitor(POLL, source=source) as monitor:
        guard = ThermalGuard(monitor, enabled=False)
        guard.begin_cell()
        time.sleep(POLL * 8)
        report = guard.end_cell()
    assert report.soc_temp_start_c is None and report.soc_temp_end_c is None
    assert (report.pressure_start, report.pressure_end) == ("Nominal", "Moderate")
