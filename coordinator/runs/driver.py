"""One host of a fleet run: the HostDriver that starts (or follows) its job and reports what
happens as HostEvents, and the job as this coordinator knows it.

A host that goes silent is `unreachable`, not failed, while its job may still run: its driver
reconnects until --host-timeout, then follows the job with job.get from the first cell it lacks,
so a link cut loses nothing. A stream lost while the host still answers (ZeroMQ reconnected the
DEALER by itself, a gap in the cells, a ping.ok naming no job) is followed the same way, on the
same connection. Cells are keyed by (job, index): never twice, never lost. A job that makes no
progress (a new cell or a model built: a bench.progress that brings neither only shows what it
does) for longer than its allowance (coordinator.runs.pace) fails its host unless the agent
lists it paused.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import zmq

from coordinator.hosts.link import Settings, Target, connect
from coordinator.runs.pace import JobPace
from shared.benchmark.matrix import MatrixError, MatrixSpec, expand
from shared.benchmark.verdict import judge
from shared.io.transport import (
    UNKNOWN_VERSION,
    AgentClient,
    AgentError,
    HostError,
    InvalidMessage,
    StreamLost,
)
from shared.shapes import Invalid
from shared.wire import protocol as p

HOST_OK, HOST_FAILED, HOST_RUNNING, HOST_UNREACHABLE = "ok", "failed", "running", "unreachable"
MACHINE, STARTED, MODEL, COOLING, CELL, UNREACHABLE, RECONNECTED, DONE = (
    "machine",
    "started",
    "model",
    "cooling",
    "cell",
    "unreachable",
    "reconnected",
    "done",
)
PAUSE, PHASE, THERMAL = "pause", "phase", "thermal"
DISPLAY_ONLY = frozenset({COOLING, PAUSE, PHASE, THERMAL})
"""Events for the progress display alone: a run stores none of them."""
PROGRESS_WANTED = ["pause", "phase"]
"""bench.progress's optional fields bench.start asks for (`progress`): an agent sends them only
when asked, so a coordinator that predates them never gets one."""
RETRY_S = 1.0
"""Between two attempts to reach a silent host."""
FOLLOW_EVERY_S = 0.5
"""How often a job followed by job.get (after a link cut, or resumed) is asked for news."""


class JobStuck(HostError):
    """The host answers but its job made no progress past the allowance: waiting longer, or
    reconnecting, changes nothing."""


@dataclass(frozen=True)
class HostEvent:
    """What a host thread reports. `data` by kind: MACHINE the agent's machine info, STARTED {"job",
    "cells"}, MODEL a model's info, COOLING a cell's cool-start wait (shared.cooling.cool_start's
    CoolWait map), PAUSE a cooling pause (shared.benchmark.status's PauseView map), PHASE a model
    build or idle baseline starting (bench.progress's `phase`), THERMAL the agent's thermal source
    (info.ok's `thermal`), CELL {"index", "record"}, UNREACHABLE {"error"} (each attempt that
    failed), RECONNECTED {} (heard again after UNREACHABLE), DONE {"status", "error"}."""

    host: str
    kind: str
    data: dict[str, Any] = field(default_factory=dict)


@dataclass
class HostJob:
    """A host's job as this coordinator knows it: its id once the agent named it, its cells'
    names (bench.start.ok's, or the spec's on resume), the cell indexes received (with the
    records, for those received in this process), the models reported."""

    id: str | None = None
    received: set[int] = field(default_factory=set)
    models: int = 0
    cells: list[str] | None = None
    records: dict[int, dict[str, Any]] = field(default_factory=dict)

    def accept(self, index: int, record: dict[str, Any]) -> bool:
        """Whether a record is new: Invalid for one the job cannot have sent (an index past its
        cells, a name not the cell's, a second record unlike the first)."""
        if self.cells is not None:
            if index >= len(self.cells):
                raise Invalid("", f"index {index}, but the job has {len(self.cells)} cells")
            if record["name"] != self.cells[index]:
                raise Invalid(
                    "", f"cell {index} named {record['name']!r}, but it is {self.cells[index]!r}"
                )
        if index in self.received:
            first = self.records.get(index)
            if first is not None and first != record:
                raise Invalid("", f"a second record for cell {index}, unlike the first")
            return False
        self.received.add(index)
        self.records[index] = record
        return True

    def first_missing(self) -> int:
        index = 0
        while index in self.received:
            index += 1
        return index


Observer = Callable[[HostEvent], None]


class HostDriver:
    """Runs `spec` on one host (or, given a job, follows it) until the job ends, reporting
    every event through `emit`; run() always ends with exactly one DONE."""

    def __init__(
        self,
        ctx: zmq.Context,
        target: Target,
        spec: dict[str, Any],
        settings: Settings,
        emit: Callable[[HostEvent], None],
        stop: threading.Event,
        job: HostJob | None = None,
        sustain: dict[str, Any] | None = None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        self.ctx, self.target, self.spec, self.settings = ctx, target, spec, settings
        self.sustain = sustain
        """A SustainPlan map: each cell runs for its duration (bench.start's `sustain`)."""
        self.extra = extra or {}
        """More of bench.start's fields: a group member's `group` and `check_tokens`."""
        self.emit, self.stop = emit, stop
        self.job = job or HostJob()
        self._start_id: str | None = None
        """The id of the bench.start sent, to find the job by (job.list) if its reply was lost."""
        self._machine_known = False
        self._version = UNKNOWN_VERSION
        """The agent's mlx-fleet version (hello.ok), which every invalid message names."""
        self._cancelled = False
        self.pace = JobPace(spec, sustain, settings.host_timeout)
        """The job's no-progress bound, from its bench.start (or the first job.get page when
        followed)."""
        self._paused = False
        """The agent listed the job paused when last asked: ask again at every job.get."""

    def run(self) -> None:
        status, error = HOST_FAILED, None
        try:
            status, error = self._drive()
        except HostError as exc:
            error = str(exc)
        except Exception as exc:  # a bug fails one host, visibly, not the run
            error = f"coordinator error: {type(exc).__name__}: {exc}"
        self._report(DONE, {"status": status, "error": error})

    def _report(self, kind: str, data: dict[str, Any]) -> None:
        self.emit(HostEvent(self.target.name, kind, data))

    def _drive(self) -> tuple[str, str | None]:
        """Connect, start or follow; while a job exists, a lost link is retried until the host
        has been silent for host_timeout."""
        heard = time.monotonic()
        lost = False
        while True:
            client: AgentClient | None = None
            try:
                with connect(self.ctx, self.target, self.settings, self.stop) as client:
                    if lost:
                        lost = False
                        self._report(RECONNECTED, {})
                    return self._session(client)
            except (AgentError, InvalidMessage, JobStuck):
                raise  # the agent answered: nothing a retry changes
            except HostError as exc:
                if client is not None:
                    heard = max(heard, client.last_heard)
                if self.job.id is None and self._start_id is None:
                    raise  # no job was started: nothing runs there to come back to
                silent = time.monotonic() - heard
                if silent > self.settings.host_timeout or self.stop.is_set():
                    raise HostError(
                        f"unreachable for {silent:.0f} s ({exc}); its job may still run: "
                        "`coordinator resume` fetches what it measured"
                    ) from None
                lost = True
                self._report(UNREACHABLE, {"error": str(exc)})
                self.stop.wait(RETRY_S)

    def _session(self, client: AgentClient) -> tuple[str, str | None]:
        """One connection's work; every reconnection ZeroMQ makes by itself meanwhile is heard
        (watch_links), so a stream it cut is followed by job.get on the same client."""
        self._version = client.agent_version
        with client.watch_links():
            if not self._machine_known:
                info = client.fetch("info", timeout=self.settings.connect_timeout)
                self._report(MACHINE, info["machine"])
                self._report(THERMAL, info["thermal"])
                self._machine_known = True
            while True:
                if self.job.id is None and self._start_id is not None:
                    self._find_job(client)
                if self.job.id is not None:
                    return self._follow(client)
                if self.stop.is_set():
                    raise HostError("interrupted before the job started")
                outcome = self._start(client)
                if outcome is not None:
                    return outcome

    def _start(self, client: AgentClient) -> tuple[str, str | None] | None:
        """bench.start, then the job's stream as the agent sends it; None once the stream is
        lost (StreamLost) or brings no progress in time: the session then finds the job
        (job.list) if its bench.start.ok was lost, and follows it by job.get."""
        body: dict[str, Any] = {"matrix": self.spec, "progress": PROGRESS_WANTED, **self.extra}
        if self.sustain is not None:  # an agent older than sustained runs knows no such field
            body["sustain"] = self.sustain
        start = client.send("bench.start", body)
        self._start_id = start.id
        self.pace.start()
        try:
            for message in client.stream(start, self.stop, self._check_stream):
                body = message.body
                if message.type == "bench.start.ok":
                    self._started(body["job"], body["cells"])
                elif message.type == "bench.progress":
                    if body["model"] is not None:  # progress: a model built
                        self.job.models += 1
                        self._report(MODEL, body["model"])
                        self.pace.progressed()
                    if body.get("cooling") is not None:
                        self._report(COOLING, body["cooling"])
                    if body.get("phase") is not None:
                        self._report(PHASE, body["phase"])
                    if body.get("pause") is not None:  # not progress: info says if paused
                        self._paused = True
                        self._report(PAUSE, body["pause"])
                elif message.type == "bench.cell":
                    if self._cell(body["index"], body["record"]):
                        self.pace.progressed([body["index"]])
                elif message.type == "bench.done":
                    return _outcome(body["status"], body["error"])
        except StreamLost:
            return None
        raise HostError("the job stream ended without bench.done")

    def _started(self, job_id: str, cells: list[str]) -> None:
        self.job.id, self.job.cells = job_id, cells
        self.pace.job_has(len(cells))
        self._report(STARTED, {"job": job_id, "cells": cells})

    def _cell(self, index: int, record: dict[str, Any]) -> bool:
        """Whether the record was new (and reported); InvalidMessage for one the job cannot
        have sent."""
        wanted = self.spec.get("precision")
        if record.get("status") == "ok" and (wanted is not None or "precision_target" in record):
            record["precision_target"] = wanted  # the job's, so no agent loosens its noisy limit
        judge(record)  # the verdict from the record's own fields: an agent's is not trusted
        try:
            new = self.job.accept(index, record)
        except Invalid as exc:
            raise InvalidMessage(f"record: {exc}", self._version) from None
        if new:
            self._report(CELL, {"index": index, "record": record})
            return True
        return False

    def _idle(self) -> float | None:
        """Seconds without progress, once past the allowance for the next cell."""
        return self.pace.overdue(self.job.first_missing())

    def _check_stream(self) -> None:
        """On the stream, no progress in time may be a stream lost unnoticed: job.get tells."""
        idle = self._idle()
        if idle is not None:
            raise StreamLost(f"the job's stream brought no progress for {idle:.0f} s")

    def _stuck(self, client: AgentClient) -> None:
        """Past its allowance (or while last seen paused), the agent's info says whether the job
        is paused (the cooling policy): then it is not stuck, and the clock starts again from
        every answer that still says so, so the cell has its whole allowance once the pause
        ends. Otherwise a job past its allowance is JobStuck."""
        assert self.job.id is not None
        info = client.fetch("info")
        self._paused = any(
            j["job"] == self.job.id and j["state"] == p.SUPERVISED_PAUSED for j in info["jobs"]
        )
        if self._paused:
            self.pace.progressed()
            return
        idle = self._idle()
        if idle is None:
            return
        allowed = self.pace.allowance(self.job.first_missing())
        raise JobStuck(
            f"its job {self.job.id} made no progress for {idle:.0f} s (no new cell or model; "
            f"{allowed:.0f} s allowed with --host-timeout {self.settings.host_timeout:g}) and "
            "the agent does not list it paused: it looks stuck there; `coordinator cancel` "
            "stops it"
        )

    def _find_job(self, client: AgentClient) -> None:
        """The link was lost before bench.start's answer came: the agent's job list says whether
        our bench.start started a job. When it did not (the agent refused it, or never got it),
        the session sends it again, so a refusal's reason reaches the user: the agent answers
        requests in order, so a job it started would be listed by now, and none runs twice."""
        for listed in client.fetch("job.list", {})["jobs"]:
            if listed["request"] == self._start_id:
                spec = client.fetch("job.get", {"job": listed["job"], "offset": 0})["spec"]
                self._started(listed["job"], cell_names(spec))
                return
        self._start_id = None

    def _follow(self, client: AgentClient) -> tuple[str, str | None]:
        """The job through job.get pages, from the first cell this run lacks, until it ends or
        makes no progress past its allowance; a cancel asked for (Ctrl-C) is sent once."""
        assert self.job.id is not None
        if not self.pace.started:
            self.pace.start()
        while True:
            offset = self.job.first_missing()
            page = client.fetch("job.get", {"job": self.job.id, "offset": offset})
            if page["job"] != self.job.id or page["offset"] != offset:
                raise InvalidMessage(
                    f"job.get.ok: job {page['job']} from cell {page['offset']}, asked for job "
                    f"{self.job.id} from cell {offset}",
                    self._version,
                )
            built = page["models"][self.job.models :]
            for info in built:
                self.job.models += 1
                self._report(MODEL, info)
            new = [
                index
                for index, record in enumerate(page["records"], start=offset)
                if self._cell(index, record)
            ]
            if built or new:
                self.pace.progressed(new)
                self._paused = False
            if page["next"] is not None:
                continue
            if page["state"] != p.JOB_RUNNING:
                return _outcome(page["state"], page["error"])
            if self._paused or self._idle() is not None:
                self._stuck(client)
            if self.stop.is_set() and not self._cancelled:
                self._cancelled = True
                try:
                    client.request("bench.cancel", {"job": self.job.id})
                except AgentError as exc:
                    if exc.code != p.NOT_RUNNING:
                        raise
            if self.stop.is_set():
                time.sleep(FOLLOW_EVERY_S)  # cancelled: wait for the job to say it ended
            else:
                self.stop.wait(FOLLOW_EVERY_S)


def cell_names(spec: dict[str, Any]) -> list[str]:
    """The cells an agent's job spec (job.get.ok's) holds; InvalidMessage for one that is not a
    matrix."""
    try:
        return [cell.name for cell in expand(MatrixSpec.from_dict(spec))]
    except MatrixError as exc:
        raise InvalidMessage(f"job.get.ok: its spec is not a matrix: {exc}") from None


def _outcome(state: str, error: str | None) -> tuple[str, str | None]:
    return (HOST_OK, None) if state == p.JOB_OK else (HOST_FAILED, error or state)
