"""How each reading crosses from the monitor's thread to the daemon's loop: a source that hands
every read's outcome over (TappedSource), and the queue and wake-up pipe it goes through
(ReadingHandoff). Its own module because it is the one part of the telemetry hub
(agent.daemon.hub) that two threads touch: everything else happens on the loop's thread, so
nothing there needs a lock."""

from __future__ import annotations

from collections.abc import Callable
from queue import SimpleQueue

from agent.daemon.telemetry import PowerPoll
from agent.daemon.wake import WakePipe
from agent.thermal import ThermalReading, ThermalSource
from agent.thermal.base import OverSource
from shared.io.queues import drained

Taken = tuple[float, ThermalReading | None, PowerPoll | None]
"""One poll's time, reading and power."""


class TappedSource(OverSource):
    """A source that hands every read's outcome (None too) to `on_read`: how the one monitor's
    thread tells the daemon about each reading as it is taken."""

    def __init__(
        self, inner: ThermalSource, on_read: Callable[[ThermalReading | None], None]
    ) -> None:
        super().__init__(inner)
        self.last_error = inner.last_error
        self._on_read = on_read

    def read(self) -> ThermalReading | None:
        reading = None
        try:
            reading = self.inner.read()
        finally:  # a source that raises still makes a sample: one without a reading
            self.last_error = self.inner.last_error
            self._on_read(reading)
        return reading

    def close(self) -> None:
        self.inner.close()


class ReadingHandoff:
    """put() on the monitor's thread; the loop polls `fd` and take()s. The loop is woken at
    every reading while `each_reading`, else only once the readings waiting and the samples not
    yet written (`unwritten`, safe to read from the monitor's thread) fill a write of
    `write_every`."""

    def __init__(self, unwritten: Callable[[], int], write_every: int) -> None:
        self._readings: SimpleQueue[Taken] = SimpleQueue()
        self._unwritten = unwritten
        self._write_every = write_every
        self.each_reading = True
        """Whether the monitor's thread wakes the loop at every reading (TelemetryHub.pace)."""
        self.pipe = WakePipe()

    @property
    def fd(self) -> int:
        return self.pipe.fd

    def put(self, taken: Taken) -> None:
        """On the monitor's thread: hand one poll over, and wake the loop when it is due."""
        readings = self._readings
        readings.put(taken)
        if self.each_reading or readings.qsize() + self._unwritten() >= self._write_every:
            self.pipe.wake()

    def take(self) -> list[Taken]:
        """Every poll handed over since the last take, oldest first (the loop's thread is the
        queue's only reader)."""
        return drained(self._readings)

    def close(self) -> None:
        self.pipe.close()
