"""`coordinator canary` over stored runs (shared/benchmark/canary.py): two synthetic runs
written through the run store's own API, the second 10 % slower after a macOS update; the
interval excludes 0 and contains -10 %. Bad splits are one line, exit 2."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from coordinator.runs.store import RunStore
from shared.benchmark.canary import CanaryError, canary, version_order
from tests.fleet_support import AgentPool, cli, exchange_keys

MACHINE = {"chip": "Apple M2 Max", "gpu_cores": 38, "memory_gb": 64, "backend": "gpu"}
CELLS = (("pp512", "prefill", 512, 0), ("tg128", "decode", 0, 128))


def record(name: str, mode: str, prompt: int, gen: int, speed: float, build: str) -> dict:
    return {
        "model": "small", "bits": 16, "n_prompt": prompt, "n_gen": gen, "n_depth": 0,
        "batch_size": 1, "mode": mode, "test": name, "name": f"small/{name}", "status": "ok",
        "error": None, "tokens_per_sec": speed, "std_tokens_per_sec": speed * 0.01,
        "ci95_tokens_per_sec": speed * 0.01, "warmup_iterations": 1, "rewarm_iterations": 0,
        "flags": [], "pause_s": 0.0,
        "settings": {"os_build": build, "mlx_version": "0.29.1", "power_mode": "normal"},
    }  # fmt: skip


def stored_run(store: RunStore, hosts: int, build: str, factor: float, seed: int) -> str:
    rng = random.Random(seed)
    names = [f"mac{seed}-{i}" for i in range(hosts)]
    run = store.create_run({"models": ["small"]}, names)
    for host in names:
        store.set_host_info(run, host, MACHINE, [], "ok", None)
        for index, (name, mode, prompt, gen) in enumerate(CELLS):
            speed = (1000.0 if mode == "prefill" else 50.0) * factor * rng.gauss(1.0, 0.02)
            store.add_cell(run, host, record(name, mode, prompt, gen, speed, build), index)
    store.finish_run(run, "ok")
    return run


@pytest.fixture
def runs(fleet_home: Path) -> tuple[str, str]:
    with RunStore(fleet_home / "coordinator.sqlite") as store:
        return (
            stored_run(store, 8, "24A335", 1.0, seed=1),
            stored_run(store, 8, "24B83", 0.9, seed=2),
        )


def test_a_known_ten_percent_loss_after_a_macos_update_is_found_with_its_interval(
    runs: tuple[str, str],
) -> None:
    result = cli(
        "coordinator", "canary", "--runs", ",".join(runs), "--split", "macos", "-o", "json"
    )
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout)
    assert (found["before"], found["after"]) == ("24A335", "24B83")
    low, high = found["ci95"]
    assert low < -0.10 < high < 0  # contains -10 %, excludes 0
    assert found["delta"] == pytest.approx(-0.10, abs=0.01)
    assert found["hosts"] == {"before": 8, "after": 8} and len(found["cells"]) == 2
    table = cli("coordinator", "canary", "--runs", ",".join(runs), "--split", "macos")
    assert "24A335 → 24B83" in table.stdout and "-10." in table.stdout


def test_a_split_that_leaves_one_side_empty_or_is_unknown_is_one_line_exit_2(
    runs: tuple[str, str],
) -> None:
    one_side = cli("coordinator", "canary", "--runs", ",".join(runs), "--split", "mlx")
    assert one_side.returncode == 2
    assert "needs exactly two sides among valid cells; found 0.29.1" in one_side.stderr
    nonsense = cli("coordinator", "canary", "--runs", runs[0], "--split", "nonsense")
    assert nonsense.returncode == 2 and "--split 'nonsense'" in nonsense.stderr
    unknown = cli("coordinator", "canary", "--runs", "r-nowhere", "--split", "macos")
    assert unknown.returncode == 2 and "unknown run" in unknown.stderr


def test_no_change_has_an_interval_around_zero_and_one_host_a_side_has_none() -> None:
    rng = random.Random(3)
    same = [
        {**record("tg128", "decode", 0, 128, 50 * rng.gauss(1, 0.02), build), "host": f"h{i}"}
        for i in range(12)
        for build in (("24A335",) if i < 6 else ("24B83",))
    ]
    found = canary(same, "macos")
    assert found.low is not None and found.low < 0 < found.high
    lonely = canary(same[:1] + same[6:7], "macos")
    assert lonely.low is None and lonely.hosts == (1, 1)
    with pytest.raises(CanaryError, match="--before"):
        canary(same, "macos", before="23A1")
    assert canary(same, "macos", before="24B83").after == "24A335"
    assert version_order("0.29.10") > version_order("0.29.9")


@pytest.mark.slow
def test_a_live_canary_runs_the_pinned_cell_and_refuses_a_split_with_one_side(
    agents: AgentPool,
) -> None:
    """Two agents on one machine run one macOS build: the pinned cell runs and is stored, and
    the split leaves one side: one line, exit 2."""
    pair = [agents.start("mac1"), agents.start("mac2")]
    for agent in pair:
        exchange_keys(agent)
    names = ",".join(agent.address for agent in pair)
    result = cli("coordinator", "canary", "--hosts", names, "--split", "macos", timeout=240)
    assert result.returncode == 2
    assert "--split macos needs exactly two sides among valid cells" in result.stderr
    (stored,) = json.loads(cli("coordinator", "runs", "-o", "json").stdout)
    assert stored["hosts"] == [agent.address for agent in pair] and stored["ok"] == 2
    assert cli("coordinator", "canary", "--split", "macos").returncode == 2
