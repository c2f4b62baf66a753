"""The documented maxima of every duration and count the CLIs and the wire take (README, Bounds;
docs/protocol.md §5, Limits), and the pure checks that refuse a value past them in one line
naming the option, the value and the bound. Pure: constants and functions, no I/O.

A bound keeps a typo (`--sustain 100000h`, `--connect-timeout 1e9`) from becoming work that
outlives everyone who asked for it, or a number too large for a poll's timeout.
"""

from __future__ import annotations

import math
from typing import Any

MINUTE = 60.0
HOUR = 3600.0
DAY = 24 * HOUR

# --- durations (seconds) -------------------------------------------------------------------------
MAX_SUSTAIN_S = DAY
"""--sustain: each cell for at most a day."""
MAX_SUSTAIN_WINDOW_S = HOUR
"""--sustain-window."""
MAX_DELAY_S = HOUR
"""--delay between two cells."""
MAX_COOL_START_S = HOUR
"""--cool-start-limit: the most a cell waits to cool before it runs."""
MAX_CONNECT_TIMEOUT_S = HOUR
"""--connect-timeout."""
MAX_HOST_TIMEOUT_S = DAY
"""--host-timeout: how long a silent host is given to come back."""
MAX_IDLE_BASELINE_S = HOUR
"""--idle-baseline."""
MAX_POLL_INTERVAL_S = HOUR
"""--poll-interval (and `agent temp`'s, `agent serve`'s)."""
MAX_LOAD_S = HOUR
"""`agent doctor --load`."""
MAX_CAPTURE_S = DAY
"""`agent doctor --capture --seconds`."""
MAX_CALIBRATE_MINUTES = 600.0
"""`agent calibrate --minutes` (and `coordinator calibrate`'s, a `calibrate.start`'s): ten
hours, past any Mac's time to throttle and a hold after it."""
MAX_GRACE_S = HOUR
"""`agent run --grace`."""
MAX_THROTTLE_WINDOW_S = DAY
"""`agent run --throttle-window`."""
MAX_RETENTION_DAYS = 3650.0
"""--retention-days: ten years."""

# --- counts --------------------------------------------------------------------------------------
MAX_CELLS = 1024
"""Cells per job, after duplicates are dropped; also the most entries in any matrix list."""
MAX_SEQ_LEN = 1_048_576
"""Tokens of a prompt, a depth, or a prefill step."""
MAX_BATCH_SIZE = 1024
MAX_CELL_TOKENS = 4_194_304
"""Tokens one iteration of a cell holds: batch x (depth + prompt + generated)."""
MAX_ITERATIONS = 1000
"""-r, and --max-repetitions."""
MAX_WARMUP = 100
"""-w."""
MAX_DECODE_TOKENS = 8192
"""A generation length (-n, -pg's second)."""
MAX_RUNS_LIMIT = 100_000
"""`coordinator runs --limit`."""
MAX_COUNT = 1_000_000
"""Any other count (`agent temp --count`)."""
MAX_PID = 4_194_304
"""A process id (`agent serve --parent-pid`): Linux's PID_MAX_LIMIT, above macOS's 99,999."""

# --- the agent's own bound on a job ---------------------------------------------------------------
JOB_SLACK = 2.0
"""A job's bound is this many times what its spec plans, plus JOB_SLACK_S: generous, so only a job
that is truly stuck (or asked for absurd work) is ended."""
JOB_SLACK_S = 30 * MINUTE
MAX_ITERATION_S = 10 * MINUTE
"""What one iteration (or model build) of a cell may take at the very most, for a job's bound."""
MAX_JOB_S = 7 * DAY
"""No job runs longer than this, whatever its spec."""


class BoundError(ValueError):
    """A value outside its bound; the message names the option, the value and the bound."""


def duration_text(seconds: float) -> str:
    """3600 -> '1h', 90 -> '90s', 86400 -> '24h', 604800 -> '7d': how a bound is said."""
    if seconds > DAY and seconds % DAY == 0:
        return f"{seconds / DAY:g}d"
    if seconds >= HOUR and seconds % HOUR == 0:
        return f"{seconds / HOUR:g}h"
    if seconds >= MINUTE and seconds % MINUTE == 0:
        return f"{seconds / MINUTE:g}m"
    return f"{seconds:g}s"


class NotFinite(ValueError):
    """No finite number; the message is what was wanted (`a number`, `a finite number`), for
    the caller's own sentence around it."""


def finite_float(value: str | float) -> float:
    """Text or a number as a finite float: NotFinite("a number") for text that is none,
    NotFinite("a finite number") for nan, inf or an int past a float's range."""
    try:
        number = float(value)
    except ValueError:
        raise NotFinite("a number") from None
    except OverflowError:
        raise NotFinite("a finite number") from None
    if not math.isfinite(number):
        raise NotFinite("a finite number")
    return number


def finite(name: str, value: Any) -> float:
    """`value` as a float, or BoundError: `NAME must be a finite number, got nan`."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BoundError(f"{name} must be a number, got {value!r}")
    try:
        return finite_float(value)
    except NotFinite as exc:
        raise BoundError(f"{name} must be {exc}, got {value}") from None


def check_seconds(
    name: str,
    value: Any,
    most: float,
    *,
    least: float = 0.0,
    above_least: bool = False,
    shown: str | None = None,
) -> float:
    """`value` seconds when finite, >= `least` (> with `above_least`) and <= `most`; BoundError
    naming `name`, the value (`shown` when given: the text typed, as `100000h`) and the bound."""
    number = finite(name, value)
    said = shown if shown is not None else f"{number:g}"
    if number < least or (above_least and number == least):
        floor = f"> {least:g}" if above_least else f">= {least:g}"
        raise BoundError(f"{name} must be {floor} seconds, got {said}")
    if number > most:
        raise BoundError(f"{name} must be at most {duration_text(most)} ({most:g} s), got {said}")
    return number


def check_count(name: str, value: Any, least: int, most: int) -> int:
    """An integer `least`..`most`, or BoundError naming `name`, the value and the bound."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise BoundError(f"{name} must be a whole number, got {value!r}")
    if value < least:
        raise BoundError(f"{name} must be at least {least}, got {value}")
    if value > most:
        raise BoundError(f"{name} must be at most {most}, got {value}")
    return value


def job_bound_s(
    cells: int,
    warmup: int,
    iterations: int,
    delay_s: float = 0.0,
    cool_start_s: float = 0.0,
    sustain_s: float | None = None,
    baseline_s: float = 0.0,
) -> float:
    """The longest a job may run before its agent ends it: per cell, a model build and its
    untimed and timed iterations at MAX_ITERATION_S each (or its sustained duration plus one
    such iteration), its delay and its cool-start wait; the idle baseline once; all of it
    JOB_SLACK times over plus JOB_SLACK_S, and never past MAX_JOB_S."""
    if sustain_s is not None:
        per_cell = sustain_s + 2 * MAX_ITERATION_S
    else:
        per_cell = (1 + warmup + iterations) * MAX_ITERATION_S
    per_cell += delay_s + cool_start_s
    planned = max(cells, 1) * per_cell + baseline_s
    return min(MAX_JOB_S, JOB_SLACK * planned + JOB_SLACK_S)
