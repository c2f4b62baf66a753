"""`coordinator runs`, `show` and `compare`: the runs kept in the run store."""

from __future__ import annotations

import sys
from typing import Annotated, Any

import typer
from rich.table import Table

from coordinator.compare import (
    COMPARE_FORMATS,
    compare_reports,
    comparison_text,
    rich_comparison,
)
from coordinator.store import RunStore, UnknownRunError
from shared.io.cli import check_output, emit, err, print_rich, show_report, usage_error
from shared.io.options import Output, ReportFormat, RunId, TableFormat, one_of
from shared.io.sqlite import StoreError


def load_reports(*run_ids: str) -> list[dict[str, Any]]:
    """The stored reports; an unknown or ambiguous id is a usage error naming it."""
    try:
        with RunStore() as store:
            return [store.load_report(run_id) for run_id in run_ids]
    except (UnknownRunError, StoreError) as exc:
        raise usage_error(str(exc)) from None


def runs(
    limit: Annotated[int, typer.Option("--limit", min=1, help="Show at most N runs.")] = 50,
    fmt: TableFormat = "table",
) -> None:
    """The stored runs, newest first, with their hosts and ok/failed cell counts."""
    try:
        with RunStore() as store:
            listed = store.list_runs(limit)
    except StoreError as exc:
        raise usage_error(str(exc)) from None
    if not listed and fmt == "table":
        err.print("no runs stored yet: `coordinator benchmark` records one", highlight=False)
        return
    emit(listed, fmt, runs_table)


def runs_table(listed: list[dict[str, Any]]) -> Table:
    table = Table(title="mlx-fleet runs")
    for name in ("run", "kind", "started", "finished", "status", "hosts", "ok", "failed"):
        table.add_column(
            name, justify="right" if name in ("ok", "failed") else "left", overflow="fold"
        )
    for run in listed:
        interrupted = run["interrupted"] and run["status"] != "interrupted"
        status = run["status"] + (" (interrupted)" if interrupted else "")
        table.add_row(
            run["id"],
            run["kind"],
            run["started"],
            run["finished"] or "",
            status,
            ", ".join(run["hosts"]),
            str(run["ok"]),
            str(run["failed"]),
        )
    return table


def show(run: RunId, fmt: ReportFormat = "table", output: Output = None) -> None:
    """A stored run's report, as `coordinator benchmark` printed it."""
    check_output(output)
    show_report(load_reports(run)[0], fmt, output)


def compare(
    run_a: RunId,
    run_b: RunId,
    fmt: Annotated[
        str,
        typer.Option(
            "--format",
            help=f"One of {', '.join(COMPARE_FORMATS)}.",
            callback=one_of(COMPARE_FORMATS),
        ),
    ] = "table",
) -> None:
    """Per-cell speed-up of RUN_B over RUN_A (tok/s B / tok/s A)."""
    report_a, report_b = load_reports(run_a, run_b)
    rows = compare_reports(report_a, report_b)
    if fmt == "table":
        print_rich(rich_comparison(rows, report_a["run_id"], report_b["run_id"]))
    else:
        sys.stdout.write(comparison_text(rows, report_a["run_id"], report_b["run_id"], fmt))
