"""The versioned-schema helper every store opens with (real SQLite files), the upgrade of files
earlier releases wrote, and every telemetry table holding exactly shared.wire.telemetry's
columns."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from agent.cooling.events import EventLog
from agent.daemon.history import MEMORY_SAMPLES, WRITE_EVERY, TelemetryHistory
from coordinator.telemetry.store import TelemetryStore
from shared.io.sqlite import StoreError, open_store, store_id
from shared.wire.telemetry import Event, Sample

STEPS = ("CREATE TABLE a (x INTEGER)", "ALTER TABLE a ADD COLUMN y TEXT; CREATE TABLE b (z REAL)")


def columns(path: Path, table: str) -> list[str]:
    with sqlite3.connect(path) as conn:
        return [row[1] for row in conn.execute(f"PRAGMA table_info({table})")]


def new_store(path: Path) -> str:
    """Open a new file with every step and close it; returns its id."""
    conn = open_store(path, STEPS, what="test store")
    made = store_id(conn)
    conn.close()
    return made


def test_a_new_file_takes_every_step(tmp_path: Path) -> None:
    path = tmp_path / "s.sqlite"
    new_store(path)
    assert columns(path, "a") == ["x", "y"] and columns(path, "b") == ["z"]
    with sqlite3.connect(path) as raw:
        assert raw.execute("PRAGMA user_version").fetchone()[0] == 2


def test_a_new_file_is_in_wal_mode(tmp_path: Path) -> None:
    path = tmp_path / "s.sqlite"
    new_store(path)
    with sqlite3.connect(path) as raw:
        assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_a_new_file_gets_an_id_it_keeps(tmp_path: Path) -> None:
    path = tmp_path / "s.sqlite"
    first = new_store(path)
    again = open_store(path, STEPS, what="test store")  # nothing left to do: nothing done
    assert store_id(again) == first and len(first) == 16
    again.close()


def test_an_older_file_takes_only_the_steps_it_lacks(tmp_path: Path) -> None:
    path = tmp_path / "s.sqlite"
    open_store(path, STEPS[:1], what="test store").close()
    with sqlite3.connect(path) as raw:
        raw.execute("INSERT INTO a (x) VALUES (7)")
    open_store(path, STEPS, what="test store").close()
    with sqlite3.connect(path) as raw:
        assert raw.execute("SELECT x, y FROM a").fetchall() == [(7, None)]


def test_a_failed_step_changes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "s.sqlite"
    open_store(path, STEPS[:1], what="test store").close()
    with pytest.raises(StoreError, match="test store"):
        open_store(
            path,
            (*STEPS[:1], "ALTER TABLE a ADD COLUMN y TEXT; ALTER TABLE nope X"),
            what="test store",
        )
    assert columns(path, "a") == ["x"]
    with sqlite3.connect(path) as raw:
        assert raw.execute("PRAGMA user_version").fetchone()[0] == 1


def test_a_newer_file_is_refused_by_name(tmp_path: Path) -> None:
    future = tmp_path / "future.sqlite"
    with sqlite3.connect(future) as raw:
        raw.execute("PRAGMA user_version = 9")
    with pytest.raises(StoreError, match="schema version 9; this mlx-fleet reads up to 2"):
        open_store(future, STEPS, what="test store")


def test_garbage_is_refused_by_name(tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.sqlite"
    garbage.write_bytes(b"not sqlite " * 200)
    with pytest.raises(StoreError, match="garbage.sqlite: not a usable mlx-fleet test store"):
        open_store(garbage, STEPS, what="test store")


def test_every_telemetry_table_holds_the_shared_types_columns(tmp_path: Path) -> None:
    history = TelemetryHistory("mac1", EventLog(tmp_path / "events.sqlite"), tmp_path / "t.sqlite")
    history.close()
    history.events.close()
    TelemetryStore(tmp_path / "coordinator.sqlite").close()
    assert columns(tmp_path / "t.sqlite", "samples") == ["seq", *Sample.columns()]
    assert sorted(columns(tmp_path / "events.sqlite", "events")) == sorted(
        ["seq", *Event.columns()]
    )
    coordinator = tmp_path / "coordinator.sqlite"
    assert sorted(columns(coordinator, "samples")) == sorted(
        ["host", "seq", "job_paused", *Sample.columns()]  # job_paused: the store's own flag
    )
    assert sorted(columns(coordinator, "events")) == sorted(["host", "seq", *Event.columns()])


def test_files_of_the_unversioned_release_are_upgraded_with_their_rows(tmp_path: Path) -> None:
    """What agent serve and agent run wrote before stores had versions: every row is kept,
    numbered, with the columns renamed as shared.wire.telemetry names them."""
    events, samples = tmp_path / "agent-events.sqlite", tmp_path / "agent-telemetry.sqlite"
    with sqlite3.connect(events) as raw:
        raw.executescript(
            "CREATE TABLE events (seq INTEGER PRIMARY KEY, time REAL NOT NULL, job TEXT NOT NULL,"
            " pid INTEGER, action TEXT NOT NULL, celsius REAL, source TEXT NOT NULL,"
            " simulated INTEGER NOT NULL, detail TEXT);"
            "INSERT INTO events VALUES (1, 10.0, 'j1', 42, 'pause', 86.0, 'sim', 1, NULL);"
            "INSERT INTO events VALUES (2, 11.0, '', NULL, 'policy', NULL, 'sim', 1, 'x=1');"
        )
    with sqlite3.connect(samples) as raw:
        raw.executescript(
            "CREATE TABLE samples (time REAL NOT NULL, host TEXT NOT NULL, celsius REAL,"
            " pressure TEXT, source TEXT NOT NULL, simulated INTEGER NOT NULL, state TEXT,"
            " trend REAL, pause_s_total REAL NOT NULL, jobs TEXT NOT NULL);"
            "INSERT INTO samples VALUES (2.0, 'mac1', 71.0, NULL, 'sim', 1, 'ok', 0.5, 0, '[]');"
            "INSERT INTO samples VALUES (1.0, 'mac1', 70.0, NULL, 'sim', 1, 'ok', NULL, 0, '[]');"
        )
    log = EventLog(events)
    history = TelemetryHistory("mac1", log, samples)
    upgraded = log.after(0, 0.0, 10)
    assert [(e.seq, e.job, e.action) for e in upgraded] == [(1, "j1", "pause"), (2, None, "policy")]
    page, _, _ = history.page(0, 0, 0.0, 10, 10**6)
    assert [(s["seq"], s["time"], s["trend_c_per_min"]) for s in page] == [
        (1, 1.0, None),
        (2, 2.0, 0.5),
    ]
    added = history.add_sample(Sample(3.0, 72.0, None, "sim", True, "ok", None, 0.0, []))
    assert added.seq == 3 and log.record(upgraded[0]).seq == 3
    history.close()
    log.close()


def test_numbers_are_never_given_twice_after_pruning(tmp_path: Path) -> None:
    """A cursor stays meaningful: pruning every row does not start the numbers again."""
    log = EventLog(tmp_path / "events.sqlite")
    history = TelemetryHistory("mac1", log, tmp_path / "t.sqlite")
    for at in (1.0, 2.0):
        history.add_sample(Sample(at, 70.0, None, "sim", True, "ok", None, 0.0, []))
        log.record(Event(at, "j", 1, "pause", "sim"))
    history.prune(cutoff=10.0)
    history.close()
    reopened = TelemetryHistory("mac1", log, tmp_path / "t.sqlite")
    assert reopened.add_sample(Sample(11.0, 70.0, None, "sim", True, "ok", None, 0.0, [])).seq == 3
    assert log.record(Event(11.0, "j", 1, "resume", "sim")).seq == 3
    reopened.close()
    log.close()


def stored_count(path: Path) -> int:
    with sqlite3.connect(path) as conn:
        return conn.execute("SELECT COUNT(*) FROM samples").fetchone()[0]


def test_samples_are_written_in_batches_and_served_from_memory_meanwhile(tmp_path: Path) -> None:
    log, path = EventLog(tmp_path / "events.sqlite"), tmp_path / "t.sqlite"
    history = TelemetryHistory("mac1", log, path)
    taken = Sample(1.0, 70.0, None, "sim", True, "ok", None, 0.0, [])
    for _ in range(WRITE_EVERY - 1):
        history.add_sample(taken)
    assert stored_count(path) == 0
    page, _, _ = history.page(0, 0, 0.0, 100, 10**6)
    assert [s["seq"] for s in page] == list(range(1, WRITE_EVERY))
    history.add_sample(taken)
    assert stored_count(path) == WRITE_EVERY
    for _ in range(MEMORY_SAMPLES + 2):  # past what memory holds, the last ones not written
        history.add_sample(taken)
    given = WRITE_EVERY + MEMORY_SAMPLES + 2
    assert stored_count(path) < given
    # a cursor older than memory reads the disk, then what waits in memory
    page, _, _ = history.page(0, 0, 0.0, 10000, 10**7)
    assert [s["seq"] for s in page] == list(range(1, given + 1))
    history.close()  # writes what waits
    assert stored_count(path) == given
    log.close()


def test_samples_recorded_before_sensors_were_kept_read_as_none(tmp_path: Path) -> None:
    """The agent's history and the coordinator's store of the previous version gain `sensor`:
    their rows read as None (no sensor said), and new rows keep it."""
    from agent.daemon.history import MIGRATIONS as HISTORY_STEPS
    from coordinator.telemetry.store import MIGRATIONS as STORE_STEPS

    history_path, store_path = tmp_path / "agent-telemetry.sqlite", tmp_path / "c.sqlite"
    old = ("time", "celsius", "source", "simulated", "pause_s_total", "jobs")
    for path, steps, insert in (
        (history_path, HISTORY_STEPS, f"({', '.join(old)}) VALUES ("),
        (store_path, STORE_STEPS, f"(host, seq, {', '.join(old)}) VALUES ('mac1:5555', 1, "),
    ):
        raw = open_store(path, steps[:-1], what="old store")
        with raw:
            raw.execute(f"INSERT INTO samples {insert}1.0, 70.0, 'iohid', 0, 0, '[]')")
        raw.close()
    log = EventLog(tmp_path / "events.sqlite")
    history = TelemetryHistory("mac1", log, history_path)
    new = Sample(2.0, 90.0, None, "smc", False, "pause", None, 0.0, [], sensor="TCMz")
    body = history.add_sample(new).body("mac1")
    history.close()
    reopened = TelemetryHistory("mac1", log, history_path)  # nothing in memory: read from disk
    page, _, _ = reopened.page(0, 0, 0.0, 10, 10**6)
    assert [(s["source"], s["sensor"]) for s in page] == [("iohid", None), ("smc", "TCMz")]
    reopened.close()
    log.close()
    with TelemetryStore(store_path) as store:
        store.add(samples=[("mac1:5555", body)])
        rows = store.samples(0.0)["mac1:5555"]
    assert [(s["seq"], s["source"], s["sensor"]) for s in rows] == [
        (1, "iohid", None),
        (2, "smc", "TCMz"),
    ]
