"""`agent run`'s feed: the daemon's samples while one answers, this machine's own source while
none does, and back to a daemon as soon as one answers again; EventForwarder sends the job's
events to the daemon."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import replace

import zmq

from agent.cooling.local_feed import LocalFeed, Observation
from agent.cooling.session import (
    CLOSE_WAIT_S,
    CONNECT_TIMEOUT_S,
    DaemonLost,
    DaemonSession,
    connect_daemon,
)
from agent.daemon_address import DaemonAddress, find_daemon
from agent.thermal import (
    SourceSpecError,
    SourceUnavailable,
    ThermalMonitor,
    ThermalSource,
    open_source,
)
from agent.thermal.base import NoneSource
from shared.cooling.calibration import SET_BY_COORDINATOR, PolicyInForce
from shared.io.keys import own_keypair
from shared.io.transport import AgentClient, HostError
from shared.wire.telemetry import Event

log = logging.getLogger("agent.remote")

REJOIN_EVERY_S = 1.0
"""How often `agent run`, supervising by itself, looks whether a daemon answers (again)."""


STATE_ACTIONS = frozenset({"pause", "resume", "stop", "kill"})
"""The events that set a job's state: the latest is replayed to a daemon that answers again."""


def open_fallback(source: ThermalSource | str | None, poll_interval: float) -> ThermalSource:
    """The source to read once the daemon is gone: a name is opened here (a source that cannot
    work becomes `none`, with the reason)."""
    if isinstance(source, ThermalSource):
        return source
    try:
        return open_source(source or "auto", interval_s=poll_interval)
    except (SourceSpecError, SourceUnavailable) as exc:
        return NoneSource(f"fallback source: {exc}")


PolicyFor = Callable[[ThermalSource], PolicyInForce]
"""The policy for a local source (its scale's defaults, or this Mac's calibration made with it,
under the thresholds given: agent.commands.run; ValueError when it cannot be): the daemon's
comes with its samples."""


class DaemonFeed:
    """`agent run`'s Feed: the daemon's samples, judged by its policy, while one answers; this
    machine's own source (`fallback`, `auto` by default, opened only then) at `poll_interval`
    with the last policy while none does, looking for one again every REJOIN_EVERY_S. Each
    change comes with a note on its sample: `fallback` when the daemon went away, `rejoin` when
    one answers again (a restarted `agent serve`).

    next() runs on the supervisor's sampler thread, which alone uses the daemon session;
    close() may come from any thread."""

    def __init__(
        self,
        session: DaemonSession | None,
        fallback: str,
        poll_interval: float,
        policy_for: PolicyFor,
        local: ThermalMonitor | None = None,
    ) -> None:
        """Without a `session`, `local` is the monitor to start on, judged by `policy_for` its
        source's scale."""
        self._session = session
        self._policy_for = policy_for
        self._fallback = fallback
        self._poll_interval = poll_interval
        self._policy = PolicyInForce(session.policy, session.policy_origin) if session else None
        self._local: LocalFeed | None = None
        if session is None:
            monitor = local or self._open_local()
            try:
                self._policy = policy_for(monitor.source)
            except BaseException:  # thresholds out of order with this source's defaults
                monitor.close()
                raise
            self._local = LocalFeed(monitor, self._policy.policy)
        self._look_at = time.monotonic() + REJOIN_EVERY_S
        self._closed = threading.Event()
        self._finished = threading.Event()
        self._lock = threading.Lock()
        self._sampling = False

    @property
    def remote(self) -> bool:
        """Whether the readings come from the daemon now."""
        return self._session is not None

    @property
    def source(self) -> str:
        session, local = self._session, self._local
        return session.source.name if session else local.source if local else "none"

    @property
    def simulated(self) -> bool:
        session, local = self._session, self._local
        return session.source.simulated if session else bool(local and local.simulated)

    @property
    def policy(self) -> PolicyInForce:
        session = self._session
        if session is not None:
            return PolicyInForce(session.policy, session.policy_origin)
        assert self._policy is not None  # set whenever there is no session
        return self._policy

    def next(self) -> Observation | None:
        with self._lock:
            self._sampling = True
        while not self._closed.is_set():
            session, local = self._session, self._local
            if session is not None:
                try:
                    sample = session.next_sample(self._closed)
                except DaemonLost as exc:
                    sample = self._fall_back(session, str(exc))
                if sample is not None:
                    return sample
                continue
            assert local is not None
            sample = local.next()
            if sample is not None and time.monotonic() >= self._look_at:
                self._look_at = time.monotonic() + REJOIN_EVERY_S
                sample = self._rejoin(local) or sample
            if sample is not None:
                return sample
        self._release()
        return None

    def close(self) -> None:
        self._closed.set()
        with self._lock:
            local, sampling = self._local, self._sampling
        if local is not None:
            local.close()
        if sampling:
            self._finished.wait(CLOSE_WAIT_S)
        else:
            self._release()  # no sampler thread ever used the session

    def _release(self) -> None:
        with self._lock:
            session, self._session = self._session, None
        if session is not None:
            session.close()
        self._finished.set()

    def _open_local(self) -> ThermalMonitor:
        source = open_fallback(self._fallback, self._poll_interval)
        return ThermalMonitor(self._poll_interval, source=source)

    def _fall_back(self, session: DaemonSession, why: str) -> Observation | None:
        session.close()
        monitor = self._open_local()
        self._policy = self._local_policy(session, monitor.source)
        with self._lock:
            self._session = None
            if self._closed.is_set():
                monitor.close()
                return None
            self._local = LocalFeed(monitor, self._policy.policy)
            self._look_at = time.monotonic() + REJOIN_EVERY_S
        sample = self._local.next()
        note = f"{why}; supervising with {monitor.source.name} here, {self._policy}"
        return None if sample is None else replace(sample, note=note)

    def _local_policy(self, session: DaemonSession, source: ThermalSource) -> PolicyInForce:
        """What a coordinator set on the daemon stays in force; defaults are this source's
        (a local sensor may read on another scale than the daemon's). Thresholds given to agent
        run out of order with them keep the daemon's numbers."""
        daemon = PolicyInForce(session.policy, session.policy_origin)
        if daemon.origin.startswith(SET_BY_COORDINATOR):
            return daemon
        try:
            return self._policy_for(source)
        except ValueError:
            return daemon

    def _rejoin(self, local: LocalFeed) -> Observation | None:
        """The daemon's first sample when one answers now (our own source is closed)."""
        session = connect_daemon(warn=False)
        if session is None:
            return None
        with self._lock:
            if self._closed.is_set():
                session.close()
                return None
            self._local, self._session = None, session
        local.close()
        note = (
            f"agent serve (pid {session.address.pid}) answers: readings from "
            f"{session.source.name} there again, its {self.policy}"
        )
        return Observation(session.first, session.policy, note=note, note_action="rejoin")


def register(
    fallback: str, poll_interval: float, policy_for: PolicyFor, local: Callable[[], ThermalMonitor]
) -> tuple[DaemonFeed, EventForwarder]:
    """`agent run`'s way in: a feed of the daemon's samples and a sink that lists the job there
    when a daemon answers; else a feed over `local()` (this machine's sensor, judged by
    `policy_for` its scale) that joins a daemon once one answers, and a sink that waits for it."""
    session = connect_daemon()
    if session is None:
        feed = DaemonFeed(None, fallback, poll_interval, policy_for, local())
        return feed, EventForwarder(None)
    feed = DaemonFeed(session, fallback, poll_interval, policy_for)
    return feed, EventForwarder(session.address)


class EventForwarder:
    """A Supervisor sink: each event of the job goes to the daemon as job.event, which lists the
    job and publishes the event. Never waits on the daemon: enforcement must not hang on a
    socket, and while no daemon answers events are only kept here (`agent run` records them
    itself in any case). A `rejoin` event connects to the daemon that answers now and replays
    the job's `start` and its latest state first, so the new daemon lists the job as it is."""

    def __init__(self, address: DaemonAddress | None, timeout: float = CONNECT_TIMEOUT_S) -> None:
        self.timeout = timeout
        self.ctx = zmq.Context()
        self.client: AgentClient | None = None
        self._start: Event | None = None
        self._state: Event | None = None
        if address is not None:
            self._connect(address)

    def __call__(self, event: Event) -> None:
        if event.action == "start":
            self._start = event
        elif event.action in STATE_ACTIONS:
            self._state = event
        if event.action == "rejoin":
            self._reconnect()
        self._send(event)

    def _connect(self, address: DaemonAddress) -> bool:
        client = AgentClient(
            self.ctx,
            address.endpoint,
            address.public_key,
            own_keypair() if address.public_key else None,
            self.timeout,
        )
        try:
            client.connect()
        except HostError as exc:
            client.close()
            log.warning("agent serve (pid %d) did not answer: %s", address.pid, exc)
            return False
        client.sock.sndtimeo = 0
        self.client = client
        return True

    def _reconnect(self) -> None:
        if self.client is not None:
            self.client.close()
            self.client = None
        address = find_daemon()
        if address is None or not self._connect(address):
            return
        for replayed in (self._start, self._state):
            if replayed is not None:
                self._send(replayed)

    def _send(self, event: Event) -> None:
        client = self.client
        if client is None:
            return
        while client.sock.poll(0):
            client.sock.recv()  # job.event.ok: nothing to learn from it
        # The daemon gone or stuck is not worth a stall: the event is recorded here anyway.
        with contextlib.suppress(zmq.Again):
            client.send("job.event", event.job_body())

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
        self.ctx.term()
