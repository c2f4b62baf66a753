"""`agent serve`: the per-Mac daemon coordinators drive over ZeroMQ (docs/protocol.md).

One ROUTER socket answers every coordinator. A benchmark job runs in a child process
(`python -m agent.job`) whose records come back over a pipe; each is journaled in SQLite and
forwarded at once as bench.cell to the coordinator that asked. The loop never blocks on the job,
so ping and info are answered while it runs. One job at a time: a second bench.start gets a
`busy` error naming the running job. SIGTERM (or SIGINT) stops the job, flushes what it
finished, tells its coordinator, and exits 0.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack
import zmq
from zmq.auth.thread import ThreadAuthenticator

from agent.journal import Journal, now_iso
from agent.keys import TrustedKeys, trusted_dir
from agent.machine import machine_info, package_version
from agent.model import BUILTIN_CONFIGS
from agent.profiling.runner import ModelLoadError, check_model_dir, require_mlx_lm
from agent.thermal import SourceSpecError, SourceUnavailable, ThermalMonitor
from shared import protocol as p
from shared.keys import own_keypair
from shared.matrix import MatrixError, MatrixSpec, expand
from shared.paths import data_subdir

log = logging.getLogger("agent.serve")

DEFAULT_BIND = f"0.0.0.0:{p.DEFAULT_PORT}"
TICK_MS = 200
"""The loop wakes at least this often: how promptly SIGTERM and a stuck cancel are noticed."""
CANCEL_GRACE_S = 5.0
"""How long a cancelled job may take to finish its current cell before it is killed."""
JOB_PAGE_BYTES = p.MAX_MESSAGE_SIZE // 2
"""job.get pages hold records up to this many packed bytes, so a reply never hits the limit."""


class ServeError(ValueError):
    """The daemon cannot start: a bad --bind or --thermal-source; the message says why."""


def endpoint_for(bind: str) -> tuple[str, bool]:
    """'HOST:PORT' -> ('tcp://HOST:PORT', is_ipv6); port 0 asks for an ephemeral port."""
    host, sep, port_text = bind.strip().rpartition(":")
    if not sep or not host or not port_text.isdigit() or int(port_text) > 65535:
        raise ServeError(f"bad --bind {bind!r}: expected HOST:PORT, e.g. 0.0.0.0:{p.DEFAULT_PORT}"
                        " or 127.0.0.1:0 for any free port")
    ipv6 = host.startswith("[")
    port = "*" if int(port_text) == 0 else port_text
    return f"tcp://{host}:{port}", ipv6


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


class AgentDaemon:
    """start() binds, serve_forever() serves until stop() (safe from a signal handler)."""

    def __init__(self, bind: str = DEFAULT_BIND, secure: bool = True,
                 thermal_source: str | None = None) -> None:
        self.endpoint, self.ipv6 = endpoint_for(bind)
        self.secure = secure
        self.thermal_source = thermal_source
        self.ctx = zmq.Context()
        self.router = self.ctx.socket(zmq.ROUTER)
        self.auth: ThreadAuthenticator | None = None
        self.public_key: str | None = None
        self.journal = Journal()
        self.job: Job | None = None
        self.monitor: ThermalMonitor | None = None
        self._stopping = False
        self._machine = machine_info()
        self._version = package_version("mlx-fleet") or "unknown"

    # --- lifecycle ------------------------------------------------------------------------------

    def start(self) -> str:
        """Bind the command socket; returns the endpoint actually bound (the port resolved)."""
        try:
            self._start_thermal()
        except (SourceSpecError, SourceUnavailable) as exc:
            self.close()
            raise ServeError(f"thermal source: {exc}") from None
        self.router.ipv6 = self.ipv6
        self.router.linger = 1000
        self.router.maxmsgsize = p.MAX_MESSAGE_SIZE
        self.router.heartbeat_ivl = 2000
        self.router.heartbeat_timeout = 6000
        if self.secure:
            keypair = own_keypair()
            self.public_key = keypair.public
            self.auth = ThreadAuthenticator(self.ctx, log=logging.getLogger("agent.zap"))
            self.auth.start()
            self.auth.configure_curve_callback(domain="*",
                                               credentials_provider=TrustedKeys(trusted_dir()))
            self.router.curve_secretkey = keypair.secret.encode("ascii")
            self.router.curve_publickey = keypair.public.encode("ascii")
            self.router.curve_server = True
        try:
            self.router.bind(self.endpoint)
        except zmq.ZMQError as exc:
            self.close()
            raise ServeError(f"cannot bind {self.endpoint}: {exc}") from None
        abandoned = self.journal.abandon_running()
        if abandoned:
            log.warning("%d job(s) were running when the agent last stopped: marked failed",
                        abandoned)
        return self.router.last_endpoint.decode()

    def _start_thermal(self) -> None:
        """Poll the thermal source in the background, so info never waits on a sensor."""
        if not self.thermal_source:
            return
        self.monitor = ThermalMonitor(poll_interval=2.0, source=self.thermal_source)
        self.monitor.start()

    def stop(self, *_: object) -> None:
        """Ask the loop to end (safe from a signal handler)."""
        self._stopping = True

    def serve_forever(self) -> None:
        """Serve until stop(); then cancel the job and keep serving (pings, info) until it has
        flushed its cells and its coordinator got bench.done, or the grace time is over."""
        poller = zmq.Poller()
        poller.register(self.router, zmq.POLLIN)
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
            if events.get(self.router):
                self._drain_router()
            if job is not None and job is self.job and events.get(job.fd):
                self._read_job(job)
            self._enforce_cancel()
        self.close()

    def close(self) -> None:
        if self.monitor is not None:
            self.monitor.close()
        if self.auth is not None:
            self.auth.stop()
            self.auth = None
        self.router.close(linger=1000)
        self.ctx.term()
        self.journal.close()

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
                    raise p.ProtocolError(p.MALFORMED, f"a message is exactly one frame after "
                                          f"the identity, got {len(payload)}")
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

    def _reply(self, identity: bytes, request: p.Message, type_: str,
               body: dict[str, Any]) -> None:
        self._send(identity, p.make(type_, body, re=request.id))

    def _handle(self, identity: bytes, message: p.Message) -> None:
        handlers = {
            "hello": self._hello,
            "ping": self._ping,
            "info": self._info,
            "bench.start": self._bench_start,
            "bench.cancel": self._bench_cancel,
            "job.get": self._job_get,
        }
        handlers[message.type](identity, message)

    def _hello(self, identity: bytes, message: p.Message) -> None:
        self._reply(identity, message, "hello.ok", {
            "agent": self._version, "protocol": p.PROTOCOL_VERSION,
            "hostname": socket.gethostname(), "secure": self.secure})

    def _ping(self, identity: bytes, message: p.Message) -> None:
        self._reply(identity, message, "ping.ok",
                    {"job": self.job.id if self.job else None, "time": time.time()})

    def _info(self, identity: bytes, message: p.Message) -> None:
        job = self.job
        self._reply(identity, message, "info.ok", {
            "agent": self._version,
            "protocol": p.PROTOCOL_VERSION,
            "machine": self._machine,
            "thermal": self._thermal(),
            "job": None if job is None else {"id": job.id, "done": job.done,
                                             "total": job.total, "started": job.started},
        })

    def _thermal(self) -> dict[str, Any]:
        """The latest polled reading; source None when serving without one."""
        if self.monitor is None:
            return {"source": None, "reading": None, "error": "no thermal source selected"}
        reading = self.monitor.reading
        return {"source": self.monitor.source.name,
                "reading": reading.to_dict() if reading else None,
                "error": self.monitor.last_error}

    def _bench_start(self, identity: bytes, message: p.Message) -> None:
        if self._stopping:
            raise p.ProtocolError(p.BUSY, "busy: the agent is stopping", re=message.id)
        if self.job is not None:
            job = self.job
            raise p.ProtocolError(p.BUSY, f"busy: job {job.id} is running ({job.done}/"
                                  f"{job.total} cells); cancel it or try again later",
                                  re=message.id)
        try:
            spec = self._check_matrix(message.body["matrix"])
        except (MatrixError, ModelLoadError) as exc:
            raise p.ProtocolError(p.BAD_MATRIX, f"matrix rejected: {exc}", re=message.id) from None
        names = [cell.name for cell in expand(spec)]
        job = self._spawn(identity, message.id, spec, len(names))
        self._reply(identity, message, "bench.start.ok", {"job": job.id, "cells": names})
        self._send(identity, p.make("bench.progress", {"job": job.id, "done": 0,
                                                       "total": job.total}, re=message.id))

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
                stdin=subprocess.PIPE, stdout=log_file, stderr=log_file, pass_fds=(write_fd,),
                close_fds=True)
        os.close(write_fd)
        assert process.stdin is not None
        process.stdin.write(msgpack.packb({"matrix": spec.to_dict(),
                                           "thermal_source": self.thermal_source}))
        process.stdin.close()
        self.journal.create_job(job_id, spec.to_dict(), total)
        self.job = Job(job_id, identity, request_id, total, process, read_fd, output, now_iso())
        log.info("job %s: %d cells (pid %d)", job_id, total, process.pid)
        return self.job

    def _bench_cancel(self, identity: bytes, message: p.Message) -> None:
        job_id = message.body["job"]
        job = self.job
        if job is None or job.id != job_id:
            known = self.journal.get_job(job_id)
            if known is None:
                raise p.ProtocolError(p.UNKNOWN_JOB, f"no job {job_id!r} here", re=message.id)
            raise p.ProtocolError(p.NOT_RUNNING, f"job {job_id} is not running (it is "
                                  f"{known['state']})", re=message.id)
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
        self._reply(identity, message, "job.get.ok", {
            "job": job_id, "state": found["state"], "error": found["error"],
            "spec": found["spec"], "models": found["models"], "records": records,
            "offset": offset, "next": following if following < len(found["records"]) else None,
            "started": found["started"], "finished": found["finished"]})

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
                self._stream(job, "bench.progress", {"done": job.done, "total": job.total,
                                                     "model": item["info"]})
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
            status, error = p.JOB_FAILED, f"the job process died ({exit_text(code)}) after " \
                                          f"{job.done} of {job.total} cells{last_words(job)}"
        self.journal.finish_job(job.id, status, error)
        if job.output.stat().st_size == 0:
            job.output.unlink()  # only a job process that said something keeps its log
        self._stream(job, "bench.done", {"status": status, "error": error, "cells": job.done})
        log.info("job %s %s: %d/%d cells%s", job.id, status, job.done, job.total,
                 f" ({error})" if error else "")
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


def serve(bind: str, secure: bool, thermal_source: str | None) -> None:
    """Run the daemon in the foreground until SIGTERM/SIGINT (launchd wants exactly that)."""
    daemon = AgentDaemon(bind, secure, thermal_source)
    signal.signal(signal.SIGTERM, daemon.stop)
    signal.signal(signal.SIGINT, daemon.stop)
    endpoint = daemon.start()
    security = f"curve-key={daemon.public_key}" if secure else "INSECURE"
    print(f"agent serve: listening on {endpoint} {security}", flush=True)
    daemon.serve_forever()
    log.info("stopped")
