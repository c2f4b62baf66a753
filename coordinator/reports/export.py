"""Stored runs as llama-bench's rows (`coordinator export`): several runs into one database or
one file, each run under its label, for llama.cpp's compare-llama-bench.py (README, Comparing
with llama.cpp's script)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from shared.reports.benchmark import (
    LINE_FIELDS,
    bench_rows,
    flat_rows,
    llama_json_rows,
    measured,
    to_jsonl,
    to_sql,
)
from shared.reports.llama_bench import label_lengths_problem
from shared.reports.rows import rows_csv, strict_json

SQLITE = "llama-bench-sqlite"
EXPORT_FORMATS = (SQLITE, "sql", "csv", "jsonl", "llama-json", "json")
"""llama-bench-sqlite writes a database file (`sql` into it); the others print llama-bench's
formats as `agent bench -o` does, and json the runs' reports (one array)."""

Labelled = Sequence[tuple[dict[str, Any], str | None]]
"""Each run's report with its label (None: each host's MLX version)."""


class ExportError(ValueError):
    """Runs or labels that cannot be exported together (the message says why)."""


def labels_for(run_ids: Sequence[str], labels: Sequence[str]) -> list[str | None]:
    """One label per run: none given (each host's MLX version), one for all, or one each."""
    if not labels:
        return [None] * len(run_ids)
    if len(labels) == 1:
        return [labels[0]] * len(run_ids)
    if len(labels) != len(run_ids):
        raise ExportError(
            f"{len(labels)} --label for {len(run_ids)} runs: give one label for all, or one "
            "per run in the order of the runs"
        )
    return list(labels)


def build_labels(runs: Labelled) -> list[str]:
    """Every build_commit the runs' rows will hold."""
    return sorted(
        {row["build_commit"] for report, label in runs for row in bench_rows(report, label)}
    )


def check_lengths(labels: Sequence[str], existing: Sequence[str] = ()) -> None:
    """ExportError where the labels (with those already in the database) differ in length."""
    problem = label_lengths_problem([*existing, *labels])
    if problem is not None:
        where = " (with those already in the database)" if existing else ""
        raise ExportError(problem + where)


def export_text(runs: Labelled, fmt: str) -> str:
    """The runs in one of EXPORT_FORMATS but the database: sql's statements, one csv (one
    header), jsonl lines, or one llama-json array."""
    if fmt in ("sql", SQLITE):
        return "".join(to_sql(report, label) for report, label in runs)
    if fmt == "jsonl":
        return "".join(to_jsonl(report, label) for report, label in runs)
    if fmt == "csv":
        rows = [row for report, label in runs for row in measured(flat_rows(report, label))]
        return rows_csv(LINE_FIELDS, rows)
    if fmt == "llama-json":
        rows = [row for report, label in runs for row in llama_json_rows(report, label)]
        return strict_json(rows, indent=2) + "\n"
    if fmt == "json":
        return strict_json([report for report, _ in runs], indent=2) + "\n"
    raise ValueError(f"unknown export format {fmt!r}")
