"""deploy/prometheus and deploy/grafana checked by Prometheus's own tools: `promtool check
config`, `promtool check rules` and `promtool test rules` (deploy/prometheus/
mlx-fleet-alerts.test.yml, shipped beside the rules); then a real Prometheus on loopback
scrapes a real `agent serve --prometheus`, answers a PromQL query for its temperature, loads
the alert rules, answers every query of the Grafana dashboard, and a benchmark job's cells
with their verdicts.

Needs Debian's `prometheus` package (prometheus and promtool; .ci/run installs it)."""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq

from shared.io.keys import own_keypair
from shared.io.trust import trust
from tests.conftest import console_script, subprocess_env
from tests.fleet_support import AgentPool, AgentProcess, connect, receive, subscriber
from tests.test_run_cli import write_curve

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "deploy" / "prometheus" / "prometheus.yml"
RULES = ROOT / "deploy" / "prometheus" / "mlx-fleet-alerts.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "mlx-fleet-dashboard.json"
RULE_TESTS = ROOT / "deploy" / "prometheus" / "mlx-fleet-alerts.test.yml"

pytestmark = [
    pytest.mark.timeout(180),
    pytest.mark.skipif(
        shutil.which("promtool") is None or shutil.which("prometheus") is None,
        reason="Prometheus is not installed (Debian's `prometheus` package; .ci/run installs it)",
    ),
]


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["promtool", *args], capture_output=True, text=True, timeout=60)


def test_promtool_accepts_the_scrape_config_and_the_alert_rules() -> None:
    for args in (("check", "config", str(CONFIG)), ("check", "rules", str(RULES))):
        checked = promtool(*args)
        assert checked.returncode == 0, checked.stdout + checked.stderr
        assert "SUCCESS" in checked.stdout


def test_the_alerts_fire_as_promtool_unit_tests_say() -> None:
    """Host down, paused, stopped, hot: each fires when it should and not before."""
    tested = promtool("test", "rules", str(RULE_TESTS))
    assert tested.returncode == 0, tested.stdout + tested.stderr


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def metrics_port(agent: AgentProcess) -> int:
    found = re.search(r"metrics on http://127\.0\.0\.1:(\d+)/metrics", agent.log_text())
    assert found, agent.log_text()
    return int(found.group(1))


@pytest.fixture
def prometheus(tmp_path: Path, agents: AgentPool) -> Iterator[tuple[str, AgentProcess]]:
    """(the API's base URL, the agent it scrapes every 0.5 s with the shipped alert rules)."""
    with scraping(tmp_path, agents, 80.0) as served:
        yield served


@contextlib.contextmanager
def scraping(
    tmp_path: Path, agents: AgentPool, celsius: float
) -> Iterator[tuple[str, AgentProcess]]:
    """A real agent at a constant replayed `celsius`, and a real Prometheus scraping it."""
    curve = write_curve(tmp_path / "warm.csv", [(0, celsius)])
    watts = tmp_path / "watts.csv"
    watts.write_text("seconds,watts\n0,12.5\n")
    agent = agents.start(
        "mac-test",
        thermal=curve,
        options=[
            "--name",
            "mac-test",
            "--poll-interval",
            "0.2",
            "--prometheus",
            "127.0.0.1:0",
            "--power-source",
            f"replay:{watts}",
        ],
    )
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 500ms, evaluation_interval: 500ms}\n"
        f"rule_files: [{json.dumps(str(RULES))}]\n"
        "scrape_configs:\n"
        "  - job_name: mlx-fleet-agents\n"
        f"    static_configs: [{{targets: ['127.0.0.1:{metrics_port(agent)}']}}]\n"
    )
    address = f"127.0.0.1:{free_port()}"
    log = open(tmp_path / "prometheus.log", "w")  # noqa: SIM115 - closed after the process
    server = subprocess.Popen(
        [
            "prometheus",
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address={address}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    base = f"http://{address}"
    try:
        deadline = time.monotonic() + 60
        while not ready(base):
            assert server.poll() is None, (tmp_path / "prometheus.log").read_text()
            assert time.monotonic() < deadline, "Prometheus did not get ready"
            time.sleep(0.2)
        yield base, agent
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(timeout=10)
        log.close()


def ready(base: str) -> bool:
    try:
        with urllib.request.urlopen(f"{base}/-/ready", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def api(base: str, path: str, **params: str) -> Any:
    query = urllib.parse.urlencode(params)
    with urllib.request.urlopen(f"{base}/api/v1/{path}?{query}", timeout=10) as response:
        answer = json.loads(response.read())
    assert answer["status"] == "success", answer
    return answer["data"]


def query_until(base: str, promql: str, timeout: float = 60) -> list[dict[str, Any]]:
    """The query's result once it has one (a scrape or two after the start)."""
    deadline = time.monotonic() + timeout
    while not (result := api(base, "query", query=promql)["result"]):
        assert time.monotonic() < deadline, f"no result for {promql}"
        time.sleep(0.25)
    return result


@pytest.mark.slow
def test_a_real_prometheus_scrapes_a_real_agent(prometheus: tuple[str, AgentProcess]) -> None:
    base, agent = prometheus
    (series,) = query_until(base, 'mlx_fleet_soc_temperature_celsius{host="mac-test"}')
    assert float(series["value"][1]) == 80.0
    assert series["metric"]["source"].startswith("replay:")
    (stop,) = query_until(base, 'mlx_fleet_policy_threshold_celsius{level="stop"}')
    assert float(stop["value"][1]) == 95.0
    # Counters exist at 0 from the start: increase() over them answers 0, not nothing.
    paused = query_until(base, 'increase(mlx_fleet_policy_actions_total{action="pause"}[5s])')
    assert [float(s["value"][1]) for s in paused] == [0.0]
    groups = api(base, "rules")["groups"]
    assert [rule["name"] for group in groups for rule in group["rules"]] == [
        "MlxFleetHostDown",
        "MlxFleetAgentUnscraped",
        "MlxFleetJobPaused",
        "MlxFleetJobStopped",
        "MlxFleetHot",
        "MlxFleetThrottling",
        "MlxFleetHostCordoned",
    ]
    assert all(rule["health"] != "err" for group in groups for rule in group["rules"])
    hot = query_until(base, 'ALERTS{alertname="MlxFleetHot"}')  # 80 °C >= 75: pending at once
    assert hot[0]["metric"]["host"] == "mac-test"


def dashboard_queries() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    queries = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    queries += [
        variable["definition"]
        for variable in dashboard["templating"]["list"]
        if variable["type"] == "query"
    ]
    return queries


@pytest.mark.slow
def test_every_query_of_the_dashboard_answers_from_a_scrape(
    prometheus: tuple[str, AgentProcess],
) -> None:
    """Each panel's PromQL, Grafana's variables set (every host, a 2 s rate interval), returns
    series from the agent: the dashboard asks only for metrics that are emitted."""
    base, _ = prometheus
    query_until(base, "mlx_fleet_agent_up")
    time.sleep(2.5)  # rate() and increase() need two scrapes within their interval
    for expr in dashboard_queries():
        if expr.startswith("label_values("):
            metric, label = re.fullmatch(r"label_values\((\w+), (\w+)\)", expr).groups()
            assert api(base, f"label/{label}/values", **{"match[]": metric}) == ["mac-test"]
            continue
        promql = expr.replace("$__rate_interval", "2s").replace('"$host"', '".*"')
        assert query_until(base, promql, timeout=20), promql
    names = set(re.findall(r"mlx_fleet_\w+", " ".join(dashboard_queries())))
    assert names == {
        "mlx_fleet_agent_up",
        "mlx_fleet_build_info",
        "mlx_fleet_cooling_state",
        "mlx_fleet_energy_joules_total",
        "mlx_fleet_pause_seconds_total",
        "mlx_fleet_policy_actions_total",
        "mlx_fleet_policy_threshold_celsius",
        "mlx_fleet_power_watts",
        "mlx_fleet_sensor_temperature_celsius",
        "mlx_fleet_soc_temperature_celsius",
        "mlx_fleet_storage_ok",
    }


CELL_KEY = "host, model, bits, batch, depth, test"


@pytest.mark.slow
def test_a_benchmark_jobs_verdicts_answer_promql(prometheus: tuple[str, AgentProcess]) -> None:
    """A job with no warm-up: every cell is `cold` whatever the machine's noise, so PromQL's
    speeds of valid cells only (the join docs/monitoring.md shows) are none, and each cell's
    speed, verdict and reasons are there, labelled alike."""
    base, agent = prometheus
    trust(own_keypair().public, "test", directory=agent.home / "keys" / "trusted")
    matrix = {"n_prompt": [16], "n_gen": [4], "models": ["small"], "warmup": 0, "iterations": 2}
    context = zmq.Context()
    try:
        client = connect(context, agent, timeout=60)
        stream = list(client.stream(client.send("bench.start", {"matrix": matrix})))
        client.close()
    finally:
        context.destroy(linger=0)
    records = [m.body["record"] for m in stream if m.type == "bench.cell"]
    assert len(records) == 2
    cold = 'mlx_fleet_benchmark_invalid_reason{reason="cold"}'
    deadline = time.monotonic() + 30
    while len(found := api(base, "query", query=cold)["result"]) < len(records):
        assert time.monotonic() < deadline, found  # until a scrape after the job's last cell
        time.sleep(0.25)
    assert {series["metric"]["test"] for series in found} == {"pp16", "tg4"}
    speeds = api(base, "query", query="mlx_fleet_benchmark_tokens_per_second")["result"]
    by_test = {s["metric"]["test"]: float(s["value"][1]) for s in speeds}
    assert by_test == {r["test"]: r["tokens_per_sec"] for r in records}
    speed = f"mlx_fleet_benchmark_tokens_per_second and on({CELL_KEY})"
    assert api(base, "query", query=f"{speed} mlx_fleet_benchmark_valid == 1")["result"] == []
    invalid = api(base, "query", query=f"{speed} mlx_fleet_benchmark_valid == 0")["result"]
    assert len(invalid) == len(records)


PAUSING = {"max_speed_temp": 75.0, "pause_temp": 85.0, "stop_temp": 95.0}
RESUMING = {"max_speed_temp": 75.0, "pause_temp": 92.0, "stop_temp": 96.0}
STOPPING = {"max_speed_temp": 70.0, "pause_temp": 80.0, "stop_temp": 88.0}


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_prometheus_counts_each_paused_second_once(tmp_path: Path, agents: AgentPool) -> None:
    """Issue 42's acceptance: a real Prometheus scraping an agent through 10 pause/resume
    cycles of a supervised job and then a thermal stop: the paused total it reports equals the
    agent's own (its last sample's pause_s_total) to within one poll (the 120 s pause once
    counted twice). The Mac is a constant 90 °C; the policy, set over the protocol, moves the
    pause threshold below and above it."""
    with scraping(tmp_path, agents, 90.0) as (base, agent):
        trust(own_keypair().public, "test", directory=agent.home / "keys" / "trusted")
        context = zmq.Context()
        try:
            client = connect(context, agent)
            client.request("policy.set", {"policy": RESUMING})
            sub = subscriber(context, agent)
            run = subprocess.Popen(
                [console_script("agent"), "run", "--", "sleep", "120"],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
                env=subprocess_env(MLX_FLEET_HOME=str(agent.home)),
            )
            try:
                receive(sub, lambda m: m.type == "telemetry.event" and m.body["action"] == "start")
                for _ in range(10):
                    client.request("policy.set", {"policy": PAUSING})
                    receive(sub, lambda m: event(m, "pause"))
                    client.request("policy.set", {"policy": RESUMING})
                    receive(sub, lambda m: event(m, "resume"))
                client.request("policy.set", {"policy": STOPPING})
                receive(sub, lambda m: event(m, "stop"))
                _, stderr = run.communicate(timeout=60)
            finally:
                run.kill()
            assert run.returncode == 75, stderr  # a thermal stop (README, Exit codes)
            last = receive(sub, lambda m: m.type == "telemetry.sample" and ended(m.body["jobs"]))
            own = last.body["pause_s_total"]
            client.close()
        finally:
            context.destroy(linger=0)
        assert own > 0.5, own
        deadline = time.monotonic() + 30
        while True:  # until a scrape after the last pause
            (series,) = query_until(base, 'mlx_fleet_pause_seconds_total{host="mac-test"}')
            counted = float(series["value"][1])
            if abs(counted - own) <= 0.2 or time.monotonic() > deadline:
                break
            time.sleep(0.25)
        assert counted == pytest.approx(own, abs=0.2), (counted, own)  # one poll: 0.2 s
        pauses = query_until(base, 'mlx_fleet_policy_actions_total{action="pause"}')
        assert float(pauses[0]["value"][1]) >= 10.0  # the stop's reading pauses first
        stops = query_until(base, 'mlx_fleet_policy_actions_total{action="stop"}')
        assert float(stops[0]["value"][1]) == 1.0


def ended(jobs: list[dict[str, Any]]) -> bool:
    """Every supervised job exited (one is listed 30 s after its exit, docs/protocol.md §10)."""
    return all(job["state"] == "exited" for job in jobs)


def event(message: Any, action: str) -> bool:
    return message.type == "telemetry.event" and message.body["action"] == action
