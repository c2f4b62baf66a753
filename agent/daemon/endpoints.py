"""The daemon's two sockets (docs/protocol.md §2-§3): a ROUTER answering every coordinator and an
XPUB publishing telemetry, both CURVE servers behind one ZAP check, or both plain (--insecure).

Only the daemon's main thread uses them; the ZAP authenticator runs on its own thread.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterator
from typing import Any, NamedTuple

import zmq
from zmq.auth.thread import ThreadAuthenticator

from agent.daemon.throttle import LogThrottle
from agent.daemon.zap import OwnOrTrustedKeys, TrustedKeys
from shared.io.address import host_port
from shared.io.keys import own_keypair
from shared.io.trust import trusted_dir
from shared.wire import protocol as p

DEFAULT_BIND = f"0.0.0.0:{p.DEFAULT_PORT}"
NOBLOCK, SNDMORE, POLLIN = int(zmq.NOBLOCK), int(zmq.SNDMORE), int(zmq.POLLIN)
"""pyzmq's flags are enum.Flag members: passing or combining one runs Python's enum code (its
send_multipart ORs SNDMORE into every frame's flags), about a tenth of the daemon's work per
request here. The daemon passes their plain values."""


class Received(NamedTuple):
    """One message off the command socket: the ROUTER identity to answer, the decoded request
    (or the refusal to send back), and its last frame under CURVE (None without), which knows
    the sender's key."""

    identity: bytes
    message: p.Message | p.ProtocolError
    frame: zmq.Frame | None


def peer_key(frame: zmq.Frame | None) -> str | None:
    """The sender's CURVE public key: the User-Id ZAP gave its connection (pyzmq's
    authenticator makes it the key's Z85 text); None without CURVE. Read only by the request
    that needs it: the lookup costs a tenth of the daemon's work for a ping."""
    if frame is None:
        return None
    try:
        return frame.get("User-Id")
    except zmq.ZMQError:
        return None


class Subscriptions:
    """The topic prefixes somebody subscribes to on the telemetry XPUB socket, kept from the
    messages it hands up (1 or 0, then the prefix). libzmq hands up a prefix's first
    subscription and its last unsubscription, a subscriber that disconnects counting as
    unsubscribing (xpub.cpp; ZMQ_XPUB_VERBOSE off), so for libzmq's own SUBs a set of
    prefixes is exact. A peer speaking raw ZMTP could cancel a prefix it never subscribed to
    (libzmq hands that up too) and so silence the stream for every subscriber; it needs a
    trusted key (or --insecure), which already lets it stop jobs and set the policy."""

    def __init__(self) -> None:
        self.prefixes: set[bytes] = set()

    def apply(self, message: bytes) -> None:
        """One message off the XPUB; anything but a (un)subscription is ignored."""
        kind, prefix = message[:1], message[1:]
        if kind == b"\x01":
            self.prefixes.add(prefix)
        elif kind == b"\x00":
            self.prefixes.discard(prefix)

    def wants(self, topic: bytes) -> bool:
        """Whether any subscriber would receive a message with this topic."""
        return any(topic.startswith(prefix) for prefix in self.prefixes)


class ServeError(ValueError):
    """The daemon cannot start: a bad --bind, --thermal-source or --prometheus, a port in use;
    the message says why."""


class PortHeld(ServeError):
    """Binding `endpoint` failed: another process holds its port (EADDRINUSE)."""

    def __init__(self, message: str, endpoint: str) -> None:
        super().__init__(message)
        self.endpoint = endpoint


def endpoint_for(bind: str) -> tuple[str, bool]:
    """'HOST:PORT' -> ('tcp://HOST:PORT', is_ipv6); port 0 asks for an ephemeral port."""
    example = f"0.0.0.0:{p.DEFAULT_PORT} or 127.0.0.1:0 for any free port"
    try:
        host, port = host_port(bind, "--bind", example)
    except ValueError as exc:
        raise ServeError(str(exc)) from None
    return f"tcp://{host}:{port or '*'}", host.startswith("[")


def telemetry_endpoint(endpoint: str, port: int | None) -> str:
    """The PUB socket's endpoint: `port` when given (0: any), else the command port + 1, or any
    free port when the command port is picked too."""
    base, _, command_port = endpoint.rpartition(":")
    if port is None:
        port = 0 if command_port == "*" else int(command_port) + p.TELEMETRY_PORT_OFFSET
    return f"{base}:{port or '*'}"


def local_address(endpoint: str) -> str:
    """HOST:PORT to reach a bound `tcp://HOST:PORT` from this machine (loopback for a wildcard)."""
    host, _, port = endpoint.removeprefix("tcp://").rpartition(":")
    host = {"0.0.0.0": "127.0.0.1", "*": "127.0.0.1", "[::]": "[::1]"}.get(host, host)
    return f"{host}:{port}"


class AgentSockets:
    """bind() once; then receive() requests, send() replies and stream messages, publish()
    telemetry; close() when done."""

    def __init__(
        self, bind: str, secure: bool, telemetry_port: int | None, throttle: LogThrottle
    ) -> None:
        self.endpoint, self.ipv6 = endpoint_for(bind)
        self.throttle = throttle
        self.telemetry = telemetry_endpoint(self.endpoint, telemetry_port)
        self.secure = secure
        self.public_key: str | None = None
        self.ctx = zmq.Context()
        self.router = self.ctx.socket(zmq.ROUTER)
        self.publisher = self.ctx.socket(zmq.XPUB)
        """An XPUB, so the daemon knows whether anyone listens: a SUB sees a PUB."""
        self.subscriptions = Subscriptions()
        self._auth: ThreadAuthenticator | None = None
        self.trusted: TrustedKeys | None = None

    def bind(self) -> str:
        """Bind both sockets; returns the command endpoint actually bound (the port resolved).
        Raises ServeError naming the endpoint that could not be bound, or the keys that could
        not be read or made."""
        try:
            keypair = own_keypair() if self.secure else None
        except (OSError, ValueError) as exc:
            raise ServeError(f"this agent's CURVE keypair: {exc}") from None
        if keypair is not None:
            self.public_key = keypair.public
            self._auth = ThreadAuthenticator(self.ctx, log=logging.getLogger("agent.zap"))
            self._auth.start()
            self.trusted = TrustedKeys(trusted_dir(), self.throttle)
            self._auth.configure_curve_callback(
                domain="*", credentials_provider=OwnOrTrustedKeys(keypair.public, self.trusted)
            )
        for sock, endpoint in ((self.router, self.endpoint), (self.publisher, self.telemetry)):
            sock.ipv6 = self.ipv6
            sock.linger = 1000
            sock.maxmsgsize = p.MAX_MESSAGE_SIZE
            sock.heartbeat_ivl = 2000
            sock.heartbeat_timeout = 6000
            if keypair is not None:
                sock.curve_secretkey = keypair.secret.encode("ascii")
                sock.curve_publickey = keypair.public.encode("ascii")
                sock.curve_server = True
            try:
                sock.bind(endpoint)
            except zmq.ZMQError as exc:
                message = f"cannot bind {endpoint}: {exc}"
                if exc.errno == zmq.EADDRINUSE:
                    raise PortHeld(message, endpoint) from None
                raise ServeError(message) from None
        self.telemetry = self.publisher.last_endpoint.decode()
        return self.router.last_endpoint.decode()

    @property
    def telemetry_port(self) -> int:
        return int(self.telemetry.rpartition(":")[2])

    @property
    def command_port(self) -> int:
        return int(self.router.last_endpoint.decode().rpartition(":")[2])

    def receive(self) -> Iterator[Received]:
        """Every message waiting on the command socket, decoded, with who sent it; never
        blocks."""
        while True:
            try:
                frames = self.router.recv_multipart(NOBLOCK, copy=False)
            except zmq.Again:
                return
            identity, payload = frames[0].bytes, frames[1:]
            frame = None if self._auth is None else frames[-1]
            try:
                if len(payload) != 1:
                    raise p.ProtocolError(
                        p.MALFORMED,
                        f"a message is exactly one frame after the identity, got {len(payload)}",
                    )
                own_key = None if frame is None else functools.partial(self.from_own_key, frame)
                message: p.Message | p.ProtocolError = p.decode(payload[0].bytes, own_key)
                p.require_request(message)
            except p.ProtocolError as exc:
                message = exc
            yield Received(identity, message, frame)
            if not self.router.getsockopt(zmq.EVENTS) & POLLIN:
                return  # drained: asking costs half the Again that one more recv would raise

    def from_own_key(self, frame: zmq.Frame) -> bool:
        """Whether a message (its last frame) came from a peer holding this agent's own key: a
        process of its user on its machine (docs/protocol.md §12). Asked only of the types
        that need it (shared.wire.protocol.OWN_KEY_ONLY)."""
        return peer_key(frame) == self.public_key

    def from_peer_agent(self, frame: zmq.Frame | None) -> bool:
        """Whether a message came from a key trusted as a peer agent (`agent keys trust KEY
        --peer`): such a key may only exchange gang states (shared.wire.protocol.PEER_REQUESTS)."""
        trusted = self.trusted
        return bool(trusted and trusted.peers) and peer_key(frame) in trusted.peers  # type: ignore[union-attr]

    def send(self, identity: bytes, message: p.Message) -> None:
        """To one coordinator; a message too large to encode goes as its `too-large` error."""
        try:
            data = p.encode(message)
        except p.ProtocolError as exc:
            data = p.encode(p.error_for(exc))
        self.router.send(identity, SNDMORE)
        self.router.send(data)

    def publish(self, type_: str, body: dict[str, Any]) -> None:
        """A sample or event to every subscriber; one too large to send (thousands of local
        jobs listed, say) is dropped and logged, never the end of the daemon. With nobody
        subscribed to its topic nothing is encoded: PUB would drop it, and encoding and
        sending were much of an idle daemon's work (docs/performance.md). The history keeps
        it either way, for a subscriber that comes later to backfill."""
        if not self.subscriptions.wants(p.TOPICS[type_]):
            return
        try:
            topic, data = p.telemetry_frames(p.make(type_, body))
        except p.ProtocolError as exc:
            self.throttle.log(
                f"unpublished {type_}", logging.ERROR, "cannot publish %s: %s", type_, exc.message
            )
            return
        self.publisher.send(topic, SNDMORE)
        self.publisher.send(data)

    def read_subscriptions(self) -> None:
        """Every (un)subscription waiting on the XPUB: the daemon's loop polls it, as a
        SUB's subscription reaches it (the loop's poll can ask at no cost, where asking
        the socket before each publish would cost a Python enum lookup in pyzmq)."""
        while True:
            try:
                self.subscriptions.apply(self.publisher.recv(NOBLOCK))
            except zmq.Again:
                return

    def close(self) -> None:
        if self._auth is not None:
            self._auth.stop()
            self._auth = None
        self.router.close(linger=1000)
        self.publisher.close(linger=0)
        self.ctx.term()
