"""What is measured around one cell's timed iterations besides their seconds: its energy windows
(agent.power.meter) and, in a sustained run, its time windows (agent.profiling.sustain). The
speed profiler tells it where each timed region starts and stops; it reads nothing inside one."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from agent.cooling.guard import CellGuard
from agent.power.meter import CellEnergy, EnergyMeter
from agent.profiling.speed import every_step
from agent.profiling.sustain import SustainRecorder
from shared.benchmark.matrix import Cell
from shared.benchmark.sustain import SustainPlan, sustained_speed


class CellWatch:
    """The IterationTiming and step plan of one cell."""

    def __init__(
        self,
        cell: Cell,
        warmup: int,
        guard: CellGuard,
        meter: EnergyMeter | None = None,
        sustain: SustainPlan | None = None,
    ) -> None:
        self.energy: CellEnergy | None = meter.cell(warmup, cell.tokens) if meter else None
        self.sustain = SustainRecorder(sustain, cell.tokens, guard, meter) if sustain else None

    def steps(self, num_warmup: int, num_iterations: int) -> Iterable[int]:
        if self.sustain is not None:
            return self.sustain.steps(num_warmup, num_iterations)
        return every_step(num_warmup, num_iterations)

    def started(self, step: int) -> None:
        if self.energy is not None:
            self.energy.started(step)

    def stopped(self, step: int, seconds: float) -> None:
        if self.energy is not None:
            self.energy.stopped(step, seconds)
        if self.sustain is not None:
            self.sustain.stopped(step, seconds)

    def fields(self, stopped: str | None = None) -> dict[str, Any]:
        """The cell's energy fields and, sustained, its `sustain` field (whose windows stand for the
        per-iteration series, left out: a long run has thousands of iterations) and its tok/s as
        tokens over time (shared.benchmark.sustain.sustained_speed) in place of the rates' mean."""
        fields: dict[str, Any] = self.energy.fields() if self.energy is not None else {}
        if self.sustain is not None:
            fields["sustain"] = self.sustain.result(stopped)
            fields["samples_ms"] = None
            fields["samples_tokens_per_sec"] = None
            speed = sustained_speed(fields["sustain"])  # tokens over time, as its windows say
            if stopped is None and speed["tokens_per_sec"] is not None:
                fields |= speed
        return fields
