"""A power source read for energy windows: the idle baseline before a matrix, and each cell's
timed iterations (agent.profiling.speed.IterationTiming). docs/energy.md says what is measured.

A read that fails loses its window; a cell that lost one reports no energy, with the reason, and
the next cell tries again: a meter that died mid-run leaves every later cell's energy N/A, said
why, while the cells themselves go on.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from agent.power.base import NoPowerSource, PowerReading, PowerSource
from shared.benchmark.energy import (
    DEFAULT_BASELINE_S,
    NO_METER,
    MeterInfo,
    Window,
    between,
    cell_energy,
    idle_power,
    unmeasured,
)

log = logging.getLogger(__name__)

BASELINE_WINDOWS = 2
"""The idle baseline lasts at least this many of the meter's intervals, so a batched counter
publishes within it."""


class EnergyMeter:
    """Reads a PowerSource (owned: closed with the meter), never raising for the source's
    faults; `last_error` says why the latest read gave nothing."""

    def __init__(self, source: PowerSource, baseline_s: float = DEFAULT_BASELINE_S) -> None:
        self.source = source
        self.baseline_s = baseline_s
        self.idle_w: float | None = None
        self.idle_note: str | None = None
        self.last_error: str | None = source.last_error

    @property
    def present(self) -> bool:
        """False for `none`: nothing is metered, and every cell says why."""
        return not isinstance(self.source, NoPowerSource)

    def info(self) -> MeterInfo:
        return self.source.info()

    def read(self) -> PowerReading | None:
        try:
            reading = self.source.read()
        except Exception as exc:  # a broken meter must not stop a benchmark
            self.last_error = f"{self.source.name}: {type(exc).__name__}: {exc}"
            return None
        self.last_error = None if reading else self.source.last_error
        return reading

    def measure_idle(self, sleep: Callable[[float], None] = time.sleep) -> None:
        """The idle baseline: watts over baseline_s seconds (at least BASELINE_WINDOWS of the
        meter's resolution) with nothing running; 0 seconds skips it."""
        if not self.present or self.baseline_s <= 0:
            return
        seconds = max(self.baseline_s, BASELINE_WINDOWS * self.source.resolution_s)
        start = self.read()
        sleep(seconds)
        end = self.read()
        if start is None or end is None:
            self.idle_note = f"no idle baseline: {self.last_error}"
            return
        self.idle_w = idle_power(between(start.joules, end.joules, end.monotonic - start.monotonic))
        log.info("idle baseline: %s W over %.1f s (%s)", self.idle_w, seconds, self.source.name)

    def cell(self, warmup: int, tokens: int) -> CellEnergy:
        return CellEnergy(self, warmup, tokens)

    def close(self) -> None:
        self.source.close()


class CellEnergy:
    """One cell's energy windows: a read just before each timed region starts and one just
    after it stops (warm-up iterations are not metered)."""

    def __init__(self, meter: EnergyMeter, warmup: int, tokens: int) -> None:
        self.meter = meter
        self.warmup = warmup
        self.tokens = tokens
        self.windows: list[Window] = []
        self.lost: str | None = None
        self._start: PowerReading | None = None

    def started(self, step: int) -> None:
        if step < self.warmup or not self.meter.present:
            return
        self._start = self.meter.read()
        if self._start is None:
            self.lost = self.lost or f"a meter read failed: {self.meter.last_error}"

    def stopped(self, step: int, seconds: float) -> None:
        start, self._start = self._start, None
        if start is None:
            return
        end = self.meter.read()
        if end is None:
            self.lost = self.lost or f"a meter read failed: {self.meter.last_error}"
            return
        self.windows.append(between(start.joules, end.joules, end.monotonic - start.monotonic))

    def fields(self) -> dict[str, object]:
        """The cell's energy fields (shared.benchmark.energy)."""
        meter = self.meter
        if not meter.present:
            return unmeasured(f"{NO_METER}: {meter.last_error or 'none selected'}")
        info = meter.info()
        if self.lost is not None:
            return unmeasured(self.lost, info)
        fields = cell_energy(self.windows, self.tokens, info, meter.idle_w)
        if meter.idle_w is None and meter.idle_note and fields["energy_j"] is not None:
            notes = [fields["energy_note"], meter.idle_note]
            fields["energy_note"] = "; ".join(note for note in notes if note)
        return fields
