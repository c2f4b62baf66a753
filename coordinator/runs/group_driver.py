"""A distributed group in a fleet run: its members' agents each run the matrix as one rank
(bench.start's `group`, docs/protocol.md §17), and the group reports as one host.

One HostDriver per member, each on its own connection with its own reconnects and no-progress
bound, reports to this driver alone; it merges the members' records of each cell into the
group's (shared.reports.group_cells) and reports the group's events as a HostDriver would. The first
member that fails fails the group: every other member's job is cancelled (a rank whose peer is
gone cannot go on), the cell in flight is recorded failed with that member's reason, and the
cells already merged stay.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import zmq

from coordinator.hosts.link import Settings, Target
from coordinator.runs.driver import (
    CELL,
    COOLING,
    DONE,
    HOST_FAILED,
    HOST_OK,
    MACHINE,
    MODEL,
    PAUSE,
    PHASE,
    RECONNECTED,
    STARTED,
    THERMAL,
    UNREACHABLE,
    HostDriver,
    HostEvent,
    HostJob,
)
from shared.benchmark.matrix import MatrixError, planned_cells
from shared.benchmark.results import cell_record
from shared.distributed.group import BenchGroup, group_name
from shared.distributed.rank_env import Member
from shared.reports.group_cells import cause_first, merge_ranks, weights_of
from shared.safe_text import shown

DRAIN_S = 0.2


class MemberMisled(Exception):
    """A member sent what its rank cannot have: the group fails, naming it."""


@dataclass(frozen=True)
class GroupTarget:
    """Hosts that run each cell as one job, in rank order; `members` as their peers reach
    them (shared.distributed.rank_env.Member: the ring's addresses, JACCL's devices)."""

    hosts: tuple[Target, ...]
    members: tuple[Member, ...]
    backend: str
    """ring or jaccl: `auto` is resolved before the run (coordinator.group_check)."""
    sharding: str
    port: int
    stall_s: float
    """How long a rank's agent lets it write nothing while no coordinator asks anything before
    it ends the rank (bench.start's `group.stall_s`): a cut link leaves no rank waiting for
    ever."""
    job: str = field(default_factory=lambda: f"g-{os.urandom(6).hex()}")

    @property
    def name(self) -> str:
        return group_name([host.name for host in self.hosts])

    @property
    def address(self) -> str:
        """Its members' addresses, as the run store keeps how each host is reached."""
        return group_name([host.address for host in self.hosts])

    server_key = None

    def body(self, rank: int) -> dict[str, Any]:
        """bench.start's `group` for member `rank`."""
        return self._spec(rank).to_wire()

    def _spec(self, rank: int) -> BenchGroup:
        return BenchGroup(
            self.job, rank, self.members, self.backend, self.port, self.sharding, self.stall_s
        )

    def stored(self, jobs: Sequence[str | None]) -> dict[str, Any]:
        """What the run store keeps of the group (from_stored's input), with each member's job
        id (rank order; None where none started), so `coordinator resume` and `cancel` can reach
        every rank's job."""
        return {
            "group": self.body(0),
            "hosts": [
                {"name": host.name, "address": host.address, "server_key": host.server_key,
                 "job": job}
                for host, job in zip(self.hosts, jobs, strict=True)
            ],
        }  # fmt: skip

    @classmethod
    def from_stored(cls, stored: dict[str, Any]) -> tuple[GroupTarget, list[str | None]]:
        """The group a run stored, and its members' job ids; ValueError (Invalid) for a stored
        group that is not one."""
        spec = BenchGroup.from_wire(stored["group"])
        hosts = tuple(
            Target(host["name"], host["address"], host["server_key"]) for host in stored["hosts"]
        )
        if len(hosts) != len(spec.members):
            raise ValueError(f"{len(hosts)} hosts stored for {len(spec.members)} members")
        group = cls(
            hosts, spec.members, spec.backend, spec.sharding, spec.port, spec.stall_s, spec.job
        )
        return group, [host["job"] for host in stored["hosts"]]


@dataclass(frozen=True)
class Resumed:
    """What a stored run already holds of a group: its members' jobs (rank order), the cells
    merged and the models reported."""

    jobs: Sequence[str | None] = ()
    merged: frozenset[int] = frozenset()
    models: frozenset[tuple[Any, Any]] = frozenset()

    @property
    def id(self) -> str | None:
        """Rank 0's job: the group's, as the run store names it."""
        return self.jobs[0] if self.jobs else None

    def job(self, rank: int) -> HostJob:
        """Member `rank`'s job, followed from the first cell the group lacks."""
        if not self.jobs or self.jobs[rank] is None:
            return HostJob()
        return HostJob(self.jobs[rank], set(self.merged))


@dataclass
class _Member:
    rank: int
    job: HostJob
    models: list[dict[str, Any]] = field(default_factory=list)
    done: tuple[str, str | None] | None = None
    unreachable: bool = False


class GroupDriver:
    """Runs `spec` on a group until every member's job has ended; run() always ends with
    exactly one DONE for the group, as HostDriver.run does for a host."""

    def __init__(
        self,
        ctx: zmq.Context,
        group: GroupTarget,
        spec: dict[str, Any],
        settings: Settings,
        emit: Callable[[HostEvent], None],
        stop: threading.Event,
        check_tokens: int,
        after: Sequence[threading.Event] = (),
        resumed: Resumed | None = None,
        netbench: Mapping[str, float] | None = None,
    ) -> None:
        self.ctx, self.group, self.spec, self.settings = ctx, group, spec, settings
        self.netbench = netbench
        """netbench's stored one-way seconds per link, for the straggler verdict."""
        self.emit, self.stop = emit, stop
        self.check_tokens = check_tokens
        self.after = after
        """Set as each run's earlier target sharing a member ends: the group starts after."""
        resumed = resumed or Resumed()
        self.members = {
            host.name: _Member(rank, resumed.job(rank)) for rank, host in enumerate(group.hosts)
        }
        self.names = [host.name for host in group.hosts]
        self.pending: dict[int, dict[int, dict[str, Any]]] = {}
        """Each cell index's records so far, by rank."""
        self.merged: set[int] = set(resumed.merged)
        self.models_reported: set[tuple[Any, Any]] = set(resumed.models)
        self._started = bool(resumed.jobs)
        self.failure: str | None = None
        self._members_stop = threading.Event()

    def run(self) -> None:
        for ended in self.after:
            while not ended.wait(DRAIN_S):
                if self.stop.is_set():
                    self._report(
                        DONE,
                        {"status": HOST_FAILED, "error": "interrupted before the group started"},
                    )
                    return
        events: queue.Queue[HostEvent] = queue.Queue()
        threads = []
        for rank, host in enumerate(self.group.hosts):
            extra = {"group": self.group.body(rank), "check_tokens": self.check_tokens}
            driver = HostDriver(
                self.ctx,
                host,
                self.spec,
                self.settings,
                events.put,
                self._members_stop,
                self.members[host.name].job,
                extra=extra,
            )
            thread = threading.Thread(target=driver.run, name=f"member {host.name}", daemon=True)
            threads.append(thread)
            thread.start()
        try:
            while not all(member.done for member in self.members.values()):
                if self.stop.is_set():
                    self._members_stop.set()
                try:
                    event = events.get(timeout=DRAIN_S)
                except queue.Empty:
                    continue
                self._heard(event)
            self.failure = self._failure()
            self._fail_in_flight()
        except MemberMisled as exc:
            self._members_stop.set()
            self.failure = str(exc)
        except Exception as exc:  # a bug fails the group, visibly, not the run
            self._members_stop.set()
            self.failure = f"coordinator error: {type(exc).__name__}: {exc}"
        status = HOST_OK if self.failure is None else HOST_FAILED
        self._report(DONE, {"status": status, "error": self.failure})

    def _report(self, kind: str, data: dict[str, Any]) -> None:
        self.emit(HostEvent(self.group.name, kind, data))

    def _heard(self, event: HostEvent) -> None:
        member = self.members[event.host]
        lead = member.rank == 0
        if event.kind == STARTED:
            self._member_started()
        elif event.kind in (MACHINE, THERMAL, PHASE) and lead:
            self._report(event.kind, event.data)
        elif event.kind == MODEL:
            member.models.append(event.data)
            self._model(event.data)
        elif event.kind in (COOLING, PAUSE):  # any rank's wait holds the group
            self._report(event.kind, event.data)
        elif event.kind == CELL:
            self._cell(member.rank, event.data["index"], event.data["record"])
        elif event.kind == UNREACHABLE:
            member.unreachable = True
            self._report(UNREACHABLE, {"error": f"{event.host}: {event.data['error']}"})
        elif event.kind == RECONNECTED:
            member.unreachable = False
            if not any(m.unreachable for m in self.members.values()):
                self._report(RECONNECTED, {})
        elif event.kind == DONE:
            member.done = (event.data["status"], event.data["error"])
            if member.done[0] != HOST_OK:
                self._members_stop.set()  # its peers cannot go on without it

    def _failure(self) -> str | None:
        """Once every member has ended: their failures, the cause first (a member lost or
        failing on its own, before one that lost its peer or was cancelled for it)."""
        failed = [
            (name, member.done[1] or member.done[0])
            for name, member in self.members.items()
            if member.done is not None and member.done[0] != HOST_OK
        ]
        return cause_first(failed) if failed else None

    def _member_started(self) -> None:
        """Once every member's job has started: the group's STARTED, rank 0's job and cells,
        with every member's job in `stored` (the run store keeps it for resume and cancel)."""
        jobs = [self.members[name].job.id for name in self.names]
        if self._started or None in jobs:
            return
        self._started = True
        cells = self.members[self.names[0]].job.cells or []
        stored = self.group.stored(jobs)
        self._report(STARTED, {"job": jobs[0], "cells": cells, "group": stored})

    def _model(self, info: dict[str, Any]) -> None:
        """Rank 0's info of a model once every rank has built it, with each rank's share in
        `ranks`: what one rank holds is not the model's size."""
        key = (info.get("model"), info.get("bits"))
        built = [_built(self.members[name].models, key) for name in self.names]
        if key in self.models_reported or any(each is None for each in built):
            return
        self.models_reported.add(key)
        shares = [
            {
                "host": name,
                "param_count": each.get("param_count"),
                "weight_memory_bytes": each.get("weight_memory_bytes"),
            }
            for name, each in zip(self.names, built, strict=True)
            if each is not None
        ]
        self._report(MODEL, {**built[0], "ranks": shares})  # type: ignore[dict-item]

    def _cell(self, rank: int, index: int, record: dict[str, Any]) -> None:
        """A member's record of cell `index`; one that says it is another rank's (or no
        rank's) fails the group: its figures cannot be placed."""
        claimed = record.get("rank") or {}
        name = self.names[rank]
        if claimed.get("rank") != rank or claimed.get("host") != name:
            said = f"rank {claimed.get('rank')} ({shown(str(claimed.get('host')))})"
            raise MemberMisled(f"{name}: its record of cell {index} is {said}'s, not rank {rank}'s")
        ranks = self.pending.setdefault(index, {})
        ranks[rank] = record
        if len(ranks) == len(self.names):
            self._merge(index)

    def _merge(self, index: int) -> None:
        ranks = self.pending.pop(index)
        records = [ranks[rank] for rank in range(len(self.names))]
        weights = [
            weights_of(self.members[name].models, records[rank])
            for rank, name in enumerate(self.names)
        ]
        merged = merge_ranks(
            records, self.names, weights, self.group.backend, self.group.sharding, self.netbench
        )
        self.merged.add(index)
        self._report(CELL, {"index": index, "record": merged})

    def _fail_in_flight(self) -> None:
        """Once every member has ended, for a failed group: the cell in flight (the first some
        ranks recorded and others never will; else the first none recorded) is the group's
        failed cell, with the reason, what the ranks that did record it measured kept in
        `ranks`, a rank that never recorded it failed with its member's own error. The cells
        after it were never run, as on a failed host."""
        cells = self._planned()
        if self.failure is None or cells is None:
            return
        index = min(self.pending, default=None)
        if index is None:
            index = 0
            while index in self.merged:
                index += 1
        if index >= len(cells):
            return
        ranks = self.pending.setdefault(index, {})
        for rank, name in enumerate(self.names):
            done = self.members[name].done
            why = (done[1] or done[0]) if done is not None and done[0] != HOST_OK else None
            error = why or f"ended before this cell ({self.failure})"
            ranks.setdefault(rank, cell_record(cells[index], error=error))
        self._merge(index)

    def _planned(self) -> list[Any] | None:
        try:
            return planned_cells(self.spec)
        except (MatrixError, TypeError, KeyError, AttributeError):
            return None


def _built(models: list[dict[str, Any]], key: tuple[Any, Any]) -> dict[str, Any] | None:
    """The last info a member sent of the model `key` (model, bits), or None."""
    for info in reversed(models):
        if (info.get("model"), info.get("bits")) == key:
            return info
    return None
