"""What the agent daemon publishes, as pure functions: samples, events, the supervised jobs and
their pause time, history pages and the retention cutoff (docs/protocol.md §10-§12).

Nothing here reads a sensor, a socket, a clock or a disk, so every rule is tested directly and the
daemon (agent/daemon/loop.py) stays a thin shell around it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Generic, TypeVar

import msgpack

from agent.daemon.gang_mailbox import GangMailbox
from agent.power.base import PowerReading
from agent.sensors.base import SourceInfo
from agent.thermal import ThermalReading, trend_slope
from shared.cooling.clocks import ClockReading, sample_fields
from shared.cooling.policy import CoolingState
from shared.cooling.throttle import ThrottleVerdict, combined, job_work, work_verdict
from shared.wire import protocol as p
from shared.wire.agent_types import RUN_ACTIONS as shared_run_actions
from shared.wire.reply_types import MAX_HISTORY_ITEMS
from shared.wire.telemetry import Event, Sample

R = TypeVar("R")

TREND_WINDOW = 5
"""Temperatures in the trend (the seed's is_rising window), as `agent temp --watch` and the
samples show it: none before this many, as two readings a poll apart make noise a slope."""
EXITED_LINGER_S = 30.0
"""An exited job stays listed this long, so a dashboard sees it end."""
VANISHED_AFTER_S = 5.0
"""A `run` job whose process group has been gone this long without an exit event has exited:
its `agent run` died (its own exit event comes within about 2 s of the group's end)."""
HISTORY_LIMIT = 1000
HISTORY_MAX_LIMIT = MAX_HISTORY_ITEMS
HISTORY_PAGE_BYTES = p.MAX_ENVELOPE_SIZE // 2
"""A history.get page's samples and events hold up to this many packed bytes, half each."""
RUN_ACTIONS = frozenset(shared_run_actions)
"""The actions of an `agent run` job (shared.wire.telemetry.Event): what job.event may carry."""
MAX_JOB_ID_LENGTH = 64
MAX_SOURCE_LENGTH = 256
MAX_DETAIL_LENGTH = 16384
"""A command line as `start` names it, or a reason: longer ones are cut (every sample lists
the jobs' command lines, and must stay well within a message)."""
MAX_PID = 2**31 - 1

STATE_AFTER = {
    "pause": p.SUPERVISED_PAUSED,
    "resume": p.SUPERVISED_RUNNING,
    "stop": p.SUPERVISED_STOPPED,
    "kill": p.SUPERVISED_STOPPED,
    "exit": p.SUPERVISED_EXITED,
}
"""How an event's action changes its job's state; other actions leave it as it is."""


# --- readings and samples ---------------------------------------------------------------------


def trend_c_per_min(temperatures: list[float], poll_interval: float) -> float | None:
    """The least-squares slope of the last TREND_WINDOW temperatures, in °C per minute; None
    before there are that many."""
    if len(temperatures) < TREND_WINDOW:
        return None
    slope = trend_slope(temperatures[-TREND_WINDOW:])
    return None if slope is None else slope * 60.0 / poll_interval


@dataclass(frozen=True)
class Poll(Generic[R]):
    """What a source gave at a poll: its reading, or why there is none."""

    source: SourceInfo
    reading: R | None
    error: str | None = None


@dataclass(frozen=True)
class PowerPoll(Poll[PowerReading]):
    """What the power source gave at a poll."""

    def fields(self) -> dict[str, Any]:
        """A sample's power_w, energy_j and power (shared.wire.telemetry.Sample)."""
        reading = self.reading
        return {
            "power_w": reading.total_w if reading else None,
            "energy_j": reading.total_j if reading else None,
            "power": {
                "source": self.source.name,
                "simulated": self.source.simulated,
                "watts": dict(reading.watts) if reading else {},
                "joules": dict(reading.joules) if reading else {},
                "error": None if reading else self.error,
            },
        }


@dataclass(frozen=True)
class ClockPoll(Poll[ClockReading]):
    """What the clock source gave at a poll."""

    def fields(self) -> dict[str, Any]:
        """A sample's clock fields (shared.wire.telemetry.Sample, CLOCK_COLUMNS)."""
        return sample_fields(self.reading, self.source.name, self.source.simulated, self.error)


def sample(
    now: float,
    reading: ThermalReading | None,
    source: SourceInfo,
    state: CoolingState | None,
    trend: float | None,
    pause_s_total: float,
    jobs: list[dict[str, Any]],
    storage_error: str | None = None,
    power: PowerPoll | None = None,
    throttle: ThrottleVerdict | None = None,
    clocks: ClockPoll | None = None,
    started: float | None = None,
    duty: float | None = None,
) -> Sample:
    """The sample of one poll (not yet numbered); `now` stands in for the time when there is no
    reading. `power` is None when the agent has no power source; `throttle` is the throttle
    rule's verdict on this poll (shared.cooling.throttle; None: no verdict); `clocks` None when
    the agent reads none (its fields then stay nil); `started` when the agent started (its
    counters count from then); `duty` the pace tier's while the state is pace."""
    return Sample(
        time=reading.time if reading else now,
        celsius=reading.celsius if reading else None,
        pressure=reading.pressure if reading else None,
        source=source.name,
        simulated=source.simulated,
        state=state.value if state else None,
        trend_c_per_min=trend,
        pause_s_total=pause_s_total,
        jobs=jobs,
        storage_error=storage_error,
        sensor=reading.sensor if reading else None,
        **(power.fields() if power else {}),
        throttling=throttle.throttling if throttle else None,
        throttle_evidence=throttle.text if throttle else None,
        **(clocks.fields() if clocks else {}),
        started=started,
        duty=duty,
    )


# --- supervised jobs --------------------------------------------------------------------------


def run_event(body: Mapping[str, Any]) -> Event:
    """The event of a job.event body (its types already checked); ValueError naming what an
    `agent run` never sends: an unknown action, a policy, a pid, time or text out of range."""
    event = Event.from_body(body)
    if event.action not in RUN_ACTIONS:
        known = ", ".join(sorted(RUN_ACTIONS))
        raise ValueError(f"unknown action {event.action!r}; an agent run job's are {known}")
    if event.policy is not None:
        raise ValueError("policy must be nil: only the agent announces a policy")
    if not event.job or len(event.job) > MAX_JOB_ID_LENGTH:
        raise ValueError(f"job must be 1 to {MAX_JOB_ID_LENGTH} characters")
    if event.pid is None and event.action == "start":
        raise ValueError("a start needs the pid of the job's process group")
    if event.pid is not None and not 0 < event.pid <= MAX_PID:
        raise ValueError(f"pid {event.pid} is not a process id")
    if not math.isfinite(event.time) or event.time < 0:
        raise ValueError(f"time {event.time!r} is not a time")
    if event.celsius is not None and not math.isfinite(event.celsius):
        raise ValueError(f"celsius {event.celsius!r} is not a temperature")
    if not 0 < len(event.source) <= MAX_SOURCE_LENGTH:
        raise ValueError(f"source must be 1 to {MAX_SOURCE_LENGTH} characters")
    if event.seq is not None and not 0 < event.seq <= p.MAX_WIRE_INT:
        raise ValueError(f"seq {event.seq} is out of range")
    if event.detail is not None and len(event.detail) > MAX_DETAIL_LENGTH:
        event = replace(event, detail=event.detail[: MAX_DETAIL_LENGTH - 1] + "…")
    return event


@dataclass
class SupervisedJob:
    job: str
    pid: int
    command: str
    kind: str
    state: str = p.SUPERVISED_RUNNING
    paused_since: float | None = None
    exited_at: float | None = None
    gone_since: float | None = None
    work: dict[str, Any] | None = None
    """A `run` job's speed and throttle verdict as its `agent run` states it (§12)."""

    def to_wire(self) -> dict[str, Any]:
        entry = {
            "job": self.job,
            "pid": self.pid,
            "command": self.command,
            "state": self.state,
            "kind": self.kind,
        }
        return entry if self.work is None else entry | {"work": self.work}


class JobTable:
    """The supervised jobs, kept by their events, and the seconds they have spent paused."""

    def __init__(self) -> None:
        self.jobs: dict[str, SupervisedJob] = {}
        self.gangs = GangMailbox()
        self._paused_s = 0.0
        self._said_s = 0.0  # the most pause_s_total said: it never goes down

    def apply(self, event: Event, kind: str) -> None:
        """`start` lists the job (its detail is the command); the actions in STATE_AFTER move it;
        a pause's time is counted when it ends, whatever ends it."""
        if event.action == "start":
            self.jobs[event.job] = SupervisedJob(
                event.job, event.pid or 0, event.detail or "", kind
            )
            return
        entry = self.jobs.get(event.job)
        state = STATE_AFTER.get(event.action)
        if entry is None or state is None or entry.state == p.SUPERVISED_EXITED:
            return
        if entry.paused_since is not None and state != p.SUPERVISED_PAUSED:
            self._paused_s += max(0.0, event.time - entry.paused_since)
            entry.paused_since = None
        elif state == p.SUPERVISED_PAUSED and entry.paused_since is None:
            entry.paused_since = event.time
        entry.state = state
        if state == p.SUPERVISED_EXITED:
            entry.exited_at = event.time
            self.gangs.forget(entry.job)

    def live_pgids(self) -> tuple[int, ...]:
        """The process groups of the jobs not yet exited (what the thermal plant heats from);
        safe from another thread: the table is copied in one step."""
        jobs = self.jobs.copy().values()
        return tuple(job.pid for job in jobs if job.pid and job.state != p.SUPERVISED_EXITED)

    def pause_s_total(self, now: float) -> float:
        """Finished pauses plus the ones going on, every job counted; never less than it said
        before (a resume stamped by `agent run` before this poll's time would take back what
        the poll counted, and a counter that goes down reads as a restart)."""
        ongoing = sum(
            max(0.0, now - job.paused_since)
            for job in self.jobs.values()
            if job.paused_since is not None
        )
        self._said_s = max(self._said_s, self._paused_s + ongoing)
        return self._said_s

    def vanished(self, alive: Callable[[int], bool], now: float) -> list[Event]:
        """Exit events for `run` jobs whose process group (`alive(pgid)`) has been gone for
        VANISHED_AFTER_S without one (their `agent run` was killed, say): apply them to end
        their listing."""
        events = []
        for job in self.jobs.values():
            if job.kind != p.KIND_RUN or job.state == p.SUPERVISED_EXITED:
                continue
            if alive(job.pid):
                job.gone_since = None
            elif job.gone_since is None:
                job.gone_since = now
            elif now - job.gone_since >= VANISHED_AFTER_S:
                events.append(
                    Event(
                        time=now,
                        job=job.job,
                        pid=job.pid,
                        action="exit",
                        source="agent",
                        detail=f"process group {job.pid} is gone; "
                        "its agent run never said how it ended",
                    )
                )
        return events

    def expire(self, now: float) -> None:
        """Drop jobs that exited more than EXITED_LINGER_S ago."""
        for job in [
            j
            for j in self.jobs.values()
            if j.exited_at is not None and now - j.exited_at > EXITED_LINGER_S
        ]:
            del self.jobs[job.job]

    def read_work(self, stated: Callable[[str], object]) -> None:
        """Each unfinished `run` job's work as `stated(job)` gives it (its `agent run`'s state
        file), checked (shared.cooling.throttle.job_work): an unreadable one is no work."""
        for job in self.jobs.values():
            if job.kind == p.KIND_RUN and job.state != p.SUPERVISED_EXITED:
                job.work = job_work(stated(job.job))

    def throttle(self, clock: ThrottleVerdict) -> ThrottleVerdict:
        """The Mac's verdict: the GPU clock's (`clock`) with what the running jobs' work rates
        say, each of those labelled `job ID`."""
        jobs = (
            (f"job {job.job}", work_verdict(job.work))
            for job in self.jobs.values()
            if job.state == p.SUPERVISED_RUNNING
        )
        return combined([(None, clock), *jobs])

    def listed(self) -> list[dict[str, Any]]:
        """Each job's wire entry; a rank of a distributed job also lists its gang."""
        listed = []
        for job in self.jobs.values():
            entry = job.to_wire()
            if self.gangs.groups and (gang := self.gangs.of_job(job.job)) is not None:
                entry["gang"] = gang
            listed.append(entry)
        return listed


# --- history ----------------------------------------------------------------------------------


def retention_cutoff(now: float, retention_days: float) -> float:
    """Samples and events older than this are pruned."""
    return now - retention_days * 86400.0


def history_limit(requested: int | None) -> int:
    """The page size for history.get's `limit`; ValueError below 1."""
    if requested is None:
        return HISTORY_LIMIT
    if requested < 1:
        raise ValueError(f"limit must be >= 1, got {requested}")
    return min(requested, HISTORY_MAX_LIMIT)


def page_history(
    samples: list[dict[str, Any]], events: list[dict[str, Any]], limit: int, budget: int
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], bool]:
    """One history.get page from the sample and event bodies after their cursors, each in `seq`
    order and holding up to limit + 1 items (one more says that more remain): each list is cut at
    `limit` items or at half of `budget` packed bytes, whichever comes first; True when either
    was cut. Each list is complete up to its last item, so its cursor moves there."""
    kept_samples, more_samples = _cut(samples, limit, budget // 2)
    kept_events, more_events = _cut(events, limit, budget // 2)
    return kept_samples, kept_events, more_samples or more_events


def _cut(items: list[dict[str, Any]], limit: int, budget: int) -> tuple[list[dict[str, Any]], bool]:
    kept: list[dict[str, Any]] = []
    size = 0
    for item in items[:limit]:
        size += len(msgpack.packb(item))
        if kept and size > budget:
            return kept, True
        kept.append(item)
    return kept, len(items) > len(kept)
