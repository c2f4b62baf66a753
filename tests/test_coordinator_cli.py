"""`coordinator runs`, `show` and `compare` end to end: the real console script in a subprocess,
reading a store the test fills through RunStore under its own MLX_FLEET_HOME."""

from __future__ import annotations

import csv
import io
import json
import subprocess
from pathlib import Path

import pytest

from coordinator.runs.store import RunStore
from tests.conftest import subprocess_env
from tests.test_store import fill_run


def run_cli(coordinator_cli: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [coordinator_cli, *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=subprocess_env(COLUMNS="200"),
    )


@pytest.fixture
def two_runs(fleet_home: Path) -> tuple[str, str]:
    """A two-host run with a failed cell, then a rerun on the same hosts where all cells ran."""
    with RunStore() as store:
        first = fill_run(
            store,
            {"mac1:5555": {32: 100.0, 64: 50.0}, "mac2:5555": {32: 80.0, 64: None}},
            status="failed",
        )
        second = fill_run(
            store, {"mac1:5555": {32: 150.0, 64: 50.0}, "mac2:5555": {32: 160.0, 64: 40.0}}
        )
    return first, second


def test_version(coordinator_cli: str) -> None:
    result = run_cli(coordinator_cli, "--version")
    assert result.returncode == 0
    assert result.stdout.strip() == "mlx-fleet coordinator 0.1.0"


def test_runs_on_an_empty_store(coordinator_cli: str, fleet_home: Path) -> None:
    result = run_cli(coordinator_cli, "runs")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "" and "no runs stored yet" in result.stderr
    assert json.loads(run_cli(coordinator_cli, "runs", "--format", "json").stdout) == []
    assert (fleet_home / "coordinator.sqlite").is_file()


def test_runs_lists_newest_first(coordinator_cli: str, two_runs: tuple[str, str]) -> None:
    first, second = two_runs
    listed = json.loads(run_cli(coordinator_cli, "runs", "--format", "json").stdout)
    assert [(r["id"], r["status"], r["ok"], r["failed"]) for r in listed] == [
        (second, "ok", 4, 0),
        (first, "failed", 3, 1),
    ]
    assert listed[0]["hosts"] == ["mac1:5555", "mac2:5555"]
    limited = json.loads(
        run_cli(coordinator_cli, "runs", "--limit", "1", "--format", "json").stdout
    )
    assert [r["id"] for r in limited] == [second]

    table = run_cli(coordinator_cli, "runs")
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    newest = next(line for line in lines if second in line)
    assert "mac1:5555, mac2:5555" in newest and " ok " in newest
    assert lines.index(newest) < next(i for i, line in enumerate(lines) if first in line)


def test_show_json_is_the_stored_report(coordinator_cli: str, two_runs: tuple[str, str]) -> None:
    first, _ = two_runs
    result = run_cli(coordinator_cli, "show", first, "--format", "json")
    assert result.returncode == 0, result.stderr
    shown = json.loads(result.stdout)
    assert shown.pop("health") == []  # judged as shown: two hosts are no family (issue 43)
    with RunStore() as store:
        assert shown == store.load_report(first)


def test_show_table(coordinator_cli: str, two_runs: tuple[str, str]) -> None:
    first, _ = two_runs
    result = run_cli(coordinator_cli, "show", first[:-1])  # a unique prefix is enough
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert f"mlx-fleet benchmark {first}" in out
    assert "mac1:5555 (mac1): Apple M4 Max (gpu), 64.0 GB RAM" in out
    assert "mac2:5555 (mac2): Apple M4 Max (gpu), 64.0 GB RAM" in out
    rows = [line for line in out.splitlines() if "small/f16" in line]
    assert len(rows) == 4
    assert "mac1:5555" in rows[0] and "100.00 ± 0.50" in rows[0] and "fastest" in rows[0]
    assert "mac2:5555" in rows[3] and "FAILED: boom on mac2:5555" in rows[3]


@pytest.mark.parametrize("fmt", ["md", "csv", "jsonl"])
def test_show_to_a_file(
    coordinator_cli: str, two_runs: tuple[str, str], tmp_path: Path, fmt: str
) -> None:
    _, second = two_runs
    out = tmp_path / f"report.{fmt}"
    result = run_cli(coordinator_cli, "show", second, "--format", fmt, "--output", str(out))
    assert result.returncode == 0, result.stderr
    assert result.stdout == "" and f"wrote {out}" in result.stderr
    text = out.read_text()
    if fmt == "md":
        assert "| mac2:5555 | small/f16 | pp32 | 1 | 160.00 ± 0.50 |" in text
    elif fmt == "csv":
        rows = list(csv.DictReader(io.StringIO(text)))
        assert [(r["host"], r["test"], r["avg_ts"]) for r in rows] == [
            ("mac1:5555", "pp32", "150.0"),
            ("mac2:5555", "pp32", "160.0"),
            ("mac1:5555", "pp64", "50.0"),
            ("mac2:5555", "pp64", "40.0"),
        ]
    else:
        lines = [json.loads(line) for line in text.splitlines()]
        assert [(c["hostname"], c["n_prompt"], c["flags"]) for c in lines] == [
            ("mac1", 32, ""),
            ("mac2", 32, "fastest"),
            ("mac1", 64, "fastest"),
            ("mac2", 64, ""),
        ]


@pytest.mark.slow
def test_compare(coordinator_cli: str, two_runs: tuple[str, str]) -> None:
    first, second = two_runs
    result = run_cli(coordinator_cli, "compare", first, second, "--format", "json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert (data["a"], data["b"]) == (first, second)
    assert [(r["host"], r["test"], r["speedup"], r["note"]) for r in data["rows"]] == [
        ("mac1:5555", "pp32", 1.5, ""),
        ("mac1:5555", "pp64", 1.0, ""),
        ("mac2:5555", "pp32", 2.0, ""),
        ("mac2:5555", "pp64", None, "failed in A: boom on mac2:5555"),
    ]

    table = run_cli(coordinator_cli, "compare", first[:-1], second[:-1])
    assert table.returncode == 0, table.stderr
    assert f"A = {first}, B = {second}" in table.stdout
    rows = [line for line in table.stdout.splitlines() if "small/f16" in line]
    assert len(rows) == 4
    for row, expected in zip(rows, ("1.50x", "1.00x", "2.00x", "failed in A"), strict=True):
        assert expected in row, row

    md = run_cli(coordinator_cli, "compare", first, second, "--format", "md").stdout
    assert "| mac2:5555 | small/f16 | 1 | pp32 | 80.00 ± 0.50 | 160.00 ± 0.50 | 2.00x |  |" in md
    csv_text = run_cli(coordinator_cli, "compare", first, second, "--format", "csv").stdout
    assert csv_text.splitlines()[0] == "host,model,batch,test,avg_ts_a,avg_ts_b,speedup,note"
    by_test = run_cli(
        coordinator_cli, "compare", first, second, "--by", "model", "--format", "json"
    )
    assert [(r["test"], r["a"]["cells"]) for r in json.loads(by_test.stdout)["rows"]] == [
        ("pp32", 2),
        ("pp64", 1),
    ]


@pytest.mark.slow
def test_compare_takes_agent_bench_json_files(
    coordinator_cli: str, agent_cli: str, tmp_path: Path
) -> None:
    """Two `agent bench -o json` outputs, as llama.cpp's compare script takes JSON files."""
    files = []
    for name, prompt in (("a.json", "16,32"), ("b.json", "16")):
        result = subprocess.run(
            [agent_cli, "bench", "--config-small", "-p", prompt, "-n", "0", "-r", "1", "-w", "0"]
            + ["-o", "json", "--output", str(tmp_path / name)],
            capture_output=True,
            text=True,
            timeout=300,
            env=subprocess_env(),
        )
        assert result.returncode == 0, result.stderr
        files.append(str(tmp_path / name))
    compared = run_cli(coordinator_cli, "compare", *files, "--format", "json")
    assert compared.returncode == 0, compared.stderr
    data = json.loads(compared.stdout)
    assert (data["a"], data["b"]) == ("a.json", "b.json")
    assert [(r["test"], r["speedup"] is not None, r["note"]) for r in data["rows"]] == [
        ("pp16", True, ""),
        ("pp32", False, "only in A"),
    ]


@pytest.mark.parametrize(
    "args",
    [
        ["show", "r-nope"],
        ["compare", "r-nope", "r-"],
        ["runs", "--format", "md"],
        ["show", "r-", "--format", "xml"],
        ["compare", "r-1", "r-2", "--format", "jsonl"],
        ["compare", "r-1", "r-2", "--by", "speed"],
        ["compare", "/no/such/report.json", "r-"],
    ],
)
@pytest.mark.slow
def test_usage_errors_exit_2(
    coordinator_cli: str, two_runs: tuple[str, str], args: list[str]
) -> None:
    result = run_cli(coordinator_cli, *args)
    assert result.returncode == 2
    assert result.stdout == ""
    assert "error:" in result.stderr


def test_an_unknown_run_is_named(coordinator_cli: str, two_runs: tuple[str, str]) -> None:
    unknown = run_cli(coordinator_cli, "show", "r-nope")
    assert "unknown run 'r-nope'" in unknown.stderr


def test_an_ambiguous_run_id_is_named_with_every_run_it_matches(
    coordinator_cli: str, two_runs: tuple[str, str]
) -> None:
    ambiguous = run_cli(coordinator_cli, "compare", two_runs[0], "r-")
    assert ambiguous.returncode == 2
    assert "run id 'r-' is ambiguous" in ambiguous.stderr
    for run_id in two_runs:
        assert run_id in ambiguous.stderr


@pytest.mark.slow
def test_corrupt_store_is_reported(coordinator_cli: str, fleet_home: Path) -> None:
    fleet_home.mkdir(parents=True, exist_ok=True)
    (fleet_home / "coordinator.sqlite").write_bytes(b"garbage" * 200)
    result = run_cli(coordinator_cli, "runs")
    assert result.returncode == 2
    assert "not a usable mlx-fleet store" in result.stderr
