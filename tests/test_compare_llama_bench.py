"""llama.cpp's own scripts/compare-llama-bench.py, unchanged, reads our runs and prints every cell.

The script is taken at test time from the llama-cpp-python source package on PyPI, which
vendors llama.cpp (`pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36`): only
the script and llama.cpp's LICENSE (MIT) are kept, in pytest's cache (.pytest_cache/d/), so the
76 MB download and its metadata build (~45 s) happen once per checkout. Where the package
cannot be had (no registry), the tests skip, saying so. The script needs GitPython and tabulate
(its requirements/requirements-compare-llama-bench.txt): the dev extra installs them.
"""

from __future__ import annotations

import fcntl
import json
import re
import shutil
import sqlite3
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import subprocess_env

PACKAGE = "llama-cpp-python==0.3.36"
INSIDE = "vendor/llama.cpp/"
SMALL = ["--config-small", "-p", "16", "-n", "4", "-d", "0,8", "-r", "2", "-w", "0"]
TESTS = ["pp16", "tg4", "pp16@d8", "tg4@d8"]


@pytest.fixture(scope="session")
def compare_script(pytestconfig: pytest.Config) -> Path:
    """compare-llama-bench.py from the source package, fetched once into pytest's cache (a lock
    keeps parallel workers from fetching it twice)."""
    cache = pytestconfig.cache
    assert cache is not None
    folder = cache.mkdir("llama-cpp-python-0.3.36")
    script = folder / "compare-llama-bench.py"
    with open(folder / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not script.exists():
            fetch_script(folder)
    return script


def fetch_script(folder: Path) -> None:
    download = folder / "download"
    shutil.rmtree(download, ignore_errors=True)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:"]
            + ["-d", str(download), PACKAGE],
            capture_output=True,
            text=True,
            timeout=600,
        )
    except subprocess.TimeoutExpired:
        pytest.skip(f"llama.cpp's compare script cannot be had: pip download {PACKAGE} hung")
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        pytest.skip(f"llama.cpp's compare script cannot be had: pip download {PACKAGE}: {last}")
    (sdist,) = download.glob("*.tar.gz")
    with tarfile.open(sdist) as archive:
        top = archive.getnames()[0].split("/")[0]
        for name, kept in (("scripts/compare-llama-bench.py", "compare-llama-bench.py"),
                           ("LICENSE", "LICENSE-llama.cpp")):  # fmt: skip
            member = archive.extractfile(f"{top}/{INSIDE}{name}")
            assert member is not None
            (folder / f"{kept}.part").write_bytes(member.read())
            (folder / f"{kept}.part").rename(folder / kept)
    shutil.rmtree(download)


def compare(script: Path, cwd: Path, inputs: list[Path], baseline: str, other: str) -> str:
    """The script's table, run as a llama.cpp user runs it (outside a git repository, so -b/-c
    name builds as they are). A file other than SQLite needs `-t llama-bench`: this version of
    the script guesses the tool from a database's tables only (`assert False` otherwise)."""
    tool = [] if not inputs or inputs[0].suffix == ".sqlite" else ["-t", "llama-bench"]
    argv = [sys.executable, str(script), *tool, "-b", baseline, "-c", other]
    for path in inputs:
        argv += ["-i", str(path)]
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def table_rows(text: str) -> dict[str, list[str]]:
    """The table's rows by test: {test: [cells...]} (the Test column found by its header)."""
    lines = [line for line in text.splitlines() if line.startswith("|")]
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    at = header.index("Test")
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[2:]]
    return {row[at]: row for row in rows}


def bench(agent_cli: str, fmt: str, label: str, *more: str) -> str:
    done = subprocess.run(
        [agent_cli, "bench", *SMALL, "-o", fmt, "--label", label, *more],
        capture_output=True,
        text=True,
        timeout=300,
        env=subprocess_env(COLUMNS="200"),
    )
    assert done.returncode in (0, 1), done.stderr  # 1: a noisy cell on a busy machine is fine
    return done.stdout


def coordinator(coordinator_cli: str, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [coordinator_cli, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env=subprocess_env(COLUMNS="200"),
    )


def into_sqlite(database: Path, script: str) -> None:
    """`... -o sql | sqlite3 FILE`, with the sqlite3 CLI where it is installed."""
    if shutil.which("sqlite3"):
        piped = subprocess.run(["sqlite3", str(database)], input=script, text=True)
        assert piped.returncode == 0
    else:
        with sqlite3.connect(database) as db:
            db.executescript(script)


def expected_speedups(database: Path, baseline: str, other: str) -> dict[str, float]:
    """Each test's mean tok/s under `other` over `baseline`, from our own table."""
    with sqlite3.connect(database) as db:
        rows = db.execute(
            "SELECT build_commit, n_prompt, n_gen, n_depth, AVG(avg_ts) FROM llama_bench "
            "GROUP BY build_commit, n_prompt, n_gen, n_depth"
        ).fetchall()
    means: dict[tuple[str, str], float] = {}
    for build, n_prompt, n_gen, n_depth, mean in rows:
        test = f"pp{n_prompt}" if n_prompt else f"tg{n_gen}"
        means[(build, test + (f"@d{n_depth}" if n_depth else ""))] = mean
    return {test: means[(other, test)] / means[(baseline, test)] for test in TESTS}


def check_table(text: str, speedups: dict[str, float] | None = None) -> dict[str, Any]:
    rows = table_rows(text)
    assert sorted(rows) == sorted(TESTS), text
    for test, row in rows.items():
        assert "small/f16" in row and float(row[-1]) > 0, text
        if speedups is not None:
            assert float(row[-1]) == pytest.approx(speedups[test], abs=0.006), (test, text)
    return rows


@pytest.mark.slow
def test_two_agent_bench_sql_runs_with_two_labels(
    agent_cli: str, compare_script: Path, tmp_path: Path
) -> None:
    """The issue's steps: two `agent bench -o sql | sqlite3 llama-bench.sqlite` runs, then the
    script with -b/-c naming the two labels."""
    database = tmp_path / "llama-bench.sqlite"
    for label in ("mlx-base", "mlx-next"):
        into_sqlite(database, bench(agent_cli, "sql", label))
    text = compare(compare_script, tmp_path, [database], "mlx-base", "mlx-next")
    assert re.search(r"t/s mlx-base \|\s+t/s mlx-next \|\s+Speedup", text), text
    check_table(text, expected_speedups(database, "mlx-base", "mlx-next"))


@pytest.mark.slow
def test_jsonl_csv_and_llama_json_inputs(
    agent_cli: str, compare_script: Path, tmp_path: Path
) -> None:
    """One jsonl file of two runs; two csv files; two llama-json files (llama-bench's array)."""
    runs = {label: {} for label in ("run-a", "run-b")}
    for label, outputs in runs.items():
        for fmt in ("jsonl", "csv", "llama-json"):
            outputs[fmt] = bench(agent_cli, fmt, label)
    jsonl = tmp_path / "both.jsonl"
    jsonl.write_text(runs["run-a"]["jsonl"] + runs["run-b"]["jsonl"])
    check_table(compare(compare_script, tmp_path, [jsonl], "run-a", "run-b"))
    for fmt, suffix in (("csv", "csv"), ("llama-json", "json")):
        files = []
        for label, outputs in runs.items():
            files.append(tmp_path / f"{label}.{suffix}")
            files[-1].write_text(outputs[fmt])
        check_table(compare(compare_script, tmp_path, files, "run-a", "run-b"))


@pytest.mark.slow
def test_two_stored_fleet_runs_exported_into_one_database(
    coordinator_cli: str, compare_script: Path, tmp_path: Path, fleet_home: Path
) -> None:
    """Two `coordinator benchmark` runs (each on the agent it starts), exported into
    llama-bench.sqlite under two labels; the script, given no -i, finds that file itself."""
    run_ids = []
    for _ in range(2):
        done = coordinator(coordinator_cli, tmp_path, "benchmark", *SMALL, "-o", "json")
        assert done.returncode in (0, 1), done.stderr
        run_ids.append(json.loads(done.stdout)["run_id"])
    labels = ["--label", "before", "--label", "after-"]
    done = coordinator(coordinator_cli, tmp_path, "export", *run_ids, *labels)
    assert done.returncode == 0, done.stderr
    database = tmp_path / "llama-bench.sqlite"
    assert "added 2 runs to llama-bench.sqlite (labels: after-, before)" in done.stderr
    text = compare(compare_script, tmp_path, [], "before", "after-")
    check_table(text, expected_speedups(database, "before", "after-"))
    with sqlite3.connect(database) as db:
        kept = db.execute("SELECT COUNT(*), COUNT(llama_bench_rowid) FROM mlx_fleet_bench")
        assert kept.fetchone() == (8, 8)

    jsonl = coordinator(coordinator_cli, tmp_path, "export", *run_ids, *labels, "-o", "jsonl")
    assert jsonl.returncode == 0, jsonl.stderr
    (tmp_path / "runs.jsonl").write_text(jsonl.stdout)
    text = compare(compare_script, tmp_path, [tmp_path / "runs.jsonl"], "before", "after-")
    check_table(text, expected_speedups(database, "before", "after-"))

    refused = coordinator(coordinator_cli, tmp_path, "export", run_ids[0], "--label", "b4")
    assert refused.returncode == 2 and refused.stderr.startswith(
        "error: labels 'b4' (2 characters) and 'before' (6) differ in length: "
        "compare-llama-bench.py cuts every build_commit to the shortest"
    ), refused.stderr
    unknown = coordinator(coordinator_cli, tmp_path, "export", "r-1999")
    assert unknown.returncode == 2
    assert unknown.stderr.strip() == "error: unknown run 'r-1999'; `coordinator runs` lists them"
