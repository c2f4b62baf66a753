"""`agent serve` as a real process on loopback, driven by the coordinator's real client and by
raw sockets for what a well-behaved client never sends."""

from __future__ import annotations

import re
import signal
import socket
import time
from collections.abc import Iterator
from typing import Any

import msgpack
import psutil
import pytest
import zmq

from shared.io.keys import new_keypair, own_keypair
from shared.io.transport import AgentClient, AgentError, HostError
from shared.io.trust import trust
from shared.wire import protocol as p
from tests.fleet_support import AgentPool, AgentProcess, connect, raw_dealer, trusted_agent

pytestmark = pytest.mark.timeout(60)

QUICK_MATRIX = {
    "n_prompt": [16],
    "models": ["small"],
    "n_gen": [4],
    "warmup": 0,
    "iterations": 1,
}
LONG_MATRIX = {
    "n_prompt": [16, 32, 48],
    "models": ["small"],
    "n_gen": [8],
    "n_depth": [0, 32],
    "warmup": 0,
    "iterations": 3,
}


def run_job(client: AgentClient, matrix: dict[str, Any]) -> list[p.Message]:
    return list(client.stream(client.send("bench.start", {"matrix": matrix})))


def start_job(
    ctx: zmq.Context, agents: AgentPool, matrix: dict[str, Any]
) -> tuple[AgentProcess, AgentClient, Iterator[p.Message], str]:
    """A trusted agent given `matrix`: the agent, the client that started the job, the job's
    stream past bench.start.ok, and the job's id."""
    agent = trusted_agent(agents)
    client = connect(ctx, agent)
    stream = client.stream(client.send("bench.start", {"matrix": matrix}))
    return agent, client, stream, next(stream).body["job"]


def test_hello_ping_info(ctx: zmq.Context, agents: AgentPool) -> None:
    agent = trusted_agent(agents)
    client = AgentClient(ctx, agent.address, agent.key, own_keypair(), 5.0)
    hello = client.connect()
    assert hello["protocol"] == p.PROTOCOL_VERSION and hello["secure"] is True
    assert client.request("ping")["job"] is None
    info = client.request("info")
    assert info["machine"]["hostname"] and info["machine"]["mlx_version"]
    assert info["thermal"]["source"] == "none" and info["thermal"]["reading"] is None
    assert info["job"] is None
    client.close()


def test_a_job_streams_every_cell_then_job_get_returns_them(
    ctx: zmq.Context, agents: AgentPool
) -> None:
    client = connect(ctx, trusted_agent(agents))
    stream = run_job(client, QUICK_MATRIX)
    types = [m.type for m in stream]
    assert types[0] == "bench.start.ok" and types[-1] == "bench.done"
    assert types.count("bench.cell") == 2
    models = [m.body["model"] for m in stream if m.type == "bench.progress" and m.body["model"]]
    assert [m["label"] for m in models] == ["small/f16"]
    job_id = stream[0].body["job"]
    assert stream[-1].body == {"job": job_id, "status": "ok", "error": None, "cells": 2}
    cells = [m.body["record"] for m in stream if m.type == "bench.cell"]
    assert [c["test"] for c in cells] == ["pp16", "tg4"]
    fetched = client.request("job.get", {"job": job_id})
    assert fetched["state"] == "ok" and fetched["records"] == cells
    assert fetched["models"] == models and fetched["next"] is None
    client.close()


@pytest.mark.slow
def test_a_running_job_keeps_others_out_until_it_is_cancelled(
    ctx: zmq.Context, agents: AgentPool
) -> None:
    agent = trusted_agent(agents)
    client = connect(ctx, agent)
    other = connect(ctx, agent)
    stream = client.stream(client.send("bench.start", {"matrix": LONG_MATRIX}))
    job_id = next(stream).body["job"]
    with pytest.raises(AgentError) as busy:
        other.request("bench.start", {"matrix": QUICK_MATRIX})
    assert busy.value.code == p.BUSY and job_id in str(busy.value)
    assert other.request("ping")["job"] == job_id
    assert other.request("info")["job"]["id"] == job_id
    assert other.request("bench.cancel", {"job": job_id}) == {"job": job_id}
    rest = list(stream)
    done = rest[-1].body
    assert done["status"] == "cancelled"
    streamed = [m.body["record"] for m in rest if m.type == "bench.cell"]
    assert done["cells"] == len(streamed) < 8
    fetched = other.request("job.get", {"job": job_id})
    assert fetched["state"] == "cancelled" and fetched["records"] == streamed
    with pytest.raises(AgentError) as not_running:
        other.request("bench.cancel", {"job": job_id})
    assert not_running.value.code == p.NOT_RUNNING
    with pytest.raises(AgentError) as unknown:
        other.request("job.get", {"job": "j-nope"})
    assert unknown.value.code == p.UNKNOWN_JOB
    assert run_job(other, QUICK_MATRIX)[-1].body["status"] == "ok"  # free again
    client.close()
    other.close()


@pytest.mark.parametrize(
    ("matrix", "needle"),
    [
        ({"n_prompt": [8, -1], "models": ["small"]}, "n_prompt[1]: prompt length -1 must be"),
        (
            {"n_prompt": [0], "n_gen": [0], "models": ["small"]},
            "n_prompt, n_gen, n_pg: nothing to measure",
        ),
        (
            {"models": ["small", "/no/such/model"]},
            "models[1]: model directory /no/such/model does not exist",
        ),
        (
            {"n_prompt": [16], "flavour": "x", "models": ["small"]},
            "unknown matrix field(s): flavour",
        ),
        ({"n_prompt": [16]}, "models: missing; name the models to run"),
        ({"models": ["/" + "x" * 4999]}, "models[0]: model '/xxx"),
        ({"models": ["/" + "x" * 300]}, "models[0]: model directory /xxx"),
        (
            {"models": ["small"], "batch_sizes": [1_000_000]},
            "batch_sizes[0]: batch size 1000000 is above the limit of 1024",
        ),
        ({"models": ["small"], "n_gen": [9000]}, "n_gen[0]: generation length 9000 is above"),
        ({"models": ["small"], "precision": 1.5}, "precision: 1.5 must be above 0 and below 1"),
    ],
)
@pytest.mark.slow
def test_the_agent_rejects_a_bad_matrix_with_its_reason(
    ctx: zmq.Context, agents: AgentPool, matrix: dict[str, Any], needle: str
) -> None:
    """Every bad-matrix message names the wire field first (docs/protocol.md §5), and so does
    a refused `sustain`."""
    client = connect(ctx, trusted_agent(agents))
    with pytest.raises(AgentError) as rejected:
        client.request("bench.start", {"matrix": matrix})
    assert rejected.value.code == p.BAD_MATRIX
    assert str(rejected.value).startswith(f"matrix rejected: {needle}"), str(rejected.value)
    sustain = {"duration_s": 3, "window_s": 2}
    with pytest.raises(AgentError) as short:
        client.request("bench.start", {"matrix": QUICK_MATRIX, "sustain": sustain})
    assert short.value.code == p.BAD_MATRIX
    assert str(short.value).startswith(
        "sustain rejected: duration_s 3 s is shorter than two windows of 2 s: give a longer "
        "duration_s or a shorter window_s"
    )
    client.close()


def envelope(**overrides: Any) -> bytes:
    return msgpack.packb(
        {"v": p.PROTOCOL_VERSION, "id": "m1", "type": "ping", "re": None, "body": {}} | overrides
    )


@pytest.mark.parametrize(
    ("frames", "code", "re"),
    [
        ([b"\x92\x01"], p.MALFORMED, None),  # a msgpack list
        ([b"\xc1"], p.MALFORMED, None),
        ([envelope(), b"second frame"], p.MALFORMED, None),
        ([envelope(v=9)], p.BAD_VERSION, "m1"),
        ([envelope(type="explode")], p.UNKNOWN_TYPE, "m1"),
        ([envelope(type="bench.start", body={"matrix": 5})], p.BAD_BODY, "m1"),
        ([envelope(type="ping.ok", body={"job": None, "time": 1.0})], p.NOT_A_REQUEST, "m1"),
    ],
)
def test_malformed_messages_get_error_replies(
    ctx: zmq.Context, agents: AgentPool, frames: list[bytes], code: str, re: str | None
) -> None:
    sock = raw_dealer(ctx, trusted_agent(agents))
    sock.send_multipart(frames)
    assert sock.poll(5000), "no reply"
    reply = p.decode(sock.recv())
    assert reply.type == "error" and reply.body["code"] == code and reply.re == re
    sock.send(envelope(id="m2"))  # still serving
    assert sock.poll(5000)
    assert p.decode(sock.recv()).type == "ping.ok"


@pytest.mark.slow
def test_sigterm_stops_the_job_keeps_its_cells_and_exits_0(
    ctx: zmq.Context, agents: AgentPool
) -> None:
    agent, client, stream, job_id = start_job(ctx, agents, LONG_MATRIX)
    first = next(m for m in stream if m.type == "bench.cell")
    agent.process.send_signal(signal.SIGTERM)
    sent = time.monotonic()
    rest = [first, *stream]
    assert agent.process.wait(timeout=15) == 0
    assert time.monotonic() - sent < 10
    assert rest[-1].type == "bench.done" and rest[-1].body["status"] == "cancelled"
    streamed = [m.body["record"] for m in rest if m.type == "bench.cell"]
    client.close()
    # The journal outlives the process: a new agent on the same home serves the job again.
    again = agents.start("agent")
    fetched = connect(ctx, again).request("job.get", {"job": job_id})
    assert fetched["state"] == "cancelled" and fetched["records"] == streamed


def test_sigterm_when_idle_exits_at_once(agents: AgentPool) -> None:
    agent = agents.start()
    agent.process.send_signal(signal.SIGTERM)
    sent = time.monotonic()
    assert agent.process.wait(timeout=10) == 0
    assert time.monotonic() - sent < 3
    assert "stopped" in agent.log_text()


@pytest.mark.slow
def test_a_killed_job_process_fails_its_cell_and_a_new_one_runs_the_rest(
    ctx: zmq.Context, agents: AgentPool
) -> None:
    agent, client, stream, job_id = start_job(ctx, agents, LONG_MATRIX)
    next(m for m in stream if m.type == "bench.cell")
    (child,) = psutil.Process(agent.process.pid).children()
    child.send_signal(signal.SIGKILL)
    rest = list(stream)
    done = rest[-1].body
    assert done["status"] == "ok" and done["cells"] == 8
    records = client.request("job.get", {"job": job_id})["records"]
    failed = [r for r in records if r["status"] != "ok"]
    assert len(records) == 8 and len(failed) == 1
    form = (
        r"the job process died \(killed by SIGKILL\) while measuring this cell: "
        rf"(.+) \(log: (.+)/job-logs/{job_id}\.log\)"
    )
    crashed = re.fullmatch(form, failed[0]["error"])
    assert crashed, failed[0]["error"]
    assert crashed[2] == str(agent.home)
    assert records[-1]["status"] == "ok"
    assert run_job(client, QUICK_MATRIX)[-1].body["status"] == "ok"
    client.close()


def test_a_job_process_killed_before_it_wrote_anything_says_so(
    ctx: zmq.Context, agents: AgentPool
) -> None:
    """The error keeps its one form when there are no last lines to quote: `it wrote nothing`,
    and the log it names is there (kept, empty)."""
    agent, client, stream, job_id = start_job(ctx, agents, QUICK_MATRIX)
    deadline = time.monotonic() + 30
    while not (children := psutil.Process(agent.process.pid).children()):
        assert time.monotonic() < deadline, "no job process"
        time.sleep(0.001)
    children[0].send_signal(signal.SIGKILL)  # still starting Python: it has written nothing
    rest = list(stream)
    assert rest[-1].body["status"] == "ok" and rest[-1].body["cells"] == 2
    log = agent.home / "job-logs" / f"{job_id}.log"
    said = f"it wrote nothing (log: {log})"
    records = client.request("job.get", {"job": job_id})["records"]
    assert [r["error"] for r in records] == [
        f"the job process died (killed by SIGKILL) while building its model: {said}"
    ] * 2
    assert log.is_file() and log.stat().st_size == 0
    client.close()


def test_an_untrusted_coordinator_is_refused_and_others_served(
    ctx: zmq.Context, agents: AgentPool
) -> None:
    agent = agents.start()
    began = time.monotonic()
    with pytest.raises(HostError, match="refused our key") as refused:
        connect(ctx, agent)
    assert time.monotonic() - began < 5
    assert own_keypair().public in str(refused.value)
    assert "refused a coordinator: key " + own_keypair().public in agent.log_text()
    trust(own_keypair().public, directory=agent.home / "keys" / "trusted")
    assert connect(ctx, agent).request("ping")["job"] is None


@pytest.mark.slow
def test_a_wrong_server_key_or_a_security_mismatch_is_named(
    ctx: zmq.Context, agents: AgentPool
) -> None:
    agent = trusted_agent(agents)
    impostor_key = new_keypair()[0]
    with pytest.raises(HostError, match="server key we hold"):
        AgentClient(ctx, agent.address, impostor_key, own_keypair(), 3.0).connect()
    insecure = agents.start("insecure", insecure=True)
    assert "CURVE is OFF" in insecure.log_text()
    # libzmq usually reports the mechanism mismatch; under load it can show only as bare
    # handshake failures, whose diagnosis names --insecure as the other possible cause.
    with pytest.raises(HostError, match="security mismatch|or the agent runs --insecure"):
        AgentClient(ctx, insecure.address, agent.key, own_keypair(), 3.0).connect()
    plain = AgentClient(ctx, insecure.address, None, None, 3.0)
    assert plain.connect()["secure"] is False
    plain.close()


@pytest.mark.slow
def test_nobody_listening_is_reported_within_the_timeout(
    ctx: zmq.Context, agents: AgentPool
) -> None:
    agent = agents.start()
    agent.kill()
    began = time.monotonic()
    with pytest.raises(HostError, match="connection refused"):
        AgentClient(ctx, agent.address, agent.key, own_keypair(), 1.0).connect()
    assert time.monotonic() - began < 2


def test_ipv6_loopback(ctx: zmq.Context, agents: AgentPool) -> None:
    if not socket.has_ipv6:
        pytest.skip("this Python has no IPv6")
    try:
        agent = agents.start("v6", bind_host="[::1]")
    except AssertionError as exc:
        pytest.skip(f"cannot bind [::1]: {exc}")
    assert agent.address.startswith("[::1]:")
    trust(own_keypair().public, "test", directory=agent.home / "keys" / "trusted")
    assert connect(ctx, agent).request("ping")["job"] is None
