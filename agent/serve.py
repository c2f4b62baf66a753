"""`agent serve`: the per-Mac daemon coordinators drive over ZeroMQ (docs/protocol.md).

One ROUTER socket answers every coordinator. A benchmark job runs in a child process
(`python -m agent.job`) whose records come back over a pipe; each is journaled in SQLite and
forwarded at once as bench.cell to the coordinator that asked. The loop never blocks on the job,
so ping and info are answered while it runs. One job at a time: a second bench.start gets a
`busy` error naming the running job. SIGTERM (or SIGINT) stops the job, flushes what it
finished, tells its coordinator, and exits 0.

The daemon also monitors all the time with ONE ThermalMonitor. Its thread hands every reading to
the main loop (a queue and a wake-up pipe), which judges it by the policy (persisted, changed by
policy.set), publishes it on a PUB socket, stores it (agent.history), feeds it to the running
benchmark job, and supervises that job with the same pure core as `agent run`. `agent run`
commands on this machine register through job.event (agent.remote). Everything stateful happens
on the main thread, so nothing here needs a lock.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from queue import Empty, SimpleQueue
from typing import Any

import msgpack
import zmq
from zmq.auth.thread import ThreadAuthenticator

from agent.events import Event, EventLog
from agent.history import TelemetryHistory, load_policy, save_policy
from agent.journal import Journal
from agent.keys import OwnOrTrustedKeys, TrustedKeys
from agent.machine import machine_info, package_version
from agent.model import BUILTIN_CONFIGS
from agent.profiling.runner import ModelLoadError, check_model_dir, require_mlx_lm
from agent.remote import DaemonAddress, pid_alive, remove_state, write_state
from agent.supervise import Supervision, react
from agent.telemetry import (
    TREND_WINDOW,
    JobTable,
    SourceInfo,
    event_body,
    event_from_body,
    history_limit,
    host_state,
    policy_text,
    reading_wire,
    retention_cutoff,
    sample_body,
    trend_c_per_min,
    updated_policy,
)
from agent.thermal import (
    SourceSpecError,
    SourceUnavailable,
    ThermalMonitor,
    ThermalReading,
    ThermalSource,
    open_source,
)
from shared import protocol as p
from shared.clock import now_iso
from shared.io.keys import own_keypair
from shared.io.metrics import MetricsServer, TelemetryMetrics, serve_metrics
from shared.io.paths import data_subdir
from shared.io.trust import trusted_dir
from shared.matrix import MatrixError, MatrixSpec, expand
from shared.policy import CoolingState

log = logging.getLogger("agent.serve")

DEFAULT_BIND = f"0.0.0.0:{p.DEFAULT_PORT}"
TICK_MS = 200
"""The loop wakes at least this often: how promptly SIGTERM and a stuck cancel are noticed."""
CANCEL_GRACE_S = 5.0
"""How long a cancelled job may take to finish its current cell before it is killed."""
JOB_PAGE_BYTES = p.MAX_MESSAGE_SIZE // 2
"""job.get and history.get pages hold up to this many packed bytes: a reply never hits the limit."""
DEFAULT_POLL_S = 1.0
DEFAULT_RETENTION_DAYS = 7.0
PRUNE_EVERY_S = 300.0
"""History is pruned this often, or ten times per retention period when that is shorter."""


class ServeError(ValueError):
    """The daemon cannot start: a bad --bind, --thermal-source or --prometheus, a port in use;
    the message says why."""


def endpoint_for(bind: str) -> tuple[str, bool]:
    """'HOST:PORT' -> ('tcp://HOST:PORT', is_ipv6); port 0 asks for an ephemeral port."""
    host, sep, port_text = bind.strip().rpartition(":")
    if not sep or not host or not port_text.isdigit() or int(port_text) > 65535:
        raise ServeError(
            f"bad --bind {bind!r}: expected HOST:PORT, e.g. 0.0.0.0:{p.DEFAULT_PORT}"
            " or 127.0.0.1:0 for any free port"
        )
    ipv6 = host.startswith("[")
    port = "*" if int(port_text) == 0 else port_text
    return f"tcp://{host}:{port}", ipv6


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


class TappedSource(ThermalSource):
    """A source that hands every read's outcome (None too) to `on_read`: how the one monitor's
    thread tells the daemon about each reading as it is taken."""

    def __init__(
        self, inner: ThermalSource, on_read: Callable[[ThermalReading | None], None]
    ) -> None:
        super().__init__()
        self.inner = inner
        self.name = inner.name
        self.simulated = inner.simulated
        self.last_error = inner.last_error
        self._on_read = on_read

    def read(self) -> ThermalReading | None:
        reading = None
        try:
            reading = self.inner.read()
        finally:  # a source that raises still makes a sample: one without a reading
            self.last_error = self.inner.last_error
            self._on_read(reading)
        return reading

    def close(self) -> None:
        self.inner.close()


@dataclass
class Job:
    """The running job, seen from the daemon."""

    id: str
    requester: bytes
    request_id: str
    total: int
    process: subprocess.Popen[bytes]
    fd: int
    output: Path
    """The job process's stdout and stderr: where a crash's traceback lands."""
    started: str
    unpacker: msgpack.Unpacker = field(default_factory=lambda: msgpack.Unpacker(raw=False))
    done: int = 0
    outcome: dict[str, Any] | None = None
    kill_at: float | None = None
    supervision: Supervision = field(default_factory=Supervision)
    """The policy's actions on the job, as the daemon decides them from its samples."""


class AgentDaemon:
    """start() binds, serve_forever() serves until stop() (safe from a signal handler)."""

    def __init__(
        self,
        bind: str = DEFAULT_BIND,
        secure: bool = True,
        thermal_source: str = "auto",
        *,
        poll_interval: float = DEFAULT_POLL_S,
        telemetry_port: int | None = None,
        retention_days: float = DEFAULT_RETENTION_DAYS,
        prometheus: str | None = None,
    ) -> None:
        self.endpoint, self.ipv6 = endpoint_for(bind)
        self.telemetry = telemetry_endpoint(self.endpoint, telemetry_port)
        self.secure = secure
        self.thermal_source = thermal_source
        self.poll_interval = poll_interval
        self.retention_days = retention_days
        self.prometheus = prometheus
        self.ctx = zmq.Context()
        self.router = self.ctx.socket(zmq.ROUTER)
        self.publisher = self.ctx.socket(zmq.PUB)
        self.auth: ThreadAuthenticator | None = None
        self.public_key: str | None = None
        self.journal = Journal()
        self.job: Job | None = None
        self.monitor: ThermalMonitor | None = None
        self.host = socket.gethostname()
        self.policy = load_policy()
        self.jobs = JobTable()
        self.history = TelemetryHistory(self.host, EventLog())
        self.metrics: TelemetryMetrics | None = None
        self._metrics_server: MetricsServer | None = None
        self._source = SourceInfo("none", False)
        self._readings: SimpleQueue[ThermalReading | None] = SimpleQueue()
        self._wake_read, self._wake_write = os.pipe()
        os.set_blocking(self._wake_write, False)
        self._last_reading: ThermalReading | None = None
        self._state: CoolingState | None = None
        self._temperatures: deque[float] = deque(maxlen=TREND_WINDOW)
        self._next_prune = 0.0
        self._stopping = False
        self._machine = machine_info()
        self._version = package_version("mlx-fleet") or "unknown"

    # --- lifecycle ------------------------------------------------------------------------------

    def start(self) -> str:
        """Bind the command and telemetry sockets, then start monitoring; returns the command
        endpoint actually bound (the port resolved)."""
        try:
            source = open_source(self.thermal_source, interval_s=self.poll_interval)
        except (SourceSpecError, SourceUnavailable) as exc:
            self.close()
            raise ServeError(f"thermal source: {exc}") from None
        self._source = SourceInfo(source.name, source.simulated)
        self.monitor = ThermalMonitor(self.poll_interval, source=TappedSource(source, self._tap))
        if self.secure:
            keypair = own_keypair()
            self.public_key = keypair.public
            self.auth = ThreadAuthenticator(self.ctx, log=logging.getLogger("agent.zap"))
            self.auth.start()
            self.auth.configure_curve_callback(
                domain="*",
                credentials_provider=OwnOrTrustedKeys(keypair.public, TrustedKeys(trusted_dir())),
            )
        for sock, endpoint in ((self.router, self.endpoint), (self.publisher, self.telemetry)):
            sock.ipv6 = self.ipv6
            sock.linger = 1000
            sock.maxmsgsize = p.MAX_MESSAGE_SIZE
            sock.heartbeat_ivl = 2000
            sock.heartbeat_timeout = 6000
            if self.secure:
                sock.curve_secretkey = keypair.secret.encode("ascii")
                sock.curve_publickey = keypair.public.encode("ascii")
                sock.curve_server = True
            try:
                sock.bind(endpoint)
            except zmq.ZMQError as exc:
                self.close()
                raise ServeError(f"cannot bind {endpoint}: {exc}") from None
        self.telemetry = self.publisher.last_endpoint.decode()
        if self.prometheus:
            self._start_metrics(self.prometheus)
        abandoned = self.journal.abandon_running()
        if abandoned:
            log.warning(
                "%d job(s) were running when the agent last stopped: marked failed", abandoned
            )
        endpoint = self.router.last_endpoint.decode()
        write_state(
            DaemonAddress(
                os.getpid(), local_address(endpoint), local_address(self.telemetry), self.public_key
            )
        )
        self.monitor.start()
        log.info(
            "monitoring %s every %g s; policy %s; telemetry on %s",
            self._source.name,
            self.poll_interval,
            policy_text(self.policy),
            self.telemetry,
        )
        return endpoint

    def _start_metrics(self, address: str) -> None:
        self.metrics = TelemetryMetrics()
        try:
            self._metrics_server = serve_metrics(self.metrics.registry, address)
        except (ValueError, OSError) as exc:
            self.close()
            raise ServeError(f"--prometheus: {exc}") from None
        host = address.rpartition(":")[0]
        log.info("metrics on http://%s:%d/metrics", host, self._metrics_server.port)

    def _tap(self, reading: ThermalReading | None) -> None:
        """On the monitor's thread: hand the reading to the main loop and wake it."""
        self._readings.put(reading)
        with contextlib.suppress(BlockingIOError):  # a wake-up is pending already
            os.write(self._wake_write, b"r")

    def stop(self, *_: object) -> None:
        """Ask the loop to end (safe from a signal handler)."""
        self._stopping = True

    def serve_forever(self) -> None:
        """Serve until stop(); then cancel the job and keep serving (pings, info) until it has
        flushed its cells and its coordinator got bench.done, or the grace time is over."""
        poller = zmq.Poller()
        poller.register(self.router, zmq.POLLIN)
        poller.register(self._wake_read, zmq.POLLIN)
        deadline: float | None = None
        while deadline is None or (self.job is not None and time.monotonic() < deadline):
            if self._stopping and deadline is None:
                deadline = time.monotonic() + CANCEL_GRACE_S + 1.0
                if self.job is not None:
                    log.info("stopping: cancelling job %s", self.job.id)
                    self._cancel(self.job)
            job = self.job
            if job is not None:
                poller.register(job.fd, zmq.POLLIN)
            events = dict(poller.poll(TICK_MS))
            if job is not None:
                poller.unregister(job.fd)
            if events.get(self._wake_read):
                self._drain_readings()
            if events.get(self.router):
                self._drain_router()
            if job is not None and job is self.job and events.get(job.fd):
                self._read_job(job)
            self._enforce_cancel()
        self.close()

    def close(self) -> None:
        remove_state(os.getpid())
        if self.monitor is not None:
            self.monitor.close()
            self.monitor.source.close()  # the monitor leaves a source it was given open
        if self._metrics_server is not None:
            self._metrics_server.close()
        if self.auth is not None:
            self.auth.stop()
            self.auth = None
        self.router.close(linger=1000)
        self.publisher.close(linger=0)
        self.ctx.term()
        self.journal.close()
        self.history.close()
        self.history.events.close()
        os.close(self._wake_read)
        os.close(self._wake_write)

    # --- telemetry ------------------------------------------------------------------------------

    def _drain_readings(self) -> None:
        with contextlib.suppress(BlockingIOError):
            os.read(self._wake_read, 4096)
        while True:
            try:
                reading = self._readings.get_nowait()
            except Empty:
                return
            self._on_reading(reading)

    def _on_reading(self, reading: ThermalReading | None) -> None:
        """One poll: judge, supervise the benchmark job, publish, store, prune."""
        now = time.time()
        self._last_reading = reading
        self._state = host_state(self.policy, reading, self._state)
        if reading is not None and reading.celsius is not None:
            self._temperatures.append(reading.celsius)
        self._supervise_job(reading)
        self._feed_job()
        for event in self.jobs.vanished(lambda pgid: pid_alive(-pgid), now):  # any in group
            self._event(event)
        self.jobs.expire(now)
        sample = sample_body(
            self.host,
            now,
            reading,
            self._source,
            self._state,
            trend_c_per_min(list(self._temperatures), self.poll_interval),
            self.jobs.pause_s_total(now),
            self.jobs.listed(),
        )
        self.history.add_sample(sample)
        self._publish("telemetry.sample", sample)
        if self.metrics is not None:
            self.metrics.observe_sample(sample)
        if now >= self._next_prune:
            self.history.prune(retention_cutoff(now, self.retention_days))
            self._next_prune = now + min(PRUNE_EVERY_S, self.retention_days * 86400.0 / 10)

    def _event(self, event: Event, kind: str = p.KIND_RUN, store: bool = True) -> None:
        """Keep the job table current (`kind` is what a `start` lists), record (unless `agent
        run` did) and publish."""
        self.jobs.apply(event, kind)
        if store:
            self.history.add_event(event)
        body = event_body(self.host, event)
        self._publish("telemetry.event", body)
        if self.metrics is not None:
            self.metrics.observe_event(body)

    def _publish(self, type_: str, body: dict[str, Any]) -> None:
        self.publisher.send_multipart(p.telemetry_frames(p.make(type_, body)))

    def _job_event(
        self, job: Job, action: str, celsius: float | None = None, detail: str | None = None
    ) -> None:
        self._event(
            Event(
                time=time.time(),
                job=job.id,
                pid=job.process.pid,
                action=action,
                source=self._source.name,
                simulated=self._source.simulated,
                celsius=celsius,
                detail=detail,
            ),
            p.KIND_BENCH,
        )

    def _supervise_job(self, reading: ThermalReading | None) -> None:
        """The benchmark job's pauses and stops as `agent run` would decide them; the job process
        honours them at its next iteration (it has the same readings and policy)."""
        job = self.job
        if job is None:
            return
        decision = react(job.supervision, self.policy, reading)
        job.supervision = decision.state
        for action in decision.actions:
            self._job_event(job, action.value, celsius=reading.celsius if reading else None)

    def _feed_job(self) -> None:
        """The latest reading and the policy to the job process. Never blocks: an update the
        pipe has no room for is dropped, the next one replaces it."""
        job = self.job
        if job is None or job.process.stdin is None:
            return
        update = msgpack.packb(
            {"reading": reading_wire(self._last_reading), "policy": self.policy.to_dict()}
        )
        with contextlib.suppress(BlockingIOError, BrokenPipeError):
            os.write(job.process.stdin.fileno(), update)

    # --- the command socket ---------------------------------------------------------------------

    def _drain_router(self) -> None:
        while True:
            try:
                frames = self.router.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            identity, payload = frames[0], frames[1:]
            try:
                if len(payload) != 1:
                    raise p.ProtocolError(
                        p.MALFORMED,
                        f"a message is exactly one frame after the identity, got {len(payload)}",
                    )
                message = p.decode(payload[0])
                p.require_request(message)
                self._handle(identity, message)
            except p.ProtocolError as exc:
                log.info("refused a message: %s: %s", exc.code, exc.message)
                self._send(identity, p.error_for(exc))
            except Exception as exc:  # a bug answers one request with an error, never kills us
                log.exception("internal error")
                self._send(identity, p.error(p.INTERNAL, f"{type(exc).__name__}: {exc}"))

    def _send(self, identity: bytes, message: p.Message) -> None:
        try:
            data = p.encode(message)
        except p.ProtocolError as exc:
            data = p.encode(p.error_for(exc))
        self.router.send_multipart([identity, data])

    def _reply(self, identity: bytes, request: p.Message, type_: str, body: dict[str, Any]) -> None:
        self._send(identity, p.make(type_, body, re=request.id))

    def _handle(self, identity: bytes, message: p.Message) -> None:
        handlers = {
            "hello": self._hello,
            "ping": self._ping,
            "info": self._info,
            "bench.start": self._bench_start,
            "bench.cancel": self._bench_cancel,
            "job.get": self._job_get,
            "history.get": self._history_get,
            "policy.get": self._policy_get,
            "policy.set": self._policy_set,
            "job.event": self._job_event_request,
        }
        handlers[message.type](identity, message)

    def _hello(self, identity: bytes, message: p.Message) -> None:
        self._reply(
            identity,
            message,
            "hello.ok",
            {
                "agent": self._version,
                "protocol": p.PROTOCOL_VERSION,
                "hostname": self.host,
                "secure": self.secure,
            },
        )

    def _ping(self, identity: bytes, message: p.Message) -> None:
        self._reply(
            identity,
            message,
            "ping.ok",
            {"job": self.job.id if self.job else None, "time": time.time()},
        )

    def _info(self, identity: bytes, message: p.Message) -> None:
        job = self.job
        self._reply(
            identity,
            message,
            "info.ok",
            {
                "agent": self._version,
                "protocol": p.PROTOCOL_VERSION,
                "machine": self._machine,
                "thermal": self._thermal(),
                "job": None
                if job is None
                else {"id": job.id, "done": job.done, "total": job.total, "started": job.started},
                "telemetry_port": int(self.telemetry.rpartition(":")[2]),
                "poll_interval": self.poll_interval,
                "policy": self.policy.to_dict(),
                "jobs": self.jobs.listed(),
            },
        )

    def _thermal(self) -> dict[str, Any]:
        """The latest polled reading, never waiting on the sensor."""
        reading = self.monitor.reading if self.monitor else None
        return {
            "source": self._source.name,
            "simulated": self._source.simulated,
            "reading": reading.to_dict() if reading else None,
            "error": self.monitor.last_error if self.monitor else None,
        }

    def _history_get(self, identity: bytes, message: p.Message) -> None:
        try:
            limit = history_limit(message.body["limit"])
        except ValueError as exc:
            raise p.ProtocolError(p.BAD_BODY, f"history.get: {exc}", re=message.id) from None
        samples, events, truncated = self.history.page(message.body["since"], limit, JOB_PAGE_BYTES)
        self._reply(
            identity,
            message,
            "history.get.ok",
            {"samples": samples, "events": events, "truncated": truncated},
        )

    def _policy_get(self, identity: bytes, message: p.Message) -> None:
        self._reply(identity, message, "policy.get.ok", {"policy": self.policy.to_dict()})

    def _policy_set(self, identity: bytes, message: p.Message) -> None:
        """Validate, persist, apply, announce; a refusal leaves the old policy in force."""
        try:
            policy = updated_policy(self.policy, message.body["policy"])
        except ValueError as exc:
            raise p.ProtocolError(
                p.BAD_POLICY,
                f"policy refused: {exc}; the policy in force stays {policy_text(self.policy)}",
                re=message.id,
            ) from None
        if policy != self.policy:
            save_policy(policy)
            self.policy = policy
            log.info("new policy: %s", policy_text(policy))
            self._event(
                Event(
                    time=time.time(),
                    job="",
                    pid=None,
                    action="policy",
                    source=self._source.name,
                    simulated=self._source.simulated,
                    detail=policy_text(policy),
                )
            )
            self._feed_job()
        self._reply(identity, message, "policy.set.ok", {"policy": policy.to_dict()})

    def _job_event_request(self, identity: bytes, message: p.Message) -> None:
        """An event of an `agent run` job on this machine: it recorded it, we list and publish."""
        self._event(event_from_body(message.body), p.KIND_RUN, store=False)
        self._reply(identity, message, "job.event.ok", {"job": message.body["job"]})

    def _bench_start(self, identity: bytes, message: p.Message) -> None:
        if self._stopping:
            raise p.ProtocolError(p.BUSY, "busy: the agent is stopping", re=message.id)
        if self.job is not None:
            job = self.job
            raise p.ProtocolError(
                p.BUSY,
                f"busy: job {job.id} is running ({job.done}/"
                f"{job.total} cells); cancel it or try again later",
                re=message.id,
            )
        try:
            spec = self._check_matrix(message.body["matrix"])
        except (MatrixError, ModelLoadError) as exc:
            raise p.ProtocolError(p.BAD_MATRIX, f"matrix rejected: {exc}", re=message.id) from None
        names = [cell.name for cell in expand(spec)]
        job = self._spawn(identity, message.id, spec, len(names))
        self._reply(identity, message, "bench.start.ok", {"job": job.id, "cells": names})
        self._send(
            identity,
            p.make("bench.progress", {"job": job.id, "done": 0, "total": job.total}, re=message.id),
        )

    def _check_matrix(self, matrix: dict[str, Any]) -> MatrixSpec:
        """The matrix as this agent would run it: model directories are paths on THIS machine.
        Raises MatrixError or ModelLoadError naming the problem."""
        spec = MatrixSpec.from_dict(matrix)
        directories = [m for m in spec.models if m not in BUILTIN_CONFIGS]
        for directory in directories:
            check_model_dir(Path(directory).expanduser())
        if directories:
            require_mlx_lm()
        return spec

    def _spawn(self, identity: bytes, request_id: str, spec: MatrixSpec, total: int) -> Job:
        job_id = f"j-{p.new_id()[:12]}"
        output = data_subdir("job-logs") / f"{job_id}.log"
        read_fd, write_fd = os.pipe()
        with open(output, "wb") as log_file:
            process = subprocess.Popen(
                [sys.executable, "-m", "agent.job", "--fd", str(write_fd)],
                stdin=subprocess.PIPE,
                stdout=log_file,
                stderr=log_file,
                pass_fds=(write_fd,),
                close_fds=True,
            )
        os.close(write_fd)
        assert process.stdin is not None
        thermal = {
            "source": self._source.name,
            "simulated": self._source.simulated,
            "poll_interval": self.poll_interval,
        }
        process.stdin.write(msgpack.packb({"matrix": spec.to_dict(), "thermal": thermal}))
        process.stdin.flush()
        os.set_blocking(process.stdin.fileno(), False)
        self.journal.create_job(job_id, spec.to_dict(), total)
        self.job = Job(job_id, identity, request_id, total, process, read_fd, output, now_iso())
        self._job_event(self.job, "start", detail=f"benchmark: {total} cells")
        self._feed_job()
        log.info("job %s: %d cells (pid %d)", job_id, total, process.pid)
        return self.job

    def _bench_cancel(self, identity: bytes, message: p.Message) -> None:
        job_id = message.body["job"]
        job = self.job
        if job is None or job.id != job_id:
            known = self.journal.get_job(job_id)
            if known is None:
                raise p.ProtocolError(p.UNKNOWN_JOB, f"no job {job_id!r} here", re=message.id)
            raise p.ProtocolError(
                p.NOT_RUNNING,
                f"job {job_id} is not running (it is {known['state']})",
                re=message.id,
            )
        self._cancel(job)
        self._reply(identity, message, "bench.cancel.ok", {"job": job_id})

    def _job_get(self, identity: bytes, message: p.Message) -> None:
        job_id = message.body["job"]
        offset = message.body["offset"] or 0
        found = self.journal.get_job(job_id)
        if found is None:
            raise p.ProtocolError(p.UNKNOWN_JOB, f"no job {job_id!r} here", re=message.id)
        records, size = [], 0
        for record in found["records"][offset:]:
            size += len(msgpack.packb(record))
            if records and size > JOB_PAGE_BYTES:
                break
            records.append(record)
        following = offset + len(records)
        self._reply(
            identity,
            message,
            "job.get.ok",
            {
                "job": job_id,
                "state": found["state"],
                "error": found["error"],
                "spec": found["spec"],
                "models": found["models"],
                "records": records,
                "offset": offset,
                "next": following if following < len(found["records"]) else None,
                "started": found["started"],
                "finished": found["finished"],
            },
        )

    # --- the job --------------------------------------------------------------------------------

    def _cancel(self, job: Job) -> None:
        if job.kill_at is None and job.process.poll() is None:
            job.process.send_signal(signal.SIGTERM)
            job.kill_at = time.monotonic() + CANCEL_GRACE_S

    def _enforce_cancel(self) -> None:
        job = self.job
        if job is not None and job.kill_at is not None and time.monotonic() > job.kill_at:
            log.warning("job %s ignored cancel for %.0f s: killing it", job.id, CANCEL_GRACE_S)
            job.process.kill()
            job.kill_at = float("inf")

    def _stream(self, job: Job, type_: str, body: dict[str, Any]) -> None:
        self._send(job.requester, p.make(type_, {"job": job.id, **body}, re=job.request_id))

    def _read_job(self, job: Job) -> None:
        data = os.read(job.fd, 65536)
        if not data:
            self._finish(job)
            return
        job.unpacker.feed(data)
        for item in job.unpacker:
            kind = item.get("kind")
            if kind == "model":
                self.journal.add_model(job.id, item["info"])
                self._stream(
                    job,
                    "bench.progress",
                    {"done": job.done, "total": job.total, "model": item["info"]},
                )
            elif kind == "cell":
                self.journal.add_cell(job.id, job.done, item["record"])
                self._stream(job, "bench.cell", {"index": job.done, "record": item["record"]})
                job.done += 1
            elif kind == "done":
                job.outcome = item

    def _finish(self, job: Job) -> None:
        """The child closed its end: it is done, cancelled, or dead. Say which, once."""
        os.close(job.fd)
        try:
            code = job.process.wait(timeout=CANCEL_GRACE_S)
        except subprocess.TimeoutExpired:
            job.process.kill()
            code = job.process.wait()
        if job.outcome is not None:
            status, error = job.outcome["status"], job.outcome["error"]
        elif job.kill_at is not None:
            status, error = p.JOB_CANCELLED, "cancelled (the job process was killed)"
        else:
            status, error = (
                p.JOB_FAILED,
                f"the job process died ({exit_text(code)}) after "
                f"{job.done} of {job.total} cells{last_words(job)}",
            )
        self.journal.finish_job(job.id, status, error)
        self._job_event(job, "exit", detail=status + (f": {error}" if error else ""))
        assert job.process.stdin is not None
        with contextlib.suppress(OSError):
            job.process.stdin.close()
        if job.output.stat().st_size == 0:
            job.output.unlink()  # only a job process that said something keeps its log
        self._stream(job, "bench.done", {"status": status, "error": error, "cells": job.done})
        log.info(
            "job %s %s: %d/%d cells%s",
            job.id,
            status,
            job.done,
            job.total,
            f" ({error})" if error else "",
        )
        self.job = None


def last_words(job: Job) -> str:
    """The last line the job process wrote (a traceback's verdict), and where the rest is."""
    try:
        lines = job.output.read_text(encoding="utf-8", errors="replace").strip().splitlines()
    except OSError:
        return ""
    return f": {lines[-1]} (log: {job.output})" if lines else ""


def exit_text(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def serve(
    bind: str,
    secure: bool,
    thermal_source: str = "auto",
    *,
    poll_interval: float = DEFAULT_POLL_S,
    telemetry_port: int | None = None,
    retention_days: float = DEFAULT_RETENTION_DAYS,
    prometheus: str | None = None,
) -> None:
    """Run the daemon in the foreground until SIGTERM/SIGINT (launchd wants exactly that)."""
    daemon = AgentDaemon(
        bind,
        secure,
        thermal_source,
        poll_interval=poll_interval,
        telemetry_port=telemetry_port,
        retention_days=retention_days,
        prometheus=prometheus,
    )
    signal.signal(signal.SIGTERM, daemon.stop)
    signal.signal(signal.SIGINT, daemon.stop)
    endpoint = daemon.start()
    security = f"curve-key={daemon.public_key}" if secure else "INSECURE"
    print(
        f"agent serve: listening on {endpoint} {security} telemetry={daemon.telemetry}", flush=True
    )
    daemon.serve_forever()
    log.info("stopped")
