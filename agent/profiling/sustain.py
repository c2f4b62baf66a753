"""A sustained cell: its iterations back to back for a duration, cut into windows of wall time, each
with its tok/s, °C, watts and the policy's state (shared.benchmark.sustain says what they mean).

SustainRecorder gives the speed profiler its steps (warm-up, then timed iterations until the
duration is over) and hears each timed region (agent.profiling.speed.IterationTiming). The gate
runs before each step as ever: a pause lands between iterations, outside every timed region,
and shows as its window's pause_s; a stop raises out of the gate and the windows measured stay.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from agent.cooling.guard import CellGuard
from agent.power.base import PowerReading
from agent.power.meter import EnergyMeter
from shared.benchmark.energy import between
from shared.benchmark.sustain import SustainPlan, SustainWindow, summarize


class SustainRecorder:
    """Steps and windows of one sustained cell of `tokens` per iteration."""

    def __init__(
        self,
        plan: SustainPlan,
        tokens: int,
        guard: CellGuard,
        meter: EnergyMeter | None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.plan = plan
        self.tokens = tokens
        self.guard = guard
        self.meter = meter if meter is not None and meter.present else None
        self.clock = clock
        self.windows: list[SustainWindow] = []
        self.start_celsius: float | None = None
        self._t0: float | None = None
        self._current: SustainWindow | None = None
        self._pause_at_open = 0.0
        self._energy_at_open: PowerReading | None = None

    def steps(self, num_warmup: int, num_iterations: int) -> Iterator[int]:
        """Warm-up as asked, then timed steps until the duration is over (one at least)."""
        yield from range(num_warmup)
        self._t0 = self.clock()
        self.start_celsius = self.guard.now().celsius
        self._open(0, self._t0)
        step = num_warmup
        while step == num_warmup or self.clock() - self._t0 < self.plan.duration_s:
            yield step
            step += 1

    def started(self, step: int) -> None:
        """Nothing to do before the clock: the window is known when the iteration ends."""

    def stopped(self, step: int, seconds: float) -> None:
        if self._t0 is None or self._current is None:
            return  # a warm-up iteration
        now = self.clock()
        index = min(int((now - self._t0) // self.plan.window_s), self.plan.windows - 1)
        while self._current.index < index:  # a pause may have spanned whole windows
            self._close(now)
            self._open(len(self.windows), now)
        window = self._current
        window.iterations += 1
        window.tokens += self.tokens
        window.timed_s += seconds

    def _open(self, index: int, at: float) -> None:
        assert self._t0 is not None
        self._current = SustainWindow(index, at - self._t0, at - self._t0)
        self._pause_at_open = self.guard.now().pause_s
        self._energy_at_open = self.meter.read() if self.meter else None

    def _close(self, at: float) -> None:
        """Close the current window at `at`: windows follow each other without a gap, each
        from where the previous one closed."""
        window, self._current = self._current, None
        assert window is not None and self._t0 is not None
        window.end_s = max(window.start_s, at - self._t0)
        conditions = self.guard.now()
        window.celsius, window.state = conditions.celsius, conditions.state
        window.pause_s = conditions.pause_s - self._pause_at_open
        opened = self._energy_at_open
        closed = self.meter.read() if self.meter else None
        if opened is not None and closed is not None and closed.monotonic > opened.monotonic:
            window.joules = between(opened.joules, closed.joules, 0.0).total_j
            if window.joules is not None:
                window.watts = window.joules / (closed.monotonic - opened.monotonic)
        self.windows.append(window)

    def result(self, stopped: str | None = None) -> dict[str, object]:
        """The cell's `sustain` field: the plan, every window, what they say, and what
        stopped it early (the policy's stop) when something did."""
        if self._current is not None:
            self._close(self.clock())
        rows = [window.to_dict() for window in self.windows]
        return {
            **self.plan.to_dict(),
            "windows": rows,
            **summarize(rows, self.start_celsius, self.plan.window_s),
            "stopped": stopped,
        }
