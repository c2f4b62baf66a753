"""`coordinator monitor --prometheus`: /metrics scraped over HTTP while the real console script
monitors a real agent (a job its replayed curve pauses meanwhile) and a dead one, parsed with
prometheus_client's own parser; then Ctrl-C ends it cleanly."""

from __future__ import annotations

import re
import select
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import console_script, piped
from tests.fleet_support import AgentPool
from tests.test_monitor import known_agent, run_job, supervised

pytestmark = pytest.mark.timeout(90)
__all__ = ["supervised"]  # the fixture, imported for its name
ANNOUNCED = re.compile(r"metrics on (http://\S+/metrics)")


def scrape(url: str) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """Every sample of every family, by sample name and sorted labels."""
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    found: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return found


@pytest.fixture
def monitoring() -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    yield started
    for process in started:
        if process.poll() is None:
            process.kill()
        process.communicate(timeout=10)


@pytest.mark.slow
def test_metrics_of_every_host_parse_and_ctrl_c_ends_the_monitor(
    agents: AgentPool,
    supervised: list[subprocess.Popen[str]],
    monitoring: list[subprocess.Popen[str]],
    tmp_path: Path,
) -> None:
    hot, gone = (
        known_agent(agents, "hot", 88.0, tmp_path, ("--name", "mac-hot")),
        known_agent(agents, "gone", 60.0, tmp_path),
    )
    gone.kill()
    process = piped(
        [
            console_script("coordinator"),
            "monitor",
            "--hosts",
            f"{hot.address},{gone.address}",
            "--connect-timeout",
            "1",
            "--prometheus",
            "127.0.0.1:0",
        ],
    )
    monitoring.append(process)
    assert process.stderr is not None
    url = None
    deadline = time.monotonic() + 30
    while url is None and time.monotonic() < deadline:
        if select.select([process.stderr], [], [], 0.2)[0]:
            match = ANNOUNCED.search(process.stderr.readline())
            url = match.group(1) if match else None
        assert process.poll() is None
    assert url is not None
    run_job(supervised, hot)  # paused at once by the 88 °C curve, while the monitor listens
    up = (("host", "mac-hot"), ("instance", hot.address))
    down = (("host", gone.address), ("instance", gone.address))  # never reached: no name yet
    while True:
        metrics = scrape(url)
        ready = metrics.get("mlx_fleet_agent_up", {})
        if (
            ready.get(up) == 1
            and ready.get(down) == 0
            and metrics.get("mlx_fleet_policy_actions_total")
            and metrics.get("mlx_fleet_pause_seconds_total", {}).get(up, 0) > 0
        ):
            break
        assert time.monotonic() < deadline, metrics
        time.sleep(0.2)
    source = f"replay:{tmp_path / 'hot'}.csv"
    assert metrics["mlx_fleet_soc_temperature_celsius"] == {(*up, ("source", source)): 88.0}
    assert metrics["mlx_fleet_cooling_state"] == {up: 2.0}
    actions = metrics["mlx_fleet_policy_actions_total"]
    assert actions[(("action", "pause"), *up)] == 1.0
    assert actions[(("action", "stop"), *up)] == 0.0  # every action exists, at 0 until taken
    assert metrics["mlx_fleet_policy_threshold_celsius"][(*up, ("level", "pause"))] == 85.0
    (build,) = metrics["mlx_fleet_build_info"]
    assert dict(build)["host"] == "mac-hot" and dict(build)["mlx_version"]
    every_down_series = [
        (name, labels)
        for name, series in metrics.items()
        for labels in series
        if ("instance", gone.address) in labels
    ]
    assert every_down_series == [("mlx_fleet_agent_up", down)]  # a host down keeps only up 0
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=15)
    assert process.returncode == 130, err  # interrupted (README, Exit codes)
    assert "Traceback" not in err and hot.address in out


def test_a_cordoned_hosts_conditions_are_exported_and_lifted(
    fleet_home: Path, monitoring: list[subprocess.Popen[str]]
) -> None:
    """mlx_fleet_host_condition is read from the run store at each scrape (the alert
    MlxFleetHostCordoned fires on it: deploy/prometheus)."""
    from coordinator.runs.conditions import add_condition
    from coordinator.runs.store import RunStore

    with RunStore(fleet_home / "coordinator.sqlite") as store:
        add_condition(store, "mac3", "out-of-family", "38.0 % below its family", None)
        add_condition(store, "mac3", "drift", "macOS 25A1", None)
    process = piped(
        [console_script("coordinator"), "monitor", "--hosts", "127.0.0.1:1",
         "--connect-timeout", "1", "--prometheus", "127.0.0.1:0"],
    )  # fmt: skip
    monitoring.append(process)
    assert process.stderr is not None
    url, deadline = None, time.monotonic() + 30
    while url is None and time.monotonic() < deadline:
        if select.select([process.stderr], [], [], 0.2)[0]:
            match = ANNOUNCED.search(process.stderr.readline())
            url = match.group(1) if match else None
    assert url is not None
    held = scrape(url)["mlx_fleet_host_condition"]
    assert held == {
        (("condition", "drift"), ("host", "mac3")): 1.0,
        (("condition", "out-of-family"), ("host", "mac3")): 1.0,
    }
    lifted = subprocess.run(
        [console_script("coordinator"), "uncordon", "mac3"], capture_output=True, text=True
    )
    assert lifted.returncode == 0, lifted.stderr
    assert "mlx_fleet_host_condition" not in scrape(url)  # a family with no sample is not listed


def test_refused_messages_are_counted_per_host_on_the_coordinators_exporter() -> None:
    """Issue 42: a message the coordinator refuses is counted where it can be seen; the
    counter is 0 from the host's first contact (increase() sees the first refusal) and exists
    only where messages are refused (the coordinator's exporter, not an agent's)."""
    from prometheus_client import generate_latest

    from shared.io.metrics import FleetMetrics, TelemetryMetrics

    coordinator, agent = FleetMetrics(), TelemetryMetrics()
    for metrics in (coordinator, agent):
        metrics.host_up("mac1", "10.0.0.1:5555" if metrics.instance else None)
    series = 'mlx_fleet_invalid_messages_total{host="mac1",instance="10.0.0.1:5555"}'
    assert f"{series} 0.0" in generate_latest(coordinator.registry).decode()
    coordinator.observe_invalid("mac1", 3, "10.0.0.1:5555")
    coordinator.observe_invalid("mac1", 1, "10.0.0.1:5555")
    assert f"{series} 4.0" in generate_latest(coordinator.registry).decode()
    assert "mlx_fleet_invalid_messages_total{" not in generate_latest(agent.registry).decode()
