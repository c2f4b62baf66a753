"""`agent serve --prometheus`: /metrics scraped over HTTP and parsed with prometheus_client's own
parser, while a registered `agent run` job is paused and resumed and while benchmark jobs run;
and the metrics' bookkeeping (absent without a reading, a counter that survives an agent
restart, a benchmark cell's series replaced when it is measured again)."""

from __future__ import annotations

import re
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import zmq
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from shared.benchmark import verdict
from shared.io import metrics as metrics_module
from shared.io.metrics import TelemetryMetrics, serve_metrics
from shared.io.transport import AgentClient
from tests.conftest import subprocess_env
from tests.fleet_support import AgentPool, connect, receive, subscriber, trusted_agent
from tests.test_run_cli import write_curve

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def parse(text: str) -> Samples:
    """Every mlx_fleet sample by (name, sorted labels)."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name.startswith("mlx_fleet_")
    }


def scrape(port: int) -> Samples:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return parse(response.read().decode())


@pytest.mark.slow
def test_metrics_follow_samples_and_policy_actions(
    ctx: zmq.Context, agents: AgentPool, agent_cli: str, tmp_path: Path
) -> None:
    source = write_curve(tmp_path / "hot.csv", [(0, 90.0)])
    agent = trusted_agent(
        agents, thermal=source, options=["--poll-interval", "0.1", "--prometheus", "127.0.0.1:0"]
    )
    found = re.search(r"metrics on http://127\.0\.0\.1:(\d+)/metrics", agent.log_text())
    assert found, agent.log_text()
    port = int(found.group(1))
    host = (("host", socket.gethostname()),)
    deadline = time.monotonic() + 10
    reading = ("mlx_fleet_soc_temperature_celsius", tuple(sorted(host + (("source", source),))))
    while reading not in (metrics := scrape(port)):  # the first sample (agent_up comes before)
        assert time.monotonic() < deadline, metrics
        time.sleep(0.05)
    assert metrics[reading] == 90.0
    assert metrics[("mlx_fleet_cooling_state", host)] == 2.0  # pause
    assert metrics[("mlx_fleet_agent_up", host)] == 1.0
    assert metrics[("mlx_fleet_pause_seconds_total", host)] == 0.0  # there, nothing paused yet
    assert metrics[("mlx_fleet_policy_actions_total", (("action", "stop"), *host))] == 0.0
    assert metrics[("mlx_fleet_policy_threshold_celsius", (*host, ("level", "stop")))] == 95.0
    assert metrics[("mlx_fleet_sensor_temperature_celsius", (*host, ("sensor", "replay")))] == 90.0

    sub = subscriber(ctx, agent)
    receive(sub, lambda m: m.type == "telemetry.sample")
    run = subprocess.Popen(
        [agent_cli, "run", "--", "sleep", "0.5"],
        stderr=subprocess.PIPE,
        text=True,
        env=subprocess_env(MLX_FLEET_HOME=str(agent.home)),
    )
    receive(sub, lambda m: m.type == "telemetry.event" and m.body["action"] == "pause")
    receive(sub, lambda m: m.type == "telemetry.sample" and m.body["pause_s_total"] > 0.3)
    client = connect(ctx, agent)
    client.request("policy.set", {"policy": {"pause_temp": 92, "stop_temp": 96}})
    client.close()
    _, stderr = run.communicate(timeout=20)
    assert run.returncode == 0, stderr
    receive(sub, lambda m: m.type == "telemetry.sample" and m.body["state"] == "reduce_batch")

    metrics = scrape(port)
    actions = {
        dict(labels)["action"]: value
        for (name, labels), value in metrics.items()
        if name == "mlx_fleet_policy_actions_total"
    }
    assert actions == {
        "pause": 1.0,
        "resume": 1.0,
        "reduce_batch": 1.0,
        "restore_batch": 0.0,
        "pace": 0.0,
        "pace_end": 0.0,
        "stop": 0.0,
    }
    assert metrics[("mlx_fleet_pause_seconds_total", host)] > 0.3
    assert metrics[("mlx_fleet_cooling_state", host)] == 1.0
    assert metrics[("mlx_fleet_policy_threshold_celsius", (*host, ("level", "pause")))] == 92.0
    origins = [
        dict(labels)["origin"] for name, labels in metrics if name == "mlx_fleet_policy_info"
    ]
    assert origins == ["set by coordinator policy, the rest the seed's defaults"]  # only the new


SAMPLE = {
    "host": "mac1",
    "celsius": 70.0,
    "source": "iohid",
    "sensor": "PMU tdie1",
    "state": "ok",
    "pause_s_total": 4.0,
    "storage_error": None,
    "power_w": None,
    "energy_j": None,
    "power": None,
}


def without_a_reading() -> TelemetryMetrics:
    """A sample with a reading, then one without."""
    metrics = TelemetryMetrics()
    metrics.observe_sample(SAMPLE)
    metrics.observe_sample({**SAMPLE, "celsius": None, "state": None, "pause_s_total": 6.0})
    return metrics


def after_a_restart() -> TelemetryMetrics:
    """Then the agent restarts, on another source, its pause total counting from 0 again."""
    metrics = without_a_reading()
    metrics.observe_sample({**SAMPLE, "source": "macmon", "pause_s_total": 1.0})
    return metrics


PAUSED = ("mlx_fleet_pause_seconds_total", (("host", "mac1"),))


@pytest.mark.parametrize(
    ("totals", "expected"),
    [
        # (pause_s_total, started) per sample; the counter's value after them
        ([(120.3, 1000.0), (120.0, 1000.0), (120.0, 1000.0)], 120.3),  # a resume stamped late
        ([(50.0, 1000.0), (120.0, 1000.0), (60.0, 1000.0), (125.0, 1000.0)], 125.0),  # replayed
        ([(120.0, 1000.0), (5.0, 2000.0), (8.0, 2000.0)], 128.0),  # restarted: a new `started`
        ([(120.0, 1000.0), (130.0, 2000.0)], 250.0),  # restarted, already past the old total
        ([(120.0, 1000.0), (100.0, None), (121.0, 1000.0)], 121.0),  # a row without it
        ([(120.0, None), (5.0, None)], 125.0),  # an older agent: a decrease is its restart
    ],
    ids=["late-resume", "replayed", "restart", "restart-past", "row-without", "older-agent"],
)
def test_the_pause_counter_counts_each_second_once(
    totals: list[tuple[float, float | None]], expected: float
) -> None:
    """Issue 42: a 120 s pause counted twice when the total went down by a late-stamped resume:
    a restart is told by the samples' `started`, never by a decrease."""
    metrics = TelemetryMetrics()
    for total, started in totals:
        metrics.observe_sample({**SAMPLE, "pause_s_total": total, "started": started})
    assert parse(generate(metrics))[PAUSED] == pytest.approx(expected)


def test_an_agent_never_says_less_pause_than_it_said() -> None:
    """The agent's own total: a resume that `agent run` stamped before the last poll's time
    takes back nothing the poll counted."""
    from agent.daemon.telemetry import JobTable
    from shared.wire.telemetry import Event

    def event(action: str, at: float) -> Event:
        return Event(time=at, job="j1", pid=42, action=action, source="sim", simulated=True)

    table = JobTable()
    table.apply(Event(time=0.0, job="j1", pid=42, action="start", source="sim",
                      simulated=True, detail="python train.py"), "run")  # fmt: skip
    table.apply(event("pause", 10.0), "run")
    assert table.pause_s_total(130.3) == pytest.approx(120.3)
    table.apply(event("resume", 130.0), "run")  # stamped 0.3 s before the poll above
    assert table.pause_s_total(131.0) == pytest.approx(120.3)
    table.apply(event("pause", 200.0), "run")
    assert table.pause_s_total(210.0) == pytest.approx(130.0)


def test_no_reading_exports_no_temperature_no_state_never_nan() -> None:
    text = generate(without_a_reading())
    assert "mlx_fleet_soc_temperature_celsius{" not in text and "NaN" not in text
    assert "mlx_fleet_cooling_state{" not in text


def test_the_pause_counter_survives_an_agent_restart() -> None:
    values = parse(generate(after_a_restart()))
    assert values[("mlx_fleet_pause_seconds_total", (("host", "mac1"),))] == 7.0


def test_the_temperature_is_labelled_with_the_new_source_after_a_restart() -> None:
    values = parse(generate(after_a_restart()))
    assert (
        values[("mlx_fleet_soc_temperature_celsius", (("host", "mac1"), ("source", "macmon")))]
        == 70.0
    )


def test_a_host_down_keeps_only_agent_up_0_until_it_returns() -> None:
    metrics = after_a_restart()
    metrics.set_policy("mac1", {"max_speed_temp": 75, "pause_temp": 85, "stop_temp": 95})
    metrics.observe_sensors("mac1", {"TCMz": 70.0})
    metrics.host_down("mac1")
    values = parse(generate(metrics))
    assert values == {("mlx_fleet_agent_up", (("host", "mac1"),)): 0.0}
    metrics.host_up("mac1", version="0.1.0", machine={"chip": "Apple M4", "mlx_version": "0.3"})
    values = parse(generate(metrics))
    assert values[("mlx_fleet_agent_up", (("host", "mac1"),))] == 1.0
    assert values[("mlx_fleet_pause_seconds_total", (("host", "mac1"),))] == 0.0
    assert values[("mlx_fleet_policy_threshold_celsius", (("host", "mac1"), ("level", "stop")))]
    build = (("chip", "Apple M4"), ("host", "mac1"), ("mlx_version", "0.3"), ("version", "0.1.0"))
    assert values[("mlx_fleet_build_info", build)] == 1.0


def test_the_policys_origin_is_one_series_that_follows_it_across_a_restart() -> None:
    metrics = after_a_restart()
    policy = {"max_speed_temp": 95, "pause_temp": 114, "stop_temp": 120}
    metrics.set_policy("mac1", policy, origin="defaults for smc")
    metrics.set_policy("mac1", policy, origin="set by coordinator policy")
    info = "mlx_fleet_policy_info"
    origins = [dict(labels)["origin"] for name, labels in parse(generate(metrics)) if name == info]
    assert origins == ["set by coordinator policy"]
    metrics.host_down("mac1")
    metrics.host_up("mac1")
    values = parse(generate(metrics))
    assert values[(info, (("host", "mac1"), ("origin", "set by coordinator policy")))] == 1.0
    metrics.set_policy("mac1", policy)  # an agent that does not say: no origin, never a guess
    assert not [name for name, _ in parse(generate(metrics)) if name == info]


def test_the_coordinators_series_carry_the_agents_name_and_its_instance() -> None:
    metrics = TelemetryMetrics(instance=True)
    metrics.host_down("10.0.0.1:5555", "10.0.0.1:5555")  # not reached yet: no name known
    metrics.host_up("mac1", "10.0.0.1:5555", version="0.1.0", machine={})
    metrics.observe_sample(SAMPLE, "10.0.0.1:5555")
    values = parse(generate(metrics))
    labels = (("host", "mac1"), ("instance", "10.0.0.1:5555"))
    assert values[("mlx_fleet_agent_up", labels)] == 1.0
    assert not [key for key in values if ("host", "10.0.0.1:5555") in key[1]]


def test_a_write_the_disk_refuses_reads_storage_ok_0_until_it_takes_it() -> None:
    metrics = TelemetryMetrics()
    metrics.observe_sample({**SAMPLE, "storage_error": "history: database or disk is full"})
    assert parse(generate(metrics))[("mlx_fleet_storage_ok", (("host", "mac1"),))] == 0.0
    metrics.observe_sample(SAMPLE)
    assert parse(generate(metrics))[("mlx_fleet_storage_ok", (("host", "mac1"),))] == 1.0


def test_an_exit_event_is_not_a_policy_action() -> None:
    metrics = after_a_restart()
    metrics.observe_event({"host": "mac1", "action": "exit"})
    values = parse(generate(metrics))
    counted = {k: v for k, v in values.items() if k[0] == "mlx_fleet_policy_actions_total"}
    assert len(counted) == 7 and set(counted.values()) == {0.0}


def test_the_exporter_serves_metrics_and_healthz_only() -> None:
    server = serve_metrics(TelemetryMetrics().registry, "127.0.0.1:0")
    try:
        base = f"http://127.0.0.1:{server.port}"
        with urllib.request.urlopen(f"{base}/healthz", timeout=5) as response:
            assert response.status == 200 and response.read() == b"ok\n"
        with urllib.request.urlopen(f"{base}/metrics", timeout=5) as response:
            assert b"# TYPE mlx_fleet_agent_up gauge" in response.read()
        for path in ("/", "/favicon.ico", "/metrics/extra", "/debug"):
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(f"{base}{path}", timeout=5)
            assert refused.value.code == 404, path
    finally:
        server.close()


BENCH = ("mlx_fleet_benchmark_tokens_per_second", "mlx_fleet_benchmark_valid")
REASON = "mlx_fleet_benchmark_invalid_reason"


def bench_series(metrics: Samples) -> Samples:
    return {key: value for key, value in metrics.items() if key[0] in (*BENCH, REASON)}


def expected_series(host: str, records: list[dict[str, Any]]) -> Samples:
    """What the exposition must hold for the latest record of each cell: its own verdict."""
    latest = {}
    for record in records:
        bits = "none" if record["bits"] is None else str(record["bits"])
        test = record["test"].split(" @ ")[0]
        labels = {"host": host, "model": record["model"], "bits": bits}
        labels |= {"batch": str(record["batch_size"]), "depth": str(record["n_depth"])}
        latest[tuple(sorted((labels | {"test": test}).items()))] = record
    expected: Samples = {}
    for labels, record in latest.items():
        valid = record["verdict"] == verdict.VALID
        expected[("mlx_fleet_benchmark_valid", labels)] = 1.0 if valid else 0.0
        if record["status"] == "ok":
            speed = record["tokens_per_sec"]
            expected[("mlx_fleet_benchmark_tokens_per_second", labels)] = speed
        for reason in record["verdict_reasons"]:
            expected[(REASON, tuple(sorted((*labels, ("reason", reason)))))] = 1.0
    return expected


def run_job(client: AgentClient, matrix: dict[str, Any]) -> list[dict[str, Any]]:
    """The records a real job streamed, in order."""
    stream = list(client.stream(client.send("bench.start", {"matrix": matrix})))
    assert stream[-1].type == "bench.done" and stream[-1].body["status"] == "ok", stream[-1]
    return [m.body["record"] for m in stream if m.type == "bench.cell"]


@pytest.mark.slow
def test_a_benchmark_jobs_cells_show_with_the_agents_own_verdicts(
    ctx: zmq.Context, agents: AgentPool
) -> None:
    """Through a real agent: every cell's tok/s, verdict and reasons as its record says (this
    machine is noisy: which verdict is not asserted, only that the gauges agree with it); a
    second job over the same cells replaces their series, none left over."""
    agent = trusted_agent(agents, options=["--name", "mac-bench", "--prometheus", "127.0.0.1:0"])
    found = re.search(r"metrics on http://127\.0\.0\.1:(\d+)/metrics", agent.log_text())
    assert found, agent.log_text()
    port = int(found.group(1))
    assert not bench_series(scrape(port))  # nothing measured yet: no series, no NaN
    matrix = {"n_prompt": [16], "n_gen": [4], "n_depth": [0, 8], "models": ["small"]}
    matrix |= {"warmup": 0, "iterations": 2}
    client = connect(ctx, agent, timeout=60)
    try:
        first = run_job(client, matrix)
        assert len(first) == 4 and all(r["verdict"] in verdict.VERDICTS for r in first)
        assert all(verdict.COLD in r["verdict_reasons"] for r in first)  # -w 0, always
        expected = expected_series("mac-bench", first)
        assert bench_series(scrape(port)) == expected
        depths = {dict(labels)["depth"] for name, labels in expected if name == BENCH[1]}
        tests = {dict(labels)["test"] for name, labels in expected if name == BENCH[1]}
        assert depths == {"0", "8"} and tests == {"pp16", "tg4"}
        second = run_job(client, matrix)
    finally:
        client.close()
    assert bench_series(scrape(port)) == expected_series("mac-bench", second)


def cell(**fields: Any) -> dict[str, Any]:
    """A measured cell record, judged as the agent judges it."""
    record = {
        "model": "small",
        "bits": None,
        "batch_size": 1,
        "n_depth": 512,
        "test": "pp64 @ d512",
        "status": "ok",
        "error": None,
        "tokens_per_sec": 100.0,
        "ci95_tokens_per_sec": 1.0,
        "warmup_iterations": 2,
        "slept_s": 0.0,
        "flags": [],
        "settings": {},
    }
    return verdict.judge(record | fields)


CELL = (
    ("batch", "1"), ("bits", "none"), ("depth", "512"), ("host", "mac1"), ("model", "small"),
    ("test", "pp64"),
)  # fmt: skip


def test_a_cell_measured_again_replaces_its_speed_verdict_and_reasons() -> None:
    metrics = TelemetryMetrics()
    metrics.observe_cell("mac1", cell(warmup_iterations=0, ci95_tokens_per_sec=20.0))
    values = bench_series(parse(generate(metrics)))
    assert values == {
        (BENCH[0], CELL): 100.0,
        (BENCH[1], CELL): 0.0,
        (REASON, tuple(sorted((*CELL, ("reason", "cold"))))): 1.0,
        (REASON, tuple(sorted((*CELL, ("reason", "noisy"))))): 1.0,
    }
    metrics.observe_cell("mac1", cell(tokens_per_sec=120.0))
    values = bench_series(parse(generate(metrics)))
    assert values == {(BENCH[0], CELL): 120.0, (BENCH[1], CELL): 1.0}


def test_a_failed_cell_has_no_speed_and_an_unknown_reason_is_other() -> None:
    metrics = TelemetryMetrics()
    failed = cell(status="failed", error="gpu-error: timeout: Metal aborted", tokens_per_sec=None)
    assert failed["verdict_reasons"] == ["gpu-error"]
    metrics.observe_cell("mac1", failed)
    values = bench_series(parse(generate(metrics)))
    assert values == {
        (BENCH[1], CELL): 0.0,
        (REASON, tuple(sorted((*CELL, ("reason", "gpu-error"))))): 1.0,
    }
    newer = cell(bits=4) | {"verdict": "invalid", "verdict_reasons": ["thermal-runaway\n"]}
    metrics.observe_cell("mac1", newer)  # a newer agent's reason: never a free-text label
    reasons = {
        dict(labels)["reason"] for name, labels in parse(generate(metrics)) if name == REASON
    }
    assert reasons == {"gpu-error", "other"}


def test_a_record_without_a_verdict_is_judged_by_the_same_rule() -> None:
    metrics = TelemetryMetrics()
    old = {key: value for key, value in cell().items() if key != "warmup_iterations"}
    del old["verdict"], old["verdict_reasons"]
    metrics.observe_cell("mac1", old)
    values = bench_series(parse(generate(metrics)))
    assert values[(BENCH[1], CELL)] == 0.0
    assert values[(REASON, tuple(sorted((*CELL, ("reason", "unverified")))))] == 1.0


def test_the_least_recently_measured_cells_go_past_the_cap(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(metrics_module, "BENCH_CELLS_MAX", 2)
    metrics = TelemetryMetrics()
    for depth in (0, 1, 2, 0, 3):  # depth 0 measured again: 1 and 2 are the oldest
        metrics.observe_cell("mac1", cell(n_depth=depth, test=f"pp64 @ d{depth}"))
    kept = {dict(labels)["depth"] for name, labels in parse(generate(metrics)) if name in BENCH}
    assert kept == {"0", "3"}


def generate(metrics: TelemetryMetrics) -> str:
    return generate_latest(metrics.registry).decode()
