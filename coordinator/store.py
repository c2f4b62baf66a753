"""The coordinator's run store: every run, host and cell in one SQLite file.

Each cell is committed the moment it arrives, so a crash or a kill keeps every result already
received. Records are stored whole as JSON text; the columns beside them are only what queries
need (run, host, cell name, status). One connection behind a lock serves every thread; WAL mode
and a busy timeout let a second process (another coordinator, `coordinator runs`) read meanwhile.
"""

from __future__ import annotations

import json
import secrets
import sqlite3
import threading
from pathlib import Path
from typing import Any

from shared.aggregate import mark_fastest
from shared.clock import iso, utc_now
from shared.io.paths import data_dir
from shared.io.sqlite import open_store

RUNNING = "running"
PENDING = "pending"

MIGRATIONS = (
    """
CREATE TABLE runs (
    id          TEXT PRIMARY KEY,
    kind        TEXT NOT NULL,
    started     TEXT NOT NULL,
    finished    TEXT,
    status      TEXT NOT NULL,
    interrupted INTEGER NOT NULL DEFAULT 0,
    spec        TEXT NOT NULL
);
CREATE INDEX runs_started ON runs (started);
CREATE TABLE run_hosts (
    run_id   TEXT NOT NULL REFERENCES runs (id),
    position INTEGER NOT NULL,
    host     TEXT NOT NULL,
    status   TEXT NOT NULL,
    error    TEXT,
    machine  TEXT,
    models   TEXT NOT NULL DEFAULT '[]',
    PRIMARY KEY (run_id, host)
);
CREATE TABLE cells (
    seq     INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id  TEXT NOT NULL REFERENCES runs (id),
    host    TEXT NOT NULL,
    name    TEXT NOT NULL,
    status  TEXT NOT NULL,
    record  TEXT NOT NULL
);
CREATE INDEX cells_run ON cells (run_id, seq);
""",
)
"""The schema, version by version (shared.io.sqlite.open_store)."""


class UnknownRunError(KeyError):
    """No run matches the id (or the prefix matches several); the message says which."""

    def __str__(self) -> str:
        # KeyError would print the message with quotes around it.
        return str(self.args[0])


def default_store_path() -> Path:
    return data_dir() / "coordinator.sqlite"


class RunStore:
    """Runs, their hosts and their cells, in the order they arrived."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path or default_store_path()
        self._lock = threading.Lock()
        self._conn = open_store(
            self.path, MIGRATIONS, what="store", rows_by_name=True, threads=True
        )
        self._conn.execute("PRAGMA foreign_keys = ON")

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def __enter__(self) -> RunStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def create_run(self, spec: dict[str, Any], hosts: list[str], kind: str = "benchmark") -> str:
        """Record a new run before any host answers; returns its id, e.g. r-20261129-1842-3f2a."""
        started = utc_now()
        with self._lock, self._conn:
            while True:
                run_id = f"r-{started:%Y%m%d-%H%M}-{secrets.token_hex(2)}"
                try:
                    self._conn.execute(
                        "INSERT INTO runs (id, kind, started, status, spec) VALUES (?, ?, ?, ?, ?)",
                        (run_id, kind, iso(started), RUNNING, json.dumps(spec, default=str)),
                    )
                    break
                except sqlite3.IntegrityError:
                    continue  # the same minute and random suffix: draw again
            for host in hosts:
                self._ensure_host(run_id, host)
        return run_id

    def _ensure_host(self, run_id: str, host: str) -> None:
        """Hosts keep the order they were first named in (create_run, then first use)."""
        self._conn.execute(
            "INSERT OR IGNORE INTO run_hosts (run_id, position, host, status) VALUES "
            "(?, (SELECT COUNT(*) FROM run_hosts WHERE run_id = ?), ?, ?)",
            (run_id, run_id, host, PENDING),
        )

    def _require_run(self, run_id: str) -> None:
        if self._conn.execute("SELECT 1 FROM runs WHERE id = ?", (run_id,)).fetchone() is None:
            raise UnknownRunError(f"unknown run {run_id!r}")

    def set_host_info(
        self,
        run_id: str,
        host: str,
        machine: dict[str, Any] | None,
        models: list[dict[str, Any]],
        status: str,
        error: str | None,
    ) -> None:
        """What a host said about itself and how it ended ("ok" or "failed" with the error)."""
        with self._lock, self._conn:
            self._require_run(run_id)
            self._ensure_host(run_id, host)
            self._conn.execute(
                "UPDATE run_hosts SET machine = ?, models = ?, status = ?, error = ? "
                "WHERE run_id = ? AND host = ?",
                (
                    None if machine is None else json.dumps(machine, default=str),
                    json.dumps(models, default=str),
                    status,
                    error,
                    run_id,
                    host,
                ),
            )

    def add_cell(self, run_id: str, host: str, record: dict[str, Any]) -> None:
        """Keep one finished cell, committed at once; the stored record carries its host."""
        stored = {**record, "host": host}
        with self._lock, self._conn:
            self._require_run(run_id)
            self._ensure_host(run_id, host)
            self._conn.execute(
                "INSERT INTO cells (run_id, host, name, status, record) VALUES (?, ?, ?, ?, ?)",
                (
                    run_id,
                    host,
                    str(record.get("name", "")),
                    str(record.get("status", "")),
                    json.dumps(stored, default=str),
                ),
            )

    def finish_run(self, run_id: str, status: str, interrupted: bool = False) -> None:
        """Close the run; a run never finished (the coordinator was killed) stays "running"."""
        with self._lock, self._conn:
            self._require_run(run_id)
            self._conn.execute(
                "UPDATE runs SET finished = ?, status = ?, interrupted = ? WHERE id = ?",
                (iso(utc_now()), status, int(interrupted), run_id),
            )

    def list_runs(self, limit: int = 50) -> list[dict[str, Any]]:
        """The newest runs first, each with its hosts and its ok/failed cell counts."""
        with self._lock:
            rows = self._conn.execute(
                "SELECT r.id, r.kind, r.started, r.finished, r.status, r.interrupted, "
                "(SELECT COUNT(*) FROM cells c WHERE c.run_id = r.id AND c.status = 'ok') AS ok, "
                "(SELECT COUNT(*) FROM cells c WHERE c.run_id = r.id AND c.status != 'ok') "
                "AS failed FROM runs r ORDER BY r.started DESC, r.rowid DESC LIMIT ?",
                (limit,),
            ).fetchall()
            runs = []
            for row in rows:
                run = dict(row)
                run["interrupted"] = bool(run["interrupted"])
                run["hosts"] = self._host_names(run["id"])
                runs.append(run)
        return runs

    def _host_names(self, run_id: str) -> list[str]:
        rows = self._conn.execute(
            "SELECT host FROM run_hosts WHERE run_id = ? ORDER BY position", (run_id,)
        )
        return [row["host"] for row in rows]

    def resolve(self, run_id: str) -> str:
        """The full id of the one run whose id is `run_id` or starts with it."""
        with self._lock:
            return self._resolve(run_id)

    def _resolve(self, run_id: str) -> str:
        if self._conn.execute("SELECT 1 FROM runs WHERE id = ?", (run_id,)).fetchone():
            return run_id
        escaped = run_id.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        matches = [
            row["id"]
            for row in self._conn.execute(
                "SELECT id FROM runs WHERE id LIKE ? ESCAPE '\\' ORDER BY started LIMIT 6",
                (escaped + "%",),
            )
        ]
        if not run_id or not matches:
            raise UnknownRunError(f"unknown run {run_id!r}; `coordinator runs` lists them")
        if len(matches) > 1:
            shown = ", ".join(matches[:5]) + (", ..." if len(matches) > 5 else "")
            raise UnknownRunError(f"run id {run_id!r} is ambiguous: it matches {shown}")
        return matches[0]

    def load_report(self, run_id: str) -> dict[str, Any]:
        """The fleet report of a run (id or unique prefix), the fastest host per cell marked."""
        with self._lock:
            full_id = self._resolve(run_id)
            run = self._conn.execute("SELECT * FROM runs WHERE id = ?", (full_id,)).fetchone()
            hosts = self._conn.execute(
                "SELECT * FROM run_hosts WHERE run_id = ? ORDER BY position", (full_id,)
            ).fetchall()
            cells = self._conn.execute(
                "SELECT record FROM cells WHERE run_id = ? ORDER BY seq", (full_id,)
            ).fetchall()
        unfinished = " (not finished: still running, or its coordinator stopped)"
        return {
            "title": f"mlx-fleet {run['kind']} {full_id}" + ("" if run["finished"] else unfinished),
            "run_id": full_id,
            "kind": run["kind"],
            "started": run["started"],
            "finished": run["finished"],
            "status": run["status"],
            "spec": json.loads(run["spec"]),
            "hosts": [
                {
                    "host": host["host"],
                    "machine": None if host["machine"] is None else json.loads(host["machine"]),
                    "models": json.loads(host["models"]),
                    "status": host["status"],
                    "error": host["error"],
                }
                for host in hosts
            ],
            "cells": mark_fastest([json.loads(cell["record"]) for cell in cells]),
            "interrupted": bool(run["interrupted"]),
        }
