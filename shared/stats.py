"""Summary statistics of per-iteration samples: pure functions, no MLX."""

from __future__ import annotations

import math
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


_T975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip
"""Student's t, two-sided 95 %, for 1..30 degrees of freedom (any statistics table)."""


def t975(df: int) -> float:
    """Student's t quantile for a two-sided 95 % interval with `df` degrees of freedom."""
    if df < 1:
        raise ValueError("an interval needs at least two samples")
    if df <= len(_T975):
        return _T975[df - 1]
    z = 1.959964
    return z + (z**3 + z) / (4 * df)  # Cornish-Fisher: within 0.005 past df 30


def ci95_half_width(samples: Sequence[float]) -> float | None:
    """Half-width of the 95 % confidence interval of the samples' mean (None for one sample:
    unknown, not zero)."""
    if len(samples) < 2:
        return None
    return t975(len(samples) - 1) * statistics.stdev(samples) / math.sqrt(len(samples))


def rate_fields(rates: Sequence[float]) -> dict[str, object]:
    """A record's tokens_per_sec, its std, its 95 % half-width and its samples from per-pass
    rates (a serving cell's: output tokens over each pass's window); None where none came."""
    rate = spread(rates) if rates else {"mean": None, "std": None}
    return {
        "tokens_per_sec": rate["mean"],
        "std_tokens_per_sec": rate["std"],
        "ci95_tokens_per_sec": ci95_half_width(rates) if rates else None,
        "samples_tokens_per_sec": rates,
    }


MIN_AUTO_REPETITIONS = 3
"""Timed iterations `-r auto` always runs: two give an interval too wide to trust (t = 12.7)."""


def precise_enough(rates: Sequence[float], precision: float, most: int) -> bool:
    """`-r auto`'s stopping rule: stop once at least MIN_AUTO_REPETITIONS rates are in and the
    95 % half-width of their mean is at most `precision` x the mean, or once `most` are in.
    Scale-free, so iterations per second stop where tokens per second would."""
    if len(rates) >= most:
        return True
    if len(rates) < MIN_AUTO_REPETITIONS:
        return False
    half = ci95_half_width(rates)
    return half is not None and half <= precision * statistics.fmean(rates)


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
        "ci95_tokens_per_sec": ci95_half_width(rates),
        "samples_ms": latencies_ms,
        "samples_tokens_per_sec": rates,
    }
