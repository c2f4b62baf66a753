"""The agent's job journal: every job and every finished cell in SQLite, committed as it arrives,
so a coordinator that lost its connection (or a later one) can fetch a job again by id.

Only the daemon's main thread writes it; records are stored whole as JSON text.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from shared.clock import now_iso
from shared.io.paths import data_dir
from shared.io.sqlite import open_store
from shared.protocol import JOB_FAILED, JOB_RUNNING

MIGRATIONS = (
    """
CREATE TABLE IF NOT EXISTS jobs (
    id       TEXT PRIMARY KEY,
    spec     TEXT NOT NULL,
    total    INTEGER NOT NULL,
    state    TEXT NOT NULL,
    error    TEXT,
    started  TEXT NOT NULL,
    finished TEXT,
    models   TEXT NOT NULL DEFAULT '[]'
);
CREATE TABLE IF NOT EXISTS cells (
    job_id TEXT NOT NULL REFERENCES jobs (id),
    idx    INTEGER NOT NULL,
    record TEXT NOT NULL,
    PRIMARY KEY (job_id, idx)
)
""",
    """
ALTER TABLE jobs ADD COLUMN request TEXT;
CREATE INDEX jobs_started ON jobs (started)
""",
)
"""The schema, version by version (shared.io.sqlite.open_store); version 1 is the file earlier
releases made without a version; version 2 keeps the id of the bench.start that made each job,
so a coordinator that lost the reply finds its job (job.list)."""
JOB_LIST_MAX = 100
ABANDONED = "the agent stopped while this job ran"


def default_journal_path() -> Path:
    return data_dir() / "agent-jobs.sqlite"


class Journal:
    def __init__(self, path: Path | None = None) -> None:
        self.path = path or default_journal_path()
        self._conn = open_store(self.path, MIGRATIONS, what="job journal")

    def close(self) -> None:
        self._conn.close()

    def abandon_running(self) -> int:
        """Jobs a previous daemon left running did not finish: say so. Returns how many."""
        with self._conn:
            cursor = self._conn.execute(
                "UPDATE jobs SET state = ?, error = ?, finished = ? WHERE state = ?",
                (JOB_FAILED, ABANDONED, now_iso(), JOB_RUNNING),
            )
        return cursor.rowcount

    def create_job(
        self, job_id: str, spec: dict[str, Any], total: int, request: str | None = None
    ) -> None:
        with self._conn:
            self._conn.execute(
                "INSERT INTO jobs (id, spec, total, state, started, request) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (job_id, json.dumps(spec), total, JOB_RUNNING, now_iso(), request),
            )

    def list_jobs(self, limit: int) -> list[dict[str, Any]]:
        """The newest jobs first (at most `limit`): what job.list answers."""
        rows = self._conn.execute(
            "SELECT id, request, state, total, error, started, finished, "
            "(SELECT COUNT(*) FROM cells WHERE job_id = jobs.id) FROM jobs "
            "ORDER BY started DESC, rowid DESC LIMIT ?",
            (limit,),
        ).fetchall()
        keys = ("job", "request", "state", "total", "error", "started", "finished", "done")
        return [dict(zip(keys, row, strict=True)) for row in rows]

    def add_model(self, job_id: str, info: dict[str, Any]) -> None:
        with self._conn:
            row = self._conn.execute("SELECT models FROM jobs WHERE id = ?", (job_id,)).fetchone()
            models = [*json.loads(row[0]), info]
            self._conn.execute(
                "UPDATE jobs SET models = ? WHERE id = ?", (json.dumps(models, default=str), job_id)
            )

    def add_cell(self, job_id: str, index: int, record: dict[str, Any]) -> None:
        with self._conn:
            self._conn.execute(
                "INSERT INTO cells (job_id, idx, record) VALUES (?, ?, ?)",
                (job_id, index, json.dumps(record, default=str)),
            )

    def finish_job(self, job_id: str, state: str, error: str | None) -> None:
        with self._conn:
            self._conn.execute(
                "UPDATE jobs SET state = ?, error = ?, finished = ? WHERE id = ?",
                (state, error, now_iso(), job_id),
            )

    def get_job(self, job_id: str) -> dict[str, Any] | None:
        """The job with its models and records in cell order, or None for an unknown id."""
        row = self._conn.execute(
            "SELECT spec, total, state, error, started, finished, models FROM jobs WHERE id = ?",
            (job_id,),
        ).fetchone()
        if row is None:
            return None
        spec, total, state, error, started, finished, models = row
        records = [
            json.loads(text)
            for (text,) in self._conn.execute(
                "SELECT record FROM cells WHERE job_id = ? ORDER BY idx", (job_id,)
            )
        ]
        return {
            "job": job_id,
            "spec": json.loads(spec),
            "total": total,
            "state": state,
            "error": error,
            "started": started,
            "finished": finished,
            "models": json.loads(models),
            "records": records,
        }
