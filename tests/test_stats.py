"""Summary statistics over per-iteration samples."""

from __future__ import annotations

import pytest

from shared.stats import spread, summarize_latencies


def test_spread() -> None:
    s = spread([1.0, 2.0, 3.0, 10.0])
    assert s["mean"] == 4.0
    assert s["min"] == 1.0
    assert s["median"] == 2.5
    assert s["std"] == pytest.approx(4.0824829, rel=1e-6)
    assert spread([5.0])["std"] is None  # unknown from one sample, not zero


def test_rates_are_taken_per_sample() -> None:
    result = summarize_latencies([0.1, 0.2], tokens_per_sample=100)
    assert result["samples_ms"] == pytest.approx([100.0, 200.0])
    assert result["samples_tokens_per_sec"] == pytest.approx([1000.0, 500.0])
    assert result["tokens_per_sec"] == pytest.approx(750.0)
    assert result["latency_ms"] == pytest.approx(150.0)


def test_no_samples_is_an_error() -> None:
    with pytest.raises(ValueError):
        spread([])
