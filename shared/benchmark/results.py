"""Result records: one plain dict per cell, the same on the agent, the wire and the coordinator.

Plain dicts (msgpack- and JSON-ready) keep the seed's metric keys: seq_len, tokens_per_sec,
latency_ms, peak_memory_gb, active_memory_gb, soc_temp_c.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from shared.benchmark.energy import energy_flags
from shared.benchmark.matrix import Cell
from shared.benchmark.verdict import judge

OK = "ok"
FAILED = "failed"
NOT_RUN = "not run"
PAUSED_FLAG = "paused"
HOT_FLAG = "hot"
SIMULATED_FLAG = "simulated"
REWARMED_FLAG = "rewarmed"


def cell_record(
    cell: Cell,
    metrics: dict[str, Any] | None = None,
    error: str | None = None,
    thermal: dict[str, Any] | None = None,
    measured: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A finished cell: its coordinates, its metrics or its error, what the guard saw, and what was
    `measured` around its iterations (energy, a sustained run's windows: shared.benchmark.energy,
    shared.benchmark.sustain), which may replace metrics it stands for; judged
    (shared.benchmark.verdict) last."""
    record: dict[str, Any] = cell.to_dict()
    record["status"] = FAILED if error is not None else OK
    record["error"] = error
    record.update(metrics or {})
    thermal = thermal or {}
    record["soc_temp_start_c"] = thermal.get("soc_temp_start_c")
    record["soc_temp_end_c"] = thermal.get("soc_temp_end_c")
    record["soc_temp_c"] = record["soc_temp_end_c"]
    record["pressure_start"] = thermal.get("pressure_start")
    record["pressure_end"] = thermal.get("pressure_end")
    record["pause_s"] = thermal.get("pause_s", 0.0)
    record["cool_wait_s"] = thermal.get("cool_wait_s", 0.0)
    record["flags"] = list(thermal.get("flags", []))
    record["thermal_source"] = thermal.get("thermal_source")
    if thermal.get("gpu_clock") and not (measured or {}).get("sustain"):
        record["gpu_clock"] = thermal["gpu_clock"]  # a sustained cell's curve is its windows
    record.update(measured or {})
    record["flags"] += energy_flags(record)
    if (record.get("rewarm_iterations") or 0) > 0:
        record["flags"].append(REWARMED_FLAG)  # informational: re-warmed after a gap
    return judge(record)


def not_run(cells: Iterable[Cell], reason: str) -> list[dict[str, Any]]:
    """Records for cells a run never reached, so every format shows what is missing and why."""
    records = []
    for cell in cells:
        record = cell_record(cell, error=reason)
        record["status"] = NOT_RUN
        records.append(judge(record))
    return records


def failed_cells(records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in records if r.get("status") != OK]


def cooling_line(records: Iterable[dict[str, Any]]) -> str | None:
    """One host's time lost to cooling over its cells, for the report's header (issue 42: the
    final table never said how long a host was paused or waited to cool): `paused 34 s in 3
    cells; waited 12 s to cool before 2 cells`; None when it lost none."""
    cells = list(records)
    paused = [r.get("pause_s") or 0.0 for r in cells if (r.get("pause_s") or 0.0) > 0]
    waited = [r.get("cool_wait_s") or 0.0 for r in cells if (r.get("cool_wait_s") or 0.0) >= 1]
    parts = []
    if paused:
        parts.append(f"paused {sum(paused):.0f} s in {len(paused)} cell{_s(paused)}")
    if waited:
        parts.append(f"waited {sum(waited):.0f} s to cool before {len(waited)} cell{_s(waited)}")
    return "; ".join(parts) or None


def _s(items: list[float]) -> str:
    return "" if len(items) == 1 else "s"
