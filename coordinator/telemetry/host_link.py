"""One host's request side for `coordinator monitor`, on its own thread: it connects (hello,
info), backfills what the monitor orders (history.get, page by page) and pings the agent when it
has gone quiet; no answer ends the session and it reconnects from scratch every RETRY_S (info
again: a restarted agent may publish elsewhere). It never touches the store, the dashboard or the
host's SUB: those belong to the monitor's main thread, which it only reports to."""

from __future__ import annotations

import contextlib
import os
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any

import zmq

from coordinator.hosts.link import Settings, Target, connect
from coordinator.telemetry.cursor_tracker import past
from coordinator.telemetry.dashboard import silent_after
from shared.io.queues import drained
from shared.io.transport import AgentClient, HostError, InvalidMessage, agent_socket
from shared.wire.telemetry import Cursor

RETRY_S = 2.0
"""Between attempts to reach a host that is down."""
POLL_MS = 200
"""How often a link waiting for room on the report queue looks at its stop flag."""
HISTORY_PAGE = 5000

CONNECTED, LOST, REFUSED, PAGE = "connected", "lost", "refused", "page"


@dataclass(frozen=True)
class LinkReport:
    """What a link tells the main thread. `data` by kind: CONNECTED a Session, LOST the error
    (no answer), REFUSED the error (an invalid message from the agent), PAGE a Page."""

    host: str
    kind: str
    data: Any


@dataclass(frozen=True)
class Session:
    """A session began: the agent's info.ok, and a SUB already connecting to its telemetry,
    made here so that a hundred hosts' handshakes start at once; from the report on it is the
    main thread's (ZeroMQ lets a socket change threads across a lock, the queue's)."""

    number: int
    info: dict[str, Any]
    sub: zmq.Socket


@dataclass(frozen=True)
class Page:
    """One history.get page of a backfill; `last`: the backfill is complete."""

    samples: list[dict[str, Any]]
    events: list[dict[str, Any]]
    last: bool


@dataclass(frozen=True)
class Backfill:
    """The main thread's order: everything after `cursor` (stamped after `since`, when given).
    An order for an earlier session than the link's is ignored."""

    session: int
    cursor: Cursor
    since: float | None = None


class Reports:
    """The links' queue to the main thread, and a pipe that is readable while it may hold
    something, so the main thread can wait on it in the same poll as the SUBs."""

    def __init__(self, maxsize: int, stop: threading.Event) -> None:
        self.queue: queue.Queue[LinkReport] = queue.Queue(maxsize)
        self.stop = stop
        self.readable, self._writable = os.pipe()
        os.set_blocking(self.readable, False)
        os.set_blocking(self._writable, False)

    def put(self, report: LinkReport) -> bool:
        """Queue a report, waiting while the queue is full (but not past stop: False)."""
        while not self.stop.is_set():
            try:
                self.queue.put(report, timeout=POLL_MS / 1000)
            except queue.Full:
                continue
            with contextlib.suppress(BlockingIOError):  # a full pipe is readable already
                os.write(self._writable, b"\0")
            return True
        return False

    def take(self) -> list[LinkReport]:
        """Every report queued now (the pipe emptied first: a report put after is signalled
        again)."""
        with contextlib.suppress(BlockingIOError):
            while os.read(self.readable, 4096):
                pass
        return drained(self.queue)

    def close(self) -> None:
        os.close(self.readable)
        os.close(self._writable)


def telemetry_socket(ctx: zmq.Context, client: AgentClient, port: int) -> zmq.Socket:
    """A SUB on the agent's telemetry port, authenticated exactly like `client`'s DEALER."""
    host = client.address.rsplit(":", 1)[0]
    sub = agent_socket(ctx, zmq.SUB, client.address, client.server_key, client.keypair)
    # No ZMTP heartbeats on a SUB: one that falls behind (a flooding agent fills its high water
    # mark) times out on them, reconnects, and libzmq aborts the process (`Assertion failed:
    # _input_stopped`: zeromq/libzmq#3937, #4767, fix pending in PR #4830). The link's pings
    # tell a silent agent instead.
    sub.heartbeat_ivl = 0
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(f"tcp://{host}:{port}")
    return sub


class HostLink:
    """One host's connection, on its own thread, until `stop` is set."""

    def __init__(
        self,
        ctx: zmq.Context,
        target: Target,
        settings: Settings,
        reports: Reports,
        stop: threading.Event,
    ) -> None:
        self.ctx, self.target, self.settings = ctx, target, settings
        self.reports, self.stop = reports, stop
        self.orders: queue.Queue[Backfill | None] = queue.Queue()
        """Backfills ordered by the main thread; None wakes the link to see `stop`."""
        self.heard_at = time.monotonic()
        """When the host was last heard: set by the main thread as it reads the host's SUB, and
        here when the agent answers a ping."""
        self.session = 0
        self.thread = threading.Thread(target=self.run, name=f"monitor {target.name}", daemon=True)

    def report(self, kind: str, data: Any) -> bool:
        return self.reports.put(LinkReport(self.target.name, kind, data))

    def wake(self) -> None:
        self.orders.put(None)

    def run(self) -> None:
        while not self.stop.is_set():
            self.session += 1
            try:
                self._session()
            except InvalidMessage as exc:
                self.report(REFUSED, str(exc))
            except HostError as exc:
                self.report(LOST, str(exc))
            except Exception as exc:  # a bug loses one host, visibly, not the monitor
                self.report(LOST, f"coordinator error: {type(exc).__name__}: {exc}")
            self.stop.wait(RETRY_S)

    def _session(self) -> None:
        with connect(self.ctx, self.target, self.settings, self.stop) as client:
            info = client.request("info", timeout=self.settings.connect_timeout)
            self.heard_at = time.monotonic()
            sub = telemetry_socket(self.ctx, client, info["telemetry_port"])
            if not self.report(CONNECTED, Session(self.session, info, sub)):
                sub.close(linger=0)  # stopped before the main thread took it
                return
            quiet_after = silent_after(info["poll_interval"])
            while not self.stop.is_set():
                quiet = time.monotonic() - self.heard_at
                if quiet > quiet_after:
                    client.request("ping", timeout=self.settings.connect_timeout)
                    self.heard_at = time.monotonic()
                    continue
                try:
                    order = self.orders.get(timeout=quiet_after - quiet)
                except queue.Empty:
                    continue
                if order is not None and order.session == self.session:
                    self._backfill(client, order)

    def _backfill(self, client: AgentClient, order: Backfill) -> None:
        """Report every page after the order's cursor until the agent has no more."""
        cursor = order.cursor
        while not self.stop.is_set():
            page = client.request(
                "history.get",
                {
                    "samples_after": cursor.samples,
                    "events_after": cursor.events,
                    "since": order.since,
                    "limit": HISTORY_PAGE,
                },
            )
            if page["history"] != cursor.history:
                raise HostError("the agent's history changed (restarted on new data): reconnecting")
            self.report(PAGE, Page(page["samples"], page["events"], last=not page["truncated"]))
            if not page["truncated"]:
                return
            cursor = past(cursor, page["samples"], page["events"])
