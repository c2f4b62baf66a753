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
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import mlx.core as mx

from agent.cluster.launch_files import write_launch_files
from shared.bench_group import BenchGroup

DIGEST_BYTES = 16
"""How much of a model digest the ranks compare (of sha256's 32)."""


@dataclass(frozen=True)
class RankGroup:
    """The joined group: `spec` says who is who, `group` is MLX's."""

    spec: BenchGroup
    group: mx.distributed.Group
    beat: Callable[[], None] = field(default=lambda: None)
    """Told each time a collective of ours completes: the group is alive (StallWatch)."""

    @property
    def rank(self) -> int:
        return self.group.rank()

    @property
    def size(self) -> int:
        return self.group.size()

    def leader_says(self, flag: bool) -> bool:
        """Rank 0's `flag`, on every rank."""
        return self._sum(int(flag) if self.rank == 0 else 0) > 0

    def any_says(self, flag: bool) -> bool:
        """Whether `flag` holds on any rank, on every rank."""
        return self._sum(int(flag)) > 0

    def which_say(self, flag: bool) -> list[int]:
        """The ranks where `flag` holds, on every rank."""
        mine = mx.zeros((self.size,), dtype=mx.int32)
        mine[self.rank] = int(flag)
        summed = mx.distributed.all_sum(mine, group=self.group)
        mx.eval(summed)
        self.beat()
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
        self.beat()
        return int(total.item())


class StallWatch:
    """Ends a rank that has waited on its group for `limit_s` with nothing done. A rank blocked
    in a collective waits for as long as its peer does not answer: for ever when the link to it
    was cut (no connection reset ever comes) or the peer's host is gone, and no signal handler
    of ours runs meanwhile. A cut also keeps the coordinator from cancelling it, so the rank
    ends itself: `on_stall(why)` (the job process reports and exits)."""

    def __init__(
        self,
        limit_s: float,
        on_stall: Callable[[str], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limit_s, self.on_stall, self.clock = limit_s, on_stall, clock
        self._last = clock()

    def beat(self) -> None:
        """Something was done: a collective completed, or the job reported."""
        self._last = self.clock()

    def start(self) -> None:
        threading.Thread(target=self._watch, name="rank-stall-watch", daemon=True).start()

    def _watch(self) -> None:
        while True:
            idle = self.clock() - self._last
            if idle > self.limit_s:
                self.on_stall(
                    f"no progress with its group for {idle:.0f} s (limit {self.limit_s:g} s): "
                    "a peer or the link to it is gone"
                )
                return
            time.sleep(min(1.0, self.limit_s / 4))


def join(spec: BenchGroup, folder: Path, beat: Callable[[], None]) -> RankGroup:
    """Write this rank's launch files into `folder`, set its environment as mlx.launch would
    and join the group; blocks until every rank has joined, holding the GIL (MLX 0.32's ring
    setup), so no signal handler or StallWatch runs meanwhile: a cancel ends it by the agent's
    kill, and a peer that never comes by the job's own bound. `beat` hears every agreement's
    collective complete."""
    os.environ.update(write_launch_files(spec.launch(), folder))
    group = mx.distributed.init(strict=True, backend=spec.backend)
    if group.size() != len(spec.members):
        raise RuntimeError(f"joined a group of {group.size()}, expected {len(spec.members)}")
    beat()
    return RankGroup(spec, group, beat)
