"""`coordinator netbench`'s driver: one rank of the link benchmark on every host, each started
by that host's agent (rank.start, docs/protocol.md §16), watched until rank 0 reports, and
every rank ended the moment one fails, is unreachable, no rank has progressed for longer than
--host-timeout (a cut link leaves them all blocked in a collective), or the user interrupts."""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import zmq

from coordinator.hosts.link import Settings, Target, connect
from coordinator.runs.store import RunStore
from shared.clock import utc_now
from shared.distributed.netbench import (
    Measured,
    NetbenchError,
    measured_from,
    ops_per_repetition,
    progress_step,
    stalled,
    stored_measurement,
)
from shared.distributed.rank_env import (
    JACCL,
    Member,
    RankEnvError,
    backends_of,
    chosen_backend,
    jaccl_devices,
)
from shared.distributed.rank_shapes import KIND_NETBENCH, MAX_BOUND_S
from shared.distributed.stragglers import netbench_one_way, same_link
from shared.io.transport import AgentClient, AgentError, HostError
from shared.safe_text import shown

POLL_S = 0.25
WORST_LINK_BYTES_S = 5e6
"""The link speed a rank's bound is sized for (5 MB/s). Past its bound a rank runs on while
it progresses or this coordinator asks about it (shared.distributed.netbench.past_bound), so
a slower link is never failed by it; the bound ends ranks whose coordinator is gone."""


class NetbenchFailed(Exception):
    """The run could not finish: one line naming the host and the reason."""


class BackendMissing(NetbenchFailed):
    """A host lacks the backend asked for: bad input, found before any rank starts."""


@dataclass(frozen=True)
class NetbenchPlan:
    sizes: tuple[int, ...]
    repetitions: int
    warmup: int
    port: int
    backend: str
    job: str = field(default_factory=lambda: f"n-{os.urandom(6).hex()}")

    def bound_s(self, ranks: int, host_timeout: float) -> float:
        """How long a rank may run: every size's all_sum and ping-pongs at WORST_LINK_BYTES_S,
        plus twice `host_timeout` for the ring to form (a ring that has not formed within one
        shows no progress, and this coordinator fails the run, naming the host, before any
        agent ends its rank), at least 1 s, at most the protocol's MAX_BOUND_S."""
        links = 1 if ranks == 2 else ranks
        per_repetition = sum(size * ops_per_repetition(size) for size in self.sizes)
        moved = per_repetition * (self.repetitions + self.warmup) * (2 + 2 * links)
        return min(MAX_BOUND_S, max(1.0, 2 * host_timeout + moved / WORST_LINK_BYTES_S))

    def spec(self) -> dict[str, Any]:
        return {"sizes": list(self.sizes), "repetitions": self.repetitions, "warmup": self.warmup}

    def step(self, done: int, hosts: list[str]) -> str:
        """What a rank that reports `done` units of progress is doing."""
        return progress_step(done, self.sizes, hosts, self.warmup, self.repetitions)


def member_of(target: Target) -> Member:
    """A host as its rank's peers see it: the hostfile's mlx.launch `ips` and `rdma`, else
    the address this coordinator reaches its agent at."""
    return Member(target.name, target.ips or (ring_address(target),), target.rdma or ())


def member_body(member: Member) -> dict[str, Any]:
    """rank.start's map of one member: its RDMA devices only where the hostfile gave them."""
    body: dict[str, Any] = {"name": member.name, "ips": list(member.ips)}
    if member.rdma:
        body["rdma"] = list(member.rdma)
    return body


def ring_address(target: Target) -> str:
    """The IP a host's peers reach it at: the one this coordinator reaches its agent at (the
    ring backend takes addresses, not names)."""
    host = target.address.rsplit(":", 1)[0].strip("[]")
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        pass
    try:
        return str(socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)[0][4][0])
    except OSError as exc:
        raise NetbenchFailed(f"{target.name}: cannot resolve {host}: {exc}") from None


@dataclass
class RankWatch:
    """What the coordinator knows of one host's rank."""

    target: Target
    client: AgentClient | None = None
    state: str = "starting"
    error: str | None = None
    report: Any = None
    elapsed_s: float = 0.0
    unreachable: bool = False
    progress: int | None = None
    """Units of the run its rank has done (None: its agent does not say)."""
    progress_age_s: float | None = None
    """Seconds since they last moved."""
    machine: dict[str, Any] | None = None
    """Its agent's info.ok `machine`."""


@dataclass
class NetbenchRun:
    """What a run got, however it ended: what `coordinator netbench` stores (save_run) and
    prints."""

    plan: NetbenchPlan
    watches: list[RankWatch]
    started: datetime = field(default_factory=utc_now)
    backend: str | None = None
    """The backend it ran on, once chosen."""
    found: list[Measured] = field(default_factory=list)
    """Rank 0's measurements, checked: empty unless the run finished."""
    error: str | None = None
    """The one line it failed with."""
    interrupted: bool = False

    @property
    def hosts(self) -> list[str]:
        return [watch.target.name for watch in self.watches]


def run_netbench(
    run: NetbenchRun,
    settings: Settings,
    stop: threading.Event,
    on_change: Callable[[list[RankWatch]], None] = lambda watches: None,
) -> None:
    """Run the plan over the watched hosts, filling `run` as it goes: its backend, then rank
    0's measurements, checked. NetbenchFailed naming the first host that failed (every rank
    stopped first, the line kept in run.error), BackendMissing before any rank starts when a
    host lacks the backend. KeyboardInterrupt (stop set) stops every rank too."""
    ctx = zmq.Context()
    plan, watches = run.plan, run.watches
    asking = watches[0]  # the host a connect or rank.start error is about
    try:
        available = {}
        for asking in watches:
            asking.client = connect(ctx, asking.target, settings, stop)
            info = asking.client.request("info", timeout=asking.client.connect_timeout)
            asking.machine = info["machine"]
            available[asking.target.name] = backends_of(
                info["machine"], asking.target.rdma is not None
            )
        try:
            run.backend = chosen_backend(plan.backend, available)
        except RankEnvError as exc:
            raise BackendMissing(str(exc)) from None
        members = [member_of(w.target) for w in watches]
        if run.backend == JACCL:
            try:
                jaccl_devices(members)
            except RankEnvError as exc:
                raise BackendMissing(f"--backend jaccl: {exc}") from None
        start = {
            "job": plan.job,
            "kind": KIND_NETBENCH,
            "members": [member_body(m) for m in members],
            "backend": run.backend,
            "port": plan.port,
            "spec": plan.spec(),
            "bound_s": plan.bound_s(len(members), settings.host_timeout),
        }
        for rank, asking in enumerate(watches):
            assert asking.client is not None
            asking.client.request("rank.start", {**start, "rank": rank})
            asking.state = "running"
        on_change(watches)
        while not all(watch.state == "ok" for watch in watches):
            if stop.wait(POLL_S):
                raise KeyboardInterrupt
            for watch in watches:
                follow(watch, plan.job)
            failure = first_failure(watches) or no_progress(watches, plan, settings.host_timeout)
            if failure is not None:
                raise NetbenchFailed(failure)
            on_change(watches)
        try:
            run.found = measured_from(watches[0].report, plan.sizes, run.hosts, plan.repetitions)
        except NetbenchError as exc:
            raise NetbenchFailed(f"{run.hosts[0]}: its report: {exc}") from None
    except (AgentError, HostError) as exc:
        run.error = f"{asking.target.name}: {exc}"
        stop_all(watches, plan.job, run.error)
        raise NetbenchFailed(run.error) from None
    except BackendMissing:
        raise
    except NetbenchFailed as exc:
        run.error = str(exc)
        stop_all(watches, plan.job, run.error)
        raise
    except KeyboardInterrupt:
        run.error, run.interrupted = "interrupted", True
        stop_all(watches, plan.job, run.error)
        raise
    finally:
        for watch in watches:
            if watch.client is not None:
                watch.client.close()
        ctx.destroy(linger=0)


def save_run(store: RunStore, run: NetbenchRun) -> str:
    """Keep the run, however it ended, as a run of kind netbench (coordinator.runs.report reads
    it back): what was asked and the backend chosen as its spec, each host's rank as it ended,
    each measurement as a cell of rank 0's host, the line it failed with. Returns its id."""
    plan = run.plan
    spec = {
        **plan.spec(),
        "job": plan.job,
        "port": plan.port,
        "backend_asked": plan.backend,
        "backend": run.backend,
    }
    reach = {w.target.name: (w.target.address, w.target.server_key) for w in run.watches}
    run_id = store.create_run(spec, run.hosts, KIND_NETBENCH, reach, run.started)
    for watch in run.watches:
        store.set_host_info(run_id, watch.target.name, watch.machine, [], watch.state, watch.error)
    for index, measured in enumerate(run.found):
        store.add_cell(run_id, run.hosts[0], stored_measurement(measured), index)
    status = "ok" if run.error is None else "failed"
    store.finish_run(run_id, status, run.interrupted, run.error)
    return run_id


def first_failure(watches: list[RankWatch]) -> str | None:
    """One line for the ranks that failed, None while none has: a host that cannot be asked
    first (its death is usually why its peers lost their ring), then the others."""
    failed = [watch for watch in watches if watch.state in ("failed", "stopped")]
    if not failed:
        return None
    failed.sort(key=lambda watch: not watch.unreachable)
    lines = [f"{watch.target.name}: {watch.error}" for watch in failed]
    return lines[0] + (f" (then {'; '.join(lines[1:])})" if len(lines) > 1 else "")


def progress_text(watches: list[RankWatch], plan: NetbenchPlan, elapsed_s: float) -> str:
    """The line a long run prints every few seconds: each rank's state, then the step of the
    slowest running rank (`send_recv C↔A at 1 MiB, repetition 5 of 5`), so a slow link reads
    as working, not hung (issue 42: five minutes of `A running, B running, C running`)."""
    states = ", ".join(f"{shown(w.target.name)} {w.state}" for w in watches)
    line = f"netbench {plan.job}: {states} ({elapsed_s:.0f} s)"
    moving = [w for w in watches if w.state == "running" and w.progress is not None]
    if moving:
        slowest = min(moving, key=lambda w: w.progress or 0)
        step = plan.step(slowest.progress or 0, [w.target.name for w in watches])
        line += f"; slowest {shown(slowest.target.name)}: {step}"
    return line


def no_progress(watches: list[RankWatch], plan: NetbenchPlan, host_timeout: float) -> str | None:
    """One line when no running rank has progressed for longer than `host_timeout` (a link
    cut, a Mac asleep: the ranks wait in a collective until their bound, hours away), naming
    the host whose rank the others wait on and the step it is in; None while any moves."""
    running = [w for w in watches if w.state == "running"]
    seen = [
        None if w.progress is None or w.progress_age_s is None else (w.progress, w.progress_age_s)
        for w in running
    ]
    laggard = stalled(seen, host_timeout)
    if laggard is None:
        return None
    watch = running[laggard]
    assert watch.progress is not None and watch.progress_age_s is not None
    step = plan.step(watch.progress, [w.target.name for w in watches])
    return (
        f"{watch.target.name}: no progress for {watch.progress_age_s:.0f} s, past --host-timeout "
        f"{host_timeout:g}, in {step}; no other rank moved either"
    )


def follow(watch: RankWatch, job: str) -> None:
    """The host's rank state now; a host that cannot be asked fails its rank."""
    if watch.state != "running" or watch.client is None:
        return
    try:
        got = watch.client.request("rank.get", {"job": job}, timeout=watch.client.connect_timeout)
    except (AgentError, HostError) as exc:
        watch.state, watch.error = "failed", str(exc)
        watch.unreachable = isinstance(exc, HostError) and not isinstance(exc, AgentError)
        return
    watch.state, watch.error = got["state"], got["error"]
    watch.report, watch.elapsed_s = got["report"], got["elapsed_s"]
    watch.progress, watch.progress_age_s = got.get("progress"), got.get("progress_age_s")


def stop_all(watches: list[RankWatch], job: str, why: str) -> None:
    """Ask every host whose rank may still run to end it (a host that cannot be asked ends its
    own at the rank's bound, or with its agent)."""
    for watch in watches:
        if watch.client is None or watch.state not in ("starting", "running"):
            continue
        with contextlib.suppress(AgentError, HostError):  # unknown-job: none had started
            got = watch.client.request("rank.stop", {"job": job, "why": why}, timeout=5.0)
            watch.state, watch.error = got["state"], got["error"]


NETBENCH_RUNS_READ = 20
"""How many of the newest netbench runs a group's straggler verdict looks through."""


def stored_link_seconds(store: RunStore, hosts: list[str]) -> dict[str, float]:
    """Each link between two of `hosts` with the one-way seconds the newest netbench run that
    measured it stored (shared.distributed.stragglers.netbench_one_way)."""
    runs = store.query(
        "SELECT id FROM runs WHERE kind = ? ORDER BY started DESC, rowid DESC LIMIT ?",
        (KIND_NETBENCH, NETBENCH_RUNS_READ),
    )
    links: dict[str, float] = {}
    for run in runs:
        rows = store.query("SELECT record FROM cells WHERE run_id = ?", (run["id"],))
        records = [json.loads(row["record"]) for row in rows]
        found = netbench_one_way([r for r in records if isinstance(r, dict)], hosts)
        known = {same_link(name) for name in links}
        links.update({name: s for name, s in found.items() if same_link(name) not in known})
    return links
