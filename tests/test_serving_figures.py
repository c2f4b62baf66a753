"""shared.benchmark.serving_figures: the percentile estimator against analytic distributions and
numpy, each figure of a request on hand-made timings, and goodput against an injected SLO miss
rate."""

from __future__ import annotations

import math
import random
import statistics

import pytest

from shared.benchmark.serving_figures import (
    SLO_PRESETS,
    Distribution,
    RequestTiming,
    Slo,
    percentile,
    serving_figures,
)

CONVERSATIONAL = SLO_PRESETS["conversational"]


def test_percentile_interpolates_between_the_closest_ranks() -> None:
    """Hyndman & Fan type 7: rank (n - 1) q / 100, linear between its neighbours."""
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert percentile([1.0, 2.0, 3.0, 4.0], 99) == pytest.approx(3.97)
    assert percentile([1.0, 2.0, 3.0, 4.0], 0) == 1.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 100) == 4.0
    assert percentile([7.0], 95) == 7.0
    with pytest.raises(ValueError, match="no values"):
        percentile([], 50)
    with pytest.raises(ValueError, match="outside"):
        percentile([1.0], 101)


def test_percentile_is_numpys_default() -> None:
    numpy = pytest.importorskip("numpy")
    rng = random.Random(46)
    for n in (2, 3, 10, 101, 1000):
        values = sorted(rng.expovariate(1.0) for _ in range(n))
        for q in (0, 1, 50, 95, 99, 99.9, 100):
            assert percentile(values, q) == pytest.approx(float(numpy.percentile(values, q)))


@pytest.mark.parametrize(
    ("name", "draw", "analytic_p99"),
    [
        # Normal(200, 30): p99 = 200 + 30 z(0.99); the p99's standard error at n = 10,000 is
        # 30 sqrt(0.99 * 0.01 / n) / phi(z) = 0.37, 0.14 % of it.
        (
            "normal",
            lambda rng: rng.gauss(200.0, 30.0),
            statistics.NormalDist(200.0, 30.0).inv_cdf(0.99),
        ),
        # Uniform(0, 1000): p99 = 990, standard error 1000 sqrt(0.99 * 0.01 / n) = 1.0 (0.1 %).
        ("uniform", lambda rng: rng.uniform(0.0, 1000.0), 990.0),
    ],
)
def test_p99_matches_an_analytic_distribution_within_one_percent(
    name: str, draw, analytic_p99: float
) -> None:
    rng = random.Random(f"p99-{name}")
    figure = Distribution.of([draw(rng) for _ in range(10_000)])
    assert figure is not None
    assert figure.count == 10_000
    assert figure.p99 == pytest.approx(analytic_p99, rel=0.01)


def test_a_requests_figures() -> None:
    """Sent at 10 s, first token at 10.3 s, three later tokens 50 ms apart, 4 output tokens."""
    timing = RequestTiming(
        start_s=10.0,
        first_token_s=10.3,
        later_token_s=(10.35, 10.40, 10.45),
        prompt_tokens=32,
        output_tokens=4,
    )
    assert timing.completed
    assert timing.ttft_s == pytest.approx(0.3)
    assert timing.e2e_s == pytest.approx(0.45)
    assert timing.itl_s == pytest.approx((0.05, 0.05, 0.05))
    assert timing.tpot_s == pytest.approx(0.05)


def test_the_servers_token_count_makes_tpot_right_when_a_chunk_carries_several() -> None:
    """Two chunks 90 ms apart, but the server counted 4 tokens: TPOT = 90 ms / 3, while the
    one inter-chunk gap stays what the client saw."""
    coalesced = RequestTiming(0.0, 0.1, (0.19,), output_tokens=4)
    assert coalesced.tpot_s == pytest.approx(0.03)
    assert coalesced.itl_s == pytest.approx((0.09,))
    counted_here = RequestTiming(0.0, 0.1, (0.19,))
    assert counted_here.tokens == 2
    assert counted_here.tpot_s == pytest.approx(0.09)


def test_one_token_has_no_tpot_and_meets_its_limit_vacuously() -> None:
    single = RequestTiming(0.0, 0.1, output_tokens=1)
    assert single.tpot_s is None
    assert single.itl_s == ()
    assert CONVERSATIONAL.met_by(single)


def test_timings_that_go_backwards_are_refused() -> None:
    with pytest.raises(ValueError, match="backwards"):
        RequestTiming(1.0, 0.5)
    with pytest.raises(ValueError, match="backwards"):
        RequestTiming(0.0, 0.5, (0.7, 0.6))
    with pytest.raises(ValueError, match="without a first"):
        RequestTiming(0.0, None, (0.7,))
    with pytest.raises(ValueError, match="negative"):
        RequestTiming(0.0, 0.5, output_tokens=-1)


@pytest.mark.parametrize("bad", [0.0, -1.0, math.nan, math.inf])
def test_an_slo_must_be_positive(bad: float) -> None:
    with pytest.raises(ValueError, match="TTFT SLO must be a positive"):
        Slo(ttft_ms=bad, tpot_ms=100.0)
    with pytest.raises(ValueError, match="TPOT SLO must be a positive"):
        Slo(ttft_ms=100.0, tpot_ms=bad)


def test_the_presets_are_mlperfs_llama_3_1_8b_constraints() -> None:
    assert SLO_PRESETS["conversational"] == Slo(2000.0, 100.0)
    assert SLO_PRESETS["interactive"] == Slo(500.0, 30.0)


def test_failed_requests_count_but_give_no_latency_and_are_never_good() -> None:
    timings = [
        RequestTiming(0.0, 0.1, (0.2, 0.3), output_tokens=3),
        RequestTiming(0.5, 0.6, (0.7,), output_tokens=None, error="server closed mid-stream"),
        RequestTiming(1.0, error="connection refused"),
    ]
    figures = serving_figures(timings, CONVERSATIONAL)
    assert (figures.requests, figures.completed, figures.failed) == (3, 1, 2)
    assert figures.ttft_ms is not None and figures.ttft_ms.count == 1
    assert figures.output_tokens == 3
    assert figures.good == 1
    assert figures.window_s == pytest.approx(0.7)  # the failed stream's last token counts
    assert figures.goodput == pytest.approx(1 / 0.7)


def test_no_completed_request_gives_unknowns_not_zeros() -> None:
    figures = serving_figures([RequestTiming(0.0, error="404")], CONVERSATIONAL)
    row = figures.flat()
    assert row["ttft_p99_ms"] is None
    assert row["request_tok_s_mean"] is None
    assert row["output_tok_s"] is None
    assert row["goodput"] is None
    assert row["failed"] == 1


def test_flat_names_every_figure() -> None:
    figures = serving_figures([RequestTiming(0.0, 0.1, (0.2,), output_tokens=2)], CONVERSATIONAL)
    row = figures.flat()
    for name in ("ttft", "itl", "tpot", "e2e"):
        for stat in ("mean", "p50", "p95", "p99"):
            assert isinstance(row[f"{name}_{stat}_ms"], float), (name, stat)
    assert row["output_tok_s"] == pytest.approx(2 / 0.2)
    assert row["request_tok_s_p50"] == pytest.approx(2 / 0.2)
    assert (row["slo_ttft_ms"], row["slo_tpot_ms"]) == (2000.0, 100.0)


def open_loop(rate: float, n: int, seed: str, late_share: float, late: str) -> list[RequestTiming]:
    """n requests arriving as a Poisson process at `rate` per second, each 16 tokens at 20 ms
    after a 100 ms TTFT; each with probability `late_share` is made late past the conversational
    SLO: its TTFT 2.5 s (late="ttft") or its tokens 150 ms apart (late="tpot")."""
    rng = random.Random(seed)
    timings, clock = [], 0.0
    for _ in range(n):
        clock += rng.expovariate(rate)
        is_late = rng.random() < late_share
        ttft = 2.5 if is_late and late == "ttft" else 0.1
        gap = 0.15 if is_late and late == "tpot" else 0.02
        first = clock + ttft
        later = tuple(first + gap * (i + 1) for i in range(15))
        timings.append(RequestTiming(clock, first, later, prompt_tokens=32, output_tokens=16))
    return timings


@pytest.mark.parametrize("late", ["ttft", "tpot"])
def test_goodput_is_the_share_within_the_slo_of_the_request_rate(late: str) -> None:
    """30 % of requests pushed over the SLO: goodput = 0.7 x the request rate, within three
    standard errors. good / n has variance 0.21 / n (binomial); the arrival rate read off n
    Poisson arrivals, relative variance 1 / n; goodput / rate = their product, relative variance
    0.21/0.49/n + 1/n, so its standard error is sqrt(0.7 / n) absolute."""
    rate, n = 2.0, 2000
    timings = open_loop(rate, n, seed=f"goodput-{late}", late_share=0.3, late=late)
    figures = serving_figures(timings, CONVERSATIONAL)
    injected_late = sum(not CONVERSATIONAL.met_by(t) for t in timings)
    assert figures.good == n - injected_late
    assert figures.goodput is not None
    assert figures.goodput / rate == pytest.approx(0.7, abs=3 * math.sqrt(0.7 / n))
    assert figures.goodput / figures.request_rate == pytest.approx(figures.good / n)
