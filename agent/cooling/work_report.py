"""A custom training loop's work, told to `agent run`: StepGate.report_work(tokens) after each
step, so the agent sees the job's tokens/s (its own speed, the throttle signal that needs no
clock: shared.cooling.throttle) as it sees mlx_lm's from its reports.

The loop's side writes the running total beside the state file (`<state file>.work`: JSON
{"tokens", "steps", "time", "pid"}, replaced atomically at most every WRITE_EVERY_S, so a fast
loop pays a file write a few times a second, not per step); `agent run`'s side (WorkFile)
reads it each poll and turns two totals into a rate, timed by the loop's own clock.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

from shared.io.files import replace_atomically

WORK_SUFFIX = ".work"
WRITE_EVERY_S = 0.2
"""At most this often the total is written: several times per poll of the agent (1 s)."""


def work_path(state_file: Path) -> Path:
    return state_file.with_name(state_file.name + WORK_SUFFIX)


def checked_tokens(tokens: object) -> float:
    """A step's tokens as reported; ValueError in one line for a report that is not a count of
    tokens (a negative, NaN, infinite or non-numeric one)."""
    if isinstance(tokens, bool) or not isinstance(tokens, (int, float)):
        raise ValueError(
            f"report_work: tokens must be a number, got {type(tokens).__name__} {tokens!r}"
        )
    if not math.isfinite(tokens) or tokens < 0:
        raise ValueError(f"report_work: tokens must be a finite number >= 0, got {tokens!r}")
    return float(tokens)


class WorkReport:
    """The loop's running total; written only under `agent run` (a state file to sit beside)."""

    def __init__(self, state_file: Path | None) -> None:
        self.path = work_path(state_file) if state_file is not None else None
        self.tokens = 0.0
        self.steps = 0
        self._written_at = -math.inf

    def add(self, tokens: object) -> None:
        self.tokens += checked_tokens(tokens)
        self.steps += 1
        now = time.monotonic()
        if self.path is None or now - self._written_at < WRITE_EVERY_S:
            return
        self._written_at = now
        body = {"tokens": self.tokens, "steps": self.steps, "time": time.time()}
        with contextlib.suppress(OSError):  # the training goes on; agent run sees no rate
            replace_atomically(self.path, json.dumps(body | {"pid": os.getpid()}))


@dataclass(frozen=True)
class Total:
    tokens: float
    time: float


class WorkFile:
    """`agent run`'s side: rate() each poll gives the tokens/s since the previous total, None
    when no new work was reported (or the file is missing or not the loop's)."""

    def __init__(self, state_file: Path) -> None:
        self.path = work_path(state_file)
        self._last: Total | None = None

    def rate(self) -> float | None:
        total = self._read()
        if total is None:
            return None
        last, self._last = self._last, total
        if last is None or total.tokens <= last.tokens or total.time <= last.time:
            return None
        return (total.tokens - last.tokens) / (total.time - last.time)

    def forget(self) -> None:
        """The next total starts afresh: the time since the last one held a pause."""
        self._last = self._read()

    def _read(self) -> Total | None:
        try:
            body = json.loads(self.path.read_text(encoding="utf-8"))
            tokens, at = body["tokens"], body["time"]
        except (OSError, ValueError, TypeError, KeyError):
            return None
        numbers = all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
            for v in (tokens, at)
        )
        return Total(float(tokens), float(at)) if numbers and tokens >= 0 else None

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)
