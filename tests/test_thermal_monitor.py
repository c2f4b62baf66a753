"""ThermalMonitor: the seed's API, a real polling thread, and sources that fail."""

from __future__ import annotations

import inspect
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from agent.thermal import ThermalMonitor, ThermalReading, ThermalSource, trend_slope
from agent.thermal.monitor import StopFlag


def wait_for(condition: Callable[[], bool], timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.01)
    return False


class Counter:
    """A zero-argument °C function: 50, 51, 52, ... (or raising while `broken`)."""

    def __init__(self, broken: int = 0) -> None:
        self.calls = 0
        self.broken = broken

    def __call__(self) -> float:
        self.calls += 1
        if self.calls <= self.broken:
            raise OSError(f"sensor glitch {self.calls}")
        return 49.0 + self.calls


def test_defaults_are_the_seeds() -> None:
    parameters = inspect.signature(ThermalMonitor).parameters
    assert parameters["poll_interval"].default == 1.0
    assert parameters["history_size"].default == 60


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="poll_interval"):
        ThermalMonitor(poll_interval=0, source="none")
    with pytest.raises(ValueError, match="history_size"):
        ThermalMonitor(history_size=0, source="none")


def test_get_soc_temperature_is_one_shot() -> None:
    monitor = ThermalMonitor(source=Counter())
    assert monitor.get_soc_temperature() == 50.0
    assert monitor.get_soc_temperature() == 51.0


def test_get_soc_temperature_is_not_recorded() -> None:
    monitor = ThermalMonitor(source=Counter())
    monitor.get_soc_temperature()
    monitor.get_soc_temperature()
    assert monitor.temperature is None
    assert monitor.get_history() == []


def test_a_callable_source_is_named_after_its_class() -> None:
    assert ThermalMonitor(source=Counter()).source.name == "callable:Counter"


def test_polling_thread_fills_a_bounded_history() -> None:
    counter = Counter()
    with ThermalMonitor(poll_interval=0.01, history_size=5, source=counter) as monitor:
        monitor.start()
        assert monitor.temperature == 50.0  # start() takes the first reading before returning
        assert wait_for(lambda: counter.calls >= 12)
        history = monitor.get_history()
        monitor.stop()
        assert not monitor.running
    assert len(history) == 5
    assert history == sorted(history) and history[-1] - history[0] == 4.0
    assert [r.celsius for r in monitor.get_readings()] == monitor.get_history()


def test_stop_is_idempotent() -> None:
    counter = Counter()
    monitor = ThermalMonitor(poll_interval=0.01, source=counter)
    monitor.stop()  # before any start
    monitor.start()
    monitor.start()
    monitor.stop()
    monitor.stop()
    assert not monitor.running
    calls = counter.calls
    time.sleep(0.05)
    assert counter.calls == calls
    monitor.close()
    monitor.close()
    assert not monitor.running


def test_start_again_works() -> None:
    monitor = ThermalMonitor(poll_interval=0.01, source=Counter())
    monitor.start()
    monitor.start()
    assert monitor.running
    monitor.stop()
    monitor.start()
    assert monitor.running
    monitor.close()


def test_is_rising_uses_the_least_squares_slope_of_the_last_window() -> None:
    assert trend_slope([1.0, 2.0, 3.0]) == 1.0
    assert trend_slope([3.0, 1.0, 2.0]) == -0.5
    assert trend_slope([5.0]) is None
    values = iter([50.0, 60.0, 70.0, 65.0, 66.0])
    with ThermalMonitor(poll_interval=0.01, source=lambda: next(values, None)) as monitor:
        monitor.start()
        assert wait_for(lambda: len(monitor.get_history()) == 5 and monitor.temperature is None)
        assert monitor.is_rising()  # all five: slope +3.7 °C per reading
        assert not monitor.is_rising(window=3)  # 70, 65, 66: slope -2
        assert monitor.is_rising(window=2)
        assert not monitor.is_rising(window=1)


def test_is_rising_when_warming(tmp_path: Path) -> None:
    curve = tmp_path / "warming.csv"
    curve.write_text("".join(f"{i * 0.02:.2f},{60 + i}\n" for i in range(10)))
    with ThermalMonitor(poll_interval=0.01, source=f"replay:{curve}") as monitor:
        monitor.start()
        assert wait_for(lambda: monitor.temperature == 69.0)
        assert monitor.is_rising()


def test_is_above_is_false_when_unknown() -> None:
    with ThermalMonitor(source=lambda: 85.0) as monitor:
        assert not monitor.is_above(85.0)  # nothing polled yet


def test_is_above_means_at_or_above() -> None:
    with ThermalMonitor(source=lambda: 85.0) as monitor:
        monitor.start()
        assert monitor.is_above(85.0)
        assert not monitor.is_above(85.1)


def test_a_failing_source_is_retried_with_backoff_and_reported(
    caplog: pytest.LogCaptureFixture,
) -> None:
    counter = Counter(broken=2)
    with caplog.at_level(logging.INFO), ThermalMonitor(0.2, source=counter) as monitor:
        monitor.start()
        assert monitor.running
        assert monitor.temperature is None
        assert "OSError: sensor glitch 1" in (monitor.last_error or "")
        assert monitor.failures == 1
        assert wait_for(lambda: monitor.temperature is not None)
        assert monitor.running
        assert monitor.failures == 0
        assert monitor.last_error is None
    assert counter.calls >= 3
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "sensor glitch 1" in warnings[0].getMessage()
    assert any("recovered after 2 failures" in r.getMessage() for r in caplog.records)


def test_none_is_a_no_op_without_a_thread() -> None:
    with ThermalMonitor(source="none") as monitor:
        monitor.start()
        assert not monitor.running
        assert monitor.temperature is None
        assert monitor.get_soc_temperature() is None
        assert monitor.last_error


class PressureOnly(ThermalSource):
    """A source with a pressure level and no degrees, like powermetrics on Apple Silicon."""

    name = "pressure-only"

    def read(self) -> ThermalReading | None:
        return self._reading(None, pressure="Heavy")


def test_pressure_only_readings_are_kept_but_not_in_the_degree_history() -> None:
    with ThermalMonitor(poll_interval=0.01, source=PressureOnly()) as monitor:
        monitor.start()
        assert wait_for(lambda: len(monitor.get_readings()) >= 3)
        reading = monitor.reading
        assert reading is not None and reading.pressure == "Heavy"
        assert monitor.temperature is None
        assert monitor.get_history() == []


def test_readers_on_other_threads_see_consistent_values() -> None:
    errors: list[BaseException] = []
    with ThermalMonitor(poll_interval=0.001, history_size=10, source=Counter()) as monitor:
        monitor.start()

        def reader() -> None:
            try:
                for _ in range(300):
                    history = monitor.get_history()
                    assert len(history) <= 10
                    assert history == sorted(history)
                    monitor.is_rising()
                    monitor.is_above(60.0)
            except BaseException as exc:  # reported to the main thread
                errors.append(exc)

        threads = [threading.Thread(target=reader) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert errors == []


def test_a_stop_flag_sleeps_until_set_and_stays_set() -> None:
    flag = StopFlag()
    assert flag.wait(0.01) is False and not flag.is_set()  # not set: the timeout runs out
    woke: list[bool] = []
    sleeper = threading.Thread(target=lambda: woke.append(flag.wait(60.0)))
    sleeper.start()
    flag.set()  # wakes the sleeper long before its minute
    sleeper.join(timeout=30.0)
    assert woke == [True]
    flag.set()  # set twice is harmless
    assert flag.wait(60.0) is True and flag.is_set()  # and it stays set for every later wait
    flag.clear()
    assert flag.wait(0.01) is False and not flag.is_set()


def test_stop_wakes_a_monitor_between_long_polls() -> None:
    counter = Counter()
    monitor = ThermalMonitor(poll_interval=3600.0, source=counter)
    monitor.start()
    assert monitor.running and counter.calls == 1  # the first reading, taken at start
    stopping = threading.Thread(target=monitor.stop)
    stopping.start()
    stopping.join(timeout=30.0)  # the join inside waits up to an hour if the sleep is not woken
    assert not stopping.is_alive() and not monitor.running
    monitor.close()
