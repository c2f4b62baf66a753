"""What the daemon answers (docs/protocol.md §5): one method per request type, and HANDLERS
(agent.daemon.handling), the table built from them that is the single list of the requests this
agent serves (a test holds it equal to shared.wire.protocol.REQUESTS). The handlers are kept by
concern: the agent's own state here (hello, ping, info, history, policy, doctor), a
coordinator's benchmark jobs and ranks in job_requests.py, the supervised `agent run` jobs and
their gangs in run_requests.py, a calibration in calibration_requests.py, staging models in
stage_requests.py; Requests, which
answers each message, is all of them.

The daemon's parts a handler reads and changes are given at construction.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from agent.daemon.benchmark.jobs import BenchJobs
from agent.daemon.calibration_requests import CalibrationRequests
from agent.daemon.deferred import DeferredReplies
from agent.daemon.endpoints import AgentSockets, Received
from agent.daemon.handling import HANDLERS, Reply, Request, check_cursor, check_limit, handles
from agent.daemon.hub import TelemetryHub
from agent.daemon.job_requests import JobRequests
from agent.daemon.ranks import RankJobs
from agent.daemon.run_requests import RunRequests
from agent.daemon.stage_requests import StageRequests
from agent.daemon.telemetry import (
    HISTORY_MAX_LIMIT,
    HISTORY_PAGE_BYTES,
    history_limit,
)
from agent.doctor.checks import report as doctor_report
from agent.staging.tasks import StageTasks
from shared.cooling.policy import policy_text
from shared.wire import protocol as p

__all__ = ["HANDLERS", "Reply", "Request", "Requests"]


class Requests(JobRequests, RunRequests, CalibrationRequests, StageRequests):
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
        staging: StageTasks,
    ) -> None:
        self.sockets = sockets
        self.staging = staging
        self.chunks = staging.server
        self.store = staging.store
        self.hub = hub
        self.jobs = jobs
        self.ranks = ranks
        self.machine = machine
        self.version = version
        self.stopping = stopping
        self.deferred = DeferredReplies()
        self._refusals_logged: dict[str, float] = {}
        """When a gang.state was last refused, by group (RunRequests)."""

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

    @handles("doctor")
    def doctor(self, request: Request) -> None:
        """This agent's `agent doctor` report, as its service sees the machine. It takes
        seconds (a 1 s benchmark, every sensor; `bandwidth`: the memory probe too), so it is
        deferred; the benchmark and the probe are skipped while a job runs, which they would
        disturb."""
        job = self.jobs.running
        skip = f"benchmark job {job.id} is running" if job else None
        ports = (self.sockets.command_port, self.sockets.telemetry_port)
        memory = bool(request.body["bandwidth"])
        self.deferred.submit(
            request.identity,
            request.message.id,
            "doctor.ok",
            lambda: {
                "report": doctor_report(ports, serving=True, skip_bench=skip, bandwidth=memory)
            },
        )
