"""`coordinator monitor`: every agent's telemetry live in one place, recorded as it arrives.

Each host gets a HostLink thread that owns its two sockets (a DEALER for info, history.get and
policy.get; a SUB on the agent's telemetry socket) and only reports on a queue, as a fleet run's
host threads do. The calling thread alone touches the store, the dashboard and the metrics, so
none of them needs a lock, and a whole queue drain is written in one transaction.

A link backfills with history.get when it connects (from the last sample recorded for that host)
and again when samples resume after a silence, so PUB's dropped messages are filled in. When a
host goes silent its link pings it; no answer ends the session and it reconnects from scratch
every RETRY_S (info again: a restarted agent may publish elsewhere).
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass
from typing import Any

import zmq

from coordinator.dashboard import SPARK_WINDOW_S, UNREACHABLE, UP, Dashboard, silent_after
from coordinator.fleet import Settings, Target, connect
from coordinator.telemetry_store import Row, TelemetryStore
from shared import protocol as p
from shared.io.metrics import TelemetryMetrics
from shared.io.transport import AgentClient, HostError, agent_socket

RETRY_S = 2.0
"""Between attempts to reach a host that is down."""
POLL_MS = 200
"""How often a link looks at its stop flag while nothing arrives."""
BACKFILL_FIRST_S = 3600.0
"""A host never recorded before is backfilled with its last hour (what the agent keeps in
memory); one recorded before, from its last recorded sample."""
HISTORY_PAGE = 5000
DRAIN_MAX = 1000
"""Messages a link takes off its SUB per report, so a flood still reaches the store in batches."""
QUEUE_MAX = 64
"""Reports waiting for the main thread. When it falls behind, links wait and their SUBs' high
water marks drop the excess at the socket, instead of memory filling with decoded samples."""

CONNECTED, LOST, SAMPLES, EVENTS, POLICY = "connected", "lost", "samples", "events", "policy"


@dataclass(frozen=True)
class LinkReport:
    """What a link tells the main thread. `data` by kind: CONNECTED the info.ok body, LOST the
    error, SAMPLES / EVENTS a list of bodies (`live`: off the SUB, not a backfill), POLICY a
    policy map."""

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
        since: float,
    ) -> None:
        self.ctx, self.target, self.settings = ctx, target, settings
        self.reports, self.stop = reports, stop
        self.since = since
        """The latest sample time this link has seen: where a backfill starts."""
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
                self._backfill(client)
                self._pump(client, sub, info["poll_interval"])
            finally:
                sub.close(linger=0)

    def _backfill(self, client: AgentClient) -> None:
        """Everything after self.since, page by page (docs/protocol.md §10)."""
        while True:
            page = client.request("history.get", {"since": self.since, "limit": HISTORY_PAGE})
            self._samples(page["samples"], live=False)
            if page["events"]:
                self.report(EVENTS, page["events"])
            latest = max((m["time"] for m in page["samples"] + page["events"]), default=None)
            if not page["truncated"] or latest is None:
                return
            self.since = max(self.since, latest)

    def _samples(self, samples: list[dict[str, Any]], live: bool) -> None:
        if samples:
            self.since = max(self.since, max(s["time"] for s in samples))
            self.report(SAMPLES, samples, live)

    def _pump(self, client: AgentClient, sub: zmq.Socket, poll_interval: float) -> None:
        """Relay telemetry until stop; after a silence, backfill what PUB dropped; when the
        agent stops answering, return (HostError) so run() reconnects."""
        quiet_after = silent_after(poll_interval)
        heard = check_at = time.monotonic()
        while not self.stop.is_set():
            if not sub.poll(POLL_MS):
                if time.monotonic() - check_at > quiet_after:
                    client.request("ping", timeout=self.settings.connect_timeout)
                    check_at = time.monotonic()
                continue
            if time.monotonic() - heard > quiet_after:
                self._backfill(client)  # before the new samples move self.since past the gap
            heard = check_at = time.monotonic()
            samples, events = [], []
            for frames in _drain(sub):
                try:
                    message = p.decode_telemetry(frames)
                except p.ProtocolError:
                    continue  # nothing to answer on a SUB; a bad message is dropped
                (samples if message.type == "telemetry.sample" else events).append(message.body)
            self._samples(samples, live=True)
            if events:
                self.report(EVENTS, events, live=True)
            if any(event["action"] == "policy" for event in events):
                self.report(POLICY, client.request("policy.get")["policy"])


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
    ) -> None:
        self.store, self.metrics = store, metrics
        self.board = Dashboard([t.name for t in targets])
        self.reports: queue.Queue[LinkReport] = queue.Queue(QUEUE_MAX)
        self.stop = threading.Event()
        self.ctx = zmq.Context()
        now = time.time()
        self.links = [
            HostLink(
                self.ctx,
                t,
                settings,
                self.reports,
                self.stop,
                store.last_sample_time(t.name) or now - BACKFILL_FIRST_S,
            )
            for t in targets
        ]
        recorded = store.samples(now - SPARK_WINDOW_S, [t.name for t in targets])
        for name, samples in recorded.items():
            self.board.seed(name, samples)
        self._exported: dict[str, float] = {}
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
        for link in self.links:
            link.thread.join(timeout=POLL_MS / 1000 + 1.0)
        if not any(link.thread.is_alive() for link in self.links):
            self.ctx.term()

    def __enter__(self) -> Monitor:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def step(self, timeout: float) -> None:
        """Wait up to `timeout` for reports, then apply every report waiting, all at once."""
        batch: list[LinkReport] = []
        try:
            batch.append(self.reports.get(timeout=timeout))
            while True:
                batch.append(self.reports.get_nowait())
        except queue.Empty:
            pass
        self.apply(batch, time.time())

    def apply(self, batch: list[LinkReport], now: float) -> None:
        samples: list[tuple[Row, bool]] = []
        events: list[Row] = []
        for report in batch:
            if report.kind == CONNECTED:
                info = report.data
                self.board.connected(report.host, info["machine"].get("hostname"), info, now)
                self.store.record_policy(report.host, info["policy"], now)
            elif report.kind == LOST:
                self.board.unreachable(report.host, report.data, now)
            elif report.kind == POLICY:
                self.board.set_policy(report.host, report.data)
                self.store.record_policy(report.host, report.data, now)
            elif report.kind == SAMPLES:
                samples += [((report.host, body), report.live) for body in report.data]
            elif report.kind == EVENTS:
                events += [(report.host, body) for body in report.data]
        new_samples, new_events = self.store.add([row for row, _ in samples], events)
        self.recorded += len(new_samples)
        for (host, body), live in samples:
            self.board.sample(host, body, now, live)
        for host, body in new_events:
            self.board.event(host, body)
            if self.metrics is not None:
                self.metrics.observe_event({**body, "host": host})
        self.board.tick(now)
        if self.metrics is not None:
            self._export()

    def _export(self) -> None:
        """Metrics labelled by HOST:PORT as monitored (two agents may share a hostname), fed
        each host's newest sample once, in time order, as the pause counter needs."""
        assert self.metrics is not None
        for name, view in self.board.hosts.items():
            if view.sample is not None and self._exported.get(name) != view.sample["time"]:
                self.metrics.observe_sample({**view.sample, "host": name})
                self._exported[name] = view.sample["time"]
            self.metrics.set_up(name, view.status == UP and not view.silent)

    def settled(self) -> bool:
        """Every host unreachable, silent, or heard live: what --once waits for."""
        return all(
            view.status == UNREACHABLE or view.silent or view.live
            for view in self.board.hosts.values()
        )
