"""What the daemon keeps: its telemetry history (every sample in memory, the latest ones, and in
SQLite; every event in agent-events.sqlite, shared with `agent run`; both pruned to a
retention, served in pages) and the policy it enforces (policy.json, so a restart keeps what
a coordinator pushed).

Only the daemon's main thread uses it.
"""

from __future__ import annotations

import json
import logging
from collections import deque
from pathlib import Path
from typing import Any

from agent.events import Event, EventLog
from agent.telemetry import event_body, page_history
from shared.io.files import replace_atomically
from shared.io.paths import data_dir
from shared.io.sqlite import open_database
from shared.policy import ThermalPolicy

log = logging.getLogger("agent.history")

SCHEMA = """
CREATE TABLE IF NOT EXISTS samples (
    time     REAL NOT NULL,
    host     TEXT NOT NULL,
    celsius  REAL,
    pressure TEXT,
    source   TEXT NOT NULL,
    simulated INTEGER NOT NULL,
    state    TEXT,
    trend    REAL,
    pause_s_total REAL NOT NULL,
    jobs     TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS samples_time ON samples (time);
"""
MEMORY_SAMPLES = 3600
"""Samples kept in memory: an hour at 1 Hz, so a coordinator's usual backfill never reads disk."""


def default_samples_path() -> Path:
    return data_dir() / "agent-telemetry.sqlite"


def policy_path() -> Path:
    return data_dir() / "policy.json"


def load_policy(path: Path | None = None) -> ThermalPolicy:
    """The policy last saved, else the default. A file that cannot be used is reported and the
    default enforced: a safe policy beats none."""
    path = path or policy_path()
    try:
        return ThermalPolicy.from_dict(json.loads(path.read_text(encoding="utf-8")))
    except FileNotFoundError:
        return ThermalPolicy()
    except (OSError, ValueError, TypeError, AttributeError) as exc:
        log.error("cannot use the saved policy %s (%s): enforcing the default", path, exc)
        return ThermalPolicy()


def save_policy(policy: ThermalPolicy, path: Path | None = None) -> None:
    """Replace the saved policy atomically; raises OSError."""
    replace_atomically(path or policy_path(), json.dumps(policy.to_dict()))


class TelemetryHistory:
    """Samples and events since the retention cutoff. `host` labels the events it serves."""

    def __init__(self, host: str, events: EventLog, path: Path | None = None) -> None:
        self.host = host
        self.events = events
        self._conn = open_database(path or default_samples_path())
        self._conn.executescript(SCHEMA)
        self._recent: deque[dict[str, Any]] = deque(maxlen=MEMORY_SAMPLES)
        self._complete_since = float("inf")
        """Memory holds every sample after this time (none yet: nothing is complete)."""

    def add_sample(self, sample: dict[str, Any]) -> None:
        if not self._recent:
            self._complete_since = sample["time"]
        elif len(self._recent) == self._recent.maxlen:
            self._complete_since = self._recent[0]["time"]  # about to be dropped
        self._recent.append(sample)
        with self._conn:
            self._conn.execute(
                "INSERT INTO samples VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    sample["time"],
                    sample["host"],
                    sample["celsius"],
                    sample["pressure"],
                    sample["source"],
                    int(sample["simulated"]),
                    sample["state"],
                    sample["trend_c_per_min"],
                    sample["pause_s_total"],
                    json.dumps(sample["jobs"]),
                ),
            )

    def add_event(self, event: Event) -> None:
        """The daemon's own events; `agent run` records its events in the same file itself."""
        self.events.record(event)

    def page(
        self, since: float, limit: int, budget: int
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]], bool]:
        """history.get: samples and events strictly after `since` (see page_history)."""
        samples = self._samples_after(since, limit + 1)
        events = [event_body(self.host, e) for e in self.events.after(since, limit + 1)]
        return page_history(samples, events, limit, budget)

    def prune(self, cutoff: float) -> None:
        """Forget what is older than `cutoff`, in memory and on disk."""
        while self._recent and self._recent[0]["time"] < cutoff:
            self._recent.popleft()
        self._complete_since = max(self._complete_since, cutoff)
        with self._conn:
            self._conn.execute("DELETE FROM samples WHERE time < ?", (cutoff,))
        self.events.prune(cutoff)

    def close(self) -> None:
        self._conn.close()

    def _samples_after(self, since: float, count: int) -> list[dict[str, Any]]:
        if since >= self._complete_since:
            return [s for s in self._recent if s["time"] > since][:count]
        rows = self._conn.execute(
            "SELECT time, host, celsius, pressure, source, simulated, state, trend, "
            "pause_s_total, jobs FROM samples WHERE time > ? ORDER BY time LIMIT ?",
            (since, count),
        ).fetchall()
        return [_sample(row) for row in rows]


def _sample(row: tuple[Any, ...]) -> dict[str, Any]:
    at, host, celsius, pressure, source, simulated, state, trend, pause_total, jobs = row
    return {
        "host": host,
        "time": at,
        "celsius": celsius,
        "pressure": pressure,
        "source": source,
        "simulated": bool(simulated),
        "state": state,
        "trend_c_per_min": trend,
        "pause_s_total": pause_total,
        "jobs": json.loads(jobs),
    }
