"""Energy and power across the fleet, end to end: real `agent serve` processes with a replayed
power curve (labelled as not a meter everywhere), the real coordinator commands, real SQLite and
Prometheus' own parser: every cell's energy, a sustained run on two hosts at once with its plot,
watts in every telemetry sample, monitor, history and /metrics, and `agent doctor`."""

from __future__ import annotations

import json
import platform
import re
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import zmq
from prometheus_client.parser import text_string_to_metric_families

from coordinator.reports.compare import compare_reports, comparison_text
from coordinator.reports.sustain_plot import plot_sustain
from coordinator.telemetry.store import TelemetryStore
from shared.io.metrics import TelemetryMetrics
from tests.fleet_support import (
    QUICK,
    AgentPool,
    cli,
    connect,
    exchange_keys,
    receive,
    subscriber,
)
from tests.power_support import powercap_zone
from tests.test_history_stats import POLICY, sample

pytestmark = pytest.mark.timeout(240)


def replay(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def metered_agent(
    agents: AgentPool, name: str, watts: Path, *more: str, thermal: str = "none"
) -> Any:
    agent = agents.start(
        name,
        thermal=thermal,
        options=["--power-source", f"replay:{watts}", "--idle-baseline", "0.2", *more],
    )
    exchange_keys(agent)
    return agent


@pytest.mark.slow
def test_every_cell_of_a_fleet_run_carries_its_energy(agents: AgentPool, tmp_path: Path) -> None:
    watts = replay(tmp_path, "watts.csv", "0,20\n")
    first = metered_agent(agents, "mac1", watts)
    second = agents.start("mac2")  # no meter: its cells say N/A, with why
    exchange_keys(second)
    result = cli(
        "coordinator", "benchmark", "--hosts", f"{first.address},{second.address}", *QUICK,
        "--format", "json",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    for cell in report["cells"]:
        if cell["host"] == first.address:
            assert cell["power_w"] == pytest.approx(20.0, rel=0.02)
            assert cell["energy_source"] == f"replay:{watts}" and cell["energy_simulated"]
            assert cell["idle_power_w"] == pytest.approx(20.0, rel=0.02)
            assert cell["tokens_per_joule"] > 0
        else:
            assert cell["energy_j"] is None and cell["tokens_per_joule"] is None
            assert cell["energy_note"].startswith("no power meter")
    table = cli("coordinator", "show", report["run_id"])
    assert table.returncode == 0, table.stderr
    assert "tok/J" in table.stdout and "20.0 sim" in table.stdout
    assert "SIMULATED: not a meter" in table.stdout
    compared = cli("coordinator", "compare", report["run_id"], report["run_id"])
    assert compared.returncode == 0, compared.stderr
    assert "tok/J A" in compared.stdout and "tok/J B" in compared.stdout


@pytest.mark.slow
def test_a_sustained_run_on_two_hosts_at_once_with_its_plot(
    agents: AgentPool, tmp_path: Path
) -> None:
    # Rising for 170 s (below the default policy's 75 °C): however late a loaded machine starts
    # the sustained cell, its 20 s see the heat rise.
    curve = "".join(f"{t},{40 + t / 5:g}\n" for t in range(0, 171, 5))
    heat = replay(tmp_path, "heat.csv", "seconds,celsius\n" + curve)
    watts = replay(tmp_path, "watts.csv", "seconds,watts\n0,10\n8,15\n16,20\n")
    options = ("--poll-interval", "0.2")
    first = metered_agent(agents, "mac1", watts, *options, thermal=f"replay:{heat}")
    second = metered_agent(agents, "mac2", watts, *options, thermal=f"replay:{heat}")
    plot = tmp_path / "out.png"
    result = cli(
        "coordinator", "benchmark", "--hosts", f"{first.address},{second.address}",
        "--config-small", "-p", "16", "-n", "0", "-w", "1",
        "--sustain", "20s", "--sustain-window", "5s", "--plot", str(plot),
        timeout=200,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert f"wrote {plot}" in result.stderr
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for mark in ("steady tok/s", "throttle", f"windows of {first.address}", "mean W"):
        assert mark in result.stdout, mark
    run_id = re.search(r"\brun (r-[\w-]+)", result.stderr).group(1)  # type: ignore[union-attr]
    shown = cli("coordinator", "show", run_id, "--format", "json")
    assert shown.returncode == 0, (run_id, shown.stderr)
    report = json.loads(shown.stdout)
    assert {cell["host"] for cell in report["cells"]} == {first.address, second.address}
    for cell in report["cells"]:
        sustain = cell["sustain"]
        assert sustain["duration_s"] == 20.0 and len(sustain["windows"]) == 4
        assert all(w["watts"] is not None and w["celsius"] is not None for w in sustain["windows"])
        assert sustain["temp_rise_c"] > 0 and sustain["throttle_ratio"] is not None


def test_a_sustain_plot_says_what_no_host_could_read() -> None:
    """Hosts with no thermal source and no meter: the °C and W panels say so, never an empty
    axis that reads as a flat line at 0 (seen by hand on the embedded agent here)."""
    windows = [
        {"index": i, "start_s": 5.0 * i, "end_s": 5.0 * (i + 1), "tokens_per_sec": 500.0 + i,
         "celsius": None, "watts": None, "paused": False}
        for i in range(2)
    ]  # fmt: skip
    cell = {"host": "local", "name": "small/f16 pp32 b1", "flags": [], "status": "ok",
            "sustain": {"windows": windows}}  # fmt: skip
    speed, heat, power = plot_sustain({"title": "run", "cells": [cell]}).axes
    said = [[text.get_text() for text in ax.texts] for ax in (speed, heat, power)]
    assert said == [
        [],
        ["no temperature reading: no thermal source on these hosts"],
        ["no power reading: no power meter on these hosts"],
    ]


@pytest.mark.slow
def test_a_sustain_the_agent_cannot_meter_is_refused_by_it(
    agents: AgentPool, tmp_path: Path
) -> None:
    agent = agents.start("mac1")  # polls every second
    exchange_keys(agent)
    result = cli(
        "coordinator", "benchmark", "--hosts", agent.address, *QUICK,
        "--sustain", "2s", "--sustain-window", "0.5s",
    )  # fmt: skip
    assert result.returncode == 1
    assert "sustain rejected" in result.stderr and "thermal poll's interval" in result.stderr
    bad = cli("coordinator", "benchmark", *QUICK, "--sustain", "5s")
    assert bad.returncode == 2 and "shorter than two windows" in bad.stderr
    no_plot = cli("coordinator", "benchmark", *QUICK, "--plot", str(tmp_path / "x.png"))
    assert no_plot.returncode == 2 and "give --sustain" in no_plot.stderr


@pytest.mark.slow
def test_samples_info_monitor_and_metrics_carry_power(
    agents: AgentPool, tmp_path: Path, ctx: zmq.Context
) -> None:
    watts = replay(tmp_path, "watts.csv", "0,12.5\n")
    agent = metered_agent(
        agents, "mac1", watts, "--poll-interval", "0.2", "--prometheus", "127.0.0.1:0"
    )
    sock = subscriber(ctx, agent)
    first = receive(sock, lambda m: m.type == "telemetry.sample" and m.body["power_w"] is not None)
    body = first.body
    assert body["power_w"] == pytest.approx(12.5)
    assert body["power"]["source"] == f"replay:{watts}" and body["power"]["simulated"] is True
    assert body["power"]["watts"] == {"system": 12.5}
    later = receive(sock, lambda m: m.type == "telemetry.sample" and m.body["seq"] > body["seq"])
    assert later.body["energy_j"] > body["energy_j"]
    with connect(ctx, agent) as client:
        power = client.request("info")["power"]
    assert power["source"] == f"replay:{watts}" and power["rails"] == ["system"]
    assert power["reading"]["total_w"] == pytest.approx(12.5)
    once = cli("coordinator", "monitor", "--hosts", agent.address, "--once", "--format", "json")
    assert once.returncode == 0, once.stderr
    (row,) = json.loads(once.stdout)["hosts"]
    assert row["power_w"] == pytest.approx(12.5) and row["power_simulated"] is True
    table = cli("coordinator", "monitor", "--hosts", agent.address, "--once")
    line = next(text for text in table.stdout.splitlines() if agent.address in text)
    assert "12.5 sim" in line
    port = int(agent.log_text().split("/metrics")[0].rsplit(":", 1)[1])
    scraped = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
    found = {
        (s.name, s.labels.get("rail")): s.value
        for family in text_string_to_metric_families(scraped.decode())
        for s in family.samples
        if s.name.startswith(("mlx_fleet_power", "mlx_fleet_energy"))
    }
    assert found[("mlx_fleet_power_watts", "system")] == pytest.approx(12.5)
    assert found[("mlx_fleet_energy_joules_total", "system")] > 0


def test_energy_metrics_survive_an_agent_restart_and_drop_a_vanished_rail() -> None:
    metrics = TelemetryMetrics()
    base = {"host": "mac1", "celsius": None, "source": "none", "state": None}
    base |= {"pause_s_total": 0.0, "storage_error": None}

    def power(joules: float, watts: dict[str, float] | None) -> dict[str, Any]:
        return {
            "source": "ioreport",
            "simulated": False,
            "watts": watts or {},
            "joules": {"cpu": joules} if watts else {},
            "error": None,
        }

    metrics.observe_sample({**base, "power": power(100.0, {"cpu": 5.0})})
    metrics.observe_sample({**base, "power": power(160.0, {"cpu": 6.0})})
    metrics.observe_sample({**base, "power": power(10.0, {"cpu": 4.0})})  # restarted: 10 J new
    registry = metrics.registry
    labels = {"host": "mac1", "source": "ioreport", "rail": "cpu"}
    assert registry.get_sample_value("mlx_fleet_energy_joules_total", labels) == 170.0
    assert registry.get_sample_value("mlx_fleet_power_watts", labels) == 4.0
    metrics.observe_sample({**base, "power": power(0.0, None)})
    assert registry.get_sample_value("mlx_fleet_power_watts", labels) is None


@pytest.mark.slow
def test_history_reports_energy_and_mean_power_and_plots_a_power_panel(tmp_path: Path) -> None:
    start = time.time() - 120
    with TelemetryStore() as store:
        store.record_policy("mac1:5555", POLICY, start - 10)
        rows = []
        for t in range(120):
            body = sample(start + t, 60.0, source="iohid")
            body |= {"power_w": 10.0 if t < 60 else 20.0, "energy_j": 15.0 * t}
            body["power"] = {"source": "smc", "simulated": False, "watts": {}, "joules": {}}
            rows.append(("mac1:5555", body))
            rows.append(("mac2:5555", sample(start + t, 50.0, source="iohid")))
        store.add(rows)
    result = cli("coordinator", "history", "--since", "1h", "--format", "json")
    assert result.returncode == 0, result.stderr
    hosts = {row["host"]: row for row in json.loads(result.stdout)["hosts"]}
    assert hosts["mac1:5555"]["energy_j"] == pytest.approx(60 * 10 + 60 * 20)
    assert hosts["mac1:5555"]["mean_power_w"] == pytest.approx(15.0)
    assert hosts["mac1:5555"]["power_sources"] == ["smc"]
    assert hosts["mac2:5555"]["energy_j"] is None and hosts["mac2:5555"]["mean_power_w"] is None
    table = cli("coordinator", "history", "--since", "1h")
    assert "mean W" in table.stdout and "15.0" in table.stdout
    plot = tmp_path / "history.png"
    drawn = cli("coordinator", "history", "--since", "1h", "--plot", str(plot))
    assert drawn.returncode == 0, drawn.stderr
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_compare_shows_tokens_per_joule_of_both_runs() -> None:
    def report(name: str, per_joule: float | None) -> dict[str, Any]:
        cell = {
            "host": "mac1", "name": "small/f16 pp16 b1", "model": "small", "bits": 16,
            "test": "pp16", "batch_size": 1, "status": "ok", "tokens_per_sec": 100.0,
            "std_tokens_per_sec": 1.0, "tokens_per_joule": per_joule,
            "energy_source": "ioreport" if per_joule else None,
        }  # fmt: skip
        return {"hosts": [{"host": "mac1"}], "cells": [cell], "run_id": name}

    rows = compare_reports(report("a", 12.5), report("b", 25.0))
    csv_text = comparison_text(rows, "a", "b", "csv")
    assert "tokens_per_joule_a,tokens_per_joule_b" in csv_text and "12.5,25.0" in csv_text
    md = comparison_text(rows, "a", "b", "md")
    assert "| tok/J A | tok/J B |" in md and "| 12.5 | 25 |" in md
    unmetered = compare_reports(report("a", None), report("b", None))
    assert "tok/J" not in comparison_text(unmetered, "a", "b", "md")


@pytest.mark.skipif(platform.system() != "Linux", reason="rapl is what Linux offers")
@pytest.mark.slow
def test_doctor_lists_every_power_source_with_its_reading(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    powercap_zone(tmp_path, "intel-rapl:0", "package-0", 1000, 10**12)
    monkeypatch.setenv("MLX_FLEET_SYSFS_ROOT", str(tmp_path))
    result = cli("agent", "doctor", "--format", "json", timeout=120)
    checks = {check["name"]: check for check in json.loads(result.stdout)["checks"]}
    rapl, auto = checks["power: rapl"], checks["power: auto"]
    assert (
        rapl["ok"]
        and "W over 0.5 s (cpu 0.00" in rapl["detail"]
        and "resolution 0.001 s" in rapl["detail"]
    )
    assert auto["ok"] and auto["detail"].endswith("-> rapl")
    assert not rapl["required"]
