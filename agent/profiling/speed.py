"""Speed measurement that times computation, not graph construction.

MLX builds graphs lazily: every timed region here ends in `mx.eval`, warm-up runs first
(kernels compile on first use), and decoding goes through a real KV cache.

Prompt processing is what mlx-lm and llama-bench call it: the prompt goes into a KV cache in
steps of `prefill_step_size` tokens, evaluating only the cache (mlx_lm/generate.py
`generate_step`: `model(chunk, cache=...)`, `mx.eval([c.state for c in cache])`,
`mx.clear_cache()`), so no prompt position but the last is projected onto the vocabulary; the
last token's logits give the first generated token, as mlx-lm's prompt time and llama-bench's
pp (logits of the batch's last token only) include it.

A depth (tokens already in the KV cache) is filled the same way once per cell, before any
iteration; each iteration, warm-up included, starts from its own evaluated copy of that cache
(copy_cache), made before the clock starts, so every timed region holds the same work and the
depth is paid for once, not once per iteration. The filled original stays in memory meanwhile:
its bytes are left out of the peak and active memory reported, which stay what the work after
one filling holds.

A timed iteration that starts more than REWARM_GAP_S after the previous iteration ended (a
cooling pause, any stall) is preceded by one more untimed iteration (`rewarm_iterations`): on
macOS wired memory is let go after about a second idle and the next decode runs several times
slower (docs/performance.md, Re-warm after a gap). Each timed window is bracketed, outside it,
by a sleep-inclusive and a sleep-exclusive clock (agent.awake.clocks): `slept_s` is how far
they drifted apart, so a window the machine slept through is known.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Literal, Protocol

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten, tree_map

from agent.awake.clocks import SleepClocks, SleepWindow, system_clocks
from agent.profiling.arguments import check_cell, check_model, check_profiler
from agent.profiling.memory import random_tokens
from agent.profiling.units import to_gb
from shared.benchmark.matrix import DEFAULT_PREFILL_STEP
from shared.stats import precise_enough, summarize_latencies

IterationGate = Callable[[int], None]
Probe = Callable[[Callable[[], Callable[[], Any]]], dict[str, Any]]
"""Run after the timed iterations with a maker of ready ones (agent.profiling.straggler_probe)."""
StepPlan = Callable[[int, int], Iterable[int]]
"""(warm-up, iterations) -> the step numbers to run; by default all of them, once."""
REWARM_GAP_S = 1.0
"""Seconds between one iteration's end and a timed one's start past which it is re-warmed."""
SYSTEM_CLOCKS = "system"
"""SpeedProfiler's default clocks: system_clocks()."""


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
    into new memory (unevaluated), offsets and steps as they were. Work writing into the copy
    finds what it would find in a freshly filled cache, an array nothing else holds, so MLX
    updates it in place just the same, and the original stays as it was."""
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


def prefill(model: nn.Module, cache: list[Any], tokens: mx.array, step: int) -> mx.array:
    """Put `tokens` (batch x length) into `cache` as mlx-lm's generate_step does: all but the
    last token in steps of `step`, each step evaluating the cache alone; then the last token,
    whose next token (greedy) is returned unevaluated."""
    length = tokens.shape[1]
    start = 0
    while length - start > 1:
        size = min(step, length - 1 - start)
        model(tokens[:, start : start + size], cache=cache)
        mx.eval(cache_state(cache))
        start += size
        mx.clear_cache()
    return mx.argmax(model(tokens[:, start:], cache=cache)[:, -1, :], axis=-1)


@dataclass
class Depth:
    """A cell's depth, filled once: the cache holding the context, and the greedy token after
    it (None at depth 0, whose cache is empty)."""

    cache: list[Any]
    token: mx.array | None

    @classmethod
    def fill(cls, model: nn.Module, context: mx.array, step: int) -> Depth:
        """`context` (batch x depth) into a new cache in prefill steps of `step`, evaluated."""
        cache = new_cache(model)
        if not context.shape[1]:
            return cls(cache, None)
        token = prefill(model, cache, context, step)
        mx.eval(token, cache_state(cache))
        return cls(cache, token)

    @property
    def kept_bytes(self) -> int:
        """What the filled original holds while the iterations work on copies."""
        return 0 if self.token is None else cache_bytes(self.cache)

    def fresh(self, model: nn.Module) -> list[Any]:
        """A cache of the iteration's own holding the depth, evaluated."""
        if self.token is None:
            return new_cache(model)
        cache = copy_cache(self.cache)
        mx.eval(cache_state(cache))
        return cache


@dataclass
class Measurement:
    samples: list[float] = field(default_factory=list)
    """Seconds per timed iteration."""
    peak_bytes: int = 0
    """The largest peak over the timed regions alone."""
    active_bytes: int = 0
    """What MLX held at the end of the last timed iteration."""
    warmup_iterations: int = 0
    """Untimed iterations run before the first timed one."""
    rewarm_iterations: int = 0
    """Untimed iterations run after a gap of more than REWARM_GAP_S, before a timed one."""
    slept_s: float | None = None
    """Seconds the machine slept inside the timed windows; None without a clock pair."""
    sleep_clock: str | None = None
    probe: dict[str, Any] | None = None
    """What the Probe found (a group cell's straggler probe); None without one."""


class SpeedProfiler:
    """The seed's speed profiler. `before_iteration` (e.g. a cooling gate) runs untimed;
    `timing` hears each timed region start and stop, untimed; `steps` may run the iterations
    for a time instead of a count (a sustained run). `clocks` (by default this system's; None:
    slept_s unknown) watch each timed window for a sleep; `injected_sleep_s` is a simulated
    sleep (MLX_FLEET_INJECT=sleep) inside a measurement's first timed window only. With a
    `precision` (`-r auto`) a measurement's timed iterations stop at the first that brings
    the mean's 95 % half-width within that share of it (shared.stats.precise_enough), the
    iterations asked for being then the most; its record carries the `precision_target`.
    `agree` makes the choices a rank of a group would otherwise make alone (re-warm, stop
    early) the group's (agent.profiling.rank_group: rank 0's say), so every rank makes the same
    collectives. `step_delay_s` (MLX_FLEET_INJECT=step-delay) is slept at each iteration's
    start, inside its time; a `probe` runs after the timed iterations."""

    def __init__(
        self,
        before_iteration: IterationGate | None = None,
        timing: IterationTiming | None = None,
        steps: StepPlan = every_step,
        clocks: SleepClocks | Literal["system"] | None = SYSTEM_CLOCKS,
        injected_sleep_s: float = 0.0,
        precision: float | None = None,
        agree: Callable[[bool], bool] | None = None,
        slow: float = 1.0,
        step_delay_s: float = 0.0,
        probe: Probe | None = None,
    ):
        check_profiler(precision, slow, injected_sleep_s)
        self.step_delay_s, self.probe = step_delay_s, probe
        self.before_iteration = before_iteration
        self.agree = agree
        self.timing = timing
        self.steps = steps
        self.clocks = system_clocks() if isinstance(clocks, str) else clocks
        self.injected_sleep_s = injected_sleep_s
        self.slow = slow
        """MLX_FLEET_INJECT=slow's F: each iteration sleeps until it took 1/F of its time."""
        self.precision = precision
        self.rewarm_gap_s = REWARM_GAP_S
        """A gap longer than this re-warms; math.inf turns re-warming off (a bench's baseline)."""

    def measure(
        self,
        model: nn.Module,
        depth: Depth,
        timed: Callable[[list[Any]], mx.array],
        num_warmup: int,
        num_iterations: int,
    ) -> Measurement:
        """Time `timed` alone on a fresh cache holding `depth`: the cache's copy and the gate
        come before the clock starts, and the peak is reset after them, so neither counts; the
        filled original's bytes are taken out of the peak and active memory."""
        if num_iterations < 1:
            raise ValueError("num_iterations must be at least 1")
        mx.clear_cache()
        measurement = Measurement()
        window = SleepWindow(self.clocks) if self.clocks is not None else None
        inject = self.injected_sleep_s if window is not None else 0.0
        ended: float | None = None
        for step in self.steps(num_warmup, num_iterations):
            counted = step >= num_warmup
            if self.before_iteration is not None:
                self.before_iteration(step)
            cache = depth.fresh(model)
            if counted and self._agreed(
                ended is not None and time.perf_counter() - ended > self.rewarm_gap_s
            ):
                mx.eval(timed(cache))  # untimed: wakes what the gap let go of
                measurement.rewarm_iterations += 1
                cache = depth.fresh(model)
            mx.reset_peak_memory()
            if self.timing is not None:
                self.timing.started(step)
            if counted and window is not None:
                window.start()
                if inject and self.clocks is not None:
                    window.clocks = self.clocks.injecting(inject)  # this window's end only
                    inject = 0.0
            start = time.perf_counter()
            output = self._step(timed, cache)
            if self.slow < 1.0:
                time.sleep((time.perf_counter() - start) * (1.0 / self.slow - 1.0))
            elapsed = time.perf_counter() - start
            if counted and window is not None:
                window.stop()
            if self.timing is not None:
                self.timing.stopped(step, elapsed)
            ended = time.perf_counter()
            if not counted:
                measurement.warmup_iterations += 1
            else:
                measurement.samples.append(elapsed)
                measurement.peak_bytes = max(measurement.peak_bytes, mx.get_peak_memory())
                measurement.active_bytes = mx.get_active_memory()
            del cache, output
            if (
                counted
                and self.precision is not None
                and self._agreed(self._precise(measurement, num_iterations))
            ):
                break
        if self.probe is not None:
            measurement.probe = self.probe(lambda: partial(self._step, timed, depth.fresh(model)))
        if window is not None and self.clocks is not None:
            measurement.slept_s = window.slept_s
            measurement.sleep_clock = self.clocks.name
        kept = depth.kept_bytes
        measurement.peak_bytes -= kept
        measurement.active_bytes -= kept
        return measurement

    def _step(self, timed: Callable[[list[Any]], mx.array], cache: list[Any]) -> mx.array:
        """One iteration's work, evaluated, after its injected delay."""
        if self.step_delay_s:
            time.sleep(self.step_delay_s)
        output = timed(cache)
        mx.eval(output)
        return output

    def _agreed(self, flag: bool) -> bool:
        """`flag` as the group decides it; this process's own when it runs alone."""
        return flag if self.agree is None else self.agree(flag)

    def _precise(self, measurement: Measurement, most: int) -> bool:
        """Whether `-r auto` may stop: never without a precision. Iterations per second stand
        for tokens per second, the rule being scale-free."""
        if self.precision is None:
            return False
        rates = [1 / seconds for seconds in measurement.samples]
        return precise_enough(rates, self.precision, most)

    def result(self, measurement: Measurement, tokens: int) -> dict[str, Any]:
        result = summarize_latencies(measurement.samples, tokens)
        result["peak_memory_gb"] = to_gb(measurement.peak_bytes)
        result["active_memory_gb"] = to_gb(measurement.active_bytes)
        result["warmup_iterations"] = measurement.warmup_iterations
        result["rewarm_iterations"] = measurement.rewarm_iterations
        result["slept_s"] = measurement.slept_s
        result["sleep_clock"] = measurement.sleep_clock
        if self.precision is not None:
            result["precision_target"] = self.precision
        if measurement.probe is not None:
            result["probe"] = measurement.probe
        return result

    def benchmark_tokens_per_sec(
        self,
        model: nn.Module,
        seq_len: int = 1024,
        num_warmup: int = 2,
        num_iterations: int = 5,
        batch_size: int = 1,
        *,
        depth: int = 0,
        prefill_step_size: int = DEFAULT_PREFILL_STEP,
    ) -> dict[str, Any]:
        """Prompt processing (pp<seq_len>): the prompt into a KV cache already holding `depth`
        tokens, in steps of `prefill_step_size` (see prefill)."""
        check_model(model)
        check_cell(
            seq_len=seq_len, depth=depth, batch_size=batch_size, num_warmup=num_warmup,
            num_iterations=num_iterations, prefill_step_size=prefill_step_size,
        )  # fmt: skip
        filled, prompt = _after_depth(model, batch_size, depth, seq_len, prefill_step_size)
        measurement = self.measure(
            model,
            filled,
            lambda cache: prefill(model, cache, prompt, prefill_step_size),
            num_warmup,
            num_iterations,
        )
        result = self.result(measurement, batch_size * seq_len)
        result.update(seq_len=seq_len, batch_size=batch_size)
        result.update(n_depth=depth, prefill_step_size=prefill_step_size)
        return result

    def benchmark_prompt_gen(
        self,
        model: nn.Module,
        prompt_len: int,
        gen_tokens: int,
        num_warmup: int = 2,
        num_iterations: int = 5,
        batch_size: int = 1,
        *,
        depth: int = 0,
        prefill_step_size: int = DEFAULT_PREFILL_STEP,
    ) -> dict[str, Any]:
        """pp<prompt_len>+tg<gen_tokens>: the prompt processed and `gen_tokens` generated,
        timed as one figure (llama-bench's -pg: t/s counts both), after `depth` tokens."""
        check_model(model)
        check_cell(
            prompt_len=prompt_len, gen_tokens=gen_tokens, depth=depth, batch_size=batch_size,
            num_warmup=num_warmup, num_iterations=num_iterations,
            prefill_step_size=prefill_step_size,
        )  # fmt: skip
        filled, prompt = _after_depth(model, batch_size, depth, prompt_len, prefill_step_size)

        def timed(cache: list[Any]) -> mx.array:
            return decode(
                model, cache, prefill(model, cache, prompt, prefill_step_size), gen_tokens
            )

        measurement = self.measure(model, filled, timed, num_warmup, num_iterations)
        result = self.result(measurement, batch_size * (prompt_len + gen_tokens))
        result.update(seq_len=prompt_len, batch_size=batch_size, decode_tokens=gen_tokens)
        result.update(n_depth=depth, prefill_step_size=prefill_step_size)
        return result

    def benchmark_autoregressive(
        self,
        model: nn.Module,
        total_tokens: int = 64,
        context_len: int = 1,
        num_warmup: int = 2,
        num_iterations: int = 5,
        batch_size: int = 1,
        *,
        prefill_step_size: int = DEFAULT_PREFILL_STEP,
    ) -> dict[str, Any]:
        """Decode `total_tokens` greedily, one at a time through the KV cache, after a context
        of `context_len` tokens (the depth, filled once; see the module's docstring) from the
        greedy token after it; at depth 0 from one random token, as llama-bench's tg."""
        check_model(model)
        check_cell(
            total_tokens=total_tokens, context_len=context_len, batch_size=batch_size,
            num_warmup=num_warmup, num_iterations=num_iterations,
            prefill_step_size=prefill_step_size,
        )  # fmt: skip
        context = random_tokens(model, batch_size, context_len)
        mx.eval(context)
        filled = Depth.fill(model, context, prefill_step_size)
        first = filled.token
        if first is None:
            first = random_tokens(model, batch_size, 1, seed=1)[:, 0]
            mx.eval(first)
        measurement = self.measure(
            model,
            filled,
            lambda cache: decode(model, cache, first, total_tokens),
            num_warmup,
            num_iterations,
        )
        result = self.result(measurement, batch_size * total_tokens)
        # Time between two tokens of one sequence (a step yields one token per sequence), so
        # with batch B: tokens_per_sec ~= B * 1000 / mean_per_token_ms.
        result["mean_per_token_ms"] = result["latency_ms"] / total_tokens
        result.update(seq_len=context_len, batch_size=batch_size, decode_tokens=total_tokens)
        result.update(n_depth=context_len, prefill_step_size=prefill_step_size)
        return result


def _after_depth(
    model: nn.Module, batch_size: int, depth: int, length: int, step: int
) -> tuple[Depth, mx.array]:
    """Random tokens: `depth` of them filled into a cache once, and the `length` that follow
    (the prompt each iteration processes)."""
    tokens = random_tokens(model, batch_size, depth + length)
    mx.eval(tokens)
    return Depth.fill(model, tokens[:, :depth], step), tokens[:, depth:]


def decode(model: nn.Module, cache: list[Any], token: mx.array, count: int) -> mx.array:
    """`count` tokens generated greedily after `token`, the last returned unevaluated. Steps
    are queued with `mx.async_eval` as in mlx-lm's generator; each token depends on the
    previous one, so evaluating the last waits for all of them."""
    for _ in range(count):
        logits = model(token[:, None], cache=cache)
        token = mx.argmax(logits[:, -1, :], axis=-1)
        mx.async_eval(token)
    return token
