"""Opening the project's SQLite files, one way for every store: WAL mode, a busy timeout, and a
versioned schema brought up to date in one transaction."""

from __future__ import annotations

import secrets
import sqlite3
from collections.abc import Sequence
from pathlib import Path

from shared.io.files import make_private

BUSY_TIMEOUT_S = 30.0
META = "CREATE TABLE IF NOT EXISTS mlx_fleet_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)"


class StoreError(RuntimeError):
    """A store file that cannot be used: not a database, or written by a newer mlx-fleet; the
    message names the file and what to do."""


def open_database(
    path: Path, *, rows_by_name: bool = False, threads: bool = False
) -> sqlite3.Connection:
    """A connection in WAL mode, so readers never block the writer and several processes (the
    daemon and `agent run`, a monitor and a benchmark) can share the file; a busy file is waited
    for, not failed on. Created, with its folder, on first use. A file that is not a database
    raises sqlite3.DatabaseError, with the connection closed. The file is private (0600), and so
    are its -wal and -shm files, which SQLite creates with the database's mode."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    make_private(path)
    conn = sqlite3.connect(path, timeout=BUSY_TIMEOUT_S, check_same_thread=not threads)
    if rows_by_name:
        conn.row_factory = sqlite3.Row
    try:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = NORMAL")  # durable across crashes in WAL mode
    except sqlite3.DatabaseError:
        conn.close()
        raise
    return conn


def open_store(
    path: Path,
    migrations: Sequence[str],
    *,
    what: str,
    rows_by_name: bool = False,
    threads: bool = False,
) -> sqlite3.Connection:
    """open_database, with the schema at version len(migrations): migrations[i] is the SQL (';'
    between statements, none inside one) that takes the file from version i to i + 1, kept
    as written once released so every file takes the same path. All of it runs in one BEGIN
    IMMEDIATE transaction, so two processes never both migrate and a failure changes nothing.
    Every store also gets a random id (store_id), made with it. Raises StoreError naming `what`
    and the file."""
    try:
        conn = open_database(path, rows_by_name=rows_by_name, threads=threads)
    except sqlite3.DatabaseError as exc:
        raise StoreError(f"{path}: not a usable mlx-fleet {what}: {exc}") from None
    try:
        with conn:
            conn.execute("BEGIN IMMEDIATE")
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version > len(migrations):
                raise StoreError(
                    f"{path} has schema version {version}; this mlx-fleet reads up to "
                    f"{len(migrations)}: upgrade mlx-fleet or use another MLX_FLEET_HOME"
                )
            for script in migrations[version:]:
                for statement in script.split(";"):
                    if statement.strip():
                        conn.execute(statement)
            conn.execute(f"PRAGMA user_version = {len(migrations)}")
            conn.execute(META)
            conn.execute(
                "INSERT OR IGNORE INTO mlx_fleet_meta (key, value) VALUES ('id', ?)",
                (secrets.token_hex(8),),
            )
    except sqlite3.DatabaseError as exc:
        conn.close()
        raise StoreError(f"{path}: not a usable mlx-fleet {what}: {exc}") from None
    except BaseException:
        conn.close()
        raise
    return conn


def store_id(conn: sqlite3.Connection) -> str:
    """The store's random id: a new file (a reinstall, a wiped data dir) has a new one, so a
    reader holding cursors into the old file knows they no longer mean anything."""
    return str(conn.execute("SELECT value FROM mlx_fleet_meta WHERE key = 'id'").fetchone()[0])
