"""What `coordinator doctor` measures beside its benchmark runs (level 2's memory-bandwidth
probe, shared.benchmark.bandwidth; level 3's steady-state tok/s), kept in the run store with
the host's family (shared.benchmark.health.family_of) under the run it belongs to, so that each
later level judges a host against the band its family's earlier figures set."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

from coordinator.runs.store import RunStore

BANDWIDTH = "bandwidth"
STEADY = "steady"
HISTORY_RUNS = 200
"""The latest probes of a name and family read for a band: the family's recent past."""


def add_probe(
    store: RunStore,
    run_id: str,
    host: str,
    name: str,
    family: Sequence[Any],
    figure: float,
    record: Any,
) -> None:
    """Keep the probe's `figure` (what bands are made of) with its whole `record`."""
    store.query(
        "INSERT OR REPLACE INTO probes (run_id, host, name, family, record) VALUES (?, ?, ?, ?, ?)",
        (run_id, host, name, json.dumps(list(family)), json.dumps({"figure": figure, **record})),
    )


def figure_history(
    store: RunStore, name: str, family: Sequence[Any], other_than: str | None
) -> list[float]:
    """The figures of the family's earlier probes of `name` (the HISTORY_RUNS latest, of any
    run but `other_than`); one that is not a positive finite number is left out (the store is
    read as untrusted as the agent that wrote it)."""
    rows = store.query(
        "SELECT p.record FROM probes p JOIN runs r ON r.id = p.run_id "
        "WHERE p.name = ? AND p.family = ? AND p.run_id IS NOT ? "
        "ORDER BY r.started DESC, r.rowid DESC LIMIT ?",
        (name, json.dumps(list(family)), other_than, HISTORY_RUNS),
    )
    found = []
    for row in rows:
        record = json.loads(row["record"])
        figure = record.get("figure") if isinstance(record, dict) else None
        number = isinstance(figure, (int, float)) and not isinstance(figure, bool)
        if number and math.isfinite(figure) and figure > 0:
            found.append(float(figure))
    return found
