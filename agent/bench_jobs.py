"""The daemon's benchmark jobs (docs/protocol.md §5, The job stream and Jobs): one at a time, each
in a child process (`python -m agent.job`) whose records come back over a pipe; every model and
cell is journaled in SQLite and streamed at once to the coordinator that asked.

Only the daemon's main thread uses this; the loop polls `running.fd` and calls read().
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack

from agent.journal import Journal
from agent.model import BUILTIN_CONFIGS
from agent.profiling.runner import ModelLoadError, check_model_dir, require_mlx_lm
from agent.telemetry import SourceInfo, reading_wire
from agent.thermal import ThermalReading
from shared import protocol as p
from shared.clock import now_iso
from shared.io.paths import data_subdir
from shared.matrix import MatrixError, MatrixSpec, expand
from shared.policy import ThermalPolicy
from shared.telemetry import Event

log = logging.getLogger("agent.jobs")

CANCEL_GRACE_S = 5.0
"""How long a cancelled job may take to finish its current cell before it is killed."""
JOB_PAGE_BYTES = p.MAX_MESSAGE_SIZE // 2
"""job.get and history.get pages hold up to this many packed bytes: a reply never hits the limit."""

Send = Callable[[bytes, p.Message], None]
Record = Callable[[Event, str], None]


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

    def summary(self) -> dict[str, Any]:
        """info.ok's `job`."""
        return {"id": self.id, "done": self.done, "total": self.total, "started": self.started}


class BenchJobs:
    """`send` reaches a coordinator; `record` publishes a job's event (agent.hub)."""

    def __init__(self, send: Send, record: Record, source: Callable[[], SourceInfo]) -> None:
        self.send = send
        self.record = record
        self.source = source
        self.journal = Journal()
        self.running: Job | None = None

    def recover(self) -> None:
        """Jobs a previous daemon left running did not finish: the journal says so."""
        abandoned = self.journal.abandon_running()
        if abandoned:
            log.warning(
                "%d job(s) were running when the agent last stopped: marked failed", abandoned
            )

    def close(self) -> None:
        self.journal.close()

    # --- requests -------------------------------------------------------------------------------

    def start(
        self, identity: bytes, request: p.Message, poll_interval: float
    ) -> tuple[Job, list[str]]:
        """A new job for `request` (a bench.start), and its cell names. ProtocolError `busy`
        while one runs, `bad-matrix` for a matrix this agent cannot run."""
        if self.running is not None:
            job = self.running
            raise p.ProtocolError(
                p.BUSY,
                f"busy: job {job.id} is running ({job.done}/{job.total} cells); cancel it or "
                "try again later",
                re=request.id,
            )
        try:
            spec = check_matrix(request.body["matrix"])
        except (MatrixError, ModelLoadError) as exc:
            raise p.ProtocolError(p.BAD_MATRIX, f"matrix rejected: {exc}", re=request.id) from None
        names = [cell.name for cell in expand(spec)]
        return self._spawn(identity, request.id, spec, len(names), poll_interval), names

    def cancel_by_id(self, job_id: str, request: p.Message) -> None:
        """bench.cancel: ProtocolError `unknown-job` or `not-running` when it cannot be."""
        job = self.running
        if job is None or job.id != job_id:
            known = self.journal.get_job(job_id)
            if known is None:
                raise p.ProtocolError(p.UNKNOWN_JOB, f"no job {job_id!r} here", re=request.id)
            state = known["state"]
            raise p.ProtocolError(
                p.NOT_RUNNING, f"job {job_id} is not running (it is {state})", re=request.id
            )
        self.cancel(job)

    def page(self, job_id: str, offset: int, request: p.Message) -> dict[str, Any]:
        """job.get.ok's body: the journaled job with a page of its records from `offset`."""
        found = self.journal.get_job(job_id)
        if found is None:
            raise p.ProtocolError(p.UNKNOWN_JOB, f"no job {job_id!r} here", re=request.id)
        records, size = [], 0
        for record in found["records"][offset:]:
            size += len(msgpack.packb(record))
            if records and size > JOB_PAGE_BYTES:
                break
            records.append(record)
        following = offset + len(records)
        return {
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
        }

    # --- the job process ------------------------------------------------------------------------

    def _spawn(
        self, identity: bytes, request_id: str, spec: MatrixSpec, total: int, poll_interval: float
    ) -> Job:
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
        source = self.source()
        thermal = {
            "source": source.name,
            "simulated": source.simulated,
            "poll_interval": poll_interval,
        }
        process.stdin.write(msgpack.packb({"matrix": spec.to_dict(), "thermal": thermal}))
        process.stdin.flush()
        os.set_blocking(process.stdin.fileno(), False)
        self.journal.create_job(job_id, spec.to_dict(), total, request_id)
        self.running = Job(job_id, identity, request_id, total, process, read_fd, output, now_iso())
        self._event(self.running, "start", detail=f"benchmark: {total} cells")
        log.info("job %s: %d cells (pid %d)", job_id, total, process.pid)
        return self.running

    def feed(self, reading: ThermalReading | None, policy: ThermalPolicy) -> None:
        """One of the daemon's polls (None: no reading) and the policy in force, to the job
        process, whose cooling gate decides on it (docs/protocol.md §13)."""
        self._send_job({"reading": reading_wire(reading), "policy": policy.to_dict()})

    def feed_policy(self, policy: ThermalPolicy) -> None:
        """A new policy, for the job's gate to judge its next polls by."""
        self._send_job({"policy": policy.to_dict()})

    def _send_job(self, update: dict[str, Any]) -> None:
        """Never blocks: an update the pipe has no room for (a job process that stopped
        reading it) is dropped."""
        job = self.running
        if job is None or job.process.stdin is None:
            return
        with contextlib.suppress(BlockingIOError, BrokenPipeError):
            os.write(job.process.stdin.fileno(), msgpack.packb(update))

    def cancel(self, job: Job) -> None:
        if job.kill_at is None and job.process.poll() is None:
            job.process.send_signal(signal.SIGTERM)
            job.kill_at = time.monotonic() + CANCEL_GRACE_S

    def enforce_cancel(self) -> None:
        """Kill a cancelled job that outlived its grace."""
        job = self.running
        if job is not None and job.kill_at is not None and time.monotonic() > job.kill_at:
            log.warning("job %s ignored cancel for %.0f s: killing it", job.id, CANCEL_GRACE_S)
            job.process.kill()
            job.kill_at = float("inf")

    def read(self, job: Job) -> None:
        """What the job process wrote since the last read: journal and stream each item."""
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
            elif kind == "event":  # the job's gate acted: its pauses as the job lives them
                self._event(job, item["action"], item["celsius"], item["detail"], at=item["time"])
            elif kind == "done":
                job.outcome = item

    def _stream(self, job: Job, type_: str, body: dict[str, Any]) -> None:
        self.send(job.requester, p.make(type_, {"job": job.id, **body}, re=job.request_id))

    def _event(
        self,
        job: Job,
        action: str,
        celsius: float | None = None,
        detail: str | None = None,
        at: float | None = None,
    ) -> None:
        source = self.source()
        event = Event(
            time=time.time() if at is None else at,
            job=job.id,
            pid=job.process.pid,
            action=action,
            source=source.name,
            simulated=source.simulated,
            celsius=celsius,
            detail=detail,
        )
        self.record(event, p.KIND_BENCH)

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
        self._event(job, "exit", detail=status + (f": {error}" if error else ""))
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
        self.running = None


def check_matrix(matrix: dict[str, Any]) -> MatrixSpec:
    """The matrix as this agent would run it: model directories are paths on THIS machine.
    Raises MatrixError or ModelLoadError naming the problem."""
    spec = MatrixSpec.from_dict(matrix)
    directories = [m for m in spec.models if m not in BUILTIN_CONFIGS]
    for directory in directories:
        check_model_dir(Path(directory).expanduser())
    if directories:
        require_mlx_lm()
    return spec


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
