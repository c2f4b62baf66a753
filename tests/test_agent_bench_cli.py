"""`agent bench` end to end: the real console script in a subprocess."""

from __future__ import annotations

import csv
import io
import json
import shutil
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import interrupt, piped, subprocess_env

QUICK = ["--config-small", "-p", "16", "-n", "2", "-r", "1", "-w", "0"]


def small_bench(*args: str, prompts: str = "8", passes: str = "1") -> list[str]:
    """`agent bench`'s arguments for the small config: PASSES timed passes of each prompt
    length in PROMPTS, no warm-up, no decode; ARGS after."""
    return [
        "bench", "--config-small", "-s", prompts, "-i", passes, "-w", "0",
        "--decode-tokens", "0", *args,
    ]  # fmt: skip


def run_agent(agent_cli: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [agent_cli, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=subprocess_env(COLUMNS="200"),
    )


@pytest.mark.slow
def test_quick_start_prints_the_table(agent_cli: str, fleet_home: Path) -> None:
    result = run_agent(
        agent_cli, "bench", "--config-small", "-p", "32,64", "-n", "16", "-d", "0,32", "-r", "2"
    )
    assert result.returncode == 0, result.stderr
    for label in (
        "pp32",
        "pp64",
        "tg16",
        "pp64 @ d32",
        "tg16 @ d32",
        "tok/s",
        "SoC °C",
        "N/A",
        "small/f16",
        "4.00M params",
        "MLX ",
    ):
        assert label in result.stdout
    saved = list((fleet_home / "runs").glob("bench-*.json"))
    assert len(saved) == 1
    assert len(json.loads(saved[0].read_text())["cells"]) == 6


@pytest.mark.slow
def test_json_carries_samples_and_machine_fields(agent_cli: str) -> None:
    result = run_agent(agent_cli, "bench", *QUICK, "-i", "2", "-b", "1,2", "--format", "json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    for key in (
        "hostname",
        "device",
        "chip",
        "memory_gb",
        "os",
        "mlx_version",
        "mlx_fleet_version",
        "python",
    ):
        assert report["machine"][key], key
    assert report["models"][0]["param_count"] == 4_000_000
    cells = report["cells"]
    assert [(c["test"], c["batch_size"]) for c in cells] == [
        ("pp16", 1),
        ("tg2", 1),
        ("pp16", 2),
        ("tg2", 2),
    ]
    assert {c["host"] for c in cells} == {report["machine"]["hostname"]}
    for cell in cells:
        assert len(cell["samples_ms"]) == 2
        assert cell["tokens_per_sec"] > 0 and cell["peak_memory_gb"] > 0


LLAMA_BENCH_COLUMNS = (
    "model_filename",
    "model_type",
    "model_size",
    "model_n_params",
    "n_batch",
    "n_prompt",
    "n_gen",
    "n_depth",
    "test_time",
    "avg_ns",
    "stddev_ns",
    "avg_ts",
    "stddev_ts",
)
"""Columns llama-bench writes (tools/llama-bench/llama-bench.cpp, test::get_fields) that mean
the same in ours."""


@pytest.mark.parametrize("fmt", ["md", "csv", "jsonl"])
@pytest.mark.slow
def test_other_formats(agent_cli: str, fmt: str, tmp_path: Path) -> None:
    out = tmp_path / f"report.{fmt}"
    result = run_agent(agent_cli, "bench", *QUICK, "-o", fmt, "--output", str(out))
    assert result.returncode == 0, result.stderr
    text = out.read_text()
    if fmt == "md":
        assert " | small/f16 | pp16 | 1 |" in text
    elif fmt == "csv":
        rows = list(csv.DictReader(io.StringIO(text)))
        assert set(LLAMA_BENCH_COLUMNS) <= set(rows[0])
        assert [(r["test"], r["n_prompt"], r["n_gen"], r["n_depth"]) for r in rows] == [
            ("pp16", "16", "0", "0"),
            ("tg2", "0", "2", "0"),
        ]
        assert all(r["host"] and r["host"] == r["hostname"] for r in rows)
        assert rows[0]["model_n_params"] == "4000000" and rows[0]["n_batch"] == "2048"
        assert float(rows[0]["avg_ts"]) > 0 and int(rows[0]["avg_ns"]) > 0
        # issue 42: the settings the json records carry
        assert rows[0]["mlx_lm_version"] and rows[0]["weights_digest"].startswith("config:")
        assert "pause_temp=" in rows[0]["policy"] and rows[0]["os_name"]
        assert {"power_mode", "power_source", "model_revision", "policy_origin"} <= set(rows[0])
    else:
        lines = [json.loads(line) for line in text.strip().splitlines()]
        assert [line["test"] for line in lines] == ["pp16", "tg2"]
        assert all(line["host"] and line["hostname"] for line in lines)
        assert all(len(line["samples_ns"]) == len(line["samples_ts"]) == 1 for line in lines)
        assert all(line["mlx_lm_version"] and "power_source" in line for line in lines)
        assert all(line["weights_digest"] and "stop_temp=" in line["policy"] for line in lines)


@pytest.mark.slow
def test_sql_loads_into_sqlite_with_the_whole_llama_bench_matrix(
    agent_cli: str, tmp_path: Path
) -> None:
    """The issue's command: every llama-bench matrix option at once, `-o sql` into SQLite."""
    args = ["-p", "32,64", "-n", "8,16", "-pg", "32,8", "-d", "0,32", "-r", "2", "-w", "0"]
    result = run_agent(agent_cli, "bench", "--config-small", *args, "-o", "sql")
    assert result.returncode == 0, result.stderr
    database = tmp_path / "bench.sqlite"
    if shutil.which("sqlite3"):  # the CLI itself, as `| sqlite3 :memory:` uses it
        piped = subprocess.run(
            ["sqlite3", str(database)], input=result.stdout, capture_output=True, text=True
        )
        assert piped.returncode == 0 and piped.stderr == "", piped.stderr
    else:
        sqlite3.connect(database).executescript(result.stdout)
    with sqlite3.connect(database) as db:
        rows = db.execute(
            "SELECT test, n_prompt, n_gen, n_depth, avg_ts > 0, length(samples_ns) > 0 "
            "FROM mlx_fleet_bench"
        ).fetchall()
    tests = ["pp32", "pp64", "tg8", "tg16", "pp32+tg8"]
    assert [row[0] for row in rows] == tests + [f"{t} @ d32" for t in tests]
    assert rows[4][1:4] == (32, 8, 0) and rows[9][1:4] == (32, 8, 32)
    assert all(row[4] == 1 and row[5] == 1 for row in rows)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--config", "medium"], "unknown config 'medium'"),
        (["--config-small", "-p", "-1"], "--n-prompt item 1: prompt length -1"),
        (["--config-small", "-s", "2000000"], "--n-prompt item 1: prompt length 2000000"),
        (["--config-small", "-p", "0", "-n", "0"], "n_prompt, n_gen, n_pg: nothing to measure"),
        (["--config-small", "-pg", "8"], "-pg: expected PROMPT,GENERATED"),
        (["--config-small", "-d", "x"], "--n-depth: 'x' is not a list of integers"),
        (["--config-small", "--delay", "-1"], "--delay must be >= 0 seconds, got -1"),
        (["--config-small", "--config", "full"], "--config-small and --config full conflict"),
        (["--config-small", "-b", "0"], "--batch-sizes item 1: batch size 0"),
        (["--config-small", "--batch-size", "-1"], "--batch-sizes item 1: batch size -1"),
        (["--config-small", "--bits", "2"], "--bits item 1: 2 is not supported"),
        (["--model", "/no/such/model"], "model directory /no/such/model does not exist"),
        (["--config-small", "--format", "xml"], "unknown format 'xml'"),
        (["--config-small", "-o", "xml"], "unknown format 'xml'"),
        (
            ["--config-small", "--output", "/no/such/folder/out.csv"],
            "folder /no/such/folder does not exist",
        ),
        (["--config-small", "--poll-interval", "0"], "--poll-interval"),
        (["--model", "/etc/hostname"], "is a file, not a model directory"),
    ],
)
@pytest.mark.slow
def test_bad_input_exits_2_with_one_line(agent_cli: str, args: list[str], message: str) -> None:
    result = run_agent(agent_cli, "bench", *args)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.stderr
    assert result.stdout == ""


def test_ctrl_c_prints_the_cells_finished_so_far(agent_cli: str) -> None:
    process = piped(
        [agent_cli, *small_bench("--format", "json", prompts="8,4096")],
    )
    assert process.stderr is not None
    first = ""
    while "[1/" not in first:  # past the header's warnings and the build's line
        first = process.stderr.readline()
        assert first, "agent bench ended before its first cell"
    assert "[1/2]" in first and "pp8" in first, first
    stdout, stderr = interrupt(process, signal.SIGINT, 300)
    report = json.loads(stdout)
    assert report["interrupted"] is True
    assert [(c["test"], c["status"]) for c in report["cells"]] == [
        ("pp8", "ok"),
        ("pp4096", "not run"),
    ]
    assert report["cells"][1]["error"] == "interrupted"


def test_help_lists_the_seed_options(agent_cli: str) -> None:
    result = run_agent(agent_cli, "bench", "--help")
    for option in (
        "--n-prompt",
        "--n-gen",
        "-pg",
        "--n-depth",
        "--repetitions",
        "--delay",
        "--prefill-step-size",
        "--output-format",
        "--seq-lengths",
        "--warmup",
        "--iterations",
        "--config-small",
        "--batch-size",
        "--model",
        "--bits",
        "--decode-tokens",
        "--format",
        "--output",
    ):
        assert option in result.stdout


def test_module_runs_without_the_console_script() -> None:
    result = subprocess.run(
        [sys.executable, "-c", "from agent.cli import app; app()", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0 and "bench" in result.stdout


def thermal_bench(agent_cli: str, curve: Path, *extra: str) -> subprocess.CompletedProcess:
    return run_agent(
        agent_cli,
        *small_bench(
            "--thermal-source", f"replay:{curve}", "--poll-interval", "0.05", "--format", "json",
            *extra, prompts="8,16", passes="2",
        ),
    )  # fmt: skip


@pytest.mark.slow
def test_a_thermal_pause_is_flagged_and_kept_out_of_the_latencies(
    agent_cli: str, tmp_path: Path
) -> None:
    curve = tmp_path / "curve.csv"
    # hot from the start, cool after 5 s: beside two busy loops agent bench took over 1.5 s to
    # reach its first cell, which then began cool
    curve.write_text("0,90\n5,70\n")
    result = thermal_bench(agent_cli, curve, "--no-cool-start")  # else it waits, not pauses
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    first, second = report["cells"]
    assert "paused" in first["flags"] and "hot" in first["flags"]
    assert "simulated" in first["flags"] and first["thermal_source"].startswith("replay:")
    assert first["pause_s"] > 0.3
    assert max(first["samples_ms"]) < first["pause_s"] * 1000
    assert first["soc_temp_end_c"] == 70.0
    assert second["flags"] == ["simulated"] and second["pause_s"] == 0.0
    assert report["thermal"]["simulated"] is True
    # A pause can outlast every cell: the terminal hears when it begins and ends, and from what.
    assert "cooling: pause at 90.0 °C (replay:" in result.stderr
    assert "cooling: resume at 70.0 °C (replay:" in result.stderr


def test_a_thermal_stop_ends_the_run_and_keeps_what_was_measured(
    agent_cli: str, tmp_path: Path
) -> None:
    curve = tmp_path / "curve.csv"
    curve.write_text("0,97\n")
    result = thermal_bench(agent_cli, curve)
    assert result.returncode == 1
    report = json.loads(result.stdout)
    assert [c["status"] for c in report["cells"]] == ["failed", "not run"]
    assert report["cells"][1]["error"] == "thermal shutdown"
    assert "97.0 °C reached the stop threshold 95.0 °C" in report["cells"][0]["error"]
    assert "thermal shutdown" in report["stopped"]
    assert "cooling: stop at 97.0 °C (replay:" in result.stderr


@pytest.mark.slow
def test_no_cooling_only_observes(agent_cli: str, tmp_path: Path) -> None:
    curve = tmp_path / "curve.csv"
    curve.write_text("0,97\n")
    result = thermal_bench(agent_cli, curve, "--no-cooling")
    assert result.returncode == 0, result.stderr
    cells = json.loads(result.stdout)["cells"]
    assert all(c["flags"] == ["hot", "simulated"] and c["pause_s"] == 0.0 for c in cells)
    assert "cooling:" not in result.stderr  # it observes: nothing was paused or stopped
    assert (
        "97.0 (replay:"
        in subprocess.run(
            [agent_cli, *small_bench("--thermal-source", f"replay:{curve}", "--no-cooling")],
            capture_output=True,
            text=True,
            timeout=300,
            env=subprocess_env(COLUMNS="250"),
        ).stdout
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--pause-temp", "70"], "thresholds out of order"),
        (["--thermal-source", "bogus"], "unknown thermal source 'bogus'; known: auto"),
    ],
)
def test_bad_thermal_options_exit_2(agent_cli: str, args: list[str], message: str) -> None:
    result = run_agent(agent_cli, "bench", "--config-small", *args)
    assert result.returncode == 2
    assert message in result.stderr
