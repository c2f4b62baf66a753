"""The coordinator's run store: every run, host and cell in one SQLite file.

Each cell is committed the moment it arrives, so a crash or a kill keeps every result already
received. Records are stored whole as JSON text; the columns beside them are only what queries
need (run, host, cell name, status). One connection behind a lock serves every thread; WAL mode
and a busy timeout let a second process (another coordinator, `coordinator runs`) read meanwhile.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import sqlite3
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from coordinator.runs.report import INTERRUPTED, RUNNING, fleet_report, netbench_report
from shared import safe_text
from shared.clock import iso, utc_now
from shared.distributed.rank_shapes import KIND_NETBENCH
from shared.io.paths import data_dir
from shared.io.sqlite import open_store

PENDING = "pending"
OWNER = f"{socket.gethostname()}:{os.getpid()}"
"""This coordinator process, as the runs it drives record it."""

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
    """
ALTER TABLE runs ADD COLUMN owner TEXT;
ALTER TABLE run_hosts ADD COLUMN address TEXT;
ALTER TABLE run_hosts ADD COLUMN server_key TEXT;
ALTER TABLE run_hosts ADD COLUMN job TEXT;
ALTER TABLE cells ADD COLUMN idx INTEGER;
CREATE UNIQUE INDEX cells_index ON cells (run_id, host, idx)
""",
    """
ALTER TABLE runs ADD COLUMN error TEXT
""",
    """
ALTER TABLE run_hosts ADD COLUMN grouped TEXT
""",
    """
CREATE TABLE conditions (
    host   TEXT NOT NULL,
    name   TEXT NOT NULL,
    since  TEXT NOT NULL,
    run_id TEXT,
    detail TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (host, name)
)
""",
    """
CREATE TABLE probes (
    run_id TEXT NOT NULL REFERENCES runs (id),
    host   TEXT NOT NULL,
    name   TEXT NOT NULL,
    family TEXT NOT NULL,
    record TEXT NOT NULL,
    PRIMARY KEY (run_id, host, name)
)
""",
)
"""The schema, version by version (shared.io.sqlite.open_store). Version 2 makes runs resumable:
the coordinator process that drives a run (`owner`, HOSTNAME:PID), how each host is reached, its
job id once the agent named it, and each cell's index in its job (one row per index: a cell
fetched twice is kept once). Version 3 keeps the one line a run failed with (a netbench run:
its ranks fail together, so the line, not one host, says why). Version 4 keeps a distributed
group's members and each one's job (`grouped`: JSON, coordinator.runs.group_driver.GroupTarget
.stored), so a group's run resumes and cancels as a host's does. Version 5 keeps each host's
named conditions (coordinator.runs.conditions): a host with any is cordoned until `coordinator
uncordon`. Version 6 keeps what `coordinator doctor --level 2` probes beside its decode cell
(coordinator.runs.probes: the memory bandwidth), with the host's family, so a later level 2
judges a host against its family's earlier figures."""


class UnknownRunError(KeyError):
    """No run matches the id (or the prefix matches several); the message says which."""

    def __str__(self) -> str:
        # KeyError would print the message with quotes around it.
        return str(self.args[0])


@dataclass(frozen=True)
class RunHost:
    """One host of a stored run, as `coordinator resume` takes it up."""

    name: str
    address: str
    server_key: str | None
    job: str | None
    status: str
    indexes: list[int]
    models: list[dict[str, Any]]
    group: dict[str, Any] | None = None
    """A distributed group's members and their jobs (GroupTarget.stored); None for a host."""


@dataclass(frozen=True)
class ResumableRun:
    id: str
    spec: dict[str, Any]
    hosts: list[RunHost]


def owner_alive(owner: str | None) -> bool | None:
    """Whether the coordinator process `owner` (HOSTNAME:PID) still runs; None when it runs on
    another machine (nobody here can tell)."""
    if not owner:
        return None
    host, _, pid = owner.rpartition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return None
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def shown_status(status: str, owner: str | None) -> str:
    """A run marked running whose coordinator is gone is `interrupted`: it will not finish by
    itself (`coordinator resume` finishes it)."""
    if status == RUNNING and owner_alive(owner) is False:
        return INTERRUPTED
    return status


MAX_RUN_ID = 100
"""The longest run id (or prefix) looked up: ours are about 20 characters."""


def resolve_id(conn: sqlite3.Connection, run_id: str) -> str:
    """The full id of the one run in `conn` whose id is `run_id` or starts with it (at least one
    character); UnknownRunError names none, or the runs it could be."""
    if len(run_id) > MAX_RUN_ID:  # SQLite refuses a LIKE pattern this long ("too complex")
        raise UnknownRunError(
            f"unknown run {safe_text.shown(run_id, 40)!r}: {len(run_id)} characters, and a run "
            f"id has at most {MAX_RUN_ID}; `coordinator runs` lists them"
        )
    if conn.execute("SELECT 1 FROM runs WHERE id = ?", (run_id,)).fetchone():
        return run_id
    escaped = run_id.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    matches = [
        row["id"]
        for row in conn.execute(
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


def default_store_path() -> Path:
    """Asking where it is makes nothing: open_store makes the file and its folders (0700)."""
    return data_dir(create=False) / "coordinator.sqlite"


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

    def create_run(
        self,
        spec: dict[str, Any],
        hosts: list[str],
        kind: str = "benchmark",
        reach: Mapping[str, tuple[str, str | None]] | None = None,
        started: datetime | None = None,
    ) -> str:
        """Record a new run, owned by this process, before any host answers; `reach` says how
        each host is reached (HOST:PORT, server key), for `coordinator resume`; `started` when
        it began, if not now (a run stored whole once it ends). Returns its id, e.g.
        r-20261129-1842-3f2a."""
        started = started or utc_now()
        with self._lock, self._conn:
            while True:
                run_id = f"r-{started:%Y%m%d-%H%M}-{secrets.token_hex(2)}"
                try:
                    self._conn.execute(
                        "INSERT INTO runs (id, kind, started, status, spec, owner) "
                        "VALUES (?, ?, ?, ?, ?, ?)",
                        (run_id, kind, iso(started), RUNNING, json.dumps(spec, default=str), OWNER),
                    )
                    break
                except sqlite3.IntegrityError:
                    continue  # the same minute and random suffix: draw again
            for host in hosts:
                self._ensure_host(run_id, host)
            for host, (address, server_key) in (reach or {}).items():
                self._conn.execute(
                    "UPDATE run_hosts SET address = ?, server_key = ? "
                    "WHERE run_id = ? AND host = ?",
                    (address, server_key, run_id, host),
                )
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

    def set_host_job(
        self, run_id: str, host: str, job: str, group: dict[str, Any] | None = None
    ) -> None:
        """The agent's job for this host (a group's: rank 0's, with every member's in `group`),
        recorded the moment the agent names it, so a run whose coordinator dies can be
        resumed."""
        grouped = None if group is None else json.dumps(group)
        with self._lock, self._conn:
            self._require_run(run_id)
            self._conn.execute(
                "UPDATE run_hosts SET job = ?, grouped = ? WHERE run_id = ? AND host = ?",
                (job, grouped, run_id, host),
            )

    def host_models(self, run_id: str, host: str) -> list[dict[str, Any]]:
        with self._lock:
            row = self._conn.execute(
                "SELECT models FROM run_hosts WHERE run_id = ? AND host = ?", (run_id, host)
            ).fetchone()
        return [] if row is None else json.loads(row["models"])

    def resumable(self, run_id: str) -> ResumableRun:
        """What `coordinator resume` needs of a run (id or unique prefix): its spec, and per
        host how to reach it, its job and the cell indexes already kept."""
        with self._lock:
            full_id = self._resolve(run_id)
            spec = json.loads(
                self._conn.execute("SELECT spec FROM runs WHERE id = ?", (full_id,)).fetchone()[0]
            )
            hosts = []
            for row in self._conn.execute(
                "SELECT * FROM run_hosts WHERE run_id = ? ORDER BY position", (full_id,)
            ).fetchall():
                indexes = [
                    index
                    for (index,) in self._conn.execute(
                        "SELECT idx FROM cells WHERE run_id = ? AND host = ? AND idx IS NOT NULL",
                        (full_id, row["host"]),
                    )
                ]
                hosts.append(
                    RunHost(
                        row["host"],
                        row["address"] or row["host"],
                        row["server_key"],
                        row["job"],
                        row["status"],
                        indexes,
                        json.loads(row["models"]),
                        json.loads(row["grouped"]) if row["grouped"] else None,
                    )
                )
        return ResumableRun(full_id, spec, hosts)

    def take_over(self, run_id: str) -> None:
        """This process drives the run from now on (`coordinator resume`)."""
        with self._lock, self._conn:
            self._conn.execute(
                "UPDATE runs SET owner = ?, status = ?, finished = NULL, interrupted = 0 "
                "WHERE id = ?",
                (OWNER, RUNNING, run_id),
            )

    def add_cell(
        self, run_id: str, host: str, record: dict[str, Any], index: int | None = None
    ) -> None:
        """Keep one finished cell, committed at once; the stored record carries its host. A cell
        whose `index` in its job is already kept is not kept twice."""
        stored = {**record, "host": host}
        with self._lock, self._conn:
            self._require_run(run_id)
            self._ensure_host(run_id, host)
            self._conn.execute(
                "INSERT OR IGNORE INTO cells (run_id, host, name, status, record, idx) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (
                    run_id,
                    host,
                    str(record.get("name", "")),
                    str(record.get("status", "")),
                    json.dumps(stored, default=str),
                    index,
                ),
            )

    def finish_run(
        self, run_id: str, status: str, interrupted: bool = False, error: str | None = None
    ) -> None:
        """Close the run (with the line it failed with, if any); a run never finished (the
        coordinator was killed) stays "running"."""
        with self._lock, self._conn:
            self._require_run(run_id)
            self._conn.execute(
                "UPDATE runs SET finished = ?, status = ?, interrupted = ?, error = ? WHERE id = ?",
                (iso(utc_now()), status, int(interrupted), error, run_id),
            )

    def list_runs(self, limit: int = 50) -> list[dict[str, Any]]:
        """The newest runs first, each with its hosts and its ok/failed cell counts."""
        with self._lock:
            rows = self._conn.execute(
                "SELECT r.id, r.kind, r.started, r.finished, r.status, r.interrupted, r.owner, "
                "r.error, "
                "(SELECT COUNT(*) FROM cells c WHERE c.run_id = r.id AND c.status = 'ok') AS ok, "
                "(SELECT COUNT(*) FROM cells c WHERE c.run_id = r.id AND c.status != 'ok') "
                "AS failed FROM runs r ORDER BY r.started DESC, r.rowid DESC LIMIT ?",
                (limit,),
            ).fetchall()
            runs = []
            for row in rows:
                run = dict(row)
                run["status"] = shown_status(run["status"], run.pop("owner"))
                run["interrupted"] = bool(run["interrupted"]) or run["status"] == INTERRUPTED
                run["hosts"] = self._host_names(run["id"])
                runs.append(run)
        return runs

    def query(self, sql: str, params: tuple[Any, ...] = ()) -> list[sqlite3.Row]:
        """The rows of one statement under the store's lock, committed (coordinator.runs.health
        and .conditions read and write so)."""
        with self._lock, self._conn:
            return self._conn.execute(sql, params).fetchall()

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
        return resolve_id(self._conn, run_id)

    def load_report(self, run_id: str) -> dict[str, Any]:
        """The report of a run (id or unique prefix): a benchmark run's fleet report, the
        fastest host per cell marked, or a netbench run's as `coordinator netbench` prints it."""
        with self._lock:
            full_id = self._resolve(run_id)
            run = self._conn.execute("SELECT * FROM runs WHERE id = ?", (full_id,)).fetchone()
            hosts = self._conn.execute(
                "SELECT * FROM run_hosts WHERE run_id = ? ORDER BY position", (full_id,)
            ).fetchall()
            cells = self._conn.execute(
                "SELECT host, idx, record FROM cells WHERE run_id = ? ORDER BY seq", (full_id,)
            ).fetchall()
        build = netbench_report if run["kind"] == KIND_NETBENCH else fleet_report
        return build(run, shown_status(run["status"], run["owner"]), hosts, cells)
