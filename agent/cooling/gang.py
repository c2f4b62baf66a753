"""This rank's side of a gang (shared.cooling.gang): it tells every member's agent what this Mac
asks for, hears what the others asked, and turns the one verdict into actions on this rank.

Every rank reports to its own agent (the agent's own key) and to each peer's (a trusted agent
key, `agent keys trust KEY --peer HOST`), over the agents' CURVE sockets: no coordinator and no
socket of our own. Each report's reply carries every member's last report that agent holds, so
a rank whose own agent is down still hears its peers, and a peer that comes back learns the
gang's state with its first reply. A change is sent at once; otherwise the own agent is asked
every LOCAL_EVERY_S (it relays what peers sent it) and the peers every poll.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import zmq

from agent.daemon_address import find_daemon
from shared.cooling.gang import (
    JACCL,
    PEER_HOLD_POLLS,
    Enforced,
    GangIdentity,
    MemberState,
    Verdict,
    gang_reason,
    merge,
    steer,
    verdict,
)
from shared.cooling.policy import Action, CoolingState
from shared.io.keys import Keypair, own_keypair
from shared.io.transport import AgentClient, AgentError, HostError
from shared.io.trust import peer_key, split_peer

log = logging.getLogger("agent.gang")

LOCAL_EVERY_S = 0.1
"""How often a rank asks its own agent for what peers reported: the pause skew between ranks
is about this (docs/performance.md), far under Metal's ~5 s command-buffer watchdog."""
REQUEST_TIMEOUT_S = 2.0
PARK_TIMEOUT_S = 30.0
"""How long a cooperative rank (MLX_FLEET_COOPERATIVE=1) may take to park at its next step
boundary before it is paused with SIGSTOP."""
FAILURES_TO_SAY = 2
"""Failed exchanges in a row (no answer) before a rank says it cannot tell an agent."""
JOIN_GRACE_S = 10.0
"""How long an agent may refuse a rank's reports before the rank says so: ranks start seconds
apart, and an agent refuses reports into a group until its own rank has joined."""
STOP_ACK_TIMEOUT_S = 3.0
"""How long a rank whose Mac stops the gang waits for every reachable rank to apply the stop
before ending its own command: a peer whose collective broke first would exit with its own code,
not the thermal stop's."""


def this_host() -> str:
    """This Mac's name as members show it (the short host name, at most 64 characters)."""
    return (socket.gethostname().split(".")[0] or "localhost")[:64]


@dataclass(frozen=True)
class Target:
    """One agent this rank reports to: its own (`local`) or a peer's; `problem` when it cannot
    even be tried (no trusted key for that Mac)."""

    name: str
    address: str
    server_key: str | None
    local: bool = False
    problem: str | None = None


def local_target() -> Target | None:
    """This Mac's agent, when one runs (its state file says where)."""
    daemon = find_daemon()
    if daemon is None:
        return None
    address = daemon.endpoint.removeprefix("tcp://")
    return Target("this Mac's agent", address, daemon.public_key, local=True)


def targets(identity: GangIdentity, default_port: int) -> list[Target]:
    """This Mac's agent (when one runs) and every peer Mac's, each found through the trust
    store's --peer entries; a peer without one is a Target with its problem."""
    found = [target for target in (local_target(),) if target is not None]
    for peer in identity.peers:  # HOST or HOST:PORT (--rank-hosts): the port is the agent's
        host, port = split_peer(peer)
        address = f"[{host}]" if ":" in host else host
        entry = peer_key(host, port=port)
        if entry is None:
            why = f"no trusted agent key for it: `agent keys trust KEY --peer {peer}`"
            found.append(Target(peer, f"{address}:{port or default_port}", None, problem=why))
            continue
        port = port or split_peer(entry.peer or peer)[1] or default_port
        found.append(Target(peer, f"{address}:{port}", entry.key))
    return found


def group_holder(group: str, rank: int) -> str | None:
    """The job on this Mac that already is rank `rank` of `group`, as its agent lists it (None:
    no agent answers, or none is)."""
    daemon = find_daemon()
    if daemon is None:
        return None
    keypair = own_keypair() if daemon.public_key else None
    address = daemon.endpoint.removeprefix("tcp://")
    try:
        with AgentClient(
            zmq.Context.instance(), address, daemon.public_key, keypair, 2.0
        ) as client:
            client.connect()
            jobs = client.request("info")["jobs"]
    except HostError:
        return None
    for job in jobs:
        gang = job.get("gang")
        if gang and (gang["group"], gang["rank"]) == (group, rank) and job["state"] != "exited":
            return str(job["job"])
    return None


News = Callable[[list[MemberState], str, str | None], None]
"""Called from a channel's thread: the members one agent holds, the agent's name, and None
when it answered, else why it did not."""


class Channel:
    """One agent, on a thread of its own (a peer that does not answer never delays another):
    it sends this rank's report when the report changes or `every_s` passes, and hands what
    the agent answers to `news`."""

    def __init__(
        self,
        target: Target,
        identity: GangIdentity,
        every_s: float,
        news: News,
        connect_timeout: float,
    ) -> None:
        self.target, self.identity, self.every_s = target, identity, every_s
        self.news, self.connect_timeout = news, connect_timeout
        self.report: MemberState | None = None
        self._sent: MemberState | None = None
        self._failures = 0
        self._refused_since: float | None = None
        self._wake = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=f"gang-{target.name}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def tell(self, report: MemberState, at_once: bool) -> None:
        with self._wake:
            self.report = report
            if at_once:
                self._wake.notify()

    def shut(self) -> None:
        """Send the last report if it was not yet, then end; join() waits for that."""
        with self._wake:
            self._closed = True
            self._wake.notify()

    def join(self) -> None:
        if self._thread.is_alive():
            self._thread.join(timeout=REQUEST_TIMEOUT_S + self.connect_timeout)

    def _run(self) -> None:
        if self.target.problem is not None:
            self.news([], self.target.name, self.target.problem)
            return
        ctx = zmq.Context.instance()
        client: AgentClient | None = None
        keypair = own_keypair() if self.target.server_key else None
        try:
            while True:
                with self._wake:
                    report = self.report
                    if self._closed and report is self._sent:
                        return  # closing sends the last report first: a stop's ack
                if report is not None:
                    client = self._exchange(ctx, client, keypair, report)
                    self._sent = report
                with self._wake:
                    if not self._closed and self.report is report:
                        self._wake.wait(self.every_s)
        finally:
            if client is not None:
                client.close()

    def _exchange(
        self,
        ctx: zmq.Context,
        client: AgentClient | None,
        keypair: Keypair | None,
        report: MemberState,
    ) -> AgentClient | None:
        """One report sent and the agent's answer handed on; the client to use next time
        (None after a failure: the next exchange connects again)."""
        if client is None and self.target.local:
            self.target = local_target() or self.target  # a restarted agent may serve elsewhere
        try:
            if client is None:
                client = AgentClient(
                    ctx, self.target.address, self.target.server_key, keypair, self.connect_timeout
                )
                client.connect()
            body = {"gang": self.identity.to_wire(), "member": report.to_wire(time.monotonic())}
            reply = client.request("gang.state", body, timeout=REQUEST_TIMEOUT_S)
        except AgentError as exc:  # it answers, and refuses: most often its rank is starting
            self._refused_since = self._refused_since or time.monotonic()
            if time.monotonic() - self._refused_since >= JOIN_GRACE_S:
                self.news([], self.target.name, str(exc))
            return client
        except (HostError, zmq.ZMQError) as exc:
            if client is not None:
                client.close()
            self._failures += 1
            if self._failures >= FAILURES_TO_SAY:
                self.news([], self.target.name, str(exc))
            return None
        self._failures, self._refused_since = 0, None
        if reply["group"] != self.identity.group:
            self.news([], self.target.name, f"it answered for group {reply['group']!r}")
            return client
        now = time.monotonic()
        members = [
            MemberState.from_wire(m, now)
            for m in reply["members"]
            if m["rank"] != self.identity.rank and m["rank"] < self.identity.world
        ]  # a rank outside the job is no member: a broken or hostile agent's
        self.news(members, self.target.name, None)
        return client


def relays(target: Target, identity: GangIdentity) -> bool:
    """Whether `target` is an agent this rank hears its peers through, asked every
    LOCAL_EVERY_S: its own, and under JACCL (whose variables name rank 0's host alone) rank 0's,
    which every rank reports to. Rank 0's agent is then the one relay between the others."""
    return target.local or identity.backend == JACCL


class GangRank:
    """The gang as this rank sees it: every member's last report, what was done to this rank,
    and the channels to the agents. The supervisor calls observe() on its own thread with each
    poll and each piece of news; the channels put news on the supervisor's queue."""

    def __init__(
        self,
        identity: GangIdentity,
        job: str,
        poll_interval: float,
        post: Callable[[tuple[list[MemberState], str, str | None]], None],
        default_port: int,
        connect_timeout: float = 2.0,
    ) -> None:
        self.identity, self.job, self.host = identity, job, this_host()
        self.hold_s = PEER_HOLD_POLLS * poll_interval
        self.stop_ack_s = max(STOP_ACK_TIMEOUT_S, 3 * poll_interval)
        """How long a stopped rank waits for every rank to apply the stop: a relayed report
        may take a poll or two to come round."""
        self.members: dict[int, MemberState] = {}
        self.enforced = Enforced()
        self.unreachable: dict[str, str] = {}
        self.silent: tuple[int, ...] = ()
        self.channels = [
            Channel(
                target,
                identity,
                LOCAL_EVERY_S if relays(target, identity) else poll_interval,
                lambda members, name, problem: post((members, name, problem)),
                connect_timeout,
            )  # fmt: skip
            for target in targets(identity, default_port)
        ]

    def start(self) -> None:
        for channel in self.channels:
            channel.start()

    def close(self) -> None:
        for channel in self.channels:
            channel.shut()
        for channel in self.channels:
            channel.join()

    def own(
        self,
        state: CoolingState,
        celsius: float | None,
        source: str,
        sensor: str | None,
        pace: tuple[float, float] | None = None,
    ) -> None:
        """This Mac's wish after a poll (with its duty and slice while it asks for pace): sent
        at once when the state changed."""
        before = self.members.get(self.identity.rank)
        duty, slice_s = pace or (None, None)
        report = MemberState(
            self.identity.rank, self.host, state, self._applied(), celsius, source, sensor,
            time.time(), self.job, heard=time.monotonic(), duty=duty, slice_s=slice_s,
        )  # fmt: skip
        self.members[self.identity.rank] = report
        self._tell(report, at_once=before is None or before.state is not state)

    def hear(self, members: list[MemberState]) -> None:
        self.members = merge(self.members, members)

    def reachability(self, name: str, problem: str | None) -> str | None:
        """What to say when an agent stops or starts answering (None: no change)."""
        before = self.unreachable.get(name)
        if problem is None:
            if before is None:
                return None
            del self.unreachable[name]
            return f"{name} answers again: the gang is told again"
        self.unreachable[name] = problem
        if before is not None:
            return None
        return f"cannot tell {name} ({problem}): this rank protects itself alone meanwhile"

    def decide(self) -> tuple[Verdict, tuple[Action, ...], list[str]]:
        """The verdict over every report that counts, the actions that bring this rank there
        (a change of what was done is reported at once), and what to say of ranks that fell
        silent."""
        decided = verdict(self.members, time.monotonic(), self.hold_s)
        notes = []
        newly = sorted(set(decided.silent) - set(self.silent))
        self.silent = decided.silent
        if newly:
            ranks = ", ".join(str(rank) for rank in newly)
            notes.append(
                f"rank {ranks} silent for {PEER_HOLD_POLLS} polls: its last report no longer "
                "holds the gang"
            )
        self.enforced, actions = steer(self.enforced, decided.state)
        if actions and (own := self.members.get(self.identity.rank)) is not None:
            report = replace(own, applied=self._applied(), time=time.time(), heard=time.monotonic())
            self.members[self.identity.rank] = report
            self._tell(report, at_once=True)
        return decided, actions, notes

    def reason(self, action: Action, decided: Verdict) -> str:
        return gang_reason(
            action, self.identity.world, decided.cause, self.identity.rank, self.untold(decided)
        )

    def untold(self, decided: Verdict) -> dict[int, str]:
        """The ranks whose reports do not reach this rank (never heard, or silent past the
        hold), each with why: what its agent's channel said, when it said something."""
        heard = {rank for rank in self.members if rank not in decided.silent}
        hosts = self.identity.hosts
        untold = {}
        for rank in range(self.identity.world):
            if rank in heard:
                continue
            problem = self.unreachable.get(hosts[rank]) if hosts[rank] else None
            state = "silent" if rank in decided.silent else "never heard"
            untold[rank] = f"{hosts[rank] or '?'}: {state}" + (f", {problem}" if problem else "")
        return untold

    def stop_applied_everywhere(self) -> bool:
        """Every member that reports applies the stop (or was never heard from)."""
        return all(m.applied is CoolingState.STOP for m in self.members.values())

    def _applied(self) -> CoolingState:
        if self.enforced.stopped:
            return CoolingState.STOP
        if self.enforced.paused:
            return CoolingState.PAUSE
        if self.enforced.paced:
            return CoolingState.PACE
        return CoolingState.REDUCE_BATCH if self.enforced.reduced else CoolingState.OK

    def _tell(self, report: MemberState, at_once: bool) -> None:
        for channel in self.channels:
            channel.tell(report, at_once)
