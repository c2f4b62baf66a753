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


def observations(
    store: RunStore, runs: int = HEALTH_RUNS, of_run: str | None = None
) -> list[Observation]:
    """Each valid cell of the `runs` latest benchmark runs, its stored record and machine
    checked again (a store is read as untrusted as the agent that wrote it). With `of_run`:
    only what scoring that run needs, its hosts' cells of its cell names up to its start, the
    latest PAST_CELLS of each (so a large store costs no more than a small one)."""
    latest = "SELECT id FROM runs WHERE kind = ? ORDER BY started DESC, rowid DESC LIMIT ?"
    if of_run is None:
        rows = store.query(
            f"{SELECTED} WHERE c.status = 'ok' AND r.id IN ({latest}) ORDER BY c.seq",
            (BENCHMARK, runs),
        )
    else:
        rows = store.query(
            f"SELECT * FROM ({SELECTED_RANKED} WHERE c.status = 'ok' AND r.id IN ({latest}) "
            "AND r.started <= (SELECT started FROM runs WHERE id = ?) "
            "AND c.host IN (SELECT host FROM run_hosts WHERE run_id = ?) "
            "AND c.name IN (SELECT name FROM cells WHERE run_id = ?)) "
            "WHERE latest <= ? ORDER BY seq",
            (BENCHMARK, runs, of_run, of_run, of_run, PAST_CELLS),
        )
    found = []
    for row in rows:
        machine = None
        if row["machine"] is not None:
            machine = salvaged(json.loads(row["machine"]), MACHINE_FIELDS)[0]
        record = salvaged_record(json.loads(row["record"]))
        seen = health.observation(row["id"], row["started"], row["host"], machine, record)
        if seen is not None:
            found.append(seen)
    return found


SELECTED = (
    "SELECT r.id, r.started, c.host, c.seq, h.machine, c.record FROM cells c "
    "JOIN runs r ON r.id = c.run_id "
    "LEFT JOIN run_hosts h ON h.run_id = c.run_id AND h.host = c.host"
)
SELECTED_RANKED = SELECTED.replace(
    "c.record FROM",
    "c.record, ROW_NUMBER() OVER (PARTITION BY c.host, c.name "
    "ORDER BY r.started DESC, c.seq DESC) AS latest FROM",
)
PAST_CELLS = 4 * (health.RECENT + 1)
"""A host's latest ok cells of one name read to score a run: its own, and enough earlier ones
that RECENT runs' valid cells are among them unless most were invalid."""


def latest_run(store: RunStore) -> str | None:
    rows = store.query(
        "SELECT id FROM runs WHERE kind = ? ORDER BY started DESC, rowid DESC LIMIT 1",
        (BENCHMARK,),
    )
    return rows[0]["id"] if rows else None


def run_health(store: RunStore, run_id: str) -> dict[str, HostScore]:
    """Every host of the run (a full id) scored, with the hosts whose cells all failed or were
    invalid left out: nothing of theirs can be scored."""
    return health.score_run(run_id, observations(store, of_run=run_id))


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
