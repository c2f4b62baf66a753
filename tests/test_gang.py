"""Distributed jobs as gangs (shared.cooling.gang, agent.cooling.gang): a real MLX ring job of two
ranks, each under `agent run` beside its own real `agent serve` (127.0.0.2 and 127.0.0.3, keys
exchanged with `agent keys trust --peer`), and no coordinator: a policy that makes one Mac ask for a
pause parks both ranks (state T), they resume together, the job ends with the right result; a stop
ends both with 75; with one peer's agent down the hot rank protects itself and says so, and the
restarted agent brings the gang back.

The temperature is a constant replayed 70 °C on both Macs; what crosses is the policy, pushed
with policy.set to one agent (the test holds the coordinator key both trust), so nothing hangs
on a curve's timing.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
import zmq

from agent.cooling.gang import LOCAL_EVERY_S
from coordinator.hosts.keys import add_host_key
from coordinator.telemetry.gang_rows import gang_rows
from shared.cooling.gang import (
    Enforced,
    GangIdentity,
    GangSpecError,
    MemberState,
    from_environment,
    from_options,
    gang_reason,
    merge,
    steer,
    verdict,
)
from shared.cooling.policy import Action, CoolingState
from shared.io.transport import AgentClient, AgentError
from tests.conftest import console_script, subprocess_env
from tests.fleet_support import AgentPool, AgentProcess, cli, connect, trusted_agent
from tests.ring_support import end_sessions

RING_JOB = Path(__file__).parent / "jobs" / "ring_steps.py"
HOT = {"max_speed_temp": 50.0, "pause_temp": 60.0, "stop_temp": 95.0, "hysteresis": 2.0}
COOL = {"max_speed_temp": 75.0, "pause_temp": 85.0, "stop_temp": 95.0, "hysteresis": 2.0}
BURNING = {"max_speed_temp": 50.0, "pause_temp": 60.0, "stop_temp": 65.0, "hysteresis": 2.0}


# --- the pure core --------------------------------------------------------------------------


def member(rank: int, state: CoolingState, at: float = 100.0, heard: float = 100.0) -> MemberState:
    return MemberState(rank, f"mac{rank}", state, state, 80.0, "smc", "TCMz", at, "job", heard)


def test_mlx_launch_ring_environment_names_the_gang() -> None:
    hostfile = '[["10.0.0.1:5000", "10.0.0.1:5001"], ["10.0.0.2:5002", "10.0.0.2:5003"]]'
    env = {"MLX_RANK": "1", "MLX_HOSTFILE": "/tmp/h"}
    identity = from_environment(env, lambda path: hostfile)
    assert identity is not None
    assert (identity.rank, identity.world, identity.backend) == (1, 2, "ring")
    assert identity.hosts == ("10.0.0.1", "10.0.0.2") and identity.peers == ("10.0.0.1",)
    again = from_environment({"MLX_RANK": "0", "MLX_HOSTFILE": "/x"}, lambda path: hostfile)
    assert again is not None and again.group == identity.group  # every rank names it alike
    other = hostfile.replace("5000", "6000")
    assert from_environment(env, lambda path: other).group != identity.group  # type: ignore[union-attr]


def test_jaccl_environment_names_rank_zero_only() -> None:
    devices = json.dumps([[None, "rdma_en3"], ["rdma_en3", None]])
    env = {"MLX_RANK": "1", "MLX_JACCL_COORDINATOR": "10.0.0.1:32323", "MLX_IBV_DEVICES": "/d"}
    identity = from_environment(env, lambda path: devices)
    assert identity is not None and identity.backend == "jaccl"
    assert identity.hosts == ("10.0.0.1", "") and identity.peers == ("10.0.0.1",)


@pytest.mark.parametrize(
    ("env", "content", "problem"),
    [
        ({"MLX_RANK": "0", "MLX_HOSTFILE": "/h"}, "{not json", "not JSON"),
        ({"MLX_RANK": "0", "MLX_HOSTFILE": "/h"}, '{"a": 1}', "not a list of ranks"),
        ({"MLX_RANK": "0", "MLX_HOSTFILE": "/h"}, '[["x"], ["y"]]', 'not "ip:port"'),
        ({"MLX_RANK": "5", "MLX_HOSTFILE": "/h"}, '[["a:1"], ["b:2"]]', "rank 5 is outside"),
        ({"MLX_RANK": "one", "MLX_HOSTFILE": "/h"}, '[["a:1"], ["b:2"]]', "MLX_RANK is 'one'"),
        ({"MLX_RANK": "0", "MLX_HOSTFILE": "/h"}, None, "cannot be read"),
    ],
)
def test_a_bad_launcher_environment_is_named(
    env: dict[str, str], content: str | None, problem: str
) -> None:
    def read(path: str) -> str:
        if content is None:
            raise FileNotFoundError(2, "No such file or directory")
        return content

    with pytest.raises(GangSpecError, match=problem):
        from_environment(env, read)


def test_one_rank_or_no_launcher_is_no_gang() -> None:
    assert from_environment({}, lambda path: "") is None
    assert from_environment({"MLX_RANK": "0", "MLX_HOSTFILE": "/h"}, lambda path: "") is None
    assert from_environment({"MLX_RANK": "0", "MLX_HOSTFILE": "/h"}, lambda p: '[["a:1"]]') is None


def test_manual_groups_need_every_rank_named() -> None:
    assert from_options("ft", 2, 0, ["mac1", "mac2"]).hosts == ("mac1", "mac2")
    with pytest.raises(GangSpecError, match="names 1 hosts for --ranks 2"):
        from_options("ft", 2, 0, ["mac1"])
    with pytest.raises(GangSpecError, match="needs --rank"):
        from_options("ft", 2, None, ["mac1", "mac2"])
    with pytest.raises(GangSpecError, match="rank 2 is outside"):
        from_options("ft", 2, 2, ["mac1", "mac2"])
    with pytest.raises(GangSpecError, match="bad group"):
        GangIdentity("../x", 0, 2, ("a", "b"), "manual")


def test_the_gang_lives_under_its_most_severe_member() -> None:
    members = {0: member(0, CoolingState.OK), 1: member(1, CoolingState.PAUSE)}
    decided = verdict(members, now=101.0, hold_s=10.0)
    assert decided.state is CoolingState.PAUSE and decided.cause == members[1]
    members[1] = member(1, CoolingState.OK, at=102.0)
    assert verdict(members, now=103.0, hold_s=10.0).state is CoolingState.OK


def test_a_silent_member_stops_holding_the_gang_but_a_stop_is_final() -> None:
    members = {0: member(0, CoolingState.OK, heard=130.0), 1: member(1, CoolingState.PAUSE)}
    held = verdict(members, now=109.0, hold_s=10.0)
    assert held.state is CoolingState.PAUSE and held.silent == ()
    expired = verdict(members, now=130.0, hold_s=10.0)
    assert expired.state is CoolingState.OK and expired.silent == (1,)
    stopped = merge(members, [member(1, CoolingState.STOP, at=101.0)])
    later = merge(stopped, [member(1, CoolingState.OK, at=200.0)])
    assert later[1].state is CoolingState.STOP
    assert verdict(later, now=1000.0, hold_s=10.0).state is CoolingState.STOP


def test_merge_keeps_the_newest_report_of_each_rank() -> None:
    old, new = member(1, CoolingState.PAUSE, at=100.0), member(1, CoolingState.OK, at=101.0)
    assert merge({1: new}, [old])[1] is new
    assert merge({1: old}, [new])[1] is new


def test_steer_pauses_once_resumes_once_and_stops_for_good() -> None:
    enforced, actions = steer(Enforced(), CoolingState.PAUSE)
    assert actions == (Action.PAUSE,)
    assert steer(enforced, CoolingState.PAUSE)[1] == ()
    enforced, actions = steer(enforced, CoolingState.REDUCE_BATCH)
    assert actions == (Action.RESUME, Action.REDUCE_BATCH)
    enforced, actions = steer(enforced, CoolingState.OK)
    assert actions == (Action.RESTORE_BATCH,)
    enforced, actions = steer(enforced, CoolingState.STOP)
    assert actions == (Action.STOP,) and steer(enforced, CoolingState.OK)[1] == ()


def test_the_reason_names_the_mac_that_caused_it() -> None:
    cause = MemberState(2, "mac2", CoolingState.PAUSE, CoolingState.PAUSE, 104.0, "smc",
                        "TCMz", 1.0, "j")  # fmt: skip
    assert gang_reason(Action.PAUSE, 3, cause, 0) == (
        "paused all 3 ranks: mac2 (rank 2) at 104.0 °C (smc · TCMz)"
    )
    assert "this Mac" in gang_reason(Action.PAUSE, 3, cause, 2)
    assert gang_reason(Action.RESUME, 3, None, 0).startswith("resumed all 3 ranks")


# --- real agents, real ranks ----------------------------------------------------------------


@dataclass
class Mac:
    agent: AgentProcess
    address: str


def free_port(host: str) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def replay_constant(path: Path, celsius: float) -> str:
    path.write_text(f"seconds,celsius\n0,{celsius}\n1000000,{celsius}\n")
    return f"replay:{path}"


def start_mac(agents: AgentPool, tmp_path: Path, address: str, port: int = 0) -> Mac:
    curve = replay_constant(tmp_path / f"{address}.csv", 70.0)
    agent = agents.start(
        address, thermal=curve, bind_host=address, port=port,
        options=["--poll-interval", "0.2"], home=tmp_path / "homes" / address,
    )  # fmt: skip
    from shared.io.keys import own_keypair
    from shared.io.trust import trust

    trust(own_keypair().public, "test", directory=agent.home / "keys" / "trusted")
    add_host_key(agent.address, agent.key or "")  # the test's coordinator knows it
    return Mac(agent, address)


def introduce(a: Mac, b: Mac) -> None:
    """Each agent trusts the other's key as the peer at its address, with the real CLI."""
    for this, other in ((a, b), (b, a)):
        done = cli(
            "agent", "keys", "trust", other.agent.key or "", "--name", other.address,
            "--peer", other.agent.address, home=this.agent.home,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr


@pytest.fixture
def two_macs(agents: AgentPool, tmp_path: Path) -> tuple[Mac, Mac]:
    for address in ("127.0.0.2", "127.0.0.3"):
        try:
            socket.socket().bind((address, 0))
        except OSError:
            pytest.skip(f"{address} cannot be bound on this machine's loopback")
    macs = (start_mac(agents, tmp_path, "127.0.0.2"), start_mac(agents, tmp_path, "127.0.0.3"))
    introduce(*macs)
    return macs


@dataclass
class Rank:
    process: subprocess.Popen[str]
    progress: Path
    stderr_path: Path

    def steps(self) -> int:
        text = self.progress.read_text() if self.progress.exists() else ""
        return int(text) if text.strip().isdigit() else 0

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")


@pytest.fixture
def ranks(tmp_path: Path) -> Iterator[list[Rank]]:
    started: list[Rank] = []
    yield started
    end_sessions([rank.process for rank in started])


def start_ranks(
    macs: tuple[Mac, Mac],
    tmp_path: Path,
    steps: int,
    into: list[Rank],
    gate: str = "",
    command: list[str] | None = None,
    rank_env: dict[int, dict[str, str]] | None = None,
) -> None:
    """Rank R on macs[R] under `agent run`: the ring job, or `command`; `gate` (step,
    scheduler, or any word for `command`): a cooperative job; `rank_env` more environment for
    some ranks. Each rank's stdout goes to tmp_path/rank-R.stdout. The ring job ends after
    `steps`, or once told (finish_soon)."""
    hostfile = tmp_path / "hosts.json"
    ring = [[f"{mac.address}:{free_port(mac.address)}"] for mac in macs]
    hostfile.write_text(json.dumps(ring))
    progress = tmp_path / "progress"
    progress.mkdir(exist_ok=True)
    for rank, mac in enumerate(macs):
        log = tmp_path / f"rank-{rank}.stderr"
        env = subprocess_env(
            MLX_FLEET_HOME=str(mac.agent.home), MLX_RANK=str(rank), MLX_HOSTFILE=str(hostfile),
            STEPS=str(steps), PROGRESS_DIR=str(progress), GATE=gate,
            FINISH_FILE=str(tmp_path / "finish"),
            **({"MLX_FLEET_COOPERATIVE": "1"} if gate else {}), **(rank_env or {}).get(rank, {}),
        )  # fmt: skip
        job = command or [sys.executable, str(RING_JOB)]
        with open(log, "w") as stderr, open(tmp_path / f"rank-{rank}.stdout", "w") as stdout:
            process = subprocess.Popen(
                [console_script("agent"), "run", "--", *job], env=env, stderr=stderr,
                stdout=stdout, text=True, start_new_session=True, cwd=tmp_path,
            )  # fmt: skip
        into.append(Rank(process, progress / f"rank-{rank}", log))


def start_stepping(
    macs: tuple[Mac, Mac], tmp_path: Path, ranks: list[Rank], gate: str = ""
) -> None:
    """start_ranks with STEPS that outlast any test (finish_soon ends them), waited for until
    every rank has stepped 10 steps."""
    start_ranks(macs, tmp_path, steps=100000, into=ranks, gate=gate)
    wait_until(lambda: all(r.steps() >= 10 for r in ranks), 90, "both ranks stepping", ranks)


def finish_soon(ranks: list[Rank], tmp_path: Path, more: int = 20) -> None:
    """Once every rank has stepped `more` steps past where it stands, tell the ring job to end
    (its FINISH_FILE): what the test waited for has been seen, the rest of STEPS (long enough
    for a pause to land on the slowest machine) need not run."""
    steps = [rank.steps() for rank in ranks]
    wait_until(
        lambda: all(r.steps() >= s + more for r, s in zip(ranks, steps, strict=True)),
        90, "every rank stepping on", ranks,
    )  # fmt: skip
    (tmp_path / "finish").touch()


def finish_cleanly(ranks: list[Rank], tmp_path: Path) -> None:
    """finish_soon; then every rank's agent run ends 0 and its ring job wrote `ok` (every step
    summed right)."""
    finish_soon(ranks, tmp_path)
    for rank in ranks:
        assert rank.process.wait(timeout=180) == 0, rank.stderr()
        assert rank.progress.with_suffix(".done").read_text() == "ok"


def ring_jobs(ranks: list[Rank]) -> list[psutil.Process]:
    """The ring job's processes under the ranks' agent runs."""
    return [
        child
        for rank in ranks
        for child in psutil.Process(rank.process.pid).children(recursive=True)
        if "ring_steps" in " ".join(child.cmdline())
    ]


def job_processes(ranks: list[Rank]) -> list[psutil.Process]:
    """Every process under the ranks' agent runs: what must be gone once they end."""
    return [child for rank in ranks for child in psutil.Process(rank.process.pid).children(True)]


def alive(process: psutil.Process) -> bool:
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def job_states(rank: Rank) -> set[str]:
    """The states of the rank's command's processes (the children of its agent run)."""
    try:
        children = psutil.Process(rank.process.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return set()
    found = set()
    for child in children:
        try:
            if "ring_steps" in " ".join(child.cmdline()):
                found.add(child.status())
        except psutil.NoSuchProcess:
            continue
    return found


def wait_until(
    condition: Callable[[], bool], timeout: float, what: str, ranks: Sequence[Rank]
) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            logs = "\n".join(f"--- rank {i}\n{r.stderr()}" for i, r in enumerate(ranks))
            raise AssertionError(f"{what} within {timeout:g} s\n{logs}")
        time.sleep(0.05)


def monitor_json(macs: tuple[Mac, Mac]) -> subprocess.CompletedProcess[str]:
    hosts = ",".join(mac.agent.address for mac in macs)
    done = cli("coordinator", "monitor", "--hosts", hosts, "--once", "--format", "json")
    assert done.returncode == 0, done.stderr
    return done


def set_policy(ctx: zmq.Context, mac: Mac, policy: dict[str, float]) -> None:
    with connect(ctx, mac.agent) as client:
        client.request("policy.set", {"policy": policy})


@pytest.mark.slow
def test_one_hot_mac_pauses_and_resumes_every_rank(
    two_macs: tuple[Mac, Mac], ranks: list[Rank], tmp_path: Path, ctx: zmq.Context
) -> None:
    hot, cool = two_macs
    start_stepping(two_macs, tmp_path, ranks)
    set_policy(ctx, hot, HOT)
    wait_until(
        lambda: all(job_states(r) == {psutil.STATUS_STOPPED} for r in ranks),
        30, "every rank's job stopped (T)", ranks,
    )  # fmt: skip
    seen = json.loads(monitor_json(two_macs).stdout)["gangs"]
    assert len(seen) == 1 and seen[0]["state"] == "pause" and seen[0]["world"] == 2
    assert seen[0]["ranks"] == {"0": hot.agent.address, "1": cool.agent.address}
    assert seen[0]["cause"]["rank"] == 0 and seen[0]["cause"]["celsius"] == 70.0
    hosts = f"{hot.agent.address},{cool.agent.address}"
    table = cli("coordinator", "monitor", "--hosts", hosts, "--once")
    assert "distributed jobs" in table.stdout and "2/2 ranks" in table.stdout, table.stdout
    parked = ring_jobs(ranks)
    cpu = [p.cpu_times() for p in parked]
    steps = [r.steps() for r in ranks]
    time.sleep(1.0)  # a window to measure that nothing runs, not a wait for a condition
    assert [p.cpu_times() for p in parked] == cpu
    assert [r.steps() for r in ranks] == steps
    set_policy(ctx, hot, COOL)
    wait_until(
        lambda: all(job_states(r) and psutil.STATUS_STOPPED not in job_states(r) for r in ranks),
        30, "every rank resumed", ranks,
    )  # fmt: skip
    finish_cleanly(ranks, tmp_path)
    assert "paused all 2 ranks: " in ranks[1].stderr()
    assert "(rank 0) at 70.0 °C" in ranks[1].stderr()
    assert "resumed all 2 ranks" in ranks[0].stderr()
    monitor_json(two_macs)  # records what the agents kept, the jobs' summaries among it
    done = cli("coordinator", "history", "--since", "1h", "--format", "json")
    assert done.returncode == 0, done.stderr
    jobs = json.loads(done.stdout)["jobs"]
    assert {job["host"] for job in jobs} == {hot.agent.address, cool.agent.address}
    for job in jobs:
        assert job["readable"] and job["paused_s"] > 0 and job["max_celsius"] == 70.0
        assert job["last_pause"].startswith("paused all 2 ranks: ")
    table = cli("coordinator", "history", "--since", "1h")
    assert "agent run jobs" in table.stdout and "paused all 2 ranks" in table.stdout


PACED = {**HOT, "pause_temp": 85.0, "pace_temp": 71.0}
"""70 °C is over the set point (the cap less 2 °C): that Mac paces, the other is cool."""


def stops_seen(pids: list[int], seconds: float) -> list[list[float]]:
    """When each process entered state T (/proc/PID/stat), sampled every millisecond or so for
    `seconds` (a window to measure in, not a wait for a condition)."""
    starts: list[list[float]] = [[] for _ in pids]
    was = ["" for _ in pids]
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for i, pid in enumerate(pids):
            try:
                stat = Path(f"/proc/{pid}/stat").read_text()
            except OSError:
                continue
            state = stat[stat.rindex(")") + 2]
            if state == "T" and was[i] != "T":
                starts[i].append(time.monotonic())
            was[i] = state
        time.sleep(0.001)
    return starts


@pytest.mark.slow
def test_one_warm_mac_paces_every_rank_in_the_same_slices(
    two_macs: tuple[Mac, Mac], ranks: list[Rank], tmp_path: Path, ctx: zmq.Context
) -> None:
    warm, cool = two_macs
    start_stepping(two_macs, tmp_path, ranks)
    set_policy(ctx, warm, PACED)
    wait_until(
        lambda: all("paced all 2 ranks" in r.stderr() for r in ranks), 30, "both ranks paced",
        ranks,
    )  # fmt: skip
    pids = [job.pid for job in ring_jobs(ranks)]
    assert len(pids) == 2
    first, second = stops_seen(pids, 4.0)
    # five slices a second, each stopping both ranks: well under a second apart from the other
    assert len(first) >= 10 and len(second) >= 10, (first, second)
    skews = [min(abs(a - b) for b in second) for a in first]
    assert max(skews) <= LOCAL_EVERY_S, skews  # the gang rule's bound for a pause's skew
    steps = [r.steps() for r in ranks]
    wait_until(
        lambda: all(r.steps() > s for r, s in zip(ranks, steps, strict=True)), 30,
        "paced ranks still stepping", ranks,
    )  # fmt: skip
    set_policy(ctx, warm, {**COOL, "pace_temp": None})
    wait_until(
        lambda: all("ended the pacing of all 2 ranks" in r.stderr() for r in ranks), 30,
        "pacing ended on both ranks", ranks,
    )  # fmt: skip
    finish_cleanly(ranks, tmp_path)
    assert "(rank 0) at 70.0 °C" in ranks[1].stderr()


@pytest.mark.slow
def test_cooperative_ranks_pace_themselves_at_their_step_boundaries(
    two_macs: tuple[Mac, Mac], ranks: list[Rank], tmp_path: Path, ctx: zmq.Context
) -> None:
    warm, _ = two_macs
    start_stepping(two_macs, tmp_path, ranks, gate="step")

    jobs = ring_jobs(ranks)

    def busy() -> float:
        """The ranks' CPU seconds per second over a window (a measurement, not a wait): what
        heats a Mac; their step rate on this crowded machine moves with the contention."""
        before, began = sum(sum(p.cpu_times()[:2]) for p in jobs), time.monotonic()
        time.sleep(2.0)
        return (sum(sum(p.cpu_times()[:2]) for p in jobs) - before) / (time.monotonic() - began)

    full = busy()
    set_policy(ctx, warm, PACED)
    wait_until(
        lambda: all("paced all 2 ranks" in r.stderr() for r in ranks), 30, "both ranks paced",
        ranks,
    )  # fmt: skip
    steps = [r.steps() for r in ranks]
    paced, deadline = busy(), time.monotonic() + 60
    while paced >= 0.6 * full and time.monotonic() < deadline:
        paced = busy()  # the duty falls towards its floor at 70 °C over a 69 °C set point
    assert paced < 0.6 * full, (paced, full)  # resting between steps
    assert psutil.STATUS_STOPPED not in job_states(ranks[0]) | job_states(ranks[1])  # no signal
    wait_until(
        lambda: all(r.steps() > s for r, s in zip(ranks, steps, strict=True)), 30,
        "paced ranks still stepping", ranks,
    )  # fmt: skip
    set_policy(ctx, warm, {**COOL, "pace_temp": None})
    finish_cleanly(ranks, tmp_path)


@pytest.mark.slow
def test_a_cooperative_rank_that_computes_late_is_named_by_every_rank(
    two_macs: tuple[Mac, Mac], ranks: list[Rank], tmp_path: Path
) -> None:
    """Rank 1 sleeps 50 ms at each step (MLX_FLEET_INJECT=step-delay): each rank's `agent run`
    names it, from the compute and wait figures the step gates share (docs/distributed.md)."""
    delayed = {1: {"MLX_FLEET_INJECT": "step-delay:0.05"}}
    start_ranks(two_macs, tmp_path, steps=100000, into=ranks, gate="step", rank_env=delayed)
    wait_until(
        lambda: all("straggler rank 1 (127.0.0.3): compute" in r.stderr() for r in ranks), 60,
        "both ranks naming rank 1", ranks,
    )  # fmt: skip
    finish_soon(ranks, tmp_path)
    for rank in ranks:
        assert rank.process.wait(timeout=180) == 0, rank.stderr()
        named = next(line for line in rank.stderr().splitlines() if "straggler rank 1" in line)
        assert "rank 1 (127.0.0.3) computes" in named and "(injected: step-delay)" in named
        assert "straggler rank 0" not in rank.stderr()


@pytest.mark.slow
def test_a_stop_on_one_mac_ends_every_rank_with_75(
    two_macs: tuple[Mac, Mac], ranks: list[Rank], tmp_path: Path, ctx: zmq.Context
) -> None:
    hot, cool = two_macs
    start_stepping(two_macs, tmp_path, ranks)
    jobs = job_processes(ranks)
    set_policy(ctx, cool, BURNING)
    for rank in ranks:
        assert rank.process.wait(timeout=60) == 75, rank.stderr()
    for rank in ranks:
        assert "stopped all 2 ranks" in rank.stderr()
        assert "cannot tell" not in rank.stderr()  # ranks starting a moment apart is no fault
    assert [job.pid for job in jobs if alive(job)] == []


@pytest.mark.slow
def test_with_a_peer_agent_down_the_hot_mac_protects_itself_and_the_gang_comes_back(
    agents: AgentPool, two_macs: tuple[Mac, Mac], ranks: list[Rank], tmp_path: Path,
    ctx: zmq.Context,
) -> None:  # fmt: skip
    hot, cool = two_macs
    start_stepping(two_macs, tmp_path, ranks)
    port = cool.agent.port
    cool.agent.kill()
    set_policy(ctx, hot, HOT)
    wait_until(
        lambda: job_states(ranks[0]) == {psutil.STATUS_STOPPED}, 30, "the hot rank parked", ranks
    )
    wait_until(
        lambda: "cannot tell 127.0.0.3" in ranks[0].stderr(), 30, "the gang could not be told",
        ranks,
    )  # fmt: skip
    # The cool rank's own agent is gone, yet it asks the hot Mac's agent itself: it parks too.
    wait_until(
        lambda: job_states(ranks[1]) == {psutil.STATUS_STOPPED}, 30, "the cool rank parked", ranks
    )
    restarted = start_mac(agents, tmp_path, cool.address, port=port)
    assert restarted.agent.key == cool.agent.key  # same data dir, same key: still trusted
    wait_until(
        lambda: "127.0.0.3 answers again" in ranks[0].stderr(), 30, "the gang told again", ranks
    )
    set_policy(ctx, hot, COOL)
    finish_cleanly(ranks, tmp_path)


# --- bad input --------------------------------------------------------------------------------


def gang_body(group: str, rank: int, job: str = "peerjob") -> dict[str, object]:
    identity = GangIdentity(group, rank, 2, ("127.0.0.2", "127.0.0.3"), "ring")
    now = time.time()
    report = MemberState(rank, "mac", CoolingState.PAUSE, CoolingState.OK, 90.0, "smc", None,
                         now, job, heard=now)  # fmt: skip
    return {"gang": identity.to_wire(), "member": report.to_wire(now)}


def test_a_peer_cannot_report_into_a_group_no_rank_here_runs(
    agents: AgentPool, ctx: zmq.Context
) -> None:
    agent = trusted_agent(agents)
    with connect(ctx, agent) as client:
        with pytest.raises(AgentError, match="no rank of group ring-abc runs on this Mac") as err:
            client.request("gang.state", gang_body("ring-abc", 1))
        assert err.value.code == "forbidden"
        bad = gang_body("ring-abc", 1)
        bad["member"]["state"] = "melting"  # type: ignore[index]
        with pytest.raises(AgentError, match="member.state") as err:
            client.request("gang.state", bad)
        assert err.value.code == "bad-body"
    assert agent.log_text().count("refused a gang.state") == 1  # logged once, not per retry


@pytest.mark.slow
def test_a_peer_cannot_speak_for_the_local_rank(
    two_macs: tuple[Mac, Mac], ranks: list[Rank], tmp_path: Path, ctx: zmq.Context
) -> None:
    start_stepping(two_macs, tmp_path, ranks)
    wait_until(lambda: listed_gangs(ctx, two_macs[0]), 60, "rank 0's gang listed", ranks)
    group = json.loads((tmp_path / "hosts.json").read_text())
    identity = from_environment(
        {"MLX_RANK": "0", "MLX_HOSTFILE": "h"}, lambda path: json.dumps(group)
    )
    assert identity is not None
    with connect(ctx, two_macs[0].agent) as client:
        with pytest.raises(AgentError, match="is this Mac's: only its own agent run reports it"):
            client.request("gang.state", gang_body(identity.group, 0))
        # A trusted peer may report the other rank (the real rank 1's next report replaces it).
        members = client.request("gang.state", gang_body(identity.group, 1, "x"))["members"]
    assert {m["rank"] for m in members} == {0, 1}


@pytest.mark.parametrize(
    ("args", "problem"),
    [
        (["--group", "ft"], "--group needs --ranks"),
        (["--ranks", "2"], "--ranks and --rank-hosts need --group"),
        (["--group", "ft", "--ranks", "2", "--rank", "0"], "names 0 hosts for --ranks 2"),
        (["--group", "ft", "--ranks", "2", "--rank", "3", "--rank-hosts", "a,b"], "rank 3"),
        (["--group", "../etc", "--ranks", "2", "--rank", "0", "--rank-hosts", "a,b"], "bad group"),
    ],
)
@pytest.mark.slow
def test_bad_gang_options_are_one_line_and_exit_2(args: list[str], problem: str) -> None:
    done = subprocess.run(
        [console_script("agent"), "run", "--thermal-source", "none", *args, "--", "true"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert problem in done.stderr and "Traceback" not in done.stderr


def test_a_bad_hostfile_is_said_and_the_rank_runs_alone(tmp_path: Path) -> None:
    hostfile = tmp_path / "hosts.json"
    hostfile.write_text("[[oops")
    done = subprocess.run(
        [console_script("agent"), "run", "--thermal-source", "none", "--", "true"],
        capture_output=True, text=True, timeout=60,
        env=subprocess_env(MLX_RANK="0", MLX_HOSTFILE=str(hostfile)),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    warning = [line for line in done.stderr.splitlines() if "MLX_HOSTFILE" in line]
    assert len(warning) == 1 and "not JSON" in warning[0] and "alone" in warning[0]


def listed_gangs(ctx: zmq.Context, mac: Mac) -> list[dict[str, object]]:
    """The gangs the agent lists for its jobs (info.ok's jobs)."""
    with connect(ctx, mac.agent) as client:
        return [job["gang"] for job in client.request("info")["jobs"] if job.get("gang")]


@pytest.mark.slow
def test_two_jobs_cannot_be_one_rank(
    two_macs: tuple[Mac, Mac], ranks: list[Rank], tmp_path: Path, ctx: zmq.Context
) -> None:
    start_stepping(two_macs, tmp_path, ranks)
    # Rank 0 holds its group once its agent run reported (after its first sample).
    wait_until(lambda: listed_gangs(ctx, two_macs[0]), 60, "rank 0's gang listed", ranks)
    done = subprocess.run(
        [console_script("agent"), "run", "--", "true"], capture_output=True, text=True,
        timeout=60, env=subprocess_env(
            MLX_FLEET_HOME=str(two_macs[0].agent.home), MLX_RANK="0",
            MLX_HOSTFILE=str(tmp_path / "hosts.json"),
        ),
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "is already job" in done.stderr


def parked_steps(macs: tuple[Mac, Mac]) -> list[int]:
    """The step each cooperative rank parked at, from the `.parked` file beside its state file."""
    steps = []
    for mac in macs:
        for path in (mac.agent.home / "jobs").glob("*.cooling.json.parked"):
            try:
                steps.append(json.loads(path.read_text())["step"])
            except (OSError, ValueError):
                continue
    return steps


@pytest.mark.parametrize("gate", ["step", "scheduler"])
@pytest.mark.slow
def test_cooperative_ranks_park_at_the_same_step_boundary(
    gate: str, two_macs: tuple[Mac, Mac], ranks: list[Rank], tmp_path: Path, ctx: zmq.Context
) -> None:
    hot, cool = two_macs
    start_stepping(two_macs, tmp_path, ranks, gate=gate)
    set_policy(ctx, cool, HOT)
    wait_until(lambda: len(parked_steps(two_macs)) == 2, 30, "both ranks parked", ranks)
    first, second = parked_steps(two_macs)
    assert first == second  # the same step on every rank: no collective in flight
    parked = ring_jobs(ranks)
    assert {p.status() for p in parked} <= {psutil.STATUS_SLEEPING}  # parked, not SIGSTOPped
    cpu = [sum(p.cpu_times()[:2]) for p in parked]
    time.sleep(1.0)  # a window to measure that nothing spins, not a wait for a condition
    assert all(sum(p.cpu_times()[:2]) - before < 0.2 for p, before in zip(parked, cpu, strict=True))
    set_policy(ctx, cool, COOL)
    finish_cleanly(ranks, tmp_path)
    assert "paused with SIGSTOP" not in ranks[0].stderr() + ranks[1].stderr()


def test_the_monitor_gathers_a_distributed_job_into_one_row() -> None:
    cause = member(1, CoolingState.PAUSE).to_wire(100.0)
    gang = {"group": "ring-1", "rank": 0, "world": 3, "hosts": ["a", "b", "c"],
            "backend": "ring", "state": "pause", "cause": cause}  # fmt: skip
    listed = [
        ("mac1", [{"job": "a", "state": "paused", "kind": "run", "gang": gang}],
         {"celsius": 80.0, "source": "smc", "sensor": "TCMz"}),
        ("mac2", [{"job": "b", "state": "paused", "kind": "run", "gang": gang | {"rank": 1}}],
         {"celsius": 104.0, "source": "smc", "sensor": "TCMz"}),
        ("mac3", [{"job": "c", "state": "exited", "kind": "run", "gang": gang | {"rank": 2}}],
         {"celsius": 120.0, "source": "smc", "sensor": None}),
    ]  # fmt: skip
    (row,) = gang_rows(listed)
    assert row.ranks == {0: "mac1", 1: "mac2"} and row.state == "pause"
    assert row.hottest == (104.0, "mac2", "smc · TCMz")  # an exited rank is not in the job
    assert row.ranks_text() == "2/3 ranks (0:mac1, 1:mac2), 1 not monitored"
    assert row.cause_text() == "mac1 (rank 1) at 80.0 °C (smc · TCMz)"


def test_prometheus_carries_each_rank_and_the_state_its_gang_lives_under() -> None:
    from prometheus_client import generate_latest

    from shared.io.metrics import TelemetryMetrics

    metrics = TelemetryMetrics()
    gang = {"group": "ring-1", "rank": 1, "world": 2, "hosts": ["a", "b"], "backend": "ring",
            "state": "pause", "cause": None}  # fmt: skip
    sample = {"host": "mac2", "celsius": 70.0, "source": "smc", "state": "ok",
              "pause_s_total": 0.0, "storage_error": None,
              "jobs": [{"job": "j1", "state": "paused", "kind": "run", "gang": gang}]}  # fmt: skip
    metrics.observe_sample(sample)
    text = generate_latest(metrics.registry).decode()
    assert ('mlx_fleet_gang_state{backend="ring",group="ring-1",host="mac2",job="j1",rank="1",'
            'world="2"} 2.0') in text  # fmt: skip
    metrics.observe_sample(sample | {"jobs": []})
    assert "mlx_fleet_gang_state{" not in generate_latest(metrics.registry).decode()


ANSI = re.compile(r"\x1b\[[0-9;]*m")
"""mlx_lm's console colours its reports even into a file."""


def write_lora_job(directory: Path) -> None:
    """A tiny Llama (tests.test_model_dir's), a word-level tokenizer mlx-lm loads offline, and
    a few lines of data: enough for mlx_lm's lora to train on this CPU in seconds."""
    from tests.test_model_dir import TINY_LLAMA, write_model, write_tokenizer

    model, data = directory / "model", directory / "data"
    model.mkdir()
    data.mkdir()
    write_model(model, TINY_LLAMA)
    write_tokenizer(model, TINY_LLAMA["vocab_size"])
    for name, lines in (("train", 64), ("valid", 8)):
        text = "".join(
            json.dumps({"text": " ".join(f"w{(i * 7 + j) % 500 + 1}" for j in range(24))}) + "\n"
            for i in range(lines)
        )
        (data / f"{name}.jsonl").write_text(text)


@pytest.mark.slow
def test_a_distributed_mlx_lm_lora_parks_every_rank_at_one_step_and_finishes(
    two_macs: tuple[Mac, Mac], ranks: list[Rank], tmp_path: Path, ctx: zmq.Context
) -> None:
    pytest.importorskip("mlx_lm", reason="the `lm` extra (mlx-lm) is not installed")
    write_lora_job(tmp_path)
    hot, cool = two_macs
    lora = [sys.executable, "-m", "agent.cooling.mlx_lm_lora", "--model", "model", "--train",
            "--data", "data", "--iters", "1000", "--batch-size", "2", "--num-layers", "1",
            "--steps-per-report", "50", "--steps-per-eval", "100000", "--val-batches", "1",
            "--adapter-path", "adapters"]  # fmt: skip
    start_ranks(two_macs, tmp_path, steps=0, into=ranks, gate="lora", command=lora)
    stdout = tmp_path / "rank-0.stdout"
    # Not the heading (printed before the ranks' first step, which under load may be more than
    # PARK_TIMEOUT_S away): iteration 1's validation report, printed once the loop is stepping.
    stepping = re.compile(r"^\s*1\s+val\s", re.MULTILINE)
    wait_until(
        lambda: stepping.search(ANSI.sub("", stdout.read_text())), 180, "lora training", ranks
    )
    set_policy(ctx, hot, HOT)
    wait_until(lambda: len(parked_steps(two_macs)) == 2, 180, "both ranks parked", ranks)
    first, second = parked_steps(two_macs)
    assert first == second
    set_policy(ctx, hot, COOL)
    for rank in ranks:
        assert rank.process.wait(timeout=300) == 0, rank.stderr()
    assert (tmp_path / "adapters" / "adapters.safetensors").exists()
    assert "paused all 2 ranks" in ranks[1].stderr()


@pytest.mark.slow
def test_a_peer_agents_key_may_only_exchange_gang_states(
    two_macs: tuple[Mac, Mac], ctx: zmq.Context
) -> None:
    """mac1's agent key (every process of mac1's user holds it) is trusted by mac2 as a peer:
    it may say hello, ping, ask info and report gang states, never drive mac2's agent."""
    from shared.io.keys import own_keypair

    one, two = two_macs
    keypair = own_keypair(one.agent.home / "keys")
    with AgentClient(ctx, two.agent.address, two.agent.key, keypair, 5.0) as client:
        client.connect()
        assert client.request("info")["name"]
        with pytest.raises(AgentError, match="a peer agent's key") as refused:
            client.request("policy.set", {"policy": HOT})
        assert refused.value.code == "forbidden"
        with pytest.raises(AgentError, match="may send only gang.state, hello, info, ping"):
            client.request("job.list", {})


@pytest.mark.slow
def test_two_ranks_may_share_a_mac(
    agents: AgentPool, tmp_path: Path, ranks: list[Rank], ctx: zmq.Context
) -> None:
    """`mlx.launch -n 2` on one host: both ranks under one agent, one gang."""
    mac = start_mac(agents, tmp_path, "127.0.0.2")
    start_stepping((mac, mac), tmp_path, ranks)
    set_policy(ctx, mac, HOT)
    wait_until(
        lambda: all(job_states(r) == {psutil.STATUS_STOPPED} for r in ranks),
        30, "both ranks stopped (T)", ranks,
    )  # fmt: skip
    set_policy(ctx, mac, COOL)
    finish_cleanly(ranks, tmp_path)
    assert "is already" not in ranks[0].stderr() + ranks[1].stderr()


@pytest.mark.slow
def test_a_cooperative_gang_stop_ends_every_rank_at_a_step_boundary(
    two_macs: tuple[Mac, Mac], ranks: list[Rank], tmp_path: Path, ctx: zmq.Context
) -> None:
    """The job ends itself (GangStopped at one step on every rank), not SIGTERMed mid-step."""
    hot, cool = two_macs
    start_stepping(two_macs, tmp_path, ranks, gate="step")
    set_policy(ctx, cool, BURNING)
    for rank in ranks:
        assert rank.process.wait(timeout=90) == 75, rank.stderr()
        assert "GangStopped: thermal stop of every rank at step" in rank.stderr()


def test_a_summary_an_agent_wrote_is_checked_before_it_is_shown(tmp_path: Path) -> None:

    from coordinator.telemetry.job_history import job_summaries
    from coordinator.telemetry.store import TelemetryStore

    with TelemetryStore(tmp_path / "t.sqlite") as store:
        rows = [("mac1", 10.0, "summary", "j1", "{not json"),
                ("mac2", 11.0, "summary", "j2",
                 json.dumps({"wall_s": "1e9", "paused_s": 3.5, "max_source": 7})),
                ("mac2", 5.0, "pause", "j2", "paused all 2 ranks: mac2 at 90 °C")]  # fmt: skip
        store.conn.executemany(
            "INSERT INTO events (host, time, action, job, detail, source, simulated) "
            "VALUES (?, ?, ?, ?, ?, 'smc', 0)", rows,
        )  # fmt: skip
        bad, odd = job_summaries(store.conn, 0.0, None)
    assert not bad["readable"] and bad["wall_s"] is None
    assert odd["readable"] and odd["wall_s"] is None and odd["paused_s"] == 3.5
    assert odd["max_source"] is None and odd["last_pause"].startswith("paused all 2 ranks")
