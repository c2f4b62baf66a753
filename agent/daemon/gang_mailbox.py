"""The daemon's side of a gang (shared.cooling.gang): what every rank of a distributed job on this
Mac said last, kept so each rank's `agent run` learns the others' from its own agent, and a rank
whose agent is down learns them from its peers' (docs/protocol.md §15).

A group exists here while a rank on this Mac reports it (with the agent's own key, from
`agent run`); peers (trusted agent keys) may report only into a group that exists here, with
the same world size and another rank than the local one: a peer cannot make this agent hold
a job it does not run, nor speak for the local rank.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from shared.cooling.gang import GangIdentity, MemberState, merge, verdict

GROUP_EXPIRES_S = 30.0
"""A group whose local rank has not reported for this long is forgotten (its `agent run` was
killed without an exit): a rank reports every poll."""


class GangRefused(ValueError):
    """A report this mailbox does not take; the message says why."""


@dataclass
class _Local:
    """A rank of the group that runs on this Mac: who it is, its job, when it last reported."""

    identity: GangIdentity
    job: str
    reported: float


@dataclass
class _Group:
    world: int
    hold_s: float
    local: dict[int, _Local] = field(default_factory=dict)
    """By rank: two ranks of one job may share a Mac (`mlx.launch -n 2` on one host)."""
    members: dict[int, MemberState] = field(default_factory=dict)


class GangMailbox:
    """The groups of the ranks on this Mac, by group name. Used from the daemon's loop only."""

    def __init__(self) -> None:
        self.groups: dict[str, _Group] = {}

    def report(
        self,
        identity: GangIdentity,
        member: MemberState,
        local: bool,
        hold_s: float,
        now: float | None = None,
    ) -> list[MemberState]:
        """Take one member's report; returns every member's last one, this one included.
        GangRefused for a report this Mac's ranks did not ask for."""
        now = time.monotonic() if now is None else now
        self.expire(now)
        group = self.groups.get(identity.group)
        if member.rank != identity.rank:
            raise GangRefused(f"the member is rank {member.rank}, the sender rank {identity.rank}")
        if group is not None and identity.world != group.world:
            raise GangRefused(
                f"group {identity.group} has {group.world} ranks here, not {identity.world}"
            )
        if local:
            held = group.local.get(member.rank) if group is not None else None
            if held is not None and held.job != member.job:
                raise GangRefused(
                    f"rank {member.rank} of group {identity.group} is job {held.job}'s on this "
                    f"Mac; job {member.job} cannot be it as well"
                )
            if group is None:
                group = self.groups[identity.group] = _Group(identity.world, hold_s)
            group.local[member.rank] = _Local(identity, member.job, now)
            group.hold_s = hold_s
        elif group is None:
            raise GangRefused(f"no rank of group {identity.group} runs on this Mac")
        elif member.rank in group.local:
            raise GangRefused(
                f"rank {member.rank} of group {identity.group} is this Mac's: only its own "
                "agent run reports it"
            )
        group.members = merge(group.members, [member])
        return [group.members[rank] for rank in sorted(group.members)]

    def expire(self, now: float) -> None:
        """Local ranks silent for GROUP_EXPIRES_S are forgotten (their agent run was killed)."""
        self._drop(lambda held: now - held.reported > GROUP_EXPIRES_S)

    def forget(self, job: str) -> None:
        """The job exited: its rank goes."""
        self._drop(lambda held: held.job == job)

    def _drop(self, gone: Callable[[_Local], bool]) -> None:
        """The local ranks `gone` says, and each group left with none here."""
        for name, group in list(self.groups.items()):
            group.local = {rank: held for rank, held in group.local.items() if not gone(held)}
            if not group.local:
                del self.groups[name]

    def of_job(self, job: str, now: float | None = None) -> dict[str, Any] | None:
        """The gang of a supervised job for its listing (info, telemetry, Prometheus): its
        identity, the state every rank lives under and the rank that causes it."""
        now = time.monotonic() if now is None else now
        for group in self.groups.values():
            for held in group.local.values():
                if held.job == job:
                    decided = verdict(group.members, now, group.hold_s)
                    cause = decided.cause
                    paced = {} if decided.duty is None else {"duty": decided.duty}
                    return (
                        held.identity.to_wire()
                        | paced
                        | {
                            "state": decided.state.value,
                            "cause": None if cause is None else cause.to_wire(now),
                        }
                    )
        return None
