"""`coordinator runs`, `show` and `compare`: the runs kept in the run store, benchmark and
netbench runs alike (each shown and compared its own way, never one against the other)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from coordinator.reports.compare import (
    COMPARE_FORMATS,
    ReportError,
    as_fleet_report,
    compare_reports,
    comparison_text,
    differing_text,
    parse_by,
    rich_comparison,
)
from coordinator.reports.compare_serving import serving_comparison
from coordinator.reports.netbench import (
    compare_netbench,
    netbench_comparison_table,
    netbench_comparison_text,
    netbench_table,
    netbench_text,
)
from coordinator.runs.health import with_health
from coordinator.runs.store import RunStore, UnknownRunError
from shared.bounds import MAX_RUNS_LIMIT
from shared.distributed.rank_shapes import KIND_NETBENCH
from shared.io.cli import (
    check_output,
    data_home,
    emit,
    err,
    print_rich,
    usage_error,
    write_text,
)
from shared.io.options import (
    Label,
    Output,
    ReportFormat,
    RunId,
    TableFormat,
    count,
    output_format,
)
from shared.io.report_output import show_report
from shared.io.sqlite import StoreError
from shared.safe_text import shown
from shared.tables import WHOLE, WORDS, FitTable

CompareFormat = output_format(COMPARE_FORMATS)
ComparedReport = Annotated[
    str,
    typer.Argument(
        help="A run id (or a unique prefix), or an `agent bench` / `coordinator show` JSON file."
    ),
]
"""One side of `coordinator compare`."""
CompareBy = Annotated[
    str | None,
    typer.Option(
        "--by",
        help="Comma list of what matches cells besides the test: host, hostname, device, "
        "model, batch, n_batch, or a setting by its name (power_mode, os_build, mlx_version, "
        "...: docs/protocol.md §5) (default: model,batch, and host when a side has several hosts); "
        "cells that share them are averaged, as llama.cpp's compare-llama-bench.py --show does.",
    ),
]
"""`coordinator compare`'s columns (coordinator.reports.compare.BY_COLUMNS)."""


def load_reports(*run_ids: str) -> list[dict[str, Any]]:
    """The stored reports; an unknown or ambiguous id is a usage error naming it."""
    data_home(write=False)  # a read-only data dir is still read
    try:
        with RunStore() as store:
            return [with_health(store, store.load_report(run_id)) for run_id in run_ids]
    except (UnknownRunError, StoreError) as exc:
        raise usage_error(str(exc)) from None


def runs(
    limit: Annotated[
        int,
        typer.Option(
            "--limit",
            help=f"Show at most N runs (1 to {MAX_RUNS_LIMIT}).",
            callback=count("--limit", 1, MAX_RUNS_LIMIT),
        ),
    ] = 50,
    fmt: TableFormat = "table",
) -> None:
    """The stored runs, newest first, with their hosts and ok/failed cell counts."""
    data_home(write=False)  # a read-only data dir is still read
    try:
        with RunStore() as store:
            listed = store.list_runs(limit)
    except StoreError as exc:
        raise usage_error(str(exc)) from None
    if not listed and fmt == "table":
        err.print(
            "no runs stored yet: `coordinator benchmark` and `coordinator netbench` record them",
            highlight=False,
        )
        return
    emit(listed, fmt, runs_table)


RUNS_FOLDS = ("finished", "kind", "started")
"""The columns a narrow terminal drops, the first first (shared.tables); the run id, its
status, hosts and cell counts always stay."""


def runs_table(listed: list[dict[str, Any]]) -> FitTable:
    table = FitTable(title="mlx-fleet runs", folds=RUNS_FOLDS)
    for name in ("run", "kind", "started", "finished", "status", "hosts", "ok", "failed"):
        wrap = WORDS if name in ("status", "hosts") else WHOLE
        table.add_column(name, justify="right" if name in ("ok", "failed") else "left", wrap=wrap)
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


def show(
    run: RunId, fmt: ReportFormat = "table", output: Output = None, label: Label = None
) -> None:
    """A stored run's report, as `coordinator benchmark` printed it.

    A netbench run's as `coordinator netbench` printed it, in the same formats."""
    check_output(output)
    report = load_reports(run)[0]
    if report["kind"] != KIND_NETBENCH:
        show_report(report, fmt, output, label)
    elif fmt == "llama-json":
        raise usage_error(f"run {run} is a netbench run: a link has no llama-bench row")
    elif fmt == "table" and output is None:
        print_rich(netbench_table(report))
    else:
        write_text(netbench_text(report, fmt), output)


def load_compared(reference: str) -> tuple[dict[str, Any], str]:
    """(the report, its name) for a run id or a JSON report file; exit 2 naming what is
    wrong with it."""
    path = Path(reference)
    try:
        is_file = path.is_file()
    except OSError:  # a name too long for a file (ENAMETOOLONG): a run id, or nothing
        is_file = False
    if not (is_file or reference.endswith(".json")):
        report = load_reports(reference)[0]
        return report, report["run_id"]
    try:
        return as_fleet_report(json.loads(path.read_text(encoding="utf-8")), path.name), path.name
    except OSError as exc:
        raise usage_error(f"cannot read {reference}: {exc.strerror or exc}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise usage_error(f"{reference} is not JSON: {exc}") from None
    except ReportError as exc:
        raise usage_error(str(exc)) from None


def compare(
    run_a: ComparedReport,
    run_b: ComparedReport,
    by: CompareBy = None,
    fmt: CompareFormat = "table",
    ignore_settings: Annotated[
        bool,
        typer.Option(
            "--ignore-settings",
            help="Compare cells whose settings differ (OS build, MLX versions, weights, power "
            "mode or source, wired limit: docs/protocol.md §5), noting it, instead of refusing.",
        ),
    ] = False,
) -> None:
    """Per-test speed-up of B over A (tok/s B / tok/s A): runs or `agent bench` JSON files.

    `~1.02x` marks a speed-up within the noise (the two 95 % intervals overlap). Cells whose
    settings differ are refused (exit 2) unless --ignore-settings; --by may name a setting
    (power_mode, os_build, ...). Two netbench runs compare bus bandwidth B/A per operation,
    ring or link, and size, marked the same way; a netbench run is never compared with a
    benchmark run."""
    try:
        columns = parse_by(by) if by is not None else None
    except ValueError as exc:
        raise usage_error(str(exc)) from None
    (report_a, name_a), (report_b, name_b) = load_compared(run_a), load_compared(run_b)
    kinds = [report.get("kind", "benchmark") for report in (report_a, report_b)]
    if KIND_NETBENCH in kinds:
        if kinds[0] != kinds[1]:
            raise usage_error(
                f"{name_a} is a {kinds[0]} run and {name_b} a {kinds[1]} run: compare two "
                "benchmark runs or two netbench runs"
            )
        if by is not None:
            raise usage_error("--by matches benchmark cells: netbench runs match by size and link")
        compared = compare_netbench(report_a, report_b)
        if fmt == "table":
            print_rich(netbench_comparison_table(compared, name_a, name_b))
        else:
            sys.stdout.write(netbench_comparison_text(compared, name_a, name_b, fmt))
        return
    rows = compare_reports(report_a, report_b, columns)
    differs = differing_text(rows)
    if differs is not None and not ignore_settings:
        raise usage_error(f"settings differ: {differs}; --ignore-settings compares them anyway")
    if fmt == "table":
        print_rich(rich_comparison(rows, name_a, name_b))
        for table in serving_comparison(rows):
            print_rich(table)
    else:
        sys.stdout.write(comparison_text(rows, name_a, name_b, fmt))
    health_lines(report_a, report_b)


def health_lines(report_a: dict[str, Any], report_b: dict[str, Any]) -> None:
    """Each side's hosts flagged by fleet health (shared.benchmark.health), one line each on
    stderr: a speed-up measured on a sick Mac says more about the Mac."""
    for side, report in (("A", report_a), ("B", report_b)):
        for host in report.get("health") or []:
            if host["flags"]:
                flags, why = ", ".join(host["flags"]), "; ".join(host["why"])
                line = f"{side}: {host['host']} is {flags}: {why}"
                err.print(shown(line), highlight=False, markup=False)
