"""The fleet benchmark across two network namespaces, "mac1" and "mac2", joined by a veth pair.

The /30 below exists only inside the namespaces this test creates: mac1 is .1, mac2 is .2. The
agents run inside them with `ip netns exec`; the coordinator runs in mac1 and reaches mac2's
agent over the veth. Needs root and `ip`; skipped with the reason where namespaces cannot be made.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator

import pytest

from tests.conftest import console_script, piped, subprocess_env
from tests.fleet_support import LONG, QUICK, AgentPool, exchange_keys
from tests.netns_support import in_ns, ip, wired_namespaces

pytestmark = [pytest.mark.timeout(240), pytest.mark.xdist_group("netns")]
"""One xdist worker runs the netns tests one after another (`--dist loadgroup`): they share the
machine's namespace table and its /run/netns mount, and time links on a busy machine."""

SUBNET = "10.254.73.{}/30"
ADDRESSES = {"mac1": "10.254.73.1", "mac2": "10.254.73.2"}
VETHS = {"mac1": f"mf{os.getpid()}a", "mac2": f"mf{os.getpid()}b"}


@pytest.fixture
def namespaces() -> Iterator[dict[str, str]]:
    """{"mac1": namespace name, "mac2": ...}, wired and up; deleted afterwards."""
    tag = f"mlxf{os.getpid()}"
    names = {role: f"{tag}-{role}" for role in ADDRESSES}
    veths = VETHS
    steps = [
        ("link", "add", veths["mac1"], "netns", names["mac1"], "type", "veth", "peer", "name",
         veths["mac2"], "netns", names["mac2"])
    ]  # fmt: skip
    for index, role in enumerate(ADDRESSES, start=1):
        ns = ("-n", names[role])
        steps += [
            (*ns, "addr", "add", SUBNET.format(index), "dev", veths[role]),
            (*ns, "link", "set", veths[role], "up"),
            (*ns, "link", "set", "lo", "up"),
        ]
    with wired_namespaces(names.values(), steps):
        yield names


def in_mac1(namespaces: dict[str, str], *args: str) -> list[str]:
    """`coordinator ARGS --format json` in mac1's namespace, where the coordinator runs."""
    return in_ns(namespaces["mac1"], console_script("coordinator"), *args, "--format", "json")


@pytest.mark.slow
def test_benchmark_across_two_namespaces(namespaces: dict[str, str], agents: AgentPool) -> None:
    started = {
        role: agents.start(role, netns=namespaces[role], bind_host=ADDRESSES[role])
        for role in ADDRESSES
    }
    for agent in started.values():
        exchange_keys(agent)
    hosts = ",".join(agent.address for agent in started.values())
    result = subprocess.run(
        in_mac1(namespaces, "benchmark", "--hosts", hosts, *QUICK),
        capture_output=True,
        text=True,
        timeout=120,
        env=subprocess_env(),
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    for role, agent in started.items():
        assert agent.address.startswith(ADDRESSES[role])
        cells = [c for c in report["cells"] if c["host"] == agent.address]
        assert [c["status"] for c in cells] == ["ok", "ok"]
    # The addresses live only in the test's namespaces, not in the one the suite runs in.
    assert f" {ADDRESSES['mac1']}/" not in ip("-o", "addr", "show").stdout


@pytest.mark.slow
def test_a_link_cut_for_15_s_mid_run_loses_no_cell(
    namespaces: dict[str, str], agents: AgentPool
) -> None:
    """mac2's agent measures on while its link is down; the coordinator (in mac1) calls the
    host unreachable, reconnects when the link is back and fetches every cell it missed."""
    agent = agents.start("mac2", netns=namespaces["mac2"], bind_host=ADDRESSES["mac2"])
    exchange_keys(agent)
    coordinator = piped(in_mac1(namespaces, "benchmark", "--hosts", agent.address, *LONG))
    veth = VETHS["mac1"]
    try:
        agent.wait_for_cells(1)
        assert ip("-n", namespaces["mac1"], "link", "set", veth, "down").returncode == 0
        time.sleep(15.0)  # the fault under test is a 15 s cut: its length is the point
        assert ip("-n", namespaces["mac1"], "link", "set", veth, "up").returncode == 0
        out, err = coordinator.communicate(timeout=150)
    finally:
        ip("-n", namespaces["mac1"], "link", "set", veth, "up")
        coordinator.kill()
    assert coordinator.returncode == 0, err
    assert "unreachable" in err and "reconnected" in err  # reported silent, not failed
    cells = json.loads(out)["cells"]
    assert len(cells) == 8 and all(c["status"] == "ok" for c in cells)
    assert len({c["name"] for c in cells}) == 8
