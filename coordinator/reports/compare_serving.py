"""Serving cells in `coordinator compare`: each side's tail latencies and goodput beside the
tok/s the main comparison shows (its output tokens per second), averaged, unweighted, over the
cells a row groups as the main comparison averages tok/s. docs/performance.md (Serving cells)
says what each figure means."""

from __future__ import annotations

import statistics
from typing import Any

from rich.text import Text

from shared.benchmark.serving import SERVE
from shared.reports.benchmark import NA, Record
from shared.safe_text import DETAIL_CAP, shown
from shared.tables import WHOLE, WORDS, FitTable

COMPARED_FIGURES = (
    ("TTFT p99", "ttft_p99_ms", ".0f"),
    ("TPOT p99", "tpot_p99_ms", ".1f"),
    ("goodput", "goodput", ".2f"),
)
"""The figures compared: the tails MLPerf judges a server by, and goodput (req/s in the SLO)."""


def serving_side(cells: list[Record]) -> dict[str, float | None] | None:
    """The mean of each compared figure over a side's measured serving cells; None when the
    side has none."""
    served = [c for c in cells if c.get("mode") == SERVE and c.get("serving")]
    if not served:
        return None
    means: dict[str, float | None] = {}
    for _, key, _ in COMPARED_FIGURES:
        values = [
            value
            for c in served
            if (value := (c["serving"].get("figures") or {}).get(key)) is not None
        ]
        means[key] = statistics.fmean(values) if values else None
    return means


def _value(row: Record, side: str, key: str, spec: str) -> str:
    summary = row.get(side) or {}
    value = (summary.get("serving") or {}).get(key)
    return NA if value is None else f"{value:{spec}}"


def serving_comparison(rows: list[Record]) -> list[FitTable]:
    """The rows that hold a serving cell on either side, each figure A then B; nothing when
    none does."""
    served = [row for row in rows if any((row.get(s) or {}).get("serving") for s in ("a", "b"))]
    if not served:
        return []
    title = "serving: A vs B (latencies in ms, goodput in requests/s within the SLO)"
    table = FitTable(title=title, folds=("hosts",))
    table.add_column("hosts", wrap=WORDS)
    table.add_column("test", wrap=WHOLE)
    for name, _, _ in COMPARED_FIGURES:
        for side in ("A", "B"):
            table.add_column(f"{name} {side}", justify="right", wrap=WHOLE)
    for row in served:
        cells = [row["hosts"], row["test"]]
        cells += [
            _value(row, side, key, spec) for _, key, spec in COMPARED_FIGURES for side in ("a", "b")
        ]
        table.add_row(*(Text(shown(str(cell), DETAIL_CAP)) for cell in cells))
    return [table]


def with_serving(summary: dict[str, Any] | None, cells: list[Record] | None) -> None:
    """A side's summary with its `serving` figures, where it has serving cells."""
    if summary is not None and cells:
        serving = serving_side([c for c in cells if c.get("status") == "ok"])
        if serving is not None:
            summary["serving"] = serving
