"""The `agent run` jobs of a window, per host, from what `coordinator monitor` recorded: each job's
`summary` event (shared.cooling.job_account: wall time, paused, hottest reading, energy, tokens/s
and throttle) and the reason of its last pause (a gang's says which Mac paused all its ranks).

An agent wrote the summary's JSON: every field is checked before it is kept (a number must be a
finite number, a text a string), and what fails is left out, never shown as a figure.
"""

from __future__ import annotations

import json
import math
import sqlite3
from typing import Any

NUMBERS = ("wall_s", "paused_s", "pauses", "max_celsius", "energy_j", "tok_s_first",
           "tok_s_last", "throttle")  # fmt: skip
TEXTS = ("max_source", "max_sensor", "energy_source", "energy_note")


def _kept(summary: Any) -> dict[str, Any]:
    """The summary's fields this module shows, each of the right type, else None."""
    if not isinstance(summary, dict):
        summary = {}
    kept: dict[str, Any] = {}
    for key in NUMBERS:
        value = summary.get(key)
        ok = type(value) in (int, float) and math.isfinite(value)
        kept[key] = value if ok else None
    for key in TEXTS:
        value = summary.get(key)
        kept[key] = value if isinstance(value, str) else None
    return kept


def job_summaries(
    conn: sqlite3.Connection, since: float, hosts: list[str] | None
) -> list[dict[str, Any]]:
    """Every job that ended in the window with a summary, oldest first."""
    query = "SELECT host, time, job, detail FROM events WHERE action = 'summary' AND time >= ?"
    params: list[Any] = [since]
    if hosts is not None:
        query += f" AND host IN ({', '.join('?' * len(hosts))})"
        params += hosts
    jobs = []
    for host, at, job, detail in conn.execute(query + " ORDER BY time, host", params):
        try:
            summary = json.loads(detail or "")
        except ValueError:
            summary = None
        last_pause = conn.execute(
            "SELECT detail FROM events WHERE host = ? AND job IS ? AND action = 'pause' "
            "AND time <= ? ORDER BY time DESC LIMIT 1",
            (host, job, at),
        ).fetchone()
        jobs.append(
            {"host": host, "job": job, "ended": at, "readable": isinstance(summary, dict)}
            | _kept(summary)
            | {"last_pause": last_pause[0] if last_pause else None}
        )
    return jobs
