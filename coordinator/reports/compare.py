"""Two benchmark reports side by side, the speed-up B/A per test, like llama.cpp's
scripts/compare-llama-bench.py: cells are matched by the test (pp512, tg128 @ d1024, ...) and
the `--by` columns (its `--show`), and cells that share them are averaged, unweighted, as that
script averages the rows it groups.

A report is a stored run (`coordinator show`'s) or an `agent bench` JSON report (its `-o json`
output, or the copy it saves under the data directory); by default cells match by model and
batch size, and by host too when either report has several. Tests found in one report only, or
failed in either, are kept and say so instead of getting a speed-up. When either report metered
energy, each side's tokens per joule (averaged as tok/s is) shows beside the speed-up.

A speed-up whose two 95 % intervals overlap (shared.benchmark.verdict.separated) is within the
noise: shown `~1.02x`, `within_noise` in JSON. Rows whose cells differ in a COMPARED setting
(shared.benchmark.settings) say which in `settings_differ`; `coordinator compare` refuses them
unless told to ignore settings.
"""

from __future__ import annotations

import csv
import io
import json
import statistics
from collections.abc import Callable, Hashable
from typing import Any

from rich.text import Text

from coordinator.reports.compare_serving import with_serving
from shared.benchmark.matrix import model_label
from shared.benchmark.results import OK
from shared.benchmark.settings import COMPARED, SETTINGS, differing, setting_text
from shared.benchmark.verdict import separated
from shared.reports.benchmark import NA, Record, mean_std, per_joule
from shared.safe_text import DETAIL_CAP, shown
from shared.tables import TEXT, WHOLE, WORDS, FitTable

COMPARE_FORMATS = ("table", "md", "csv", "json")
BY_COLUMNS: dict[str, Callable[[Record], Hashable]] = {
    "host": lambda cell: cell.get("host"),
    "hostname": lambda cell: cell["_machine"].get("hostname"),
    "device": lambda cell: cell["_machine"].get("device"),
    "model": lambda cell: model_label(cell["model"], cell.get("bits")),
    "batch": lambda cell: cell["batch_size"],
    "n_batch": lambda cell: cell.get("prefill_step_size"),
    **{
        key: (lambda cell, key=key: setting_text((cell.get("settings") or {}).get(key)))
        for key in SETTINGS
    },
}
"""What `--by` may name: the host as the run names it, its hostname, its device (the chip MLX
runs on), the model (label), the batch size, llama-bench's n_batch (our prefill step), and any
key of a record's `settings` by its own name (power_mode, os_build, ...; `unknown` where a
record has none)."""


class ReportError(ValueError):
    """A file that is not a benchmark report; the message says what it is not."""


def as_fleet_report(report: Any, name: str) -> dict[str, Any]:
    """A run's report as is; an `agent bench` report as a one-host run named `name`. Raises
    ReportError for anything else."""
    if not isinstance(report, dict) or not isinstance(report.get("cells"), list):
        raise ReportError(f"{name} is not an `agent bench` or `coordinator show` JSON report")
    if "hosts" in report:
        return report
    machine = report.get("machine") or {}
    host = machine.get("hostname") or name
    return {
        "run_id": name,
        "hosts": [{"host": host, "machine": machine, "models": report.get("models", [])}],
        "cells": [{"host": host, **cell} for cell in report["cells"]],
    }


def default_by(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """Model and batch; the host too when either report has more than one."""
    several = len(a["hosts"]) > 1 or len(b["hosts"]) > 1
    return ["host", "model", "batch"] if several else ["model", "batch"]


def parse_by(text: str) -> list[str]:
    """'host,model' -> ['host', 'model']; ValueError naming an unknown column."""
    columns = [column.strip() for column in text.split(",") if column.strip()]
    unknown = [column for column in columns if column not in BY_COLUMNS]
    if unknown or not columns:
        raise ValueError(
            f"--by {text!r}: choose from {', '.join(BY_COLUMNS)} (the test is always matched)"
        )
    return list(dict.fromkeys(columns))


def _grouped(report: dict[str, Any], by: list[str]) -> dict[tuple[Hashable, ...], list[Record]]:
    """Cells by (the by columns..., test), in report order."""
    machines = {host["host"]: host.get("machine") or {} for host in report["hosts"]}
    groups: dict[tuple[Hashable, ...], list[Record]] = {}
    for cell in report["cells"]:
        seen = {**cell, "_machine": machines.get(cell.get("host"), {})}
        key = (*(BY_COLUMNS[column](seen) for column in by), cell["test"])
        groups.setdefault(key, []).append(cell)
    return groups


def side(cells: list[Record] | None) -> dict[str, Any] | None:
    """One report's figure for a row: its one cell's mean ± std, or the mean over the ok cells
    the row groups (`cells` counts them); None when the report has no such cells."""
    if cells is None:
        return None
    good = [c for c in cells if c.get("status") == OK and c.get("tokens_per_sec") is not None]
    failed = [c for c in cells if c.get("status") != OK]
    summary: dict[str, Any] = {
        "tokens_per_sec": None,
        "std_tokens_per_sec": None,
        "cells": len(good),
        "failed": [c.get("error") for c in failed],
        "hosts": list(dict.fromkeys(str(c.get("host", "")) for c in cells)),
    }
    if len(good) == 1:
        summary["tokens_per_sec"] = good[0]["tokens_per_sec"]
        summary["std_tokens_per_sec"] = good[0].get("std_tokens_per_sec")
        summary["ci95_tokens_per_sec"] = good[0].get("ci95_tokens_per_sec")
    elif good:
        summary["tokens_per_sec"] = statistics.fmean(c["tokens_per_sec"] for c in good)
    per_joule = [c["tokens_per_joule"] for c in good if c.get("tokens_per_joule") is not None]
    summary["tokens_per_joule"] = statistics.fmean(per_joule) if per_joule else None
    summary["metered"] = any(c.get("energy_source") for c in cells)
    summary["energy_simulated"] = any(c.get("energy_simulated") for c in good)
    with_serving(summary, good)  # a serving cell's tails and goodput (compare_serving)
    return summary


def speedup(a: dict[str, Any] | None, b: dict[str, Any] | None) -> float | None:
    """B's tokens/s over A's, when both measured and A measured a positive speed."""
    if a is None or b is None:
        return None
    speed_a, speed_b = a["tokens_per_sec"], b["tokens_per_sec"]
    if speed_a is None or speed_b is None or speed_a <= 0:
        return None
    return speed_b / speed_a


def within_noise(a: dict[str, Any] | None, b: dict[str, Any] | None) -> bool | None:
    """Whether the two sides' 95 % intervals overlap; None where either has none (a side that
    averages several cells has none)."""
    if a is None or b is None:
        return None
    if a.get("ci95_tokens_per_sec") is None or b.get("ci95_tokens_per_sec") is None:
        return None
    if a["tokens_per_sec"] is None or b["tokens_per_sec"] is None:
        return None
    return not separated(a, b)


def settings_differ(
    cells_a: list[Record] | None, cells_b: list[Record] | None
) -> dict[str, dict[str, list[str]]]:
    """The COMPARED settings the two sides' cells differ in: {key: {"a": values, "b": values}}.
    Empty when a side has no cells, or none with settings (an older run: unknown, not refused)."""
    with_a = [c for c in cells_a or [] if c.get("settings")]
    with_b = [c for c in cells_b or [] if c.get("settings")]
    if not with_a or not with_b:
        return {}
    found = differing(with_a, with_b, COMPARED)
    return {key: {"a": left, "b": right} for key, (left, right) in found.items()}


def differing_text(rows: list[Record]) -> str | None:
    """One line naming every COMPARED setting some row differs in, with each side's values;
    None when none does."""
    seen: dict[str, tuple[set[str], set[str]]] = {}
    for row in rows:
        for key, values in row.get("settings_differ", {}).items():
            left, right = seen.setdefault(key, (set(), set()))
            left.update(values["a"])
            right.update(values["b"])
    if not seen:
        return None
    return "; ".join(
        f"{key} {'/'.join(sorted(left))} (A) vs {'/'.join(sorted(right))} (B)"
        for key, (left, right) in sorted(seen.items())
    )


def _note(a: dict[str, Any] | None, b: dict[str, Any] | None) -> str:
    if a is None:
        return "only in B"
    if b is None:
        return "only in A"
    notes = []
    for name, summary in (("A", a), ("B", b)):
        failures = summary["failed"]
        if len(failures) == 1:
            notes.append(f"failed in {name}: {failures[0]}")
        elif failures:
            notes.append(f"failed in {name}: {len(failures)} cells")
    return "; ".join(notes)


def _hosts(a: dict[str, Any] | None, b: dict[str, Any] | None) -> str:
    hosts = [", ".join(s["hosts"]) for s in (a, b) if s is not None]
    return hosts[0] if len(set(hosts)) == 1 else " → ".join(hosts)


def compare_reports(
    a: dict[str, Any], b: dict[str, Any], by: list[str] | None = None
) -> list[Record]:
    """One row per (by columns, test) of either report: A's in order, then those only B has.
    Each row names its by columns, its test, the hosts on each side, and both figures."""
    by = by or default_by(a, b)
    groups_a, groups_b = _grouped(a, by), _grouped(b, by)
    rows = []
    for key in [*groups_a, *(k for k in groups_b if k not in groups_a)]:
        side_a, side_b = side(groups_a.get(key)), side(groups_b.get(key))
        row: Record = dict(zip(by, key[:-1], strict=True))
        row.update(
            test=key[-1],
            hosts=_hosts(side_a, side_b),
            a=side_a,
            b=side_b,
            speedup=speedup(side_a, side_b),
            within_noise=within_noise(side_a, side_b),
            settings_differ=settings_differ(groups_a.get(key), groups_b.get(key)),
            note=_note(side_a, side_b),
        )
        if row["settings_differ"]:
            differs = "settings differ: " + ", ".join(row["settings_differ"])
            row["note"] = "; ".join(filter(None, [row["note"], differs]))
        rows.append(row)
    return rows


def _figure(summary: dict[str, Any] | None) -> str:
    if summary is None or summary["tokens_per_sec"] is None:
        return NA
    if summary["cells"] > 1:
        return f"{summary['tokens_per_sec']:.2f} (mean of {summary['cells']})"
    return mean_std(summary, "tokens_per_sec", "std_tokens_per_sec")


Column = tuple[str, Callable[[Record], str]]


def columns(rows: list[Record]) -> list[Column]:
    """The row's key columns (the hosts when the host is not one of them), the test, A, B."""
    keys = [k for k in (rows[0] if rows else {}) if k in BY_COLUMNS]
    shown: list[Column] = [] if "host" in keys else [("hosts", lambda row: row["hosts"])]
    shown += [(key, lambda row, key=key: str(row[key])) for key in keys]
    return [
        *shown,
        ("test", lambda row: row["test"]),
        ("tok/s A", lambda row: _figure(row["a"])),
        ("tok/s B", lambda row: _figure(row["b"])),
        ("speed-up", speedup_text),
        *(ENERGY_COLUMNS if any(_metered(row) for row in rows) else []),
        ("note", lambda row: row["note"]),
    ]


def speedup_text(row: Record) -> str:
    """`1.50x`; `~1.02x` when the two intervals overlap (within the noise)."""
    if row["speedup"] is None:
        return NA
    return ("~" if row.get("within_noise") else "") + f"{row['speedup']:.2f}x"


def _metered(row: Record) -> bool:
    return any(row[s] is not None and row[s]["metered"] for s in ("a", "b"))


def _per_joule(name: str) -> Column:
    """Tokens per joule of one side (docs/energy.md), `sim` after a figure no meter gave."""
    return (f"tok/J {name.upper()}", lambda row: NA if row[name] is None else per_joule(row[name]))


ENERGY_COLUMNS: list[Column] = [_per_joule("a"), _per_joule("b")]
"""Shown after the speed-up when either report metered energy."""


COMPARE_FOLDS = ("tok/J A", "tok/J B", "n_batch", "batch", "hosts")
"""The columns a narrow terminal drops, the first first (shared.tables); the other keys cells
are matched by, the test, both tok/s, the speed-up and the note always stay."""


def rich_comparison(rows: list[Record], name_a: str, name_b: str) -> FitTable:
    """Faster rows in green, slower in red; unmatched or failed tests dimmed."""
    title = Text(shown(f"A = {name_a}, B = {name_b}; speed-up = B/A tok/s", DETAIL_CAP))
    table = FitTable(title=title, folds=COMPARE_FOLDS)
    kept = columns(rows)
    for name, _ in kept:
        left = name not in ("batch", "n_batch") and not name.startswith(("tok/", "speed"))
        wrap = TEXT if name == "note" else WORDS if name == "hosts" else WHOLE
        table.add_column(name, justify="left" if left else "right", wrap=wrap)
    for row in rows:
        ratio = row["speedup"]
        style = "dim" if ratio is None else "green" if ratio > 1 else "red" if ratio < 1 else None
        if ratio is not None and row.get("within_noise"):
            style = None  # within the noise: neither faster nor slower
        # an agent's words (a model, a test, a note quoting an error): Text, never markup
        table.add_row(*(Text(shown(render(row), DETAIL_CAP)) for _, render in kept), style=style)
    return table


def comparison_text(rows: list[Record], name_a: str, name_b: str, fmt: str) -> str:
    """The comparison as md, csv or json text (a table goes through rich_comparison)."""
    if fmt == "json":
        return json.dumps({"a": name_a, "b": name_b, "rows": rows}, indent=2, default=str) + "\n"
    shown = columns(rows)
    if fmt == "csv":
        out = io.StringIO()
        writer = csv.writer(out)
        keys = [name for name, _ in shown if name == "hosts" or name in BY_COLUMNS]
        energy = ["tokens_per_joule"] if any(_metered(row) for row in rows) else []
        writer.writerow(
            [*keys, "test", "avg_ts_a", "avg_ts_b", "speedup"]
            + [f"{key}_{s}" for key in energy for s in ("a", "b")]
            + ["note"]
        )
        for row in rows:
            speeds = [None if row[s] is None else row[s]["tokens_per_sec"] for s in ("a", "b")]
            per_j = [None if row[s] is None else row[s][key] for key in energy for s in ("a", "b")]
            writer.writerow(
                [*(row[key] for key in keys), row["test"], *speeds, row["speedup"], *per_j]
                + [row["note"]]
            )
        return out.getvalue()
    if fmt == "md":
        lines = [
            f"<!-- A = {name_a}, B = {name_b}; speed-up = B/A tok/s -->",
            "| " + " | ".join(name for name, _ in shown) + " |",
            "| " + " | ".join("---" for _ in shown) + " |",
        ]
        lines += [
            "| " + " | ".join(render(row).replace("|", "\\|") for _, render in shown) + " |"
            for row in rows
        ]
        return "\n".join(lines) + "\n"
    raise ValueError(f"unknown comparison format {fmt!r}; choose from {COMPARE_FORMATS}")
