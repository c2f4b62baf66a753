"""The cooling policy on a group, as issue 17's gang rule has it: a pause on one member's Mac
holds every rank (they meet in each forward pass's all_sum), and the group's cell says so; a
stop on one stops the group. Real agents on loopback, one of them on a replayed hot curve
(labelled simulated wherever shown), the other with no sensor."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.fleet_support import AgentPool
from tests.group_support import insecure_benchmark as coordinator
from tests.group_support import rank_children, wait_for_no_rank

CELLS = ["--config-small", "-p", "32", "-n", "0", "-r", "2", "-w", "1", "--no-cool-start"]


@pytest.mark.slow
def test_a_pause_on_one_member_holds_the_group_and_marks_its_cell(
    agents: AgentPool, tmp_path: Path
) -> None:
    curve = tmp_path / "curve.csv"
    curve.write_text("0,90\n12,70\n")  # b is hot for its first 12 s: paused, then cool
    a = agents.start("a", insecure=True)
    b = agents.start(
        "b", insecure=True, thermal=f"replay:{curve}", options=["--poll-interval", "0.2"]
    )
    done = coordinator("--hosts", f"{a.address}+{b.address}", *CELLS, "-o", "json")
    assert done.returncode in (0, 1), done.stderr  # 1: the paused cell is not valid
    (cell,) = json.loads(done.stdout)["cells"]
    assert cell["status"] == "ok", cell.get("error")
    assert "paused" in cell["flags"] and "paused" in cell["verdict_reasons"]
    paused = {rank["host"]: rank["pause_s"] for rank in cell["ranks"]}
    assert paused[b.address] > 0 and paused[a.address] == 0  # a waited in the collective
    assert cell["thermal_source"].startswith(f"{b.address}: replay:")  # the hottest, named
    assert not rank_children({"a": a, "b": b})


@pytest.mark.slow
def test_a_stop_on_one_member_stops_the_group(agents: AgentPool, tmp_path: Path) -> None:
    curve = tmp_path / "curve.csv"
    curve.write_text("0,97\n")  # at the stop threshold (95 °C) throughout
    a = agents.start("a", insecure=True)
    b = agents.start(
        "b", insecure=True, thermal=f"replay:{curve}", options=["--poll-interval", "0.2"]
    )
    group = f"{a.address}+{b.address}"
    done = coordinator("--hosts", group, *CELLS, "-o", "json")
    assert done.returncode == 1, done.stderr
    report = json.loads(done.stdout)
    host = report["hosts"][0]
    assert host["status"] == "failed" and host["error"].startswith(f"{b.address}: "), host
    assert "stop threshold" in host["error"]
    (cell,) = report["cells"]
    assert cell["status"] == "failed" and cell["error"].startswith(f"rank 1 ({b.address}): ")
    wait_for_no_rank({"a": a, "b": b}, within=60)
