"""The local agent daemon's monitor, for the processes of this machine: one sensor reader serves
every job (docs/protocol.md §12).

A running `agent serve` writes `agent-serve.json` in its data directory (find_daemon() reads it).
Local clients talk to it with the agent's own keypair, which the daemon trusts by itself:

- `RemoteMonitor`: ThermalMonitor's API over the daemon's samples, with the daemon's policy in
  `policy` (CoolingScheduler uses it); a local monitor when no daemon runs, or once it is gone.
- `DaemonFeed`: the agent.supervise Feed `agent run` uses: the daemon's samples while one
  answers, a LocalFeed over this machine's own source while none does, and back to a daemon as
  soon as one answers again; `EventForwarder` sends the job's events to the daemon.
- `FedSource`: a ThermalSource whose readings someone else hands over (a benchmark job process
  gets the daemon's on its stdin; RemoteMonitor gets them off the telemetry socket).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import zmq

from agent.supervise import LocalFeed, Observation
from agent.telemetry import SourceInfo, policy_text, reading_from_wire
from agent.thermal import (
    SourceSpecError,
    SourceUnavailable,
    ThermalMonitor,
    ThermalReading,
    ThermalSource,
    open_source,
)
from agent.thermal.base import NoneSource
from agent.thermal.monitor import StopFlag
from shared import protocol as p
from shared.io.files import replace_atomically
from shared.io.keys import own_keypair
from shared.io.paths import data_dir
from shared.io.transport import AgentClient, HostError
from shared.policy import ThermalPolicy
from shared.telemetry import Event

log = logging.getLogger("agent.remote")

STATE_FILE = "agent-serve.json"
CONNECT_TIMEOUT_S = 2.0
"""How long a local client waits for the daemon before supervising itself."""
SLICE_S = 0.1
"""How often a client waiting for a sample looks whether it was closed or the daemon died."""
CLOSE_WAIT_S = 2.0
REJOIN_EVERY_S = 1.0
"""How often `agent run`, supervising by itself, looks whether a daemon answers (again)."""
STATE_ACTIONS = frozenset({"pause", "resume", "stop", "kill"})
"""The events that set a job's state: the latest is replayed to a daemon that answers again."""


# --- finding the daemon -----------------------------------------------------------------------


@dataclass(frozen=True)
class DaemonAddress:
    """Where this machine's daemon listens, as its state file says."""

    pid: int
    endpoint: str
    telemetry: str
    public_key: str | None


def state_path() -> Path:
    return data_dir() / STATE_FILE


def pid_alive(pid: int) -> bool:
    """Whether the process lives (a negative pid: whether any of that process group does)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: alive
    return True


def write_state(address: DaemonAddress) -> None:
    """Publish where the daemon listens (0600, replaced atomically: a stale file from a killed
    daemon is overwritten)."""
    replace_atomically(
        state_path(),
        json.dumps(
            {
                "pid": address.pid,
                "endpoint": address.endpoint,
                "telemetry": address.telemetry,
                "public_key": address.public_key,
            }
        ),
    )


def remove_state(pid: int) -> None:
    """Remove the state file if it is still this daemon's."""
    found = read_state()
    if found is not None and found.pid == pid:
        state_path().unlink(missing_ok=True)


def read_state() -> DaemonAddress | None:
    try:
        data = json.loads(state_path().read_text(encoding="utf-8"))
        return DaemonAddress(
            int(data["pid"]), str(data["endpoint"]), str(data["telemetry"]), data["public_key"]
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def find_daemon() -> DaemonAddress | None:
    """This data directory's running daemon; None when there is none (or only a stale file)."""
    found = read_state()
    return found if found is not None and pid_alive(found.pid) else None


class DaemonUnavailable(RuntimeError):
    """The daemon's state file is there but the daemon did not answer."""


class DaemonLost(RuntimeError):
    """The daemon stopped publishing or its process is gone; the message says which."""


# --- readings handed over -----------------------------------------------------------------------


class FedSource(ThermalSource):
    """Readings that another process took: read() returns the latest one handed over, never
    touching a sensor. Named after the source that took them. `pushed`: the monitor over it
    records each as it is handed over, and polls nothing itself."""

    pushed = True

    def __init__(self, info: SourceInfo) -> None:
        super().__init__()
        self.name = info.name
        self.simulated = info.simulated
        self._latest: ThermalReading | None = None
        self.last_error = "no reading from the agent yet"

    def feed(self, reading: ThermalReading | None) -> None:
        self._latest = reading
        self.last_error = None if reading else "the agent has no reading"

    def end(self, why: str) -> None:
        self._latest = None
        self.last_error = why

    def read(self) -> ThermalReading | None:
        return self._latest


# --- one connection to the daemon ---------------------------------------------------------------


class DaemonSession:
    """Requests on a DEALER and samples on a SUB, both with this data directory's keypair.
    Built on one thread, then used by one thread at a time."""

    def __init__(self, address: DaemonAddress, timeout: float = CONNECT_TIMEOUT_S) -> None:
        self.address = address
        self.ctx = zmq.Context()
        keypair = own_keypair() if address.public_key else None
        self.client = AgentClient(self.ctx, address.endpoint, address.public_key, keypair, timeout)
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.linger = 0
        self.sub.maxmsgsize = p.MAX_MESSAGE_SIZE
        if keypair is not None and address.public_key:
            self.sub.curve_secretkey = keypair.secret.encode("ascii")
            self.sub.curve_publickey = keypair.public.encode("ascii")
            self.sub.curve_serverkey = address.public_key.encode("ascii")
        self.sub.subscribe(b"")
        try:
            self.sub.connect(f"tcp://{address.telemetry}")
            self.client.connect()
            info = self.client.request("info", timeout=timeout)
        except (HostError, zmq.ZMQError) as exc:
            self.close()
            raise DaemonUnavailable(
                f"agent serve (pid {address.pid}) did not answer: {exc}"
            ) from None
        thermal = info["thermal"]
        self.source = SourceInfo(thermal["source"], thermal["simulated"])
        self.first = reading_from_wire(thermal["reading"])
        self.poll_interval: float = info["poll_interval"]
        self.policy = ThermalPolicy.from_dict(info["policy"])
        self.silence_s = 3 * self.poll_interval + 1.0
        self._heard = time.monotonic()

    def next_sample(self, stop: StopFlag | threading.Event) -> Observation | None:
        """The daemon's next reading with the policy to judge it by (a `policy` event carries the
        new one); None once `stop` is set. Raises DaemonLost."""
        while not stop.is_set():
            if self.sub.poll(SLICE_S * 1000):
                try:
                    message = p.decode_telemetry(self.sub.recv_multipart())
                except p.ProtocolError as exc:
                    log.warning("ignored a telemetry message: %s", exc.message)
                    continue
                self._heard = time.monotonic()
                if message.type == "telemetry.sample":
                    return Observation(reading_from_wire(message.body), self.policy)
                if message.body["policy"] is not None:
                    self.policy = ThermalPolicy.from_dict(message.body["policy"])
                continue
            if not pid_alive(self.address.pid):
                raise DaemonLost(f"agent serve (pid {self.address.pid}) is gone")
            silent = time.monotonic() - self._heard
            if silent > self.silence_s:
                raise DaemonLost(
                    f"agent serve (pid {self.address.pid}) sent nothing for {silent:.1f} s"
                )
        return None

    def close(self) -> None:
        self.sub.close(linger=0)
        self.client.close()
        self.ctx.term()


def connect_daemon(timeout: float = CONNECT_TIMEOUT_S, warn: bool = True) -> DaemonSession | None:
    """A session with this machine's daemon, or None (none runs, or it does not answer: why is
    logged when `warn`)."""
    address = find_daemon()
    if address is None:
        return None
    try:
        return DaemonSession(address, timeout)
    except DaemonUnavailable as exc:
        if warn:
            log.warning("%s; going on without it", exc)
        return None


def open_fallback(source: ThermalSource | str | None, poll_interval: float) -> ThermalSource:
    """The source to read once the daemon is gone: a name is opened here (a source that cannot
    work becomes `none`, with the reason)."""
    if isinstance(source, ThermalSource):
        return source
    try:
        return open_source(source or "auto", interval_s=poll_interval)
    except (SourceSpecError, SourceUnavailable) as exc:
        return NoneSource(f"fallback source: {exc}")


# --- agent run ----------------------------------------------------------------------------------


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
        policy: ThermalPolicy,
        local: ThermalMonitor | None = None,
    ) -> None:
        """Without a `session`, `local` is the monitor to start on."""
        self._session = session
        self._fallback = fallback
        self._poll_interval = poll_interval
        self._policy = session.policy if session else policy
        self._local: LocalFeed | None = None
        if session is None:
            self._local = LocalFeed(local or self._open_local(), policy)
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
    def policy(self) -> ThermalPolicy:
        session = self._session
        return session.policy if session else self._policy

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
        self._policy = session.policy
        session.close()
        monitor = self._open_local()
        with self._lock:
            self._session = None
            if self._closed.is_set():
                monitor.close()
                return None
            self._local = LocalFeed(monitor, self._policy)
            self._look_at = time.monotonic() + REJOIN_EVERY_S
        sample = self._local.next()
        note = f"{why}; supervising with {monitor.source.name} here"
        return None if sample is None else replace(sample, note=note)

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
            f"{session.source.name} there again, its policy {policy_text(session.policy)}"
        )
        return Observation(session.first, session.policy, note=note, note_action="rejoin")


def register(
    fallback: str, poll_interval: float, policy: ThermalPolicy, local: Callable[[], ThermalMonitor]
) -> tuple[DaemonFeed, EventForwarder]:
    """`agent run`'s way in: a feed of the daemon's samples and a sink that lists the job there
    when a daemon answers; else a feed over `local()` (this machine's sensor, judged by
    `policy`) that joins a daemon once one answers, and a sink that waits for it."""
    session = connect_daemon()
    if session is None:
        return DaemonFeed(None, fallback, poll_interval, policy, local()), EventForwarder(None)
    return DaemonFeed(session, fallback, poll_interval, policy), EventForwarder(session.address)


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


# --- cooperative training loops -----------------------------------------------------------------


class RemoteMonitor(ThermalMonitor):
    """The local daemon's monitor with ThermalMonitor's API and semantics: `reading`,
    `temperature`, `get_history()` and `is_rising()` follow the daemon's samples (its poll
    interval, its source's name); `read()` / `get_soc_temperature()` give its latest reading;
    `policy` is the policy the daemon enforces (updated when a coordinator pushes one), which
    CoolingScheduler uses when given no policy of its own.

    With no daemon running, it is a plain ThermalMonitor over `source` (a name or a
    ThermalSource; "auto" by default) and `policy` is None. If the daemon goes away while
    polling, it opens `source` then and goes on locally, keeping the daemon's last policy.
    """

    def __init__(
        self,
        poll_interval: float = 1.0,
        history_size: int = 60,
        source: ThermalSource | str | None = None,
    ) -> None:
        self._fallback = source
        self._session = connect_daemon()
        self.policy: ThermalPolicy | None = None
        if self._session is None:
            super().__init__(poll_interval, history_size, source)
            return
        fed = FedSource(self._session.source)
        fed.feed(self._session.first)
        super().__init__(self._session.poll_interval, history_size, fed)
        self.policy = self._session.policy

    def start(self) -> None:
        """With a daemon: take its latest reading now, then follow its samples on a thread."""
        if self._session is None or self.running:
            super().start()
            return
        self._poll()
        self._start_thread()

    @property
    def remote(self) -> bool:
        """Whether readings come from the daemon now."""
        return self._session is not None

    def close(self) -> None:
        super().close()
        session, self._session = self._session, None
        if session is not None:
            session.close()

    def _run(self) -> None:
        session = self._session
        if session is None:
            super()._run()
            return
        try:
            while (sample := session.next_sample(self._stop)) is not None:
                assert isinstance(self.source, FedSource)
                self.source.feed(sample.reading)
                self.policy = sample.policy
                self._poll()
            return
        except DaemonLost as exc:
            log.warning("%s: reading the sensor here", exc)
        self._session = None
        session.close()
        with self._source_lock:
            self.source = open_fallback(self._fallback, self.poll_interval)
            self._owns_source = not isinstance(self._fallback, ThermalSource)
        super()._run()
