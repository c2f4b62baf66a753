"""What the group tests share: the rank processes an agent left, the coordinator's stored cells
of a group, and `coordinator benchmark` against insecure agents, each run on ring ports of its own.

Every member of a loopback group listens on 127.0.0.1, so two group tests on the default
starting port (mlx.launch's 32323) would join each other's rings when xdist runs them side by
side: each run takes a free run of ports (`--port`) instead."""

from __future__ import annotations

import sqlite3
import subprocess
import time
from pathlib import Path

import psutil

from tests.conftest import console_script, subprocess_env
from tests.fleet_support import AgentProcess
from tests.ring_support import free_port_run

JOB_CHILD = "agent.daemon.benchmark.child"
RING_PORTS = 8
"""Ports a test's group run takes: one per member and address, for the largest test group."""


def ring_port() -> list[str]:
    """`--port` at the first of RING_PORTS loopback ports free now."""
    return ["--port", str(free_port_run(RING_PORTS))]


def rank_children(agents: dict[str, AgentProcess]) -> list[psutil.Process]:
    """The benchmark job processes (ranks) any of the agents started, still alive."""
    parents = {str(agent.process.pid) for agent in agents.values()}
    found = []
    for process in psutil.process_iter(["cmdline"]):
        argv = process.info["cmdline"] or []
        if JOB_CHILD not in argv or "--parent" not in argv:
            continue
        try:
            alive = process.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:  # it ended between the listing and the look
            continue
        if argv[argv.index("--parent") + 1] in parents and alive:
            found.append(process)
    return found


def wait_for_no_rank(agents: dict[str, AgentProcess], within: float) -> None:
    deadline = time.monotonic() + within
    while rank_children(agents):
        assert time.monotonic() < deadline, f"rank processes left: {rank_children(agents)}"
        time.sleep(0.5)


def group_cells(home: Path, group: str) -> int:
    """The cells of `group` the coordinator has stored so far; 0 while its store is being made
    (no file yet, or no table: the coordinator creates them as it starts)."""
    store = home / "coordinator.sqlite"
    if not store.exists():
        return 0
    try:
        with sqlite3.connect(store) as db:
            query = "SELECT count(*) FROM cells WHERE host = ?"
            return db.execute(query, (group,)).fetchone()[0]
    except sqlite3.OperationalError:  # no such table yet, or the schema being written
        return 0


def insecure_benchmark(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [console_script("coordinator"), "benchmark", "--insecure", *ring_port(), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=subprocess_env(COLUMNS="200"),
    )
