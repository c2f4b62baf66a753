"""Which clock source a machine reads (open_clock_source): the thermal source's own where it has
one (the thermal plant's simulated clock, a capture's replayed clocks), else the platform's
(IOReport on a Mac, cpufreq on Linux), else none, with the reason."""

from __future__ import annotations

import sys
from typing import Any

from agent.clocks.base import ClockSource, NoClockSource
from agent.sensors.base import SourceUnavailable
from shared.cooling.clocks import ClockReading


def platform_clock_source() -> ClockSource:
    """This machine's clocks; SourceUnavailable saying why there are none."""
    if sys.platform == "darwin":
        from agent.clocks.ioreport import IOReportClockSource

        return IOReportClockSource()
    if sys.platform.startswith("linux"):
        from agent.clocks.cpufreq import CpufreqSource

        return CpufreqSource()
    raise SourceUnavailable(f"no clock source known for {sys.platform}")


class ThermalSourcesClock(ClockSource):
    """A thermal source's own clock that is not a ClockSource (the plant's PlantClocks: a
    `name`, `simulated` and `read()`), read as one: a read that raises is a None reading with
    the reason, as every source's hiccup is; closing it is its thermal source's business."""

    def __init__(self, own: Any) -> None:
        super().__init__()
        self._own = own
        self.name = str(getattr(own, "name", "thermal source's clock"))
        self.simulated = bool(getattr(own, "simulated", False))
        self.note = getattr(own, "note", None)

    def read(self) -> ClockReading | None:
        try:
            reading = self._own.read()
        except Exception as exc:  # noqa: BLE001 - a clock hiccup never takes the poll down
            return self._fail(f"{self.name}: {exc}")
        if reading is None:
            return self._fail(getattr(self._own, "last_error", None) or f"{self.name}: no reading")
        self.last_error = None
        return reading


def open_clock_source(thermal_source: object | None = None) -> ClockSource:
    """The clocks that go with `thermal_source`: its `clock_source` attribute when it carries
    one (a model's clock belongs to its model, a capture's to its Mac), else this machine's;
    a NoClockSource saying `unavailable: <why>` when there is none. Never raises."""
    own = getattr(thermal_source, "clock_source", None)
    if isinstance(own, ClockSource):
        return own
    if callable(getattr(own, "read", None)):
        return ThermalSourcesClock(own)
    try:
        return platform_clock_source()
    except SourceUnavailable as exc:
        return NoClockSource(f"unavailable: {exc}")
