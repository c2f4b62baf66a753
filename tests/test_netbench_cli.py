"""`coordinator netbench` end to end: real agents on loopback each start a rank through
rank.start, the CLI prints nccl-tests' figures per size and link, `-o json` for scripts; a
host that is not there, or a rank that cannot form the ring, fails in one line with nothing
left running; bad input is one line, exit 2, before any host is asked."""

from __future__ import annotations

import json

import psutil
import pytest

from tests.fleet_support import AgentPool, cli, exchange_keys
from tests.ring_support import free_port_run

SMALL = ["--sizes", "1K,64K", "-r", "2", "-w", "1"]


def started(agents: AgentPool, count: int) -> list[str]:
    names = []
    for index in range(count):
        agent = agents.start(f"agent{index}")
        exchange_keys(agent)
        names.append(agent.address)
    return names


def test_three_hosts_give_every_link_and_the_ring(agents: AgentPool) -> None:
    hosts = started(agents, 3)
    port = str(free_port_run(3))
    result = cli(
        "coordinator",
        "netbench",
        "--hosts",
        ",".join(hosts),
        *SMALL,
        "--port",
        port,
        "-o",
        "json",
        timeout=600,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["hosts"] == hosts and report["backend"] == "ring"
    where = {(row["operation"], row["where"]) for row in report["results"]}
    ring = "+".join(hosts)
    links = {f"{hosts[0]}↔{hosts[1]}", f"{hosts[1]}↔{hosts[2]}", f"{hosts[2]}↔{hosts[0]}"}
    assert where == {("all_sum", ring)} | {("send_recv", link) for link in links}
    for row in report["results"]:
        assert row["busbw_gbps"] > 0 and len(row["seconds"]) == 2
    assert set(report["links_best_busbw_gbps"]) == links

    table = cli(
        "coordinator",
        "netbench",
        "--hosts",
        ",".join(hosts[:2]),
        *SMALL,
        "--port",
        port,
        timeout=600,
    )
    assert table.returncode == 0, table.stderr
    assert "busbw GB/s" in table.stdout and "one link: no sibling" in table.stdout


def test_a_host_that_is_not_there_fails_the_run_in_one_line(agents: AgentPool) -> None:
    (host,) = started(agents, 1)
    missing = f"127.0.0.1:{free_port_run(1)}"
    result = cli(
        "coordinator", "netbench", "--hosts", f"{host},{missing}", *SMALL, "--connect-timeout", "2"
    )
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1].startswith(f"error: {missing}: ")
    assert not ranks_running()


def ranks_running() -> list[psutil.Process]:
    found = []
    for process in psutil.process_iter(["cmdline"]):
        if "agent.cluster.netbench" in " ".join(process.info["cmdline"] or []):
            found.append(process)
    return found


@pytest.mark.parametrize(
    ("args", "problem"),
    [
        (["--hosts", "a"], "netbench needs two or more hosts"),
        (
            ["--hosts", "a,b", "--sizes", "1M,1K"],
            "--sizes: sizes must increase: 1 KiB follows 1 MiB",
        ),
        (["--hosts", "a,b", "--sizes", "2G"], "--sizes: size 2 GiB is outside 4 B … 1 GiB"),
        (["--hosts", "a,b", "--backend", "mpi"], "--backend 'mpi': choose from ring, jaccl, auto"),
        (["--hosts", "a,b", "--port", "65534", "--sizes", "1K"], None),
        (["--hosts", "a,b,c", "--port", "65534"], "3 hosts would run past port 65535"),
    ],
)
def test_bad_input_is_one_line_before_any_host_is_asked(
    args: list[str], problem: str | None
) -> None:
    result = cli("coordinator", "netbench", *args, "--connect-timeout", "1")
    if problem is None:  # in range: it goes on to the hosts, which are not there
        assert result.returncode == 1
        return
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and problem in lines[0], result.stderr


def jaccl_hostfile(tmp_path, agents: AgentPool) -> tuple[str, list[str]]:
    """Two real agents in a hostfile in mlx.launch's form, RDMA devices included."""
    entries, addresses = [], []
    for index, rdma in enumerate(([None, "rdma_en3"], ["rdma_en3", None])):
        agent = agents.start(f"jaccl{index}")
        exchange_keys(agent)
        entries.append(
            {"ssh": f"mac{index}", "ips": ["127.0.0.1"], "port": agent.port, "rdma": rdma}
        )
        addresses.append(agent.address)
    path = tmp_path / "hosts.json"
    path.write_text(json.dumps(entries))
    return str(path), addresses


def test_jaccl_on_hosts_that_lack_it_is_refused_before_any_rank(
    tmp_path, agents: AgentPool
) -> None:
    hostfile, _ = jaccl_hostfile(tmp_path, agents)
    result = cli("coordinator", "netbench", "--hostfile", hostfile, *SMALL, "--backend", "jaccl")
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "no jaccl backend (JACCL needs macOS 26.2" in lines[0]
    assert not ranks_running()


def test_auto_runs_the_ring_where_jaccl_cannot(tmp_path, agents: AgentPool) -> None:
    hostfile, addresses = jaccl_hostfile(tmp_path, agents)
    port = str(free_port_run(2))
    result = cli(
        "coordinator",
        "netbench",
        "--hostfile",
        hostfile,
        *SMALL,
        "--port",
        port,
        "-o",
        "json",
        timeout=600,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["backend"] == "ring"


def test_jaccl_without_rdma_devices_is_one_line() -> None:
    result = cli("coordinator", "netbench", "--hosts", "a,b", "--backend", "jaccl")
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "error: --backend jaccl: no RDMA devices given for a:5555, b:5555: use a hostfile in "
        "mlx.launch's form with `rdma` for every host (docs/distributed.md)"
    )


def test_an_agent_killed_mid_run_fails_it_and_leaves_no_rank(agents: AgentPool) -> None:
    import subprocess
    import time

    from tests.conftest import console_script, subprocess_env

    first, second = agents.start("first"), agents.start("second")
    for agent in (first, second):
        exchange_keys(agent)
    run = subprocess.Popen(
        [console_script("coordinator"), "netbench", "--hosts", f"{first.address},{second.address}",
         "--sizes", "4M,16M,64M", "-r", "1000", "--port", str(free_port_run(2))],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=subprocess_env(),
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while len(ranks_running()) < 2:
        assert run.poll() is None and time.monotonic() < deadline, (
            run.stderr.read() if run.stderr else ""
        )
        time.sleep(0.1)
    second.kill()  # SIGKILL: its rank ends by its lifeline, the coordinator finds it gone
    _, stderr = run.communicate(timeout=300)
    assert run.returncode == 1, stderr
    assert stderr.strip().splitlines()[-1].startswith(f"error: {second.address}: ")
    gone = time.monotonic() + 60
    while ranks_running():
        assert time.monotonic() < gone, ranks_running()
        time.sleep(0.1)
