"""The protocol's limits on real sockets: the size that really arrives under CURVE, pages that
stay under it, and the requests the agent refuses from whom (docs/protocol.md §4, §5, §7)."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
import zmq

from agent.daemon.benchmark.jobs import job_page
from shared.benchmark.matrix import MAX_CELLS, MAX_MODEL_LENGTH
from shared.io.keys import own_keypair
from shared.io.transport import AgentClient, AgentError
from shared.wire import protocol as p
from tests.fleet_support import AgentPool, AgentProcess, connect, trusted_agent

pytestmark = pytest.mark.timeout(120)


def curve_pair(ctx: zmq.Context) -> tuple[zmq.Socket, zmq.Socket]:
    """A ROUTER (CURVE server) and a DEALER connected to it, both with the protocol's
    maxmsgsize, as the agent and the coordinator set them."""
    server_public, server_secret = zmq.curve_keypair()
    client_public, client_secret = zmq.curve_keypair()
    router = ctx.socket(zmq.ROUTER)
    router.curve_server = True
    router.curve_publickey, router.curve_secretkey = server_public, server_secret
    dealer = ctx.socket(zmq.DEALER)
    dealer.curve_serverkey = server_public
    dealer.curve_publickey, dealer.curve_secretkey = client_public, client_secret
    for sock in (router, dealer):
        sock.linger = 0
        sock.maxmsgsize = p.MAX_MESSAGE_SIZE
    port = router.bind_to_random_port("tcp://127.0.0.1")
    dealer.connect(f"tcp://127.0.0.1:{port}")
    return router, dealer


def arrives(ctx: zmq.Context, size: int, wait_s: float) -> bool:
    router, dealer = curve_pair(ctx)
    try:
        dealer.send(b"x" * size)
        if not router.poll(wait_s * 1000):
            return False
        return len(router.recv_multipart()[1]) == size
    finally:
        router.close()
        dealer.close()


@pytest.mark.slow
def test_the_largest_message_that_arrives_under_curve_is_the_usable_size(
    ctx: zmq.Context,
) -> None:
    """CURVE's MESSAGE command adds 33 bytes that count against maxmsgsize: an envelope of
    MAX_ENVELOPE_SIZE arrives, one byte more is dropped with its connection."""
    assert arrives(ctx, p.MAX_ENVELOPE_SIZE, wait_s=30)
    assert not arrives(ctx, p.MAX_ENVELOPE_SIZE + 1, wait_s=3)


def hello_of_size(size: int, message_id: str = "big") -> bytes:
    """A valid `hello` whose envelope is exactly `size` bytes."""

    def packed(client: str) -> bytes:
        body = {"client": client, "version": None}
        envelope = {"v": p.PROTOCOL_VERSION, "id": message_id, "type": "hello", "re": None}
        return msgpack.packb(envelope | {"body": body})

    data = packed("c" * (size - len(packed("")) - 4))  # str32 header: 4 bytes more than fixstr
    assert len(data) == size
    return data


def raw_socket(ctx: zmq.Context, agent: AgentProcess, keys_home: Any = None) -> zmq.Socket:
    keypair = own_keypair(keys_home) if keys_home else own_keypair()
    sock = ctx.socket(zmq.DEALER)
    sock.linger = 0
    sock.maxmsgsize = p.MAX_MESSAGE_SIZE
    if agent.key:
        sock.curve_secretkey = keypair.secret.encode()
        sock.curve_publickey = keypair.public.encode()
        sock.curve_serverkey = agent.key.encode()
    sock.connect(f"tcp://{agent.address}")
    return sock


def ask(sock: zmq.Socket, data: bytes) -> p.Message:
    sock.send(data)
    assert sock.poll(30_000), "no reply"
    return p.decode(sock.recv())


def test_the_agent_answers_a_message_of_the_usable_size(
    ctx: zmq.Context, agents: AgentPool
) -> None:
    sock = raw_socket(ctx, trusted_agent(agents))
    reply = ask(sock, hello_of_size(p.MAX_ENVELOPE_SIZE))
    assert reply.type == "hello.ok" and reply.re == "big"


def test_an_insecure_agent_refuses_what_is_above_the_usable_size(
    ctx: zmq.Context, agents: AgentPool
) -> None:
    """Without CURVE a message up to maxmsgsize arrives; the envelope limit still holds."""
    sock = raw_socket(ctx, agents.start(insecure=True))
    reply = ask(sock, hello_of_size(p.MAX_ENVELOPE_SIZE + 1))
    assert reply.type == "error" and reply.body["code"] == p.TOO_LARGE


def test_a_job_page_stays_under_the_limit_with_the_largest_spec() -> None:
    """job.get echoes the spec and the models: records fill what they leave, and every record
    is on exactly one page."""
    models = [f"/models/{i:04d}/" + "m" * (MAX_MODEL_LENGTH - 14) for i in range(MAX_CELLS)]
    found = {
        "job": "j-1",
        "state": "ok",
        "error": None,
        "spec": {"models": models, "n_prompt": [16], "batch_sizes": [1]},
        "models": [{"label": m, "param_count": 1} for m in models],
        "records": [{"name": m, "index": i, "error": "e" * 1500} for i, m in enumerate(models)],
        "started": "t",
        "finished": "t",
    }
    seen: list[dict[str, Any]] = []
    offset: int | None = 0
    while offset is not None:
        page = job_page(found, offset)
        assert len(p.encode(p.make("job.get.ok", page, re="r" * 64))) <= p.MAX_ENVELOPE_SIZE
        assert page["records"]
        seen += page["records"]
        offset = page["next"]
    assert seen == found["records"]


def test_job_event_is_refused_from_a_coordinator(ctx: zmq.Context, agents: AgentPool) -> None:
    agent = trusted_agent(agents)
    client = connect(ctx, agent)
    event = {
        "job": "fake",
        "pid": 4242,
        "action": "start",
        "time": 1.0,
        "celsius": None,
        "source": "none",
        "simulated": False,
        "detail": "a job that does not exist",
        "policy": None,
        "seq": None,
    }
    with pytest.raises(AgentError) as refused:
        client.request("job.event", event)
    assert refused.value.code == p.FORBIDDEN
    coordinator = raw_socket(ctx, agent)
    for body in ({}, {"job": 7}, event | {"action": "teleport"}):  # forbidden before the body
        assert ask(coordinator, request("job.event", body)).body["code"] == p.FORBIDDEN, body
    coordinator.close()
    assert client.request("info")["jobs"] == []
    local = raw_socket(ctx, agent, agent.home / "keys")  # the agent's own key, as agent run's
    assert ask(local, request("job.event", {})).body["code"] == p.BAD_BODY  # the body's turn
    least = {"job": "terse", "pid": 4243, "action": "start", "time": 2.0, "source": "none"}
    terse = ask(local, request("job.event", least | {"simulated": False}))  # nil ones omitted
    assert (terse.type, terse.body) == ("job.event.ok", {"job": "terse"})
    local.close()
    assert [j["job"] for j in client.request("info")["jobs"]] == ["terse"]
    own = AgentClient(ctx, agent.address, agent.key, own_keypair(agent.home / "keys"), 5.0)
    own.connect()
    with pytest.raises(AgentError) as unknown:
        own.request("job.event", event | {"action": "teleport"})
    assert unknown.value.code == p.BAD_BODY and "unknown action 'teleport'" in str(unknown.value)
    assert own.request("job.event", event) == {"job": "fake"}
    assert [j["job"] for j in own.request("info")["jobs"]] == ["terse", "fake"]
    own.close()
    client.close()


def request(type_: str, body: Any) -> bytes:
    """An envelope AgentClient would not send (a body of any shape)."""
    envelope = {"v": p.PROTOCOL_VERSION, "id": p.new_id(), "type": type_, "re": None}
    return msgpack.packb(envelope | {"body": body})


def test_every_limit_out_of_its_range_is_a_bad_body(ctx: zmq.Context, agents: AgentPool) -> None:
    """One rule for every page limit (§5): nil takes the default, 1 to the maximum is served,
    anything else is refused naming the range, never cut silently."""
    client = connect(ctx, trusted_agent(agents))
    history = {"samples_after": 0, "events_after": 0}
    for type_, body, most in (
        ("history.get", history, 10_000),
        ("job.list", {}, 100),
    ):
        for limit in (0, -1, most + 1, 2**63 - 1):
            with pytest.raises(AgentError) as refused:
                client.request(type_, body | {"limit": limit})
            assert refused.value.code == p.BAD_BODY
            assert str(refused.value) == f"{type_}: limit must be 1 to {most}, got {limit}"
        for limit in (None, 1, most):
            client.request(type_, body | {"limit": limit})
    client.close()


@pytest.mark.parametrize(
    ("type_", "body", "needle"),
    [
        ("job.get", {"job": "j-1", "offset": -1}, "offset must be 0 to"),
        ("history.get", {"samples_after": 2**64 - 1, "events_after": 0}, "samples_after"),
        ("history.get", {"samples_after": 0, "events_after": -5}, "events_after"),
    ],
)
def test_offsets_and_cursors_out_of_range_are_bad_bodies(
    ctx: zmq.Context, agents: AgentPool, type_: str, body: dict[str, Any], needle: str
) -> None:
    client = connect(ctx, trusted_agent(agents))
    with pytest.raises(AgentError) as refused:
        client.request(type_, body)
    assert refused.value.code == p.BAD_BODY and needle in str(refused.value)
    client.close()
