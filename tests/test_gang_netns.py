"""A gang of three Macs in three network namespaces, joined by a bridge in a fourth (a switch):
each namespace runs its own real `agent serve` at its own address, keys exchanged with `agent
keys trust --peer`, and one rank of a real 3-rank MLX ring job under `agent run`. No
coordinator takes part in the gang: the policy pushes come from `coordinator policy` run
inside one namespace, as an operator's would. One Mac over `pause_temp` parks all three; a
stop on another ends all three with 75 and leaves nothing behind.

The 10.254.74.0/24 below exists only inside the namespaces this test creates. Needs root and
`ip`; skipped with the reason where namespaces or a bridge cannot be made.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from coordinator.hosts.keys import add_host_key
from tests.conftest import console_script, subprocess_env
from tests.fleet_support import AgentPool, AgentProcess, cli
from tests.netns_support import in_ns, wired_namespaces
from tests.test_gang import (
    BURNING,
    COOL,
    HOT,
    RING_JOB,
    Rank,
    alive,
    job_processes,
    job_states,
    wait_until,
)

pytestmark = [pytest.mark.timeout(300), pytest.mark.xdist_group("netns")]
"""One xdist worker runs the netns tests one after another (`--dist loadgroup`): they share the
machine's namespace table and its /run/netns mount, and time links on a busy machine."""

MACS = ("mac1", "mac2", "mac3")
ADDRESS = "10.254.74.{}"


@pytest.fixture
def lab() -> Iterator[dict[str, str]]:
    """{mac: namespace}, each wired to the switch namespace's bridge; deleted afterwards."""
    tag = f"mg{os.getpid()}"
    names = {mac: f"{tag}-{mac}" for mac in MACS}
    switch = f"{tag}-sw"
    steps = [("-n", switch, "link", "add", "br0", "type", "bridge"),
             ("-n", switch, "link", "set", "br0", "up")]  # fmt: skip
    for index, name in enumerate(names.values(), start=1):
        here, there = f"{tag}{index}a", f"{tag}{index}b"
        steps += [
            ("link", "add", here, "netns", name, "type", "veth", "peer", "name", there,
             "netns", switch),
            ("-n", switch, "link", "set", there, "master", "br0"),
            ("-n", switch, "link", "set", there, "up"),
            ("-n", name, "addr", "add", f"{ADDRESS.format(index)}/24", "dev", here),
            ("-n", name, "link", "set", here, "up"),
            ("-n", name, "link", "set", "lo", "up"),
        ]  # fmt: skip
    with wired_namespaces([switch, *names.values()], steps):
        yield names


def start_lab(lab: dict[str, str], agents: AgentPool, tmp_path: Path) -> list[AgentProcess]:
    curve = tmp_path / "flat.csv"
    curve.write_text("seconds,celsius\n0,70\n1000000,70\n")
    started = []
    for index, mac in enumerate(MACS, start=1):
        agent = agents.start(
            mac, netns=lab[mac], bind_host=ADDRESS.format(index), thermal=f"replay:{curve}",
            options=["--poll-interval", "0.2"],
        )  # fmt: skip
        coordinator_key = cli("coordinator", "keys", "show").stdout.strip()
        trusted = cli("agent", "keys", "trust", coordinator_key, "--name", "op", home=agent.home)
        assert trusted.returncode == 0, trusted.stderr
        add_host_key(agent.address, agent.key or "")
        started.append(agent)
    for agent in started:
        for other, peer in zip(MACS, started, strict=True):
            if peer is agent:
                continue
            done = cli("agent", "keys", "trust", peer.key or "", "--name", other, "--peer",
                       peer.address, home=agent.home)  # fmt: skip
            assert done.returncode == 0, done.stderr
    return started


@pytest.fixture
def lab_ranks() -> Iterator[list[Rank]]:
    started: list[Rank] = []
    yield started
    for rank in started:
        if rank.process.poll() is None:
            for child in psutil.Process(rank.process.pid).children(recursive=True):
                child.send_signal(signal.SIGKILL)
            rank.process.kill()
        rank.process.wait(timeout=15)


def start_ranks(
    lab: dict[str, str], agents: list[AgentProcess], tmp_path: Path, into: list[Rank]
) -> None:
    hostfile = tmp_path / "hosts.json"
    hostfile.write_text(json.dumps([[f"{ADDRESS.format(i)}:{42000 + i}"] for i in (1, 2, 3)]))
    progress = tmp_path / "progress"
    progress.mkdir()
    for rank, (mac, agent) in enumerate(zip(MACS, agents, strict=True)):
        env = subprocess_env(
            MLX_FLEET_HOME=str(agent.home), MLX_RANK=str(rank), MLX_HOSTFILE=str(hostfile),
            STEPS="1000000", PROGRESS_DIR=str(progress),
        )  # fmt: skip
        log = tmp_path / f"rank-{rank}.stderr"
        with open(log, "w") as stderr:
            process = subprocess.Popen(
                in_ns(lab[mac], console_script("agent"), "run", "--", sys.executable,
                      str(RING_JOB)),
                env=env, stderr=stderr, stdout=subprocess.DEVNULL, text=True,
            )  # fmt: skip
        into.append(Rank(process, progress / f"rank-{rank}", log))


def push(lab: dict[str, str], agent: AgentProcess, mac: str, policy: dict[str, float]) -> None:
    """`coordinator policy` from inside `mac`'s namespace, as an operator there would."""
    flags = [f"--{key.replace('_', '-')}={value:g}" for key, value in policy.items()]
    done = subprocess.run(
        in_ns(lab[mac], console_script("coordinator"), "policy", "--hosts", agent.address,
              *flags),
        capture_output=True, text=True, timeout=60, env=subprocess_env(),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr + done.stdout


@pytest.mark.slow
def test_three_macs_pause_resume_and_stop_as_one_gang(
    lab: dict[str, str], agents: AgentPool, lab_ranks: list[Rank], tmp_path: Path
) -> None:
    started = start_lab(lab, agents, tmp_path)
    start_ranks(lab, started, tmp_path, lab_ranks)
    wait_until(lambda: all(r.steps() >= 10 for r in lab_ranks), 120, "3 ranks stepping", lab_ranks)
    push(lab, started[1], "mac2", HOT)
    wait_until(
        lambda: all(job_states(r) == {psutil.STATUS_STOPPED} for r in lab_ranks),
        30, "every rank's job stopped (T)", lab_ranks,
    )  # fmt: skip
    push(lab, started[1], "mac2", COOL)
    steps = [r.steps() for r in lab_ranks]
    wait_until(
        lambda: all(r.steps() > s for r, s in zip(lab_ranks, steps, strict=True)),
        60, "every rank stepping again", lab_ranks,
    )  # fmt: skip
    jobs = job_processes(lab_ranks)
    push(lab, started[2], "mac3", BURNING)
    for rank in lab_ranks:
        assert rank.process.wait(timeout=60) == 75, rank.stderr()
        assert "stopped all 3 ranks" in rank.stderr()
    assert "paused all 3 ranks" in lab_ranks[0].stderr()
    assert [job.pid for job in jobs if alive(job)] == []
