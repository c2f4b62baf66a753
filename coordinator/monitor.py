"""`coordinator monitor`: every agent's telemetry live in one place, recorded as it arrives.

Each host gets a HostLink thread that owns its two sockets (a DEALER for info and history.get;
a SUB on the agent's telemetry socket) and only reports on a queue, as a fleet run's
host threads do. The calling thread alone touches the store, the dashboard and the metrics, so
none of them needs a lock, and a whole queue drain is written in one transaction.

A link backfills with history.get when it connects, from the cursor recorded for that host (the
last sample and event numbers held with nothing missing before them, docs/protocol.md §10), and
again whenever a live sample or event skips a number, so what PUB dropped is filled in however
old its time stamp. When a host goes silent its link pings it; no answer ends the session and it
reconnects from scratch every RETRY_S (info again: a restarted agent may publish elsewhere).
"""

from __future__ import annotations

import os
import queue
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import zmq

from coordinator.dashboard import SPARK_WINDOW_S, UNREACHABLE, UP, Dashboard, silent_after
from coordinator.fleet import Settings, Target, connect
from coordinator.telemetry_store import Row, TelemetryStore
from shared import protocol as p
from shared.io.transport import AgentClient, HostError, agent_socket
from shared.telemetry import Cursor

if TYPE_CHECKING:
    from shared.io.metrics import TelemetryMetrics

RETRY_S = 2.0
"""Between attempts to reach a host that is down."""
POLL_MS = 200
"""How often a link waiting for room on the report queue looks at its stop flag."""
BACKFILL_FIRST_S = 3600.0
"""A host never recorded before is backfilled with its last hour (what the agent keeps in
memory); one recorded before, from its cursor; one whose history is new (reinstalled, its data
wiped), with all of it."""
HISTORY_PAGE = 5000
DRAIN_MAX = 1000
"""Messages a link takes off its SUB per report, so a flood still reaches the store in batches."""
BATCH_S = 0.1
"""Reports arriving this soon after the first of a step are applied with it."""
PRUNE_EVERY_S = 300.0
"""While it runs, the monitor drops what is older than the retention this often."""
QUEUE_MAX = 64
"""Reports waiting for the main thread. When it falls behind, links wait and their SUBs' high
water marks drop the excess at the socket, instead of memory filling with decoded samples."""

CONNECTED, LOST, SAMPLES, EVENTS, POLICY, CURSOR = (
    "connected",
    "lost",
    "samples",
    "events",
    "policy",
    "cursor",
)


@dataclass(frozen=True)
class LinkReport:
    """What a link tells the main thread. `data` by kind: CONNECTED the info.ok body, LOST the
    error, SAMPLES / EVENTS a list of bodies (`live`: off the SUB, not a backfill), POLICY a
    policy map, CURSOR the Cursor that what was reported so far reaches."""

    host: str
    kind: str
    data: Any
    live: bool = False


def telemetry_socket(ctx: zmq.Context, client: AgentClient, port: int) -> zmq.Socket:
    """A SUB on the agent's telemetry port, authenticated exactly like `client`'s DEALER."""
    host = client.address.rsplit(":", 1)[0]
    sub = agent_socket(ctx, zmq.SUB, client.address, client.server_key, client.keypair)
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
        reports: queue.Queue[LinkReport],
        stop: threading.Event,
        cursor: Cursor | None,
        wake_fd: int,
    ) -> None:
        self.ctx, self.target, self.settings = ctx, target, settings
        self.reports, self.stop = reports, stop
        self.wake_fd = wake_fd
        """Readable once `stop` is set: a link waits on it and its SUB, never on a timer."""
        self.cursor = cursor
        """Where the record of this host's history stands (None: nothing recorded yet)."""
        self.thread = threading.Thread(target=self.run, name=f"monitor {target.name}", daemon=True)

    def report(self, kind: str, data: Any, live: bool = False) -> None:
        """Queue a report, waiting while the queue is full (but not past stop)."""
        item = LinkReport(self.target.name, kind, data, live)
        while not self.stop.is_set():
            try:
                self.reports.put(item, timeout=POLL_MS / 1000)
                return
            except queue.Full:
                continue

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                self._session()
            except HostError as exc:
                self.report(LOST, str(exc))
            except Exception as exc:  # a bug loses one host, visibly, not the monitor
                self.report(LOST, f"coordinator error: {type(exc).__name__}: {exc}")
            self.stop.wait(RETRY_S)

    def _session(self) -> None:
        with connect(self.ctx, self.target, self.settings) as client:
            info = client.request("info", timeout=self.settings.connect_timeout)
            sub = telemetry_socket(self.ctx, client, info["telemetry_port"])
            try:
                self.report(CONNECTED, info)
                since = None
                if self.cursor is None or self.cursor.history != info["history"]:
                    since = time.time() - BACKFILL_FIRST_S if self.cursor is None else None
                    self.cursor = Cursor(info["history"])
                self._backfill(client, since)
                self._pump(client, sub, info["poll_interval"])
            finally:
                sub.close(linger=0)

    def _backfill(self, client: AgentClient, since: float | None = None) -> None:
        """Everything after the cursor (stamped after `since`, when given), page by page."""
        assert self.cursor is not None
        while True:
            page = client.request(
                "history.get",
                {
                    "samples_after": self.cursor.samples,
                    "events_after": self.cursor.events,
                    "since": since,
                    "limit": HISTORY_PAGE,
                },
            )
            if page["history"] != self.cursor.history:
                raise HostError("the agent's history changed (restarted on new data): reconnecting")
            self._relay(page["samples"], page["events"], live=False)
            self._move_cursor(page["samples"], page["events"], contiguous=False)
            if not page["truncated"]:
                return

    def _relay(
        self, samples: list[dict[str, Any]], events: list[dict[str, Any]], live: bool
    ) -> None:
        if samples:
            self.report(SAMPLES, samples, live)
        if events:
            self.report(EVENTS, events, live)

    def _move_cursor(
        self, samples: list[dict[str, Any]], events: list[dict[str, Any]], contiguous: bool
    ) -> bool:
        """Advance the cursor over what was just relayed: a backfill page is complete up to its
        last item; live messages only as far as their numbers follow on. True when a live one
        skipped a number (a gap to backfill). Reports the new cursor."""
        assert self.cursor is not None
        moved_samples, gap_samples = _advance(self.cursor.samples, samples, contiguous)
        moved_events, gap_events = _advance(self.cursor.events, events, contiguous)
        cursor = Cursor(self.cursor.history, moved_samples, moved_events)
        if cursor != self.cursor:
            self.cursor = cursor
            self.report(CURSOR, cursor)
        return gap_samples or gap_events

    def _pump(self, client: AgentClient, sub: zmq.Socket, poll_interval: float) -> None:
        """Relay telemetry until stop; when a number is skipped, backfill what PUB dropped; when
        the agent stops answering, return (HostError) so run() reconnects."""
        quiet_after = silent_after(poll_interval)
        check_at = time.monotonic()
        poller = zmq.Poller()
        poller.register(sub, zmq.POLLIN)
        poller.register(self.wake_fd, zmq.POLLIN)
        while not self.stop.is_set():
            quiet = time.monotonic() - check_at
            if quiet > quiet_after:
                client.request("ping", timeout=self.settings.connect_timeout)
                check_at = time.monotonic()
                continue
            if sub not in dict(poller.poll((quiet_after - quiet) * 1000 + 1)):
                continue
            check_at = time.monotonic()
            samples, events = [], []
            for frames in _drain(sub):
                try:
                    message = p.decode_telemetry(frames)
                except p.ProtocolError:
                    continue  # nothing to answer on a SUB; a bad message is dropped
                (samples if message.type == "telemetry.sample" else events).append(message.body)
            self._relay(samples, events, live=True)
            if self._move_cursor(samples, events, contiguous=True):
                self._close_gap(client, samples, events)
            policies = [event["policy"] for event in events if event["policy"] is not None]
            if policies:
                self.report(POLICY, policies[-1])

    def _close_gap(
        self, client: AgentClient, samples: list[dict[str, Any]], events: list[dict[str, Any]]
    ) -> None:
        """Backfill what was skipped; whatever the agent no longer has is gone for good, so the
        cursor then passes the live messages that showed the gap."""
        self._backfill(client)
        assert self.cursor is not None
        latest = Cursor(
            self.cursor.history,
            max([self.cursor.samples, *_numbers(samples)]),
            max([self.cursor.events, *_numbers(events)]),
        )
        if latest != self.cursor:
            self.cursor = latest
            self.report(CURSOR, latest)


def _numbers(items: list[dict[str, Any]]) -> list[int]:
    return [item["seq"] for item in items if item["seq"] is not None]


def _advance(cursor: int, items: list[dict[str, Any]], contiguous: bool) -> tuple[int, bool]:
    """(the new cursor, whether a number was skipped) after `items` arrived."""
    numbers = sorted(set(_numbers(items)))
    if not contiguous:
        return max([cursor, *numbers]), False
    for number in numbers:
        if number == cursor + 1:
            cursor = number
        elif number > cursor + 1:
            return cursor, True
    return cursor, False


def _drain(sub: zmq.Socket) -> list[list[bytes]]:
    """What the SUB holds now, at most DRAIN_MAX messages."""
    batch = []
    while len(batch) < DRAIN_MAX:
        try:
            batch.append(sub.recv_multipart(zmq.NOBLOCK))
        except zmq.Again:
            break
    return batch


class Monitor:
    """The links, the store, the dashboard and the metrics, driven by step() from one thread."""

    def __init__(
        self,
        targets: list[Target],
        settings: Settings,
        store: TelemetryStore,
        metrics: TelemetryMetrics | None = None,
        retention_s: float | None = None,
    ) -> None:
        self.store, self.metrics = store, metrics
        self.retention_s = retention_s
        """Telemetry older than this is dropped at start and every PRUNE_EVERY_S after."""
        self._next_prune = 0.0
        self._wake_read, self._wake_write = os.pipe()
        self.board = Dashboard([t.name for t in targets])
        self.reports: queue.Queue[LinkReport] = queue.Queue(QUEUE_MAX)
        self.stop = threading.Event()
        self.ctx = zmq.Context()
        now = time.time()
        wake = self._wake_read
        self.links = [
            HostLink(self.ctx, t, settings, self.reports, self.stop, store.cursor(t.name), wake)
            for t in targets
        ]
        self._prune(now)
        recorded = store.readings(now - SPARK_WINDOW_S, [t.name for t in targets])
        for name, readings in recorded.items():
            self.board.seed(name, readings)
        self._exported: dict[str, float] = {}
        self._exported_up: dict[str, bool] = {}
        self._names: dict[str, str] = {}
        """Each host's agent name (info.ok `name`): its `host` label; its HOST:PORT until then."""
        self._infos: dict[str, dict[str, Any]] = {}
        self.recorded = 0
        """Samples recorded for the first time since start (the benchmark counts them)."""

    def start(self) -> None:
        for link in self.links:
            link.thread.start()

    def close(self) -> None:
        """Stop the links. One still waiting for an answer (at most its timeout) is left to
        finish on its own, daemon thread and context with it: closing its sockets under it
        from here would not be thread-safe."""
        self.stop.set()
        os.write(self._wake_write, b"x")  # never read: readable for every link from now on
        for link in self.links:
            link.thread.join(timeout=POLL_MS / 1000 + 1.0)
        if not any(link.thread.is_alive() for link in self.links):
            self.ctx.term()
            os.close(self._wake_read)
        os.close(self._wake_write)

    def __enter__(self) -> Monitor:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def step(self, timeout: float) -> None:
        """Wait up to `timeout` for a report, gather what else arrives within BATCH_S, then
        apply it all at once: a lab's hundred hosts publishing each second make ten
        transactions a second, not a hundred."""
        batch: list[LinkReport] = []
        try:
            batch.append(self.reports.get(timeout=timeout))
            until = time.monotonic() + BATCH_S
            while (left := until - time.monotonic()) > 0:
                batch.append(self.reports.get(timeout=left))
        except queue.Empty:
            pass
        self.apply(batch, time.time())

    def apply(self, batch: list[LinkReport], now: float) -> None:
        samples: list[tuple[Row, bool]] = []
        events: list[Row] = []
        cursors: dict[str, Cursor] = {}
        for report in batch:
            if report.kind == CONNECTED:
                info = report.data
                self.board.connected(report.host, info["machine"].get("hostname"), info, now)
                self.store.record_policy(report.host, info["policy"], now)
                self._names[report.host] = info.get("name") or report.host
                self._infos[report.host] = info
            elif report.kind == LOST:
                self.board.unreachable(report.host, report.data, now)
            elif report.kind == POLICY:
                self.board.set_policy(report.host, report.data)
                self.store.record_policy(report.host, report.data, now)
                if self.metrics is not None:
                    self.metrics.set_policy(self.host_name(report.host), report.data, report.host)
            elif report.kind == SAMPLES:
                samples += [((report.host, body), report.live) for body in report.data]
            elif report.kind == EVENTS:
                events += [(report.host, body) for body in report.data]
            elif report.kind == CURSOR:
                cursors[report.host] = report.data
        new_samples, new_events = self.store.add([row for row, _ in samples], events, cursors)
        self.recorded += new_samples
        for (host, body), live in samples:
            self.board.sample(host, body, now, live)
        for host, body in new_events:
            self.board.event(host, body)
            if self.metrics is not None:
                self.metrics.observe_event({**body, "host": self.host_name(host)}, host)
        self.board.tick(now)
        if self.metrics is not None:
            self._export()
        self._prune(now)

    def _prune(self, now: float) -> None:
        if self.retention_s is not None and now >= self._next_prune:
            self.store.prune(now - self.retention_s)
            self._next_prune = now + PRUNE_EVERY_S

    def host_name(self, name: str) -> str:
        """The `host` label of the host monitored as `name` (HOST:PORT)."""
        return self._names.get(name, name)

    def _export(self) -> None:
        """Each host's series under its agent's name (`host`) and its HOST:PORT (`instance`):
        all of them while it is up, fed its newest sample once, in time order, as the pause
        counter needs; agent_up 0 alone while it is down (unreachable, silent, not reached)."""
        assert self.metrics is not None
        for name, view in self.board.hosts.items():
            host = self.host_name(name)
            up = view.status == UP and not view.silent
            if not up:
                if self._exported_up.get(name) is not False:
                    self.metrics.host_down(host, name)
                    self._exported_up[name] = False
                continue
            if not self._exported_up.get(name):
                info = self._infos.get(name, {})
                self.metrics.host_up(
                    host,
                    name,
                    version=info.get("agent"),
                    machine=info.get("machine"),
                    policy=view.policy,
                )
                self._exported_up[name] = True
            if view.sample is not None and self._exported.get(name) != view.sample["time"]:
                self.metrics.observe_sample({**view.sample, "host": host}, name)
                self._exported[name] = view.sample["time"]

    def settled(self) -> bool:
        """Every host unreachable, silent, or heard live: what --once waits for."""
        return all(
            view.status == UNREACHABLE or view.silent or view.live
            for view in self.board.hosts.values()
        )
