"""What every clock source gives: a ClockReading (shared.cooling.clocks) or None with the reason
(the Source protocol of agent.sensors.base: a hiccup never raises)."""

from __future__ import annotations

from abc import abstractmethod

from agent.sensors.base import Source
from shared.cooling.clocks import ClockReading


class ClockSource(Source):
    """A place clocks come from: IOReport on a Mac, cpufreq on Linux, the thermal plant
    (simulated), a capture (replayed). `note` is what its readings mean here (requested or
    granted state), carried by each reading."""

    note: str | None = None
    counts_intervals: bool = False
    """Its reading covers the interval since the previous read (IOReport's residencies): a
    single read needs one taken a moment before."""

    @abstractmethod
    def read(self) -> ClockReading | None:
        """The clocks over the interval since the previous read, or None (see `last_error`)."""


class NoClockSource(ClockSource):
    """No clock: every read is None, with the reason."""

    name = "none"

    def __init__(self, reason: str) -> None:
        super().__init__()
        self.last_error = reason

    def read(self) -> ClockReading | None:
        return None
