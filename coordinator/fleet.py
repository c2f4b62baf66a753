"""A fleet run: the same matrix on every host at once, every cell kept as it arrives.

Each host is driven by its own thread with its own AgentClient; the threads only report
HostEvents on a queue. The calling thread alone touches the RunStore and the observer (the
progress display), so neither needs to be thread-safe and a cell is stored the moment it lands.
A host that fails (unreachable, refused, dead mid-run, rejected matrix) ends with its error; the
others go on.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import zmq

from coordinator.store import RunStore
from shared.io.keys import Keypair
from shared.io.transport import CANCEL_WAIT_S, AgentClient, HostError
from shared.protocol import JOB_OK

HOST_OK, HOST_FAILED = "ok", "failed"
MACHINE, STARTED, MODEL, CELL, DONE = "machine", "started", "model", "cell", "done"


@dataclass(frozen=True)
class Target:
    """A host to drive: `name` labels it in reports, `address` (HOST:PORT) reaches it."""

    name: str
    address: str
    server_key: str | None


@dataclass(frozen=True)
class Settings:
    """How to reach agents: `keypair` None means no CURVE (agents run --insecure)."""

    keypair: Keypair | None
    connect_timeout: float = 5.0


@dataclass(frozen=True)
class HostEvent:
    """What a host thread reports. `data` by kind: MACHINE the agent's machine info, STARTED
    the bench.start.ok body, MODEL a model's info, CELL a record, DONE {"status", "error"}."""

    host: str
    kind: str
    data: dict[str, Any] = field(default_factory=dict)


@dataclass
class FleetResult:
    run_id: str
    interrupted: bool
    hosts_ok: bool


Observer = Callable[[HostEvent], None]


def connect(ctx: zmq.Context, target: Target, settings: Settings) -> AgentClient:
    """A client whose hello the agent answered; HostError says why there is none."""
    if settings.keypair is not None and target.server_key is None:
        raise HostError(
            f"no server key known for {target.address}: run `agent keys show` "
            f"there, then `coordinator keys add {target.address} KEY` (or give "
            "the key in the hostfile)"
        )
    server_key = target.server_key if settings.keypair is not None else None
    client = AgentClient(
        ctx, target.address, server_key, settings.keypair, settings.connect_timeout
    )
    try:
        client.connect()
    except BaseException:
        client.close()
        raise
    return client


def drive_host(
    ctx: zmq.Context,
    target: Target,
    spec: dict[str, Any],
    settings: Settings,
    emit: Callable[[HostEvent], None],
    stop: threading.Event,
) -> None:
    """Run `spec` on one host, emitting its events; always ends with exactly one DONE."""
    status, error = HOST_FAILED, None
    try:
        with connect(ctx, target, settings) as client:
            emit(HostEvent(target.name, MACHINE, client.request("info")["machine"]))
            if stop.is_set():
                raise HostError("interrupted before the job started")
            start = client.send("bench.start", {"matrix": spec})
            for message in client.stream(start, stop):
                body = message.body
                if message.type == "bench.start.ok":
                    emit(HostEvent(target.name, STARTED, body))
                elif message.type == "bench.progress" and body["model"] is not None:
                    emit(HostEvent(target.name, MODEL, body["model"]))
                elif message.type == "bench.cell":
                    emit(HostEvent(target.name, CELL, body["record"]))
                elif message.type == "bench.done":
                    status = HOST_OK if body["status"] == JOB_OK else HOST_FAILED
                    error = body["error"] if status == HOST_FAILED else None
    except HostError as exc:
        error = str(exc)
    except Exception as exc:  # a bug fails one host, visibly, not the run
        error = f"coordinator error: {type(exc).__name__}: {exc}"
    emit(HostEvent(target.name, DONE, {"status": status, "error": error}))


@dataclass
class _HostState:
    machine: dict[str, Any] | None = None
    models: list[dict[str, Any]] = field(default_factory=list)
    done: bool = False


def run_fleet(
    targets: list[Target],
    spec: dict[str, Any],
    store: RunStore,
    settings: Settings,
    observer: Observer | None = None,
) -> FleetResult:
    """Drive every target at once until each is done; Ctrl-C cancels the jobs, keeps what
    arrived and marks the run interrupted."""
    run_id = store.create_run(spec, [t.name for t in targets])
    events: queue.Queue[HostEvent] = queue.Queue()
    stop = threading.Event()
    states = {t.name: _HostState() for t in targets}
    ctx = zmq.Context()
    threads = [
        threading.Thread(
            target=drive_host,
            name=f"host {t.name}",
            daemon=True,
            args=(ctx, t, spec, settings, events.put, stop),
        )
        for t in targets
    ]
    for thread in threads:
        thread.start()
    interrupted, hosts_ok = False, True
    deadline: float | None = None
    while not all(state.done for state in states.values()):
        try:
            if deadline is not None and time.monotonic() > deadline:
                break  # interrupted and a host would not stop: leave it
            try:
                event = events.get(timeout=0.2)
            except queue.Empty:
                continue
            state = states[event.host]
            if event.kind in (MACHINE, MODEL):
                if event.kind == MACHINE:
                    state.machine = event.data
                else:
                    state.models.append(event.data)
                store.set_host_info(
                    run_id, event.host, state.machine, state.models, "running", None
                )
            elif event.kind == CELL:
                store.add_cell(run_id, event.host, event.data)
            elif event.kind == DONE:
                state.done = True
                hosts_ok &= event.data["status"] == HOST_OK
                store.set_host_info(
                    run_id,
                    event.host,
                    state.machine,
                    state.models,
                    event.data["status"],
                    event.data["error"],
                )
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
            hosts_ok = False
            store.set_host_info(
                run_id,
                name,
                state.machine,
                state.models,
                HOST_FAILED,
                "interrupted before the host finished",
            )
    store.finish_run(run_id, HOST_OK if hosts_ok else HOST_FAILED, interrupted=interrupted)
    ctx.destroy(linger=0)
    return FleetResult(run_id, interrupted, hosts_ok)
