"""A group's run outlives its coordinator as a host's does: `coordinator resume` follows every
member's rank job from the first cell the group lacks and merges the rest, none twice;
`coordinator cancel` reaches every member's rank. Real agents on loopback, the real console
scripts, the coordinator SIGKILLed while the group measures."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.conftest import console_script, subprocess_env
from tests.fleet_support import LONG, AgentPool, AgentProcess
from tests.group_support import group_cells, rank_children, ring_port, wait_for_no_rank

pytestmark = pytest.mark.timeout(300)
WAIT_S = 120.0


LONGEST = ["--config-small", "-p", "16,32,48,64", "-n", "8", "-d", "0,32,64", "-r", "10", "-w", "1"]
"""Fifteen cells of ten repetitions: still running when `coordinator cancel` comes."""


def killed_mid_group(
    agents: AgentPool, home: Path, matrix: list[str] = LONG
) -> tuple[str, dict[str, AgentProcess]]:
    """A group run whose coordinator was SIGKILLed once the group had a cell: its run id."""
    started = {name: agents.start(name, insecure=True) for name in ("a", "b")}
    group = "+".join(agent.address for agent in started.values())
    running = subprocess.Popen(
        [
            console_script("coordinator"),
            "benchmark",
            "--insecure",
            *ring_port(),
            "--hosts",
            group,
            *matrix,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=subprocess_env(),
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + WAIT_S
        while group_cells(home, group) < 1:
            assert running.poll() is None, "the coordinator ended before the group measured"
            assert time.monotonic() < deadline, "the group measured no cell in time"
            time.sleep(0.1)
    finally:
        running.send_signal(signal.SIGKILL)
        running.wait(timeout=30)
    listed = coordinator("runs", "-o", "json")
    return json.loads(listed.stdout)[0]["id"], started


def coordinator(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [console_script("coordinator"), *args],
        capture_output=True,
        text=True,
        timeout=WAIT_S,
        env=subprocess_env(COLUMNS="200"),
    )


@pytest.mark.slow
def test_resume_finishes_a_group_whose_coordinator_was_killed(
    agents: AgentPool, fleet_home: Path
) -> None:
    run, started = killed_mid_group(agents, fleet_home)
    resumed = coordinator("resume", run, "--insecure", "-o", "json")
    assert resumed.returncode == 0, resumed.stderr
    report = json.loads(resumed.stdout)
    cells = report["cells"]
    assert len(cells) == 8 and all(c["status"] == "ok" for c in cells), cells
    assert max(Counter(c["name"] for c in cells).values()) == 1  # none twice
    assert all(len(c["ranks"]) == 2 for c in cells)  # each merged from both ranks
    assert not rank_children(started)


@pytest.mark.slow
def test_cancel_reaches_every_rank_of_a_group(agents: AgentPool, fleet_home: Path) -> None:
    run, started = killed_mid_group(agents, fleet_home, LONGEST)
    cancelled = coordinator("cancel", run, "--insecure", "-o", "json")
    assert cancelled.returncode == 0, cancelled.stderr
    rows = json.loads(cancelled.stdout)
    group = "+".join(agent.address for agent in started.values())
    assert [row["host"] for row in rows] == [
        f"{agent.address} (rank {rank} of {group})" for rank, agent in enumerate(started.values())
    ]
    assert {row["result"] for row in rows} <= {"cancelled", "not running"}
    assert "cancelled" in {row["result"] for row in rows}
    wait_for_no_rank(started, within=60)
