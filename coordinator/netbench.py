"""`coordinator netbench`'s driver: one rank of the link benchmark on every host, each started
by that host's agent (rank.start, docs/protocol.md §16), watched until rank 0 reports, and
every rank ended the moment one fails, is unreachable, or the user interrupts."""

from __future__ import annotations

import contextlib
import ipaddress
import os
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import zmq

from coordinator.fleet import Settings, Target, connect
from shared.io.transport import AgentClient, AgentError, HostError
from shared.netbench import Measured, NetbenchError, measured_from, ops_per_repetition
from shared.rank_env import (
    JACCL,
    Member,
    RankEnvError,
    backends_of,
    chosen_backend,
    jaccl_devices,
)
from shared.rank_shapes import KIND_NETBENCH, MAX_BOUND_S

POLL_S = 0.25
BOUND_SLACK_S = 120.0
WORST_LINK_BYTES_S = 5e6
"""The slowest link a bound allows for (5 MB/s): a bound that ends a slow but working run
would be a lie about the link."""


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

    def bound_s(self, ranks: int) -> float:
        """How long a rank may run: every size's all_sum and ping-pongs at WORST_LINK_BYTES_S,
        plus slack for starting MLX and forming the ring, at most the protocol's MAX_BOUND_S."""
        links = 1 if ranks == 2 else ranks
        per_repetition = sum(size * ops_per_repetition(size) for size in self.sizes)
        moved = per_repetition * (self.repetitions + self.warmup) * (2 + 2 * links)
        return min(MAX_BOUND_S, BOUND_SLACK_S + moved / WORST_LINK_BYTES_S)

    def spec(self) -> dict[str, Any]:
        return {"sizes": list(self.sizes), "repetitions": self.repetitions, "warmup": self.warmup}


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


def run_netbench(
    targets: list[Target],
    settings: Settings,
    plan: NetbenchPlan,
    stop: threading.Event,
    on_change: Callable[[list[RankWatch]], None] = lambda watches: None,
) -> tuple[str, list[Measured]]:
    """The backend used and rank 0's measurements, checked; NetbenchFailed naming the first
    host that failed (every rank stopped first), BackendMissing before any rank starts when a
    host lacks the backend. KeyboardInterrupt (stop set) stops every rank too."""
    ctx = zmq.Context()
    watches = [RankWatch(target) for target in targets]
    asking = watches[0]  # the host a connect or rank.start error is about
    try:
        available = {}
        for asking in watches:
            asking.client = connect(ctx, asking.target, settings, stop)
            machine = asking.client.request("info", timeout=asking.client.connect_timeout)
            available[asking.target.name] = backends_of(
                machine["machine"], asking.target.rdma is not None
            )
        try:
            backend = chosen_backend(plan.backend, available)
        except RankEnvError as exc:
            raise BackendMissing(str(exc)) from None
        members = [member_of(w.target) for w in watches]
        if backend == JACCL:
            try:
                jaccl_devices(members)
            except RankEnvError as exc:
                raise BackendMissing(f"--backend jaccl: {exc}") from None
        start = {
            "job": plan.job,
            "kind": KIND_NETBENCH,
            "members": [member_body(m) for m in members],
            "backend": backend,
            "port": plan.port,
            "spec": plan.spec(),
            "bound_s": plan.bound_s(len(members)),
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
            failure = first_failure(watches)
            if failure is not None:
                raise NetbenchFailed(failure)
            on_change(watches)
        hosts = [watch.target.name for watch in watches]
        try:
            return backend, measured_from(watches[0].report, plan.sizes, hosts, plan.repetitions)
        except NetbenchError as exc:
            raise NetbenchFailed(f"{hosts[0]}: its report: {exc}") from None
    except (AgentError, HostError) as exc:
        why = f"{asking.target.name}: {exc}"
        stop_all(watches, plan.job, why)
        raise NetbenchFailed(why) from None
    except BackendMissing:
        raise
    except NetbenchFailed as exc:
        stop_all(watches, plan.job, str(exc))
        raise
    except KeyboardInterrupt:
        stop_all(watches, plan.job, "interrupted")
        raise
    finally:
        for watch in watches:
            if watch.client is not None:
                watch.client.close()
        ctx.destroy(linger=0)


def first_failure(watches: list[RankWatch]) -> str | None:
    """One line for the ranks that failed, None while none has: a host that cannot be asked
    first (its death is usually why its peers lost their ring), then the others."""
    failed = [watch for watch in watches if watch.state in ("failed", "stopped")]
    if not failed:
        return None
    failed.sort(key=lambda watch: not watch.unreachable)
    lines = [f"{watch.target.name}: {watch.error}" for watch in failed]
    return lines[0] + (f" (then {'; '.join(lines[1:])})" if len(lines) > 1 else "")


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


def stop_all(watches: list[RankWatch], job: str, why: str) -> None:
    """Ask every host whose rank may still run to end it (a host that cannot be asked ends its
    own at the rank's bound, or with its agent)."""
    for watch in watches:
        if watch.client is None or watch.state not in ("starting", "running"):
            continue
        with contextlib.suppress(AgentError, HostError):
            watch.client.request("rank.stop", {"job": job, "why": why}, timeout=5.0)
        watch.state = "stopped"
