"""Before a run with groups starts any job: every member of every group is asked, all at once,
whether the group can run, so a group that cannot is one line and exit 2, not a run that fails
half-way: the members' MLX versions (ranks of different MLX need not agree on a collective or
a random weight), the backend (JACCL needs macOS 26.2+ and RDMA devices on every member), and
bench.check (the matrix as each member would run its rank: the models there, each splitting as
asked). A member that does not answer is no bad input: its group fails in the run, naming it,
and the single hosts go on (docs/distributed.md)."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import zmq

from coordinator.commands.hosts import on_every_host
from coordinator.hosts.link import Settings, Target, connect
from coordinator.runs.group_driver import GroupTarget
from coordinator.runs.netbench import NetbenchFailed, member_of
from shared.distributed.group import group_name
from shared.distributed.rank_env import (
    AUTO,
    JACCL,
    RING,
    RankEnvError,
    backends_of,
    chosen_backend,
    jaccl_devices,
)
from shared.io.transport import AgentError, HostError
from shared.safe_text import shown
from shared.wire import protocol as p

MIN_STALL_S = 60.0


class GroupRefused(ValueError):
    """A group that cannot run as asked: one line naming the group, the member and why."""


@dataclass(frozen=True)
class GroupPlan:
    """How every group of the run runs (the benchmark command's options)."""

    backend: str
    sharding: str
    port: int
    host_timeout: float

    @property
    def stall_s(self) -> float:
        """How long a rank's agent lets it write nothing while no coordinator asks anything
        before it ends the rank (agent.daemon.benchmark.jobs.group_stalled): twice the time a
        silent host is given, so the coordinator names a lost member before its agent acts."""
        return max(MIN_STALL_S, 2 * self.host_timeout)


@dataclass
class _Answer:
    machine: dict[str, Any] | None = None
    refused: str | None = None
    unreachable: str | None = None


def prepare(
    entries: Sequence[Target | tuple[Target, ...]],
    spec: dict[str, Any],
    settings: Settings,
    plan: GroupPlan,
) -> list[Target | GroupTarget]:
    """The run's targets, each group (a tuple of members, rank order) checked and resolved
    into a GroupTarget; GroupRefused for the first group that cannot run."""
    groups = [entry for entry in entries if isinstance(entry, tuple)]
    if not groups:
        return list(entries)  # type: ignore[arg-type]
    resolved = {members: _resolve(members, plan) for members in groups}
    asked = {member.name: member for members in groups for member in members}
    answers = dict(
        zip(asked, on_every_host(list(asked.values()), _ask_info(settings)), strict=True)
    )
    for members, group in resolved.items():
        backend = checked_backend(group, [answers[m.name] for m in members], plan)
        resolved[members] = replace(group, backend=backend)
    checks = [
        (group, rank, host) for group in resolved.values() for rank, host in enumerate(group.hosts)
    ]
    answered = on_every_host(checks, _ask_check(settings, spec))
    for (group, _, host), (refused, _) in zip(checks, answered, strict=True):
        if refused is not None:
            raise GroupRefused(f"{group.name}: {host.name}: {shown(refused)}")
    for group in resolved.values():
        held = [
            models for (g, _, _), (_, models) in zip(checks, answered, strict=True) if g is group
        ]
        _same_weights(group, held)
    return [resolved[entry] if isinstance(entry, tuple) else entry for entry in entries]


def _same_weights(group: GroupTarget, held: list[dict[str, Any] | None]) -> None:
    """Every member names each model's weights alike (bench.check.ok's `models`: a built-in
    config's digest, a directory's listing); a member that could not be asked, or could not
    name a model's, is no difference (its ranks compare full digests as they load)."""
    answers = [(host.name, models) for host, models in zip(group.hosts, held, strict=True)]
    names = {model for _, models in answers if models for model in models}
    for model in sorted(names):
        seen = {host: models.get(model) for host, models in answers if models and models.get(model)}
        if len(set(seen.values())) > 1:
            said = ", ".join(f"{host} {shown(str(digest)[:20])}" for host, digest in seen.items())
            raise GroupRefused(
                f"{group.name}: its members hold different weights for {model} ({said})"
            )


def _resolve(members: tuple[Target, ...], plan: GroupPlan) -> GroupTarget:
    """A group as its ranks will see each other; `auto` stays until the members answer."""
    try:
        ring = tuple(member_of(member) for member in members)
    except NetbenchFailed as exc:
        raise GroupRefused(f"{group_name([m.name for m in members])}: {exc}") from None
    return GroupTarget(members, ring, plan.backend, plan.sharding, plan.port, plan.stall_s)


def _ask_info(settings: Settings) -> Any:
    def ask(ctx: zmq.Context, target: Target, stop: threading.Event) -> _Answer:
        try:
            with connect(ctx, target, settings, stop) as client:
                info = client.request("info", timeout=settings.connect_timeout)
                return _Answer(machine=info["machine"] or {})
        except AgentError as exc:
            return _Answer(refused=str(exc))
        except HostError as exc:
            return _Answer(unreachable=str(exc))

    return ask


def checked_backend(group: GroupTarget, answers: list[_Answer], plan: GroupPlan) -> str:
    """The backend the group runs on (`auto` chosen), once the members' MLX versions are
    alike and every one has it; the asked one as it is while a member is unreachable."""
    known = {
        host.name: answer.machine
        for host, answer in zip(group.hosts, answers, strict=True)
        if answer.machine is not None
    }
    for host, answer in zip(group.hosts, answers, strict=True):
        if answer.refused is not None:
            raise GroupRefused(f"{group.name}: {host.name}: {shown(answer.refused)}")
    if len(known) < len(group.hosts):
        # A member is unreachable: the run fails the group, naming it.
        return RING if plan.backend == AUTO else plan.backend
    versions = {name: machine.get("mlx_version") for name, machine in known.items()}
    if len(set(versions.values())) > 1:
        said = ", ".join(f"{name} {shown(str(version))}" for name, version in versions.items())
        raise GroupRefused(
            f"{group.name}: its members run different MLX ({said}); a group's ranks need the same"
        )
    rdma = {host.name: host.rdma is not None for host in group.hosts}
    available = {name: backends_of(machine, rdma[name]) for name, machine in known.items()}
    try:
        backend = chosen_backend(plan.backend, available)
        if backend == JACCL:
            jaccl_devices(group.members)
    except RankEnvError as exc:
        raise GroupRefused(f"{group.name}: --backend {plan.backend}: {exc}") from None
    return backend


def _ask_check(settings: Settings, spec: dict[str, Any]) -> Any:
    """bench.check with the member's own bench.start body: (its refusal or None, the models'
    identities it named or None). An unreachable member refuses nothing: its group fails in
    the run, naming it."""

    def ask(
        ctx: zmq.Context, item: tuple[GroupTarget, int, Target], stop: threading.Event
    ) -> tuple[str | None, dict[str, Any] | None]:
        group, rank, host = item
        body = {"matrix": spec, "group": group.body(rank)}
        try:
            with connect(ctx, host, settings, stop) as client:
                checked = client.request("bench.check", body, timeout=settings.connect_timeout)
        except AgentError as exc:
            if exc.code == p.UNKNOWN_TYPE:
                return "its agent predates groups (no bench.check): update it", None
            return str(exc), None
        except HostError:
            return None, None
        return None, checked.get("models")

    return ask
