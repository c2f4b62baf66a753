"""A fleet run: the same matrix on every host at once, every cell kept as it arrives.

Each host is driven by its own thread (a HostDriver with its own AgentClient); the threads only
report HostEvents on a queue. The calling thread alone touches the RunStore and the observer (the
progress display), so neither needs to be thread-safe and a cell is stored the moment it lands.

A host that goes silent is `unreachable`, not failed, while its job may still run: its driver
reconnects until --host-timeout, then follows the job with job.get from the first cell it lacks,
so a link cut loses nothing. A stream lost while the host still answers (ZeroMQ reconnected the
DEALER by itself, a gap in the cells, a ping.ok naming no job) is followed the same way, on the
same connection. Cells are keyed by (job, index): never twice, never lost. A job that makes no
progress for longer than shared.benchmark.progress allows fails its host unless the agent lists it
paused. A host that fails for good (refused, rejected matrix, gone past the timeout, stuck)
ends with its error; the others go on. A run whose coordinator died is finished later by
`coordinator resume`, which drives the same HostDrivers over the jobs the run recorded.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

import zmq

from coordinator.store import RunStore
from shared.benchmark.matrix import Cell, MatrixError, MatrixSpec, expand, planned_cells
from shared.benchmark.progress import ProgressClock, cell_work
from shared.benchmark.verdict import judge
from shared.io.keys import Keypair
from shared.io.transport import (
    CANCEL_WAIT_S,
    UNKNOWN_VERSION,
    AgentClient,
    AgentError,
    HostError,
    InvalidMessage,
    StreamLost,
    resolve_error,
)
from shared.shapes import Invalid
from shared.stats import MIN_AUTO_REPETITIONS
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
PROGRESS_WANTED = ["pause", "phase"]
"""bench.progress's optional fields bench.start asks for (`progress`): an agent sends them only
when asked, so a coordinator that predates them never gets one."""
DEFAULT_HOST_TIMEOUT_S = 120.0
"""How long a silent host is given to come back before it is failed (its job may still run)."""
RETRY_S = 1.0
"""Between two attempts to reach a silent host."""
FOLLOW_EVERY_S = 0.5
"""How often a job followed by job.get (after a link cut, or resumed) is asked for news."""


class JobStuck(HostError):
    """The host answers but its job made no progress past the allowance: waiting longer, or
    reconnecting, changes nothing."""


@dataclass(frozen=True)
class Target:
    """A host to drive: `name` labels it in reports, `address` (HOST:PORT) reaches it."""

    name: str
    address: str
    server_key: str | None
    ips: tuple[str, ...] = ()
    """Where a distributed job's peers reach it (a hostfile's mlx.launch `ips`); empty: the
    address's host."""
    rdma: tuple[str | None, ...] | None = None
    """Its RDMA device towards each host (mlx.launch's `rdma`), for JACCL; None: none given."""


@dataclass(frozen=True)
class Settings:
    """How to reach agents: `keypair` None means no CURVE (agents run --insecure)."""

    keypair: Keypair | None
    connect_timeout: float = 5.0
    host_timeout: float = DEFAULT_HOST_TIMEOUT_S


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


@dataclass
class FleetResult:
    run_id: str
    interrupted: bool
    hosts_ok: bool
    resumable: bool
    """Some host's job may hold cells this run lacks: `coordinator resume` can fetch them."""


Observer = Callable[[HostEvent], None]


def connect(
    ctx: zmq.Context, target: Target, settings: Settings, stop: threading.Event | None = None
) -> AgentClient:
    """A client whose hello the agent answered; HostError says why there is none (a name DNS
    cannot resolve first: no key is worth adding for a mistyped host). Setting `stop` (Ctrl-C)
    ends a connect under way at once."""
    unresolved = resolve_error(target.address)
    if unresolved is not None:
        raise HostError(unresolved)
    if settings.keypair is not None and target.server_key is None:
        raise HostError(
            f"no server key known for {target.address}: run `agent keys show` "
            f"there, then `coordinator keys add {target.address} KEY` (or give "
            "the key in the hostfile)"
        )
    server_key = target.server_key if settings.keypair is not None else None
    client = AgentClient(
        ctx, target.address, server_key, settings.keypair, settings.connect_timeout, stop
    )
    try:
        client.connect()
    except BaseException:
        client.close()
        raise
    return client


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
        self._clock: ProgressClock | None = None
        """The job's progress, from its bench.start (or the first job.get page when followed)."""
        self._paused = False
        """The agent listed the job paused when last asked: ask again at every job.get."""
        self._plan = _plan_of(spec)
        """The cells `spec` plans, to size the next one; None when it cannot be expanded."""

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
        self._clock = self._new_clock()
        try:
            for message in client.stream(start, self.stop, self._check_stream):
                body = message.body
                if message.type == "bench.start.ok":
                    self._started(body["job"], body["cells"])
                elif message.type == "bench.progress":
                    if body["model"] is not None:
                        self.job.models += 1
                        self._report(MODEL, body["model"])
                    if body.get("cooling") is not None:
                        self._report(COOLING, body["cooling"])
                    if body.get("phase") is not None:
                        self._report(PHASE, body["phase"])
                    if body.get("pause") is not None:  # each report of a pause is progress
                        self._report(PAUSE, body["pause"])
                    self._progressed([])
                elif message.type == "bench.cell":
                    if self._cell(body["index"], body["record"]):
                        self._progressed([body["index"]])
                elif message.type == "bench.done":
                    return _outcome(body["status"], body["error"])
        except StreamLost:
            return None
        raise HostError("the job stream ended without bench.done")

    def _started(self, job_id: str, cells: list[str]) -> None:
        self.job.id, self.job.cells = job_id, cells
        if self._plan is not None and len(self._plan) != len(cells):
            self._plan = None  # not the job the spec plans: its cells' sizes are unknown
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

    # --- the no-progress bound (shared.benchmark.progress)
    # ------------------------------------------

    def _new_clock(self) -> ProgressClock:
        waits = [self.spec.get("delay_s"), self.spec.get("cool_start_s")]
        waits.append((self.sustain or {}).get("duration_s"))
        planned = sum(w for w in waits if _is_number(w))
        return ProgressClock(
            self.settings.host_timeout,
            time.monotonic(),
            planned_s=float(planned),
            sustained=self.sustain is not None,
            spread=self._repetition_spread(),
        )

    def _repetition_spread(self) -> float:
        """ProgressClock's spread: under `-r auto` (a precision) a cell runs from
        MIN_AUTO_REPETITIONS to `iterations` timed iterations."""
        most = self.spec.get("iterations")
        if self.spec.get("precision") is None or not _is_number(most):
            return 1.0
        return max(1.0, most / MIN_AUTO_REPETITIONS)

    def _size(self, index: int) -> tuple[Hashable, float]:
        """The model (its key) and the work of cell `index`, as far as the plan tells."""
        if self._plan is None or index >= len(self._plan):
            return None, 1.0
        cell = self._plan[index]
        return (cell.model, cell.bits), cell_work(
            cell.n_prompt, cell.n_gen, cell.n_depth, cell.batch_size
        )

    def _progressed(self, indexes: list[int]) -> None:
        assert self._clock is not None
        self._clock.progressed(time.monotonic(), [self._size(i) for i in indexes])

    def _idle(self) -> float | None:
        """Seconds without progress, once past the allowance for the next cell."""
        assert self._clock is not None
        return self._clock.overdue(time.monotonic(), *self._size(self.job.first_missing()))

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
        assert self._clock is not None and self.job.id is not None
        info = client.fetch("info")
        self._paused = any(
            j["job"] == self.job.id and j["state"] == p.SUPERVISED_PAUSED for j in info["jobs"]
        )
        if self._paused:
            self._clock.progressed(time.monotonic())
            return
        idle = self._idle()
        if idle is None:
            return
        allowed = self._clock.allowance(*self._size(self.job.first_missing()))
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
        if self._clock is None:
            self._clock = self._new_clock()
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
                self._progressed(new)
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


def _plan_of(spec: dict[str, Any]) -> list[Cell] | None:
    """The cells a spec plans (a stored one's too), or None when it plans none we can tell."""
    try:
        return planned_cells(spec)
    except (MatrixError, TypeError, KeyError, AttributeError):
        return None


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _outcome(state: str, error: str | None) -> tuple[str, str | None]:
    return (HOST_OK, None) if state == p.JOB_OK else (HOST_FAILED, error or state)


@dataclass
class _HostState:
    machine: dict[str, Any] | None = None
    models: list[dict[str, Any]] = field(default_factory=list)
    job: str | None = None
    done: bool = False
    status: str = HOST_RUNNING


CHECK_TOKENS = 8
"""Greedy tokens every host decodes per model when a run has a group: the group's against a
member's alone is its correctness check (shared.reports.group_cells.tokens_check)."""


def run_fleet(
    targets: list[Any],
    spec: dict[str, Any],
    store: RunStore,
    settings: Settings,
    observer: Observer | None = None,
    sustain: dict[str, Any] | None = None,
) -> FleetResult:
    """Drive every target (a Target, or a group: coordinator.group_driver.GroupTarget) at once
    until each is done; Ctrl-C cancels the jobs, keeps what arrived and marks the run
    interrupted. With `sustain` (a SustainPlan map) every cell runs for its duration on every
    host at once. Groups are driven after the hosts listed with them (whatever their order in
    `targets`): a group waits for every host it shares to end (_sharing)."""
    targets = sorted(targets, key=lambda t: hasattr(t, "members"))  # hosts, then groups
    reach = {t.name: (t.address, t.server_key) for t in targets}
    run_id = store.create_run(spec, [t.name for t in targets], reach=reach)
    jobs = {t.name: (t, HostJob()) for t in targets}
    return _drive(run_id, jobs, spec, store, settings, observer, sustain)


def resume_fleet(
    run_id: str, store: RunStore, settings: Settings, observer: Observer | None = None
) -> FleetResult:
    """Finish a run whose coordinator stopped: follow every host's recorded job to its end and
    fetch each cell the run lacks. Hosts whose job never started cannot be resumed and say so."""
    from coordinator.group_driver import GroupTarget, Resumed  # it builds on HostDriver

    run = store.resumable(run_id)
    drivers: dict[str, tuple[Any, Any]] = {}
    for host in run.hosts:
        if host.job is None:
            continue
        if host.group is not None:  # every member's job, followed from the first cell lacking
            group, jobs = GroupTarget.from_stored(host.group)
            models = frozenset((info.get("model"), info.get("bits")) for info in host.models)
            drivers[host.name] = (group, Resumed(jobs, frozenset(host.indexes), models))
            continue
        job = HostJob(host.job, set(host.indexes), len(host.models))
        drivers[host.name] = (Target(host.name, host.address, host.server_key), job)
    store.take_over(run_id)
    return _drive(run_id, drivers, run.spec, store, settings, observer)


def _drive(
    run_id: str,
    hosts: dict[str, tuple[Any, Any]],
    spec: dict[str, Any],
    store: RunStore,
    settings: Settings,
    observer: Observer | None,
    sustain: dict[str, Any] | None = None,
) -> FleetResult:
    events: queue.Queue[HostEvent] = queue.Queue()
    stop = threading.Event()
    states = {
        name: _HostState(job=job.id, models=store.host_models(run_id, name))
        for name, (_, job) in hosts.items()
    }
    ctx = zmq.Context()
    from coordinator.group_driver import GroupDriver, GroupTarget, Resumed  # on HostDriver

    members = {
        host.address
        for target, _ in hosts.values()
        if isinstance(target, GroupTarget)
        for host in target.hosts
    }  # each decodes the tokens its groups' are held against (an agent that predates
    # check_tokens refuses it: a host in no group is never asked for it)
    ended = {name: threading.Event() for name in hosts}
    threads = []
    for name, (target, job) in hosts.items():
        emit = _telling(events.put, ended[name])
        if isinstance(target, GroupTarget):
            resumed = job if isinstance(job, Resumed) else None
            after = [] if resumed else [ended[other] for other in _sharing(hosts, name)]
            driver: Any = GroupDriver(
                ctx, target, spec, settings, emit, stop, CHECK_TOKENS, after, resumed
            )
        else:
            extra = {"check_tokens": CHECK_TOKENS} if target.address in members else None
            driver = HostDriver(ctx, target, spec, settings, emit, stop, job, sustain, extra)
        threads.append(threading.Thread(target=driver.run, name=f"host {name}", daemon=True))
    for thread in threads:
        thread.start()
    interrupted = False
    deadline: float | None = None
    while not all(state.done for state in states.values()):
        try:
            if deadline is not None and time.monotonic() > deadline:
                break  # interrupted and a host would not stop: leave it
            try:
                event = events.get(timeout=0.2)
            except queue.Empty:
                continue
            _record(store, run_id, states[event.host], event)
            if observer is not None:
                observer(event)
        except KeyboardInterrupt:
            if interrupted:
                break  # a second Ctrl-C: stop waiting for the hosts
            interrupted = True
            stop.set()
            deadline = time.monotonic() + CANCEL_WAIT_S + 2.0
    for name, state in states.items():
        if not state.done:
            state.status = HOST_FAILED
            store.set_host_info(
                run_id,
                name,
                state.machine,
                state.models,
                HOST_FAILED,
                "interrupted before the host finished",
            )
    hosts_ok = all(state.status == HOST_OK for state in states.values())
    store.finish_run(run_id, HOST_OK if hosts_ok else HOST_FAILED, interrupted=interrupted)
    ctx.destroy(linger=0)
    resumable = any(state.job is not None and state.status != HOST_OK for state in states.values())
    return FleetResult(run_id, interrupted, hosts_ok, resumable)


def _telling(emit: Observer, ended: threading.Event) -> Observer:
    """`emit`, setting `ended` once the host's DONE has gone out."""

    def emitting(event: HostEvent) -> None:
        emit(event)
        if event.kind == DONE:
            ended.set()

    return emitting


def _sharing(hosts: dict[str, tuple[Any, HostJob]], name: str) -> list[str]:
    """The targets listed before group `name` that share a host with it: it starts once they
    have ended, as an agent runs one job at a time and two would measure each other. (A
    resumed run follows jobs that exist: they need no order.)"""

    def machines(target: Any) -> set[str]:
        return {host.address for host in getattr(target, "hosts", (target,))}

    order = list(hosts)
    mine = machines(hosts[name][0])
    return [other for other in order[: order.index(name)] if machines(hosts[other][0]) & mine]


def _record(store: RunStore, run_id: str, state: _HostState, event: HostEvent) -> None:
    """One host event into the store, the moment it arrives."""
    if event.kind in (COOLING, PAUSE, PHASE, THERMAL):
        return  # the display's alone: nothing to store
    host = event.host
    if event.kind == RECONNECTED:
        state.status = HOST_RUNNING
    elif event.kind == MACHINE:
        state.machine = event.data
    elif event.kind == MODEL:
        state.models.append(event.data)
    elif event.kind == STARTED:
        state.job = event.data["job"]
        store.set_host_job(run_id, host, event.data["job"], event.data.get("group"))
    elif event.kind == CELL:
        store.add_cell(run_id, host, event.data["record"], event.data["index"])
        return
    elif event.kind == UNREACHABLE:
        state.status = HOST_UNREACHABLE
    elif event.kind == DONE:
        state.done = True
        state.status = event.data["status"]
    error = event.data.get("error") if event.kind in (UNREACHABLE, DONE) else None
    store.set_host_info(run_id, host, state.machine, state.models, state.status, error)
