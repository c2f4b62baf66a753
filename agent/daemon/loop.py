"""`agent serve`: the per-Mac daemon coordinators drive over ZeroMQ (docs/protocol.md).

The daemon is four parts on one thread, wired here: its sockets (agent.daemon.endpoints), its
telemetry hub with the one sensor reader and the policy (agent.daemon.hub), its benchmark jobs
(agent.daemon.benchmark.jobs) and the request handlers (agent.daemon.requests). The loop below polls
the command socket, the hub's wake-up pipe and the running job's pipe, so ping and info are answered
while a job runs; whatever wakes it, it first takes every reading the hub holds, so each request
sees them all.

SIGTERM (or SIGINT) stops the job, flushes what it finished, tells its coordinator, and exits 0.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import signal
import sqlite3
import time
from pathlib import Path

import zmq

from agent.daemon.benchmark.jobs import CANCEL_GRACE_S, BenchJobs
from agent.daemon.endpoints import DEFAULT_BIND, AgentSockets, ServeError, local_address
from agent.daemon.hub import TelemetryHub
from agent.daemon.ranks import POLL_S, RankJobs
from agent.daemon.requests import Requests
from agent.daemon.storage import STATE, StorageHealth, describe
from agent.daemon.throttle import LogThrottle
from agent.daemon.wake import WakePipe
from agent.daemon_address import DaemonAddress, remove_state, state_path, write_state
from agent.power.meter import EnergyMeter
from agent.power.registry import open_power_source
from agent.profiling.device_probe import NO_DEVICE_FIX
from agent.profiling.machine import machine_info, package_version
from agent.staging.serving import ChunkServer
from agent.staging.store import ModelStore
from agent.staging.tasks import DEFAULT_BUSY_RATE, StageTasks
from agent.thermal import SourceSpecError, SourceUnavailable, ThermalSource, open_source
from agent.thermal.plant import PlantSource
from shared.benchmark.energy import DEFAULT_BASELINE_S
from shared.cooling.sources import DEFAULT_POLL_INTERVAL_S
from shared.io.keys import own_keypair
from shared.io.paths import DataDirError, checked_data_dir, data_dir
from shared.io.sqlite import StoreError
from shared.wire import protocol as p

log = logging.getLogger("agent.serve")  # the name its log lines have always carried

PARENT_CHECK_S = 1.0
"""With --parent-pid, how often the loop looks whether its coordinator is still there. Nothing
else wakes an idle daemon but a request, the hub's readings (each poll while a subscriber, a job
or a deferred reply needs the loop, every WRITE_EVERY polls otherwise: TelemetryHub.pace) or
stop()."""
DEFAULT_RETENTION_DAYS = 7.0
RANKS_DIR = "ranks"
"""Under the data dir: each rank's launch files and output, a folder per job."""


class AgentDaemon:
    """start() binds, serve_forever() serves until stop() (safe from a signal handler)."""

    def __init__(
        self,
        bind: str = DEFAULT_BIND,
        secure: bool = True,
        thermal_source: str = "auto",
        *,
        poll_interval: float = DEFAULT_POLL_INTERVAL_S,
        telemetry_port: int | None = None,
        retention_days: float = DEFAULT_RETENTION_DAYS,
        prometheus: str | None = None,
        name: str | None = None,
        parent_pid: int | None = None,
        power_source: str = "auto",
        idle_baseline: float = DEFAULT_BASELINE_S,
        models_dir: Path | None = None,
        stage_busy_rate: float = DEFAULT_BUSY_RATE,
    ) -> None:
        """Raises ServeError for a bad --bind or a data directory it cannot use."""
        self.throttle = LogThrottle(log)
        """Every log line a peer or a fault could repeat without end goes through it."""
        self.storage = StorageHealth(self.throttle)
        self.sockets = AgentSockets(bind, secure, telemetry_port, self.throttle)
        self.parent_pid = parent_pid
        """Stop when this process (the coordinator that started us) is gone."""
        self.thermal_source = thermal_source
        self.power_source = power_source
        self.idle_baseline = idle_baseline
        self.prometheus = prometheus
        self._unwritten_state: DaemonAddress | None = None
        try:
            self.hub, self.jobs = open_stores(
                self.sockets, self.storage, poll_interval, retention_days, name
            )
        except ServeError:
            self.sockets.close()
            raise
        self.machine = machine_info()  # MLX's device asked in a child: an abort there is said
        if self.machine.get("device_error"):
            log.warning(
                "MLX device unknown, serving degraded: %s. Fix: %s",
                self.machine["device_error"],
                NO_DEVICE_FIX,
            )
        self.version = package_version("mlx-fleet") or "unknown"
        self.ranks = RankJobs(data_dir() / RANKS_DIR)
        self._wake = WakePipe()
        store = ModelStore(models_dir)
        chunks = ChunkServer(store, self._wake.wake)
        keypair = own_keypair() if secure else None
        self.staging = StageTasks(store, chunks, keypair, lambda: runs_a_job(self), stage_busy_rate)
        self.requests = Requests(
            self.sockets,
            self.hub,
            self.jobs,
            self.machine,
            self.version,
            lambda: self._stopping,
            self.ranks,
            self.staging,
        )
        self._stopping = False

    @property
    def public_key(self) -> str | None:
        return self.sockets.public_key

    @property
    def telemetry(self) -> str:
        return self.sockets.telemetry

    def start(self) -> str:
        """Bind the command and telemetry sockets, then start monitoring; returns the command
        endpoint actually bound (the port resolved). Raises ServeError, everything closed."""
        try:
            source, meter = open_instruments(
                self.thermal_source, self.power_source, self.hub.poll_interval, self.idle_baseline
            )
        except ServeError:
            self.close()
            raise
        if isinstance(source, PlantSource):  # heated by the jobs it supervises, too
            source.heat_from(self.hub.jobs.live_pgids)
        try:
            endpoint = self.sockets.bind()
            if self.prometheus:
                self._serve_metrics(self.prometheus)
        except ServeError:
            source.close()
            meter.close()
            self.close()
            raise
        try:
            self.jobs.recover()  # bound: no other daemon runs on this data directory's jobs
        except sqlite3.Error as exc:
            source.close()
            meter.close()
            self.close()
            raise ServeError(f"cannot update the job journal: {describe(exc)}") from None
        self._unwritten_state = DaemonAddress(
            os.getpid(),
            local_address(endpoint),
            local_address(self.sockets.telemetry),
            self.sockets.public_key,
        )
        self._retry_writes()
        self.hub.start(source, meter)
        log.info("telemetry on %s", self.sockets.telemetry)
        return endpoint

    def _serve_metrics(self, address: str) -> None:
        try:
            port = self.hub.serve_metrics(address, self.version, self.machine)
        except (ValueError, OSError) as exc:
            raise ServeError(f"--prometheus: {exc}") from None
        log.info("metrics on http://%s:%d/metrics", address.rpartition(":")[0], port)

    def stop(self, *_: object) -> None:
        """Ask the loop to end (safe from a signal handler: a signal interrupts the loop's
        poll, which runs this handler and polls again, to find the wake-up pipe readable)."""
        self._stopping = True
        self._wake.wake()

    def serve_forever(self) -> None:
        """Serve until stop(); then cancel the job and keep serving (pings, info) until it has
        flushed its cells and its coordinator got bench.done, or the grace time is over."""
        poller = zmq.Poller()
        poller.register(self.sockets.router, zmq.POLLIN)
        poller.register(self.sockets.publisher, zmq.POLLIN)  # (un)subscriptions
        poller.register(self.hub.wake_fd, zmq.POLLIN)
        poller.register(self._wake.fd, zmq.POLLIN)
        deadline: float | None = None
        while True:
            if self.parent_pid is not None and os.getppid() != self.parent_pid:
                self._stopping = True  # our coordinator died: an embedded agent goes with it
            if self._stopping and deadline is None:
                deadline = time.monotonic() + CANCEL_GRACE_S + 1.0
                if self.jobs.running is not None:
                    log.info("stopping: cancelling job %s", self.jobs.running.id)
                    self.jobs.cancel(self.jobs.running)
            if deadline is not None and (self.jobs.running is None or time.monotonic() >= deadline):
                break  # at once when no job runs: not at the next thing that wakes the loop
            job = self.jobs.running
            if job is not None:
                poller.register(job.fd, zmq.POLLIN)
            ready = dict(poller.poll(self._sleep_ms(deadline)))
            if job is not None:
                poller.unregister(job.fd)
            if ready.get(self._wake.fd):
                self._wake.take()  # stop() woke us: the loop's top handles it
            if ready.get(self.sockets.publisher):
                self.sockets.read_subscriptions()  # first: a new subscriber gets this reading
            if ready.get(self.hub.wake_fd):
                self.hub.woken()
            self._take_readings()  # whatever woke the loop: the requests see every reading
            if ready.get(self.sockets.router):
                self._answer_all()
            self.requests.send_finished()
            for identity, message in self.staging.server.finished():
                self.sockets.send(identity, message)
            if job is not None and job is self.jobs.running and ready.get(job.fd):
                self.jobs.read(job)
            self.jobs.enforce_cancel()
            self.ranks.poll()
            self.throttle.flush()
            self.hub.pace(
                bool(self.sockets.subscriptions.prefixes)
                or self.jobs.running is not None
                or self.requests.deferred.waiting  # sent when the loop next wakes
            )
            self._take_readings()  # any taken while the loop worked, before pace() said so
        self.close()

    def _take_readings(self) -> None:
        """Every reading the hub holds: judged, stored, published, fed to the running job."""
        readings = self.hub.drain()
        if readings:
            for reading, clock in readings:
                self.jobs.feed(reading, self.hub.policy, clock)
            self._retry_writes()

    def _sleep_ms(self, deadline: float | None) -> float | None:
        """How long the loop may wait for a socket or pipe: for ever, unless something falls
        due: the end of the stop grace, a cancelled job's kill, the next parent check."""
        due = [] if deadline is None else [deadline]
        job = self.jobs.running
        if job is not None and job.kill_at is not None and math.isfinite(job.kill_at):
            due.append(job.kill_at)  # infinite once killed: then its pipe's end wakes us
        if self.parent_pid is not None:
            due.append(time.monotonic() + PARENT_CHECK_S)
        if self.ranks.running is not None:
            due.append(time.monotonic() + POLL_S)  # its end and its bound
        if not due:
            return None
        return max(0.0, min(due) - time.monotonic()) * 1000 + 1

    def _answer_all(self) -> None:
        for received in self.sockets.receive():
            identity = received.identity
            try:
                if isinstance(received.message, p.ProtocolError):
                    raise received.message
                self.requests.answer(received)
            except p.ProtocolError as exc:
                self.throttle.log(
                    f"refused messages ({exc.code})",
                    logging.INFO,
                    "refused a message: %s: %s",
                    exc.code,
                    exc.message.replace("\r", "\\r").replace("\n", "\\n"),  # one line
                )
                self.sockets.send(identity, p.error_for(exc))
            except Exception as exc:  # a bug answers one request with an error, never kills us
                log.exception("internal error")
                re = received.message.id if isinstance(received.message, p.Message) else None
                self.sockets.send(
                    identity, p.error(p.INTERNAL, f"{type(exc).__name__}: {exc}", re=re)
                )

    def _retry_writes(self) -> None:
        """Write what the disk refused before: once per poll (the hub retries its own stores
        with every sample)."""
        self.jobs.retry_writes()
        if self._unwritten_state is not None:
            try:
                write_state(self._unwritten_state)
            except OSError as exc:
                self.storage.failed(STATE, state_path(), exc)
                return
            self._unwritten_state = None
            self.storage.written(STATE)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            remove_state(os.getpid())
        self.requests.deferred.close()
        self.staging.close()
        if self.requests.calibration is not None:
            self.requests.calibration.close()
        self.ranks.close()
        self.hub.close()
        self.sockets.close()
        self.jobs.close()
        self._wake.close()


def runs_a_job(daemon: AgentDaemon) -> bool:
    """Whether a job runs here (a benchmark, a rank, an `agent run` job, a calibration): a
    model is then staged under the rate cap. Asked from a transfer's thread."""
    calibration = daemon.requests.calibration
    return (
        daemon.jobs.running is not None
        or daemon.ranks.running is not None
        or bool(daemon.hub.jobs.live_pgids())
        or (calibration is not None and calibration.state == "running")
    )


def open_stores(
    sockets: AgentSockets,
    storage: StorageHealth,
    poll_interval: float,
    retention_days: float,
    name: str | None,
) -> tuple[TelemetryHub, BenchJobs]:
    """The hub (history, events, policy) and the jobs (journal) over the data directory;
    ServeError naming the directory or the file and the problem when they cannot be."""
    try:
        checked_data_dir()  # the one check every command makes (shared.io.paths)
        hub = TelemetryHub(sockets.publish, poll_interval, retention_days, storage, name)
    except DataDirError as exc:
        raise ServeError(str(exc)) from None
    except (StoreError, OSError) as exc:
        raise ServeError(f"cannot open the agent's data: {describe(exc)}") from None
    try:
        jobs = BenchJobs(
            sockets.send,
            hub.event,
            lambda: hub.instruments.source,
            storage,
            poll_interval,
            lambda: hub.instruments.meter,
            hub.observe_cell,
        )
    except (StoreError, OSError) as exc:
        hub.close()
        raise ServeError(f"cannot open the agent's data: {describe(exc)}") from None
    return hub, jobs


def open_instruments(
    thermal_source: str, power_source: str, poll_interval: float, idle_baseline: float
) -> tuple[ThermalSource, EnergyMeter]:
    """The thermal source and the power meter `agent serve` was told to read; ServeError
    naming which cannot be opened, nothing left open."""
    try:
        source = open_source(thermal_source, interval_s=poll_interval)
    except (SourceSpecError, SourceUnavailable) as exc:
        raise ServeError(f"thermal source: {exc}") from None
    try:
        power = open_power_source(power_source, interval_s=poll_interval)
    except (SourceSpecError, SourceUnavailable) as exc:
        source.close()
        raise ServeError(f"power source: {exc}") from None
    return source, EnergyMeter(power, idle_baseline)


def serve(daemon: AgentDaemon) -> None:
    """Run `daemon` in the foreground until SIGTERM/SIGINT (launchd wants exactly that)."""
    signal.signal(signal.SIGTERM, daemon.stop)
    signal.signal(signal.SIGINT, daemon.stop)
    endpoint = daemon.start()
    security = f"curve-key={daemon.public_key}" if daemon.sockets.secure else "INSECURE"
    print(
        f"agent serve: listening on {endpoint} {security} telemetry={daemon.telemetry}", flush=True
    )
    daemon.serve_forever()
    log.info("stopped")
