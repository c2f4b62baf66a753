"""Pure aggregation: the fastest host per cell, and the speed-up between two runs."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

import pytest

from coordinator.reports.compare import (
    ReportError,
    as_fleet_report,
    compare_reports,
    comparison_text,
    parse_by,
    rich_comparison,
    side,
    speedup,
)
from coordinator.runs.store import RunStore
from shared.benchmark.aggregate import mark_fastest
from shared.benchmark.matrix import Cell
from shared.benchmark.results import cell_record
from shared.benchmark.verdict import separated
from shared.stats import summarize_latencies
from tests.test_store import failed_cell, fill_run, ok_cell


def on(host: str, record: dict[str, Any]) -> dict[str, Any]:
    return {**record, "host": host}


def fastest_of(cells: list[dict[str, Any]]) -> list[tuple[str, int]]:
    return [(c["host"], c["n_prompt"]) for c in mark_fastest(cells) if c.get("fastest")]


def test_fastest_host_per_cell() -> None:
    cells = [
        on("a", ok_cell(32, 10.0)),
        on("b", ok_cell(32, 30.0)),
        on("c", ok_cell(32, 20.0)),
        on("a", ok_cell(64, 9.0)),
        on("b", ok_cell(64, 6.0)),
    ]
    assert fastest_of(cells) == [("b", 32), ("a", 64)]
    # 9 ± 1 against 8 ± 1: the lead is inside the noise, so nobody is the fastest
    cells[-1] = on("b", ok_cell(64, 8.0))
    assert fastest_of(cells) == [("b", 32)]


def measured(host: str, samples_s: list[float]) -> dict[str, Any]:
    """A pp32 cell on `host` whose timed iterations took `samples_s` (real summarising)."""
    metrics = summarize_latencies(samples_s, 32)
    return on(host, cell_record(Cell("small", 16, 32, 0, 0, 1), metrics))


def test_a_noisy_host_is_fastest_only_beyond_its_noise() -> None:
    clean = measured("clean", [1.00, 1.01, 0.99, 1.00, 1.00])  # ~32 tok/s, tight
    noisy = measured("noisy", [0.50, 1.10, 0.60, 1.20, 0.55])  # faster on average, wide
    assert noisy["tokens_per_sec"] > clean["tokens_per_sec"]
    assert not separated(noisy, clean)
    assert fastest_of([clean, noisy]) == []
    quick = measured("noisy", [0.50, 0.52, 0.49, 0.51, 0.50])  # the same host once it settles
    assert separated(quick, clean)
    assert fastest_of([clean, quick]) == [("noisy", 32)]


def test_one_iteration_has_no_interval_and_never_wins() -> None:
    single = measured("a", [0.1])
    assert single["ci95_tokens_per_sec"] is None
    assert fastest_of([single, measured("b", [1.0, 1.01, 0.99])]) == []


def test_one_host_is_never_the_fastest() -> None:
    assert fastest_of([on("a", ok_cell(32, 10.0)), on("a", ok_cell(64, 10.0))]) == []
    # the same host twice with one cell name is still one host
    assert fastest_of([on("a", ok_cell(32, 10.0)), on("a", ok_cell(32, 11.0))]) == []


def test_failed_records_do_not_race() -> None:
    assert fastest_of([on("a", ok_cell(32, 10.0)), on("b", failed_cell(32, "OOM"))]) == []


def test_unmeasured_records_do_not_race() -> None:
    unmeasured = {**on("b", ok_cell(32, 1.0)), "tokens_per_sec": None}
    assert fastest_of([on("a", ok_cell(32, 10.0)), unmeasured]) == []
    assert fastest_of([on("a", ok_cell(32, 10.0)), unmeasured, on("c", ok_cell(32, 5.0))]) == [
        ("a", 32)
    ]


def tied_cells() -> list[dict[str, Any]]:
    """Two hosts at the same speed, the second carrying a stale mark."""
    return [on("a", ok_cell(32, 10.0)), {**on("b", ok_cell(32, 10.0)), "fastest": True}]


def test_a_tie_marks_nobody() -> None:
    marked = mark_fastest(tied_cells())
    assert [c.get("fastest") for c in marked] == [None, None]  # the stale mark is dropped


def test_marking_leaves_the_given_cells_unchanged() -> None:
    cells = tied_cells()
    mark_fastest(cells)
    assert "fastest" not in cells[0] and cells[1]["fastest"] is True
    assert "fastest" not in mark_fastest(cells)[1]


def test_marking_marked_cells_again_changes_nothing() -> None:
    marked = mark_fastest(tied_cells())
    assert mark_fastest(marked) == marked


def report(speeds: dict[str, dict[int, float | None]], tmp_path: Path) -> dict[str, Any]:
    """A report as the store gives it back: the tests compare what `coordinator compare` reads."""
    with RunStore(tmp_path / "runs.sqlite") as store:
        return store.load_report(fill_run(store, speeds))


def test_multi_host_runs_match_by_host_and_cell(tmp_path: Path) -> None:
    a = report({"mac1:5555": {32: 100.0, 64: 50.0}, "mac2:5555": {32: 200.0}}, tmp_path)
    b = report({"mac2:5555": {32: 100.0}, "mac1:5555": {32: 150.0, 128: 10.0}}, tmp_path)
    rows = compare_reports(a, b)
    assert [(r["host"], r["test"], r["speedup"], r["note"]) for r in rows] == [
        ("mac1:5555", "pp32", 1.5, ""),
        ("mac1:5555", "pp64", None, "only in A"),
        ("mac2:5555", "pp32", 0.5, ""),
        ("mac1:5555", "pp128", None, "only in B"),
    ]
    assert rows[0]["model"] == "small/f16" and rows[0]["batch"] == 1
    assert rows[0]["a"]["tokens_per_sec"] == 100.0 and rows[0]["b"]["tokens_per_sec"] == 150.0


def test_single_host_runs_match_by_cell_alone(tmp_path: Path) -> None:
    a = report({"mac1:5555": {32: 100.0, 64: 40.0}}, tmp_path)
    b = report({"mac2:5555": {32: 123.0, 64: None}}, tmp_path)
    rows = compare_reports(a, b)
    assert [(r["hosts"], r["test"], r["speedup"], r["note"]) for r in rows] == [
        ("mac1:5555 → mac2:5555", "pp32", pytest.approx(1.23), ""),
        ("mac1:5555 → mac2:5555", "pp64", None, "failed in B: boom on mac2:5555"),
    ]


def test_by_groups_cells_and_averages_them_unweighted(tmp_path: Path) -> None:
    """--by batch (the model and the host dropped) pools both hosts per test,
    as compare-llama-bench.py averages the rows its --show columns group."""
    a = report({"mac1:5555": {32: 100.0}, "mac2:5555": {32: 300.0}}, tmp_path)
    b = report({"mac1:5555": {32: 150.0}, "mac2:5555": {32: 450.0}}, tmp_path)
    (row,) = compare_reports(a, b, parse_by("batch"))
    assert (row["batch"], row["test"], row["hosts"]) == (1, "pp32", "mac1:5555, mac2:5555")
    assert row["a"]["tokens_per_sec"] == 200.0 and row["a"]["cells"] == 2
    assert row["speedup"] == 1.5
    md = comparison_text([row], "r-a", "r-b", "md").splitlines()
    assert md[1] == "| hosts | batch | test | tok/s A | tok/s B | speed-up | note |"
    assert "| 200.00 (mean of 2) | 300.00 (mean of 2) | 1.50x |" in md[3]
    by_host = compare_reports(a, b, parse_by("host"))
    assert [(r["host"], r["speedup"]) for r in by_host] == [("mac1:5555", 1.5), ("mac2:5555", 1.5)]


def test_by_names_only_known_columns() -> None:
    assert parse_by("host, model,host") == ["host", "model"]
    for bad in ("speed", "", "host,,nope"):
        with pytest.raises(ValueError, match="choose from host, hostname, device, model"):
            parse_by(bad)


def test_an_agent_bench_report_is_a_one_host_run() -> None:
    cells = [ok_cell(32, 10.0)]
    fleet = as_fleet_report({"machine": {"hostname": "mac9"}, "models": [], "cells": cells}, "x")
    assert fleet["hosts"][0]["host"] == "mac9" and fleet["cells"][0]["host"] == "mac9"
    with pytest.raises(ReportError, match="y.json is not an `agent bench`"):
        as_fleet_report({"rows": []}, "y.json")


def test_speedup_needs_two_good_measurements() -> None:
    good, slow = side([ok_cell(32, 10.0)]), side([ok_cell(32, 5.0)])
    assert speedup(good, slow) == 0.5
    assert speedup(None, good) is None and speedup(good, None) is None
    assert speedup(side([failed_cell(32, "x")]), good) is None
    assert speedup(side([{**ok_cell(32, 1.0), "tokens_per_sec": 0.0}]), good) is None


def test_formats(tmp_path: Path) -> None:
    a = report({"mac1:5555": {32: 100.0, 64: 10.0}}, tmp_path)
    b = report({"mac1:5555": {32: 123.0}}, tmp_path)
    rows = compare_reports(a, b)

    md = comparison_text(rows, "r-a", "r-b", "md").splitlines()
    assert md[0] == "<!-- A = r-a, B = r-b; speed-up = B/A tok/s -->"
    assert md[1] == "| hosts | model | batch | test | tok/s A | tok/s B | speed-up | note |"
    assert md[3] == (
        "| mac1:5555 | small/f16 | 1 | pp32 | 100.00 ± 0.50 | 123.00 ± 0.50 | 1.23x |  |"
    )
    assert md[4] == "| mac1:5555 | small/f16 | 1 | pp64 | 10.00 ± 0.50 | N/A | N/A | only in A |"

    parsed = list(csv.DictReader(io.StringIO(comparison_text(rows, "r-a", "r-b", "csv"))))
    assert [
        (r["model"], r["test"], r["avg_ts_a"], r["avg_ts_b"], r["speedup"], r["note"])
        for r in parsed
    ] == [
        ("small/f16", "pp32", "100.0", "123.0", "1.23", ""),
        ("small/f16", "pp64", "10.0", "", "", "only in A"),
    ]

    data = json.loads(comparison_text(rows, "r-a", "r-b", "json"))
    assert (data["a"], data["b"]) == ("r-a", "r-b")
    assert data["rows"][0]["speedup"] == pytest.approx(1.23)
    assert data["rows"][1]["b"] is None

    table = rich_comparison(rows, "r-a", "r-b")
    assert [column.header for column in table.columns][-2:] == ["speed-up", "note"]
    assert table.row_count == 2 and table.rows[0].style == "green" and table.rows[1].style == "dim"


def test_unknown_format() -> None:
    with pytest.raises(ValueError, match="unknown comparison format 'xml'"):
        comparison_text([], "a", "b", "xml")
