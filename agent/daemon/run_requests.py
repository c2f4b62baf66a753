"""The requests about the jobs `agent run` supervises (docs/protocol.md §11, §15): their events
(job.event) and, for a rank of a distributed job, its gang's reports (gang.state) from this
Mac's `agent run` and from the peer agents of its group. Its own module because these come from
the supervised jobs and their peers, not from a coordinator's benchmark
(agent.daemon.job_requests) nor about the agent itself (agent.daemon.requests). A base of
agent.daemon.requests.Requests: it uses the parts given there."""

from __future__ import annotations

import logging
import math
import time

from agent.daemon.endpoints import AgentSockets
from agent.daemon.gang_mailbox import GangRefused
from agent.daemon.handling import Reply, Request, handles
from agent.daemon.hub import TelemetryHub
from agent.daemon.telemetry import run_event
from shared.cooling.gang import PEER_HOLD_POLLS, GangIdentity, MemberState
from shared.shapes import Invalid
from shared.wire import protocol as p
from shared.wire.agent_shapes import gang_request

log = logging.getLogger("agent.daemon")  # the name its log lines have always carried

REFUSAL_LOG_EVERY_S = 60.0
MAX_GROUPS_REMEMBERED = 1024


class RunRequests:
    """The handlers of job.event and gang.state."""

    sockets: AgentSockets
    hub: TelemetryHub
    _refusals_logged: dict[str, float]

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
