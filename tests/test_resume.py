"""Runs that outlive their coordinator: `coordinator resume` after a SIGKILL, `coordinator
cancel`, and the agent's job list, against real agents on loopback and the real console
scripts."""

from __future__ import annotations

import json
import signal
import subprocess
from collections import Counter

import pytest
import zmq

from shared.io.transport import AgentError
from shared.wire import protocol as p
from tests.conftest import console_script, piped
from tests.fleet_support import LONG, AgentPool, AgentProcess, cli, connect, exchange_keys

pytestmark = pytest.mark.timeout(180)


def start_benchmark(*agents: AgentProcess, extra: tuple[str, ...] = ()) -> subprocess.Popen[str]:
    return piped(
        [
            console_script("coordinator"),
            "benchmark",
            "--hosts",
            ",".join(agent.address for agent in agents),
            *LONG,
            *extra,
            "--format",
            "json",
        ],
        start_new_session=True,
    )


def latest_run() -> dict:
    listed = cli("coordinator", "runs", "--format", "json")
    assert listed.returncode == 0, listed.stderr
    return json.loads(listed.stdout)[0]


@pytest.mark.slow
def test_resume_completes_a_run_whose_coordinator_was_killed(agents: AgentPool) -> None:
    hosts = [agents.start("mac1"), agents.start("mac2")]
    for agent in hosts:
        exchange_keys(agent)
    coordinator = start_benchmark(*hosts)
    try:
        for agent in hosts:
            agent.wait_for_cells(1)
    finally:
        coordinator.send_signal(signal.SIGKILL)
        coordinator.communicate(timeout=30)
    run = latest_run()
    assert run["status"] == "interrupted" and run["interrupted"] is True

    resumed = cli("coordinator", "resume", run["id"][:14], "--format", "json")
    assert resumed.returncode == 0, resumed.stderr
    report = json.loads(resumed.stdout)
    assert report["run_id"] == run["id"] and report["status"] == "ok"
    for agent in hosts:
        cells = [c for c in report["cells"] if c["host"] == agent.address]
        assert len(cells) == 8 and all(c["status"] == "ok" for c in cells)
        assert max(Counter(c["name"] for c in cells).values()) == 1  # none twice
    shown = cli("coordinator", "show", run["id"], "--format", "json")
    assert json.loads(shown.stdout)["cells"] == report["cells"]
    assert latest_run()["status"] == "ok"


def test_resume_of_an_unknown_run_is_a_usage_error() -> None:
    result = cli("coordinator", "resume", "r-nope")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: unknown run 'r-nope'; `coordinator runs` lists them"
    ]


@pytest.mark.slow
def test_cancel_stops_the_jobs_of_a_run(agents: AgentPool) -> None:
    agent = agents.start("mac1")
    exchange_keys(agent)
    coordinator = start_benchmark(agent)
    try:
        agent.wait_for_cells(1)
    finally:
        coordinator.send_signal(signal.SIGKILL)
        coordinator.communicate(timeout=30)
    run = latest_run()
    cancelled = cli("coordinator", "cancel", run["id"], "--format", "json")
    assert cancelled.returncode == 0, cancelled.stderr
    (row,) = json.loads(cancelled.stdout)
    assert row["host"] == agent.address and row["result"] in ("cancelled", "not running")
    again = json.loads(cli("coordinator", "cancel", run["id"], "--format", "json").stdout)
    assert again[0]["result"] == "not running"  # the job ended: nothing left to stop


@pytest.mark.slow
def test_cancel_by_host_stops_whatever_job_runs_there(agents: AgentPool) -> None:
    agent = agents.start("mac1")
    exchange_keys(agent)
    idle = json.loads(cli("coordinator", "cancel", "--hosts", agent.address, "-o", "json").stdout)
    assert idle[0]["result"] == "none" and idle[0]["job"] is None


@pytest.mark.slow
def test_the_job_list_finds_a_job_by_the_request_that_started_it(
    ctx: zmq.Context, agents: AgentPool
) -> None:
    agent = agents.start("mac1")
    exchange_keys(agent)
    client = connect(ctx, agent)
    matrix = {"n_prompt": [16], "models": ["small"], "warmup": 0, "iterations": 1}
    start = client.send("bench.start", {"matrix": matrix})
    stream = client.stream(start)
    job = next(stream).body["job"]
    for _ in stream:
        pass
    (listed,) = client.request("job.list", {})["jobs"]
    assert listed["job"] == job and listed["request"] == start.id
    assert listed["state"] == p.JOB_OK and listed["done"] == listed["total"] == 2
    with pytest.raises(AgentError, match="limit must be 1 to 100, got 0"):
        client.request("job.list", {"limit": 0})
    client.close()
