"""What `coordinator doctor --level 2` measures beside its decode cell (the memory-bandwidth
probe, shared.benchmark.bandwidth), kept in the run store with the host's family
(shared.benchmark.health.family_of) under the level-2 run, so that each later level 2 judges a
host against the band its family's earlier figures set."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

from coordinator.runs.store import RunStore

BANDWIDTH = "bandwidth"
HISTORY_RUNS = 200
"""The latest probes of a name read for a band: a family's recent past."""


def add_probe(
    store: RunStore, run_id: str, host: str, name: str, family: Sequence[Any], record: Any
) -> None:
    store.query(
        "INSERT OR REPLACE INTO probes (run_id, host, name, family, record) VALUES (?, ?, ?, ?, ?)",
        (run_id, host, name, json.dumps(list(family)), json.dumps(record)),
    )


def read_history(
    store: RunStore, family: Sequence[Any], other_than: str | None, name: str = BANDWIDTH
) -> list[float]:
    """The read GB/s of the family's earlier bandwidth probes (the HISTORY_RUNS latest of the
    name, any run but `other_than`); a stored figure that is not a positive finite number is
    left out (the store is read as untrusted as the agent that wrote it)."""
    rows = store.query(
        "SELECT p.run_id, p.record FROM probes p JOIN runs r ON r.id = p.run_id "
        "WHERE p.name = ? AND p.family = ? AND p.run_id IS NOT ? "
        "ORDER BY r.started DESC, r.rowid DESC LIMIT ?",
        (name, json.dumps(list(family)), other_than, HISTORY_RUNS),
    )
    found = []
    for row in rows:
        record = json.loads(row["record"])
        read = record.get("read") if isinstance(record, dict) else None
        gbs = read.get("gbs") if isinstance(read, dict) else None
        number = isinstance(gbs, (int, float)) and not isinstance(gbs, bool)
        if number and math.isfinite(gbs) and gbs > 0:
            found.append(float(gbs))
    return found
