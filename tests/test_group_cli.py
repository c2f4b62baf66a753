"""A group that cannot run is bad input: one line naming the group, the member and why, exit 2,
nothing on stdout, and no job started on any agent (real agents on loopback, asked by the real
`coordinator benchmark` before the run: coordinator/commands/group_check.py)."""

from __future__ import annotations

import json
import socket
import subprocess
from pathlib import Path

import pytest

from coordinator.commands.group_check import GroupPlan, GroupRefused, _Answer, checked_backend
from coordinator.hosts.link import Target
from coordinator.runs.group_driver import GroupTarget
from shared.distributed.rank_env import Member
from tests.fleet_support import AgentPool, AgentProcess
from tests.group_support import insecure_benchmark, wait_for_no_rank
from tests.ring_support import free_port_run
from tests.test_model_shard import TINY, write_model_dir

QUICK = ["--config-small", "-p", "16", "-n", "4", "-r", "1", "-w", "0"]


def coordinator(*args: str) -> subprocess.CompletedProcess[str]:
    """`coordinator benchmark --insecure` that waits up to 30 s for each member's first reply
    (a later --connect-timeout in `args` wins): every member here is up, and on a loaded full run
    one took past the default 5 s, so a refusal read as a failed host (exit 1)."""
    return insecure_benchmark("--connect-timeout", "30", *args)


def refused(done: subprocess.CompletedProcess[str]) -> str:
    """The one line of a refusal, checked: exit 2, nothing on stdout, no traceback."""
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stdout == ""
    lines = [line for line in done.stderr.splitlines() if line and not line.startswith("WARN")]
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    return lines[0]


def no_job_ran(*agents: AgentProcess) -> None:
    for agent in agents:
        assert agent.journal_cells() == 0
        assert "job j-" not in agent.log_text()


@pytest.fixture
def two(agents: AgentPool) -> tuple[AgentProcess, AgentProcess]:
    return agents.start("a", insecure=True), agents.start("b", insecure=True)


@pytest.mark.slow
def test_a_backend_the_members_lack_is_named(two: tuple[AgentProcess, AgentProcess]) -> None:
    a, b = two
    line = refused(coordinator("--hosts", f"{a.address}+{b.address}", "--backend", "jaccl", *QUICK))
    assert line.startswith(f"error: {a.address}+{b.address}: --backend jaccl: ")
    assert "no jaccl backend" in line and "macOS 26.2" in line
    no_job_ran(a, b)


@pytest.mark.slow
def test_a_ring_port_another_ring_holds_is_named(two: tuple[AgentProcess, AgentProcess]) -> None:
    """Two rings on one port would join each other's ranks (MLX listens with SO_REUSEPORT,
    mlx/distributed/utils.cpp): the member whose port is held refuses the group before any job."""
    a, b = two
    port = free_port_run(2)
    with socket.socket() as other_ring:
        other_ring.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        other_ring.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        other_ring.bind(("127.0.0.1", port + 1))  # rank 1's: b's
        other_ring.listen()
        group = f"{a.address}+{b.address}"
        line = refused(coordinator("--hosts", group, "--port", str(port), *QUICK))
    assert line.startswith(f"error: {group}: {b.address}: bench.start: group: "), line
    assert f"port 127.0.0.1:{port + 1} is in use on this machine" in line
    no_job_ran(a, b)


@pytest.mark.slow
def test_a_model_that_cannot_split_over_the_group_is_named(agents: AgentPool) -> None:
    a, b, c = (agents.start(name, insecure=True) for name in "abc")
    group = "+".join(agent.address for agent in (a, b, c))
    line = refused(coordinator("--hosts", f"{a.address},{group}", *QUICK))
    assert f"{group}: {a.address}: matrix rejected: " in line
    assert "models[0] small" in line and "do not split evenly over 3 ranks" in line
    no_job_ran(a, b, c)


@pytest.mark.slow
def test_a_sharding_the_model_dir_lacks_is_named(agents: AgentPool, tmp_path: Path) -> None:
    model = write_model_dir(tmp_path / "llama", {**TINY, "model_type": "llama"})
    a, b = agents.start("a", insecure=True), agents.start("b", insecure=True)
    group = f"{a.address}+{b.address}"
    line = refused(
        coordinator(
            "--hosts", group, "--model", str(model), "--sharding", "pipeline", "-p", "16",
            "-n", "4", "-r", "1", "-w", "0",
        )
    )  # fmt: skip
    assert line.startswith(f"error: {group}: {a.address}: matrix rejected: models[0] ")
    assert "pipeline" in line
    no_job_ran(a, b)


@pytest.mark.slow
def test_members_holding_different_weights_are_named(agents: AgentPool, tmp_path: Path) -> None:
    """The same --model path, ~/tiny, is another model on each member (each agent's HOME)."""
    homes = {name: tmp_path / f"home-{name}" for name in "ab"}
    for name, width in (("a", 128), ("b", 256)):
        homes[name].mkdir()
        write_model_dir(homes[name] / "tiny", {**TINY, "model_type": "llama", "hidden_size": width})
    a, b = (
        agents.start(name, insecure=True, wrapper=["env", f"HOME={homes[name]}"]) for name in "ab"
    )
    group = f"{a.address}+{b.address}"
    line = refused(coordinator("--hosts", group, "--model", "~/tiny", "-p", "16", "-n", "4"))
    assert f"{group}: its members hold different weights for ~/tiny" in line
    assert f"{a.address} listing:" in line and f"{b.address} listing:" in line
    no_job_ran(a, b)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--hosts", "127.0.0.1:1,127.0.0.1:1+"], "a group joins two or more hosts with +"),
        (["--hosts", "127.0.0.1:1+127.0.0.1:1"], "a group lists 127.0.0.1:1 twice"),
        (["--sharding", "data"], "unknown sharding 'data'; choose from tensor, pipeline"),
        (["--backend", "mpi"], "--backend 'mpi': choose from ring, jaccl, auto"),
        (["--sustain", "1m"], "--sustain: a group's cells do not run sustained"),
    ],
)
@pytest.mark.slow
def test_a_bad_group_option_is_one_line(args: list[str], message: str) -> None:
    hosts = [] if "--hosts" in args else ["--hosts", "127.0.0.1:1,127.0.0.1:1+127.0.0.1:2"]
    assert message in refused(coordinator(*hosts, *args, *QUICK))


def test_members_on_different_mlx_are_refused() -> None:
    """No two MLX versions are installed here: the rule, on the members' `info` machines."""
    hosts = (Target("a", "10.0.0.1:5555", None), Target("b", "10.0.0.2:5555", None))
    group = GroupTarget(
        hosts, (Member("a", ("10.0.0.1",)), Member("b", ("10.0.0.2",))), "auto", "tensor", 32323, 60
    )
    plan = GroupPlan("auto", "tensor", 32323, 30.0)
    answers = [
        _Answer(machine={"mlx_version": "0.32.4"}),
        _Answer(machine={"mlx_version": "0.31.1"}),
    ]
    with pytest.raises(
        GroupRefused, match=r"a\+b: its members run different MLX \(a 0.32.4, b 0.31.1\)"
    ):
        checked_backend(group, answers, plan)
    alike = [_Answer(machine={"mlx_version": "0.32.4"})] * 2
    assert checked_backend(group, alike, plan) == "ring"
    unreachable = [alike[0], _Answer(unreachable="no reply")]
    assert checked_backend(group, unreachable, plan) == "ring"  # the run names it, not bad input


@pytest.mark.slow
def test_a_group_runs_an_mlx_lm_directory_through_sharded_load(
    agents: AgentPool, tmp_path: Path
) -> None:
    """--model DIR on a group: each rank loads its share through mlx_lm's sharded_load, and the
    split model predicts and decodes the tokens a member does alone."""
    model = write_model_dir(tmp_path / "qwen2", {**TINY, "model_type": "qwen2"})
    a, b = agents.start("a", insecure=True), agents.start("b", insecure=True)
    for sharding in ("tensor", "pipeline"):
        group = f"{a.address}+{b.address}"
        done = coordinator(
            "--hosts", f"{a.address},{group}", "--model", str(model), "--sharding", sharding,
            "-p", "16", "-n", "4", "-r", "1", "-w", "0", "-o", "json",
        )  # fmt: skip
        assert done.returncode in (0, 1), done.stderr  # 1: a cell of one repetition is noisy
        cells = json.loads(done.stdout)["cells"]
        split = [c for c in cells if c["host"] == group]
        assert len(split) == 2 and all(c["status"] == "ok" for c in split), split
        assert all(c["tokens_check"] == f"same as {a.address}" for c in split)
        assert {c["group"]["sharding"] for c in split} == {sharding}


@pytest.mark.slow
def test_a_member_unreachable_at_start_fails_its_group_and_the_hosts_go_on(
    agents: AgentPool,
) -> None:
    a = agents.start("a", insecure=True)
    with socket.socket() as closed:  # a port nothing listens on once this closes
        closed.bind(("127.0.0.1", 0))
        gone = f"127.0.0.1:{closed.getsockname()[1]}"
    group = f"{a.address}+{gone}"
    done = coordinator(
        "--hosts", f"{a.address},{group}", "--connect-timeout", "1", *QUICK, "-o", "json"
    )
    assert done.returncode == 1, done.stderr
    report = json.loads(done.stdout)
    alone = [c for c in report["cells"] if c["host"] == a.address]
    assert len(alone) == 2 and all(c["status"] == "ok" for c in alone)
    failed = next(h for h in report["hosts"] if h["host"] == group)
    assert failed["status"] == "failed" and failed["error"].startswith(f"{gone}: "), failed
    cells = [c for c in report["cells"] if c["host"] == group]
    assert cells and all(c["status"] != "ok" for c in cells)
    assert cells[0]["error"].startswith(f"rank 1 ({gone}): ")
    wait_for_no_rank({"a": a}, within=60)
