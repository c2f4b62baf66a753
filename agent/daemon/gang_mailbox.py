"""The daemon's side of a gang (shared.gang): what every rank of a distributed job on this Mac
said last, kept so each rank's `agent run` learns the others' from its own agent, and a rank
whose agent is down learns them from its peers' (docs/protocol.md §15).

A group exists here while a rank on this Mac reports it (with the agent's own key, from
`agent run`); peers (trusted agent keys) may report only into a group that exists here, with
the same world size and another rank than the local one: a peer cannot make this agent hold
a job it does not run, nor speak for the local rank.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from shared.gang import GangIdentity, MemberState, merge, verdict

GROUP_EXPIRES_S = 30.0
"""A group whose local rank has not reported for this long is forgotten (its `agent run` was
killed without an exit): a rank reports every poll."""


class GangRefused(ValueError):
    """A report this mailbox does not take; the message says why."""


@dataclass
class _Group:
    identity: GangIdentity
    job: str
    hold_s: float
    reported: float
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
        if local:
            if group is not None and group.job != member.job:
                raise GangRefused(
                    f"group {identity.group} is job {group.job}'s on this Mac; job "
                    f"{member.job} cannot join it as well"
                )
            if group is None or group.identity != identity:
                kept = group.members if group is not None else {}
                group = _Group(identity, member.job, hold_s, now, dict(kept))
                self.groups[identity.group] = group
            group.reported, group.hold_s = now, hold_s
        else:
            if group is None:
                raise GangRefused(f"no rank of group {identity.group} runs on this Mac")
            if identity.world != group.identity.world:
                raise GangRefused(
                    f"group {identity.group} has {group.identity.world} ranks here, "
                    f"not {identity.world}"
                )
            if member.rank == group.identity.rank:
                raise GangRefused(
                    f"rank {member.rank} of group {identity.group} is this Mac's: only its own "
                    "agent run reports it"
                )
        group.members = merge(group.members, [member])
        return [group.members[rank] for rank in sorted(group.members)]

    def expire(self, now: float) -> None:
        for name in [n for n, g in self.groups.items() if now - g.reported > GROUP_EXPIRES_S]:
            del self.groups[name]

    def forget(self, job: str) -> None:
        """The job exited: its group goes with it."""
        for name in [n for n, g in self.groups.items() if g.job == job]:
            del self.groups[name]

    def of_job(self, job: str, now: float | None = None) -> dict[str, Any] | None:
        """The gang of a supervised job for its listing (info, telemetry, Prometheus): its
        identity, the state every rank lives under and the rank that causes it."""
        now = time.monotonic() if now is None else now
        for group in self.groups.values():
            if group.job == job:
                decided = verdict(group.members, now, group.hold_s)
                cause = decided.cause
                return group.identity.to_wire() | {
                    "state": decided.state.value,
                    "cause": None if cause is None else cause.to_wire(now),
                }
        return None
