"""`agent doctor` on this (Linux) machine, and `coordinator doctor` over the protocol against
real agent processes: every check is reported honestly (a macOS feature absent here is a ✗ that
says so), and the exit code says whether the agent can run."""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path

import pytest
import zmq

from tests.fleet_support import AgentPool, cli, connect, exchange_keys, trusted_agent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("0.0.0.0", 0))
        return sock.getsockname()[1]


def checks(report: dict) -> dict[str, dict]:
    return {check["name"]: check for check in report["checks"]}


@pytest.mark.slow
def test_agent_doctor_reports_every_check_and_exits_0_when_the_agent_can_run() -> None:
    port = free_port()
    result = cli("agent", "doctor", "--format", "json", "--bind", f"0.0.0.0:{port}")
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    found = checks(report)
    assert report["ok"] is True and report["machine"]["mlx_version"]
    for name in ("python", "mlx", "benchmark", "data dir", f"port {port} (command)"):
        assert found[name]["ok"] and found[name]["required"], name
    assert "GFLOP/s" in found["benchmark"]["detail"]
    assert found[f"port {port + 1} (telemetry)"]["ok"]
    assert {"metal", "thermal: auto", "thermal pressure", "clocks", "service", "firewall"} <= set(
        found
    )
    clocks = found["clocks"]  # this machine's, or why not (no cpufreq in most VMs)
    assert not clocks["required"]
    assert clocks["ok"] or clocks["detail"].startswith("unavailable: ")
    if sys.platform != "darwin":  # honest failures, each saying why, none of them required
        assert not found["metal"]["ok"] and "Metal is macOS only" in found["metal"]["detail"]
        assert not found["thermal pressure"]["ok"]
        assert "notify API" in found["thermal pressure"]["detail"]
        assert not found["firewall"]["ok"] and "not a Mac" in found["firewall"]["detail"]
        assert "thermal: linux" in found and "thermal: smc" not in found
        assert not any(found[name]["required"] for name in ("metal", "firewall", "service"))


@pytest.mark.slow
def test_agent_doctor_only_looks_at_a_missing_data_dir(tmp_path: Path) -> None:
    """A doctor makes nothing: a missing data dir (and the folder it would be made in) is still
    missing after it, and the check says `agent serve` makes it, ✓: it can be made."""
    home = tmp_path / "fresh" / "home"
    result = cli("agent", "doctor", "--format", "json", "--bind", "127.0.0.1:0", home=home)
    assert not (tmp_path / "fresh").exists(), result.stderr
    found = checks(json.loads(result.stdout))
    assert found["data dir"]["ok"] and found["data dir"]["required"], found["data dir"]
    assert "missing" in found["data dir"]["detail"] and "agent serve" in found["data dir"]["detail"]
    assert found["agent key"]["ok"]


@pytest.mark.slow
def test_a_port_taken_by_another_program_fails_with_the_fix() -> None:
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = cli("agent", "doctor", "--bind", f"0.0.0.0:{port}")
    assert result.returncode == 1, result.stdout
    row = next(line for line in result.stdout.splitlines() if f"port {port}" in line)
    assert "✗" in row and "cannot bind" in row and "--bind" in row


@pytest.mark.slow
def test_the_ports_of_this_machines_running_agent_are_not_a_failure(agents: AgentPool) -> None:
    agent = agents.start("mac1")
    result = cli("agent", "doctor", "--format", "json", "--bind", agent.address, home=agent.home)
    found = checks(json.loads(result.stdout))
    assert found[f"port {agent.port} (command)"]["detail"].startswith("in use by agent serve")


@pytest.mark.slow
def test_coordinator_doctor_collects_every_agent_into_one_table(
    agents: AgentPool, tmp_path: Path
) -> None:
    mac1, mac2, gone = agents.start("mac1"), agents.start("mac2"), agents.start("mac3")
    for agent in (mac1, mac2, gone):
        exchange_keys(agent)
    gone.kill()
    hosts = f"{mac1.address},{mac2.address}"
    result = cli("coordinator", "doctor", "--hosts", hosts, "--format", "json")
    assert result.returncode == 0, result.stdout + result.stderr
    rows = {row["host"]: row for row in json.loads(result.stdout)}
    for agent in (mac1, mac2):
        report = rows[agent.address]["report"]
        assert report["ok"]
        assert checks(report)[f"port {agent.port} (command)"]["detail"] == "bound by this agent"
        assert report["machine"]["hostname"]
    table = cli(
        "coordinator", "doctor", "--hosts", f"{hosts},{gone.address}", "--connect-timeout", "1"
    )
    assert table.returncode == 1
    for agent in (mac1, mac2, gone):
        assert agent.address in table.stdout
    assert "connection refused" in table.stdout


@pytest.mark.slow
def test_the_agent_answers_pings_while_its_doctor_report_is_made(agents: AgentPool) -> None:
    """The report takes over a second (its benchmark alone): it is deferred, the loop goes on."""
    agent = trusted_agent(agents)
    ctx = zmq.Context()
    try:
        with connect(ctx, agent) as client:
            asked = client.send("doctor")
            pinged = client.send("ping")
            order = []
            while len(order) < 2:
                assert client.sock.poll(60_000), "no reply within 60 s"
                reply = client._receive()
                if reply is not None and reply.re in (asked.id, pinged.id):
                    order.append(reply.type)
    finally:
        ctx.destroy(linger=0)
    assert order == ["ping.ok", "doctor.ok"]


@pytest.mark.parametrize("fmt", ["table", "json"])
def test_doctor_bad_input_is_one_line_exit_2(fmt: str) -> None:
    result = cli("agent", "doctor", "--bind", "nonsense", "--format", fmt)
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1
    assert "bad --bind 'nonsense'" in result.stderr


@pytest.mark.slow
def test_doctor_shows_the_policy_in_force_and_warns_of_thresholds_below_the_idle_reading(
    tmp_path: Path, fleet_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A policy an operator set at or below what the sensor reads at idle is accepted (the
    agent enforces what it is told) but would hold every job back: doctor says so."""
    zone = tmp_path / "sys" / "class" / "thermal" / "thermal_zone0"
    zone.mkdir(parents=True)
    (zone / "type").write_text("x86_pkg_temp\n")
    (zone / "temp").write_text("62000\n")
    monkeypatch.setenv("MLX_FLEET_SYSFS_ROOT", str(tmp_path / "sys"))
    port = free_port()
    doctor = ("agent", "doctor", "--format", "json", "--bind", f"0.0.0.0:{port}")
    defaults = checks(json.loads(cli(*doctor).stdout))["policy"]
    assert defaults["ok"] and defaults["detail"] == "policy 85/95/100 °C (defaults for linux)"
    fleet_home.mkdir(parents=True, exist_ok=True)
    low = {"max_speed_temp": 50, "pause_temp": 61, "stop_temp": 70}
    (fleet_home / "policy.json").write_text(json.dumps(low))
    warned = checks(json.loads(cli(*doctor).stdout))["policy"]
    assert not warned["ok"] and not warned["required"]
    assert "policy 50/61/70 °C (set by coordinator policy)" in warned["detail"]
    assert "reduce ≥ 50, pause ≥ 61 °C is at or below the 62.0 °C linux reads" in warned["detail"]
    assert "85/95/100" in warned["fix"]


@pytest.mark.parametrize(
    ("resolution", "window"),
    [(2.3, 4.6), (1.0, 2.0), (0.001, 0.5), (0.0, 0.5), (60.0, 10.0)],
    ids=["ioreport", "smc", "rapl", "model", "slowest"],
)
def test_doctor_reads_a_power_source_over_two_of_its_updates(
    resolution: float, window: float
) -> None:
    """Issue 42: half a second is shorter than the ~2 s between IOReport's counter updates."""
    from agent.doctor.power import read_window

    assert read_window(resolution) == pytest.approx(window)
