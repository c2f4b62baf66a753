"""Opening the project's SQLite files, one way for every store: WAL mode, a busy timeout, and a
versioned schema brought up to date in one transaction."""

from __future__ import annotations

import errno
import os
import secrets
import sqlite3
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import quote

from shared.io.files import make_private
from shared.io.paths import make_folders, unwritable

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
    make_folders(path.parent)
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
    Every store also gets a random id (store_id), made with it. A store that cannot be written
    here (a read-only mount, no permission) is opened read-only, so it can still be read.
    Raises StoreError naming `what` and the file."""
    if read_only(path):
        return open_read_only(path, migrations, what=what, rows_by_name=rows_by_name)
    try:
        conn = open_database(path, rows_by_name=rows_by_name, threads=threads)
    except sqlite3.DatabaseError as exc:
        raise store_error(path, what, exc) from None
    except OSError as exc:
        raise StoreError(f"{path}: {exc.strerror or exc}") from None
    try:
        with conn:
            conn.execute("BEGIN IMMEDIATE")
            version = schema_version(conn)
            check_version(path, version, migrations)
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
        raise store_error(path, what, exc) from None
    except BaseException:
        conn.close()
        raise
    return conn


UNWRITABLE = (errno.EROFS, errno.EACCES)
NOT_CORRUPT = frozenset(
    {"SQLITE_READONLY", "SQLITE_CANTOPEN", "SQLITE_FULL", "SQLITE_PERM", "SQLITE_IOERR"}
)
"""SQLite's names for a file the system refuses, which says nothing of what the file holds."""


def read_only(path: Path) -> bool:
    """Whether the store at `path` can only be read here: its folder is on a read-only mount
    or not this user's to write, or the file is not. A full disk is not that: a writer waits
    for space (agent/daemon/storage.py)."""
    folder = next(f for f in path.parents if f.exists())  # the folders it would be made in
    if not folder.is_dir():
        return False
    if unwritable(folder) in UNWRITABLE:
        return True
    return path.exists() and not os.access(path, os.W_OK)


def open_read_only(
    path: Path, migrations: Sequence[str], *, what: str, rows_by_name: bool
) -> sqlite3.Connection:
    """The store opened with SQLite's mode=ro, or immutable=1 where a WAL file's -shm cannot be
    made (a read-only mount); nothing stored yet reads as an empty store, held in memory."""
    if not path.exists():
        conn = sqlite3.connect(":memory:", check_same_thread=False)
        for script in migrations:
            conn.executescript(script)
        conn.execute(META)
        conn.execute("INSERT INTO mlx_fleet_meta (key, value) VALUES ('id', ?)", ("empty",))
    else:
        conn = connect_read_only(path, what)
        version = schema_version(conn)
        if version != len(migrations):
            conn.close()
            check_version(path, version, migrations)
            raise StoreError(
                f"{path} is read-only here and at schema version {version}, older than this "
                f"mlx-fleet's {len(migrations)}: open it once where it can be written to bring "
                "it up to date"
            )
    if rows_by_name:
        conn.row_factory = sqlite3.Row
    return conn


def connect_read_only(path: Path, what: str) -> sqlite3.Connection:
    """mode=ro first, which sees a writer's latest commits; immutable=1 where that cannot open
    (nothing on a read-only mount can change the file)."""
    uri = f"file:{quote(str(path.absolute()))}?mode=ro"
    for options in ("", "&immutable=1"):
        conn = sqlite3.connect(
            uri + options, uri=True, timeout=BUSY_TIMEOUT_S, check_same_thread=False
        )
        try:
            schema_version(conn)
        except sqlite3.OperationalError:
            conn.close()
            continue
        except sqlite3.DatabaseError as exc:
            conn.close()
            raise store_error(path, what, exc) from None
        return conn
    raise StoreError(f"{path}: the {what} is read-only here and SQLite cannot open it")


def schema_version(conn: sqlite3.Connection) -> int:
    return int(conn.execute("PRAGMA user_version").fetchone()[0])


def check_version(path: Path, version: int, migrations: Sequence[str]) -> None:
    """A file written by a newer mlx-fleet is refused, naming both versions."""
    if version > len(migrations):
        raise StoreError(
            f"{path} has schema version {version}; this mlx-fleet reads up to "
            f"{len(migrations)}: upgrade mlx-fleet or use another MLX_FLEET_HOME"
        )


def store_error(path: Path, what: str, exc: sqlite3.DatabaseError) -> StoreError:
    """What a failed open says: the system's refusal as it is, and "not a usable" only of a
    file whose contents SQLite rejects (which reads as damage, and is)."""
    name = getattr(exc, "sqlite_errorname", "")  # SQLITE_IOERR_WRITE: its family, SQLITE_IOERR
    if "_".join(name.split("_")[:2]) in NOT_CORRUPT:
        return StoreError(f"{path}: cannot use the mlx-fleet {what}: {exc}")
    return StoreError(f"{path}: not a usable mlx-fleet {what}: {exc}")


def store_id(conn: sqlite3.Connection) -> str:
    """The store's random id: a new file (a reinstall, a wiped data dir) has a new one, so a
    reader holding cursors into the old file knows they no longer mean anything."""
    return str(conn.execute("SELECT value FROM mlx_fleet_meta WHERE key = 'id'").fetchone()[0])
