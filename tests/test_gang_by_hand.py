"""A gang set up by hand exactly as docs/monitoring.md says (issue 42): each agent trusts the
other's key with `agent keys trust KEY --peer HOST:PORT`, and each rank runs `agent run --group
NAME --ranks 2 --rank R --rank-hosts HOST:PORT,HOST:PORT -- CMD` (no launcher variables).

Both agents serve on one address (127.0.0.2), told apart by their ports alone: a peer found by
its host part only finds neither (the failure the issue reports: the ranks never met, and one
logged "paused all 2 ranks" while the other ran on). The job is a plain Python loop that counts
its steps; the gang pauses it with SIGSTOP. With the keys exchanged both ranks pause and resume
together; with one key withheld the hot rank pauses itself and its log names the rank it could
not tell, never "all".
"""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import zmq

from shared.cooling.gang import MemberState, gang_reason
from shared.cooling.policy import Action, CoolingState
from shared.io.keys import own_keypair
from shared.io.trust import peer_key, trust
from tests.conftest import console_script, subprocess_env
from tests.fleet_support import AgentPool, AgentProcess, cli, connect
from tests.ring_support import end_sessions
from tests.test_gang import Rank as GangRank
from tests.test_gang import wait_until
from tests.test_gang_netns import lab as netns_lab  # noqa: F401 - a fixture: namespaces

ADDRESS = "127.0.0.2"
HOT = {"max_speed_temp": 50.0, "pause_temp": 60.0, "stop_temp": 95.0, "hysteresis": 2.0}
COOL = {"max_speed_temp": 75.0, "pause_temp": 85.0, "stop_temp": 95.0, "hysteresis": 2.0}
STEPS = (
    "import os, sys, time\n"
    "path, n = sys.argv[1], 0\n"
    "while not os.path.exists(path + '.finish'):\n"
    "    n += 1\n"
    "    open(path, 'w').write(str(n))\n"
    "    time.sleep(0.02)\n"
)
"""The job: counts steps into a file until told to finish."""


# --- the pure core --------------------------------------------------------------------------


def test_a_rank_not_told_is_named_and_never_counted() -> None:
    cause = MemberState(0, "mac0", CoolingState.PAUSE, CoolingState.PAUSE, 70.0, "smc", None,
                        1.0, "j")  # fmt: skip
    said = gang_reason(Action.PAUSE, 3, cause, 0, {2: "mac2: never heard, no trusted key"})
    assert said == (
        "paused 2 of 3 ranks (0, 1): mac0 (rank 0, this Mac) at 70.0 °C (smc); "
        "not told: rank 2 (mac2: never heard, no trusted key)"
    )
    resumed = gang_reason(Action.RESUME, 2, None, 0, {1: "mac1: silent"})
    assert "all 2" not in resumed and "not told: rank 1 (mac1: silent)" in resumed


def test_a_peer_is_found_by_host_and_port(tmp_path: Path) -> None:
    """Two agents of one address, trusted as HOST:PORT each: the port picks the key; a peer
    trusted as HOST alone serves any port asked for, after one that names the very port."""
    first, second, third = (zmq.curve_keypair()[0].decode() for _ in range(3))
    trust(first, "a", directory=tmp_path, peer=f"{ADDRESS}:6000")
    trust(second, "b", directory=tmp_path, peer=f"{ADDRESS}:6001")
    trust(third, "c", directory=tmp_path, peer="127.0.0.3")
    assert peer_key("127.0.0.3", tmp_path, port=6002).key == third  # type: ignore[union-attr]
    assert peer_key(ADDRESS, tmp_path, port=6001).key == second  # type: ignore[union-attr]
    assert peer_key(ADDRESS, tmp_path, port=6000).key == first  # type: ignore[union-attr]
    assert peer_key(ADDRESS, tmp_path, port=7000) is None
    assert peer_key("127.0.0.9", tmp_path, port=6000) is None


# --- two real agents, two ranks by hand -------------------------------------------------------


class Rank(GangRank):
    """A rank started by hand (test_gang's), and whether its job is stopped."""

    def stopped(self) -> bool:
        """The job's process (under agent run) is in state T."""
        try:
            children = psutil.Process(self.process.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return False
        jobs = [c for c in children if "-c" in c.cmdline()]
        return bool(jobs) and all(c.status() == psutil.STATUS_STOPPED for c in jobs)


@pytest.fixture
def two_agents(agents: AgentPool, tmp_path: Path) -> tuple[AgentProcess, AgentProcess]:
    try:
        socket_check = socket.socket()
        socket_check.bind((ADDRESS, 0))
        socket_check.close()
    except OSError:
        pytest.skip(f"{ADDRESS} cannot be bound on this machine's loopback")
    started = []
    for name in ("rank0", "rank1"):
        curve = tmp_path / f"{name}.csv"
        curve.write_text("seconds,celsius\n0,70\n1000000,70\n")
        agent = agents.start(
            name, thermal=f"replay:{curve}", bind_host=ADDRESS,
            options=["--poll-interval", "0.2"], home=tmp_path / "homes" / name,
        )  # fmt: skip
        trust(own_keypair().public, "test", directory=agent.home / "keys" / "trusted")
        started.append(agent)
    return started[0], started[1]


def trust_peer(this: AgentProcess, other: AgentProcess) -> None:
    """docs/monitoring.md's step, with the real CLI: `agent keys trust KEY --peer HOST:PORT`."""
    done = cli(
        "agent", "keys", "trust", other.key or "", "--name", f"peer{other.port}",
        "--peer", other.address, home=this.home,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr


@pytest.fixture
def ranks(tmp_path: Path) -> Iterator[list[Rank]]:
    started: list[Rank] = []
    yield started
    for rank in started:
        (rank.progress.parent / f"{rank.progress.name}.finish").touch()
    end_sessions([rank.process for rank in started])


def start_ranks(pair: tuple[AgentProcess, AgentProcess], tmp_path: Path, into: list[Rank]) -> None:
    hosts = ",".join(agent.address for agent in pair)
    for rank, agent in enumerate(pair):
        steps, log = tmp_path / f"steps-{rank}", tmp_path / f"rank-{rank}.stderr"
        env = subprocess_env(MLX_FLEET_HOME=str(agent.home))
        with open(log, "w") as stderr:
            process = subprocess.Popen(
                [console_script("agent"), "run", "--group", "byhand", "--ranks", "2",
                 "--rank", str(rank), "--rank-hosts", hosts, "--",
                 sys.executable, "-c", STEPS, str(steps)],
                env=env, stderr=stderr, stdout=subprocess.DEVNULL, text=True,
                start_new_session=True, cwd=tmp_path,
            )  # fmt: skip
        into.append(Rank(process, steps, log))


def set_policy(ctx: zmq.Context, agent: AgentProcess, policy: dict[str, float]) -> None:
    with connect(ctx, agent) as client:
        client.request("policy.set", {"policy": policy})


@pytest.mark.slow
def test_ranks_set_up_by_hand_pause_and_resume_together(
    two_agents: tuple[AgentProcess, AgentProcess],
    ranks: list[Rank],
    tmp_path: Path,
    ctx: zmq.Context,
) -> None:
    hot, cool = two_agents
    trust_peer(hot, cool)
    trust_peer(cool, hot)
    start_ranks(two_agents, tmp_path, ranks)
    wait_until(lambda: all(r.steps() >= 10 for r in ranks), 60, "both ranks stepping", ranks)
    set_policy(ctx, hot, HOT)
    wait_until(lambda: all(r.stopped() for r in ranks), 30, "both ranks paused (T)", ranks)
    set_policy(ctx, hot, COOL)
    wait_until(lambda: not any(r.stopped() for r in ranks), 30, "both ranks resumed", ranks)
    for rank in ranks:
        assert "paused all 2 ranks: " in rank.stderr(), rank.stderr()
        assert "cannot tell" not in rank.stderr(), rank.stderr()


@pytest.mark.slow
def test_a_rank_whose_peer_is_untrusted_never_says_all(
    two_agents: tuple[AgentProcess, AgentProcess],
    ranks: list[Rank],
    tmp_path: Path,
    ctx: zmq.Context,
) -> None:
    """No `agent keys trust` on either side: the hot rank pauses itself alone, says so, and
    names rank 1 with why; the other rank runs on."""
    hot, cool = two_agents
    start_ranks(two_agents, tmp_path, ranks)
    wait_until(lambda: all(r.steps() >= 10 for r in ranks), 60, "both ranks stepping", ranks)
    set_policy(ctx, hot, HOT)
    wait_until(lambda: ranks[0].stopped(), 30, "the hot rank paused (T)", ranks)
    wait_until(lambda: "paused 1 of 2 ranks" in ranks[0].stderr(), 10, "its line", ranks)
    log = ranks[0].stderr()
    assert "all 2 ranks" not in log, log
    assert f"not told: rank 1 ({cool.address}: never heard" in log, log
    assert "no trusted agent key" in log, log
    before = ranks[1].steps()
    wait_until(lambda: ranks[1].steps() > before + 5, 30, "the other rank running on", ranks)
    assert not ranks[1].stopped()


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.xdist_group("netns")
def test_ranks_set_up_by_hand_on_two_namespaces_pause_and_resume_together(
    netns_lab: dict[str, str],  # noqa: F811 - the fixture imported above
    agents: AgentPool,
    ranks: list[Rank],
    tmp_path: Path,
) -> None:
    """Issue 42's acceptance: two Macs in two network namespaces (tests/test_gang_netns.py's
    lab, each agent trusting the others with `agent keys trust KEY --peer HOST:PORT`), two
    ranks started by hand with `--rank-hosts HOST:PORT,HOST:PORT`: a pause on one Mac parks
    both, a cool policy resumes both, and each says `paused all 2 ranks`."""
    from tests.netns_support import in_ns
    from tests.test_gang_netns import push, start_lab

    lab = netns_lab
    started = start_lab(lab, agents, tmp_path)[:2]  # mac1 and mac2; mac3's agent idles
    hosts = ",".join(agent.address for agent in started)
    for rank, (mac, agent) in enumerate(zip(("mac1", "mac2"), started, strict=True)):
        steps, log = tmp_path / f"steps-{rank}", tmp_path / f"rank-{rank}.stderr"
        with open(log, "w") as stderr:
            process = subprocess.Popen(
                in_ns(lab[mac], console_script("agent"), "run", "--group", "byhand",
                      "--ranks", "2", "--rank", str(rank), "--rank-hosts", hosts, "--",
                      sys.executable, "-c", STEPS, str(steps)),
                env=subprocess_env(MLX_FLEET_HOME=str(agent.home)), stderr=stderr,
                stdout=subprocess.DEVNULL, text=True, start_new_session=True,
            )  # fmt: skip
        ranks.append(Rank(process, steps, log))
    wait_until(lambda: all(r.steps() >= 10 for r in ranks), 120, "both ranks stepping", ranks)
    push(lab, started[0], "mac1", HOT)
    wait_until(lambda: all(r.stopped() for r in ranks), 60, "both ranks paused (T)", ranks)
    push(lab, started[0], "mac1", COOL)
    wait_until(lambda: not any(r.stopped() for r in ranks), 60, "both ranks resumed", ranks)
    for rank in ranks:
        assert "paused all 2 ranks: " in rank.stderr(), rank.stderr()
        assert "not told" not in rank.stderr(), rank.stderr()
