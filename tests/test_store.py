"""RunStore on real SQLite files: ids, arrival order, crash survival, threads, schema checks."""

from __future__ import annotations

import json
import re
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from coordinator.runs.store import MIGRATIONS, RunStore, UnknownRunError
from shared.benchmark.matrix import Cell
from shared.benchmark.results import cell_record
from shared.io.sqlite import StoreError
from shared.reports.benchmark import render_text

MACHINE = {
    "hostname": "mac1",
    "device": "Apple M4 Max",
    "backend": "gpu",
    "memory_gb": 64.0,
    "os": "macOS 15.1",
    "mlx_version": "0.21.0",
    "mlx_fleet_version": "0.1.0",
}


def ok_cell(seq_len: int, tokens_per_sec: float, batch_size: int = 1) -> dict[str, Any]:
    """A prefill cell of the small model as the agent reports it."""
    return cell_record(
        Cell("small", 16, seq_len, 0, 0, batch_size),
        {
            "tokens_per_sec": tokens_per_sec,
            "std_tokens_per_sec": 0.5,
            "ci95_tokens_per_sec": 1.0,
            "latency_ms": 1000.0 * seq_len * batch_size / tokens_per_sec,
            "std_latency_ms": 0.1,
            "peak_memory_gb": 0.25,
        },
    )


def failed_cell(seq_len: int, error: str) -> dict[str, Any]:
    return cell_record(Cell("small", 16, seq_len, 0, 0, 1), error=error)


def fill_run(
    store: RunStore, speeds: dict[str, dict[int, float | None]], status: str = "ok"
) -> str:
    """A finished run: per host, per sequence length, tok/s (None: the cell failed)."""
    run_id = store.create_run({"n_prompt": [32, 64]}, list(speeds))
    for host, cells in speeds.items():
        store.set_host_info(
            run_id, host, {**MACHINE, "hostname": host.split(":")[0]}, [], "ok", None
        )
        for seq_len, speed in cells.items():
            store.add_cell(
                run_id,
                host,
                ok_cell(seq_len, speed)
                if speed is not None
                else failed_cell(seq_len, f"boom on {host}"),
            )
    store.finish_run(run_id, status)
    return run_id


@pytest.fixture
def store(tmp_path: Path) -> Iterator[RunStore]:
    with RunStore(tmp_path / "runs.sqlite") as opened:
        yield opened


def test_default_path_is_under_the_data_dir(fleet_home: Path) -> None:
    with RunStore() as store:
        assert store.path == fleet_home / "coordinator.sqlite"
    assert store.path.is_file()


def three_hundred_ids(store: RunStore) -> list[str]:
    return [store.create_run({}, ["mac1:5555"]) for _ in range(300)]


def test_ids_are_unique(store: RunStore) -> None:
    assert len(set(three_hundred_ids(store))) == 300


def test_ids_are_readable(store: RunStore) -> None:
    for run_id in three_hundred_ids(store):
        assert re.fullmatch(r"r-\d{8}-\d{4}-[0-9a-f]{4}", run_id), run_id


def test_report_round_trip(store: RunStore) -> None:
    spec = {"n_prompt": [32, 64], "models": ["small"], "warmup": 0}
    run_id = store.create_run(spec, ["mac1:5555", "mac2:5555"])
    first, second, third = ok_cell(32, 100.0), ok_cell(64, 80.0), failed_cell(32, "OOM")
    store.add_cell(run_id, "mac2:5555", first)
    store.add_cell(run_id, "mac1:5555", second)
    store.add_cell(run_id, "mac2:5555", third)
    store.set_host_info(run_id, "mac1:5555", MACHINE, [{"label": "small/f16"}], "ok", None)
    store.set_host_info(run_id, "mac2:5555", None, [], "failed", "connection lost")
    store.finish_run(run_id, "failed", interrupted=True)

    report = store.load_report(run_id)
    assert report["run_id"] == run_id and report["title"] == f"mlx-fleet benchmark {run_id}"
    assert report["spec"] == spec and report["status"] == "failed"
    assert report["interrupted"] is True and report["finished"] is not None
    assert report["hosts"] == [
        {
            "host": "mac1:5555",
            "machine": MACHINE,
            "models": [{"label": "small/f16"}],
            "status": "ok",
            "error": None,
        },
        {
            "host": "mac2:5555",
            "machine": None,
            "models": [],
            "status": "failed",
            "error": "connection lost",
        },
    ]
    assert report["cells"] == [
        {**first, "host": "mac2:5555"},
        {**second, "host": "mac1:5555"},
        {**third, "host": "mac2:5555"},
    ]
    assert "host" not in first  # add_cell stores a copy


def test_hosts_first_named_later_are_appended(store: RunStore) -> None:
    run_id = store.create_run({}, ["b:1"])
    store.add_cell(run_id, "a:1", ok_cell(32, 1.0))
    store.set_host_info(run_id, "c:1", None, [], "failed", "refused")
    hosts = store.load_report(run_id)["hosts"]
    assert [(h["host"], h["status"]) for h in hosts] == [
        ("b:1", "pending"),
        ("a:1", "pending"),
        ("c:1", "failed"),
    ]


def test_fastest_host_is_marked_on_load(store: RunStore) -> None:
    run_id = fill_run(store, {"mac1:5555": {32: 100.0, 64: 50.0}, "mac2:5555": {32: 120.0}})
    cells = store.load_report(run_id)["cells"]
    assert [(c["host"], c["n_prompt"], c.get("fastest")) for c in cells] == [
        ("mac1:5555", 32, None),
        ("mac1:5555", 64, None),
        ("mac2:5555", 32, True),
    ]
    text = render_text(store.load_report(run_id), "md")
    assert "| mac2:5555 | small/f16 | pp32 | 1 | 120.00 ± 0.50 |" in text
    assert "fastest" in text


def test_list_runs_newest_first_with_counts(store: RunStore) -> None:
    older = fill_run(store, {"mac1:5555": {32: 1.0, 64: None}}, status="failed")
    newer = fill_run(store, {"mac1:5555": {32: 1.0}, "mac2:5555": {32: 2.0, 64: 3.0}})
    unfinished = store.create_run({}, ["mac3:5555"])
    runs = store.list_runs()
    assert [r["id"] for r in runs] == [unfinished, newer, older]
    assert {k: runs[1][k] for k in ("status", "ok", "failed", "hosts", "interrupted")} == {
        "status": "ok",
        "ok": 3,
        "failed": 0,
        "hosts": ["mac1:5555", "mac2:5555"],
        "interrupted": False,
    }
    assert (runs[2]["status"], runs[2]["ok"], runs[2]["failed"]) == ("failed", 1, 1)
    assert (runs[0]["status"], runs[0]["finished"], runs[0]["ok"]) == ("running", None, 0)
    assert [r["id"] for r in store.list_runs(limit=2)] == [unfinished, newer]


def test_a_unique_prefix_finds_its_run(store: RunStore) -> None:
    run_id = store.create_run({}, ["mac1:5555"])
    assert store.load_report(run_id[:-1])["run_id"] == run_id
    assert store.resolve(run_id) == run_id


def test_an_unknown_id_is_a_key_error_that_names_it(store: RunStore) -> None:
    store.create_run({}, ["mac1:5555"])
    with pytest.raises(UnknownRunError, match="unknown run 'r-nope'") as caught:
        store.load_report("r-nope")
    assert isinstance(caught.value, KeyError)
    assert str(caught.value) == "unknown run 'r-nope'; `coordinator runs` lists them"


def test_a_prefix_of_two_runs_is_ambiguous(store: RunStore) -> None:
    store.create_run({}, ["mac1:5555"])
    store.create_run({}, ["mac1:5555"])
    with pytest.raises(UnknownRunError, match="ambiguous"):
        store.load_report("r-")


def test_an_empty_id_is_unknown(store: RunStore) -> None:
    store.create_run({}, ["mac1:5555"])  # the one run every prefix matches: still not found
    with pytest.raises(UnknownRunError):
        store.load_report("")


def test_like_wildcards_in_a_prefix_are_taken_literally(store: RunStore) -> None:
    store.create_run({}, ["mac1:5555"])
    with pytest.raises(UnknownRunError, match="unknown run"):
        store.load_report("%")


def test_writes_to_an_unknown_run_are_refused(store: RunStore) -> None:
    for write in (
        lambda: store.add_cell("r-x", "h:1", ok_cell(32, 1.0)),
        lambda: store.set_host_info("r-x", "h:1", None, [], "ok", None),
        lambda: store.finish_run("r-x", "ok"),
    ):
        with pytest.raises(UnknownRunError):
            write()


def test_the_file_is_in_wal_mode(store: RunStore) -> None:
    with sqlite3.connect(store.path) as raw:
        assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_the_file_is_versioned_by_its_migrations(store: RunStore) -> None:
    with sqlite3.connect(store.path) as raw:
        assert raw.execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS) == 6


def test_a_version_2_file_is_migrated_and_keeps_the_line_a_run_failed_with(
    tmp_path: Path,
) -> None:
    path = tmp_path / "v2.sqlite"
    with sqlite3.connect(path) as raw:
        for script in MIGRATIONS[:2]:
            raw.executescript(script)
        raw.execute("PRAGMA user_version = 2")
        raw.execute(
            "INSERT INTO runs (id, kind, started, status, spec) "
            "VALUES ('r-old', 'benchmark', '2026-01-01T00:00:00+00:00', 'ok', '{}')"
        )
    with RunStore(path) as store:
        run_id = store.create_run({"sizes": [1024]}, ["a", "b"], kind="netbench")
        store.finish_run(run_id, "failed", error="a: no progress for 20 s")
        listed = {run["id"]: run for run in store.list_runs()}
    assert listed["r-old"]["error"] is None
    assert (listed[run_id]["kind"], listed[run_id]["error"]) == (
        "netbench",
        "a: no progress for 20 s",
    )


def test_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "future.sqlite"
    with sqlite3.connect(path) as raw:
        raw.execute("PRAGMA user_version = 99")
    with pytest.raises(StoreError, match="schema version 99"):
        RunStore(path)


def test_garbage_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "garbage.sqlite"
    path.write_bytes(b"not sqlite at all " * 100)
    with pytest.raises(StoreError, match="not a usable mlx-fleet store"):
        RunStore(path)


def test_reopening_keeps_everything(tmp_path: Path) -> None:
    path = tmp_path / "runs.sqlite"
    with RunStore(path) as first:
        run_id = fill_run(first, {"mac1:5555": {32: 10.0, 64: None}})
        before = first.load_report(run_id)
    with RunStore(path) as second:
        assert second.load_report(run_id) == before


def test_cells_survive_a_killed_writer(tmp_path: Path) -> None:
    """Each cell is committed at once: SIGKILL after three cells leaves three cells."""
    path = tmp_path / "runs.sqlite"
    script = f"""
import os, signal, sys
sys.path.insert(0, {str(Path(__file__).parent.parent)!r})
from collections.abc import Iterator
from pathlib import Path
from coordinator.runs.store import RunStore
from tests.test_store import ok_cell
store = RunStore(Path({str(path)!r}))
run_id = store.create_run({{}}, ["mac1:5555"])
for seq_len in (32, 64, 128):
    store.add_cell(run_id, "mac1:5555", ok_cell(seq_len, 10.0))
print(run_id, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == -9, result.stderr
    with RunStore(path) as store:
        report = store.load_report(result.stdout.strip())
    # its coordinator is gone: the run will not finish by itself
    assert report["status"] == "interrupted" and report["finished"] is None
    assert report["interrupted"] is True
    assert "`coordinator resume` finishes it" in report["title"]
    assert [c["n_prompt"] for c in report["cells"]] == [32, 64, 128]


def test_threads_share_one_store(store: RunStore) -> None:
    run_id = store.create_run({}, [f"mac{i}:5555" for i in range(8)])

    def feed(host: str) -> None:
        for seq_len in range(1, 41):
            store.add_cell(run_id, host, ok_cell(seq_len, float(seq_len)))

    threads = [threading.Thread(target=feed, args=(f"mac{i}:5555",)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    cells = store.load_report(run_id)["cells"]
    assert len(cells) == 320
    for i in range(8):
        mine = [c["n_prompt"] for c in cells if c["host"] == f"mac{i}:5555"]
        assert mine == list(range(1, 41))  # each host's cells in the order it sent them
    assert store.list_runs()[0]["ok"] == 320


def test_records_are_json_text(store: RunStore) -> None:
    """Stored as JSON with indexed columns beside it; another reader can query them."""
    run_id = fill_run(store, {"mac1:5555": {32: 10.0, 64: None}})
    with sqlite3.connect(store.path) as raw:
        rows = raw.execute(
            "SELECT host, name, status, record FROM cells WHERE run_id = ? ORDER BY seq", (run_id,)
        ).fetchall()
    assert [(h, n, s) for h, n, s, _ in rows] == [
        ("mac1:5555", "small/f16 pp32 b1", "ok"),
        ("mac1:5555", "small/f16 pp64 b1", "failed"),
    ]
    assert json.loads(rows[1][3])["error"] == "boom on mac1:5555"
