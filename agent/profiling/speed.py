"""Speed measurement that times computation, not graph construction.

MLX builds graphs lazily: every timed region here ends in `mx.eval`, warm-up runs first
(kernels compile on first use), and decoding goes through a real KV cache.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten, tree_map

from agent.profiling.memory import random_tokens, to_gb
from shared.stats import summarize_latencies

State = TypeVar("State")
IterationGate = Callable[[int], None]
StepPlan = Callable[[int, int], Iterable[int]]
"""(warm-up, iterations) -> the step numbers to run; by default all of them, once."""


class IterationTiming(Protocol):
    """Told around each iteration's timed region, outside it: an energy meter reads here."""

    def started(self, step: int) -> None:
        """The inputs are ready and the gate has passed: the clock starts next."""

    def stopped(self, step: int, seconds: float) -> None:
        """`mx.eval` has returned and the clock stopped after `seconds`."""


def every_step(num_warmup: int, num_iterations: int) -> range:
    return range(num_warmup + num_iterations)


def new_cache(model: nn.Module) -> list[Any]:
    """A fresh KV cache for our model or any mlx-lm model."""
    if hasattr(model, "make_cache"):
        return model.make_cache()
    from mlx_lm.models.cache import make_prompt_cache

    return make_prompt_cache(model)


def cache_state(cache: list[Any]) -> list[Any]:
    return [layer.state for layer in cache]


def copy_cache(cache: list[Any]) -> list[Any]:
    """The cache with buffers of its own: each layer copied with every array it holds copied
    into new memory (unevaluated), offsets and steps as they were. A decode writing into the
    copy finds what it would find in a freshly prefilled cache, an array nothing else holds, so
    MLX updates it in place just the same, and the original stays as it was."""
    copies = []
    for layer in cache:
        clone = copy.copy(layer)
        for name, value in vars(layer).items():
            setattr(clone, name, tree_map(_own_copy, value))
        copies.append(clone)
    return copies


def _own_copy(value: Any) -> Any:
    return mx.array(value) if isinstance(value, mx.array) else value


def cache_bytes(cache: list[Any]) -> int:
    """Bytes held by the cache's arrays."""
    return sum(
        leaf.nbytes for _, leaf in tree_flatten(cache_state(cache)) if isinstance(leaf, mx.array)
    )


@dataclass
class Measurement:
    samples: list[float] = field(default_factory=list)
    """Seconds per timed iteration."""
    peak_bytes: int = 0
    """The largest peak over the timed regions alone."""
    active_bytes: int = 0
    """What MLX held at the end of the last timed iteration."""


class SpeedProfiler:
    """The seed's speed profiler. `before_iteration` (e.g. a cooling gate) runs untimed;
    `timing` hears each timed region start and stop, untimed; `steps` may run the iterations
    for a time instead of a count (a sustained run)."""

    def __init__(
        self,
        before_iteration: IterationGate | None = None,
        timing: IterationTiming | None = None,
        steps: StepPlan = every_step,
    ):
        self.before_iteration = before_iteration
        self.timing = timing
        self.steps = steps

    def _measure(
        self,
        prepare: Callable[[], State],
        timed: Callable[[State], mx.array],
        num_warmup: int,
        num_iterations: int,
    ) -> Measurement:
        """Time `timed` alone: `prepare` (fresh inputs, a prefilled cache) and the gate run
        before the clock starts, and the peak is reset after them, so neither counts."""
        if num_iterations < 1:
            raise ValueError("num_iterations must be at least 1")
        mx.clear_cache()
        measurement = Measurement()
        for step in self.steps(num_warmup, num_iterations):
            if self.before_iteration is not None:
                self.before_iteration(step)
            state = prepare()
            mx.reset_peak_memory()
            if self.timing is not None:
                self.timing.started(step)
            start = time.perf_counter()
            output = timed(state)
            mx.eval(output)
            elapsed = time.perf_counter() - start
            if self.timing is not None:
                self.timing.stopped(step, elapsed)
            if step >= num_warmup:
                measurement.samples.append(elapsed)
                measurement.peak_bytes = max(measurement.peak_bytes, mx.get_peak_memory())
                measurement.active_bytes = mx.get_active_memory()
            del state, output
        return measurement

    def _result(self, measurement: Measurement, tokens: int) -> dict[str, Any]:
        result = summarize_latencies(measurement.samples, tokens)
        result["peak_memory_gb"] = to_gb(measurement.peak_bytes)
        result["active_memory_gb"] = to_gb(measurement.active_bytes)
        return result

    def benchmark_tokens_per_sec(
        self,
        model: nn.Module,
        seq_len: int = 1024,
        num_warmup: int = 2,
        num_iterations: int = 5,
        batch_size: int = 1,
    ) -> dict[str, Any]:
        """Prefill: the whole prompt in one evaluated forward pass."""
        tokens = random_tokens(model, batch_size, seq_len)
        mx.eval(tokens)
        measurement = self._measure(lambda: tokens, model, num_warmup, num_iterations)
        result = self._result(measurement, batch_size * seq_len)
        result.update(seq_len=seq_len, batch_size=batch_size)
        return result

    def benchmark_autoregressive(
        self,
        model: nn.Module,
        total_tokens: int = 64,
        context_len: int = 1,
        num_warmup: int = 2,
        num_iterations: int = 5,
        batch_size: int = 1,
    ) -> dict[str, Any]:
        """Decode `total_tokens` greedily, one at a time through the KV cache.

        The context of `context_len` tokens is prefilled once per cell, before any iteration;
        each iteration, warm-up included, decodes from its own copy of that cache (copy_cache),
        made and evaluated before the clock starts, so every timed region holds the same
        decoding alone and a prefill is paid once, not once per iteration. The prefilled
        original stays in memory meanwhile: its bytes are left out of the peak and active
        memory reported, which stay what a decode after one prefill holds. Steps are queued with
        `mx.async_eval` as in mlx-lm's generator; each token depends on the previous one, so the
        final `mx.eval` waits for all of them.
        """
        if total_tokens < 1:
            raise ValueError("total_tokens must be at least 1")
        context = random_tokens(model, batch_size, context_len)
        mx.eval(context)
        prefilled = new_cache(model)
        first = mx.argmax(model(context, cache=prefilled)[:, -1, :], axis=-1)
        mx.eval(first, cache_state(prefilled))

        def prefill() -> tuple[list[Any], mx.array]:
            cache = copy_cache(prefilled)
            mx.eval(cache_state(cache))
            return cache, first

        def decode(state: tuple[list[Any], mx.array]) -> mx.array:
            cache, token = state
            for _ in range(total_tokens):
                logits = model(token[:, None], cache=cache)
                token = mx.argmax(logits[:, -1, :], axis=-1)
                mx.async_eval(token)
            return token

        measurement = self._measure(prefill, decode, num_warmup, num_iterations)
        kept = cache_bytes(prefilled)
        measurement.peak_bytes -= kept
        measurement.active_bytes -= kept
        result = self._result(measurement, batch_size * total_tokens)
        # Time between two tokens of one sequence (a step yields one token per sequence), so
        # with batch B: tokens_per_sec ~= B * 1000 / mean_per_token_ms.
        result["mean_per_token_ms"] = result["latency_ms"] / total_tokens
        result.update(seq_len=context_len, batch_size=batch_size, decode_tokens=total_tokens)
        return result
