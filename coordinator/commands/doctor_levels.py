"""`coordinator doctor --level 2`: level 1 (each agent's doctor) and, on every host at once, a
fixed small decode cell judged against the band its family's earlier level-2 results set
(shared.benchmark.health.band), with whether the SoC sensor moved under that load and the
bandwidth the decode implies (shared.benchmark.roofline). One table, a verdict per host; a
failing host gets the condition `doctor`, a passing one has its conditions lifted."""

from __future__ import annotations

import statistics
from typing import Any

from rich.text import Text

from coordinator.hosts.link import Settings, Target
from coordinator.runs.conditions import add_condition, uncordon
from coordinator.runs.fleet import run_fleet
from coordinator.runs.health import observations, with_health
from coordinator.runs.store import RunStore
from shared.benchmark.health import band, cell_key, family_of
from shared.benchmark.matrix import MatrixSpec
from shared.benchmark.verdict import VALID, verdict_text
from shared.safe_text import shown
from shared.tables import WHOLE, WORDS, FitTable

LEVEL_2_SPEC = MatrixSpec(
    n_prompt=(), n_gen=(32,), models=("small",), warmup=1, iterations=20, precision=0.05
)
"""The fixed cell every level 2 runs (tg32 of the built-in small model, -r auto at 5 %, at most
20 iterations), so each host's figure has the same meaning run after run."""
DOCTOR_CONDITION = "doctor"
PASS, FAIL = "pass", "fail"


def level_two(
    rows: list[dict[str, Any]], targets: list[Target], settings: Settings, store: RunStore
) -> list[dict[str, Any]]:
    """The level-1 `rows` with each host's level-2 figures and verdict; records the verdicts
    as conditions."""
    reachable = [t for t, row in zip(targets, rows, strict=True) if row["reachable"]]
    report: dict[str, Any] = {"cells": [], "hosts": []}
    if reachable:
        result = run_fleet(reachable, LEVEL_2_SPEC.to_dict(), store, settings)
        report = with_health(store, store.load_report(result.run_id))
    seen = observations(store)
    for row in rows:
        judge_host(row, report, seen)
        if row["verdict"] == FAIL:
            add_condition(store, row["host"], DOCTOR_CONDITION, "; ".join(row["why"]), None)
        else:
            row["lifted"] = uncordon(store, row["host"])
    return rows


def judge_host(row: dict[str, Any], report: dict[str, Any], seen: list) -> None:
    host = row["host"]
    cell = next((c for c in report["cells"] if c.get("host") == host), None)
    machine = next((h["machine"] for h in report["hosts"] if h["host"] == host), None)
    row.update(tokens_per_sec=None, band=None, sensor=None, bandwidth_gbs=None, why=[])
    if not (row["report"] and row["report"]["ok"]):
        row["why"].append("level 1 failed" if row["reachable"] else f"unreachable: {row['error']}")
    if cell is None:
        row["why"].append("the decode cell did not run")
    else:
        row["tokens_per_sec"] = cell.get("tokens_per_sec")
        if cell.get("verdict") != VALID:
            row["why"].append(f"the decode cell is {verdict_text(cell)}")
        row["sensor"] = sensor_moved(cell)
        roof = cell.get("roofline") or {}
        if roof.get("fraction") is not None:
            row["bandwidth_gbs"] = roof["fraction"] * roof["bandwidth_gbs"]
        family = family_of(machine, cell.get("settings"))
        history = [
            o.tokens_per_sec
            for o in seen
            if o.cell == cell_key(cell) and o.family == family and o.run != report.get("run_id")
        ]
        row["band"] = band(history)
        row["band_runs"] = len(history)
        speed = row["tokens_per_sec"]
        if row["band"] is not None and speed is not None and not row["band"][0] <= speed:
            row["why"].append(
                f"{speed:.1f} tok/s below its family's band ({row['band'][0]:.1f} to "
                f"{row['band'][1]:.1f}, from {len(history)} level-2 results; median "
                f"{statistics.median(history):.1f})"
            )
    row["verdict"] = FAIL if row["why"] else PASS


def sensor_moved(cell: dict[str, Any]) -> str:
    start, end = cell.get("soc_temp_start_c"), cell.get("soc_temp_end_c")
    if start is None or end is None:
        return "no sensor"
    return f"{start:.1f} → {end:.1f} °C" + ("" if end != start else " (did not move)")


def level_two_table(rows: list[dict[str, Any]]) -> FitTable:
    table = FitTable(title="mlx-fleet doctor, level 2", folds=("sensor", "bandwidth"))
    for name in ("host", "level 1", "decode tok/s", "band", "bandwidth", "sensor"):
        table.add_column(name, wrap=WHOLE)
    table.add_column("verdict", wrap=WORDS)
    for row in rows:
        speed = row["tokens_per_sec"]
        low_high = row["band"]
        table.add_row(
            Text(shown(row["host"])),
            "ok" if row["report"] and row["report"]["ok"] else "failed",
            "N/A" if speed is None else f"{speed:.1f}",
            f"no band yet ({row.get('band_runs', 0)} of 3 results)"
            if low_high is None
            else f"{low_high[0]:.1f} to {low_high[1]:.1f}",
            "N/A" if row["bandwidth_gbs"] is None else f"{row['bandwidth_gbs']:.0f} GB/s",
            Text(shown(row["sensor"] or "N/A")),
            Text(row["verdict"] + (f": {shown('; '.join(row['why']))}" if row["why"] else "")),
            style="red" if row["verdict"] == FAIL else None,
        )
    return table
