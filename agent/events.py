"""Supervision events: one record per action on a supervised job, kept in SQLite and shown as one
stderr line.

Kept apart from the supervisor so the daemon can serve (history.get) the records `agent run`
wrote in the same file, and so every line says when its source is not a sensor.
"""

from __future__ import annotations

import time
from dataclasses import astuple, dataclass, fields
from pathlib import Path
from typing import Any

from shared.io.paths import data_dir
from shared.io.sqlite import open_database

PREFIX = "[mlx-fleet]"

SCHEMA = """
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
CREATE INDEX IF NOT EXISTS events_time ON events (time);
"""


@dataclass(frozen=True)
class Event:
    """What happened to a job: `action` is start, pause, resume, reduce_batch, restore_batch, stop
    (thermal), forward (a signal to `agent run`), cleanup (what a finished CMD left behind),
    fallback (`agent run` lost its daemon and reads the sensor itself), kill or exit; or policy,
    the daemon's own record of a new policy (`job` empty). `celsius` is the reading that caused
    it, when one did."""

    time: float
    job: str
    pid: int | None
    action: str
    source: str
    simulated: bool = False
    celsius: float | None = None
    detail: str | None = None


_COLUMNS = ", ".join(f.name for f in fields(Event))


def format_line(event: Event) -> str:
    """`[mlx-fleet] 12:00:01 pause at 86.0 °C job 3f2a pid 4242 (replay:c.csv, simulated)`;
    always one line, even for a command with newlines in it."""
    parts = [PREFIX, time.strftime("%H:%M:%S", time.localtime(event.time)), event.action]
    if event.celsius is not None:
        parts.append(f"at {event.celsius:.1f} °C")
    parts.append(f"job {event.job}")
    if event.pid is not None:
        parts.append(f"pid {event.pid}")
    if event.detail:
        parts[-1] += ":"
        parts.append(event.detail.replace("\r", "\\r").replace("\n", "\\n"))  # one line
    parts.append(f"({event.source}, simulated)" if event.simulated else f"({event.source})")
    return " ".join(parts)


def default_events_path() -> Path:
    return data_dir() / "agent-events.sqlite"


class EventLog:
    """Append-only events in SQLite (WAL, so several `agent run` and the daemon can share it)."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path or default_events_path()
        self._conn = open_database(self.path)
        self._conn.executescript(SCHEMA)

    def record(self, event: Event) -> None:
        with self._conn:
            self._conn.execute(
                f"INSERT INTO events ({_COLUMNS}) VALUES ({', '.join('?' * len(fields(Event)))})",
                astuple(event),
            )

    def since(self, start: float = 0.0, job: str | None = None) -> list[Event]:
        """Events at or after `start` (epoch seconds), oldest first; one job's when `job` is set."""
        query = f"SELECT {_COLUMNS} FROM events WHERE time >= ?"
        params: tuple[object, ...] = (start,)
        if job is not None:
            query += " AND job = ?"
            params += (job,)
        rows = self._conn.execute(query + " ORDER BY time, seq", params).fetchall()
        return [_event(row) for row in rows]

    def after(self, start: float, limit: int) -> list[Event]:
        """At most `limit` events strictly after `start`, oldest first: a page of history."""
        rows = self._conn.execute(
            f"SELECT {_COLUMNS} FROM events WHERE time > ? ORDER BY time, seq LIMIT ?",
            (start, limit),
        ).fetchall()
        return [_event(row) for row in rows]

    def prune(self, before: float) -> int:
        """Forget events older than `before` (the retention); returns how many."""
        with self._conn:
            return self._conn.execute("DELETE FROM events WHERE time < ?", (before,)).rowcount

    def close(self) -> None:
        self._conn.close()


def _event(row: tuple[Any, ...]) -> Event:
    at, job, pid, action, source, simulated, celsius, detail = row
    return Event(at, job, pid, action, source, bool(simulated), celsius, detail)
