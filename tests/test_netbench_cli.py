"""`coordinator netbench` end to end: real agents on loopback each start a rank through
rank.start, the CLI prints nccl-tests' figures per size and link, `-o json` for scripts; every
run is stored (a failed one with its error) and `coordinator runs`, `show` and `compare` read
it back; a host that is not there, or a rank that cannot form the ring, fails in one line with
nothing left running; bad input is one line, exit 2, before any host is asked."""

from __future__ import annotations

import csv
import io
import json
import sqlite3
import subprocess

import psutil
import pytest

from coordinator.reports.netbench import netbench_comparison_table, netbench_table
from tests.fleet_support import QUICK, AgentPool, cli, exchange_keys
from tests.ring_support import free_port_run
from tests.test_tables_fit import check_fit

SMALL = ["--sizes", "1K,64K", "-r", "2", "-w", "1"]


def started(agents: AgentPool, count: int) -> list[str]:
    names = []
    for index in range(count):
        agent = agents.start(f"agent{index}")
        exchange_keys(agent)
        names.append(agent.address)
    return names


def small_netbench(port: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`coordinator netbench ARGS` of SMALL, its ring on `port`: it must succeed."""
    result = cli("coordinator", "netbench", *args, *SMALL, "--port", port, timeout=600)
    assert result.returncode == 0, result.stderr
    return result


@pytest.mark.slow
def test_three_hosts_give_every_link_and_the_ring(agents: AgentPool) -> None:
    hosts = started(agents, 3)
    port = str(free_port_run(3))
    report = json.loads(small_netbench(port, "--hosts", ",".join(hosts), "-o", "json").stdout)
    assert report["hosts"] == hosts and report["backend"] == "ring"
    where = {(row["operation"], row["where"]) for row in report["results"]}
    ring = "+".join(hosts)
    links = {f"{hosts[0]}↔{hosts[1]}", f"{hosts[1]}↔{hosts[2]}", f"{hosts[2]}↔{hosts[0]}"}
    assert where == {("all_sum", ring)} | {("send_recv", link) for link in links}
    for row in report["results"]:
        assert row["busbw_gbps"] > 0 and len(row["seconds"]) == 2
    assert set(report["links_best_busbw_gbps"]) == links

    table = small_netbench(port, "--hosts", ",".join(hosts[:2]))
    assert "busbw GB/s" in table.stdout and "one link: no sibling" in table.stdout


@pytest.mark.slow
def test_a_host_that_is_not_there_fails_the_run_in_one_line(agents: AgentPool) -> None:
    (host,) = started(agents, 1)
    missing = f"127.0.0.1:{free_port_run(1)}"
    result = cli(
        "coordinator", "netbench", "--hosts", f"{host},{missing}", *SMALL, "--connect-timeout", "1"
    )
    assert result.returncode == 1
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith(f"error: {missing}: ")
    assert not ranks_running(agents)
    (listed,) = json.loads(cli("coordinator", "runs", "-o", "json").stdout)
    assert (listed["kind"], listed["status"]) == ("netbench", "failed")
    assert listed["id"] in result.stderr  # where it is kept, said before the error line
    stored = json.loads(cli("coordinator", "show", listed["id"], "-o", "json").stdout)
    assert "error: " + stored["error"] == line and stored["results"] == []
    assert [rank["status"] for rank in stored["ranks"]] == ["starting", "starting"]
    assert stored["ranks"][0]["machine"]["hostname"]  # what it got: the host that answered
    table = cli("coordinator", "show", listed["id"])
    assert table.returncode == 0 and "failed: " in table.stdout


@pytest.mark.slow
def test_runs_are_stored_shown_and_compared_like_benchmark_runs(agents: AgentPool) -> None:
    hosts = started(agents, 2)
    port = str(free_port_run(2))
    made = []
    for _ in range(2):
        result = small_netbench(port, "--hosts", ",".join(hosts), "-o", "json")
        made.append(json.loads(result.stdout))
        assert f"run {made[-1]['run_id']} stored" in result.stderr
    a, b = made
    listed = json.loads(cli("coordinator", "runs", "-o", "json").stdout)
    assert [(run["id"], run["kind"], run["ok"]) for run in listed] == [
        (b["run_id"], "netbench", 4),  # newest first; a cell per operation, link and size
        (a["run_id"], "netbench", 4),
    ]
    assert "netbench" in cli("coordinator", "runs").stdout

    shown = cli("coordinator", "show", a["run_id"], "-o", "json")
    assert json.loads(shown.stdout) == a  # exactly what netbench printed
    table = cli("coordinator", "show", a["run_id"])
    assert "busbw GB/s" in table.stdout and "one link: no sibling" in table.stdout
    rows = list(
        csv.DictReader(io.StringIO(cli("coordinator", "show", a["run_id"], "-o", "csv").stdout))
    )
    assert [float(row["busbw_gbps"]) for row in rows] == [r["busbw_gbps"] for r in a["results"]]
    sql = cli("coordinator", "show", a["run_id"], "-o", "sql").stdout
    with sqlite3.connect(":memory:") as db:
        db.executescript(sql)
        assert db.execute("SELECT COUNT(*) FROM mlx_fleet_netbench").fetchone()[0] == 4
    markdown = cli("coordinator", "show", a["run_id"], "-o", "md").stdout
    assert "| operation | over | size |" in markdown
    jsonl = cli("coordinator", "show", a["run_id"], "-o", "jsonl").stdout.splitlines()
    assert [json.loads(line)["size"] for line in jsonl] == [r["size"] for r in a["results"]]

    compared = json.loads(
        cli("coordinator", "compare", a["run_id"], b["run_id"], "-o", "json").stdout
    )
    assert len(compared["rows"]) == 4
    for row, first, second in zip(compared["rows"], a["results"], b["results"], strict=True):
        assert (row["operation"], row["over"], row["size"]) == (
            first["operation"], first["where"], first["size"]
        )  # fmt: skip
        assert row["speedup"] == pytest.approx(second["busbw_gbps"] / first["busbw_gbps"])
        assert isinstance(row["within_noise"], bool)  # two repetitions: an interval each
    assert "B/A" in cli("coordinator", "compare", a["run_id"], b["run_id"]).stdout
    for table in (
        netbench_comparison_table(compared["rows"], a["run_id"], b["run_id"]),
        netbench_table(a),
    ):  # readable at 80 columns: every figure and ratio whole on its line
        lines = check_fit(table, 80)
        assert max(map(len, lines)) <= 80
    for fmt in ("csv", "md"):
        assert cli("coordinator", "compare", a["run_id"], b["run_id"], "-o", fmt).returncode == 0

    benchmark = cli("coordinator", "benchmark", "--hosts", hosts[0], *QUICK, "-o", "json")
    assert benchmark.returncode == 0, benchmark.stderr
    bench_id = json.loads(benchmark.stdout)["run_id"]
    refused = cli("coordinator", "compare", a["run_id"], bench_id)
    assert refused.returncode == 2
    assert refused.stderr.strip() == (
        f"error: {a['run_id']} is a netbench run and {bench_id} a benchmark run: compare two "
        "benchmark runs or two netbench runs"
    )


def ranks_running(agents: AgentPool) -> list[psutil.Process]:
    """The link benchmark's rank processes that `agents` (this test's) started, even those whose
    agent is gone: known by the MLX_FLEET_HOME their agent passed on, so that the ranks of tests
    running beside this one (xdist) are not counted."""
    homes = {str(agent.home) for agent in agents.agents}
    found = []
    for process in psutil.process_iter(["cmdline", "environ"]):
        if "agent.cluster.netbench" in " ".join(process.info["cmdline"] or []) and (
            (process.info["environ"] or {}).get("MLX_FLEET_HOME") in homes
        ):
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
@pytest.mark.slow
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


@pytest.mark.slow
def test_jaccl_on_hosts_that_lack_it_is_refused_before_any_rank(
    tmp_path, agents: AgentPool
) -> None:
    hostfile, _ = jaccl_hostfile(tmp_path, agents)
    result = cli("coordinator", "netbench", "--hostfile", hostfile, *SMALL, "--backend", "jaccl")
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "no jaccl backend (JACCL needs macOS 26.2" in lines[0]
    assert not ranks_running(agents)


@pytest.mark.slow
def test_auto_runs_the_ring_where_jaccl_cannot(tmp_path, agents: AgentPool) -> None:
    hostfile, addresses = jaccl_hostfile(tmp_path, agents)
    port = str(free_port_run(2))
    result = small_netbench(port, "--hostfile", hostfile, "-o", "json")
    assert json.loads(result.stdout)["backend"] == "ring"


def test_jaccl_without_rdma_devices_is_one_line() -> None:
    result = cli("coordinator", "netbench", "--hosts", "a,b", "--backend", "jaccl")
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "error: --backend jaccl: no RDMA devices given for a:5555, b:5555: use a hostfile in "
        "mlx.launch's form with `rdma` for every host (docs/distributed.md)"
    )


@pytest.mark.slow
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
    while len(ranks_running(agents)) < 2:
        assert run.poll() is None and time.monotonic() < deadline, (
            run.stderr.read() if run.stderr else ""
        )
        time.sleep(0.1)
    second.kill()  # SIGKILL: its rank ends by its lifeline, the coordinator finds it gone
    _, stderr = run.communicate(timeout=300)
    assert run.returncode == 1, stderr
    assert stderr.strip().splitlines()[-1].startswith(f"error: {second.address}: ")
    gone = time.monotonic() + 60
    while ranks_running(agents):
        assert time.monotonic() < gone, ranks_running(agents)
        time.sleep(0.1)


def test_a_ranks_error_in_the_caption_is_never_markup() -> None:
    """Issue 42: a rank's error (an agent's words) reached the caption as Rich markup: `[/]`
    raised MarkupError, `[bold]` vanished."""
    import io

    from rich.console import Console

    from coordinator.reports.netbench import netbench_table

    said = "rank 1 ended with exit 1: [/] [bold red]LOUD [link=file:///etc/passwd]x"
    report = {
        "backend": "ring",
        "title": "[reverse]MARKUP[/reverse] run",
        "results": [],
        "slow_links": {},
        "links_best_busbw_gbps": {},
        "error": said,
    }
    out = io.StringIO()
    Console(file=out, width=200).print(netbench_table(report))
    drawn = out.getvalue()  # the caption wraps at the table's width
    assert "[/] [bold red]LOUD" in drawn and "[link=file:///etc/passwd]x" in drawn
    assert "[reverse]MARKUP[/reverse] run" in drawn
