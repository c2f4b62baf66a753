"""rank.start, rank.get and rank.stop against real `agent serve` processes on loopback: two
agents each start one rank of the link benchmark and the ring runs to rank 0's report; the
agent refuses what it must (a bad body by its field, a second job, a benchmark beside a rank)
and ends a rank at its bound or when asked; rank.get carries the rank's heartbeat (its units of
progress and their age)."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from typing import Any

import psutil
import pytest
import zmq

from shared.distributed.netbench import measured_from, progress_total
from shared.io.transport import AgentClient, AgentError
from tests.fleet_support import AgentPool, connect, trusted_agent
from tests.ring_support import free_port_run

DEADLINE_S = 300.0
SPEC = {"sizes": [1024, 65536], "repetitions": 2, "warmup": 1}


def start_body(job: str, rank: int, port: int, **changes: Any) -> dict[str, Any]:
    members = [{"name": "a", "ips": ["127.0.0.1"]}, {"name": "b", "ips": ["127.0.0.1"]}]
    body = {
        "job": job,
        "kind": "netbench",
        "rank": rank,
        "members": members,
        "backend": "ring",
        "port": port,
        "spec": SPEC,
        "bound_s": DEADLINE_S,
    }
    return {**body, **changes}


def settled(client: AgentClient, job: str) -> dict[str, Any]:
    end = time.monotonic() + DEADLINE_S
    while True:
        got = client.request("rank.get", {"job": job})
        if got["state"] != "running":
            return got
        assert time.monotonic() < end, f"rank of {job} still running"
        time.sleep(0.1)


def refused(call: Callable[[], object]) -> AgentError:
    with pytest.raises(AgentError) as caught:
        call()
    return caught.value


@pytest.mark.slow
def test_two_agents_run_a_ring_to_rank_0s_report(agents: AgentPool, ctx: zmq.Context) -> None:
    first, second = (connect(ctx, trusted_agent(agents, name)) for name in ("a", "b"))
    port = free_port_run(2)
    assert first.request("rank.start", start_body("n-1", 0, port)) == {"job": "n-1", "rank": 0}
    second.request("rank.start", start_body("n-1", 1, port))
    zero, one = settled(first, "n-1"), settled(second, "n-1")
    assert (zero["state"], one["state"]) == ("ok", "ok"), (zero["error"], one["error"])
    assert one["report"] is None
    assert len(measured_from(zero["report"], SPEC["sizes"], ["a", "b"], 2)) == 4
    total = progress_total(SPEC["sizes"], ["a", "b"], SPEC["warmup"], SPEC["repetitions"])
    assert zero["progress"] == one["progress"] == total
    assert 0 <= zero["progress_age_s"] <= zero["elapsed_s"]


@pytest.mark.slow
def test_a_rank_that_cannot_move_says_so_in_its_heartbeat(
    agents: AgentPool, ctx: zmq.Context
) -> None:
    client = connect(ctx, trusted_agent(agents))
    client.request("rank.start", start_body("n-7", 0, free_port_run(2)))  # its peer never comes
    first = client.request("rank.get", {"job": "n-7"})
    end = time.monotonic() + DEADLINE_S
    while (later := client.request("rank.get", {"job": "n-7"}))["progress_age_s"] < first[
        "progress_age_s"
    ] + 1.0:
        assert time.monotonic() < end, later
        time.sleep(0.1)
    assert first["progress"] == later["progress"] == 0  # the ring never formed
    assert later["progress_age_s"] == pytest.approx(later["elapsed_s"], abs=0.5)
    stopped = client.request("rank.stop", {"job": "n-7", "why": "test over"})
    assert (stopped["state"], stopped["progress"]) == ("stopped", 0)


def test_the_agent_refuses_by_field_and_never_runs_two(agents: AgentPool, ctx: zmq.Context) -> None:
    client = connect(ctx, trusted_agent(agents))
    port = free_port_run(2)
    bad = [
        (start_body("n-2", 2, port), "rank.start: rank is 2, not one of 0…1"),
        (start_body("n-2", 0, port, backend="mpi"), "rank.start: backend is 'mpi'"),
        (start_body("n-2", 0, port, spec={**SPEC, "sizes": [64, 32]}), "spec.sizes"),
        (start_body("n-2", 0, port, spec={**SPEC, "sizes": [6]}), "float32"),
        (
            start_body("n-2", 0, port, members=[{"name": "a", "ips": ["127.0.0.1"]}] * 2),
            "lists 'a' twice",
        ),
        (start_body("n-2", 0, port, bound_s=0.5), "rank.start: bound_s"),
        (start_body("../n", 0, port), "job may hold only letters, digits"),
        (
            start_body(
                "n-2",
                0,
                port,
                members=[{"name": "a", "ips": ["mac1"]}, {"name": "b", "ips": ["127.0.0.1"]}],
            ),
            "members[0].ips has 'mac1', not an IP address",
        ),
        (
            start_body(
                "n-2",
                0,
                port,
                members=[
                    {"name": "a\x1b[2J", "ips": ["127.0.0.1"]},
                    {"name": "b", "ips": ["127.0.0.1"]},
                ],
            ),
            "members[0].name holds a control character",
        ),
    ]
    for body, problem in bad:
        error = refused(lambda body=body: client.request("rank.start", body))
        assert error.code == "bad-body" and problem in str(error), str(error)
    client.request("rank.start", start_body("n-3", 0, port))  # its peer never comes
    busy = refused(lambda: client.request("rank.start", start_body("n-4", 0, port)))
    assert busy.code == "busy" and "rank 0 of job n-3" in str(busy)
    matrix = {"n_prompt": [16], "models": ["small"]}
    busy = refused(lambda: client.request("bench.start", {"matrix": matrix}))
    assert busy.code == "busy"
    stopped = client.request("rank.stop", {"job": "n-3", "why": "test over"})
    assert (stopped["state"], stopped["error"]) == ("stopped", "test over")
    unknown = refused(lambda: client.request("rank.get", {"job": "n-9"}))
    assert unknown.code == "unknown-job"
    # A stopped rank keeps the agent busy until its process is gone (SIGTERM now, reaped at a
    # later poll of the agent's loop): on a loaded machine that outlasts one request.
    end = time.monotonic() + DEADLINE_S
    while True:
        try:
            client.request("bench.start", {"matrix": matrix})
            break
        except AgentError as error:
            assert error.code == "busy" and "rank 0 of job n-3" in str(error), str(error)
            assert time.monotonic() < end, "the stopped rank kept the agent busy"
            time.sleep(0.1)


@pytest.mark.slow
def test_a_rank_whose_peer_never_comes_fails_at_its_bound(
    agents: AgentPool, ctx: zmq.Context
) -> None:
    client = connect(ctx, trusted_agent(agents))
    client.request("rank.start", start_body("n-5", 1, free_port_run(2), bound_s=2.0))
    got = settled(client, "n-5")
    assert (got["state"], got["error"]) == ("failed", "rank 1 ran past its bound of 2 s")


@pytest.mark.slow
def test_a_rank_ends_with_its_agent(agents: AgentPool, ctx: zmq.Context) -> None:
    agent = trusted_agent(agents)
    connect(ctx, agent).request("rank.start", start_body("n-6", 0, free_port_run(2)))
    children = psutil.Process(agent.process.pid).children()
    assert len(children) == 1
    end = time.monotonic() + DEADLINE_S
    while "agent.cluster.netbench" not in " ".join(children[0].cmdline()):
        assert time.monotonic() < end, children[0].cmdline()  # empty until its exec is done
        time.sleep(0.05)
    agent.kill()  # SIGKILL: the agent gets no chance to end it; the rank's lifeline does
    gone, alive = psutil.wait_procs(children, timeout=DEADLINE_S)
    assert alive == []


def test_a_rank_whose_port_another_ring_holds_is_refused_before_it_starts(
    agents: AgentPool, ctx: zmq.Context
) -> None:
    """MLX's ring listens with SO_REUSEADDR and SO_REUSEPORT (mlx/distributed/utils.cpp), so a
    second ring on a held port would bind and join the first one's ranks: the agent asks first."""
    client = connect(ctx, trusted_agent(agents))
    port = free_port_run(2)
    with socket.socket() as other_ring:
        other_ring.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        other_ring.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        other_ring.bind(("127.0.0.1", port))
        other_ring.listen()
        error = refused(lambda: client.request("rank.start", start_body("n-5", 0, port)))
        assert error.code == "cannot-listen", str(error)
        assert f"port 127.0.0.1:{port} is in use on this machine" in str(error)
        assert "choose another --port" in str(error)
        assert refused(lambda: client.request("rank.get", {"job": "n-5"})).code == "unknown-job"
        away = [{"name": "a", "ips": ["192.0.2.1"]}, {"name": "b", "ips": ["127.0.0.1"]}]
        error = refused(
            lambda: client.request("rank.start", start_body("n-6", 0, port, members=away))
        )
        assert error.code == "cannot-listen"
        assert "192.0.2.1 is not an address of this machine" in str(error), str(error)
