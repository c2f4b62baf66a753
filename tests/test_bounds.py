"""Bounds on everything (shared.bounds): every duration and count has a documented maximum,
refused in one line naming the option, the value and the bound; NaN and the infinities are
refused by name; the wire refuses what the CLI does; and an agent ends a job that outlives its own
bound even when its coordinator is gone."""

from __future__ import annotations

import math
import subprocess
import time

import pytest
import zmq

from agent.daemon.benchmark.deadline import BOUND_ENV, job_bound, too_long
from coordinator.commands.history import unknown_host_message
from coordinator.telemetry.store import TelemetryStore
from shared import bounds
from shared.benchmark.matrix import MatrixError, MatrixSpec
from shared.benchmark.sustain import SustainError, SustainPlan
from shared.bounds import BoundError, check_count, check_seconds, duration_text, job_bound_s
from shared.wire import protocol as p
from tests.conftest import run_cli
from tests.fleet_support import AgentPool, connect, trusted_agent
from tests.test_history_stats import sample

pytestmark = pytest.mark.timeout(120)


def one_line(result: subprocess.CompletedProcess[str]) -> str:
    lines = result.stderr.strip().splitlines()
    lines = [line for line in lines if not line.startswith("WARNING: --insecure")]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: "), lines[0]
    assert "Traceback" not in result.stderr
    return lines[0]


# --- the pure module ------------------------------------------------------------------------------


def test_duration_text_says_a_bound_as_typed() -> None:
    assert duration_text(86400) == "24h"
    assert duration_text(3600) == "1h"
    assert duration_text(90) == "90s"
    assert duration_text(120) == "2m"
    assert duration_text(7 * 86400) == "7d"


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_not_finite_is_refused_by_name(value: float) -> None:
    with pytest.raises(BoundError, match=r"^--delay must be a finite number, got"):
        check_seconds("--delay", value, 10)


def test_seconds_and_counts_name_the_value_and_the_bound() -> None:
    with pytest.raises(BoundError, match=r"--sustain must be at most 24h \(86400 s\), got 100000h"):
        check_seconds("--sustain", 3.6e8, bounds.MAX_SUSTAIN_S, shown="100000h")
    with pytest.raises(BoundError, match=r"must be > 0 seconds, got 0"):
        check_seconds("--x", 0, 10, above_least=True)
    assert check_seconds("--x", 10, 10) == 10
    with pytest.raises(BoundError, match=r"--limit must be at most 100000, got 10\*\*20|got 1"):
        check_count("--limit", 10**20, 1, bounds.MAX_RUNS_LIMIT)
    with pytest.raises(BoundError, match="whole number"):
        check_count("--limit", 1.5, 1, 10)
    assert check_count("-w", 0, 0, bounds.MAX_WARMUP) == 0


def test_a_jobs_bound_grows_with_its_spec_and_is_capped() -> None:
    small = job_bound_s(2, 0, 1)
    assert small > bounds.JOB_SLACK_S
    assert job_bound_s(20, 0, 1) > small
    assert job_bound_s(2, 0, 1, sustain_s=3600) > 2 * 3600
    assert job_bound_s(1024, 100, 1000) == bounds.MAX_JOB_S
    spec = MatrixSpec(models=("small",), n_prompt=(16,), n_gen=(0,), warmup=0, iterations=1)
    assert job_bound(spec, 1, None) == job_bound_s(1, 0, 1)
    assert too_long(10, SustainPlan(86400.0, 60.0)) is not None
    assert too_long(2, SustainPlan(60.0, 10.0)) is None


def test_bounds_is_pure() -> None:
    """tests/test_layers.py's rule, for the module every bound lives in."""
    import ast
    from pathlib import Path

    tree = ast.parse(Path(bounds.__file__).read_text(encoding="utf-8"))
    imported = {
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    } | {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert imported <= {"__future__", "math", "typing"}


# --- the wire -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value", "needle"),
    [
        ("delay_s", 1e9, "delay_s: 1e+09 s is outside 0..3600 s"),
        ("delay_s", math.nan, "delay_s: nan is not a number of seconds"),
        ("cool_start_s", math.inf, "cool_start_s: inf is not a number of seconds"),
        ("iterations", 10**6, "iterations: 1000000 is above the limit of 1000"),
        ("warmup", 101, "warmup: 101 is above the limit of 100"),
    ],
)
def test_the_wire_refuses_an_over_bound_spec_by_name(field: str, value: float, needle: str) -> None:
    data = {"models": ["small"], field: value}
    with pytest.raises(MatrixError) as refused:
        MatrixSpec.from_dict(data)
    assert needle in str(refused.value)


def test_the_wire_refuses_an_over_bound_sustain_by_name() -> None:
    with pytest.raises(SustainError, match=r"duration_s must be at most 24h \(86400 s\)"):
        SustainPlan.from_dict({"duration_s": 3.6e8, "window_s": 10.0})
    with pytest.raises(SustainError, match=r"window_s must be at most 1h"):
        SustainPlan.from_dict({"duration_s": 86400.0, "window_s": 7200.0})


# --- the command lines ----------------------------------------------------------------------------

SMALL = ["--config-small"]


@pytest.mark.parametrize(
    ("command", "needle"),
    [
        (
            ["coordinator", "benchmark", *SMALL, "--sustain", "100000h"],
            "--sustain must be at most 24h (86400 s), got 100000h",
        ),
        (
            ["coordinator", "benchmark", *SMALL, "--sustain", "60s", "--sustain-window", "2h"],
            "--sustain-window must be at most 1h (3600 s), got 2h",
        ),
        (["agent", "bench", *SMALL, "--delay", "1e5"], "--delay must be at most 1h (3600 s)"),
        (["agent", "bench", *SMALL, "--delay", "nan"], "--delay must be a finite number, got nan"),
        (
            ["agent", "bench", *SMALL, "--cool-start-limit", "inf"],
            "--cool-start-limit must be a finite number, got inf",
        ),
        (["agent", "bench", *SMALL, "-w", "1000"], "--warmup must be at most 100, got 1000"),
        (["agent", "bench", *SMALL, "-r", "100000"], "--repetitions: 100000 is above the limit"),
        (
            ["agent", "bench", *SMALL, "-r", "auto", "--max-repetitions", "5000"],
            "--max-repetitions must be",
        ),
        (["agent", "bench", *SMALL, "-p", "16,99999999"], "--n-prompt item 2: prompt length"),
        (["agent", "bench", *SMALL, "-n", "100000"], "--n-gen item 1: generation length"),
        (["agent", "bench", *SMALL, "-b", "5000"], "--batch-sizes item 1: batch size 5000"),
        (["agent", "bench", *SMALL, "-d", "9999999"], "--n-depth item 1: depth 9999999"),
        (
            ["agent", "bench", *SMALL, "--pause-temp", "nan"],
            "--pause-temp must be a finite number, got nan",
        ),
        (
            ["agent", "bench", *SMALL, "--stop-temp", "inf"],
            "--stop-temp must be a finite number, got inf",
        ),
        (
            ["agent", "bench", *SMALL, "--idle-baseline", "1e9"],
            "--idle-baseline must be at most 1h",
        ),
        (["agent", "temp", "--poll-interval", "1e9"], "--poll-interval must be at most 1h"),
        (
            ["coordinator", "status", "--hosts", "127.0.0.1:9", "--connect-timeout", "1e9"],
            "--connect-timeout must be at most 1h (3600 s), got 1e+09",
        ),
        (
            ["coordinator", "doctor", "--hosts", "127.0.0.1:9", "--connect-timeout", "nan"],
            "--connect-timeout must be a finite number, got nan",
        ),
        (
            ["coordinator", "benchmark", *SMALL, "--host-timeout", "1e12"],
            "--host-timeout must be at most 24h",
        ),
        (
            ["coordinator", "runs", "--limit", "100000000000000000000"],
            "--limit must be at most 100000, got 100000000000000000000",
        ),
        (["coordinator", "runs", "--limit", "0"], "--limit must be at least 1, got 0"),
        (
            ["coordinator", "monitor", "--once", "--retention-days", "1e9"],
            "--retention-days must be at most 3650 days",
        ),
        (["agent", "run", "--grace", "1e9", "--", "true"], "--grace must be at most 1h"),
        (
            [
                "agent",
                "serve",
                "--insecure",
                "--bind",
                "127.0.0.1:0",
                "--parent-pid",
                "1" + "0" * 20,
            ],
            "--parent-pid must be a process id, 1 to 4194304",
        ),
        (["agent", "temp", "--count", "10000000"], "--count must be 0 to 1000000"),
    ],
)
@pytest.mark.slow
def test_an_over_bound_option_is_one_line_naming_it(command: list[str], needle: str) -> None:
    result = run_cli(*command, timeout=60)
    assert result.returncode == 2, result.stderr
    assert needle in one_line(result)


# --- messages that name the real problem ----------------------------------------------------------


def test_history_names_a_host_the_store_does_not_hold() -> None:
    with TelemetryStore() as store:
        store.add([("mac1:5555", sample(time.time() - 60, 50.0))])
    result = run_cli("coordinator", "history", "--hosts", "mac11")
    assert result.returncode == 2
    line = one_line(result)
    assert "host mac11:5555 is not in the telemetry store" in line
    assert "did you mean mac1:5555?" in line and "(recorded: mac1:5555)" in line
    fine = run_cli("coordinator", "history", "--hosts", "mac1", "--format", "json")
    assert fine.returncode == 0, fine.stderr


def test_unknown_host_message_without_any_host() -> None:
    assert "no host is recorded yet" in unknown_host_message("typo:5555", [])


def test_serve_names_a_bind_address_that_cannot_resolve() -> None:
    result = run_cli("agent", "serve", "--bind", "nosuch.invalid:0", "--insecure", timeout=60)
    assert result.returncode == 2
    line = one_line(result)
    assert "--bind nosuch.invalid:0: cannot resolve nosuch.invalid" in line
    assert "No such device" not in line


# --- the agent's own bound on a job -------------------------------------------------------------


@pytest.mark.slow
def test_the_agent_ends_a_job_past_its_bound_with_its_coordinator_gone(
    agents: AgentPool, monkeypatch: pytest.MonkeyPatch, ctx: zmq.Context
) -> None:
    """A job whose bound is 3 s (MLX_FLEET_JOB_BOUND_S) and whose spec waits a minute between its
    two cells: its coordinator leaves at once, and the agent cancels it by itself, saying why."""
    monkeypatch.setenv(BOUND_ENV, "3")
    agent = trusted_agent(agents)
    matrix = {
        "models": ["small"],
        "n_prompt": [16, 32],
        "n_gen": [0],
        "warmup": 0,
        "iterations": 1,
        "delay_s": 600.0,
    }
    client = connect(ctx, agent, timeout=30)
    start = client.send("bench.start", {"matrix": matrix})
    deadline = time.monotonic() + 60
    job_id = None
    while job_id is None:
        assert time.monotonic() < deadline, "no bench.start.ok"
        if client.sock.poll(1000):
            message = p.decode(client.sock.recv())
            if message.re == start.id:
                assert message.type == "bench.start.ok", message.body
                job_id = message.body["job"]
    client.close()  # the coordinator is gone

    watcher = connect(ctx, agent, timeout=30)
    try:
        deadline = time.monotonic() + 90
        while True:
            page = watcher.fetch("job.get", {"job": job_id, "offset": 0}, timeout=30)
            if page["state"] != "running":
                break
            assert time.monotonic() < deadline, "the agent did not end the job past its bound"
            time.sleep(0.2)
    finally:
        watcher.close()
    assert page["state"] == p.JOB_CANCELLED
    assert "ran past its bound of 3 s" in page["error"]
    assert "ran past its bound" in agent.log_text()
