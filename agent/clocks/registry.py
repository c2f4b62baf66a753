"""Which clock source a machine reads (open_clock_source): the thermal source's own where it has
one (the thermal plant's simulated clock, a capture's replayed clocks), else the platform's
(IOReport on a Mac, cpufreq on Linux), else none, with the reason."""

from __future__ import annotations

import sys

from agent.clocks.base import ClockSource, NoClockSource
from agent.sensors.base import SourceUnavailable


def platform_clock_source() -> ClockSource:
    """This machine's clocks; SourceUnavailable saying why there are none."""
    if sys.platform == "darwin":
        from agent.clocks.ioreport import IOReportClockSource

        return IOReportClockSource()
    if sys.platform.startswith("linux"):
        from agent.clocks.cpufreq import CpufreqSource

        return CpufreqSource()
    raise SourceUnavailable(f"no clock source known for {sys.platform}")


def open_clock_source(thermal_source: object | None = None) -> ClockSource:
    """The clocks that go with `thermal_source`: its `clock_source` attribute when it carries
    one (a model's clock belongs to its model, a capture's to its Mac), else this machine's;
    a NoClockSource saying `unavailable: <why>` when there is none. Never raises."""
    own = getattr(thermal_source, "clock_source", None)
    if isinstance(own, ClockSource):
        return own
    try:
        return platform_clock_source()
    except SourceUnavailable as exc:
        return NoClockSource(f"unavailable: {exc}")
