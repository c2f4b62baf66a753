"""A serving cell's figures from its requests' timings, as the client saw each stream.

Every time is on one monotonic clock, in seconds; every figure is in milliseconds or per second.
What each figure means, and how it compares with mlx-lm's server benchmark and MLPerf's, is in
docs/performance.md (Serving cells). Pure: no clock is read here, so a test, an agent and a
stored run reach the same figures from the same timings.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

QUANTILES = (50, 95, 99)
"""The percentiles every latency figure is given at (MLPerf judges servers at the 99th)."""


def percentile(ordered: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100) of already sorted values, by linear interpolation between the
    closest ranks: Hyndman & Fan's definition 7, numpy.percentile's default ("linear") and
    mlx-lm's server_benchmark.py's `percentile`. With n values the percentile sits at rank
    h = (n - 1) q / 100 (0-based), between ordered[floor h] and the next."""
    if not ordered:
        raise ValueError("no values to take a percentile of")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile {q} is outside 0-100")
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (rank - low) * (ordered[high] - ordered[low])


@dataclass(frozen=True)
class Distribution:
    """How one figure spread over a cell: its count, mean and QUANTILES."""

    count: int
    mean: float
    p50: float
    p95: float
    p99: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Distribution | None:
        """None for no values: an unknown, not a zero."""
        if not values:
            return None
        ordered = sorted(values)
        p50, p95, p99 = (percentile(ordered, q) for q in QUANTILES)
        return cls(len(ordered), statistics.fmean(ordered), p50, p95, p99)


@dataclass(frozen=True)
class RequestTiming:
    """One request as its client saw it: when it was sent, when its first token arrived, when
    each later token arrived, how many prompt and output tokens the server counted (None when it
    did not say), the error that ended it (None when it completed), and how many of its prompt's
    tokens the server found cached.

    A streamed chunk is a token event: on mlx_lm.server each chunk carries one token's text,
    unless its detokenizer held text back (then one chunk carries several). `output_tokens`
    from the server's usage counts them right; without it the events are counted."""

    start_s: float
    first_token_s: float | None = None
    later_token_s: tuple[float, ...] = ()
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    error: str | None = None
    cached_tokens: int | None = None
    """Of the prompt's tokens, those the server said it found in its prompt cache."""

    def __post_init__(self) -> None:
        if self.first_token_s is None and self.later_token_s:
            raise ValueError("later tokens without a first token")
        times = [self.start_s]
        if self.first_token_s is not None:
            times.append(self.first_token_s)
        times.extend(self.later_token_s)
        if any(b < a for a, b in zip(times, times[1:], strict=False)):
            raise ValueError("token times go backwards (or come before the request)")
        for name in ("prompt_tokens", "output_tokens", "cached_tokens"):
            count = getattr(self, name)
            if count is not None and count < 0:
                raise ValueError(f"{name} {count} is negative")

    @property
    def completed(self) -> bool:
        """The stream ended normally with at least one token."""
        return self.error is None and self.first_token_s is not None

    @property
    def tokens(self) -> int:
        """Output tokens: the server's count where it gave one, else the token events seen."""
        if self.output_tokens is not None:
            return self.output_tokens
        return 0 if self.first_token_s is None else 1 + len(self.later_token_s)

    @property
    def ttft_s(self) -> float | None:
        """Time to first token: from sending the request to its first token's arrival."""
        return None if self.first_token_s is None else self.first_token_s - self.start_s

    @property
    def e2e_s(self) -> float | None:
        """End-to-end latency: from sending the request to its last token's arrival."""
        if self.first_token_s is None:
            return None
        last = self.later_token_s[-1] if self.later_token_s else self.first_token_s
        return last - self.start_s

    @property
    def itl_s(self) -> tuple[float, ...]:
        """Inter-token latencies: the gaps between consecutive token events."""
        if self.first_token_s is None:
            return ()
        times = (self.first_token_s, *self.later_token_s)
        return tuple(b - a for a, b in zip(times, times[1:], strict=False))

    @property
    def tpot_s(self) -> float | None:
        """Time per output token after the first: (e2e - TTFT) / (tokens - 1); None below two
        tokens (there is no later token to time)."""
        e2e, ttft = self.e2e_s, self.ttft_s
        if e2e is None or ttft is None or self.tokens < 2:
            return None
        return (e2e - ttft) / (self.tokens - 1)


@dataclass(frozen=True)
class Slo:
    """A service level a request meets or misses: its TTFT and its TPOT, each at most this."""

    ttft_ms: float
    tpot_ms: float

    def __post_init__(self) -> None:
        for name, value in (("TTFT", self.ttft_ms), ("TPOT", self.tpot_ms)):
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"the {name} SLO must be a positive number of ms, not {value}")

    def met_by(self, timing: RequestTiming) -> bool:
        """A completed request within both limits. One with a single output token has no TPOT
        and meets that limit vacuously, as vLLM's benchmark_serving.py --goodput counts it."""
        ttft, tpot = timing.ttft_s, timing.tpot_s
        if not timing.completed or ttft is None or ttft * 1000 > self.ttft_ms:
            return False
        return tpot is None or tpot * 1000 <= self.tpot_ms


SLO_PRESETS = {
    "conversational": Slo(ttft_ms=2000.0, tpot_ms=100.0),
    "interactive": Slo(ttft_ms=500.0, tpot_ms=30.0),
}
"""MLPerf Inference's latency constraints for its Llama3.1-8B summarization task, datacenter
suite: the "conversational" (Server) and "interactive" categories (mlcommons/inference_policies,
inference_rules.adoc, the benchmarks table; MLPerf requires them at the 99th percentile)."""
DEFAULT_SLO = "conversational"


@dataclass(frozen=True)
class ServingFigures:
    """A serving cell's figures. The window runs from the first request's sending to the last
    token of any request: every rate is over it. Latencies are in ms, rates per second; a
    figure no request could give is None."""

    requests: int
    completed: int
    failed: int
    window_s: float | None
    output_tokens: int
    output_tok_s: float | None
    request_rate: float | None
    ttft_ms: Distribution | None
    itl_ms: Distribution | None
    tpot_ms: Distribution | None
    e2e_ms: Distribution | None
    request_tok_s: Distribution | None
    slo: Slo
    good: int
    goodput: float | None

    def flat(self) -> dict[str, Any]:
        """One column per figure (`ttft_p99_ms`, `request_tok_s_mean`, ...), for the formats
        whose rows are flat; an unknown is None."""
        row: dict[str, Any] = {
            "requests": self.requests,
            "completed": self.completed,
            "failed": self.failed,
            "window_s": self.window_s,
            "output_tokens": self.output_tokens,
            "output_tok_s": self.output_tok_s,
            "request_rate": self.request_rate,
            "slo_ttft_ms": self.slo.ttft_ms,
            "slo_tpot_ms": self.slo.tpot_ms,
            "good": self.good,
            "goodput": self.goodput,
        }
        for name, unit in (("ttft", "_ms"), ("itl", "_ms"), ("tpot", "_ms"), ("e2e", "_ms")):
            row.update(_columns(name, unit, getattr(self, f"{name}_ms")))
        row.update(_columns("request_tok_s", "", self.request_tok_s))
        return row


def _columns(name: str, unit: str, figure: Distribution | None) -> dict[str, float | None]:
    stats = ("mean", *(f"p{q}" for q in QUANTILES))
    return {
        f"{name}_{stat}{unit}": None if figure is None else getattr(figure, stat) for stat in stats
    }


def serving_figures(timings: Sequence[RequestTiming], slo: Slo) -> ServingFigures:
    """The figures of a cell's requests. ITL pools every gap of every request (as vLLM's
    benchmark_serving.py does), so a long answer weighs in per token; TPOT, TTFT and e2e are one
    value per completed request; per-request tok/s is output tokens / e2e latency."""
    done = [t for t in timings if t.completed]
    window = _window_s(timings)
    output = sum(t.tokens for t in done)
    good = sum(slo.met_by(t) for t in done)

    def per_second(count: int) -> float | None:
        return None if window is None else count / window

    def ms(values: Sequence[float | None]) -> Distribution | None:
        return Distribution.of([v * 1000 for v in values if v is not None])

    return ServingFigures(
        requests=len(timings),
        completed=len(done),
        failed=len(timings) - len(done),
        window_s=window,
        output_tokens=output,
        output_tok_s=per_second(output),
        request_rate=per_second(len(done)),
        ttft_ms=ms([t.ttft_s for t in done]),
        itl_ms=ms([gap for t in done for gap in t.itl_s]),
        tpot_ms=ms([t.tpot_s for t in done]),
        e2e_ms=ms([t.e2e_s for t in done]),
        request_tok_s=Distribution.of(
            [t.tokens / e2e for t in done if (e2e := t.e2e_s) is not None and e2e > 0]
        ),
        slo=slo,
        good=good,
        goodput=per_second(good),
    )


def _window_s(timings: Sequence[RequestTiming]) -> float | None:
    """From the first request sent to the last token received; None with no token, or a
    window of no length (no rate can be taken over it)."""
    ends = [e2e + t.start_s for t in timings if (e2e := t.e2e_s) is not None]
    if not ends:
        return None
    window = max(ends) - min(t.start_s for t in timings)
    return window if window > 0 else None
