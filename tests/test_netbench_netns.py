"""`coordinator netbench` across three network namespaces wired as a triangle: each pair of
"Macs" has its own veth pair and /30, so each link of the ring is its own cable. With one of
them rate-limited with `tc ... tbf` (the others too, to ten times its rate), the link benchmark
flags that link and only that one; with one cut mid-run (`ip link set ... down`), the ranks
block in a collective and the run fails within --host-timeout, naming the host and the step,
with no rank left on any host.

Each host's ring address is its end of the link its left neighbour reaches it over (rank i-1
connects to rank i, as MLX's ring does): a's on c-a, b's on a-b, c's on b-c. The coordinator
runs in a, which reaches c's address through c's end of c-a (a /32 route; Linux answers for
any of its addresses on any link). The addresses exist only inside the test's namespaces.
Needs root, `ip` and `tc`; skipped with the reason where the namespaces cannot be made.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator

import pytest

from shared.distributed.netbench import progress_step
from tests.conftest import console_script, subprocess_env
from tests.fleet_support import AgentPool, AgentProcess, cli, exchange_keys
from tests.netns_support import in_ns, ip, wired_namespaces
from tests.test_netbench_cli import ranks_running

pytestmark = [pytest.mark.timeout(600), pytest.mark.xdist_group("netns")]
"""One xdist worker runs the netns tests one after another (`--dist loadgroup`): they share the
machine's namespace table and its /run/netns mount, and time links on a busy machine."""

LINKS = {
    ("a", "b"): "10.254.81.{}/30",
    ("b", "c"): "10.254.82.{}/30",
    ("c", "a"): "10.254.83.{}/30",
}
"""Each link's /30: its first host is .1, its second .2."""
RING_ADDRESS = {"a": "10.254.83.2", "b": "10.254.81.2", "c": "10.254.82.2"}
"""Where each host's left neighbour reaches it: a on c-a, b on a-b, c on b-c."""
SLOW = ("b", "c")
RATE = "40mbit"
OTHERS_RATE = "400mbit"
"""The other cables, shaped too: unshaped, a link's bandwidth is what the CPU has left, and on a
busy machine one measured a quarter of its sibling (flagged slow); shaped, each measures its
rate, ten times the slow one's."""


def veth(link: tuple[str, str], end: str) -> str:
    return f"nb{os.getpid() % 100000}{link[0]}{link[1]}{end}"


@pytest.fixture
def wired() -> Iterator[dict[str, str]]:
    """The three namespaces, {"a": name, ...}, wired as a triangle; deleted afterwards."""
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            pytest.skip(f"the `{tool}` command (iproute2) is not installed")
    names = {host: f"mlxnb{os.getpid()}-{host}" for host in "abc"}
    steps: list[tuple[str, ...]] = []
    for (first, second), subnet in LINKS.items():
        one, two = veth((first, second), first), veth((first, second), second)
        steps.append(
            ("link", "add", one, "netns", names[first], "type", "veth", "peer", "name", two,
             "netns", names[second])
        )  # fmt: skip
        for index, (host, dev) in enumerate(((first, one), (second, two)), start=1):
            steps += [
                ("-n", names[host], "addr", "add", subnet.format(index), "dev", dev),
                ("-n", names[host], "link", "set", dev, "up"),
            ]
    steps += [("-n", name, "link", "set", "lo", "up") for name in names.values()]
    steps.append(
        ("-n", names["a"], "route", "add", f"{RING_ADDRESS['c']}/32", "via", "10.254.83.1")
    )
    with wired_namespaces(names.values(), steps):
        yield names


@pytest.fixture
def triangle(wired: dict[str, str]) -> dict[str, str]:
    """The triangle with its b-c cable limited to RATE, the others to OTHERS_RATE."""
    for link in LINKS:
        rate, burst = (RATE, "32kbit") if link == SLOW else (OTHERS_RATE, "256kbit")
        for host in link:  # both directions of the cable
            limited = subprocess.run(
                ["tc", "-n", wired[host], "qdisc", "add", "dev", veth(link, host), "root", "tbf",
                 "rate", rate, "burst", burst, "latency", "400ms"],
                capture_output=True, text=True, timeout=30,
            )  # fmt: skip
            if limited.returncode != 0:
                pytest.skip(f"cannot rate-limit a veth with tc: {limited.stderr.strip()}")
    return wired


def ring_agents(names: dict[str, str], agents: AgentPool) -> list[AgentProcess]:
    """An agent in each namespace, at its ring address, trusted by this test's coordinator."""
    started = []
    for host in "abc":
        agent = agents.start(host, netns=names[host], bind_host=RING_ADDRESS[host])
        exchange_keys(agent)
        started.append(agent)
    return started


@pytest.mark.slow
def test_the_rate_limited_link_and_only_it_is_flagged(
    triangle: dict[str, str], agents: AgentPool
) -> None:
    hosts = [agent.address for agent in ring_agents(triangle, agents)]
    result = subprocess.run(
        in_ns(triangle["a"], console_script("coordinator"), "netbench",
              "--hosts", ",".join(hosts), "--sizes", "64K,1M", "-r", "3", "-o", "json"),
        capture_output=True, text=True, timeout=500, env=subprocess_env(),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    slow = f"{hosts[1]}↔{hosts[2]}"
    assert list(report["slow_links"]) == [slow], report["links_best_busbw_gbps"]
    limited = report["links_best_busbw_gbps"][slow]
    assert limited < 40e6 / 8 / 1e9 * 1.5  # the tbf rate, 5 MB/s, give or take its burst
    others = [value for link, value in report["links_best_busbw_gbps"].items() if link != slow]
    assert min(others) > 3 * limited


REPETITIONS = 40
"""Each operation's repetitions: the b-c ping-pong lasts seconds (about 6 s on a 2-core VM, 0.15 s
a repetition), long enough to cut it in; the all_sum and the a-b ping-pong before it, the test's
chosen wait, take about 15 s there."""
CUT_TIMEOUT_S = 20
"""--host-timeout for the cut: short, with room for three ranks to start on a loaded machine."""


def progress_of(agent: AgentProcess) -> int:
    """The units its rank has written (agent.cluster.netbench.Progress); 0 before any."""
    for path in agent.home.glob("ranks/*/progress"):
        text = path.read_text().strip()
        return int(text) if text.isdigit() else 0
    return 0


def step_of(agent: AgentProcess, hosts: list[str]) -> str:
    """What its rank is doing, by the units it has written."""
    return progress_step(progress_of(agent), [1 << 20], hosts, 1, REPETITIONS)


@pytest.mark.slow
def test_a_link_cut_mid_run_fails_it_within_the_host_timeout(
    wired: dict[str, str], agents: AgentPool
) -> None:
    started = ring_agents(wired, agents)
    hosts = [agent.address for agent in started]
    run = subprocess.Popen(
        in_ns(wired["a"], console_script("coordinator"), "netbench",
              "--hosts", ",".join(hosts), "--sizes", "1M", "-r", str(REPETITIONS), "-w", "1",
              "--host-timeout", str(CUT_TIMEOUT_S)),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=subprocess_env(),
    )  # fmt: skip
    cut = f"send_recv {hosts[1]}↔{hosts[2]}"
    deadline = time.monotonic() + 300
    try:
        # into the b-c ping-pong (MLX's ring sends it over the b-c cable alone), then cut it
        while not step_of(started[1], hosts).startswith(cut):
            assert run.poll() is None, run.communicate()[1]
            assert time.monotonic() < deadline, f"never reached {cut}: {progress_of(started[1])}"
            time.sleep(0.05)
        link = ("b", "c")
        assert ip("-n", wired["b"], "link", "set", veth(link, "b"), "down").returncode == 0
        cut_at = time.monotonic()
        _, stderr = run.communicate(timeout=CUT_TIMEOUT_S + 120)
        took = time.monotonic() - cut_at
    finally:
        run.kill()
    assert run.returncode == 1, stderr
    line = stderr.strip().splitlines()[-1]
    assert line.startswith((f"error: {hosts[1]}: ", f"error: {hosts[2]}: ")), line
    assert f"past --host-timeout {CUT_TIMEOUT_S}, in {cut} at 1 MiB, " in line, line
    # its heartbeat, not its bound (hours); counted from the last progress the coordinator saw,
    # which its poll may have seen up to a poll before the cut
    assert CUT_TIMEOUT_S - 2 <= took < CUT_TIMEOUT_S + 60
    gone = time.monotonic() + 60
    while ranks_running(agents):  # every rank stopped, on every host
        assert time.monotonic() < gone, ranks_running(agents)
        time.sleep(0.1)
    (listed,) = json.loads(cli("coordinator", "runs", "-o", "json").stdout)
    assert (listed["kind"], listed["status"], "error: " + listed["error"]) == (
        "netbench", "failed", line
    )  # fmt: skip
