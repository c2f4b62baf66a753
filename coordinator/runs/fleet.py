"""A fleet run: the same matrix on every host at once, every cell kept as it arrives.

Each host is driven by its own thread (coordinator.runs.driver's HostDriver, or a group's
GroupDriver); the threads only report HostEvents on a queue. The calling thread alone touches the
RunStore and the observer (the progress display), so neither needs to be thread-safe and a cell
is stored the moment it lands. A host that fails for good (refused, rejected matrix, gone past the
timeout, stuck) ends with its error; the others go on. A run whose coordinator died is finished
later by `coordinator resume`, which drives the same drivers over the jobs the run recorded.
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import zmq

from coordinator.hosts.link import Settings, Target
from coordinator.runs.driver import (
    CELL,
    DISPLAY_ONLY,
    DONE,
    HOST_FAILED,
    HOST_OK,
    HOST_RUNNING,
    HOST_UNREACHABLE,
    MACHINE,
    MODEL,
    RECONNECTED,
    STARTED,
    UNREACHABLE,
    HostDriver,
    HostEvent,
    HostJob,
    Observer,
)
from coordinator.runs.group_driver import GroupDriver, GroupTarget, Resumed
from coordinator.runs.netbench import stored_link_seconds
from coordinator.runs.store import RunStore
from shared.io.transport import CANCEL_WAIT_S


@dataclass
class FleetResult:
    run_id: str
    interrupted: bool
    hosts_ok: bool
    resumable: bool
    """Some host's job may hold cells this run lacks: `coordinator resume` can fetch them."""


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
    """Drive every target (a Target, or a group: coordinator.runs.group_driver.GroupTarget) at once
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
            links = stored_link_seconds(store, [host.name for host in target.hosts])
            driver: Any = GroupDriver(
                ctx, target, spec, settings, emit, stop, CHECK_TOKENS, after, resumed, links
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
    if event.kind in DISPLAY_ONLY:
        return
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
