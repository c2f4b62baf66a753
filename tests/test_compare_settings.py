"""`coordinator compare` and settings: pairs whose settings differ are refused (exit 2) unless
--ignore-settings; a speed-up within the noise is marked `~` (docs/protocol.md §5)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from coordinator.reports.compare import compare_reports, parse_by
from coordinator.runs.store import RunStore
from shared.exit_codes import EXIT_USAGE
from tests.conftest import subprocess_env
from tests.test_store import MACHINE, ok_cell


def run_cli(cli: str, *args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [cli, *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=subprocess_env(COLUMNS="200", **env),
    )


def bench(agent_cli: str, output: Path, **env: str) -> Path:
    result = run_cli(
        agent_cli,
        *("bench", "--config-small", "-p", "16", "-n", "0", "-r", "1", "-w", "0"),
        *("-o", "json", "--output", str(output)),
        **env,
    )
    assert result.returncode == 0, result.stderr
    return output


@pytest.mark.slow
def test_a_low_power_run_is_refused_unless_settings_are_ignored(
    agent_cli: str, coordinator_cli: str, tmp_path: Path
) -> None:
    normal = bench(agent_cli, tmp_path / "normal.json")
    low = bench(agent_cli, tmp_path / "low.json", MLX_FLEET_INJECT="low-power")
    assert json.loads(low.read_text())["cells"][0]["injected"] == ["low-power"]

    refused = run_cli(coordinator_cli, "compare", str(normal), str(low))
    assert refused.returncode == EXIT_USAGE, refused.stdout
    assert "power_mode" in refused.stderr and "low" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr

    ignored = run_cli(
        coordinator_cli, "compare", str(normal), str(low), "--ignore-settings", "--format", "json"
    )
    assert ignored.returncode == 0, ignored.stderr
    rows = json.loads(ignored.stdout)["rows"]
    assert rows and all("power_mode" in row["settings_differ"] for row in rows)
    assert all("settings differ: power_mode" in row["note"] for row in rows)

    same = run_cli(coordinator_cli, "compare", str(normal), str(normal), "--format", "json")
    assert same.returncode == 0, same.stderr
    assert all(row["settings_differ"] == {} for row in json.loads(same.stdout)["rows"])


@pytest.mark.slow
def test_by_a_setting(agent_cli: str, coordinator_cli: str, tmp_path: Path) -> None:
    normal = bench(agent_cli, tmp_path / "normal.json")
    low = bench(agent_cli, tmp_path / "low.json", MLX_FLEET_INJECT="low-power")
    result = run_cli(
        coordinator_cli,
        *("compare", str(normal), str(low), "--by", "power_mode"),
        *("--ignore-settings", "--format", "json"),
    )
    assert result.returncode == 0, result.stderr
    assert [(row["power_mode"], row["note"]) for row in json.loads(result.stdout)["rows"]] == [
        ("unknown", "only in A"),
        ("low", "only in B"),
    ]
    assert parse_by("power_mode,model") == ["power_mode", "model"]


SETTINGS = {"os_build": "23C71", "mlx_version": "0.30.0", "power_mode": "normal"}


def store_run(store: RunStore, speeds: dict[int, tuple[float, float]], **settings: Any) -> str:
    """A one-host run whose cells have (tok/s, 95 % half-width) and settings."""
    run_id = store.create_run({"n_prompt": list(speeds)}, ["mac1:5555"])
    store.set_host_info(run_id, "mac1:5555", {**MACHINE, "hostname": "mac1"}, [], "ok", None)
    for seq_len, (speed, half) in speeds.items():
        cell = ok_cell(seq_len, speed)
        cell.update(ci95_tokens_per_sec=half, settings={**SETTINGS, **settings})
        store.add_cell(run_id, "mac1:5555", cell)
    store.finish_run(run_id, "ok")
    return run_id


@pytest.mark.slow
def test_speedups_within_the_noise_are_marked(coordinator_cli: str, fleet_home: Path) -> None:
    with RunStore() as store:
        first = store_run(store, {32: (100.0, 3.0), 64: (50.0, 1.0)})
        again = store_run(store, {32: (102.0, 3.0), 64: (49.5, 1.0)})
        faster = store_run(store, {32: (150.0, 3.0), 64: (50.2, 1.0)})
        a, b = store.load_report(first), store.load_report(again)
    for row in compare_reports(a, b):
        assert row["within_noise"] is True, row

    same = run_cli(coordinator_cli, "compare", first, again, "--format", "json")
    assert same.returncode == 0, same.stderr
    assert [r["within_noise"] for r in json.loads(same.stdout)["rows"]] == [True, True]
    table = run_cli(coordinator_cli, "compare", first, again)
    rows = [line for line in table.stdout.splitlines() if "pp32" in line or "pp64" in line]
    assert len(rows) == 2 and all("~" in row for row in rows), table.stdout
    assert "~1.02x" in rows[0]

    md = run_cli(coordinator_cli, "compare", first, faster, "--format", "md").stdout
    assert "| 1.50x |" in md and "~1.00x" in md


def test_records_without_settings_do_not_refuse_each_other(tmp_path: Path) -> None:
    with RunStore(tmp_path / "runs.sqlite") as store:
        plain: list[dict[str, Any]] = []
        for _ in range(2):
            run_id = store.create_run({"n_prompt": [32]}, ["mac1:5555"])
            store.set_host_info(run_id, "mac1:5555", MACHINE, [], "ok", None)
            store.add_cell(run_id, "mac1:5555", ok_cell(32, 100.0))
            store.finish_run(run_id, "ok")
            plain.append(store.load_report(run_id))
        with_settings = store.load_report(store_run(store, {32: (100.0, 1.0)}))
    assert [row["settings_differ"] for row in compare_reports(*plain)] == [{}]
    assert [row["settings_differ"] for row in compare_reports(plain[0], with_settings)] == [{}]
    # Both sides are ok_cell's 100 ± 1 tok/s: the intervals overlap.
    assert [row["within_noise"] for row in compare_reports(*plain)] == [True]
