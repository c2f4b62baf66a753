"""`coordinator export`: stored runs as llama-bench's rows, several runs into one database, so
llama.cpp's compare-llama-bench.py compares them (coordinator.reports.export)."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Annotated

import typer

from coordinator.commands.runs import load_reports
from coordinator.reports.export import (
    EXPORT_FORMATS,
    SQLITE,
    ExportError,
    build_labels,
    check_lengths,
    export_text,
    labels_for,
)
from shared.distributed.rank_shapes import KIND_NETBENCH
from shared.exit_codes import EXIT_PARTIAL
from shared.io.cli import check_output, err, fail, usage_error, write_text
from shared.io.options import Output, label_given, output_format
from shared.reports.llama_bench import left_out_note

DEFAULT_DATABASE = Path("llama-bench.sqlite")
"""Where compare-llama-bench.py looks first when given no -i."""
ExportFormat = output_format(
    EXPORT_FORMATS,
    f"One of {', '.join(EXPORT_FORMATS)}: llama-bench-sqlite adds the runs to a database "
    f"(--output, default {DEFAULT_DATABASE}); the others print llama-bench's formats.",
)
ExportRuns = Annotated[
    list[str], typer.Argument(help="Run ids (or unique prefixes): `coordinator runs` lists them.")
]
ExportLabels = Annotated[
    list[str] | None,
    typer.Option(
        "--label",
        metavar="TEXT",
        help="build_commit of the rows, the name compare-llama-bench.py's -b/-c take: once for "
        "every run, or once per run in their order [default: each host's MLX version]. Labels "
        "of one database need one length.",
    ),
]


def export(
    runs: ExportRuns,
    fmt: ExportFormat = SQLITE,
    labels: ExportLabels = None,
    output: Output = None,
) -> None:
    """Stored runs as llama-bench's rows, for llama.cpp's compare-llama-bench.py.

    llama-bench-sqlite adds them to a database (table llama_bench, ours in mlx_fleet_bench),
    created if new; then `compare-llama-bench.py -i llama-bench.sqlite -b LABEL_A -c LABEL_B`
    prints each test's speed-up (README, Comparing with llama.cpp's script)."""
    given = [label_given(label) or "" for label in labels or []]
    check_output(output)
    reports = load_reports(*runs)
    for run, report in zip(runs, reports, strict=True):
        if report.get("kind") == KIND_NETBENCH:
            raise usage_error(f"run {run} is a netbench run: a link has no llama-bench row")
    try:
        labelled = list(zip(reports, labels_for(runs, given), strict=True))
        database = (output or DEFAULT_DATABASE) if fmt == SQLITE else None
        check_lengths(build_labels(labelled), existing_labels(database))
    except ExportError as exc:
        raise usage_error(str(exc)) from None
    text = export_text(labelled, fmt)
    if database is None:
        write_text(text, output)
        for run, report in zip(runs, reports, strict=True):
            if (note := left_out_note(report, fmt)) is not None:
                err.print(f"run {run}: {note}", highlight=False, markup=False)
        return
    try:
        with closing(sqlite3.connect(database)) as db, db:
            db.executescript(text)
    except sqlite3.Error as exc:
        raise fail(f"cannot write {database}: {exc}", EXIT_PARTIAL) from None
    names = ", ".join(build_labels(labelled))
    err.print(
        f"added {len(runs)} run{'s' * (len(runs) > 1)} to {database} (labels: {names}): "
        f"compare-llama-bench.py -i {database} -b LABEL -c LABEL",
        highlight=False,
        markup=False,
    )


def existing_labels(database: Path | None) -> list[str]:
    """The labels a database already holds in llama_bench (none for a new file); a file that
    is not a SQLite database is one line, exit 2."""
    if database is None or not database.exists():
        return []
    try:
        with closing(sqlite3.connect(f"file:{database}?mode=ro", uri=True)) as db:
            tables = {name for (name,) in db.execute("SELECT name FROM sqlite_master")}
            if "llama_bench" not in tables:
                return []
            return [
                label for (label,) in db.execute("SELECT DISTINCT build_commit FROM llama_bench")
            ]
    except sqlite3.DatabaseError as exc:
        raise usage_error(f"--output {database}: not a SQLite database ({exc})") from None
