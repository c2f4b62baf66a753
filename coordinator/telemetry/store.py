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
from collections.abc import Iterable, Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

from shared.io.paths import data_dir
from shared.io.sqlite import open_store
from shared.wire.telemetry import CLOCK_COLUMNS, FIRST_SAMPLE_ROW, Cursor, Event, Sample

_FIRST_ROW = Sample.column_sql(FIRST_SAMPLE_ROW, {"trend_c_per_min": "trend"})

MIGRATIONS = (
    f"""
CREATE TABLE samples (
    host TEXT NOT NULL,
{_FIRST_ROW},
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
CREATE INDEX policies_host ON policies (host, time)
""",
    """
ALTER TABLE samples RENAME COLUMN trend TO trend_c_per_min;
ALTER TABLE samples ADD COLUMN seq INTEGER;
ALTER TABLE events ADD COLUMN policy TEXT;
ALTER TABLE events ADD COLUMN seq INTEGER;
CREATE TABLE cursors (
    host    TEXT PRIMARY KEY,
    history TEXT NOT NULL,
    samples INTEGER NOT NULL,
    events  INTEGER NOT NULL
)
""",
    Sample.added_sql("samples", ("storage_error",)),
    """
ALTER TABLE samples ADD COLUMN job_paused INTEGER
""",
    Sample.added_sql("samples", ("power_w", "energy_j", "power")),
    Sample.added_sql("samples", ("sensor",)),
    """
ALTER TABLE policies ADD COLUMN origin TEXT
""",
    Sample.added_sql("samples", ("throttling", "throttle_evidence")),
    Sample.added_sql("samples", CLOCK_COLUMNS),
    Sample.added_sql("samples", ("started",)),
    Sample.added_sql("samples", ("duty",)),
)
"""The schema, version by version (shared.io.sqlite.open_store): version 2 names the columns as
shared.wire.telemetry does, keeps each row's `seq` as the agent numbered it, and each host's cursor;
version 3 keeps what the agent could not write when it took the sample (storage_error);
version 4 keeps whether a sample lists a paused job (`coordinator history` counts them without
parsing `jobs`; NULL in rows recorded before, where it reads `jobs`); version 5 what its power
source read at the same poll (power_w, energy_j, power); version 6 which sensor of the
source each reading is (sensor; NULL in rows recorded before); version 7 where a policy's
numbers came from (origin: `defaults for smc`, `set by coordinator policy`, ...; NULL when the
agent did not say); version 8 whether the Mac throttled and why (throttling,
throttle_evidence; NULL in rows recorded before); version 9 the clocks (CLOCK_COLUMNS; NULL in
rows recorded before, and from an agent that predates them); version 10 when the agent that
took it started (started: its counters' restarts; NULL before); version 11 the pace tier's
duty (duty; NULL when not paced, and before). Every query filters by host and
time, which the samples' primary key and the events' unique key index."""

Row = tuple[str, dict[str, Any]]
"""(host, body): the host as the coordinator names it (HOST:PORT), the message body as sent."""


def default_telemetry_path() -> Path:
    return data_dir() / "coordinator-telemetry.sqlite"


class TelemetryStore:
    """One connection, used by one thread (the monitor's main loop, or one command)."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path or default_telemetry_path()
        self.conn = open_store(self.path, MIGRATIONS, what="telemetry store", rows_by_name=True)
        """Also for the queries of coordinator.telemetry.stats, on the same thread."""

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> TelemetryStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def add(
        self,
        samples: Iterable[Row] = (),
        events: Iterable[Row] = (),
        cursors: Mapping[str, Cursor] | None = None,
    ) -> tuple[int, list[Row]]:
        """Record a batch, and where each host's history now stands, in one transaction (one
        fsync for many samples; a cursor is never saved without what it covers); returns how
        many samples and which events were not already recorded (an event alerts once)."""
        sample_sql = _insert("samples", (*Sample.columns(), "seq", "job_paused"))
        event_sql = _insert("events", (*Event.columns(), "seq"))
        new_events: list[Row] = []
        with self.conn:
            before = self.conn.total_changes
            self.conn.executemany(sample_sql, (_sample_row(host, body) for host, body in samples))
            new_samples = self.conn.total_changes - before
            for host, body in events:
                if self.conn.execute(event_sql, (host, *_row(Event.from_body(body)))).rowcount:
                    new_events.append((host, body))
            for host, cursor in (cursors or {}).items():
                self.conn.execute(
                    "INSERT OR REPLACE INTO cursors (host, history, samples, events) "
                    "VALUES (?, ?, ?, ?)",
                    (host, cursor.history, cursor.samples, cursor.events),
                )
        return new_samples, new_events

    def cursor(self, host: str) -> Cursor | None:
        """Where the record of `host`'s history stands; None for a host never recorded."""
        row = self.conn.execute(
            "SELECT history, samples, events FROM cursors WHERE host = ?", (host,)
        ).fetchone()
        return None if row is None else Cursor(row["history"], row["samples"], row["events"])

    def record_policy(
        self, host: str, policy: dict[str, Any], when: float, origin: str | None = None
    ) -> None:
        """Note that `host` enforces `policy` from `when` on, its numbers from `origin` (None:
        not said); nothing when it already did."""
        text = json.dumps(policy, sort_keys=True)
        with self.conn:
            last = self.conn.execute(
                "SELECT policy, origin FROM policies WHERE host = ? "
                "ORDER BY time DESC, rowid DESC LIMIT 1",
                (host,),
            ).fetchone()
            if last is None or (last["policy"], last["origin"]) != (text, origin):
                self.conn.execute(
                    "INSERT INTO policies (host, time, policy, origin) VALUES (?, ?, ?, ?)",
                    (host, when, text, origin),
                )

    def prune(self, before: float) -> int:
        """Drop samples and events older than `before`, host by host through the keys on (host,
        time) (policies are tiny and say which thresholds were in force, so they stay); returns
        how many rows went."""
        gone = 0
        with self.conn:
            for table in ("samples", "events"):
                for host in recorded_hosts(self.conn, table):
                    gone += self.conn.execute(
                        f"DELETE FROM {table} WHERE host = ? AND time < ?", (host, before)
                    ).rowcount
        return gone

    def readings(self, since: float, hosts: list[str]) -> dict[str, list[tuple[float, Any]]]:
        """Per host, oldest first, (time, °C) of the samples at or after `since`: what a
        sparkline shows, read through the primary key without the rest of each row."""
        return {
            host: [
                (row[0], row[1])
                for row in self.conn.execute(
                    "SELECT time, celsius FROM samples WHERE host = ? AND time >= ? ORDER BY time",
                    (host, since),
                )
            ]
            for host in hosts
        }

    def samples(
        self, since: float, hosts: list[str] | None = None
    ) -> dict[str, list[dict[str, Any]]]:
        """Per host, oldest first, samples at or after `since`, shaped like a sample body
        (without `host`)."""
        return self._bodies(Sample, "ORDER BY host, time", since, hosts)

    def events(
        self, since: float, hosts: list[str] | None = None
    ) -> dict[str, list[dict[str, Any]]]:
        """Per host, oldest first, events at or after `since`, shaped like an event body (without
        `host`)."""
        return self._bodies(Event, "ORDER BY host, time, rowid", since, hosts)

    def _bodies(
        self, kind: type[Sample] | type[Event], order: str, since: float, hosts: list[str] | None
    ) -> dict[str, list[dict[str, Any]]]:
        table = "samples" if kind is Sample else "events"
        columns = ", ".join((*kind.columns(), "seq"))
        query, params = _filtered(
            f"SELECT host, {columns} FROM {table} WHERE time >= ?", since, hosts
        )
        by_host: dict[str, list[dict[str, Any]]] = {}
        for row in self.conn.execute(f"{query} {order}", params):
            host, *values, seq = tuple(row)
            by_host.setdefault(host, []).append(asdict(kind.from_row(values, seq=seq)))
        return by_host

    def policies(
        self, hosts: list[str] | None = None
    ) -> dict[str, list[tuple[float, dict[str, Any]]]]:
        """Per host, every policy learned, oldest first, with the time it was learned: all of
        them, since the one in force at the start of a window was learned before it. A policy
        whose origin the agent said carries it under `origin`."""
        by_host: dict[str, list[tuple[float, dict[str, Any]]]] = {}
        query, params = "SELECT host, time, policy, origin FROM policies", hosts or []
        if hosts is not None:
            query += f" WHERE host IN ({', '.join('?' * len(hosts))})"
        for row in self.conn.execute(query + " ORDER BY host, time, rowid", params):
            policy = json.loads(row["policy"])
            if row["origin"] is not None:
                policy["origin"] = row["origin"]
            by_host.setdefault(row["host"], []).append((row["time"], policy))
        return by_host


def recorded_hosts(conn: sqlite3.Connection, table: str) -> list[str]:
    """Every host with rows in `table` (samples or events), by name: a skip scan of the index
    on (host, ...), one seek per host rather than a read of the table."""
    return [
        row[0]
        for row in conn.execute(
            f"WITH RECURSIVE h(host) AS (SELECT MIN(host) FROM {table} UNION ALL "
            f"SELECT (SELECT MIN(host) FROM {table} WHERE host > h.host) FROM h "
            "WHERE h.host IS NOT NULL) SELECT host FROM h WHERE host IS NOT NULL"
        )
    ]


def _sample_row(host: str, body: dict[str, Any]) -> tuple[Any, ...]:
    """A validated sample body as its row: (host, *columns, seq, job_paused)."""
    paused = any(job["state"] == "paused" for job in body["jobs"])
    return (host, *Sample.body_row(body), body["seq"], paused)


def _row(record: Sample | Event) -> tuple[Any, ...]:
    return (*record.row(), record.seq)


def _insert(table: str, columns: tuple[str, ...]) -> str:
    """INSERT OR IGNORE of (host, *columns): a row heard twice (live, then in a backfill) is
    recorded once."""
    names = ", ".join(("host", *columns))
    return f"INSERT OR IGNORE INTO {table} ({names}) VALUES ({', '.join('?' * (len(columns) + 1))})"


def _filtered(query: str, since: float, hosts: list[str] | None) -> tuple[str, list[Any]]:
    params: list[Any] = [since]
    if hosts is not None:
        query += f" AND host IN ({', '.join('?' * len(hosts))})"
        params += hosts
    return query, params
