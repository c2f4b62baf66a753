"""llama-bench's rows (shared.reports.llama_bench) in our csv, jsonl, sql and llama-json: the
columns and key values llama.cpp's compare-llama-bench.py needs, on reports shaped as agents send
them. The script itself reads real runs in tests/test_compare_llama_bench.py."""

from __future__ import annotations

import csv
import io
import json
import sqlite3
import subprocess
from typing import Any

import pytest

from shared.reports.benchmark import render_text
from shared.reports.llama_bench import (
    LLAMA_BENCH_FIELDS,
    LLAMA_BENCH_KEYS,
    LabelError,
    check_label,
    label_lengths_problem,
    left_out_note,
)
from tests.conftest import console_script

NAMES = [name for name, _ in LLAMA_BENCH_FIELDS]
MAC = {
    "hostname": "mac1",
    "chip": "Apple M3 Pro",
    "gpu_cores": 18,
    "backend": "gpu",
    "device": "applegpu_g15s",
    "mlx_version": "0.29.1",
    "mlx_fleet_version": "0.1.0",
}


def cell(test: str, n_prompt: int, n_gen: int, batch: int = 1, **more: Any) -> dict[str, Any]:
    """A finished cell as an agent reports it (the fields the rows read)."""
    return {
        "model": "small",
        "bits": 16,
        "name": f"small/f16 {test} b{batch}",
        "test": test,
        "mode": "prefill" if n_gen == 0 else "decode",
        "n_prompt": n_prompt,
        "n_gen": n_gen,
        "n_depth": 0,
        "batch_size": batch,
        "prefill_step_size": 2048,
        "status": "ok",
        "tokens_per_sec": 400.0,
        "std_tokens_per_sec": 8.0,
        "latency_ms": 40.0,
        "std_latency_ms": 0.8,
        "samples_ms": [39.5, 40.5],
        "samples_tokens_per_sec": [405.0, 395.0],
        "test_time": "2026-12-06T05:00:00+00:00",
        "flags": [],
        **more,
    }


def report(machine: dict[str, Any] = MAC) -> dict[str, Any]:
    failed = cell("tg8", 0, 8, status="failed", error="Metal: out of memory")
    for key in ("tokens_per_sec", "std_tokens_per_sec", "latency_ms", "std_latency_ms"):
        failed[key] = None
    return {
        "machine": machine,
        "models": [
            {
                "model": "small",
                "bits": 16,
                "label": "small/f16",
                "param_count": 4_000_000,
                "weight_memory_bytes": 8_000_000,
            }
        ],
        "cells": [cell("pp16", 16, 0), cell("pp16", 16, 0, batch=2), failed],
    }


def loaded(*scripts: str) -> sqlite3.Connection:
    db = sqlite3.connect(":memory:")
    for script in scripts:
        db.executescript(script)
    return db


def test_sql_writes_llama_benchs_table_whole_with_no_null_key() -> None:
    db = loaded(render_text(report(), "sql"))
    columns = [row[1] for row in db.execute("PRAGMA table_info(llama_bench)")]
    assert columns == NAMES and len(NAMES) == 42
    rows = [dict(zip(NAMES, r, strict=True)) for r in db.execute("SELECT * FROM llama_bench")]
    assert len(rows) == 2, "the failed cell has no figure: llama-bench writes no row for it"
    for row in rows:
        assert all(row[key] is not None for key in (*LLAMA_BENCH_KEYS, "build_commit", "avg_ts"))
        assert row["build_commit"] == "0.29.1", "the label defaults to the MLX version"
        assert row["cpu_info"] == "Apple M3 Pro" and row["gpu_info"] == "Apple M3 Pro 18-core GPU"
        assert row["backends"] == "MLX" and row["n_gpu_layers"] == 99
        assert row["model_size"] == 8_000_000 and row["model_n_params"] == 4_000_000
        assert (row["avg_ns"], row["stddev_ns"], row["avg_ts"]) == (40_000_000, 800_000, 400.0)
    assert [r["model_type"] for r in rows] == ["small/f16", "small/f16 b2"]


def test_our_table_keeps_every_cell_keyed_to_its_llama_bench_row() -> None:
    """Two runs into one database (as `| sqlite3 FILE` twice): each row of ours points at its
    own llama_bench row, and the failed cell is kept with no row to point at."""
    db = loaded(render_text(report(), "sql"), render_text(report(), "sql", label="0.30.0"))
    ours = db.execute(
        "SELECT m.build_commit, m.test, m.batch_size, m.status, l.build_commit, l.model_type "
        "FROM mlx_fleet_bench m LEFT JOIN llama_bench l ON l.rowid = m.llama_bench_rowid"
    ).fetchall()
    assert len(ours) == 6 and set(ours) == {
        ("0.29.1", "pp16", 1, "ok", "0.29.1", "small/f16"),
        ("0.29.1", "pp16", 2, "ok", "0.29.1", "small/f16 b2"),
        ("0.29.1", "tg8", 1, "failed", None, None),
        ("0.30.0", "pp16", 1, "ok", "0.30.0", "small/f16"),
        ("0.30.0", "pp16", 2, "ok", "0.30.0", "small/f16 b2"),
        ("0.30.0", "tg8", 1, "failed", None, None),
    }
    assert db.execute("SELECT error FROM mlx_fleet_bench WHERE status = 'failed'").fetchone() == (
        "Metal: out of memory",
    )


def test_a_cpu_run_says_so_in_its_keys() -> None:
    """MLX's CPU backend: no GPU (empty, as llama-bench writes it), no layer on one."""
    linux = {"hostname": "vm", "chip": "AMD EPYC", "backend": "cpu", "device": "AMD EPYC"}
    db = loaded(render_text(report(linux), "sql"))
    row = db.execute("SELECT build_commit, gpu_info, backends, n_gpu_layers FROM llama_bench")
    assert row.fetchone() == ("unknown", "", "MLX CPU", 0)


def test_jsonl_and_csv_carry_llama_benchs_keys_first() -> None:
    lines = [json.loads(line) for line in render_text(report(), "jsonl").splitlines()]
    rows = list(csv.DictReader(io.StringIO(render_text(report(), "csv", label="x1"))))
    assert len(lines) == len(rows) == 2
    for line in lines:
        assert list(line)[:42] == NAMES and line["host"] == "mac1"
        assert line["samples_ts"] == [405.0, 395.0] and line["samples_ns"] == [39500000, 40500000]
        assert all(line[key] is not None for key in LLAMA_BENCH_KEYS)
    assert list(rows[0])[:42] == NAMES and {r["build_commit"] for r in rows} == {"x1"}
    assert left_out_note(report(), "csv") == (
        "1 cell with no figure (failed or not run) left out of the csv, as llama-bench leaves "
        "them: -o json, or -o sql's mlx_fleet_bench, keeps them"
    )
    assert left_out_note(report(), "sql") is None


def test_llama_json_is_llama_benchs_array() -> None:
    """llama-bench's `-o json`: its fields in its order, booleans as JSON's, then the samples."""
    rows = json.loads(render_text(report(), "llama-json"))
    assert isinstance(rows, list) and len(rows) == 2
    assert list(rows[0]) == [*NAMES, "samples_ns", "samples_ts"]
    assert rows[0]["embeddings"] is False and rows[0]["n_threads"] == 0


@pytest.mark.parametrize("label", ["", "two words", "it's", "x" * 65, "-dash-first", "semi;colon"])
def test_a_label_the_script_cannot_take_is_refused(label: str) -> None:
    with pytest.raises(LabelError, match="a label is 1 to 64 characters"):
        check_label(label)


def test_labels_of_two_lengths_are_named() -> None:
    assert check_label("macos-24A335") == "macos-24A335"
    assert label_lengths_problem(["0.29.1", "0.30.0", "0.29.1"]) is None
    assert label_lengths_problem(["0.29.1", "0.29.1-mac1"]) == (
        "labels '0.29.1' (6 characters) and '0.29.1-mac1' (11) differ in length: "
        "compare-llama-bench.py cuts every build_commit to the shortest ('0.29.1'), so -b/-c "
        "could not name '0.29.1-mac1'; choose labels of one length"
    )


@pytest.mark.parametrize(
    "command", [["agent", "bench", "--config-small"], ["coordinator", "show", "r-1"]]
)
def test_a_bad_label_is_one_line_before_any_work(command: list[str]) -> None:
    done = subprocess.run(
        [console_script(command[0]), *command[1:], "-o", "sql", "--label", "it's"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith('error: --label "it\'s": a label is 1 to 64 characters')
