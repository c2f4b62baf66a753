"""`coordinator health` over a synthetic fleet written through the run store's own API: the
slow host out-of-family, a host on another macOS build drifted, one with a fresh kernel panic
panicked; each recorded as its condition, shown, and lifted by `coordinator uncordon`."""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

from coordinator.runs.store import RunStore
from shared.benchmark import health
from tests.fleet_support import cli
from tests.test_canary import CELLS, MACHINE, record


def test_health_names_the_slow_the_drifted_and_the_panicked_host(fleet_home: Path) -> None:
    rng = random.Random(43)
    names = [f"mac{i:02d}" for i in range(20)]
    with RunStore(fleet_home / "coordinator.sqlite") as store:
        run = store.create_run({"models": ["small"]}, names)
        for host in names:
            store.set_host_info(run, host, MACHINE, [], "ok", None)
            build = "24B83" if host == "mac05" else "24A335"
            factor = 0.8 if host == "mac07" else 1.0
            for index, (name, mode, prompt, gen) in enumerate(CELLS):
                speed = 100.0 * factor * rng.gauss(1.0, 0.02)
                cell = record(name, mode, prompt, gen, speed, build)
                if host == "mac11":
                    cell["panics"] = [{"file": "Kernel.panic", "time": time.time() - 3600,
                                       "panic_string": "panic(cpu 0): watchdog"}]  # fmt: skip
                store.add_cell(run, host, cell, index)
        store.finish_run(run, "ok")

    result = cli("coordinator", "health", "-o", "json")
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout)
    flagged = {h["host"] for h in found["hosts"] if h["flags"]}
    assert flagged == {"mac07"}
    held = {host: [c["name"] for c in items] for host, items in found["conditions"].items()}
    assert held == {"mac07": ["out-of-family"], "mac05": ["drift"], "mac11": ["panicked"]}
    assert "where 19 of its 20 siblings run macOS 24A335" in found["found"]["mac05"]["drift"]
    assert "watchdog" in found["found"]["mac11"]["panicked"]

    compared = cli("coordinator", "compare", found["run_id"], found["run_id"])
    assert compared.returncode == 0, compared.stderr
    assert "A: mac07 is out-of-family: 2" in compared.stderr
    assert "B: mac07 is out-of-family" in compared.stderr
    shown = json.loads(cli("coordinator", "show", found["run_id"], "-o", "json").stdout)
    slow = [c for c in shown["cells"] if c["host"] == "mac07"]
    assert all("out-of-family" in c["flags"] and c["relative_score"] < 0.9 for c in slow)

    table = cli("coordinator", "health")
    assert "mac07" in table.stdout and "[cordoned: out-of-family]" in table.stdout
    assert "[cordoned: drift]" in table.stdout
    lifted = cli("coordinator", "uncordon", "mac05")
    assert lifted.returncode == 0 and "lifted drift" in lifted.stderr
    left = json.loads(cli("coordinator", "health", "--no-record", "-o", "json").stdout)
    assert set(left["conditions"]) == {"mac07", "mac11"}


def test_drift_needs_a_majority_of_three_siblings() -> None:
    family = ("Apple M2 Max", 38, 64, "normal")
    seen = [
        health.Observation("r", "t", f"h{i}", family + (build, "0.29.1"), ("c",), 1.0)
        for i, build in enumerate(["24A335", "24A335", "24B83"])
    ]
    assert set(health.drifted(seen, "r")) == {"h2"}
    assert health.drifted(seen[:2] + [seen[2]][:0], "r") == {}
    split = seen[:1] + seen[2:] + [health.Observation("r", "t", "h3", family + ("25A1", "0.29.1"),
                                                      ("c",), 1.0)]  # fmt: skip
    assert health.drifted(split, "r") == {}  # three builds among three: no majority
