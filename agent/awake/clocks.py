"""A sleep-inclusive and a sleep-exclusive clock, read together at a timed window's ends: if the
machine slept inside the window, the first ran on and the second did not.

macOS: CLOCK_MONOTONIC_RAW is mach_continuous_time (counts sleep) and CLOCK_UPTIME_RAW is
mach_absolute_time (stops in sleep): Apple's Libc gen/clock_gettime.c maps them so, and Python
exposes both (time module, macOS 10.12+). Linux: CLOCK_BOOTTIME counts suspend, CLOCK_MONOTONIC
does not (clock_gettime(2)). perf_counter, which times the windows, is the sleep-exclusive one on
both, which is why a window's tok/s alone cannot reveal a sleep.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass

CLOCK_PAIRS = {
    "darwin": ("CLOCK_MONOTONIC_RAW", "CLOCK_UPTIME_RAW"),
    "linux": ("CLOCK_BOOTTIME", "CLOCK_MONOTONIC"),
}
"""platform -> (sleep-inclusive, sleep-exclusive) clock names of the time module."""


@dataclass(frozen=True)
class SleepClocks:
    inclusive: int
    exclusive: int
    name: str
    """`CLOCK_BOOTTIME/CLOCK_MONOTONIC`: what a record's slept_s was measured with."""
    injected_s: float = 0.0
    """A simulated sleep (MLX_FLEET_INJECT=sleep): added to the inclusive clock's reading."""

    def read(self) -> tuple[float, float]:
        """(sleep-inclusive, sleep-exclusive) seconds, read back to back."""
        return (
            time.clock_gettime(self.inclusive) + self.injected_s,
            time.clock_gettime(self.exclusive),
        )

    def injecting(self, seconds: float) -> SleepClocks:
        """These clocks with `seconds` more sleep on the inclusive one from now on."""
        return SleepClocks(self.inclusive, self.exclusive, self.name, self.injected_s + seconds)


class SleepWindow:
    """Sleep measured over timed windows: `start` and `stop` around each, `slept_s` the total
    the clocks disagreed by."""

    def __init__(self, clocks: SleepClocks) -> None:
        self.clocks = clocks
        self.slept_s = 0.0
        self._started: tuple[float, float] | None = None

    def start(self) -> None:
        self._started = self.clocks.read()

    def stop(self) -> None:
        if self._started is None:
            raise RuntimeError("stop() without start()")
        inclusive, exclusive = self.clocks.read()
        before_inclusive, before_exclusive = self._started
        drift = (inclusive - before_inclusive) - (exclusive - before_exclusive)
        self.slept_s += max(0.0, drift)
        self._started = None


def system_clocks(platform: str = sys.platform) -> SleepClocks | None:
    """This platform's pair; None where it has none (the record then says slept_s unknown)."""
    names = CLOCK_PAIRS.get(platform)
    if names is None or not all(hasattr(time, name) for name in names):
        return None
    inclusive, exclusive = (getattr(time, name) for name in names)
    return SleepClocks(inclusive, exclusive, "/".join(names))
