"""What a running benchmark job tells, as it happens: each model and cell journaled, then
streamed to the coordinator that asked (bench.progress, bench.cell, bench.done, docs/protocol.md
§5, The job stream); its start, its cooling actions and its end published as events. Its own
module because saying what happened is one thing and running the job process another
(agent.daemon.benchmark.jobs): every path a job takes (done, cancelled, crashed, restarted)
says it the same way here."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from agent.daemon.benchmark.job import Job
from agent.daemon.benchmark.journal import Journal
from agent.sensors.base import SourceInfo
from shared.wire import protocol as p
from shared.wire.telemetry import Event

log = logging.getLogger("agent.jobs")  # the name its log lines have always carried

Send = Callable[[bytes, p.Message], None]
Record = Callable[[Event, str], None]
Measured = Callable[[dict[str, Any]], None]


class JobReporter:
    """`send` reaches a coordinator; `record` publishes a job's event (agent.daemon.hub);
    `measured` hears of every cell record streamed (the hub's /metrics); `source` labels the
    events."""

    def __init__(
        self,
        journal: Journal,
        send: Send,
        record: Record,
        source: Callable[[], SourceInfo],
        measured: Measured,
    ) -> None:
        self.journal = journal
        self.send = send
        self.record = record
        self.source = source
        self.measured = measured

    def model(self, job: Job, info: dict[str, Any]) -> None:
        """A model the job process built; journaled and streamed once, not again when a new
        process builds it after a crash."""
        key = (info["model"], info["bits"])
        job.built.add(key)
        if key in job.journaled_models:
            return
        job.journaled_models.add(key)
        self.journal.add_model(job.id, info)
        self.stream(job, "bench.progress", {"done": job.done, "total": job.total, "model": info})

    def cell(self, job: Job, record: dict[str, Any]) -> None:
        self.journal.add_cell(job.id, job.done, record)
        self.stream(job, "bench.cell", {"index": job.done, "record": record})
        self.measured(record)
        job.done += 1

    def progress(self, job: Job, name: str, value: Any) -> None:
        """bench.progress with one optional field (`cooling`, or one the requester asked for)."""
        waiting = {"done": job.done, "total": job.total, "model": None}
        self.stream(job, "bench.progress", {**waiting, name: value})

    def stream(self, job: Job, type_: str, body: dict[str, Any]) -> None:
        self.send(job.requester, p.make(type_, {"job": job.id, **body}, re=job.request_id))

    def event(
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

    def finish(self, job: Job, status: str, error: str | None) -> None:
        """Say how the job ended: journaled, published, streamed (bench.done) and logged."""
        self.journal.finish_job(job.id, status, error)
        self.event(job, "exit", detail=status + (f": {error}" if error else ""))
        log_path = job.process.log
        if (
            not job.crashed
            and log_path is not None
            and log_path.exists()
            and log_path.stat().st_size == 0
        ):
            log_path.unlink()  # only a job that said something, or lost a process, keeps its log
        self.stream(job, "bench.done", {"status": status, "error": error, "cells": job.done})
        log.info(
            "job %s %s: %d/%d cells%s",
            job.id,
            status,
            job.done,
            job.total,
            f" ({error})" if error else "",
        )
