"""One coordinator-side connection to one agent: a DEALER socket, the CURVE handshake with a
diagnosis when it fails, request/reply by message id, and a job stream kept honest by
application-level heartbeats (zguide's Paranoid Pirate: ping when quiet, give up after
HEARTBEAT_LIVENESS silent intervals).

An AgentClient belongs to one thread; a fleet run gives each host its own.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import zmq
from zmq.utils.monitor import recv_monitor_message

from shared.io.keys import Keypair
from shared.shapes import Invalid
from shared.wire import protocol as p
from shared.wire.agent_shapes import check_agent_body

HEARTBEAT_INTERVAL_S = 1.0
HEARTBEAT_LIVENESS = 5
"""An agent silent for this many intervals (pings unanswered) is declared dead: ~5 s."""
REQUEST_TIMEOUT_S = 10.0
WAIT_SLICE_S = 0.1
"""The longest a connect waits before it looks at its stop flag again: Ctrl-C ends it at once,
not when --connect-timeout runs out."""
CANCEL_WAIT_S = 10.0
"""After bench.cancel, how long to wait for the job's bench.done before giving up on it."""


class HostError(Exception):
    """A host that cannot be used or stopped answering; the message says why."""


class AgentError(HostError):
    """The agent answered with an error; `code` is the protocol's error code."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class InvalidMessage(HostError):
    """The agent sent a message that is not valid (docs/protocol.md §4, §5, §10): a broken or
    hostile agent, not a network fault, so a retry changes nothing. `problem` names the message
    and the field, `version` the agent's."""

    def __init__(self, problem: str, version: str = "version unknown") -> None:
        super().__init__(f"sent an invalid {problem} (agent {version})")
        self.problem, self.version = problem, version

    def replying(self, request: str) -> InvalidMessage:
        """The same problem, told as the reply to `request`."""
        answer = InvalidMessage(self.problem, self.version)
        answer.args = (f"answered {request} with an invalid reply: {self.problem} "
                       f"(agent {self.version})",)  # fmt: skip
        return answer


class StreamLost(HostError):
    """The job's stream can no longer be trusted to be whole: the DEALER reconnected (the agent
    sends the stream to the connection that is gone), a cell or the bench.done says some were
    lost, or a ping.ok names no job or another. The job may well run on: follow it with job.get
    from the first cell missing (docs/protocol.md §6)."""


UNKNOWN_VERSION = "version unknown"
LINK_EVENTS = zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED | zmq.EVENT_HANDSHAKE_SUCCEEDED
"""What a LinkWatch hears: a connection dropped, or a new one made."""


class LinkWatch:
    """The socket monitor of a connected DEALER. ZeroMQ reconnects a DEALER by itself, and the
    agent's ROUTER knows the new connection as another identity: whatever it sent the old one
    (a reply, the job's stream) is dropped, and only these events say so."""

    def __init__(self, sock: zmq.Socket) -> None:
        self.sock = sock
        # A unique endpoint, as in AgentClient.connect().
        self.monitor = sock.get_monitor_socket(LINK_EVENTS, f"inproc://links.{p.new_id()}")

    def events(self) -> list[int]:
        """The link events since the last call, oldest first."""
        seen = []
        while self.monitor.poll(0):
            seen.append(int(recv_monitor_message(self.monitor)["event"]))
        return seen

    def close(self) -> None:
        if not self.sock.closed:
            self.sock.disable_monitor()
        self.monitor.close(linger=0)


HANDSHAKE_FAILURES_TO_CONCLUDE = 10
"""A bare handshake failure is ambiguous: a mechanism mismatch against a freshly started agent
often shows as a few resets before its own event. Ten in a row (about 1.5 s of retries) mean a
wrong server key; a connect timeout that comes first says the same."""
WRONG_KEY = (
    "CURVE handshake failed: the server key we hold for this host is not the agent's "
    "(run `agent keys show` there, then `coordinator keys add HOST:PORT KEY`), or the "
    "agent runs --insecure"
)


def handshake_diagnosis(
    events: list[tuple[int, int]], our_key: str | None, curve: bool = True
) -> str | None:
    """Why a connection never became usable, from its socket monitor events; None while
    nothing conclusive happened. Pure, so each case is testable without a network. Without
    `curve` (--insecure) no key can be wrong: failed handshakes mean a peer that is no agent."""
    failures = 0
    for event, value in events:
        if event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
            fix = f"; on that host run: agent keys trust '{our_key}'" if our_key else ""
            return (
                f"refused our key (ZAP status {value}): the agent does not trust this "
                f"coordinator's public key{fix}"
            )
        if (
            event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
            and value == zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH
        ):
            return (
                "security mismatch: one side runs CURVE and the other does not "
                "(agent serve --insecure needs coordinator --insecure, and vice versa)"
            )
        if event in (zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL, zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL):
            failures += 1
    if failures < HANDSHAKE_FAILURES_TO_CONCLUDE:
        return None
    return WRONG_KEY if curve else NOT_ZMTP


NOT_ZMTP = (
    "the handshake keeps failing without CURVE: is this an mlx-fleet agent? (something else "
    "may listen on that port: `agent serve` listens on port 5555 by default)"
)


NOT_AN_AGENT = (
    "TCP connected but the handshake did not complete within {timeout:g} s: is this an "
    "mlx-fleet agent? (something else may listen on {address}: `agent serve` listens on port "
    "5555 by default)"
)


def timeout_diagnosis(
    events: list[tuple[int, int]], timeout: float, address: str = "that port", curve: bool = True
) -> str:
    """What a connect that timed out without a conclusive event most likely met."""
    kinds = {event for event, _ in events}
    if zmq.EVENT_HANDSHAKE_SUCCEEDED in kinds:
        return f"connected, but the agent did not answer within {timeout:g} s"
    if kinds & {zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL, zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL}:
        return WRONG_KEY if curve else NOT_AN_AGENT.format(timeout=timeout, address=address)
    if zmq.EVENT_CONNECTED in kinds:
        return NOT_AN_AGENT.format(timeout=timeout, address=address)
    if zmq.EVENT_CONNECT_RETRIED in kinds:
        return (
            f"connection refused for {timeout:g} s: is `agent serve` running on that host and port?"
        )
    return f"no answer within {timeout:g} s: host unreachable or the port is filtered"


def resolve_error(address: str) -> str | None:
    """Why HOST of HOST:PORT (IPv6 in brackets) has no address, or None when it has one."""
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    try:
        socket.getaddrinfo(host, int(port) if port.isdigit() else None, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        return f"cannot resolve host {host}: {exc.strerror or exc} (check the name, or DNS)"
    except (UnicodeError, ValueError) as exc:
        return f"cannot resolve host {host}: {exc}"
    return None


def agent_socket(
    ctx: zmq.Context, kind: int, address: str, server_key: str | None, keypair: Keypair | None
) -> zmq.Socket:
    """A socket to reach an agent at `address` (HOST:PORT) with the protocol's settings: the
    DEALER for requests and the SUB for telemetry both authenticate the same way (§2)."""
    sock = ctx.socket(kind)
    sock.linger = 0
    sock.ipv6 = address.startswith("[")
    sock.maxmsgsize = p.MAX_MESSAGE_SIZE
    sock.heartbeat_ivl = 2000
    sock.heartbeat_timeout = 6000
    if server_key is not None:
        if keypair is None:
            raise ValueError("CURVE needs this coordinator's keypair")
        sock.curve_secretkey = keypair.secret.encode("ascii")
        sock.curve_publickey = keypair.public.encode("ascii")
        sock.curve_serverkey = server_key.encode("ascii")
    return sock


class AgentClient:
    """A DEALER connected to one agent. `server_key` None means no CURVE (an --insecure agent)."""

    def __init__(
        self,
        ctx: zmq.Context,
        address: str,
        server_key: str | None,
        keypair: Keypair | None,
        connect_timeout: float = 5.0,
        stop: threading.Event | None = None,
    ) -> None:
        self.address = address
        self.connect_timeout = connect_timeout
        self.stop = stop
        """Set (Ctrl-C, the run ending): a connect under way gives up at once, HostError."""
        self.keypair = keypair
        self.server_key = server_key
        self.sock = agent_socket(ctx, zmq.DEALER, address, server_key, keypair)
        self._replies = zmq.Poller()
        """Made once: Socket.poll() would build a Poller for every wait."""
        self._replies.register(self.sock, zmq.POLLIN)
        self.last_heard = time.monotonic()
        self.agent_version = UNKNOWN_VERSION
        """The agent's mlx-fleet version, from hello.ok: every invalid message names it."""

    def close(self) -> None:
        self.sock.close(linger=0)

    def __enter__(self) -> AgentClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def connect(self) -> dict[str, Any]:
        """Connect and say hello; the hello.ok body, or HostError saying why not, within
        connect_timeout (at once for a name DNS cannot resolve: ZeroMQ would retry it for ever,
        as if the port refused)."""
        unresolved = resolve_error(self.address)
        if unresolved is not None:
            raise HostError(unresolved)
        # A unique endpoint: the default one is named after the file descriptor, which a socket
        # closed a moment ago may still be reporting on.
        monitor = self.sock.get_monitor_socket(addr=f"inproc://monitor.{p.new_id()}")
        events: list[tuple[int, int]] = []
        try:
            self.sock.connect(f"tcp://{self.address}")
            hello = self.send("hello", {"client": "coordinator"})
            deadline = time.monotonic() + self.connect_timeout
            poller = zmq.Poller()
            poller.register(self.sock, zmq.POLLIN)
            poller.register(monitor, zmq.POLLIN)
            while (left := deadline - time.monotonic()) > 0:
                if self.stop is not None and self.stop.is_set():
                    raise HostError(f"interrupted while connecting to {self.address}")
                ready = dict(poller.poll(min(left, WAIT_SLICE_S) * 1000))
                if ready.get(monitor):
                    event = recv_monitor_message(monitor)
                    events.append((event["event"], event["value"]))
                    why = handshake_diagnosis(
                        events,
                        self.keypair.public if self.keypair else None,
                        self.server_key is not None,
                    )
                    if why is not None:
                        raise HostError(why)
                if ready.get(self.sock):
                    reply = self._reply_to(hello)
                    if reply is not None:
                        return self._greeted(self._body(reply, "hello.ok"))
            raise HostError(
                timeout_diagnosis(
                    events, self.connect_timeout, self.address, self.server_key is not None
                )
            )
        except zmq.ZMQError as exc:
            raise HostError(f"cannot connect to {self.address}: {exc}") from None
        finally:
            self.sock.disable_monitor()
            monitor.close(linger=0)

    def send(self, type_: str, body: dict[str, Any] | None = None) -> p.Message:
        message = p.make(type_, body)
        self.sock.send(p.encode(message))
        return message

    def _greeted(self, hello: dict[str, Any]) -> dict[str, Any]:
        """hello.ok's body, once its protocol is the one this side speaks (§8: the version is
        learnt before anything else is sent)."""
        self.agent_version = hello["agent"]
        if hello["protocol"] != p.PROTOCOL_VERSION:
            raise InvalidMessage(
                f"hello.ok: the agent speaks protocol {hello['protocol']}, this coordinator "
                f"{p.PROTOCOL_VERSION}: install the same mlx-fleet on both sides",
                self.agent_version,
            )
        return hello

    def _receive(self) -> p.Message:
        """One message off the socket, valid to its last field (shared.wire.agent_shapes), or
        InvalidMessage naming the first problem and the agent's version (an agent speaking
        another protocol version: a HostError saying so)."""
        data = self.sock.recv()
        self.last_heard = time.monotonic()
        try:
            message = p.decode(data)
        except p.ProtocolError as exc:
            if exc.code == p.BAD_VERSION:
                raise HostError(f"the agent speaks another protocol: {exc.message}") from None
            raise InvalidMessage(f"message: {exc.message}", self.agent_version) from None
        try:
            check_agent_body(message.type, message.body)
        except Invalid as exc:
            raise InvalidMessage(f"{message.type}: {exc}", self.agent_version) from None
        return message

    def receive(self, timeout: float) -> p.Message | None:
        """The next message within `timeout` seconds, checked as every one is, or None: for a
        caller with several requests in flight (an agent fetching a model's chunks)."""
        return self._receive() if self._replies.poll(timeout * 1000) else None

    def _reply_to(self, request: p.Message) -> p.Message | None:
        """The next message, when it answers `request`; InvalidMessage says which request an
        invalid one came while waiting for."""
        try:
            message = self._receive()
        except InvalidMessage as exc:
            raise exc.replying(request.type) from None
        return message if message.re == request.id else None

    def _body(self, reply: p.Message, expected: str) -> dict[str, Any]:
        if reply.type == "error":
            raise AgentError(reply.body["code"], reply.body["message"])
        if reply.type != expected:
            raise InvalidMessage(
                f"reply: {reply.type} where {expected} was due", self.agent_version
            ).replying(expected.removesuffix(".ok"))
        return reply.body

    def request(
        self, type_: str, body: dict[str, Any] | None = None, timeout: float = REQUEST_TIMEOUT_S
    ) -> dict[str, Any]:
        """Send a request and return its reply's body (AgentError for an error reply)."""
        message = self.send(type_, body)
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            if self._replies.poll(left * 1000):
                reply = self._reply_to(message)
                if reply is not None:
                    return self._body(reply, f"{type_}.ok")
        raise HostError(f"no reply to {type_} within {timeout:g} s")

    _links: LinkWatch | None = None
    """The watch a session holds open (watch_links), else None: stream and fetch open their
    own."""

    @contextmanager
    def watch_links(self) -> Iterator[LinkWatch]:
        """Hear every reconnection from now until the block ends, across stream() and fetch()
        calls: one sent just before a call cannot go unnoticed."""
        links = LinkWatch(self.sock)
        self._links = links
        try:
            yield links
        finally:
            self._links = None
            links.close()

    @contextmanager
    def _watched(self) -> Iterator[LinkWatch]:
        if self._links is not None:
            yield self._links
        else:
            with self.watch_links() as links:
                yield links

    def _poller(self, links: LinkWatch) -> zmq.Poller:
        poller = zmq.Poller()
        poller.register(self.sock, zmq.POLLIN)
        poller.register(links.monitor, zmq.POLLIN)
        return poller

    def fetch(
        self, type_: str, body: dict[str, Any] | None = None, timeout: float = REQUEST_TIMEOUT_S
    ) -> dict[str, Any]:
        """request() for a request that only reads (info, job.get, job.list): sent again each
        time the DEALER reconnects, since what was in flight then is lost either way; the first
        answer to any copy is the reply."""
        with self._watched() as links:
            sent = {self.send(type_, body).id}
            poller = self._poller(links)
            deadline = time.monotonic() + timeout
            while (left := deadline - time.monotonic()) > 0:
                ready = dict(poller.poll(left * 1000))
                if ready.get(links.monitor) and zmq.EVENT_HANDSHAKE_SUCCEEDED in links.events():
                    sent.add(self.send(type_, body).id)
                if ready.get(self.sock):
                    try:
                        reply = self._receive()
                    except InvalidMessage as exc:
                        raise exc.replying(type_) from None
                    if reply.re in sent:
                        return self._body(reply, f"{type_}.ok")
            raise HostError(f"no reply to {type_} within {timeout:g} s")

    def stream(
        self,
        start: p.Message,
        stop: threading.Event | None = None,
        check: Callable[[], None] | None = None,
    ) -> Iterator[p.Message]:
        """Every message answering `start` (a bench.start) up to and including bench.done.

        Pings the agent whenever it has been quiet for a heartbeat interval; raises HostError
        after HEARTBEAT_LIVENESS silent intervals, and StreamLost as soon as the stream cannot
        be whole (lost_stream). `check` is called at every turn and may raise to end the stream
        (the coordinator's no-progress bound). When `stop` is set the job is cancelled and the
        stream still runs to the agent's bench.done (or CANCEL_WAIT_S). See JobStream.
        """
        with self._watched() as links:
            yield from JobStream(self, start, stop, check, links)


class JobStream:
    """One job's stream on an AgentClient, as AgentClient.stream() yields it: the heartbeats
    that tell a busy agent from a dead one (Paranoid Pirate), the cancel when `stop` is set, and
    the checks that the stream is whole. Apart from AgentClient because a request/reply never
    pings, cancels or counts cells; it uses the client's socket and message checks as they are."""

    def __init__(
        self,
        client: AgentClient,
        start: p.Message,
        stop: threading.Event | None,
        check: Callable[[], None] | None,
        links: LinkWatch,
    ) -> None:
        self.client, self.start, self.links = client, start, links
        self.stop, self.check = stop, check
        self.job_id: str | None = None
        self.cancel_by: float | None = None
        self.liveness = HEARTBEAT_LIVENESS
        self.cells = 0  # received in a row from index 0: they come in run order
        self.total: int | None = None  # the job's cells, once bench.start.ok named them
        self.job_pings: set[str] = set()  # sent once the job was known: their ping.ok names it
        self.start_pings: set[str] = set()  # sent before: answered first, the start's reply is lost

    def __iter__(self) -> Iterator[p.Message]:
        client = self.client
        poller = client._poller(self.links)
        while True:
            if self.check is not None:
                self.check()
            self._cancel_when_stopped()
            ready = dict(poller.poll(HEARTBEAT_INTERVAL_S * 1000))
            if ready.get(self.links.monitor):
                why = lost_stream(client.address, self.links.events())
                if why is not None:
                    raise StreamLost(why)
            if not ready:
                self._quiet()
                continue
            if not ready.get(client.sock):
                continue
            self.liveness = HEARTBEAT_LIVENESS
            message = client._receive()
            if not self._answers_start(message):
                continue  # a heartbeat reply, a cancel reply, or something stale
            yield message
            if message.type == "bench.done":
                return

    def _cancel_when_stopped(self) -> None:
        """bench.cancel once `stop` is set and the job is known; HostError when the job has
        not stopped CANCEL_WAIT_S later."""
        job_id = self.job_id
        if self.stop is not None and self.stop.is_set() and job_id and self.cancel_by is None:
            self.client.send("bench.cancel", {"job": job_id})
            self.cancel_by = time.monotonic() + CANCEL_WAIT_S
        if self.cancel_by is not None and time.monotonic() > self.cancel_by:
            raise HostError(f"job {job_id} did not stop within {CANCEL_WAIT_S:g} s of bench.cancel")

    def _quiet(self) -> None:
        """A heartbeat interval without a message: a ping, or HostError after
        HEARTBEAT_LIVENESS of them."""
        self.liveness -= 1
        if self.liveness == 0:
            silent = time.monotonic() - self.client.last_heard
            raise HostError(
                f"the agent stopped answering (silent for {silent:.0f} s, "
                f"{HEARTBEAT_LIVENESS} pings unanswered)"
            )
        ping = self.client.send("ping")
        (self.job_pings if self.job_id is not None else self.start_pings).add(ping.id)

    def _answers_start(self, message: p.Message) -> bool:
        """Whether `message` belongs to the stream; StreamLost when it shows the stream is not
        whole (a ping.ok naming another job, a ping answered before bench.start, a cell missed,
        bench.done counting more); InvalidMessage for a cell the job does not have."""
        job_id, cells = self.job_id, self.cells
        if message.type == "ping.ok" and message.re in self.start_pings and job_id is None:
            # An agent answers in order (docs/protocol.md §6): bench.start's reply was lost.
            raise StreamLost(
                "the agent answered a ping sent after bench.start, but not bench.start: its "
                "reply was lost"
            )
        if message.type == "ping.ok" and message.re in self.job_pings:
            self.job_pings.discard(message.re)
            if message.body["job"] != job_id:
                running = message.body["job"]
                raise StreamLost(
                    f"a ping.ok says the agent runs {'no job' if running is None else running}"
                    f", not job {job_id}: its stream was lost"
                )
        if message.re != self.start.id:
            return False
        if message.type == "error":
            raise AgentError(message.body["code"], message.body["message"])
        if message.type == "bench.start.ok":
            self.job_id, self.total = message.body["job"], len(message.body["cells"])
        elif message.type == "bench.cell":
            index = message.body["index"]
            if self.total is not None and index >= self.total:
                raise InvalidMessage(
                    f"bench.cell: index is {index}, but its job has {self.total} cells",
                    self.client.agent_version,
                )
            if index > cells:
                raise StreamLost(
                    f"cell {index} came where cell {cells} was due: the stream lost {index - cells}"
                )
            self.cells = max(cells, index + 1)
        elif message.type == "bench.done" and message.body["cells"] > cells:
            raise StreamLost(
                f"bench.done counts {message.body['cells']} cells, the stream brought {cells}"
            )
        return True


def lost_stream(address: str, events: list[int]) -> str | None:
    """Why a job stream is lost, from the link events heard during it (any of LINK_EVENTS:
    the first connection was made before the stream began); None for none."""
    if not events:
        return None
    what = "dropped" if zmq.EVENT_DISCONNECTED in events else "was made again"
    return (
        f"the connection to {address} {what}: ZeroMQ reconnects by itself, but the agent sent "
        "the job's stream to the connection that is gone"
    )
