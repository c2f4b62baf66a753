"""The agent's job journal: every job and every finished cell in SQLite, committed as it arrives,
so a coordinator that lost its connection (or a later one) can fetch a job again by id.

Only the daemon's main thread writes it; records are stored whole as JSON text. A disk that
refuses a write loses nothing: see Journal.
"""

from __future__ import annotations

import json
import logging
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.daemon.storage import JOURNAL, StorageHealth
from agent.daemon.throttle import LogThrottle
from shared.clock import now_iso
from shared.io.paths import data_dir
from shared.io.sqlite import open_store
from shared.wire.protocol import JOB_FAILED, JOB_RUNNING

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
LISTED = ("job", "request", "state", "total", "error", "started", "finished", "done")
"""A job as job.list lists it."""
ABANDONED = "the agent stopped while this job ran"

log = logging.getLogger("agent.journal")


def default_journal_path() -> Path:
    return data_dir() / "agent-jobs.sqlite"


@dataclass
class JournaledJob:
    """A job as the journal holds it in memory: while it runs, and until all of it is written."""

    id: str
    spec: dict[str, Any]
    total: int
    started: str
    request: str | None = None
    state: str = JOB_RUNNING
    error: str | None = None
    finished: str | None = None
    models: list[dict[str, Any]] = field(default_factory=list)
    records: list[dict[str, Any]] = field(default_factory=list)
    row_written: bool = False
    cells_written: int = 0

    @property
    def written(self) -> bool:
        return self.row_written and self.cells_written == len(self.records)

    def listed(self) -> dict[str, Any]:
        """As list_jobs() lists it."""
        return {
            "job": self.id,
            "request": self.request,
            "state": self.state,
            "total": self.total,
            "error": self.error,
            "started": self.started,
            "finished": self.finished,
            "done": len(self.records),
        }

    def to_dict(self) -> dict[str, Any]:
        """As get_job() returns it."""
        return {
            "job": self.id,
            "spec": self.spec,
            "total": self.total,
            "state": self.state,
            "error": self.error,
            "started": self.started,
            "finished": self.finished,
            "models": list(self.models),
            "records": list(self.records),
        }


class Journal:
    """Every job and cell, in SQLite. The running job, and any job the disk has not taken whole,
    is also held in memory: get_job() answers from there, so job.get returns every cell even
    while the disk refuses them; retry() writes what is pending once it takes them again."""

    def __init__(self, path: Path | None = None, storage: StorageHealth | None = None) -> None:
        self.path = path or default_journal_path()
        self.storage = storage or StorageHealth(LogThrottle(log))
        self._conn = open_store(self.path, MIGRATIONS, what="job journal")
        self._held: dict[str, JournaledJob] = {}

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
        """`request`: the id of the bench.start that made the job (job.list finds it by it)."""
        self._held[job_id] = JournaledJob(job_id, spec, total, now_iso(), request)
        self._write(self._held[job_id])

    def list_jobs(self, limit: int) -> list[dict[str, Any]]:
        """The newest jobs first (at most `limit`): what job.list answers, the jobs held in
        memory (not yet written whole) as they are there."""
        rows = self._conn.execute(
            "SELECT id, request, state, total, error, started, finished, "
            "(SELECT COUNT(*) FROM cells WHERE job_id = jobs.id) FROM jobs "
            "ORDER BY started DESC, rowid DESC LIMIT ?",
            (limit,),
        ).fetchall()
        listed = {row[0]: dict(zip(LISTED, row, strict=True)) for row in rows}
        for job in self._held.values():
            listed[job.id] = job.listed()
        return sorted(listed.values(), key=lambda job: job["started"], reverse=True)[:limit]

    def add_model(self, job_id: str, info: dict[str, Any]) -> None:
        job = self._held[job_id]
        job.models.append(info)
        job.row_written = False
        self._write(job)

    def add_cell(self, job_id: str, index: int, record: dict[str, Any]) -> None:
        job = self._held[job_id]
        if index != len(job.records):
            raise ValueError(f"job {job_id}: cell {index} after {len(job.records)} cells")
        job.records.append(record)
        self._write(job)

    def finish_job(self, job_id: str, state: str, error: str | None) -> None:
        job = self._held[job_id]
        job.state, job.error, job.finished = state, error, now_iso()
        job.row_written = False
        self._write(job)

    def retry(self) -> None:
        """Write what the disk refused before."""
        for job in [j for j in self._held.values() if not j.written]:
            self._write(job)

    def get_job(self, job_id: str) -> dict[str, Any] | None:
        """The job with its models and records in cell order, or None for an unknown id."""
        held = self._held.get(job_id)
        if held is not None:
            return held.to_dict()
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

    def _write(self, job: JournaledJob) -> None:
        """Bring the file up to `job` in one transaction; a finished job written whole leaves
        memory."""
        cells = [
            (job.id, index, json.dumps(record, default=str))
            for index, record in enumerate(job.records[job.cells_written :], job.cells_written)
        ]
        try:
            with self._conn:
                if not job.row_written:
                    self._conn.execute(_UPSERT_JOB, _job_row(job))
                self._conn.executemany(
                    "INSERT OR IGNORE INTO cells (job_id, idx, record) VALUES (?, ?, ?)", cells
                )
        except sqlite3.Error as exc:
            self.storage.failed(JOURNAL, self.path, exc)
            return
        job.row_written, job.cells_written = True, len(job.records)
        self.storage.written(JOURNAL)
        if job.state != JOB_RUNNING:
            del self._held[job.id]


_UPSERT_JOB = """
INSERT INTO jobs (id, spec, total, state, error, started, finished, models, request)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (id) DO UPDATE SET
    state = excluded.state, error = excluded.error, finished = excluded.finished,
    models = excluded.models
"""


def _job_row(job: JournaledJob) -> tuple[Any, ...]:
    return (
        job.id,
        json.dumps(job.spec),
        job.total,
        job.state,
        job.error,
        job.started,
        job.finished,
        json.dumps(job.models, default=str),
        job.request,
    )
