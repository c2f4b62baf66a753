"""Serving cells in a report: a table of their figures under the main one (which shows their
output tok/s and pass time as any cell's), and their columns in the flat formats (csv, jsonl,
and sql's table of ours). Pure rendering of the `serving` field of records
(shared.benchmark.serving); every unknown is N/A, never a number. docs/performance.md
(Serving cells) says what each figure means."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rich.text import Text

from shared.benchmark.aggregate import ordered
from shared.benchmark.energy import not_a_meter
from shared.benchmark.matrix import model_label, named_label
from shared.benchmark.serving import PERCENTILE_KEYS, SERVE
from shared.benchmark.verdict import verdict_text
from shared.reports.rows import exported
from shared.safe_text import DETAIL_CAP, shown
from shared.tables import WHOLE, WORDS, FitTable

NA = "N/A"
Record = dict[str, Any]
Column = tuple[str, Callable[[Record], str]]
COUNTS = ("requests", "completed", "failed", "good", "output_tokens")
RATES = ("window_s", "output_tok_s", "request_rate", "goodput", "slo_ttft_ms", "slo_tpot_ms")
SERVING_FIELDS: list[tuple[str, str]] = [
    ("serve_concurrency", "INTEGER"),
    ("serve_offered_rate", "REAL"),
    ("serve_loop", "TEXT"),
    ("serve_engine", "TEXT"),
    ("serve_passes", "INTEGER"),
    ("serve_saturated", "INTEGER"),
    *((f"serve_{key}", "INTEGER") for key in COUNTS),
    *((f"serve_{key}", "REAL") for key in RATES),
    *((f"serve_{key}", "REAL") for key in PERCENTILE_KEYS),
    ("serve_joules_per_output_token_net", "REAL"),
]
"""A serving cell's figures as row columns (empty for any other cell): its load (clients, or
requests/s offered), its engine, and every figure of shared.benchmark.serving_figures."""


def served(records: list[Record]) -> list[Record]:
    return [r for r in records if r.get("mode") == SERVE and r.get("serving")]


def serving_row(record: Record) -> dict[str, Any]:
    """The SERVING_FIELDS of one record (all None for a cell that is not a serving one)."""
    if record.get("mode") != SERVE:
        return dict.fromkeys(name for name, _ in SERVING_FIELDS)
    serving = record.get("serving") or {}
    figures = serving.get("figures") or {}
    row = {
        "serve_concurrency": record.get("concurrency") or None,
        "serve_offered_rate": record.get("request_rate") or None,
        "serve_loop": serving.get("loop"),
        "serve_engine": serving.get("engine"),
        "serve_passes": serving.get("passes"),
        "serve_saturated": serving.get("saturated"),
        "serve_joules_per_output_token_net": record.get("joules_per_output_token_net"),
    }
    for key in (*COUNTS, *RATES, *PERCENTILE_KEYS):
        row[f"serve_{key}"] = figures.get(key)
    return row


def _figure(record: Record, key: str, spec: str = ".0f") -> str:
    value = ((record.get("serving") or {}).get("figures") or {}).get(key)
    return NA if value is None else f"{value:{spec}}"


def _pair(key: str) -> Callable[[Record], str]:
    """`p50/p99` of a latency, in ms."""
    return lambda r: f"{_figure(r, f'{key}_p50_ms')}/{_figure(r, f'{key}_p99_ms')}"


def _joules(record: Record) -> str:
    value = record.get("joules_per_output_token_net")
    return NA if value is None else not_a_meter(f"{value:.3g}", record)


def cooling_text(record: Record) -> str:
    """What the cooling policy did around the cell: `paused 12 s`, `waited 30 s` (to start
    cool), or nothing."""
    parts = []
    if (record.get("pause_s") or 0) > 0:
        parts.append(f"paused {record['pause_s']:.0f} s")
    if (record.get("cool_wait_s") or 0) >= 1:
        parts.append(f"waited {record['cool_wait_s']:.0f} s")
    return ", ".join(parts)


def _goodput(record: Record) -> str:
    figures = (record.get("serving") or {}).get("figures") or {}
    good, rate = figures.get("goodput"), figures.get("request_rate")
    if good is None:
        return NA
    share = f" {good / rate:.0%}" if rate else ""
    return f"{good:.2f}{share}"


COLUMNS: list[Column] = [
    ("model", lambda r: named_label(r) or model_label(r["model"], r.get("bits"))),
    ("test", lambda r: str(r["test"])),
    ("req/s", lambda r: _figure(r, "request_rate", ".2f")),
    ("TTFT ms", _pair("ttft")),
    ("ITL ms", _pair("itl")),
    ("TPOT ms", _pair("tpot")),
    ("e2e ms", _pair("e2e")),
    ("goodput", _goodput),
    ("J/tok", _joules),
    ("cooling", lambda r: cooling_text(r)),
    ("verdict", lambda r: verdict_text(r)),
]
HOST: Column = ("host", lambda r: str(r.get("host", "")))
FOLDS = ("cooling", "J/tok", "e2e ms", "TPOT ms", "req/s", "verdict", "host", "ITL ms")
"""The columns a narrow terminal drops, the first first (shared.tables)."""
NOTE = (
    "latencies p50/p99; goodput: requests/s within the SLO (TTFT {ttft:g} ms, TPOT {tpot:g} "
    "ms) and its share; J/tok: joules per output token net of idle"
)


def rich_serving(records: list[Record]) -> list[FitTable]:
    """The serving table, or nothing when no record is a serving cell's."""
    cells = served(records)
    if not cells:
        return []
    columns = [HOST, *COLUMNS] if any("host" in r for r in cells) else COLUMNS
    figures = (cells[0].get("serving") or {}).get("figures") or {}
    caption = NOTE.format(ttft=figures.get("slo_ttft_ms", 0), tpot=figures.get("slo_tpot_ms", 0))
    table = FitTable(title="serving", caption=caption, folds=FOLDS)
    for name, _ in columns:
        left = name in ("host", "model", "test", "cooling", "verdict")
        wrap = WORDS if name in ("verdict", "host", "cooling") else WHOLE
        table.add_column(name, justify="left" if left else "right", wrap=wrap)
    for record in ordered(cells):
        style = None if record.get("status") == "ok" else "red"
        table.add_row(*(Text(shown(f(record), DETAIL_CAP)) for _, f in columns), style=style)
    return [table]


def markdown_serving(records: list[Record]) -> list[str]:
    """The serving table in Markdown, under the main one."""
    cells = served(records)
    if not cells:
        return []
    columns = [HOST, *COLUMNS] if any("host" in r for r in cells) else COLUMNS
    lines = ["", "| " + " | ".join(name for name, _ in columns) + " |"]
    lines.append("| " + " | ".join("---" for _ in columns) + " |")
    for record in ordered(cells):
        cells_text = (exported(f(record)).replace("|", "\\|") for _, f in columns)
        lines.append("| " + " | ".join(cells_text) + " |")
    return lines
