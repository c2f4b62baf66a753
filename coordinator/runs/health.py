"""Fleet health over the run store: every valid cell of the latest benchmark runs scored
against its family and its own past (shared.benchmark.health), for `coordinator health`, the
fleet table, `show` and `compare`."""

from __future__ import annotations

import json
from typing import Any

from coordinator.runs.store import RunStore
from shared.benchmark import health
from shared.benchmark.health import HostScore, Observation
from shared.benchmark.roofline import mark_roofline
from shared.wire.agent_shapes import MACHINE_FIELDS, salvaged, salvaged_record

HEALTH_RUNS = 200
"""The latest benchmark runs read: the run judged and every host's past (RECENT runs each)."""
BENCHMARK = "benchmark"


def observations(store: RunStore, runs: int = HEALTH_RUNS) -> list[Observation]:
    """Each valid cell of the `runs` latest benchmark runs, its stored record and machine
    checked again (a store is read as untrusted as the agent that wrote it)."""
    rows = store.query(
        "SELECT r.id, r.started, c.host, h.machine, c.record FROM cells c "
        "JOIN runs r ON r.id = c.run_id "
        "LEFT JOIN run_hosts h ON h.run_id = c.run_id AND h.host = c.host "
        "WHERE c.status = 'ok' AND r.id IN "
        "(SELECT id FROM runs WHERE kind = ? ORDER BY started DESC, rowid DESC LIMIT ?) "
        "ORDER BY c.seq",
        (BENCHMARK, runs),
    )
    found = []
    for row in rows:
        machine = (
            None
            if row["machine"] is None
            else salvaged(json.loads(row["machine"]), MACHINE_FIELDS)[0]
        )
        record = salvaged_record(json.loads(row["record"]))
        seen = health.observation(row["id"], row["started"], row["host"], machine, record)
        if seen is not None:
            found.append(seen)
    return found


def latest_run(store: RunStore) -> str | None:
    rows = store.query(
        "SELECT id FROM runs WHERE kind = ? ORDER BY started DESC, rowid DESC LIMIT 1",
        (BENCHMARK,),
    )
    return rows[0]["id"] if rows else None


def run_health(store: RunStore, run_id: str) -> dict[str, HostScore]:
    """Every host of the run (a full id) scored, with the hosts whose cells all failed or were
    invalid left out: nothing of theirs can be scored."""
    return health.score_run(run_id, observations(store))


def with_health(store: RunStore, report: dict[str, Any]) -> dict[str, Any]:
    """A benchmark run's report with its cells marked (shared.benchmark.health.mark_health,
    shared.benchmark.roofline.mark_roofline) and `health`: each scored host's scores, flags and
    why."""
    if report.get("kind", BENCHMARK) != BENCHMARK:
        return report
    scores = run_health(store, report["run_id"])
    cells = mark_roofline(report)
    return {
        **report,
        "cells": health.mark_health(cells, scores),
        "health": [health.as_dict(score) for score in scores.values()],
    }
