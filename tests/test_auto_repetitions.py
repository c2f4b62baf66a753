"""`-r auto`: the stopping rule fed sequences of rates, the options and the wire field checked as
a user and a peer meet them, and one real `agent bench -r auto` whose record is consistent."""

from __future__ import annotations

import json
import math
import threading

import pytest
import zmq

from coordinator.hosts.link import Settings, Target
from coordinator.runs.driver import HostDriver, HostEvent
from shared.benchmark.matrix import (
    DEFAULT_COOL_START_S,
    DEFAULT_MAX_REPETITIONS,
    Cell,
    MatrixError,
    MatrixSpec,
)
from shared.benchmark.progress import ProgressClock
from shared.benchmark.results import cell_record
from shared.benchmark.verdict import NOISY, NOISY_SHARE, interval, is_noisy
from shared.io.options import MatrixOptions, parse_precision
from shared.stats import (
    MIN_AUTO_REPETITIONS,
    ci95_half_width,
    precise_enough,
    summarize_latencies,
)
from tests.conftest import refusal, run_cli


def stops_after(rates: list[float], precision: float, most: int) -> int:
    """How many of `rates` a cell under -r auto times before the rule stops it."""
    for count in range(1, len(rates) + 1):
        if precise_enough(rates[:count], precision, most):
            return count
    raise AssertionError("the rule never stopped")


# --- the stopping rule --------------------------------------------------------------------------


def test_steady_rates_stop_at_the_minimum() -> None:
    assert stops_after([100.0, 100.5, 99.5, 100.0, 100.0], 0.05, 50) == MIN_AUTO_REPETITIONS


def test_two_rates_never_stop_however_close() -> None:
    assert not precise_enough([100.0, 100.0], 0.05, 50)


def test_noisy_rates_run_on_until_the_interval_narrows() -> None:
    rates = [100.0, 80.0, 120.0] + [100.0] * 20
    count = stops_after(rates, 0.05, 50)
    assert MIN_AUTO_REPETITIONS < count < len(rates)
    half = ci95_half_width(rates[:count])
    assert half is not None and half <= 0.05 * sum(rates[:count]) / count
    assert not precise_enough(rates[: count - 1], 0.05, 50)


def test_the_maximum_stops_a_cell_short_of_its_precision() -> None:
    rates = [50.0, 150.0] * 10
    assert stops_after(rates, 0.05, 6) == 6
    half = ci95_half_width(rates[:6])
    assert half is not None and half > 0.05 * 100.0


def test_a_tighter_precision_needs_more_rates() -> None:
    rates = [100.0, 97.0, 103.0, 99.0, 101.0, 98.0, 102.0] * 4
    assert stops_after(rates, 0.05, 50) < stops_after(rates, 0.01, 50)


def test_the_rule_is_scale_free() -> None:
    """Iterations per second (what the profiler feeds it) stop where tokens per second would."""
    rates = [100.0, 80.0, 120.0, 95.0, 105.0, 100.0, 100.0, 101.0, 99.0] * 2
    assert stops_after(rates, 0.05, 50) == stops_after([r / 512 for r in rates], 0.05, 50)


# --- options and the matrix ---------------------------------------------------------------------


@pytest.mark.parametrize(("text", "share"), [("0.02", 0.02), ("2%", 0.02), (" 5 % ", 0.05)])
def test_a_precision_is_a_share_or_a_percentage(text: str, share: float) -> None:
    assert math.isclose(parse_precision(text), share)


def test_auto_defaults_to_the_noisy_share_and_the_documented_maximum() -> None:
    spec = MatrixOptions(repetitions="auto", config_small=True).spec()
    assert spec.precision == NOISY_SHARE and spec.iterations == DEFAULT_MAX_REPETITIONS
    spec = MatrixOptions(
        repetitions="auto", precision="2%", max_repetitions=6, config_small=True
    ).spec()
    assert math.isclose(spec.precision or 0.0, 0.02) and spec.iterations == 6


def test_a_count_keeps_its_meaning() -> None:
    spec = MatrixOptions(repetitions="7", config_small=True).spec()
    assert spec.iterations == 7 and spec.precision is None
    plain = MatrixSpec(models=("small",), cool_start_s=DEFAULT_COOL_START_S)
    assert MatrixOptions(config_small=True).spec() == plain


def test_the_precision_travels_in_the_spec() -> None:
    spec = MatrixSpec(models=("small",), iterations=6, precision=0.02)
    assert spec.to_dict()["precision"] == 0.02
    assert MatrixSpec.from_dict(spec.to_dict()) == spec
    assert "precision" not in MatrixSpec(models=("small",)).to_dict()  # as before -r auto


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"precision": 0}, "precision: 0 must be above 0 and below 1"),
        ({"precision": 1.5}, "precision: 1.5 must be above 0 and below 1"),
        ({"precision": float("nan")}, "precision: nan is not a number"),
        ({"precision": True}, "precision: True is not a number"),
        ({"precision": "2%"}, "precision: '2%' is not a number"),
        ({"precision": 0.05, "iterations": 2}, "iterations: 2 must be at least 3 with a precision"),
    ],
)
def test_an_agent_refuses_a_bad_precision_from_a_peer(
    fields: dict[str, object], message: str
) -> None:
    with pytest.raises(MatrixError) as caught:
        MatrixSpec.from_dict({"models": ["small"], **fields})
    assert str(caught.value).startswith(message)


def test_a_coordinator_waits_for_a_cell_that_may_run_to_the_maximum() -> None:
    fixed = ProgressClock(10.0, since=0.0)
    auto = ProgressClock(10.0, since=0.0, spread=50 / MIN_AUTO_REPETITIONS)
    for clock in (fixed, auto):
        clock.progressed(2.0, [("m", 1.0)])
    assert auto.allowance("m", 1.0) - 10.0 == pytest.approx(
        (fixed.allowance("m", 1.0) - 10.0) * 50 / 3
    )


@pytest.mark.parametrize(("precision", "noisy"), [(None, True), (0.5, False)])
def test_a_coordinator_judges_by_its_jobs_precision_not_the_agents(
    precision: float | None, noisy: bool
) -> None:
    """An agent claiming a loose precision_target gets the job's instead, before the verdict."""
    samples = [0.010, 0.012, 0.014]  # a half-width of about 42 % of the mean
    metrics = summarize_latencies(samples, 16) | {"warmup_iterations": 1}
    record = cell_record(Cell("small", 16, 16, 0, 0, 1), metrics | {"precision_target": 0.9})
    assert record["verdict_reasons"] == []  # as the agent judged it
    spec = MatrixSpec(models=("small",), iterations=6, precision=precision).to_dict()
    events: list[HostEvent] = []
    ctx = zmq.Context()
    try:
        driver = HostDriver(
            ctx, Target("h", "127.0.0.1:1", None), spec, Settings(None), events.append,
            threading.Event(),
        )  # fmt: skip
        assert driver._cell(0, record)
    finally:
        ctx.term()
    assert record["precision_target"] == precision
    assert (NOISY in record["verdict_reasons"]) == noisy
    assert events[0].data["record"] is record


# --- the command line ---------------------------------------------------------------------------


BAD = [
    (["-r", "0"], "--repetitions: 0 must be at least 1"),
    (["-r", "abc"], "--repetitions: 'abc' is not a whole number or auto"),
    (["-r", "auto", "--precision", "0"], "--precision must be above 0 and below 1"),
    (["-r", "auto", "--precision", "nan"], "--precision must be above 0 and below 1"),
    (["-r", "auto", "--precision", "1.5"], "--precision must be above 0 and below 1"),
    (["-r", "auto", "--precision", "100%"], "--precision must be above 0 and below 1"),
    (["-r", "auto", "--precision", "fast"], "--precision: 'fast' is not a share"),
    (["-r", "auto", "--max-repetitions", "2"], "--max-repetitions must be 3 to 1000"),
    (["--precision", "2%"], "--precision applies to -r auto only"),
    (["-r", "5", "--max-repetitions", "9"], "--max-repetitions applies to -r auto only"),
    (["-r", "auto", "--sustain", "30s"], "-r auto and --sustain conflict"),
]


@pytest.mark.parametrize("command", [["agent", "bench"], ["coordinator", "benchmark"]])
@pytest.mark.parametrize(("args", "needle"), BAD)
def test_bad_repetitions_are_one_line_and_exit_2(
    command: list[str], args: list[str], needle: str
) -> None:
    assert needle in refusal(*command, "--config-small", *args)


def test_help_documents_auto() -> None:
    text = run_cli("agent", "bench", "--help").stdout
    for words in ("--precision", "--max-repetitions", f"default: {DEFAULT_MAX_REPETITIONS}"):
        assert words in text


@pytest.mark.slow
def test_a_real_auto_run_is_consistent() -> None:
    """Consistency only: this machine is noisy, so whether a cell is valid is not asserted."""
    result = run_cli(
        "agent", "bench", "--config-small", "-p", "16", "-n", "4",
        "-r", "auto", "--max-repetitions", "6", "-o", "json",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["spec"]["precision"] == NOISY_SHARE and report["spec"]["iterations"] == 6
    assert [cell["test"] for cell in report["cells"]] == ["pp16", "tg4"]
    for cell in report["cells"]:
        rates = cell["samples_tokens_per_sec"]
        assert MIN_AUTO_REPETITIONS <= len(rates) <= 6
        assert cell["precision_target"] == NOISY_SHARE
        low, high = interval(cell) or (math.nan, math.nan)
        half = (high - low) / 2
        assert half == pytest.approx(ci95_half_width(rates))
        noisy = half > NOISY_SHARE * cell["tokens_per_sec"]
        assert is_noisy(cell) == noisy and (NOISY in cell["verdict_reasons"]) == noisy
        if len(rates) < 6:  # stopped early: it reached its precision
            assert not noisy


def _cell(reasons: list[str], target: float | None, samples: int = 5) -> dict:
    return {
        "status": "ok",
        "verdict": "invalid" if reasons else "valid",
        "verdict_reasons": reasons,
        "precision_target": target,
        "samples_ms": [10.0] * samples,
    }


def test_auto_tables_show_the_repetitions_each_cell_took() -> None:
    """Issue 42: -r auto tables did not show how many repetitions each cell took."""
    from shared.reports.benchmark import columns_for

    fixed = [name for name, _ in columns_for([_cell([], None)])]
    assert "reps" not in fixed
    auto = dict(columns_for([_cell([], 0.05, samples=7)]))
    assert auto["reps"](_cell([], 0.05, samples=7)) == "7"
    assert auto["reps"]({"status": "failed"}) == "N/A"


@pytest.mark.parametrize(
    ("cells", "said"),
    [
        ([_cell([], None)], None),
        ([_cell(["noisy"], None), _cell([], None)], "1 of 2 cells are invalid: noisy"),
        ([_cell(["cold", "noisy"], None)], "`-r auto` repeats each cell until"),
        ([_cell(["noisy"], 0.05)], "raise --max-repetitions"),
    ],
    ids=["none", "count", "fixed", "auto"],
)
def test_noisy_cells_point_to_r_auto(cells: list[dict], said: str | None) -> None:
    """Issue 42: most cells of a quick run were `invalid: noisy` with no hint toward -r auto."""
    from shared.benchmark.verdict import noisy_hint

    hint = noisy_hint(cells)
    assert (hint is None) if said is None else (hint is not None and said in hint)
