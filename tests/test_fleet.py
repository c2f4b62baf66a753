"""`coordinator benchmark` and `coordinator status` end to end: real agents on loopback, keys
exchanged with the real commands, the real console scripts."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from shared.benchmark.verdict import separated
from tests.conftest import console_script, interrupt, piped, subprocess_env
from tests.fleet_support import LONG, QUICK, AgentPool, cli, exchange_keys

pytestmark = pytest.mark.timeout(90)


def benchmark(*args: str) -> subprocess.CompletedProcess[str]:
    return cli("coordinator", "benchmark", *args)


def cells_of(report: dict, host: str) -> list[dict]:
    return [c for c in report["cells"] if c["host"] == host]


def host_entry(report: dict, host: str) -> dict:
    return next(h for h in report["hosts"] if h["host"] == host)


@pytest.mark.slow
def test_two_agents_return_every_cell_in_one_report(agents: AgentPool) -> None:
    first, second = agents.start("mac1"), agents.start("mac2")
    exchange_keys(first)
    exchange_keys(second)
    result = benchmark("--hosts", f"{first.address},{second.address}", *QUICK, "--format", "json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    for agent in (first, second):
        host = host_entry(report, agent.address)
        assert host["status"] == "ok" and host["error"] is None
        assert host["machine"]["mlx_version"] and host["models"][0]["label"] == "small/f16"
        cells = cells_of(report, agent.address)
        assert [c["test"] for c in cells] == ["pp16", "tg4"]
        assert all(c["status"] == "ok" and c["tokens_per_sec"] > 0 for c in cells)
    fastest = [c for c in report["cells"] if c.get("fastest")]
    # two agents on one machine: a host is the fastest only where its interval separates
    for winner in fastest:
        rivals = [c for c in report["cells"] if c["name"] == winner["name"] and c is not winner]
        assert rivals and all(separated(winner, rival) for rival in rivals)
    assert all(c["verdict"] in ("valid", "invalid") for c in report["cells"])
    stored = cli("coordinator", "show", report["run_id"], "--format", "json")
    assert json.loads(stored.stdout)["cells"] == report["cells"]


@pytest.mark.slow
def test_the_embedded_agent_is_the_default(fleet_home: Path) -> None:
    result = benchmark("--config-small", "-s", "32,64", "-n", "8", "-d", "0,32", "-i", "1")
    assert result.returncode == 0, result.stderr
    for text in ("local", "pp32", "pp64", "tg8", "pp64 @ d32", "tg8 @ d32", "tok/s", "SoC °C"):
        assert text in result.stdout
    assert result.stdout.count("\n│ local") == 6
    log = (fleet_home / "embedded-agent" / "agent.log").read_text()
    assert "stopped" in log  # the local agent was stopped, not left running


@pytest.mark.slow
def test_an_untrusted_coordinator_is_told_which_host_refused(agents: AgentPool) -> None:
    trusting, refusing = agents.start("mac1"), agents.start("mac2")
    exchange_keys(trusting)
    agent_key = cli("agent", "keys", "show", home=refusing.home).stdout.strip()
    cli("coordinator", "keys", "add", refusing.address, agent_key)
    began = time.monotonic()
    result = benchmark(
        "--hosts", f"{trusting.address},{refusing.address}", *QUICK, "--format", "json"
    )
    assert result.returncode == 1
    assert f"{refusing.address}: refused our key" in result.stderr
    report = json.loads(result.stdout)
    assert "does not trust this coordinator" in host_entry(report, refusing.address)["error"]
    assert len(cells_of(report, trusting.address)) == 2
    assert cells_of(report, refusing.address) == []
    assert time.monotonic() - began < 30
    assert "refused a coordinator" in refusing.log_text()


@pytest.mark.slow
def test_sigkill_mid_run_keeps_the_other_host_and_the_finished_cells(agents: AgentPool) -> None:
    survivor, victim = agents.start("mac1"), agents.start("mac2")
    exchange_keys(survivor)
    exchange_keys(victim)
    coordinator = piped(
        [
            console_script("coordinator"),
            "benchmark",
            "--hosts",
            f"{survivor.address},{victim.address}",
            *LONG,
            "--host-timeout",
            "2",
            "--format",
            "json",
        ],
    )
    try:
        victim.wait_for_coordinator_cells(coordinator, 1)
        victim.kill()
        out, err = coordinator.communicate(timeout=60)
    finally:
        coordinator.kill()
    assert coordinator.returncode == 1, err
    report = json.loads(out)
    survived = cells_of(report, survivor.address)
    assert len(survived) == 8 and all(c["status"] == "ok" for c in survived)
    assert host_entry(report, survivor.address)["status"] == "ok"
    killed = [c for c in cells_of(report, victim.address) if c["status"] == "ok"]
    assert 1 <= len(killed) < 8
    not_run = [c for c in cells_of(report, victim.address) if c["status"] == "not run"]
    assert len(killed) + len(not_run) == 8
    error = host_entry(report, victim.address)["error"]
    assert error.startswith("unreachable for ") and "its job may still run" in error, error
    assert all(c["error"] == error for c in not_run)
    assert f"coordinator resume {report['run_id']}" in err


@pytest.mark.slow
def test_an_unreachable_host_is_reported_and_the_others_go_on(agents: AgentPool) -> None:
    live, gone = agents.start("mac1"), agents.start("mac2")
    exchange_keys(live)
    exchange_keys(gone)
    gone.kill()
    began = time.monotonic()
    result = benchmark(
        "--hosts",
        f"{live.address},{gone.address}",
        *QUICK,
        "--connect-timeout",
        "1",
        "--format",
        "json",
    )
    assert result.returncode == 1
    report = json.loads(result.stdout)
    assert "connection refused" in host_entry(report, gone.address)["error"]
    assert len(cells_of(report, live.address)) == 2
    assert time.monotonic() - began < 30


@pytest.mark.slow
def test_a_hostfile_carries_the_keys(agents: AgentPool, tmp_path: Path) -> None:
    agent = agents.start("mac1")
    coordinator_key = cli("coordinator", "keys", "show").stdout.strip()
    cli("agent", "keys", "trust", coordinator_key, home=agent.home)
    host, port = agent.address.rsplit(":", 1)
    hostfile = tmp_path / "hosts.toml"
    hostfile.write_text(f'[[hosts]]\nhost = "{host}"\nport = {port}\nkey = "{agent.key}"\n')
    result = benchmark("--hostfile", str(hostfile), *QUICK, "--format", "jsonl")
    assert result.returncode == 0, result.stderr
    assert len(result.stdout.splitlines()) == 2


def test_a_malformed_hostfile_exits_2_naming_file_and_entry(tmp_path: Path) -> None:
    hostfile = tmp_path / "hosts.json"
    hostfile.write_text(json.dumps([{"host": "mac1"}, {"host": "mac2", "port": "http"}]))
    result = benchmark("--hostfile", str(hostfile), *QUICK)
    assert result.returncode == 2
    assert f"{hostfile}: entry 2 " in result.stderr and "bad port 'http'" in result.stderr


@pytest.mark.slow
def test_the_agents_reason_for_rejecting_a_matrix_reaches_the_user(agents: AgentPool) -> None:
    agent = agents.start("mac1")
    exchange_keys(agent)
    result = benchmark(
        "--hosts",
        agent.address,
        "--model",
        "/models/not-on-this-mac",
        "-s",
        "16",
        "--format",
        "json",
    )
    assert result.returncode == 1
    error = host_entry(json.loads(result.stdout), agent.address)["error"]
    assert "/models/not-on-this-mac does not exist" in error


@pytest.mark.slow
def test_status_reports_reachable_and_unreachable_agents(agents: AgentPool) -> None:
    simulated, gone = agents.start("mac1", thermal="sim"), agents.start("mac2")
    exchange_keys(simulated)
    exchange_keys(gone)
    gone.kill()
    result = cli("coordinator", "status", "--format", "json", "--connect-timeout", "1")
    assert result.returncode == 1
    rows = {row["host"]: row for row in json.loads(result.stdout)}
    up = rows[simulated.address]
    assert up["reachable"] and up["agent"] and up["device"] and up["memory_gb"] > 0
    assert up["thermal_source"] == "sim" and up["simulated"] is True
    assert up["sensor"] is None  # the model names no sensor
    assert isinstance(up["celsius"], float) and up["job"] is None
    down = rows[gone.address]
    assert not down["reachable"] and "connection refused" in down["error"]
    table = cli("coordinator", "status", "--hosts", simulated.address)
    assert table.returncode == 0, table.stderr
    assert "(simulated)" in table.stdout and "idle" in table.stdout


@pytest.mark.slow
def test_ctrl_c_cancels_the_jobs_and_keeps_what_arrived(agents: AgentPool) -> None:
    agent = agents.start("mac1")
    exchange_keys(agent)
    coordinator = piped(
        [
            console_script("coordinator"),
            "benchmark",
            "--hosts",
            agent.address,
            *LONG,
            "--format",
            "json",
        ],
    )
    try:
        agent.wait_for_coordinator_cells(coordinator, 1)
        out, err = interrupt(coordinator, signal.SIGINT, 60)
    finally:
        coordinator.kill()
    report = json.loads(out)
    assert report["interrupted"] is True
    measured = [c for c in report["cells"] if c["status"] == "ok"]
    assert 1 <= len(measured) < 8
    unmeasured = [c for c in report["cells"] if c["status"] == "not run"]
    assert len(measured) + len(unmeasured) == 8  # every cell is listed, what was cut says why
    assert all("cancelled" in c["error"] for c in unmeasured)
    assert "cancelled" in host_entry(report, agent.address)["error"]
    assert "cancelled" in agent.log_text()
    assert "every job was asked to stop; `coordinator resume" in err, err  # issue 42
    assert "may still" not in err


@pytest.mark.slow
def test_the_embedded_agent_does_not_outlive_a_killed_coordinator(fleet_home: Path) -> None:
    coordinator = subprocess.Popen(
        [console_script("coordinator"), "benchmark", *LONG, "--format", "json"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=subprocess_env(),
    )
    state = fleet_home / "embedded-agent" / "agent-serve.json"
    deadline = time.monotonic() + 60
    while not state.exists():
        assert time.monotonic() < deadline and coordinator.poll() is None
        time.sleep(0.1)
    pid = json.loads(state.read_text())["pid"]
    coordinator.kill()
    coordinator.wait(timeout=10)
    deadline = time.monotonic() + 30
    while running(pid):
        assert time.monotonic() < deadline, "the local agent outlived its coordinator"
        time.sleep(0.1)


def running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
