"""`coordinator doctor --level 2`: level 1 (each agent's doctor, with its memory-bandwidth
probe: shared.benchmark.bandwidth) and, on every host at once, a fixed small decode cell; the
decode's tok/s and the probe's read GB/s each judged against the band its family's earlier
level-2 results set (shared.benchmark.health.band), with whether the SoC sensor moved under
that load and the bandwidth the decode implies (shared.benchmark.roofline). One table, a
verdict per host; a failing host gets the condition `doctor`, a passing one has its
conditions lifted."""

from __future__ import annotations

import statistics
from typing import Any

from rich.text import Text

from coordinator.hosts.link import Settings, Target
from coordinator.runs.conditions import add_condition, uncordon
from coordinator.runs.driver import Observer
from coordinator.runs.fleet import FleetResult, run_fleet
from coordinator.runs.health import observations, with_health
from coordinator.runs.probes import BANDWIDTH, add_probe, figure_history
from coordinator.runs.store import RunStore
from shared.benchmark.bandwidth import CPU, figures, judge, unmeasured
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
    rows: list[dict[str, Any]],
    targets: list[Target],
    settings: Settings,
    store: RunStore,
) -> tuple[list[dict[str, Any]], FleetResult | None]:
    """The level-1 `rows` (each agent's doctor with its bandwidth probe) with each host's
    level-2 figures and verdict, and the decode run (None: no host was reachable); the probes
    are stored under it for later bands. Conditions are not touched (record_verdicts)."""
    reachable = [t for t, row in zip(targets, rows, strict=True) if row["reachable"]]
    result = decode_run(reachable, settings, store) if reachable else None
    return judged(rows, result, store), result


def decode_run(
    reachable: list[Target], settings: Settings, store: RunStore, observer: Observer | None = None
) -> FleetResult:
    """The fixed decode cell on every reachable host at once, stored as a benchmark run."""
    return run_fleet(reachable, LEVEL_2_SPEC.to_dict(), store, settings, observer)


def judged(
    rows: list[dict[str, Any]], result: FleetResult | None, store: RunStore
) -> list[dict[str, Any]]:
    """Each row judged at level 2 from the decode run (None: it did not run)."""
    report: dict[str, Any] = {"cells": [], "hosts": []}
    if result is not None:
        report = with_health(store, store.load_report(result.run_id))
    seen = observations(store)
    for row in rows:
        judge_host(row, report, seen, store)
    return rows


def record_verdicts(store: RunStore, rows: list[dict[str, Any]], run_id: str | None) -> None:
    """A failing host gets the condition `doctor` (it is cordoned) with why; a passing host
    has all of its conditions lifted."""
    for row in rows:
        if row["verdict"] == FAIL:
            add_condition(store, row["host"], DOCTOR_CONDITION, "; ".join(row["why"]), run_id)
        else:
            row["lifted"] = uncordon(store, row["host"])


def judge_host(row: dict[str, Any], report: dict[str, Any], seen: list, store: RunStore) -> None:
    host = row["host"]
    cell = next((c for c in report["cells"] if c.get("host") == host), None)
    machine = next((h["machine"] for h in report["hosts"] if h["host"] == host), None)
    row.update(tokens_per_sec=None, band=None, sensor=None, bandwidth_gbs=None, why=[])
    if not (row["report"] and row["report"]["ok"]):
        row["why"].append("level 1 failed" if row["reachable"] else f"unreachable: {row['error']}")
    family = family_of(
        machine or (row["report"] or {}).get("machine"), (cell or {}).get("settings")
    )
    judge_memory(row, machine, family, store, report.get("run_id"))
    if cell is None:
        row["why"].append(not_run(report, host, "the decode cell"))
    else:
        row["tokens_per_sec"] = cell.get("tokens_per_sec")
        if cell.get("verdict") != VALID:
            row["why"].append(f"the decode cell is {verdict_text(cell)}")
        row["sensor"] = sensor_moved(cell)
        roof = cell.get("roofline") or {}
        if roof.get("fraction") is not None:
            row["bandwidth_gbs"] = roof["fraction"] * roof["bandwidth_gbs"]
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


def judge_memory(
    row: dict[str, Any],
    machine: dict[str, Any] | None,
    family: tuple,
    store: RunStore,
    run_id: str | None,
) -> None:
    """The host's bandwidth probe as figures (`memory`), its family's band (`memory_band`)
    and why it fails: not measured, or below the band. A measured probe is kept under the
    run for later bands."""
    machine = machine or (row["report"] or {}).get("machine")
    raw = (row["report"] or {}).get("bandwidth")
    if raw is None:
        why = row.get("bandwidth_refused") or (
            "its agent sent no bandwidth probe" if row["reachable"] else "unreachable"
        )
        found = unmeasured(why)
    else:
        found = figures(raw, machine)
    history = figure_history(store, BANDWIDTH, family, run_id)
    row["memory"] = found
    row["memory_band"], below = judge(found["read"]["gbs"], history)
    row["memory_band_runs"] = len(history)
    if found["read"]["gbs"] is None:
        if row["reachable"]:
            row["why"].append(f"memory bandwidth not measured: {found['why']}")
    elif below:
        row["why"].append(below)
    if run_id is not None and found["read"]["gbs"] is not None:
        add_probe(store, run_id, row["host"], BANDWIDTH, family, found["read"]["gbs"], found)


def not_run(report: dict[str, Any], host: str, what: str) -> str:
    """`the decode cell did not run`, with the line its host's run failed with when it has one
    (a job refused, the host gone)."""
    error = next((h.get("error") for h in report.get("hosts") or [] if h["host"] == host), None)
    return f"{what} did not run" + (f": {error}" if error else "")


def sensor_moved(cell: dict[str, Any]) -> str:
    start, end = cell.get("soc_temp_start_c"), cell.get("soc_temp_end_c")
    if start is None or end is None:
        return "no sensor"
    return f"{start:.1f} → {end:.1f} °C" + ("" if end != start else " (did not move)")


def level_two_table(rows: list[dict[str, Any]]) -> FitTable:
    table = FitTable(title="mlx-fleet doctor, level 2", folds=("sensor", "decode GB/s"))
    for name in ("host", "level 1", "decode tok/s", "band", "decode GB/s", "memory", "sensor"):
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
            "N/A" if row["bandwidth_gbs"] is None else f"{row['bandwidth_gbs']:.0f}",
            memory_cell(row),
            Text(shown(row["sensor"] or "N/A")),
            Text(row["verdict"] + (f": {shown('; '.join(row['why']))}" if row["why"] else "")),
            style="red" if row["verdict"] == FAIL else None,
        )
    return table


def memory_cell(row: dict[str, Any]) -> Text:
    """`412 GB/s, 75 % of 546`, `8.9 GB/s, CPU path`, or N/A; its band beneath."""
    found = row["memory"]
    read = found["read"]["gbs"]
    if read is None:
        return Text("N/A")
    if found["fraction"] is not None:
        said = f"{read:.1f} GB/s, {found['fraction']:.0%} of {found['spec_gbs']:g}"
    else:
        said = f"{read:.1f} GB/s, " + ("CPU path" if found["backend"] == CPU else "no spec")
    low_high = row["memory_band"]
    band_text = (
        f"no band yet ({row['memory_band_runs']} of 3)"
        if low_high is None
        else f"band {low_high[0]:.1f} to {low_high[1]:.1f}"
    )
    return Text(f"{said}\n{band_text}")
