"""Opening the project's SQLite files, one way for every store."""

from __future__ import annotations

import sqlite3
from pathlib import Path

BUSY_TIMEOUT_S = 30.0


def open_database(
    path: Path, *, rows_by_name: bool = False, threads: bool = False
) -> sqlite3.Connection:
    """A connection in WAL mode, so readers never block the writer and several processes (the
    daemon and `agent run`, a monitor and a benchmark) can share the file; a busy file is waited
    for, not failed on. Created, with its folder, on first use. A file that is not a database
    raises sqlite3.DatabaseError, with the connection closed."""
    path.parent.mkdir(parents=True, exist_ok=True)
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
