"""A benchmark job that is one rank of a distributed group (bench.start's `group`,
docs/protocol.md §17): which members run the matrix together, in rank order, over which of
MLX's backends, with the model split how. Every member's agent gets the same group but its own
`rank`; each runs the whole matrix in lockstep with the others, rank 0's timings being the
group's.

Pure: the shape and the checks a shape cannot make, the names a table shows, and the rank's
environment (shared.distributed.rank_env, as mlx.launch writes it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from shared import shapes as s
from shared.distributed.rank_env import JACCL, RING, Member, RankLaunch, rank_launch
from shared.distributed.rank_shapes import JOB_ID, MAX_MEMBERS, MEMBER, group_members

TENSOR, PIPELINE = "tensor", "pipeline"
SHARDINGS = (TENSOR, PIPELINE)
GROUP_JOINER = "+"
"""How `--hosts` joins hosts into one group: `mac1+mac2`."""
MAX_STALL_S = 24 * 3600.0
MAX_CHECK_TOKENS = 64
"""The most greedy tokens a job decodes as its correctness check (bench.start's
`check_tokens`), after its predictions over the check's prompt."""
CHECK_PROMPT_LENGTH = 16
"""The check's prompt (agent.profiling.greedy): a record's `greedy_tokens` holds a prediction
for each of its positions, then the tokens decoded."""

GROUP = s.fields(
    {
        "job": s.text(most=64, least=1),
        "rank": s.integer(0, MAX_MEMBERS - 1),
        "members": s.list_of(MEMBER, most=MAX_MEMBERS),
        "backend": s.one_of((RING, JACCL)),
        "port": s.integer(1024, 65535),
        "sharding": s.one_of(SHARDINGS),
        "stall_s": s.number(1.0, MAX_STALL_S),
    }
)


@dataclass(frozen=True)
class BenchGroup:
    """Rank `rank` of the group `job` (an id the coordinator picks, the same on every member)."""

    job: str
    rank: int
    members: tuple[Member, ...]
    backend: str
    port: int
    sharding: str
    stall_s: float
    """How long the rank's job may write nothing while no coordinator asks its agent anything
    before the agent ends it (agent.daemon.benchmark.jobs.group_stalled)."""

    @classmethod
    def from_wire(cls, body: Any) -> BenchGroup:
        """bench.start's `group` checked whole; Invalid names the field (`group.members`...)."""
        try:
            GROUP(body)
            if not JOB_ID.fullmatch(body["job"]):
                raise s.Invalid("job", "may hold only letters, digits, '-', '_' and '.'")
            members = group_members(body["members"], body["rank"])
        except s.Invalid as exc:
            raise exc.within("group") from None
        return cls(
            body["job"],
            body["rank"],
            tuple(members),
            body["backend"],
            body["port"],
            body["sharding"],
            float(body["stall_s"]),
        )

    def to_wire(self) -> dict[str, Any]:
        members = []
        for member in self.members:
            raw: dict[str, Any] = {"name": member.name, "ips": list(member.ips)}
            if member.rdma:
                raw["rdma"] = list(member.rdma)
            members.append(raw)
        return {
            "job": self.job,
            "rank": self.rank,
            "members": members,
            "backend": self.backend,
            "port": self.port,
            "sharding": self.sharding,
            "stall_s": self.stall_s,
        }

    @property
    def names(self) -> list[str]:
        return [member.name for member in self.members]

    @property
    def host(self) -> str:
        """This rank's member name."""
        return self.members[self.rank].name

    def launch(self) -> RankLaunch:
        """This rank's environment, as mlx.launch writes it (RankEnvError when it cannot be)."""
        return rank_launch(self.members, self.rank, self.backend, self.port)


def group_name(members: Sequence[str]) -> str:
    """The name a group goes by in tables and the run store: `mac1+mac2`."""
    return GROUP_JOINER.join(members)


def group_label(members: Sequence[str], sharding: str, backend: str) -> str:
    """How a table names a group's row: `mac1+mac2 (2 ranks, tensor, ring)`."""
    return f"{group_name(members)} ({len(members)} ranks, {sharding}, {backend})"
