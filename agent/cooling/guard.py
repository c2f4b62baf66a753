"""The hook through which a benchmark run is gated and annotated per cell.

The benchmark runner knows nothing about sensors or policies: it calls a CellGuard at the
start of each cell, before each iteration (outside the timed region, so a pause never lands in
a latency), and at the end of the cell. The thermal guard lives in agent.cooling.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass
class GuardReport:
    """What the guard observed over one cell."""

    soc_temp_start_c: float | None = None
    soc_temp_end_c: float | None = None
    pressure_start: str | None = None
    pressure_end: str | None = None
    """Thermal pressure levels, for sources that report one (with or without degrees)."""
    pause_s: float = 0.0
    cool_wait_s: float = 0.0
    """How long the cell waited, before it started, for the machine to cool (cool start)."""
    flags: list[str] = field(default_factory=list)
    thermal_source: str | None = None
    gpu_clock: dict[str, Any] | None = None
    """The GPU clock the agent read during the cell, one [hz, active share] per poll, and the
    sustained clock it knew (the throttle rule's reference): a record's `gpu_clock`."""


@dataclass(frozen=True)
class Conditions:
    """What a guard sees now: the latest °C, the policy's state (None without a reading) and
    the seconds spent paused so far, all cells together."""

    celsius: float | None = None
    state: str | None = None
    pause_s: float = 0.0


class CellGuard(Protocol):
    def begin_cell(self, cool_start_s: float = 0.0, injected_c: float | None = None) -> None:
        """Called once before a cell's warm-up; may first wait up to `cool_start_s` for the
        machine to cool (`injected_c`: as if it stayed at that °C, MLX_FLEET_INJECT=hot-start)."""

    def now(self) -> Conditions:
        """What it sees now (a sustained cell's windows report it)."""

    def before_iteration(self, step: int) -> None:
        """Called before every warm-up and timed iteration; may block (pause) or raise."""

    def end_cell(self) -> GuardReport:
        """Called once after the cell, also when it failed."""


class NullGuard:
    """No sensor, no policy: temperatures are unknown and nothing is gated."""

    def begin_cell(self, cool_start_s: float = 0.0, injected_c: float | None = None) -> None:
        pass

    def now(self) -> Conditions:
        return Conditions()

    def before_iteration(self, step: int) -> None:
        pass

    def end_cell(self) -> GuardReport:
        return GuardReport()


class RunStopped(RuntimeError):
    """Raised by a guard to end the whole run (e.g. a thermal stop), not just one cell."""
