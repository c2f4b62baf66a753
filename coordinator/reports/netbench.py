"""A netbench report as people and scripts read it: the table `coordinator netbench` and `show`
print, the same rows as md, csv, jsonl or sql (shared.reports.benchmark's writers), and two runs
compared per operation, link and size, bus bandwidth B over A. No sockets: `coordinator show` and
`compare` load it from the run store alone."""

from __future__ import annotations

import json
import math
from typing import Any

from rich.text import Text

from coordinator.reports.compare import speedup_text
from shared.distributed.netbench import ALL_SUM, format_bytes
from shared.reports.benchmark import NA, drawn_text, markdown_table
from shared.reports.rows import rows_csv, rows_sql, strict_json
from shared.safe_text import shown
from shared.stats import ci95_half_width
from shared.tables import TEXT, WHOLE, FitTable

NETBENCH_FOLDS = ("algbw GB/s", "time µs")
"""What a narrow terminal drops first: bus bandwidth, the wire's scale, stays."""
COLUMNS = ("operation", "over", "size", "time µs", "algbw GB/s", "busbw GB/s")
ROW_FIELDS: list[tuple[str, str]] = [
    ("run_id", "TEXT"),
    ("backend", "TEXT"),
    ("operation", "TEXT"),
    ("over", "TEXT"),
    ("size", "INTEGER"),
    ("ranks", "INTEGER"),
    ("time_us", "REAL"),
    ("time_us_std", "REAL"),
    ("algbw_gbps", "REAL"),
    ("algbw_gbps_std", "REAL"),
    ("busbw_gbps", "REAL"),
    ("busbw_gbps_std", "REAL"),
    ("slow", "INTEGER"),
    ("samples_s", "TEXT"),
]
"""One measurement as a flat row (csv, sql, jsonl): `over` the ring or the link, `slow` 1 for
a flagged link, `samples_s` each repetition's seconds per operation, ';'-joined."""
SQL_TABLE = "mlx_fleet_netbench"


def figure(mean: float | None, std: float | None) -> str:
    """Three significant figures, the ± to the same decimals."""
    if mean is None:
        return NA
    decimals = max(0, 2 - math.floor(math.log10(abs(mean)))) if mean else 0
    return f"{mean:.{decimals}f}" + ("" if std is None else f" ± {std:.{decimals}f}")


def flagged(report: dict[str, Any], row: dict[str, Any]) -> bool:
    return row["operation"] != ALL_SUM and row["where"] in report["slow_links"]


def cells(report: dict[str, Any], row: dict[str, Any]) -> list[str]:
    """A row as the table shows it (COLUMNS)."""
    return [
        row["operation"],
        shown(row["where"]) + (" SLOW" if flagged(report, row) else ""),
        format_bytes(row["size"]),
        figure(row["time_us"], row["time_us_std"]),
        figure(row["algbw_gbps"], row["algbw_gbps_std"]),
        figure(row["busbw_gbps"], row["busbw_gbps_std"]),
    ]


def caption(report: dict[str, Any]) -> str:
    """The verdict under the table: why it failed, else the slow links or why there are none."""
    if report.get("error"):
        return f"failed: {shown(report['error'])}"
    slow = report["slow_links"]
    if slow:
        return "; ".join(f"slow link {shown(link)}: {why}" for link, why in slow.items())
    if len(report["links_best_busbw_gbps"]) < 2:
        return "one link: no sibling to compare it with"
    return "no link 30 % or more below its siblings"


def netbench_table(report: dict[str, Any]) -> FitTable:
    """One row per operation, link and size; the slow links (or the failure) in the caption."""
    backend = report["backend"] or "no backend chosen"
    title = f"{shown(report.get('title') or 'mlx-fleet netbench')} ({backend})"
    table = FitTable(title=Text(title), folds=NETBENCH_FOLDS)  # Text: never markup
    for name in COLUMNS:
        table.add_column(
            name, wrap=WHOLE, justify="left" if name in ("operation", "over") else "right"
        )
    for row in report["results"]:
        red = flagged(report, row)
        table.add_row(*(Text(cell) for cell in cells(report, row)), style="red" if red else None)
    table.caption = Text(caption(report))  # a rank's error, in an agent's words
    return table


def flat_rows(report: dict[str, Any]) -> list[dict[str, Any]]:
    """Every measurement as a ROW_FIELDS row."""
    return [
        {
            "run_id": report.get("run_id"),
            "backend": report["backend"],
            "operation": row["operation"],
            "over": row["where"],
            "size": row["size"],
            "ranks": row["ranks"],
            **{key: row[key] for key, _ in ROW_FIELDS[6:12]},
            "slow": int(flagged(report, row)),
            "samples_s": ";".join(map(repr, row["seconds"])),
        }
        for row in report["results"]
    ]


def netbench_text(report: dict[str, Any], fmt: str, width: int = 160) -> str:
    """The report in any of shared.reports.benchmark's FORMATS as text (the table: drawn_text)."""
    if fmt == "table":
        return drawn_text(netbench_table(report), width)
    if fmt == "json":
        return strict_json(report, indent=2) + "\n"
    if fmt == "jsonl":
        return "".join(strict_json(row) + "\n" for row in flat_rows(report))
    if fmt == "csv":
        return rows_csv([name for name, _ in ROW_FIELDS], flat_rows(report))
    if fmt == "sql":
        return rows_sql(SQL_TABLE, ROW_FIELDS, flat_rows(report))
    if fmt == "md":
        head = [report.get("title") or "mlx-fleet netbench", f"backend: {report['backend']}"]
        lines = [f"<!-- {shown(line).replace('--', '- -')} -->" for line in head]
        lines += markdown_table(COLUMNS, (cells(report, row) for row in report["results"]))
        return "\n".join([*lines, "", caption(report)]) + "\n"
    raise ValueError(f"unknown format {fmt!r}")


# --- two runs compared --------------------------------------------------------------------------


def _interval(row: dict[str, Any]) -> tuple[float, float] | None:
    """The 95 % interval of the mean time per operation, None for one repetition."""
    half = ci95_half_width(row["seconds"])
    if half is None:
        return None
    mean = sum(row["seconds"]) / len(row["seconds"])
    return mean - half, mean + half


def within_noise(a: dict[str, Any] | None, b: dict[str, Any] | None) -> bool | None:
    """Whether the two rows' 95 % intervals overlap (as `coordinator compare` judges tok/s: the
    bus bandwidth is the size over the time, so its intervals overlap when the time's do);
    None where either lacks one."""
    if a is None or b is None:
        return None
    first, second = _interval(a), _interval(b)
    if first is None or second is None:
        return None
    return not (first[1] < second[0] or second[1] < first[0])


def compare_netbench(a: dict[str, Any], b: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per (operation, ring or link, size) of either run, A's in order then those only
    B has: each side's bus bandwidth ± its spread, B/A, and whether that is within the noise."""
    rows_a = {(r["operation"], r["where"], r["size"]): r for r in a["results"]}
    rows_b = {(r["operation"], r["where"], r["size"]): r for r in b["results"]}
    compared = []
    for key in [*rows_a, *(k for k in rows_b if k not in rows_a)]:
        side_a, side_b = rows_a.get(key), rows_b.get(key)
        ratio = None
        if side_a is not None and side_b is not None and side_a["busbw_gbps"] > 0:
            ratio = side_b["busbw_gbps"] / side_a["busbw_gbps"]
        compared.append(
            {
                "operation": key[0],
                "over": key[1],
                "size": key[2],
                **{
                    f"busbw_gbps{std}_{name}": None if side is None else side[f"busbw_gbps{std}"]
                    for name, side in (("a", side_a), ("b", side_b))
                    for std in ("", "_std")
                },
                "speedup": ratio,
                "within_noise": within_noise(side_a, side_b),
                "note": "only in B" if side_a is None else "only in A" if side_b is None else "",
            }
        )
    return compared


COMPARE_COLUMNS = ("operation", "over", "size", "busbw A GB/s", "busbw B GB/s", "B/A", "note")
COMPARE_FOLDS = ("note", "operation", "busbw A GB/s", "busbw B GB/s")
"""What a narrow terminal drops first (the link or ring says the operation); where, the size
and B/A always stay."""
COMPARE_FIELDS = (
    "operation",
    "over",
    "size",
    "busbw_gbps_a",
    "busbw_gbps_std_a",
    "busbw_gbps_b",
    "busbw_gbps_std_b",
    "speedup",
    "within_noise",
    "note",
)
"""A compared row's keys, in order: csv's header."""


def compared_cells(row: dict[str, Any]) -> list[str]:
    return [
        row["operation"],
        shown(row["over"]),
        format_bytes(row["size"]),
        figure(row["busbw_gbps_a"], row["busbw_gbps_std_a"]),
        figure(row["busbw_gbps_b"], row["busbw_gbps_std_b"]),
        speedup_text(row),
        row["note"],
    ]


def netbench_comparison_table(rows: list[dict[str, Any]], name_a: str, name_b: str) -> FitTable:
    """Faster rows in green, slower in red, within the noise plain; unmatched ones dimmed."""
    table = FitTable(
        title=Text(f"A = {shown(name_a)}, B = {shown(name_b)}; B/A = bus bandwidth B / A"),
        folds=COMPARE_FOLDS,
    )
    for name in COMPARE_COLUMNS:
        left = name in ("operation", "over", "note")
        table.add_column(name, justify="left" if left else "right", wrap=TEXT if left else WHOLE)
    for row in rows:
        ratio = row["speedup"]
        style = "dim" if ratio is None else "green" if ratio > 1 else "red" if ratio < 1 else None
        if ratio is not None and row["within_noise"]:
            style = None
        table.add_row(*(Text(cell) for cell in compared_cells(row)), style=style)
    return table


def netbench_comparison_text(rows: list[dict[str, Any]], name_a: str, name_b: str, fmt: str) -> str:
    """The comparison as md, csv or json text (a table goes through the table above)."""
    if fmt == "json":
        return json.dumps({"a": name_a, "b": name_b, "rows": rows}, indent=2) + "\n"
    if fmt == "csv":
        return rows_csv(COMPARE_FIELDS, rows)
    if fmt == "md":
        title = f"<!-- A = {shown(name_a)}, B = {shown(name_b)}; B/A = bus bandwidth B / A -->"
        lines = [title, *markdown_table(COMPARE_COLUMNS, map(compared_cells, rows))]
        return "\n".join(lines) + "\n"
    raise ValueError(f"unknown comparison format {fmt!r}")
