"""The running benchmark job, seen from the daemon: its plan, its requester, the process now
running its cells and how far it got. Its own module, below the parts that each handle one side
of it (agent.daemon.benchmark.jobs runs it, agent.daemon.benchmark.reporter says what it did), so
that they share it without importing each other."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from agent.daemon.benchmark.deadline import Deadline
from agent.daemon.benchmark.plan import JobPlan
from agent.daemon.benchmark.process import JobProcess
from shared.benchmark.matrix import Cell, MatrixSpec


@dataclass
class Job:
    """The running job, seen from the daemon."""

    plan: JobPlan
    """What bench.start asked for: the job's id, spec, cells, and how to run them."""
    requester: bytes
    request_id: str
    process: JobProcess
    """The job process now running its cells (a new one after a crash)."""
    started: str
    done: int = 0
    begun: int | None = None
    """The index of the cell the process said it is measuring."""
    built: set[tuple[str, int | None]] = field(default_factory=set)
    """The (model, bits) the current process has built."""
    journaled_models: set[tuple[str, int | None]] = field(default_factory=set)
    outcome: dict[str, Any] | None = None
    kill_at: float | None = None
    crashed: bool = False
    """A job process died: its log is kept, even empty, as the cells' errors name it."""
    deadline: Deadline | None = None
    """The job's own bound (agent.daemon.benchmark.deadline): past it the agent cancels it."""
    overran: str | None = None
    """Why the agent cancelled it, once it ran past its deadline: the job's error."""
    active_at: float = field(default_factory=time.monotonic)
    """When its process last wrote anything (a model, a cell, a pause, a cooling wait)."""

    @property
    def id(self) -> str:
        return self.plan.id

    @property
    def spec(self) -> MatrixSpec:
        return self.plan.spec

    @property
    def cells(self) -> list[Cell]:
        return self.plan.cells

    @property
    def total(self) -> int:
        return len(self.cells)

    @property
    def fd(self) -> int:
        return self.process.fd

    def summary(self) -> dict[str, Any]:
        """info.ok's `job`."""
        return {"id": self.id, "done": self.done, "total": self.total, "started": self.started}
