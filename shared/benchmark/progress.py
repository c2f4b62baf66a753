"""How long a job may go without progress before its host is failed (docs/protocol.md §6).

--host-timeout bounds a host that is silent; a host that answers every ping can still hold a job
that never moves (a wedged job process, or a stream lost where nobody noticed). Progress is a
new cell, a model built, or a bench.progress. Pure: every time comes in as an argument, so each
case is testable without a clock or a network.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

MODEL_BUILD_TIMEOUTS = 4.0
"""Before the first cell of a model (of the job, or the next model), this many host timeouts
more: building it may download or convert weights, and no cell of it has been timed yet."""
SLOWEST_CELL_FACTOR = 3.0
"""The next cell is given this many times what the slowest cell so far took (scaled to its
work): cells of one job vary, and a cooling pause lengthens any of them."""
DECODE_WEIGHT = 64
"""A generated token counts as this many prompt tokens of work: each is a sequential step."""


def cell_work(n_prompt: int, n_gen: int, n_depth: int, batch_size: int) -> float:
    """A cell's size, to scale the slowest cell's time to the next one: tokens through the
    model (the depth's fill included), a generated token weighing DECODE_WEIGHT; at least 1."""
    return float(max(1, batch_size * (n_depth + n_prompt + DECODE_WEIGHT * n_gen)))


def no_progress_allowance(
    host_timeout: float,
    planned_s: float = 0.0,
    slowest_s: float = 0.0,
    slowest_s_per_work: float = 0.0,
    next_work: float = 1.0,
    builds_model: bool = True,
) -> float:
    """Seconds the job may go from its last progress to the next before its host fails:
    host_timeout + planned_s (what the next cell is planned to take by the clock: the matrix's
    delay_s, its cool_start_s, a sustained run's duration_s) + MODEL_BUILD_TIMEOUTS x
    host_timeout before the first cell of a model + SLOWEST_CELL_FACTOR x the slowest cell so
    far, scaled up to the next cell's work when it is larger."""
    allowance = host_timeout + planned_s
    if builds_model:
        allowance += MODEL_BUILD_TIMEOUTS * host_timeout
    return allowance + SLOWEST_CELL_FACTOR * max(slowest_s, slowest_s_per_work * next_work)


@dataclass
class ProgressClock:
    """A job's progress as one coordinator sees it: when it last progressed and how slow its
    cells have been. `now` is always given (time.monotonic() in use)."""

    host_timeout: float
    since: float
    planned_s: float = 0.0
    sustained: bool = False
    """Each cell runs for a planned duration: its work says nothing of its time."""
    slowest_s: float = 0.0
    slowest_s_per_work: float = 0.0
    spread: float = 1.0
    """How many times the slowest cell's time a cell of the same work may take: under `-r auto`
    its most iterations over its fewest (one cell may stop at 3, the next run to the most)."""
    timed_models: set[Hashable] = field(default_factory=set)
    """The models (a key per model and bits) with a cell timed: no build allowance for them."""

    def progressed(self, now: float, cells: Sequence[tuple[Hashable, float]] = ()) -> None:
        """Progress at `now`: a model built or a bench.progress (no cells), or `cells` (each
        (its model's key, its work)) arrived, sharing the time since the last progress."""
        if cells:
            share = max(0.0, now - self.since) / len(cells)
            for model, work in cells:
                self.slowest_s = max(self.slowest_s, share)
                self.slowest_s_per_work = max(self.slowest_s_per_work, share / work)
                self.timed_models.add(model)
        self.since = now

    def allowance(self, next_model: Hashable, next_work: float) -> float:
        return no_progress_allowance(
            self.host_timeout,
            self.planned_s,
            self.spread * self.slowest_s,
            0.0 if self.sustained else self.spread * self.slowest_s_per_work,
            next_work,
            next_model not in self.timed_models,
        )

    def overdue(self, now: float, next_model: Hashable, next_work: float) -> float | None:
        """The seconds without progress when they exceed the allowance, else None."""
        idle = now - self.since
        return idle if idle > self.allowance(next_model, next_work) else None
