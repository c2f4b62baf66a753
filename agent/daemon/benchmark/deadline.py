"""A benchmark job's own bound: the longest it may run before its agent ends it, whether or not
the coordinator that started it is still there (a coordinator that died leaves no one to cancel a
job that hangs, or one asked for absurd work, and the agent would stay busy for everyone).

The bound follows from the spec (shared.bounds.job_bound_s: every cell's build, warm-up and
repetitions, or its sustained duration, its delay and its cool-start wait, with generous slack);
MLX_FLEET_JOB_BOUND_S, when set, replaces it (tests make it small; an operator may too).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from shared.benchmark.matrix import MatrixSpec
from shared.benchmark.sustain import SustainPlan
from shared.bounds import MAX_JOB_S, duration_text, job_bound_s

BOUND_ENV = "MLX_FLEET_JOB_BOUND_S"
"""Seconds: every job's bound, in place of the spec's."""


def job_bound(
    spec: MatrixSpec, cells: int, sustain: SustainPlan | None, baseline_s: float = 0.0
) -> float:
    """The bound of a job of `cells` cells of `spec` (seconds)."""
    configured = os.environ.get(BOUND_ENV)
    if configured:
        try:
            seconds = float(configured)
        except ValueError:
            seconds = 0.0
        if seconds > 0:
            return seconds
    return job_bound_s(
        cells,
        spec.warmup,
        spec.iterations,
        spec.delay_s,
        spec.cool_start_s,
        sustain.duration_s if sustain is not None else None,
        baseline_s,
    )


def too_long(cells: int, sustain: SustainPlan | None) -> str | None:
    """Why a sustained job could not end within MAX_JOB_S, the most any job may run; None when
    it can."""
    if sustain is None or sustain.duration_s * cells <= MAX_JOB_S:
        return None
    return (
        f"{cells} cells of duration_s {sustain.duration_s:g} s would run "
        f"{sustain.duration_s * cells / 3600:.1f} h; a job runs at most "
        f"{duration_text(MAX_JOB_S)} ({MAX_JOB_S / 86400:g} days): fewer cells or a shorter "
        "duration"
    )


@dataclass
class Deadline:
    """When a job started (monotonic) and how long it may run."""

    bound_s: float
    started: float

    @classmethod
    def starting_now(cls, bound_s: float) -> Deadline:
        return cls(bound_s, time.monotonic())

    def passed(self, now: float | None = None) -> bool:
        return (time.monotonic() if now is None else now) - self.started > self.bound_s

    def reason(self) -> str:
        """The job's error once its agent ended it."""
        shown = f"{self.bound_s:.0f} s" if self.bound_s >= 10 else f"{self.bound_s:g} s"
        if self.bound_s >= 3600:
            shown += f" ({self.bound_s / 3600:.1f} h)"
        return (
            f"ran past its bound of {shown} (the agent ends a job that outlives what its spec "
            f"plans, with slack; docs/protocol.md §5, Limits): cancelled by the agent"
        )
