"""Two stored runs side by side, per-cell speed-up B/A (like llama.cpp's compare-llama-bench.py).

Cells match by (host, cell name); when each run has exactly one host they match by cell name
alone, so a run on mac1 compares with a run on mac2. Cells found in only one run, or failed in
either, are kept and say so instead of getting a speed-up.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Hashable
from typing import Any

from rich.table import Table

from shared.matrix import model_label
from shared.report import NA, Column, Record, mean_std, per_joule
from shared.results import OK

COMPARE_FORMATS = ("table", "md", "csv", "json")


def _host_names(report: dict[str, Any]) -> list[str]:
    return [host["host"] for host in report["hosts"]]


def _by_key(report: dict[str, Any], single_host: bool) -> dict[Hashable, Record]:
    """Cells by match key, in report order; a repeated key keeps its first cell."""
    cells: dict[Hashable, Record] = {}
    for cell in report["cells"]:
        key = cell["name"] if single_host else (cell.get("host"), cell["name"])
        cells.setdefault(key, cell)
    return cells


def speedup(a: Record | None, b: Record | None) -> float | None:
    """B's tokens/s over A's, when both cells ran fine and A measured a positive speed."""
    if a is None or b is None or a.get("status") != OK or b.get("status") != OK:
        return None
    speed_a, speed_b = a.get("tokens_per_sec"), b.get("tokens_per_sec")
    if speed_a is None or speed_b is None or speed_a <= 0:
        return None
    return speed_b / speed_a


def _note(a: Record | None, b: Record | None) -> str:
    if a is None:
        return "only in B"
    if b is None:
        return "only in A"
    return "; ".join(
        f"failed in {side}: {cell.get('error')}"
        for side, cell in (("A", a), ("B", b))
        if cell.get("status") != OK
    )


def _host(a: Record | None, b: Record | None) -> str:
    hosts = [str(cell.get("host", "")) for cell in (a, b) if cell is not None]
    return hosts[0] if len(set(hosts)) == 1 else " → ".join(hosts)


def compare_reports(a: dict[str, Any], b: dict[str, Any]) -> list[Record]:
    """One row per cell of either run: A's cells in order, then those only B has."""
    single_host = len(_host_names(a)) == 1 and len(_host_names(b)) == 1
    cells_a, cells_b = _by_key(a, single_host), _by_key(b, single_host)
    rows = []
    for key in [*cells_a, *(k for k in cells_b if k not in cells_a)]:
        cell_a, cell_b = cells_a.get(key), cells_b.get(key)
        cell = cell_a or cells_b[key]
        rows.append(
            {
                "host": _host(cell_a, cell_b),
                "name": cell["name"],
                "model": model_label(cell["model"], cell.get("bits")),
                "test": cell["test"],
                "batch_size": cell["batch_size"],
                "a": cell_a,
                "b": cell_b,
                "speedup": speedup(cell_a, cell_b),
                "note": _note(cell_a, cell_b),
            }
        )
    return rows


def _speed(side: str) -> Column:
    return (
        f"tok/s {side.upper()}",
        lambda row: (
            NA if row[side] is None else mean_std(row[side], "tokens_per_sec", "std_tokens_per_sec")
        ),
    )


def _per_joule(side: str) -> Column:
    return (f"tok/J {side.upper()}", lambda row: NA if row[side] is None else per_joule(row[side]))


COLUMNS: list[Column] = [
    ("host", lambda row: row["host"]),
    ("model", lambda row: row["model"]),
    ("test", lambda row: row["test"]),
    ("batch", lambda row: str(row["batch_size"])),
    _speed("a"),
    _speed("b"),
    ("speed-up", lambda row: NA if row["speedup"] is None else f"{row['speedup']:.2f}x"),
    ("note", lambda row: row["note"]),
]
ENERGY_COLUMNS: list[Column] = [_per_joule("a"), _per_joule("b")]
"""Shown after the speed-up when either run metered energy."""


def columns_for(rows: list[Record]) -> list[Column]:
    metered = any((row[side] or {}).get("energy_source") for row in rows for side in "ab")
    return [*COLUMNS[:7], *ENERGY_COLUMNS, *COLUMNS[7:]] if metered else COLUMNS


def rich_comparison(rows: list[Record], run_a: str, run_b: str) -> Table:
    """Faster rows in green, slower in red; unmatched or failed cells dimmed."""
    table = Table(title=f"A = {run_a}, B = {run_b}; speed-up = B/A tok/s")
    columns = columns_for(rows)
    for name, _ in columns:
        table.add_column(
            name,
            justify="left" if name in ("host", "model", "test", "note") else "right",
            overflow="fold",
        )
    for row in rows:
        ratio = row["speedup"]
        style = "dim" if ratio is None else "green" if ratio > 1 else "red" if ratio < 1 else None
        table.add_row(*(render(row) for _, render in columns), style=style)
    return table


def _value(row: Record, side: str, key: str) -> Any:
    return None if row[side] is None else row[side].get(key)


def comparison_text(rows: list[Record], run_a: str, run_b: str, fmt: str) -> str:
    """The comparison as md, csv or json text (a table goes through rich_comparison)."""
    if fmt == "json":
        return json.dumps({"a": run_a, "b": run_b, "rows": rows}, indent=2, default=str) + "\n"
    if fmt == "csv":
        out = io.StringIO()
        writer = csv.writer(out)
        writer.writerow(
            [
                "host",
                "name",
                "model",
                "test",
                "batch_size",
                "tokens_per_sec_a",
                "tokens_per_sec_b",
                "speedup",
                "tokens_per_joule_a",
                "tokens_per_joule_b",
                "note",
            ]
        )
        for row in rows:
            speeds = [_value(row, side, "tokens_per_sec") for side in ("a", "b")]
            per_joule_ab = [_value(row, side, "tokens_per_joule") for side in ("a", "b")]
            writer.writerow(
                [
                    row["host"],
                    row["name"],
                    row["model"],
                    row["test"],
                    row["batch_size"],
                    *speeds,
                    row["speedup"],
                    *per_joule_ab,
                    row["note"],
                ]
            )
        return out.getvalue()
    if fmt == "md":
        columns = columns_for(rows)
        lines = [
            f"<!-- A = {run_a}, B = {run_b}; speed-up = B/A tok/s -->",
            "| " + " | ".join(name for name, _ in columns) + " |",
            "| " + " | ".join("---" for _ in columns) + " |",
        ]
        lines += [
            "| " + " | ".join(render(row).replace("|", "\\|") for _, render in columns) + " |"
            for row in rows
        ]
        return "\n".join(lines) + "\n"
    raise ValueError(f"unknown comparison format {fmt!r}; choose from {COMPARE_FORMATS}")
