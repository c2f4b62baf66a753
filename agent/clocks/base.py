"""What every clock source gives: a ClockReading (shared.cooling.clocks) or None with the reason
(the Source protocol of agent.sensors.base: a hiccup never raises)."""

from __future__ import annotations

import time
from abc import abstractmethod

from agent.clocks.decode import Clocks, plausible_hz
from agent.sensors.base import NoSource, Source
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

    def _from_clocks(self, clocks: Clocks, prefix: str) -> ClockReading | None:
        """A reading of decoded clocks, what could not be told said in its note (and in
        `last_error`, `prefix: ...`); None when nothing could be, or a clock is out of range."""
        figures = (clocks.gpu_hz, clocks.cpu_p_hz, clocks.cpu_e_hz)
        if not all(map(plausible_hz, figures)):
            return self._fail(f"{prefix}: a decoded clock out of range {figures}")
        if clocks.gpu_active is None and all(value is None for value in figures):
            return self._fail(f"{prefix}: " + ("; ".join(clocks.problems) or "no residency"))
        self.last_error = "; ".join(clocks.problems) or None
        note = self.note if self.last_error is None else f"{self.note}; {self.last_error}"
        return ClockReading(
            time.time(), clocks.gpu_hz, clocks.gpu_active, clocks.cpu_p_hz, clocks.cpu_e_hz,
            self.name, simulated=self.simulated, note=note,
        )  # fmt: skip


class NoClockSource(NoSource, ClockSource):
    """No clock: every read is None, with the reason."""
