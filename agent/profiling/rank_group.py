"""This job process as one rank of a distributed group (bench.start's `group`): it joins MLX's
own backend with the environment mlx.launch would have written, and keeps in lockstep with
its peers wherever a rank would otherwise decide alone.

Every rank runs the same matrix and meets the others in the model's collectives. Any choice
that changes how many collectives a rank makes must be the same on every rank, or one waits
for ever on a peer that went on: whether a timed iteration re-warms, whether `-r auto` has
enough iterations (rank 0 decides, its timings being the group's), whether a cell is refused
for memory (any rank that cannot hold it refuses it for all). Each agreement is one small
`all_sum`, outside every timed region.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx

from agent.cluster.launch_files import write_launch_files
from shared.distributed.group import BenchGroup

DIGEST_BYTES = 16
"""How much of a model digest the ranks compare (of sha256's 32)."""


@dataclass(frozen=True)
class RankGroup:
    """The joined group: `spec` says who is who, `group` is MLX's."""

    spec: BenchGroup
    group: mx.distributed.Group

    @property
    def rank(self) -> int:
        return self.group.rank()

    @property
    def size(self) -> int:
        return self.group.size()

    def leader_says(self, flag: bool) -> bool:
        """Rank 0's `flag`, on every rank."""
        return self._sum(int(flag) if self.rank == 0 else 0) > 0

    def leader_counts(self, counts: list[int]) -> list[int]:
        """Rank 0's `counts`, on every rank (each rank gives as many)."""
        mine = counts if self.rank == 0 else [0] * len(counts)
        summed = mx.distributed.all_sum(mx.array(mine, dtype=mx.int64), group=self.group)
        mx.eval(summed)
        return [int(value) for value in summed.tolist()]

    def which_say(self, flag: bool) -> list[int]:
        """The ranks where `flag` holds, on every rank."""
        mine = mx.zeros((self.size,), dtype=mx.int32)
        mine[self.rank] = int(flag)
        summed = mx.distributed.all_sum(mine, group=self.group)
        mx.eval(summed)
        return [rank for rank, said in enumerate(summed.tolist()) if said]

    def digests_differ(self, digest: str | None) -> list[str] | None:
        """None when every rank holds the same weights (the same digest), else each rank's
        digest (a prefix; `unknown` where a rank has none), in rank order."""
        mine = hashlib.sha256((digest or "").encode()).digest()[:DIGEST_BYTES]
        table = mx.zeros((self.size, DIGEST_BYTES), dtype=mx.int32)
        table[self.rank] = mx.array(list(mine), dtype=mx.int32)
        summed = mx.distributed.all_sum(table, group=self.group)
        mx.eval(summed)
        rows = [bytes(row) for row in summed.tolist()]
        if all(row == rows[0] for row in rows):
            return None
        unknown = hashlib.sha256(b"").digest()[:DIGEST_BYTES]
        return ["unknown" if row == unknown else row.hex()[:12] for row in rows]

    def _sum(self, value: int) -> int:
        total = mx.distributed.all_sum(mx.array([value], dtype=mx.int32), group=self.group)
        mx.eval(total)
        return int(total.item())


def join(spec: BenchGroup, folder: Path) -> RankGroup:
    """Write this rank's launch files into `folder`, set its environment as mlx.launch would
    and join the group; blocks until every rank has joined, holding the GIL (MLX 0.32's ring
    setup), so no signal handler runs meanwhile: the agent's kill ends it (a cancel, or
    agent.daemon.benchmark.jobs.group_stalled)."""
    os.environ.update(write_launch_files(spec.launch(), folder))
    group = mx.distributed.init(strict=True, backend=spec.backend)
    if group.size() != len(spec.members):
        raise RuntimeError(f"joined a group of {group.size()}, expected {len(spec.members)}")
    return RankGroup(spec, group)
