"""The requests a coordinator's benchmark makes of this agent (docs/protocol.md §5): a job to
check, start, cancel and read back (bench.*, job.*), and a rank of a job across several Macs
(rank.*). Its own module because running benchmarks is one concern of the daemon's requests,
apart from the agent's own state (agent.daemon.requests) and the supervised `agent run` jobs
(agent.daemon.run_requests). A base of agent.daemon.requests.Requests: it uses the parts given
there."""

from __future__ import annotations

from collections.abc import Callable

from agent.daemon.benchmark.jobs import BenchJobs
from agent.daemon.benchmark.journal import JOB_LIST_MAX
from agent.daemon.benchmark.plan import model_identity
from agent.daemon.handling import Reply, Request, check_cursor, check_limit, handles
from agent.daemon.hub import TelemetryHub
from agent.daemon.ranks import RankJobs, RankRefused, rank_body
from shared.wire import protocol as p


class JobRequests:
    """The handlers of bench.*, job.* and rank.*: one benchmark job or one rank at a time."""

    jobs: BenchJobs
    ranks: RankJobs
    hub: TelemetryHub
    stopping: Callable[[], bool]

    def refuse_while_busy(self, request: Request, other: str | None) -> None:
        """`busy` while the agent stops, while `other` runs (the job of the other kind: a rank
        for a benchmark, a benchmark for a rank; None: none), or while this Mac calibrates
        (agent.daemon.calibration_requests): a job beside the calibration's load would heat the
        Mac the calibration measures."""
        if self.stopping():
            raise request.refuse(p.BUSY, "busy: the agent is stopping")
        if other is not None:
            raise request.refuse(p.BUSY, f"busy: {other} is running")
        calibration = getattr(self, "calibration", None)
        if calibration is not None and calibration.state == "running":
            raise request.refuse(
                p.BUSY, f"busy: a calibration is running ({calibration.minutes:g} min)"
            )

    @handles("bench.start")
    def bench_start(self, request: Request) -> Reply:
        """Every refusal (busy, bad-matrix, too-large) comes before the job process starts: an
        error reply never leaves a job behind."""
        rank = self.ranks.running
        self.refuse_while_busy(
            request, None if rank is None else f"rank {rank.rank} of job {rank.job}"
        )
        plan = self.jobs.plan(request.message)
        progress = {"job": plan.id, "done": 0, "total": len(plan.cells)}
        reply = Reply(
            "bench.start.ok",
            {"job": plan.id, "cells": [cell.name for cell in plan.cells]},
            then=(("bench.progress", progress),),
        )
        p.encode(p.make(reply.type, reply.body, re=request.message.id))  # too-large: refused
        self.jobs.start(request.identity, request.message.id, plan)
        last_clock = self.hub.clock_throttle.last_clock
        self.jobs.feed(self.hub.last_reading, self.hub.policy, last_clock)  # the last poll's
        return reply

    @handles("bench.check")
    def bench_check(self, request: Request) -> Reply:
        """bench.start's every check, starting nothing: a coordinator asks each member of a
        group before any job of its run starts, so a group that cannot run is bad input."""
        plan = self.jobs.plan(request.message, busy_ok=True)
        models = {model: model_identity(model) for model in plan.spec.models}
        return Reply(
            "bench.check.ok", {"cells": [cell.name for cell in plan.cells], "models": models}
        )

    @handles("rank.start")
    def rank_start(self, request: Request) -> Reply:
        """A rank never runs beside a benchmark job: each would measure the other."""
        job = self.jobs.running
        self.refuse_while_busy(request, None if job is None else f"benchmark job {job.id}")
        try:
            rank = self.ranks.start(request.body)
        except RankRefused as exc:
            raise request.refuse(exc.code, str(exc)) from None
        return Reply("rank.start.ok", {"job": rank.job, "rank": rank.rank})

    @handles("rank.get")
    def rank_get(self, request: Request) -> Reply:
        rank = self.ranks.get(request.body["job"])
        if rank is None:
            raise request.refuse(p.UNKNOWN_JOB, f"no rank of job {request.body['job']!r} here")
        rank.asked()
        return Reply("rank.get.ok", rank_body(rank))

    @handles("rank.stop")
    def rank_stop(self, request: Request) -> Reply:
        rank = self.ranks.get(request.body["job"])
        if rank is None:
            raise request.refuse(p.UNKNOWN_JOB, f"no rank of job {request.body['job']!r} here")
        rank.stop(request.body["why"] or "stopped by its coordinator")
        return Reply("rank.stop.ok", rank_body(rank))

    @handles("bench.cancel")
    def bench_cancel(self, request: Request) -> Reply:
        self.jobs.cancel_by_id(request.body["job"], request.message)
        return Reply("bench.cancel.ok", {"job": request.body["job"]})

    @handles("job.get")
    def job_get(self, request: Request) -> Reply:
        offset = request.body["offset"] or 0
        check_cursor(request, "offset")
        return Reply("job.get.ok", self.jobs.page(request.body["job"], offset, request.message))

    @handles("job.list")
    def job_list(self, request: Request) -> Reply:
        check_limit(request, JOB_LIST_MAX)
        jobs = self.jobs.journal.list_jobs(request.body["limit"] or JOB_LIST_MAX)
        return Reply("job.list.ok", {"jobs": jobs})
