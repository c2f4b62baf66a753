"""Distributed benchmark cells across network namespaces (docs/distributed.md): three "Macs"
(tests.netns_support: each its own namespace and address, a bridge between them), the
coordinator in the hub, `--hosts A,B,A+B`: the group's cells run as ranks of MLX's ring that
the agents start, beside each host alone in one table. Then a rank's agent killed, or its
cable pulled, mid-cell: the cell fails with the reason, the single hosts' cells are whole, and
no rank's process is left on any host.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import console_script, subprocess_env
from tests.fleet_support import AgentPool, AgentProcess, exchange_keys
from tests.group_support import group_cells, rank_children, wait_for_no_rank
from tests.netns_support import Lab, lab

pytestmark = [pytest.mark.timeout(600), pytest.mark.xdist_group("netns")]
"""One xdist worker runs the netns tests one after another (`--dist loadgroup`): they share the
machine's namespace table and its /run/netns mount, and time links on a busy machine."""

MATRIX = ["--config-small", "-p", "32,64", "-n", "8", "-r", "2", "-w", "1"]
LONGER = ["--config-small", "-p", "16,32,48,64", "-n", "8", "-d", "0,32", "-r", "4", "-w", "1"]
"""Ten cells: the group is still measuring when a test pulls one of its members."""
WAIT_S = 240.0


@pytest.fixture
def hosts(agents: AgentPool) -> Iterator[tuple[Lab, dict[str, AgentProcess]]]:
    with lab(["a", "b", "c"]) as made:
        started = {}
        for host in "abc":
            agent = agents.start(host, netns=made.namespaces[host], bind_host=made.addresses[host])
            exchange_keys(agent)
            started[host] = agent
        yield made, started


def benchmark(made: Lab, *args: str) -> list[str]:
    return [console_script("coordinator"), "benchmark", *args]


def report_of(made: Lab, stderr: str) -> dict:
    run = re.search(r"run (r-\S+) stored", stderr)
    assert run, stderr
    shown = made.run(
        [console_script("coordinator"), "show", run.group(1), "-o", "json"],
        capture_output=True,
        text=True,
        timeout=60,
        env=subprocess_env(),
    )
    return json.loads(shown.stdout)


@pytest.mark.slow
def test_a_group_runs_beside_its_members_in_one_table(
    hosts: tuple[Lab, dict[str, AgentProcess]],
) -> None:
    made, started = hosts
    a, b = started["a"].address, started["b"].address
    done = made.run(
        benchmark(made, "--hosts", f"{a},{b},{a}+{b}", *MATRIX),
        capture_output=True,
        text=True,
        timeout=WAIT_S,
        env=subprocess_env(COLUMNS="200"),
    )
    assert done.returncode == 0, done.stderr
    table = done.stdout
    assert f"{a}+{b} (2 ranks, tensor, ring)" in table
    assert sum(f"│ {a} " in line for line in table.splitlines()) == 3  # its pp32, pp64, tg8
    report = report_of(made, done.stderr)
    cells = {(c["host"], c["name"]): c for c in report["cells"]}
    names = sorted({name for _, name in cells})
    assert len(names) == 3
    for name in names:
        alone, group = cells[(a, name)], cells[(f"{a}+{b}", name)]
        assert alone["status"] == group["status"] == "ok", group.get("error")
        assert (
            group["greedy_tokens"] == alone["greedy_tokens"]
            and len(alone["greedy_tokens"]) == 16 + 8
        )
        assert group["tokens_check"] == f"same as {a}"
        assert group["group"] == {
            "members": [a, b],
            "ranks": 2,
            "backend": "ring",
            "sharding": "tensor",
        }
        assert [rank["host"] for rank in group["ranks"]] == [a, b]
        for rank in group["ranks"]:
            assert rank["peak_memory_gb"] > 0 and rank["active_memory_gb"] > 0
            assert 0 < rank["weight_memory_bytes"] < 0.8 * 1e9 * alone["peak_memory_gb"]
        assert group["speedup"] > 0 and group["speedup_over"] in (a, b)
    split = next(h for h in report["hosts"] if h["host"] == f"{a}+{b}")["models"][0]
    whole = next(h for h in report["hosts"] if h["host"] == a)["models"][0]
    assert [share["host"] for share in split["ranks"]] == [a, b]
    assert all(share["param_count"] < whole["param_count"] for share in split["ranks"])
    assert not rank_children(started)


def pulled_mid_group(
    made: Lab, started: dict[str, AgentProcess], home: Path, pull: str
) -> tuple[subprocess.CompletedProcess[str], dict]:
    """Run A,B,A+B over LONGER; once the group has a cell, `pull` B ("kill": SIGKILL its agent
    alone; "cut": its cable); the coordinator's outcome and report."""
    a, b = started["a"].address, started["b"].address
    running = made.popen(
        benchmark(made, "--hosts", f"{a},{b},{a}+{b}", *LONGER, "--host-timeout", "10"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=subprocess_env(COLUMNS="200"),
    )
    try:
        deadline = time.monotonic() + WAIT_S
        while group_cells(home, f"{a}+{b}") < 1:
            assert running.poll() is None, running.communicate()
            assert time.monotonic() < deadline, "the group measured no cell in time"
            time.sleep(0.2)
        if pull == "kill":
            started["b"].process.send_signal(signal.SIGKILL)  # the agent alone: its rank dies too
        else:
            made.cut("b")
        out, err = running.communicate(timeout=WAIT_S)
    finally:
        running.kill()
    return subprocess.CompletedProcess(running.args, running.returncode, out, err), report_of(
        made, err
    )


def check_failed_group(done: subprocess.CompletedProcess[str], report: dict, b: str) -> None:
    assert done.returncode == 1, done.stderr
    group = next(h for h in report["hosts"] if "+" in h["host"])
    assert group["status"] == "failed" and group["error"].startswith(f"{b}: "), group["error"]
    failed = [c for c in report["cells"] if c["host"] == group["host"] and c["status"] == "failed"]
    assert failed and failed[0]["error"].startswith(f"rank 1 ({b}): "), failed[0]["error"]
    singles = [c for c in report["cells"] if "+" not in c["host"]]
    assert len(singles) == 2 * 10 and all(c["status"] == "ok" for c in singles)


@pytest.mark.slow
def test_a_killed_rank_agent_fails_the_cell_and_leaves_no_rank(
    hosts: tuple[Lab, dict[str, AgentProcess]], fleet_home: Path
) -> None:
    made, started = hosts
    done, report = pulled_mid_group(made, started, fleet_home, "kill")
    check_failed_group(done, report, started["b"].address)
    wait_for_no_rank(started, within=60)


@pytest.mark.slow
def test_a_cut_cable_fails_the_cell_in_the_host_timeout_and_leaves_no_rank(
    hosts: tuple[Lab, dict[str, AgentProcess]], fleet_home: Path
) -> None:
    made, started = hosts
    began = time.monotonic()
    done, report = pulled_mid_group(made, started, fleet_home, "cut")
    check_failed_group(done, report, started["b"].address)
    assert "unreachable" in report["hosts"][-1]["error"]
    assert time.monotonic() - began < WAIT_S
    # B's agent, cut off from everyone, ends B's rank once it has written nothing and nobody
    # has asked anything for the stall limit (2 x --host-timeout, at least 60 s); A's was
    # cancelled by its agent at the coordinator's word.
    wait_for_no_rank(started, within=150)
    assert "no request from a coordinator" in started["b"].log_text()
