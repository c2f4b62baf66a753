"""What the daemon answers (docs/protocol.md §5): one method per request type, and HANDLERS, the
table built from them that is the single list of the requests this agent serves (a test holds
it equal to shared.wire.protocol.REQUESTS).

A handler returns its Reply, or raises ProtocolError, which goes back as an `error` reply, or
returns None when its reply is deferred (computed on a worker thread and sent by the daemon's loop
through send_finished()). The daemon's parts it reads and changes are given at construction.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import zmq

from agent.daemon.benchmark.jobs import BenchJobs
from agent.daemon.benchmark.journal import JOB_LIST_MAX
from agent.daemon.benchmark.plan import model_identity
from agent.daemon.deferred import DeferredReplies
from agent.daemon.endpoints import AgentSockets, Received
from agent.daemon.gang_mailbox import GangRefused
from agent.daemon.hub import TelemetryHub
from agent.daemon.ranks import RankJobs, RankRefused, rank_body
from agent.daemon.telemetry import (
    HISTORY_MAX_LIMIT,
    HISTORY_PAGE_BYTES,
    history_limit,
    run_event,
)
from agent.doctor.checks import report as doctor_report
from shared.cooling.gang import PEER_HOLD_POLLS, GangIdentity, MemberState
from shared.cooling.policy import policy_text
from shared.shapes import Invalid
from shared.wire import protocol as p
from shared.wire.agent_shapes import gang_request

log = logging.getLogger("agent.daemon")

REFUSAL_LOG_EVERY_S = 60.0
MAX_GROUPS_REMEMBERED = 1024


class Reply(NamedTuple):
    """The reply's type and body, and the stream messages that follow it at once (same `re`)."""

    type: str
    body: dict[str, Any]
    then: tuple[tuple[str, dict[str, Any]], ...] = ()


class Request(NamedTuple):
    identity: bytes
    message: p.Message
    frame: zmq.Frame | None
    """The message's last frame under CURVE, None without: see endpoints.peer_key."""

    @property
    def body(self) -> dict[str, Any]:
        return self.message.body

    def refuse(self, code: str, message: str) -> p.ProtocolError:
        """The error answering this request."""
        return p.ProtocolError(code, message, re=self.message.id)


Handler = Callable[["Requests", Request], Reply | None]
HANDLERS: dict[str, Handler] = {}


def handles(type_: str) -> Callable[[Handler], Handler]:
    """Register the decorated method as the handler of request `type_`."""

    def register(handler: Handler) -> Handler:
        if type_ in HANDLERS:
            raise ValueError(f"two handlers for {type_}")
        HANDLERS[type_] = handler
        return handler

    return register


class Requests:
    """The handlers, over the daemon's sockets, telemetry hub and benchmark jobs."""

    def __init__(
        self,
        sockets: AgentSockets,
        hub: TelemetryHub,
        jobs: BenchJobs,
        machine: dict[str, Any],
        version: str,
        stopping: Callable[[], bool],
        ranks: RankJobs,
    ) -> None:
        self.sockets = sockets
        self.hub = hub
        self.jobs = jobs
        self.ranks = ranks
        self.machine = machine
        self.version = version
        self.stopping = stopping
        self.deferred = DeferredReplies()
        self._refusals_logged: dict[str, float] = {}

    def answer(self, received: Received) -> None:
        """Reply to one request: its handler's reply, or an `error` (a deferred reply later)."""
        message = received.message
        assert isinstance(message, p.Message)
        request = Request(received.identity, message, received.frame)
        if not self.sockets.from_peer_agent(received.frame):
            self.jobs.heard()  # a coordinator is there (BenchJobs.group_stalled)
        if message.type not in p.PEER_REQUESTS and self.sockets.from_peer_agent(received.frame):
            allowed = ", ".join(sorted(p.PEER_REQUESTS))
            why = (
                f"{message.type}: a peer agent's key (trusted with --peer) may send only {allowed}"
            )
            self.sockets.send(received.identity, p.error(p.FORBIDDEN, why, re=message.id))
            return
        reply = HANDLERS[message.type](self, request)
        if reply is None:
            return
        for type_, body in ((reply.type, reply.body), *reply.then):
            self.sockets.send(received.identity, p.make(type_, body, re=message.id))

    def send_finished(self) -> None:
        """Send every deferred reply whose work is done (its failure as an `internal` error)."""
        for pending in self.deferred.finished():
            try:
                message = p.make(pending.type, pending.future.result(), re=pending.re)
            except Exception as exc:  # a bug answers one request, never kills the daemon
                message = p.error(p.INTERNAL, f"{type(exc).__name__}: {exc}", re=pending.re)
            self.sockets.send(pending.identity, message)

    @handles("hello")
    def hello(self, request: Request) -> Reply:
        return Reply(
            "hello.ok",
            {
                "agent": self.version,
                "protocol": p.PROTOCOL_VERSION,
                "hostname": self.hub.host,
                "secure": self.sockets.secure,
            },
        )

    @handles("ping")
    def ping(self, request: Request) -> Reply:
        job = self.jobs.running
        return Reply("ping.ok", {"job": job.id if job else None, "time": time.time()})

    @handles("info")
    def info(self, request: Request) -> Reply:
        job = self.jobs.running
        return Reply(
            "info.ok",
            {
                "agent": self.version,
                "protocol": p.PROTOCOL_VERSION,
                "name": self.hub.host,
                "machine": self.machine,
                "thermal": self.hub.instruments.thermal(),
                "power": self.hub.instruments.power(),
                "job": None if job is None else job.summary(),
                "telemetry_port": self.sockets.telemetry_port,
                "poll_interval": self.hub.poll_interval,
                "policy": self.hub.policy.to_dict(),
                "policy_origin": self.hub.policy_origin,
                "jobs": self.hub.jobs.listed(),
                "history": self.hub.history.id,
                "storage": self.hub.storage.report(),
            },
        )

    @handles("bench.start")
    def bench_start(self, request: Request) -> Reply:
        """Every refusal (busy, bad-matrix, too-large) comes before the job process starts: an
        error reply never leaves a job behind."""
        if self.stopping():
            raise request.refuse(p.BUSY, "busy: the agent is stopping")
        rank = self.ranks.running
        if rank is not None:
            raise request.refuse(p.BUSY, f"busy: rank {rank.rank} of job {rank.job} is running")
        plan = self.jobs.plan(request.message)
        progress = {"job": plan.id, "done": 0, "total": len(plan.cells)}
        reply = Reply(
            "bench.start.ok",
            {"job": plan.id, "cells": [cell.name for cell in plan.cells]},
            then=(("bench.progress", progress),),
        )
        p.encode(p.make(reply.type, reply.body, re=request.message.id))  # too-large: refused
        self.jobs.start(request.identity, request.message.id, plan)
        self.jobs.feed(self.hub.last_reading, self.hub.policy)  # what the daemon read last
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
        if self.stopping():
            raise request.refuse(p.BUSY, "busy: the agent is stopping")
        job = self.jobs.running
        if job is not None:
            raise request.refuse(p.BUSY, f"busy: benchmark job {job.id} is running")
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

    @handles("history.get")
    def history_get(self, request: Request) -> Reply:
        check_limit(request, HISTORY_MAX_LIMIT)
        limit = history_limit(request.body["limit"])
        check_cursor(request, "samples_after")
        check_cursor(request, "events_after")
        body = request.body
        samples, events, truncated = self.hub.history.page(
            body["samples_after"],
            body["events_after"],
            body["since"] or 0.0,
            limit,
            HISTORY_PAGE_BYTES,
        )
        return Reply(
            "history.get.ok",
            {
                "history": self.hub.history.id,
                "samples": samples,
                "events": events,
                "truncated": truncated,
            },
        )

    @handles("policy.get")
    def policy_get(self, request: Request) -> Reply:
        return Reply(
            "policy.get.ok",
            {"policy": self.hub.policy.to_dict(), "origin": self.hub.policy_origin},
        )

    @handles("policy.set")
    def policy_set(self, request: Request) -> Reply:
        """A refusal leaves the old policy in force; a change reaches the running job at once."""
        before = self.hub.policy
        try:
            policy = self.hub.set_policy(request.body["policy"])
        except ValueError as exc:
            raise p.ProtocolError(
                p.BAD_POLICY,
                f"policy refused: {exc}; the policy in force stays {policy_text(before)} "
                f"({self.hub.policy_origin})",
                re=request.message.id,
            ) from None
        if policy != before:
            self.jobs.feed_policy(policy)
        return Reply(
            "policy.set.ok", {"policy": policy.to_dict(), "origin": self.hub.policy_origin}
        )

    @handles("job.event")
    def job_event(self, request: Request) -> Reply:
        """An event of an `agent run` job on this machine: we list and publish it (and record
        it when `agent run` could not). Only a process holding the agent's own key (its user,
        on this machine) may send one, so a coordinator cannot make up local jobs: the
        socket refused any other's, `forbidden`, before reading its body (AgentSockets)."""
        try:
            event = run_event(request.body)
        except ValueError as exc:
            raise request.refuse(p.BAD_BODY, f"job.event: {exc}") from None
        self.hub.event(event, p.KIND_RUN)
        return Reply("job.event.ok", {"job": request.body["job"]})

    @handles("gang.state")
    def gang_state(self, request: Request) -> Reply:
        """A rank's report into its gang (docs/protocol.md §15): from this Mac's `agent run`
        (the agent's own key, a job it supervises) it keeps the group here; from a peer agent
        it is taken only into a group a rank here reports. Answers every member's last report.
        A refusal is logged, at most once a minute per group, since a peer retries each poll."""
        body = request.body
        try:
            gang_request(body)
            identity = GangIdentity.from_wire(body["gang"])
            now = time.monotonic()  # `heard` is this agent's own clock: a wall step changes nothing
            member = MemberState.from_wire(body["member"], now)
        except (Invalid, ValueError) as exc:
            raise request.refuse(p.BAD_BODY, f"gang.state: {exc}") from None
        supervised = self.hub.jobs.jobs.get(member.job)
        local = supervised is not None and supervised.kind == p.KIND_RUN
        if local and request.frame is not None:
            local = self.sockets.from_own_key(request.frame)
        hold_s = PEER_HOLD_POLLS * self.hub.poll_interval
        try:
            members = self.hub.jobs.gangs.report(identity, member, local, hold_s, now)
        except GangRefused as exc:
            self._log_refusal(identity.group, str(exc))
            raise request.refuse(p.FORBIDDEN, f"gang.state: {exc}") from None
        return Reply(
            "gang.state.ok",
            {"group": identity.group, "members": [m.to_wire(now) for m in members]},
        )

    def _log_refusal(self, group: str, why: str) -> None:
        now = time.monotonic()
        if now - self._refusals_logged.get(group, -math.inf) >= REFUSAL_LOG_EVERY_S:
            if len(self._refusals_logged) >= MAX_GROUPS_REMEMBERED:  # names are the peers'
                self._refusals_logged.clear()
            self._refusals_logged[group] = now
            log.warning("refused a gang.state: %s", why)

    @handles("doctor")
    def doctor(self, request: Request) -> None:
        """This agent's `agent doctor` report, as its service sees the machine. It takes
        seconds (a 1 s benchmark, every sensor), so it is deferred; the benchmark is skipped
        while a job runs, which it would disturb."""
        job = self.jobs.running
        skip = f"benchmark job {job.id} is running" if job else None
        ports = (self.sockets.command_port, self.sockets.telemetry_port)
        self.deferred.submit(
            request.identity,
            request.message.id,
            "doctor.ok",
            lambda: {"report": doctor_report(ports, serving=True, skip_bench=skip)},
        )


def check_limit(request: Request, most: int) -> None:
    """A page's `limit`: nil (the default) or 1 to `most`; `bad-body` naming the range
    otherwise, never a silent cut (docs/protocol.md §5)."""
    limit = request.body["limit"]
    if limit is not None and not 1 <= limit <= most:
        raise request.refuse(
            p.BAD_BODY, f"{request.message.type}: limit must be 1 to {most}, got {limit}"
        )


def check_cursor(request: Request, name: str) -> None:
    """An offset or a cursor: 0 to MAX_WIRE_INT; `bad-body` naming the field otherwise."""
    value = request.body[name]
    if value is not None and not 0 <= value <= p.MAX_WIRE_INT:
        raise request.refuse(
            p.BAD_BODY,
            f"{request.message.type}: {name} must be 0 to {p.MAX_WIRE_INT}, got {value}",
        )
