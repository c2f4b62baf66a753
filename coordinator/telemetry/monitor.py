"""`coordinator monitor`: every agent's telemetry live in one place, recorded as it arrives.

The main thread reads every host's SUB in one poll, decodes each message, and alone touches the
store, the dashboard and the metrics, so none of them needs a lock and a whole batch is written in
one transaction. Each host's requests (hello, info, history.get, ping) wait on a HostLink thread of
its own (coordinator.telemetry.host_link), which only reports back; one thread reading every SUB,
not one per host, is what lets the monitor keep up with a flood of samples (docs/performance.md).

A host is backfilled with history.get when its session begins, from the cursor recorded for it
(the last sample and event numbers held with nothing missing before them, docs/protocol.md §10),
and again whenever a live sample or event skips a number, so what PUB dropped is filled in however
old its time stamp (coordinator.telemetry.cursor_tracker).
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any

import zmq

from coordinator.hosts.link import Settings, Target
from coordinator.telemetry.cursor_tracker import CursorTracker
from coordinator.telemetry.dashboard import (
    INVALID,
    SPARK_WINDOW_S,
    UNREACHABLE,
    UP,
    Dashboard,
)
from coordinator.telemetry.host_link import (
    CONNECTED,
    LOST,
    PAGE,
    POLL_MS,
    REFUSED,
    Backfill,
    HostLink,
    LinkReport,
    Page,
    Reports,
    Session,
)
from coordinator.telemetry.store import Row, TelemetryStore
from shared.cooling.calibration import origin_in_detail, origin_told
from shared.wire import protocol as p
from shared.wire.agent_types import decode_agent_telemetry
from shared.wire.telemetry import Cursor

if TYPE_CHECKING:
    from shared.io.metrics import FleetMetrics

BACKFILL_FIRST_S = 3600.0
"""A host never recorded before is backfilled with its last hour (what the agent keeps in
memory); one recorded before, from its cursor; one whose history is new (reinstalled, its data
wiped), with all of it."""
DRAIN_MAX = 1000
"""Messages taken off one SUB per poll, so one flooding host cannot starve the others."""
BATCH_S = 0.1
"""What arrives this soon after the first of a step is applied with it (a host's SUB holds
1000 messages meanwhile, ZeroMQ's default high water mark)."""
PRUNE_EVERY_S = 300.0
"""While it runs, the monitor drops what is older than the retention this often."""
QUEUE_MAX = 64
"""Reports waiting for the main thread (backfill pages of up to 5000 samples): when it falls
behind, links wait instead of memory filling with pages."""


def _drain(sub: zmq.Socket) -> list[list[bytes]]:
    """What the SUB holds now, at most DRAIN_MAX messages."""
    batch = []
    while len(batch) < DRAIN_MAX:
        try:
            batch.append(sub.recv_multipart(zmq.NOBLOCK))
        except zmq.Again:
            break
    return batch


class Arrivals:
    """What one step gathered: live messages by host (in the order read), and the links'
    reports."""

    def __init__(self) -> None:
        self.live: dict[str, tuple[list[dict[str, Any]], list[dict[str, Any]]]] = {}
        self.reports: list[LinkReport] = []
        self.messages = 0
        self.invalid: dict[str, tuple[int, str]] = {}
        """By host: how many invalid messages its SUB gave, and the last one's problem."""

    def read(self, host: str, frames: list[list[bytes]]) -> None:
        self.messages += len(frames)
        samples, events = self.live.setdefault(host, ([], []))
        for message_frames in frames:
            try:
                message = decode_agent_telemetry(message_frames)
            except p.ProtocolError as exc:  # nothing to answer on a SUB: dropped, and said
                self._refused(host, exc.message)
                continue
            (samples if message.type == "telemetry.sample" else events).append(message.body)

    def _refused(self, host: str, problem: str) -> None:
        count, _ = self.invalid.get(host, (0, ""))
        self.invalid[host] = (count + 1, problem)


class Monitor:
    """The links, the SUBs, the store, the dashboard and the metrics, driven by step() from one
    thread."""

    def __init__(
        self,
        targets: list[Target],
        settings: Settings,
        store: TelemetryStore,
        metrics: FleetMetrics | None = None,
        retention_s: float | None = None,
    ) -> None:
        self.store, self.metrics = store, metrics
        self.retention_s = retention_s
        """Telemetry older than this is dropped at start and every PRUNE_EVERY_S after."""
        self._next_prune = 0.0
        self.board = Dashboard([t.name for t in targets])
        self.stop = threading.Event()
        self.reports = Reports(QUEUE_MAX, self.stop)
        self.ctx = zmq.Context()
        self.links = {
            t.name: HostLink(self.ctx, t, settings, self.reports, self.stop) for t in targets
        }
        self.cursors: dict[str, Cursor | None] = {t.name: store.cursor(t.name) for t in targets}
        """Where the record of each host's history stands, as last stored."""
        self._trackers: dict[str, tuple[int, CursorTracker]] = {}
        """Each host's latest session number and cursor tracker."""
        self._subs: dict[zmq.Socket, str] = {}
        self._sub_of: dict[str, zmq.Socket] = {}
        self._poller = zmq.Poller()
        self._poller.register(self.reports.readable, zmq.POLLIN)
        now = time.time()
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
        for link in self.links.values():
            link.thread.start()

    def close(self) -> None:
        """Stop the links. One still waiting for an answer (at most its timeout) is left to
        finish on its own, daemon thread and context with it: closing its sockets under it
        from here would not be thread-safe. Once every link has ended, every socket left is
        this thread's, a SUB whose CONNECTED report was taken but never applied (Ctrl-C, or
        an error in apply) too: destroy() closes them all."""
        self.stop.set()
        for link in self.links.values():
            link.wake()
        for link in self.links.values():
            link.thread.join(timeout=POLL_MS / 1000 + 1.0)
        for report in self.reports.take():  # a session begun after the last step
            if report.kind == CONNECTED:
                report.data.sub.close(linger=0)
        for sub in self._subs:
            sub.close(linger=0)
        if not any(link.thread.is_alive() for link in self.links.values()):
            self.ctx.destroy(linger=0)
            self.reports.close()

    def __enter__(self) -> Monitor:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def step(self, timeout: float) -> None:
        """Wait up to `timeout` for telemetry or a link's report, gather what else arrives
        within BATCH_S, then apply it all at once: a lab's hundred hosts publishing each second
        make ten transactions a second, not a hundred. When the first read is a trickle (fewer
        messages than hosts: a lab publishing once a second) the batch is read once, after
        BATCH_S, since a poll of every host's socket costs more the more hosts there are; a
        flood is read on as it comes until BATCH_S is over."""
        arrivals = Arrivals()
        if not self._gather(arrivals, timeout):
            self.apply(arrivals, time.time())
            return
        until = time.monotonic() + BATCH_S
        if arrivals.messages < len(self._subs):
            time.sleep(BATCH_S)
        while True:
            self._gather(arrivals, max(0.0, until - time.monotonic()))
            if time.monotonic() >= until:
                break
        self.apply(arrivals, time.time())

    def _gather(self, arrivals: Arrivals, timeout: float) -> bool:
        """Read what is ready within `timeout`; False when nothing was."""
        ready = self._poller.poll(timeout * 1000)
        for sock, _ in ready:
            if sock == self.reports.readable:
                arrivals.reports += self.reports.take()
            else:
                host = self._subs[sock]
                self.links[host].heard_at = time.monotonic()
                arrivals.read(host, _drain(sock))
        return bool(ready)

    def apply(self, arrivals: Arrivals, now: float) -> None:
        live: list[Row] = []
        paged: list[Row] = []
        events: list[Row] = []
        # live first: what was read off a SUB before its session's LOST belongs to that session
        for host, (live_samples, live_events) in arrivals.live.items():
            live += [(host, body) for body in live_samples]
            events += [(host, body) for body in live_events]
            self._heard(host, live_samples, live_events)
            pushed = [event for event in live_events if event["policy"] is not None]
            if pushed:
                policy, origin = pushed[-1]["policy"], origin_in_detail(pushed[-1]["detail"])
                self.board.set_policy(host, policy, origin)
                self.store.record_policy(host, policy, now, origin)
                if self.metrics is not None:
                    self.metrics.set_policy(self.host_name(host), policy, host, origin)
        for host, (count, problem) in arrivals.invalid.items():
            version = self._infos.get(host, {}).get("agent", "version unknown")
            self.board.invalid(host, problem, version, now, count)
            if self.metrics is not None:
                self.metrics.observe_invalid(self.host_name(host), count, host)
        for report in arrivals.reports:
            if report.kind == CONNECTED:
                self._connected(report.host, report.data, now)
            elif report.kind in (LOST, REFUSED):
                self._lost(report.host)
                status = INVALID if report.kind == REFUSED else UNREACHABLE
                self.board.unreachable(report.host, report.data, now, status)
                if report.kind == REFUSED and self.metrics is not None:  # an invalid message
                    self.metrics.observe_invalid(self.host_name(report.host), 1, report.host)
            elif report.kind == PAGE:
                page: Page = report.data
                paged += [(report.host, body) for body in page.samples]
                events += [(report.host, body) for body in page.events]
                self._paged(report.host, page)
        new_samples, new_events = self.store.add(paged + live, events, self._moved_cursors())
        self.recorded += new_samples
        for host, body in paged:
            self.board.sample(host, body, now, live=False)
        for host, body in live:
            self.board.sample(host, body, now, live=True)
        for host, body in new_events:
            self.board.event(host, body)
            if self.metrics is not None:
                self.metrics.observe_event({**body, "host": self.host_name(host)}, host)
        self.board.tick(now)
        if self.metrics is not None:
            self._export()
        self._prune(now)

    def _connected(self, host: str, session: Session, now: float) -> None:
        """A session began: read the host's SUB from now on and order its first backfill
        (whatever the SUB missed before it connected shows as a gap)."""
        info = session.info
        self.board.connected(host, info["machine"].get("hostname"), info, now)
        self.store.record_policy(host, info["policy"], now, origin_told(info.get("policy_origin")))
        self._names[host] = info.get("name") or host
        self._infos[host] = info
        self._lost(host)
        self._subs[session.sub], self._sub_of[host] = host, session.sub
        self._poller.register(session.sub, zmq.POLLIN)
        latest = self._trackers.get(host)  # saved with this batch, maybe not yet stored
        cursor, since = (latest[1].cursor if latest else self.cursors[host]), None
        if cursor is None or cursor.history != info["history"]:
            since = now - BACKFILL_FIRST_S if cursor is None else None
            cursor = Cursor(info["history"])
        tracker = CursorTracker(cursor)
        tracker.start_backfill()
        self._trackers[host] = (session.number, tracker)
        self.links[host].orders.put(Backfill(session.number, cursor, since))

    def _lost(self, host: str) -> None:
        """The host's session ended: its SUB goes (a new session makes a new one and a new
        tracker; the old one's cursor is still stored with what it covers)."""
        sub = self._sub_of.pop(host, None)
        if sub is not None:
            self._poller.unregister(sub)
            del self._subs[sub]
            sub.close(linger=0)

    def _paged(self, host: str, page: Page) -> None:
        number, tracker = self._trackers[host]
        tracker.paged(page.samples, page.events)
        if page.last and tracker.backfilled():
            self.links[host].orders.put(Backfill(number, tracker.cursor))

    def _heard(
        self, host: str, samples: list[dict[str, Any]], events: list[dict[str, Any]]
    ) -> None:
        number, tracker = self._trackers[host]
        if tracker.live(samples, events):
            self.links[host].orders.put(Backfill(number, tracker.cursor))

    def _moved_cursors(self) -> dict[str, Cursor]:
        """Each host's cursor that moved since it was last stored (stored with what it covers)."""
        moved = {
            host: tracker.cursor
            for host, (_, tracker) in self._trackers.items()
            if tracker.cursor != self.cursors[host]
        }
        self.cursors.update(moved)
        return moved

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
                    policy_origin=view.policy_origin,
                )
                self._exported_up[name] = True
            if view.sample is not None and self._exported.get(name) != view.sample["time"]:
                self.metrics.observe_sample({**view.sample, "host": host}, name)
                self._exported[name] = view.sample["time"]
