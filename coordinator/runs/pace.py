"""How long one host's job may go without progress (shared.benchmark.progress's ProgressClock),
sized from the job's matrix: the waits it plans, the spread `-r auto` allows, and each cell's
work as far as the plan tells. A HostDriver keeps one per job."""

from __future__ import annotations

import time
from collections.abc import Hashable
from typing import Any

from shared.benchmark.matrix import Cell, MatrixError, planned_cells
from shared.benchmark.progress import ProgressClock, cell_work
from shared.stats import MIN_AUTO_REPETITIONS


class JobPace:
    """The no-progress bound of one job: `progressed` at each new cell or model, `overdue` says
    how long the job has gone without progress once past the next cell's allowance."""

    def __init__(
        self, spec: dict[str, Any], sustain: dict[str, Any] | None, host_timeout: float
    ) -> None:
        self.spec, self.sustain, self.host_timeout = spec, sustain, host_timeout
        self._plan = _plan_of(spec)
        """The cells `spec` plans, to size the next one; None when it cannot be expanded."""
        self._clock: ProgressClock | None = None

    def start(self) -> None:
        """The clock starts (again) now: a job started, or followed from here."""
        waits = [self.spec.get("delay_s"), self.spec.get("cool_start_s")]
        waits.append((self.sustain or {}).get("duration_s"))
        planned = sum(w for w in waits if _is_number(w))
        self._clock = ProgressClock(
            self.host_timeout,
            time.monotonic(),
            planned_s=float(planned),
            sustained=self.sustain is not None,
            spread=self._repetition_spread(),
        )

    @property
    def started(self) -> bool:
        return self._clock is not None

    def job_has(self, cells: int) -> None:
        """The job the agent started has `cells` cells: a plan of another length is not its."""
        if self._plan is not None and len(self._plan) != cells:
            self._plan = None  # not the job the spec plans: its cells' sizes are unknown

    def progressed(self, indexes: list[int] | None = None) -> None:
        """Progress now: the cells `indexes` arrived (none: a model, a pause, a phase)."""
        assert self._clock is not None
        self._clock.progressed(time.monotonic(), [self._size(i) for i in indexes or []])

    def overdue(self, next_index: int) -> float | None:
        """Seconds without progress, once past the allowance for cell `next_index`."""
        assert self._clock is not None
        return self._clock.overdue(time.monotonic(), *self._size(next_index))

    def allowance(self, next_index: int) -> float:
        assert self._clock is not None
        return self._clock.allowance(*self._size(next_index))

    def _repetition_spread(self) -> float:
        """ProgressClock's spread: under `-r auto` (a precision) a cell runs from
        MIN_AUTO_REPETITIONS to `iterations` timed iterations."""
        most = self.spec.get("iterations")
        if self.spec.get("precision") is None or not _is_number(most):
            return 1.0
        return max(1.0, most / MIN_AUTO_REPETITIONS)

    def _size(self, index: int) -> tuple[Hashable, float]:
        """The model (its key) and the work of cell `index`, as far as the plan tells."""
        if self._plan is None or index >= len(self._plan):
            return None, 1.0
        cell = self._plan[index]
        return (cell.model, cell.bits), cell_work(
            cell.n_prompt, cell.n_gen, cell.n_depth, cell.batch_size
        )


def _plan_of(spec: dict[str, Any]) -> list[Cell] | None:
    """The cells a spec plans (a stored one's too), or None when it plans none we can tell."""
    try:
        return planned_cells(spec)
    except (MatrixError, TypeError, KeyError, AttributeError):
        return None


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
