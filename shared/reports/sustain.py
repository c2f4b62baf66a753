"""Sustained runs in a report: one summary row per cell (and host), then each cell's windows. Pure
rendering of the `sustain` field of records (shared.benchmark.sustain); every unknown is N/A."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rich.text import Text

from shared.benchmark.energy import not_a_meter
from shared.benchmark.matrix import model_label, named_label
from shared.benchmark.sustain import STEADY_WINDOWS, steady_unknown
from shared.safe_text import DETAIL_CAP, shown
from shared.tables import TEXT, WHOLE, FitTable

NA = "N/A"
RULE = (
    f"steady = mean of the last {STEADY_WINDOWS} full windows after the first; "
    "throttle = steady/first"
)
Record = dict[str, Any]
Column = tuple[str, Callable[[Record], str]]


def _number(value: float | None, spec: str, unit: str = "") -> str:
    return NA if value is None else f"{value:{spec}}{unit}"


def sustained(records: list[Record]) -> list[Record]:
    """The records of a sustained run that hold windows."""
    return [record for record in records if (record.get("sustain") or {}).get("windows")]


def _throttle(summary: dict[str, Any]) -> str:
    if summary.get("first_tokens_per_sec") is None:
        return NA
    at = summary.get("time_to_throttle_s")
    return "none" if at is None else f"{at:.0f} s"


def _watts(summary: dict[str, Any], record: Record) -> str:
    value = summary.get("mean_power_w")
    return NA if value is None else not_a_meter(f"{value:.1f}", record)


SUMMARY_COLUMNS: list[Column] = [
    ("model", lambda r: named_label(r) or model_label(r["model"], r.get("bits"))),
    ("test", lambda r: r["test"]),
    ("batch", lambda r: str(r["batch_size"])),
    ("first tok/s", lambda r: _number(r["sustain"]["first_tokens_per_sec"], ".2f")),
    ("steady tok/s", lambda r: _number(r["sustain"]["steady_tokens_per_sec"], ".2f")),
    ("throttle", lambda r: _number(r["sustain"]["throttle_ratio"], ".2f", "x")),
    ("throttled at", lambda r: _throttle(r["sustain"])),
    ("°C rise", lambda r: _number(r["sustain"]["temp_rise_c"], "+.1f")),
    ("mean W", lambda r: _watts(r["sustain"], r)),
    ("paused", lambda r: _number(r["sustain"]["pause_s"], ".0f", " s")),
    ("stopped", lambda r: r["sustain"].get("stopped") or ""),
]
HOST: Column = ("host", lambda r: str(r.get("host", "")))

WINDOW_COLUMNS: list[Column] = [
    ("window", lambda w: str(w["index"])),
    ("from s", lambda w: f"{w['start_s']:.1f}"),
    ("to s", lambda w: f"{w['end_s']:.1f}"),
    ("iters", lambda w: str(w["iterations"])),
    ("tok/s", lambda w: _number(w["tokens_per_sec"], ".2f")),
    ("°C", lambda w: _number(w["celsius"], ".1f")),
    ("W", lambda w: _number(w["watts"], ".1f")),
    ("state", lambda w: w["state"] or NA),
    ("pause", lambda w: f"paused {w['pause_s']:.1f} s" if w["paused"] else ""),
]


SUMMARY_FOLDS = ("mean W", "paused", "°C rise", "batch", "throttled at", "first tok/s")
WINDOW_FOLDS = ("W", "iters", "from s", "state")
"""The columns a narrow terminal drops, the first first (shared.tables)."""


def summary_columns(records: list[Record]) -> list[Column]:
    return [HOST, *SUMMARY_COLUMNS] if any("host" in r for r in records) else SUMMARY_COLUMNS


def cell_title(record: Record) -> str:
    """`host: cell`, and which of its columns are not a sensor's or a meter's."""
    where = f"{record['host']}: " if record.get("host") else ""
    labels = [
        label
        for label, simulated in (
            ("°C simulated", "simulated" in (record.get("flags") or [])),
            ("W simulated", record.get("energy_simulated")),
        )
        if simulated
    ]
    return f"{where}{record['name']}" + (f" ({', '.join(labels)})" if labels else "")


def steady_notes(records: list[Record]) -> list[str]:
    """Why each cell without a steady tok/s has none (shown under the summary)."""
    return [
        f"{cell_title(record)}: {why}"
        for record in records
        if (why := steady_unknown(record["sustain"])) is not None
    ]


def rich_sustain(records: list[Record]) -> list[FitTable]:
    """The summary table, then one table of windows per sustained cell."""
    runs = sustained(records)
    if not runs:
        return []
    notes = [shown(note, DETAIL_CAP) for note in steady_notes(runs)]  # an agent's names
    summary = FitTable(
        title=f"sustained: {RULE}",
        caption=Text("\n".join(notes)) if notes else None,  # Text: never markup
        folds=SUMMARY_FOLDS,
    )
    columns = summary_columns(runs)
    for name, _ in columns:
        summary.add_column(name, wrap=TEXT if name == "stopped" else WHOLE)
    for record in runs:
        summary.add_row(*(Text(shown(render(record), DETAIL_CAP)) for _, render in columns))
    tables = [summary]
    for record in runs:
        title = Text(shown(f"windows of {cell_title(record)}"))
        table = FitTable(title=title, title_justify="left", folds=WINDOW_FOLDS)
        for name, _ in WINDOW_COLUMNS:
            table.add_column(name, justify="left" if name in ("state", "pause") else "right")
        for window in record["sustain"]["windows"]:
            style = "dark_orange" if window["paused"] else None
            cells = (Text(shown(render(window))) for _, render in WINDOW_COLUMNS)
            table.add_row(*cells, style=style)
        tables.append(table)
    return tables


def markdown_sustain(records: list[Record]) -> list[str]:
    """The same as Markdown tables."""
    runs = sustained(records)
    if not runs:
        return []
    lines = ["", f"Sustained: {RULE}", ""]
    lines += _markdown(summary_columns(runs), runs)
    lines += [f"\n{note}" for note in steady_notes(runs)]
    for record in runs:
        lines += ["", f"Windows of {cell_title(record)}", ""]
        lines += _markdown(WINDOW_COLUMNS, record["sustain"]["windows"])
    return lines


def _markdown(columns: list[Column], rows: list[Record]) -> list[str]:
    lines = ["| " + " | ".join(name for name, _ in columns) + " |"]
    lines.append("| " + " | ".join("---" for _ in columns) + " |")
    for row in rows:
        lines.append("| " + " | ".join(r(row).replace("|", "\\|") for _, r in columns) + " |")
    return lines
