"""The ranks this agent runs for jobs spanning several Macs (rank.start, rank.get, rank.stop in
docs/protocol.md §16): one at a time, never beside a benchmark job (both would measure each
other), each in its own process under agent.cluster, ended at its bound by the daemon's loop
even when no coordinator is left to ask, and ended with the daemon. Ending one never stalls the
loop: SIGTERM at once, SIGKILL from a later poll (agent.cluster.rank_process)."""

from __future__ import annotations

import json
import logging
from collections import OrderedDict
from pathlib import Path
from typing import Any

from agent.cluster.ports import listen_problem
from agent.cluster.rank_process import RankProcess, python_module
from shared.distributed.rank_env import RankEnvError, listens_on, rank_launch
from shared.distributed.rank_shapes import KIND_NETBENCH, check_rank_start
from shared.shapes import Invalid
from shared.wire import protocol as p

log = logging.getLogger("agent.ranks")

POLL_S = 0.2
"""How often the loop looks at a rank whose process lives (its progress, its end, its bound,
its SIGKILL when it ignores a SIGTERM)."""
KEPT = 16
"""Finished ranks whose state rank.get still answers."""


class RankRefused(ValueError):
    """A rank.start this agent will not run: `code` is the protocol's error code."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class RankJobs:
    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self._ranks: OrderedDict[str, RankProcess] = OrderedDict()

    @property
    def running(self) -> RankProcess | None:
        """The rank whose process lives: running, or ended and not yet gone (its ports and
        cores are still taken, so it is still busy)."""
        return next((rank for rank in self._ranks.values() if rank.alive), None)

    def start(self, body: dict[str, Any]) -> RankProcess:
        """Check rank.start's body and start its rank; RankRefused (bad-body, busy) says why
        not, before any process starts."""
        try:
            members = check_rank_start(body)
            launch = rank_launch(members, body["rank"], body["backend"], body["port"])
        except (Invalid, RankEnvError) as exc:
            raise RankRefused(p.BAD_BODY, f"rank.start: {exc}") from None
        if body["job"] in self._ranks:
            raise RankRefused(p.BAD_BODY, f"rank.start: job {body['job']!r} was started already")
        if self.running is not None:
            raise RankRefused(p.BUSY, f"busy: rank {self.running.rank} of job {self.running.job}")
        listening = listens_on(members, body["rank"], body["backend"], body["port"])
        if (why := listen_problem(listening)) is not None:
            raise RankRefused(p.CANNOT_LISTEN, f"rank.start: {why}")
        spec = {**body["spec"], "hosts": [member.name for member in members]}
        assert body["kind"] == KIND_NETBENCH  # the only kind the shape admits
        argv = python_module("agent.cluster.netbench", json.dumps(spec))
        rank = RankProcess(
            body["job"], launch, argv, self.workdir / safe_name(body["job"]), body["bound_s"]
        )
        try:
            rank.start()
        except OSError as exc:
            raise RankRefused(p.INTERNAL, f"rank.start: cannot start the rank: {exc}") from None
        self._ranks[body["job"]] = rank
        while len(self._ranks) > KEPT:
            self._ranks.popitem(last=False)
        log.info("rank %d of job %s started (%s)", rank.rank, rank.job, body["backend"])
        return rank

    def get(self, job: str) -> RankProcess | None:
        rank = self._ranks.get(job)
        if rank is not None:
            rank.poll()
        return rank

    def poll(self) -> None:
        """What the loop calls while a rank's process lives: reads its progress, ends one past
        its bound, SIGKILLs one that outlived its grace, logs each end."""
        rank = self.running
        if rank is None:
            return
        was = rank.state
        if rank.poll() != was:
            log.info("rank %d of job %s: %s %s", rank.rank, rank.job, rank.state, rank.error or "")

    def close(self) -> None:
        """The daemon stops: every rank with it, each gone before this returns."""
        for rank in self._ranks.values():
            rank.stop("the agent stopped")
            rank.settle(wait=True)


def safe_name(job: str) -> str:
    """A job id as a folder name: only letters, digits, '-', '_' and '.' kept."""
    kept = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in job)
    return kept.lstrip(".") or "_"


def rank_body(rank: RankProcess) -> dict[str, Any]:
    """rank.get.ok's body."""
    return {
        "job": rank.job,
        "rank": rank.rank,
        "state": rank.state,
        "elapsed_s": round(rank.elapsed_s(), 3),
        "progress": rank.progress,
        "progress_age_s": round(rank.progress_age_s(), 3),
        "error": rank.error,
        "report": rank.report if isinstance(rank.report, dict) else None,
    }
