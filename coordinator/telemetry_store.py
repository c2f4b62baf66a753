"""The coordinator's telemetry: every sample and event `coordinator monitor` heard, and each
policy it learned a host enforces, in SQLite beside the run store.

A sibling file (`coordinator-telemetry.sqlite`), not more tables in `coordinator.sqlite`: the
monitor writes several samples a second for hours, and its own file keeps those writes from
ever holding the lock a benchmark needs to commit a cell, and keeps the two schemas versioned
apart. Samples and events arrive twice on purpose (live, and again in a backfill after a
silence); unique keys make the second copy a no-op, and add() says which rows were new so an old
event never alerts twice.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from coordinator.store import StoreError
from shared.io.paths import data_dir
from shared.io.sqlite import open_database

SCHEMA_VERSION = 1
SCHEMA = """
CREATE TABLE samples (
    host          TEXT NOT NULL,
    time          REAL NOT NULL,
    celsius       REAL,
    pressure      TEXT,
    source        TEXT NOT NULL,
    simulated     INTEGER NOT NULL,
    state         TEXT,
    trend         REAL,
    pause_s_total REAL NOT NULL,
    jobs          TEXT NOT NULL,
    PRIMARY KEY (host, time)
) WITHOUT ROWID;
CREATE TABLE events (
    host      TEXT NOT NULL,
    time      REAL NOT NULL,
    celsius   REAL,
    action    TEXT NOT NULL,
    pid       INTEGER,
    job       TEXT,
    source    TEXT NOT NULL,
    simulated INTEGER NOT NULL,
    detail    TEXT
);
CREATE UNIQUE INDEX events_key ON events (host, time, action, IFNULL(job, ''), IFNULL(pid, -1));
CREATE TABLE policies (
    host   TEXT NOT NULL,
    time   REAL NOT NULL,
    policy TEXT NOT NULL
);
CREATE INDEX policies_host ON policies (host, time);
"""
SAMPLE_COLUMNS = (
    "time",
    "celsius",
    "pressure",
    "source",
    "simulated",
    "state",
    "trend",
    "pause_s_total",
    "jobs",
)
EVENT_COLUMNS = ("time", "celsius", "action", "pid", "job", "source", "simulated", "detail")

Row = tuple[str, dict[str, Any]]
"""(host, body): the host as the coordinator names it (HOST:PORT), the message body as sent."""


def default_telemetry_path() -> Path:
    return data_dir() / "coordinator-telemetry.sqlite"


class TelemetryStore:
    """One connection, used by one thread (the monitor's main loop, or one command)."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path or default_telemetry_path()
        try:
            self._conn = open_database(self.path, rows_by_name=True)
            try:
                self._migrate()
            except BaseException:
                self._conn.close()
                raise
        except sqlite3.DatabaseError as exc:
            raise StoreError(
                f"{self.path}: not a usable mlx-fleet telemetry store: {exc}"
            ) from None

    def _migrate(self) -> None:
        with self._conn:
            self._conn.execute("BEGIN IMMEDIATE")
            version = self._conn.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise StoreError(
                    f"{self.path} has schema version {version}; this mlx-fleet "
                    f"reads up to {SCHEMA_VERSION}: upgrade mlx-fleet"
                )
            if version == 0:
                for statement in SCHEMA.split(";"):
                    if statement.strip():
                        self._conn.execute(statement)
                self._conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> TelemetryStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def add(
        self, samples: Iterable[Row] = (), events: Iterable[Row] = ()
    ) -> tuple[list[Row], list[Row]]:
        """Record a batch in one transaction (one fsync for many samples); returns the samples
        and events that were not already recorded."""
        new_samples: list[Row] = []
        new_events: list[Row] = []
        with self._conn:
            for host, body in samples:
                cursor = self._conn.execute(
                    "INSERT OR IGNORE INTO samples (host, time, celsius, pressure, source, "
                    "simulated, state, trend, pause_s_total, jobs) VALUES (?, ?, ?, ?, ?, ?, ?, "
                    "?, ?, ?)",
                    (
                        host,
                        body["time"],
                        body["celsius"],
                        body["pressure"],
                        body["source"],
                        int(body["simulated"]),
                        body["state"],
                        body["trend_c_per_min"],
                        body["pause_s_total"],
                        json.dumps(body["jobs"]),
                    ),
                )
                if cursor.rowcount:
                    new_samples.append((host, body))
            for host, body in events:
                cursor = self._conn.execute(
                    "INSERT OR IGNORE INTO events (host, time, celsius, action, pid, job, source, "
                    "simulated, detail) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        host,
                        body["time"],
                        body["celsius"],
                        body["action"],
                        body["pid"],
                        body["job"],
                        body["source"],
                        int(body["simulated"]),
                        body["detail"],
                    ),
                )
                if cursor.rowcount:
                    new_events.append((host, body))
        return new_samples, new_events

    def record_policy(self, host: str, policy: dict[str, Any], when: float) -> None:
        """Note that `host` enforces `policy` from `when` on (nothing when it already did)."""
        text = json.dumps(policy, sort_keys=True)
        with self._conn:
            last = self._conn.execute(
                "SELECT policy FROM policies WHERE host = ? ORDER BY time DESC, rowid DESC LIMIT 1",
                (host,),
            ).fetchone()
            if last is None or last["policy"] != text:
                self._conn.execute(
                    "INSERT INTO policies (host, time, policy) VALUES (?, ?, ?)", (host, when, text)
                )

    def prune(self, before: float) -> int:
        """Drop samples and events older than `before` (policies are tiny and say which
        thresholds were in force, so they stay); returns how many rows went."""
        with self._conn:
            gone = self._conn.execute("DELETE FROM samples WHERE time < ?", (before,)).rowcount
            gone += self._conn.execute("DELETE FROM events WHERE time < ?", (before,)).rowcount
        return gone

    def last_sample_time(self, host: str) -> float | None:
        """Where a backfill for `host` starts."""
        row = self._conn.execute(
            "SELECT MAX(time) AS t FROM samples WHERE host = ?", (host,)
        ).fetchone()
        return row["t"]

    def samples(
        self, since: float, hosts: list[str] | None = None
    ) -> dict[str, list[dict[str, Any]]]:
        """Per host, oldest first, samples at or after `since`, shaped like a sample body."""
        by_host: dict[str, list[dict[str, Any]]] = {}
        query, params = _filtered(
            "SELECT host, " + ", ".join(SAMPLE_COLUMNS) + " FROM samples WHERE time >= ?",
            since,
            hosts,
        )
        for row in self._conn.execute(query + " ORDER BY host, time", params):
            sample = dict(row)
            sample["simulated"] = bool(sample["simulated"])
            sample["trend_c_per_min"] = sample.pop("trend")
            sample["jobs"] = json.loads(sample["jobs"])
            by_host.setdefault(sample.pop("host"), []).append(sample)
        return by_host

    def events(
        self, since: float, hosts: list[str] | None = None
    ) -> dict[str, list[dict[str, Any]]]:
        """Per host, oldest first, events at or after `since`."""
        by_host: dict[str, list[dict[str, Any]]] = {}
        query, params = _filtered(
            "SELECT host, " + ", ".join(EVENT_COLUMNS) + " FROM events WHERE time >= ?",
            since,
            hosts,
        )
        for row in self._conn.execute(query + " ORDER BY host, time, rowid", params):
            event = dict(row)
            event["simulated"] = bool(event["simulated"])
            by_host.setdefault(event.pop("host"), []).append(event)
        return by_host

    def policies(
        self, hosts: list[str] | None = None
    ) -> dict[str, list[tuple[float, dict[str, Any]]]]:
        """Per host, every policy learned, oldest first, with the time it was learned: all of
        them, since the one in force at the start of a window was learned before it."""
        by_host: dict[str, list[tuple[float, dict[str, Any]]]] = {}
        query, params = _filtered(
            "SELECT host, time, policy FROM policies WHERE time >= ?", float("-inf"), hosts
        )
        for row in self._conn.execute(query + " ORDER BY host, time, rowid", params):
            by_host.setdefault(row["host"], []).append((row["time"], json.loads(row["policy"])))
        return by_host


def _filtered(query: str, since: float, hosts: list[str] | None) -> tuple[str, list[Any]]:
    params: list[Any] = [since]
    if hosts is not None:
        query += f" AND host IN ({', '.join('?' * len(hosts))})"
        params += hosts
    return query, params
