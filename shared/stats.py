"""Summary statistics of per-iteration samples: pure functions, no MLX."""

from __future__ import annotations

import statistics
from collections.abc import Sequence


def spread(values: Sequence[float]) -> dict[str, float | None]:
    """Mean, sample standard deviation (None for one sample: unknown, not zero), min, median."""
    if not values:
        raise ValueError("no samples to summarize")
    return {
        "mean": statistics.fmean(values),
        "std": statistics.stdev(values) if len(values) > 1 else None,
        "min": min(values),
        "median": statistics.median(values),
    }


def summarize_latencies(samples_s: Sequence[float], tokens_per_sample: int) -> dict[str, object]:
    """The seed's speed keys from timed samples, each token rate taken per sample.

    tokens_per_sec is the mean of the per-iteration rates (as llama-bench reports t/s),
    and its std is the spread of those rates, so `mean ± std` reads the same way for both.
    """
    latencies_ms = [s * 1000.0 for s in samples_s]
    rates = [tokens_per_sample / s for s in samples_s]
    latency = spread(latencies_ms)
    rate = spread(rates)
    return {
        "tokens_per_sec": rate["mean"],
        "std_tokens_per_sec": rate["std"],
        "latency_ms": latency["mean"],
        "std_latency_ms": latency["std"],
        "min_latency_ms": latency["min"],
        "median_latency_ms": latency["median"],
        "samples_ms": latencies_ms,
        "samples_tokens_per_sec": rates,
    }
