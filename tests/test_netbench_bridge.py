"""`coordinator netbench` over a slow member (issue 42, Build 7): three "Macs" on one bridge
(tests.netns_support), the coordinator in the hub, and one member's cable shaped with `tc ...
tbf` to a few Mbit/s both ways, as a Mac on a slow segment would be. The run outlasts
its ranks' bound (twice `--host-timeout` for the ring to form plus its bytes at 5 MB/s) and is
not ended by it while its progress moves; every 10 s the progress line names the step of the
rank furthest behind; and both of the slow member's ring links are flagged, the other not.

Needs root, `ip` and `tc`; skipped with the reason where the namespaces cannot be made.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator

import pytest

from coordinator.runs.netbench import NetbenchPlan
from shared.distributed.netbench import parse_sizes
from tests.conftest import console_script, subprocess_env
from tests.fleet_support import AgentPool, exchange_keys
from tests.netns_support import Lab, lab
from tests.test_netbench_cli import ranks_running

pytestmark = [pytest.mark.timeout(300), pytest.mark.xdist_group("netns")]
"""One xdist worker runs the netns tests one after another (`--dist loadgroup`)."""

RATE = "2mbit"
"""The slow member's cable: 16 KiB ping-pongs of 20 operations take about 2.6 s a repetition
over it, so its two links carry the run past its bound, a ring of fast veths would not."""
SIZES, REPETITIONS, WARMUP = "16K", 3, 1
"""Four passes (a warm-up, three timed) over each link, each of 20 operations."""
HOST_TIMEOUT_S = 8
"""Short, so the ranks' bound is short (twice it, plus 2 s of bytes at 5 MB/s: 18 s), long
enough for three ranks to form their ring on a loaded machine. The run outlasts the bound by
the link's physics alone: its shaped ping-pongs and all_sums take about 28 s at 2 Mbit/s."""


@pytest.fixture
def shaped(agents: AgentPool) -> Iterator[tuple[Lab, list[str]]]:
    """The bridge with c's cable at RATE both ways (its hub end shapes what reaches c, its own
    end what c sends), an agent on each host; the hosts' addresses in ring order."""
    if shutil.which("tc") is None:
        pytest.skip("the `tc` command (iproute2) is not installed")
    with lab(["a", "b", "c"]) as made:
        for namespace, dev in (
            (made.hub, made.hub_ends["c"]),
            (made.namespaces["c"], made.host_ends["c"]),
        ):
            limited = subprocess.run(
                ["tc", "-n", namespace, "qdisc", "add", "dev", dev, "root", "tbf", "rate", RATE,
                 "burst", "32kbit", "latency", "400ms"],
                capture_output=True, text=True, timeout=30,
            )  # fmt: skip
            if limited.returncode != 0:
                pytest.skip(f"cannot rate-limit a veth with tc: {limited.stderr.strip()}")
        hosts = []
        for host in "abc":
            agent = agents.start(host, netns=made.namespaces[host], bind_host=made.addresses[host])
            exchange_keys(agent)
            hosts.append(agent.address)
        yield made, hosts


@pytest.mark.slow
def test_a_slow_member_runs_past_the_bound_names_its_step_and_its_links_are_flagged(
    shaped: tuple[Lab, list[str]], agents: AgentPool
) -> None:
    made, hosts = shaped
    done = made.run(
        [console_script("coordinator"), "netbench", "--hosts", ",".join(hosts), "--sizes", SIZES,
         "-r", str(REPETITIONS), "-w", str(WARMUP), "--host-timeout", str(HOST_TIMEOUT_S),
         "-o", "json"],
        capture_output=True, text=True, timeout=240, env=subprocess_env(COLUMNS="200"),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    a, b, c = hosts
    assert sorted(report["slow_links"]) == sorted([f"{b}↔{c}", f"{c}↔{a}"]), report
    # the ranks ran past the bound the coordinator gave them, still making progress
    plan = NetbenchPlan(parse_sizes(SIZES), REPETITIONS, WARMUP, 0, "ring")
    bound = plan.bound_s(len(hosts), HOST_TIMEOUT_S)
    line = re.compile(
        rf"^netbench n-\w+: {a} running, {b} running, {c} running \((\d+) s\); slowest "
        rf"(?:{a}|{b}|{c}): (.*)$"
    )
    seen = [(int(m[1]), m[2]) for m in map(line.match, done.stderr.splitlines()) if m]
    assert seen and max(elapsed for elapsed, _ in seen) > bound, (bound, done.stderr)
    step = re.compile(
        r"(all_sum|send_recv \S+↔\S+) at 16 KiB, (repetition [1-3] of 3|warm-up 1 of 1)$"
    )
    assert any(step.fullmatch(said) for _, said in seen), done.stderr
    assert not ranks_running(agents)
