"""The daemon's benchmark jobs (docs/protocol.md §5, The job stream and Jobs): one at a time, each
in a child process (`python -m agent.daemon.benchmark.child`, agent.daemon.benchmark.process) whose
records come back over a pipe; every model and cell is journaled and streamed at once to the
coordinator that asked.

A job process that dies mid-job (a signal, an exit code) fails the cell it was measuring, named
with how it died and its last lines, and a new process runs the cells left: one cell that
crashes (out of memory, say) never costs the others. A rank of a group (bench.start's `group`)
is the exception: a new process cannot rejoin the ring its peers hold, so its job fails.

Only the daemon's main thread uses this; the loop polls `running.fd` and calls read(). A request
is checked in plan.py, a job process started in launch.py, and what the job did is said in
reporter.py.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import msgpack

from agent.daemon.benchmark.deadline import Deadline, job_bound
from agent.daemon.benchmark.job import Job
from agent.daemon.benchmark.journal import Journal
from agent.daemon.benchmark.launch import JobLauncher
from agent.daemon.benchmark.plan import JobPlan, JobPlanner
from agent.daemon.benchmark.process import exit_text
from agent.daemon.benchmark.reporter import JobReporter, Measured, Record, Send
from agent.daemon.storage import StorageHealth
from agent.power.meter import EnergyMeter
from agent.profiling.settings import mark_injected
from agent.sensors.base import SourceInfo
from agent.thermal import ThermalReading
from agent.thermal.base import reading_wire
from shared.benchmark import faults, gpu_errors
from shared.benchmark.matrix import Cell
from shared.benchmark.results import cell_record
from shared.clock import now_iso
from shared.cooling.policy import ThermalPolicy
from shared.wire import protocol as p

log = logging.getLogger("agent.jobs")

CANCEL_GRACE_S = 5.0
"""How long a cancelled job may take to finish its current cell before it is killed."""
PAGE_ROOM = 1024
"""Bytes a job.get.ok page keeps free for its envelope (v, id, type, re) and list headers."""


class BenchJobs:
    """The one job this agent runs at a time: started from a checked plan (JobPlanner), fed
    the daemon's readings and policy, read as its process writes (JobReporter says what it did),
    cancelled, and carried on in a new process (JobLauncher) after a crash.

    `send` reaches a coordinator; `record` publishes a job's event (agent.daemon.hub);
    `measured` hears of every cell record streamed (the hub's /metrics); `storage` hears of
    every write the disk refuses."""

    def __init__(
        self,
        send: Send,
        record: Record,
        source: Callable[[], SourceInfo],
        storage: StorageHealth,
        poll_interval: float,
        meter: Callable[[], EnergyMeter | None] = lambda: None,
        measured: Measured = lambda record: None,
    ) -> None:
        """Opens the journal: raises StoreError or OSError when it cannot be. `meter` is the
        daemon's power meter: each job process opens the same source for its cells' energy."""
        self.meter = meter
        self.journal = Journal(storage=storage)
        self.planner = JobPlanner(meter, poll_interval)
        self.launcher = JobLauncher(source, meter, poll_interval, storage)
        self.reporter = JobReporter(self.journal, send, record, source, measured)
        self.running: Job | None = None
        self.heard_at = time.monotonic()
        """When the agent last heard a request: a coordinator is there (group_stalled)."""

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

    def plan(self, request: p.Message, busy_ok: bool = False) -> JobPlan:
        """What `request` (a bench.start or bench.check) would run, starting nothing.
        ProtocolError `busy` while a job runs (unless `busy_ok`: a check), and the planner's
        (JobPlanner.plan) for a request this agent cannot run."""
        if self.running is not None and not busy_ok:
            job = self.running
            raise p.ProtocolError(
                p.BUSY,
                f"busy: job {job.id} is running ({job.done}/{job.total} cells); cancel it or "
                "try again later",
                re=request.id,
            )
        return self.planner.plan(request)

    def start(self, identity: bytes, request_id: str, plan: JobPlan) -> Job:
        """Run `plan` (from plan(), with nothing started since) for the coordinator at
        `identity`. Raises OSError when no job process can be started."""
        process = self.launcher.launch(plan, 0)
        job = Job(plan, identity, request_id, process, now_iso())
        self.journal.create_job(plan.id, plan.spec.to_dict(), len(plan.cells), request_id)
        meter = self.meter()
        baseline = meter.baseline_s if meter is not None and meter.present else 0.0
        job.deadline = Deadline.starting_now(
            job_bound(plan.spec, len(plan.cells), plan.sustain, baseline)
        )
        self.running = job
        self.reporter.event(job, "start", detail=f"benchmark: {job.total} cells")
        log.info("job %s: %d cells (pid %d)", job.id, job.total, process.pid)
        return job

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
        return job_page(found, offset)

    # --- the job process ------------------------------------------------------------------------

    def feed(
        self,
        reading: ThermalReading | None,
        policy: ThermalPolicy,
        clock: dict[str, Any] | None = None,
    ) -> None:
        """One of the daemon's polls (None: no reading) and the policy in force, to the job
        process, whose cooling gate decides on it, and the GPU clock of the poll when the agent
        read one, for its cells' records (docs/protocol.md §13)."""
        if self.running is not None:
            update = {"reading": reading_wire(reading), "policy": policy.to_dict()}
            self.running.process.send(update if clock is None else update | {"clock": clock})

    def feed_policy(self, policy: ThermalPolicy) -> None:
        """A new policy, for the job's gate to judge its next polls by."""
        if self.running is not None:
            self.running.process.send({"policy": policy.to_dict()})

    def cancel(self, job: Job) -> None:
        if job.kill_at is None:
            job.process.terminate()
            job.kill_at = time.monotonic() + CANCEL_GRACE_S

    def heard(self) -> None:
        """A request came in (any: a coordinator following a job pings it or asks job.get)."""
        self.heard_at = time.monotonic()

    def enforce_cancel(self) -> None:
        """Cancel a job past its own bound, or a group's rank stalled with no coordinator to
        cancel it (group_stalled); kill a cancelled job that outlived its grace."""
        job = self.running
        if job is not None and job.kill_at is None:
            why = None
            if job.deadline is not None and job.deadline.passed():
                why = job.deadline.reason()
            elif job.plan.group is not None:
                why = group_stalled(job.plan.group.stall_s, job.active_at, self.heard_at)
            if why is not None:
                job.overran = why
                log.warning("job %s %s", job.id, job.overran)
                self.cancel(job)
        if job is not None and job.kill_at is not None and time.monotonic() > job.kill_at:
            log.warning("job %s ignored cancel for %.0f s: killing it", job.id, CANCEL_GRACE_S)
            job.process.kill()
            job.kill_at = float("inf")

    def retry_writes(self) -> None:
        self.journal.retry()

    def read(self, job: Job) -> None:
        """What the job process wrote since the last read: journal and stream each item."""
        items = job.process.read()
        if items is None:
            self._ended(job)
            return
        job.active_at = time.monotonic()
        for item in items:
            kind = item.get("kind")
            if kind == "model":
                self.reporter.model(job, item["info"])
            elif kind == "begin":
                job.begun = item["index"]
            elif kind == "cell":
                self.reporter.cell(job, item["record"])
            elif kind == "cooling":  # progress too: a cell waiting to start cool is not stuck
                self.reporter.progress(job, "cooling", item["wait"])
            elif kind in job.plan.takes:  # "pause", "phase": progress its requester asked for
                self.reporter.progress(job, kind, item[kind])
            elif kind == "event":  # the job's gate acted: its pauses as the job lives them
                self.reporter.event(
                    job, item["action"], item["celsius"], item["detail"], at=item["time"]
                )
            elif kind == "done":
                job.outcome = item

    def _ended(self, job: Job) -> None:
        """The process closed its end: the job is done or cancelled; or the process died, and
        the cells left go to a new one."""
        code = job.process.reap(CANCEL_GRACE_S)
        if job.overran is not None:
            self._finish(job, p.JOB_CANCELLED, job.overran)
        elif job.outcome is not None:
            self._finish(job, job.outcome["status"], job.outcome["error"])
        elif job.kill_at is not None:
            self._finish(job, p.JOB_CANCELLED, "cancelled (the job process was killed)")
        elif job.done >= job.total:
            log.warning("job %s: its process died (%s) after its last cell", job.id, code)
            self._finish(job, p.JOB_OK, None)
        else:
            self._crashed(job, code)

    def _crashed(self, job: Job, code: int) -> None:
        """Fail what the dead process was doing (the cell it measured; or, when it died building
        a model, that model's cells), then run the cells left in a new process."""
        died = f"the job process died ({exit_text(code)})"
        job.crashed = True
        said = job.process.last_lines()
        failed = crashed_cells(job.cells[job.done :], job.begun == job.done, job.built, died, said)
        gpu = job.process.gpu_error()
        if gpu is not None and len(failed) == 1:  # Metal aborted the cell it measured
            failed = [gpu_failed(job.cells[job.done], job.done, *gpu)]
        log.warning("job %s: %s; %d cell(s) failed", job.id, died, len(failed))
        for record in failed:
            self.reporter.cell(job, record)
        if job.done >= job.total:
            self._finish(job, p.JOB_OK, None)
            return
        if job.plan.group is not None:
            rank = job.plan.group.rank
            self._finish(job, p.JOB_FAILED, f"{died}: rank {rank} cannot rejoin its group")
            return
        try:
            job.process = self.launcher.launch(job.plan, job.done)
        except OSError as exc:
            self._finish(job, p.JOB_FAILED, f"{died}; no new job process: {exc}")
            return
        job.begun, job.built = None, set()
        self.reporter.event(
            job,
            "start",
            detail=f"benchmark: {job.total - job.done} cells left, in a new job process "
            f"after {exit_text(code)}",
        )

    def _finish(self, job: Job, status: str, error: str | None) -> None:
        """Say how the job ended, once; no job runs after."""
        self.reporter.finish(job, status, error)
        self.running = None


def group_stalled(
    limit_s: float, active_at: float, heard_at: float, now: float | None = None
) -> str | None:
    """Why a group's rank is ended by its own agent, or None. A rank blocked in a collective
    waits for as long as its peer does not answer: for ever when the cable to it was cut (no
    reset ever comes), and the same cut keeps the coordinator from cancelling it. So a rank that
    has written nothing for `limit_s` while the agent has heard no request for as long is ended
    here. A coordinator still asking means the group is watched: a long load, a peer's cooling
    pause, a long cell are its to judge (it cancels the group when a member fails)."""
    now = time.monotonic() if now is None else now
    quiet = now - max(active_at, heard_at)
    if quiet <= limit_s:
        return None
    return (
        f"no progress with its group and no request from a coordinator for {quiet:.0f} s "
        f"(limit {limit_s:g} s): a peer or the link to it is gone"
    )


def crashed_cells(
    left: list[Cell], begun: bool, built: set[tuple[str, int | None]], died: str, said: str
) -> list[dict[str, Any]]:
    """The records of what a dead job process was doing, from the cells it `left`: the first,
    when it had `begun` it or had `built` its model; else (it died building that model) every
    cell of that model. Their error has one form (docs/protocol.md §5, The job stream):
    `DIED while measuring this cell: SAID` (or `while building its model`), SAID what the
    process wrote and where its log is (process.output_said)."""
    cell = left[0]
    group = (cell.model, cell.bits)
    if begun or group in built:
        return [cell_record(cell, error=f"{died} while measuring this cell: {said}")]
    return [
        cell_record(c, error=f"{died} while building its model: {said}")
        for c in left
        if (c.model, c.bits) == group
    ]


def gpu_failed(cell: Cell, index: int, kind: str, line: str) -> dict[str, Any]:
    """The record of a cell whose job process Metal aborted: error `gpu-error: KIND: LINE`
    (shared.benchmark.gpu_errors), marked injected when MLX_FLEET_INJECT put the error there."""
    record = cell_record(cell, error=gpu_errors.error_text(kind, line))
    try:
        injected = "gpu-error" in faults.for_cell(faults.from_environ(), index + 1)
    except ValueError:
        injected = False
    mark_injected(record, ["gpu-error"] if injected else [])
    return record


def job_page(found: dict[str, Any], offset: int) -> dict[str, Any]:
    """job.get.ok's body: the journaled job (Journal.get_job) with as many of its records from
    `offset` as fit in one message beside everything else it echoes (the spec, the models)."""
    page: dict[str, Any] = {
        "job": found["job"],
        "state": found["state"],
        "error": found["error"],
        "spec": found["spec"],
        "models": found["models"],
        "records": [],
        "offset": offset,
        "next": None,
        "started": found["started"],
        "finished": found["finished"],
    }
    budget = p.MAX_ENVELOPE_SIZE - PAGE_ROOM - len(msgpack.packb(page))
    size = 0
    for record in found["records"][offset:]:
        size += len(msgpack.packb(record))
        if page["records"] and size > budget:
            break
        page["records"].append(record)
    following = offset + len(page["records"])
    if following < len(found["records"]):
        page["next"] = following
    return page
