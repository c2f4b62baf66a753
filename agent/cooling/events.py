"""Supervision events (shared.wire.telemetry.Event): kept in SQLite and shown as one stderr line.

Kept apart from the supervisor so the daemon can serve (history.get) the records `agent run`
wrote in the same file, and so every line says when its source is not a sensor.
"""

from __future__ import annotations

import sys
import time
from dataclasses import replace
from pathlib import Path

from shared import safe_text
from shared.io.paths import data_dir
from shared.io.sqlite import open_store, store_id
from shared.wire.telemetry import Event

PREFIX = "[mlx-fleet]"

MIGRATIONS = (
    """
CREATE TABLE IF NOT EXISTS events (
    seq       INTEGER PRIMARY KEY,
    time      REAL NOT NULL,
    job       TEXT NOT NULL,
    pid       INTEGER,
    action    TEXT NOT NULL,
    celsius   REAL,
    source    TEXT NOT NULL,
    simulated INTEGER NOT NULL,
    detail    TEXT
);
CREATE INDEX IF NOT EXISTS events_time ON events (time)
""",
    """
CREATE TABLE events_2 (
    seq       INTEGER PRIMARY KEY AUTOINCREMENT,
    time      REAL NOT NULL,
    job       TEXT,
    pid       INTEGER,
    action    TEXT NOT NULL,
    source    TEXT NOT NULL,
    simulated INTEGER NOT NULL,
    celsius   REAL,
    detail    TEXT,
    policy    TEXT
);
INSERT INTO events_2 (seq, time, job, pid, action, source, simulated, celsius, detail)
    SELECT seq, time, NULLIF(job, ''), pid, action, source, simulated, celsius, detail
    FROM events;
DROP TABLE events;
ALTER TABLE events_2 RENAME TO events;
CREATE INDEX events_time ON events (time)
""",
)
"""The schema, version by version (shared.io.sqlite.open_store). Version 1 is the file earlier
releases made without a version; version 2 numbers events with AUTOINCREMENT, so a `seq` is never
given twice even after pruning (it is the history cursor, docs/protocol.md §10), and stores the
columns of shared.wire.telemetry.Event."""
_COLUMNS = ", ".join(Event.columns())
_INSERT = f"INSERT INTO events ({_COLUMNS}) VALUES ({', '.join('?' * len(Event.columns()))})"


def warn(message: str) -> None:
    """A warning of `agent run`'s on stderr, under the prefix of its event lines."""
    print(f"{PREFIX} warning: {message}", file=sys.stderr, flush=True)


def format_line(event: Event) -> str:
    """`[mlx-fleet] 12:00:01 pause at 86.0 °C job 3f2a pid 4242 (replay:c.csv, simulated)`;
    always one line, even for a command with newlines in it, and no control character (a
    gang's events carry what peer agents said)."""
    parts = [PREFIX, time.strftime("%H:%M:%S", time.localtime(event.time)), event.action]
    if event.celsius is not None:
        parts.append(f"at {event.celsius:.1f} °C")
    if event.job:
        parts.append(f"job {event.job}")
    if event.pid is not None:
        parts.append(f"pid {event.pid}")
    if event.detail:
        parts[-1] += ":"
        one_line = event.detail.replace("\r", "\\r").replace("\n", "\\n")
        parts.append(safe_text.shown(one_line, cap=None))  # a peer's words are in some
    source = safe_text.shown(event.source, cap=None)
    parts.append(f"({source}, simulated)" if event.simulated else f"({source})")
    return " ".join(parts)


def default_events_path() -> Path:
    return data_dir() / "agent-events.sqlite"


class EventLog:
    """Append-only events in SQLite (WAL, so several `agent run` and the daemon can share it).

    An event's number is AUTOINCREMENT's, given under the file's write lock (so every process
    numbers in one order) and committed, synced, before record() returns it: what is published
    or served under a number stays that number's, even after a crash or a power loss (a
    commit only written, not synced, could be lost and its number given again). That costs
    one sync per event, events are rare; samples are numbered otherwise (agent.daemon.history)."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path or default_events_path()
        self._conn = open_store(self.path, MIGRATIONS, what="event log")
        self._conn.execute("PRAGMA synchronous = FULL")  # the WAL synced at each commit
        self._conn.execute("PRAGMA fullfsync = ON")  # macOS: past the drive's cache too

    @property
    def id(self) -> str:
        return store_id(self._conn)

    def record(self, event: Event) -> Event:
        """Store `event`; returns it with the `seq` the store gave it."""
        with self._conn:
            seq = self._conn.execute(_INSERT, event.row()).lastrowid
        return replace(event, seq=seq)

    def holds(self, event: Event) -> bool:
        """Whether this file holds `event` under its `seq` (same time, action, job and pid):
        a number another file gave must not be taken for one of this file's."""
        row = self._conn.execute(
            "SELECT 1 FROM events WHERE seq = ? AND time = ? AND action = ? AND job IS ?"
            " AND pid IS ?",
            (event.seq, event.time, event.action, event.job, event.pid),
        ).fetchone()
        return row is not None

    def since(self, start: float = 0.0, job: str | None = None) -> list[Event]:
        """Events at or after `start` (epoch seconds), oldest first; one job's when `job` is set."""
        query = f"SELECT seq, {_COLUMNS} FROM events WHERE time >= ?"
        params: tuple[object, ...] = (start,)
        if job is not None:
            query += " AND job = ?"
            params += (job,)
        rows = self._conn.execute(query + " ORDER BY time, seq", params).fetchall()
        return [Event.from_row(row[1:], seq=row[0]) for row in rows]

    def after(self, seq: int, since: float, limit: int) -> list[Event]:
        """At most `limit` events numbered after `seq` and stamped after `since`, in `seq`
        order: a page of history."""
        rows = self._conn.execute(
            f"SELECT seq, {_COLUMNS} FROM events WHERE seq > ? AND time > ? ORDER BY seq LIMIT ?",
            (seq, since, limit),
        ).fetchall()
        return [Event.from_row(row[1:], seq=row[0]) for row in rows]

    def prune(self, before: float) -> int:
        """Forget events older than `before` (the retention); returns how many."""
        with self._conn:
            return self._conn.execute("DELETE FROM events WHERE time < ?", (before,)).rowcount

    def close(self) -> None:
        self._conn.close()
