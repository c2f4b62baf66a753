"""A stored run as one report: pure assembly of what the run store holds. A benchmark run's
fleet report lists every cell a host's job never delivered as `not run` (and why), so no format
hides what is missing; a netbench run's is what `coordinator netbench` printed, every figure
computed again from the stored timings."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from shared.benchmark.aggregate import mark_fastest
from shared.benchmark.matrix import planned_cells
from shared.benchmark.results import not_run
from shared.distributed.netbench import measurement_of, report_of
from shared.reports.group_cells import mark_groups
from shared.wire.agent_shapes import MACHINE_FIELDS, MODEL_FIELDS, salvaged, salvaged_record

RUNNING, INTERRUPTED = "running", "interrupted"


def fleet_report(
    run: Mapping[str, Any],
    status: str,
    hosts: list[Mapping[str, Any]],
    cells: list[Mapping[str, Any]],
) -> dict[str, Any]:
    """The report of one run: `run` its row, `status` as it is to be shown (a run whose
    coordinator is gone shows `interrupted`), `hosts` and `cells` their rows in order."""
    spec = json.loads(run["spec"])
    records = [salvaged_record(json.loads(cell["record"])) for cell in cells]
    if status != RUNNING:
        records += missing_cells(spec, hosts, cells)
    unfinished = {
        RUNNING: " (running)",
        INTERRUPTED: " (interrupted: its coordinator stopped; `coordinator resume` finishes it)",
    }.get(status, "")
    return {
        "title": f"mlx-fleet {run['kind']} {run['id']}{unfinished}",
        "run_id": run["id"],
        "kind": run["kind"],
        "started": run["started"],
        "finished": run["finished"],
        "status": status,
        "spec": spec,
        "hosts": [
            {
                "host": host["host"],
                "machine": _stored(host["machine"], MACHINE_FIELDS),
                "models": [salvaged(info, MODEL_FIELDS)[0] for info in json.loads(host["models"])],
                "status": host["status"],
                "error": host["error"],
            }
            for host in hosts
        ],
        "cells": mark_fastest(mark_groups(records)),
        "interrupted": bool(run["interrupted"]) or status == INTERRUPTED,
    }


def netbench_report(
    run: Mapping[str, Any],
    status: str,
    hosts: list[Mapping[str, Any]],
    cells: list[Mapping[str, Any]],
) -> dict[str, Any]:
    """The report of one netbench run (coordinator.runs.netbench.save_run's rows): its spec, each
    host's rank as it ended, the line it failed with, and shared.distributed.netbench's figures."""
    spec = json.loads(run["spec"])
    found = [measurement_of(json.loads(cell["record"])) for cell in cells]
    return {
        "title": f"mlx-fleet netbench {run['id']}",
        "run_id": run["id"],
        "kind": run["kind"],
        "started": run["started"],
        "finished": run["finished"],
        "status": status,
        "interrupted": bool(run["interrupted"]) or status == INTERRUPTED,
        "error": run["error"],
        "job": spec.get("job"),
        "hosts": [host["host"] for host in hosts],
        "backend": spec.get("backend"),
        "port": spec.get("port"),
        "spec": spec,
        "ranks": [
            {
                "host": host["host"],
                "status": host["status"],
                "error": host["error"],
                "machine": _stored(host["machine"], MACHINE_FIELDS),
            }
            for host in hosts
        ],
        **report_of(found),
    }


def _stored(text: str | None, checks: dict[str, Any]) -> dict[str, Any] | None:
    """A stored map with the values its checks refuse set to nil (a run stored before agents'
    messages were checked)."""
    return None if text is None else salvaged(json.loads(text), checks)[0]


def missing_cells(
    spec: dict[str, Any], hosts: list[Mapping[str, Any]], cells: list[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """`not run` records for the cells of each started job that never arrived, with the host's
    error as the reason. Hosts whose job never started have no cells to list: their error says
    why."""
    planned = planned_cells(spec)
    kept: dict[str, set[int]] = {}
    for cell in cells:
        if cell["idx"] is not None:
            kept.setdefault(cell["host"], set()).add(cell["idx"])
    records = []
    for host in hosts:
        if host["job"] is None:
            continue
        have = kept.get(host["host"], set())
        lacking = [cell for index, cell in enumerate(planned) if index not in have]
        reason = host["error"] or "never received"
        records += [{**record, "host": host["host"]} for record in not_run(lacking, reason)]
    return records
