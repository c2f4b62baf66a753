"""ThermalMonitor: the seed's polling API over any ThermalSource."""

from __future__ import annotations

import contextlib
import logging
import operator
import threading
from collections import deque
from collections.abc import Callable, Sequence

from agent.sensors.base import Backoff, ClosedOnExit
from agent.thermal.base import CallableSource, NoneSource, ThermalReading, ThermalSource
from agent.thermal.registry import open_source
from shared.bounds import MAX_POLL_INTERVAL_S, check_count, check_seconds

log = logging.getLogger(__name__)

SourceLike = ThermalSource | str | Callable[[], float | None] | None


def trend_slope(values: Sequence[float]) -> float | None:
    """Least-squares slope (°C per sample) of evenly spaced values; None with fewer than two."""
    n = len(values)
    if n < 2:
        return None
    x_mean = (n - 1) / 2.0
    # sum((i - x_mean) * (y - y_mean)) is sum(i * y) - x_mean * sum(y), as the x deviations sum
    # to 0 (summed in C: the daemon takes a trend at every poll); and sum((i - x_mean) ** 2)
    # over 0..n-1 is n(n² - 1)/12
    numerator = sum(map(operator.mul, range(n), values)) - x_mean * sum(values)
    return numerator * 12.0 / (n * (n * n - 1))


class StopFlag:
    """What a polling thread sleeps on between polls, woken early by set(). wait() is one C
    call (a lock taken with a timeout), where threading.Event.wait runs a Condition's Python
    at every poll: most of what an idle 1 Hz thread costs (docs/performance.md)."""

    def __init__(self) -> None:
        self._unset = threading.Lock()
        """Held while the flag is not set."""
        self._unset.acquire()

    def wait(self, timeout: float) -> bool:
        """Sleep up to `timeout` seconds (none when not above 0); True as soon as (or if
        already) set."""
        if not self._unset.acquire(timeout=max(timeout, 0.0)):
            return False
        self.set()  # it stays set for the next wait
        return True

    def is_set(self) -> bool:
        return not self._unset.locked()

    def set(self) -> None:
        with contextlib.suppress(RuntimeError):  # set already
            self._unset.release()

    def clear(self) -> None:
        self._unset.acquire(blocking=False)


MOST_HISTORY = 1_000_000
"""Readings a monitor keeps: eleven days at 1 Hz (issue 42: every size of the Python API
bounded; 10**12 grew until the machine ran out)."""


class ThermalMonitor(ClosedOnExit):
    """Polls a thermal source on a daemon thread and keeps a rolling history.

    `source` is a ThermalSource (the caller keeps ownership), a source name such as "auto" or
    "replay:curve.csv", or a zero-argument callable returning °C or None. The default, "auto",
    picks the best sensor this machine has and is a no-op when it has none. A source that raises is
    retried with backoff and reported in `last_error`; it never kills the monitor.
    """

    def __init__(
        self, poll_interval: float = 1.0, history_size: int = 60, source: SourceLike = None
    ) -> None:
        check_seconds("poll_interval", poll_interval, MAX_POLL_INTERVAL_S, above_least=True)
        check_count("history_size", history_size, 1, MOST_HISTORY)
        self.poll_interval = poll_interval
        self.history_size = history_size
        self._owns_source = not isinstance(source, ThermalSource)
        if isinstance(source, ThermalSource):
            self.source = source
        elif source is None or isinstance(source, str):
            self.source = open_source(source or "auto", interval_s=poll_interval)
        else:
            self.source = CallableSource(source)
        self._history: deque[ThermalReading] = deque(maxlen=history_size)
        self._listeners: list[Callable[[ThermalReading | None], None]] = []
        self._latest: ThermalReading | None = None
        self._lock = threading.Lock()
        self._source_lock = threading.Lock()
        self._stop = StopFlag()
        self._thread: threading.Thread | None = None
        self._backoff = Backoff(initial=poll_interval, maximum=max(30.0, poll_interval))
        self.last_error: str | None = self.source.last_error
        self.failures = 0

    # --- one-shot -------------------------------------------------------------------------------

    def read(self) -> ThermalReading | None:
        """One reading straight from the source, not recorded; None when unavailable."""
        reading, _ = self._read_source()
        return reading

    def get_soc_temperature(self) -> float | None:
        """One-shot SoC temperature in °C; None when unavailable."""
        reading = self.read()
        return reading.celsius if reading else None

    # --- polling --------------------------------------------------------------------------------

    def start(self) -> None:
        """Take a first reading now (so `temperature` is set on return), then poll in the
        background. A no-op thread-wise when there is no sensor, and altogether for a source
        whose readings are handed over (`pushed`); calling it twice is harmless."""
        if self.running or self.source.pushed:
            return
        self._poll()
        if not isinstance(self.source, NoneSource):
            self._start_thread()

    def _start_thread(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="thermal-monitor", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop polling; idempotent. The source stays open so start() may be called again."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout=self.poll_interval + 10.0)

    def close(self) -> None:
        """Stop, and close the source when the monitor opened it."""
        self.stop()
        if self._owns_source:
            self.source.close()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    # --- what has been seen ---------------------------------------------------------------------

    @property
    def temperature(self) -> float | None:
        """The latest polled temperature; None when the latest poll had none."""
        with self._lock:
            return self._latest.celsius if self._latest else None

    @property
    def reading(self) -> ThermalReading | None:
        """The latest polled reading (with its pressure level, sensors and source)."""
        with self._lock:
            return self._latest

    def get_history(self) -> list[float]:
        """The polled temperatures, oldest first (at most history_size)."""
        with self._lock:
            return [r.celsius for r in self._history if r.celsius is not None]

    def get_readings(self) -> list[ThermalReading]:
        """The polled readings, oldest first, including those with only a pressure level."""
        with self._lock:
            return list(self._history)

    def is_rising(self, window: int = 5) -> bool:
        """Whether the least-squares slope of the last `window` temperatures is positive."""
        if window < 2:
            return False
        slope = trend_slope(self.get_history()[-window:])
        return slope is not None and slope > 0

    def is_above(self, threshold: float) -> bool:
        """Whether the latest temperature is at or above threshold (False when unknown)."""
        temperature = self.temperature
        return temperature is not None and temperature >= threshold

    # --- internals ------------------------------------------------------------------------------

    def _read_source(self) -> tuple[ThermalReading | None, bool]:
        """(reading, failed): a source that raises is reported, never propagated."""
        with self._source_lock:
            try:
                reading = self.source.read()
            except Exception as exc:  # a broken sensor must not stop training
                self.failures += 1
                self.last_error = f"{self.source.name}: {type(exc).__name__}: {exc}"
                if self.failures == 1:
                    log.warning("thermal source failed, retrying with backoff: %s", self.last_error)
                return None, True
            if self.failures:
                log.info(
                    "thermal source %s recovered after %d failures", self.source.name, self.failures
                )
            self.failures = 0
            self.last_error = None if reading else self.source.last_error
            return reading, False

    def add_listener(self, listener: Callable[[ThermalReading | None], None]) -> None:
        """Call `listener` (on the polling thread) with every poll's outcome from now on, None
        for a poll without a reading: unlike the bounded history, it misses none however long
        the caller looks away."""
        with self._lock:
            self._listeners.append(listener)

    def _poll(self) -> bool:
        """Read once and record; True when the source failed."""
        reading, failed = self._read_source()
        self.record(reading)
        return failed

    def record(self, reading: ThermalReading | None) -> None:
        """One poll's outcome, as the latest reading, in the history and to every listener:
        what polling does, and how a `pushed` source's readings arrive."""
        with self._lock:
            self._latest = reading
            if reading is not None:
                self._history.append(reading)
            listeners = list(self._listeners)
        for listener in listeners:
            listener(reading)

    def _run(self) -> None:
        delay = self.poll_interval
        while not self._stop.wait(delay):
            if self._poll():
                delay = self._backoff.next_delay()
            else:
                self._backoff.reset()
                delay = self.poll_interval
