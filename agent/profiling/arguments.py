"""The Python API's arguments (README, Python API), each refused with its own one line before
MLX sees it, every size bounded as a matrix's cell is (shared.bounds): issue 42 found a 0-token
prompt giving MLX's reshape error, 10**9 tokens running until killed, and a profiler's NaN
precision or zero slowdown accepted or a ZeroDivisionError."""

from __future__ import annotations

import math
from typing import Any

import mlx.nn as nn

from shared.bounds import (
    MAX_BATCH_SIZE,
    MAX_CELL_TOKENS,
    MAX_DECODE_TOKENS,
    MAX_ITERATIONS,
    MAX_SEQ_LEN,
    MAX_WARMUP,
    BoundError,
    check_count,
)

CELL_BOUNDS = {
    "seq_len": (1, MAX_SEQ_LEN),
    "prompt_len": (1, MAX_SEQ_LEN),
    "context_len": (0, MAX_SEQ_LEN),
    "depth": (0, MAX_SEQ_LEN),
    "gen_tokens": (1, MAX_DECODE_TOKENS),
    "total_tokens": (1, MAX_DECODE_TOKENS),
    "batch_size": (1, MAX_BATCH_SIZE),
    "num_warmup": (0, MAX_WARMUP),
    "num_iterations": (1, MAX_ITERATIONS),
    "prefill_step_size": (1, MAX_SEQ_LEN),
}
"""Each argument of the Python API's benchmarks, bounded as a matrix's cell is (shared.bounds):
refused with its own name before MLX sees it (a 0-token prompt was MLX's reshape error, 10**9
tokens ran until killed)."""


def check_cell(**arguments: int) -> None:
    """ValueError naming the first argument out of its CELL_BOUNDS, or a cell whose tokens per
    iteration (batch x every token it holds) pass MAX_CELL_TOKENS."""
    for name, value in arguments.items():
        least, most = CELL_BOUNDS[name]
        check_count(name, value, least, most)
    held = sum(value for name, value in arguments.items() if name in TOKEN_ARGUMENTS)
    tokens = arguments.get("batch_size", 1) * held
    if tokens > MAX_CELL_TOKENS:
        raise BoundError(
            f"batch_size x tokens is {tokens}, past the {MAX_CELL_TOKENS} tokens one cell may hold"
        )


TOKEN_ARGUMENTS = ("seq_len", "prompt_len", "context_len", "depth", "gen_tokens", "total_tokens")


MOST_INJECTED_SLEEP_S = 1e6
"""As MLX_FLEET_INJECT's sleep (shared.benchmark.faults)."""


def check_model(model: Any) -> None:
    """TypeError unless `model` is an MLX model (mlx.nn.Module: build_model's, or mlx-lm's)."""
    if not isinstance(model, nn.Module):
        raise TypeError(
            f"model must be an MLX model (mlx.nn.Module, e.g. build_model's), got "
            f"{type(model).__name__}"
        )


def check_profiler(precision: Any, slow: Any, injected_sleep_s: Any) -> None:
    """SpeedProfiler's settings: `precision` None or a share of the mean above 0 and below 1,
    `slow` above 0 and at most 1, `injected_sleep_s` 0 or more; each finite."""
    if precision is not None and not _number_in(precision, 0.0, 1.0, closed=False):
        raise ValueError(
            f"precision must be None or a number above 0 and below 1, got {precision!r}"
        )
    if not _number_in(slow, 0.0, 1.0, closed=True):
        raise ValueError(f"slow must be a number above 0 and at most 1, got {slow!r}")
    if not _number_in(injected_sleep_s, 0.0, MOST_INJECTED_SLEEP_S, closed=True, least_too=True):
        raise ValueError(
            f"injected_sleep_s must be a number of seconds from 0 to {MOST_INJECTED_SLEEP_S:g}, "
            f"got {injected_sleep_s!r}"
        )


def _number_in(
    value: Any, least: float, most: float, *, closed: bool, least_too: bool = False
) -> bool:
    """A finite int or float (no bool) above `least` (or at it, `least_too`) and below `most`
    (or at it, `closed`)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return False
    above = value >= least if least_too else value > least
    below = value <= most if closed else value < most
    return above and below
