"""The daemon's benchmark jobs (docs/protocol.md §5, The job stream and Jobs): one at a time, each
in a child process (`python -m agent.daemon.benchmark.child`, agent.daemon.benchmark.process) whose
records come back over a pipe; every model and cell is journaled and streamed at once to the
coordinator that asked.

A job process that dies mid-job (a signal, an exit code) fails the cell it was measuring, named
with how it died and its last lines, and a new process runs the cells left: one cell that
crashes (out of memory, say) never costs the others. A rank of a group (bench.start's `group`)
is the exception: a new process cannot rejoin the ring its peers hold, so its job fails.

Only the daemon's main thread uses this; the loop polls `running.fd` and calls read().
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack

from agent.daemon.benchmark.deadline import Deadline, job_bound, too_long
from agent.daemon.benchmark.journal import Journal
from agent.daemon.benchmark.process import JobProcess, exit_text
from agent.daemon.storage import JOB_LOGS, StorageHealth
from agent.model import BUILTIN_CONFIGS, DEFAULT_SEED
from agent.power.meter import EnergyMeter
from agent.profiling.hf_models import ModelNotFound, locate, names_a_repo, offline
from agent.profiling.model_dir import ModelLoadError, check_model_dir, require_mlx_lm
from agent.profiling.settings import config_digest, listing_digest, mark_injected
from agent.profiling.sharding import model_sharding_problem
from agent.sensors.base import SourceInfo
from agent.thermal import ThermalReading
from agent.thermal.base import reading_wire
from shared.benchmark import faults, gpu_errors
from shared.benchmark.matrix import Cell, MatrixError, MatrixSpec, expand
from shared.benchmark.results import cell_record
from shared.benchmark.sustain import WIRE_NAMES, SustainError, SustainPlan
from shared.clock import now_iso
from shared.cooling.policy import ThermalPolicy
from shared.distributed.group import MAX_CHECK_TOKENS, BenchGroup
from shared.distributed.rank_env import RankEnvError
from shared.io.paths import data_dir, data_subdir
from shared.shapes import Invalid
from shared.wire import protocol as p
from shared.wire.telemetry import Event

log = logging.getLogger("agent.jobs")

CANCEL_GRACE_S = 5.0
"""How long a cancelled job may take to finish its current cell before it is killed."""
PROGRESS_FIELDS = frozenset({"pause", "phase"})
"""bench.progress's optional fields a bench.start may ask for by name (its `progress`)."""
PAGE_ROOM = 1024
"""Bytes a job.get.ok page keeps free for its envelope (v, id, type, re) and list headers."""

Send = Callable[[bytes, p.Message], None]
Record = Callable[[Event, str], None]
Measured = Callable[[dict[str, Any]], None]


@dataclass
class Job:
    """The running job, seen from the daemon."""

    plan: JobPlan
    """What bench.start asked for: the job's id, spec, cells, and how to run them."""
    requester: bytes
    request_id: str
    process: JobProcess
    """The job process now running its cells (a new one after a crash)."""
    started: str
    done: int = 0
    begun: int | None = None
    """The index of the cell the process said it is measuring."""
    built: set[tuple[str, int | None]] = field(default_factory=set)
    """The (model, bits) the current process has built."""
    journaled_models: set[tuple[str, int | None]] = field(default_factory=set)
    outcome: dict[str, Any] | None = None
    kill_at: float | None = None
    crashed: bool = False
    """A job process died: its log is kept, even empty, as the cells' errors name it."""
    deadline: Deadline | None = None
    """The job's own bound (agent.daemon.benchmark.deadline): past it the agent cancels it."""
    overran: str | None = None
    """Why the agent cancelled it, once it ran past its deadline: the job's error."""
    active_at: float = field(default_factory=time.monotonic)
    """When its process last wrote anything (a model, a cell, a pause, a cooling wait)."""

    @property
    def id(self) -> str:
        return self.plan.id

    @property
    def spec(self) -> MatrixSpec:
        return self.plan.spec

    @property
    def cells(self) -> list[Cell]:
        return self.plan.cells

    @property
    def total(self) -> int:
        return len(self.cells)

    @property
    def fd(self) -> int:
        return self.process.fd

    def summary(self) -> dict[str, Any]:
        """info.ok's `job`."""
        return {"id": self.id, "done": self.done, "total": self.total, "started": self.started}


class BenchJobs:
    """`send` reaches a coordinator; `record` publishes a job's event (agent.daemon.hub);
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
        self.send = send
        self.record = record
        self.source = source
        self.meter = meter
        self.measured = measured
        self.storage = storage
        self.poll_interval = poll_interval
        self.journal = Journal(storage=storage)
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
        ProtocolError `busy` while a job runs (unless `busy_ok`: a check), `bad-matrix` for a
        matrix this agent cannot run (or cannot split as its `group` asks)."""
        if self.running is not None and not busy_ok:
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
        try:
            sustain = self._sustain(request.body.get("sustain"))
        except SustainError as exc:
            raise p.ProtocolError(p.BAD_MATRIX, f"sustain rejected: {exc}", re=request.id) from None
        cells = expand(spec)
        if (why := too_long(len(cells), sustain)) is not None:
            raise p.ProtocolError(p.BAD_MATRIX, f"sustain rejected: {why}", re=request.id)
        group = self._group(request)
        if group is not None:
            self._check_split(spec, group, request)
        check_tokens = request.body.get("check_tokens") or 0
        if not 0 <= check_tokens <= MAX_CHECK_TOKENS:
            raise p.ProtocolError(
                p.BAD_BODY,
                f"check_tokens is {check_tokens}, not 0 to {MAX_CHECK_TOKENS}",
                re=request.id,
            )
        wanted = request.body.get("progress") or []
        takes = frozenset(name for name in wanted if name in PROGRESS_FIELDS)  # others: newer
        return JobPlan(f"j-{p.new_id()[:12]}", spec, cells, sustain, takes, group, check_tokens)

    @staticmethod
    def _check_split(spec: MatrixSpec, group: BenchGroup, request: p.Message) -> None:
        """Every model of the matrix splits as the group asks, at every bits: `bad-matrix`
        naming the first that does not (agent.profiling.sharding)."""
        for index, model in enumerate(spec.models):
            for bits in spec.bits:
                try:
                    why = model_sharding_problem(model, bits, len(group.members), group.sharding)
                except ModelNotFound:
                    continue  # a Hugging Face id not fetched yet: its load checks it
                except Exception as exc:  # a config.json mlx-lm cannot read, and the like
                    why = f"cannot tell how it splits: {type(exc).__name__}: {exc}"
                if why is not None:
                    raise p.ProtocolError(
                        p.BAD_MATRIX,
                        f"matrix rejected: models[{index}] {model}: {why}",
                        re=request.id,
                    )

    @staticmethod
    def _group(request: p.Message) -> BenchGroup | None:
        """bench.start's `group`, checked: `bad-body` naming the field; a sustained run is
        refused for a group (its ranks would end their windows apart and part in a
        collective)."""
        raw = request.body.get("group")
        if raw is None:
            return None
        try:
            group = BenchGroup.from_wire(raw)
            group.launch()  # the ring's ports past 65535, JACCL without devices: refused now
        except Invalid as exc:
            raise p.ProtocolError(p.BAD_BODY, f"bench.start: {exc}", re=request.id) from None
        except RankEnvError as exc:
            why = f"bench.start: group: {exc}"
            raise p.ProtocolError(p.BAD_BODY, why, re=request.id) from None
        if request.body.get("sustain") is not None:
            raise p.ProtocolError(
                p.BAD_MATRIX,
                "sustain rejected: a group's cells do not run sustained",
                re=request.id,
            )
        return group

    def _sustain(self, wanted: Any) -> SustainPlan | None:
        """bench.start's `sustain` as a plan whose windows hold a new reading of this agent's
        power meter and thermal source; SustainError naming what does not."""
        if wanted is None:
            return None
        plan = SustainPlan.from_dict(wanted)
        meter = self.meter()
        if meter is not None and meter.present:
            plan.check(
                meter.info().resolution_s, f"the power meter {meter.source.name}", WIRE_NAMES
            )
        plan.check(self.poll_interval, "the agent's thermal poll", WIRE_NAMES)
        return plan

    def start(self, identity: bytes, request_id: str, plan: JobPlan) -> Job:
        """Run `plan` (from plan(), with nothing started since) for the coordinator at
        `identity`. Raises OSError when no job process can be started."""
        process = self._process(plan, 0)
        job = Job(plan, identity, request_id, process, now_iso())
        self.journal.create_job(plan.id, plan.spec.to_dict(), len(plan.cells), request_id)
        meter = self.meter()
        baseline = meter.baseline_s if meter is not None and meter.present else 0.0
        job.deadline = Deadline.starting_now(
            job_bound(plan.spec, len(plan.cells), plan.sustain, baseline)
        )
        self.running = job
        self._event(job, "start", detail=f"benchmark: {job.total} cells")
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

    def _process(self, plan: JobPlan, first: int) -> JobProcess:
        """A job process for the cells of `plan` from index `first`. Raises OSError."""
        source = self.source()
        thermal = {
            "source": source.name,
            "simulated": source.simulated,
            "poll_interval": self.poll_interval,
        }
        meter = self.meter()
        power = {
            "source": meter.source.spec if meter is not None and meter.present else "none",
            "baseline_s": meter.baseline_s if meter is not None else 0.0,
            "why": meter.last_error if meter is not None else "the agent has no power source",
        }
        request = {
            "matrix": plan.spec.to_dict(),
            "thermal": thermal,
            "power": power,
            "sustain": plan.sustain.to_dict() if plan.sustain else None,
            "first": first,
            "group": plan.group.to_wire() if plan.group else None,
            "check_tokens": plan.check_tokens,
        }
        return JobProcess.spawn(request, self._log_path(plan.id))

    def _log_path(self, job_id: str) -> Path | None:
        """Where the job's output goes; None (nowhere) when the disk refuses the folder."""
        try:
            folder = data_subdir("job-logs")
            path = folder / f"{job_id}.log"
            path.touch(mode=0o600)
        except OSError as exc:
            self.storage.failed(JOB_LOGS, data_dir(create=False) / "job-logs", exc)
            return None
        self.storage.written(JOB_LOGS)
        return path

    def feed(self, reading: ThermalReading | None, policy: ThermalPolicy) -> None:
        """One of the daemon's polls (None: no reading) and the policy in force, to the job
        process, whose cooling gate decides on it (docs/protocol.md §13)."""
        if self.running is not None:
            self.running.process.send(
                {"reading": reading_wire(reading), "policy": policy.to_dict()}
            )

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
                self._model(job, item["info"])
            elif kind == "begin":
                job.begun = item["index"]
            elif kind == "cell":
                self._cell(job, item["record"])
            elif kind == "cooling":  # progress too: a cell waiting to start cool is not stuck
                waiting = {"done": job.done, "total": job.total, "model": None}
                self._stream(job, "bench.progress", {**waiting, "cooling": item["wait"]})
            elif kind in job.plan.takes:  # "pause", "phase": progress its requester asked for
                waiting = {"done": job.done, "total": job.total, "model": None}
                self._stream(job, "bench.progress", {**waiting, kind: item[kind]})
            elif kind == "event":  # the job's gate acted: its pauses as the job lives them
                self._event(job, item["action"], item["celsius"], item["detail"], at=item["time"])
            elif kind == "done":
                job.outcome = item

    def _model(self, job: Job, info: dict[str, Any]) -> None:
        key = (info["model"], info["bits"])
        job.built.add(key)
        if key in job.journaled_models:
            return  # built again by a new process after a crash
        job.journaled_models.add(key)
        self.journal.add_model(job.id, info)
        self._stream(job, "bench.progress", {"done": job.done, "total": job.total, "model": info})

    def _cell(self, job: Job, record: dict[str, Any]) -> None:
        self.journal.add_cell(job.id, job.done, record)
        self._stream(job, "bench.cell", {"index": job.done, "record": record})
        self.measured(record)
        job.done += 1

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
            self._cell(job, record)
        if job.done >= job.total:
            self._finish(job, p.JOB_OK, None)
            return
        if job.plan.group is not None:
            rank = job.plan.group.rank
            self._finish(job, p.JOB_FAILED, f"{died}: rank {rank} cannot rejoin its group")
            return
        try:
            job.process = self._process(job.plan, job.done)
        except OSError as exc:
            self._finish(job, p.JOB_FAILED, f"{died}; no new job process: {exc}")
            return
        job.begun, job.built = None, set()
        self._event(
            job,
            "start",
            detail=f"benchmark: {job.total - job.done} cells left, in a new job process "
            f"after {exit_text(code)}",
        )

    def _finish(self, job: Job, status: str, error: str | None) -> None:
        """Say how the job ended, once."""
        self.journal.finish_job(job.id, status, error)
        self._event(job, "exit", detail=status + (f": {error}" if error else ""))
        log_path = job.process.log
        if (
            not job.crashed
            and log_path is not None
            and log_path.exists()
            and log_path.stat().st_size == 0
        ):
            log_path.unlink()  # only a job that said something, or lost a process, keeps its log
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


@dataclass(frozen=True)
class JobPlan:
    """A job about to start: its id, its spec and its cells in run order."""

    id: str
    spec: MatrixSpec
    cells: list[Cell]
    sustain: SustainPlan | None = None
    takes: frozenset[str] = frozenset()
    """bench.start's `progress`: the optional bench.progress fields it takes."""
    group: BenchGroup | None = None
    """The distributed group it is one rank of (bench.start's `group`), or None."""
    check_tokens: int = 0
    """Greedy tokens each model decodes as the correctness check (bench.start's `check_tokens`)."""


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


def check_matrix(matrix: dict[str, Any]) -> MatrixSpec:
    """The matrix as this agent would run it: the models named (a bench.start never falls back
    to the default model), model directories are paths on THIS machine, Hugging Face ids are
    resolved here (the job fetches one not cached yet; offline, one not cached is refused now).
    Raises MatrixError or ModelLoadError naming the problem, and the wire field first
    (`models[1]: ...`)."""
    if "models" not in matrix:
        raise MatrixError(
            "models: missing; name the models to run (a config such as small or full, a "
            "model directory on the agent, or a Hugging Face id ORG/NAME)"
        )
    spec = MatrixSpec.from_dict(matrix)
    directories = [(i, m) for i, m in enumerate(spec.models) if m not in BUILTIN_CONFIGS]
    if directories:
        require_mlx_lm()
    for i, directory in directories:
        try:
            check_model_on_disk(directory)
        except ModelLoadError as exc:
            raise ModelLoadError(f"models[{i}]: {exc}") from None
    return spec


def model_identity(name: str) -> str | None:
    """What names a model's weights, cheap enough for a request (bench.check): a built-in
    config's digest, a directory's listing (agent.profiling.settings.listing_digest); None for
    a Hugging Face id not fetched yet, or a directory with no weights to list."""
    if name in BUILTIN_CONFIGS:
        return config_digest(BUILTIN_CONFIGS[name](), DEFAULT_SEED)
    try:
        return listing_digest(locate(name, download=False).path)
    except (ModelNotFound, RuntimeError):  # RuntimeError: ~user for a user this Mac lacks
        return None


def check_model_on_disk(directory: str) -> None:
    """A model directory of this machine, or a Hugging Face id it can fetch (or holds, offline);
    ModelLoadError naming the problem."""
    try:
        path = Path(directory).expanduser()
    except RuntimeError as exc:  # ~user for a user this machine does not have
        raise ModelLoadError(f"model directory {directory}: {exc}") from None
    if names_a_repo(directory):
        if not offline():
            return  # the job process downloads it
        try:
            path = locate(directory, download=False).path
        except ModelNotFound as exc:
            raise ModelLoadError(str(exc)) from None
    check_model_dir(path)
