"""A model staged across the fleet (docs/staging.md): the origin prepares it once (a host that
downloads or holds it, or an agent this coordinator starts on its own copy), then the copies
fan out agent to agent along shared.staging.tree, each host that finishes serving the next.
The coordinator moves no byte: it asks (`stage.prepare`, `stage.fetch`, `stage.cancel`), polls
each host's task (`stage.status`) and re-plans around a host that fails or is lost. Protocol:
docs/protocol.md §19."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import zmq

from coordinator.hosts.link import Settings, Target
from coordinator.runs.host_worker import (
    INVALID_REPLY,
    LOST,
    RECONNECTED,
    REFUSED,
    REPLY,
    UNREACHABLE,
    HostReport,
    HostWorker,
)
from shared.staging.tree import Copy, Tree, TreeError

ORIGIN = "origin"
"""The tree's name for an origin that is no host of the stage (this coordinator's copy)."""
MAX_ATTEMPTS = 3
"""Fetches a host is given (each from whichever sender the tree names) before it is failed."""
LIST_TIMEOUT_S = 600.0
"""models.list hashes again a file whose size or mtime changed: a large model takes minutes."""
CANCEL_WAIT_S = 3.0
RETRY_S = 1.0
"""After a receiver answered with an earlier fetch that still runs, how long before ours is
asked again (its cancel takes effect meanwhile)."""
POLL_S = 0.25
"""How often each host is asked how its task goes: a finished host serves the next within it."""
BAD_INPUT = frozenset({"bad-model", "bad-store", "no-space", "bad-body"})
"""Refusals that are the operator's input (exit 2), not a host's failure."""
REFUSALS = BAD_INPUT | {"mismatch", "busy", "untrusted-peer"}
"""A fetch refused for these is not tried again from another sender: the host says why."""

# What a host's row says at the end.
STAGED, HELD, FAILED, LOST_HOST, MISMATCH, WAITING, CANCELLED, REFUSED_HOST = (
    "staged",
    "held",
    "failed",
    "lost",
    "mismatch",
    "not staged",
    "cancelled",
    "refused",
)


class StageRefused(Exception):
    """Bad input found before any byte moved (an unknown model or revision, a host without room
    or with an unusable store): one line per problem, exit 2."""

    def __init__(self, lines: list[str]) -> None:
        super().__init__("; ".join(lines))
        self.lines = lines


@dataclass(frozen=True)
class Origin:
    """Where the model is prepared: `target` (a host of the stage when `is_host`), the
    `stage.prepare` body, and its command socket's HOST:PORT as a receiver reaches it."""

    target: Target
    prepare: dict[str, Any]
    is_host: bool
    address_for: Callable[[Target], str]


@dataclass
class HostRow:
    """One host's stage, as the report shows it."""

    host: str
    state: str = WAITING
    source: str | None = None
    bytes: int = 0
    total: int | None = None
    resumed: int = 0
    rate: float | None = None
    seconds: float | None = None
    attempts: int = 0
    error: str | None = None
    code: str | None = None
    """The agent's error code of a refusal."""

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class StageResult:
    model: str
    revision: str | None
    digest: str | None
    size: int | None
    origin: str
    rows: list[HostRow]
    interrupted: bool = False
    seconds: float = 0.0
    """The whole stage: the origin's preparation, the hosts' listing and the tree."""
    fan_out_s: float | None = None
    """The tree alone (None: it never began)."""

    @property
    def ok(self) -> bool:
        return not self.interrupted and all(row.state in (STAGED, HELD) for row in self.rows)

    @property
    def bad_input(self) -> list[str]:
        """Each host refused for the operator's input (no room, an unusable store): one line."""
        return [
            f"{row.host}: {row.error}"
            for row in self.rows
            if row.state == REFUSED_HOST and row.code in BAD_INPUT
        ]

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "revision": self.revision,
            "digest": self.digest,
            "size": self.size,
            "origin": self.origin,
            "interrupted": self.interrupted,
            "seconds": round(self.seconds, 3),
            "fan_out_s": None if self.fan_out_s is None else round(self.fan_out_s, 3),
            "hosts": [row.to_dict() for row in self.rows],
        }


@dataclass(frozen=True)
class StageEvent:
    """What the progress display hears: `kind` is `prepare` (the origin's task), `fetch` (a
    host's task), `line` (one line to print: a failure, a loss), `done` (a host finished)."""

    kind: str
    host: str
    task: dict[str, Any] | None = None
    line: str | None = None


def model_task(body: dict[str, Any], name: str) -> dict[str, Any] | None:
    """The task of model `name` in a stage.status reply (or the task a stage.* reply is)."""
    if "tasks" not in body:
        return body if body.get("model") == name else None
    return next((task for task in body["tasks"] if task["model"] == name), None)


class StageSetup:
    """A stage's hosts asked through a worker each, and what comes before any byte moves: the
    origin prepares the model, the hosts say what they hold, the receivers whether they can
    take it."""

    def __init__(
        self,
        model: str,
        name: str,
        hosts: list[Target],
        origin: Origin,
        settings: Settings,
        watch: Callable[[StageEvent], None],
        restage: bool = False,
    ) -> None:
        self.model, self.name, self.hosts, self.origin = model, name, hosts, origin
        self.settings, self.watch, self.restage = settings, watch, restage
        self.by_name = {target.name: target for target in hosts}
        self.rows = {target.name: HostRow(target.name) for target in hosts}
        self.reports: queue.Queue[HostReport] = queue.Queue()
        self.stop = threading.Event()
        self.ctx = zmq.Context()
        self.workers: dict[str, HostWorker] = {}
        self.task: dict[str, Any] = {}
        """The origin's ready task: revision, digest, total."""
        self.tree: Tree | None = None
        self.fetching: dict[str, Copy] = {}
        """Receiver → the copy it was asked to fetch and acknowledged."""
        self.asked: dict[str, Copy] = {}
        """Receiver → a copy asked whose reply has not come yet."""
        self.fan_out_s: float | None = None
        """Seconds from the first copy asked to the last one's end: the tree's own time."""
        self.stash: list[HostReport] = []
        """What the hosts said while the origin prepared the model, for _holders."""
        self.pending: list[tuple[Copy, float]] = []
        """Copies planned but not asked yet, each with the time it may be asked (_ask_due)."""
        self.unreachable: set[str] = set()
        """Hosts not answering now (not lost yet): no copy is asked from them."""
        self.cancels: dict[str, int] = {}
        """Receiver → earlier fetches of its cancelled (_still_fetching)."""
        try:
            Tree.start(ORIGIN, [target.name for target in hosts])
        except TreeError as exc:
            raise StageRefused([str(exc)]) from None

    def _next(self, timeout: float = 0.5) -> HostReport | None:
        try:
            return self.reports.get(timeout=timeout)
        except queue.Empty:
            return None

    def _line(self, host: str, text: str) -> None:
        self.watch(StageEvent("line", host, line=text))

    def _lose(self, host: str, error: str | None) -> None:
        row = self.rows[host]
        row.state, row.error = LOST_HOST, f"unreachable: {error}"
        self._line(host, row.error)

    def _fail(self, host: str, error: str) -> None:
        row = self.rows[host]
        row.state, row.error = FAILED, error
        self._line(host, error)

    # --- 1. the origin prepares the model once ---------------------------------------------

    def _prepare(self) -> None:
        origin = self.origin.target.name
        worker = self.workers[origin]
        worker.ask("stage.prepare", self.origin.prepare, tag="prepare")
        asked = True
        while True:
            report = self._next()
            if report is None:
                continue
            if report.host != origin or report.request == "models.list":
                self.stash.append(report)  # what the hosts hold: _holders reads it
                continue
            if report.kind == REFUSED:
                raise StageRefused([f"{origin}: {report.error}"])
            if report.kind == LOST:
                raise StageRefused([f"{origin}: unreachable: {report.error}"])
            if report.kind == UNREACHABLE:
                self._line(origin, f"unreachable ({report.error}); reconnecting")
                continue
            if report.kind != REPLY:
                continue
            if asked:
                asked = False
                worker.poll = ("stage.status", {"model": self.name})
            task = model_task(report.body or {}, self.name)
            if task is None and report.request == "stage.status":  # lost: no poll brings it back
                raise StageRefused([f"{origin}: its task of {self.name} is gone (restarted?)"])
            if task is None:
                continue
            self.watch(StageEvent("prepare", origin, task))
            if task["state"] == "ready":
                if task["digest"] is None or task["revision"] is None or task["total"] is None:
                    raise StageRefused([f"{origin}: its ready task names no digest"])
                self.task = task
                worker.poll = None
                for row in self.rows.values():
                    row.total = task["total"]
                return
            if task["state"] in ("failed", "cancelled"):
                raise StageRefused([f"{origin}: {task['error'] or task['state']}"])

    # --- 2. who holds it already, and who may take it --------------------------------------

    def _holders(self) -> set[str]:
        """Hosts holding this digest whole (a stage run again resumes from them); a host holding
        another copy of the revision is `mismatch` (left alone unless restage)."""
        waiting = set(self.rows)
        holders: set[str] = set()
        while waiting:
            report = self.stash.pop(0) if self.stash else self._next()
            if report is None or report.host not in waiting:
                continue
            if report.kind in (UNREACHABLE, LOST):
                self._lose(report.host, report.error)
                waiting.discard(report.host)
                continue
            if report.kind == REFUSED:
                self._fail(
                    report.host,
                    "its agent predates staging (no models.list): update it"
                    if report.code == "unknown-type"
                    else report.error or "models.list refused",
                )
                waiting.discard(report.host)
                continue
            if report.kind != REPLY or report.request != "models.list":
                continue
            waiting.discard(report.host)
            held = [
                model
                for model in (report.body or {}).get("models", [])
                if model["model"] == self.name and model["revision"] == self.task["revision"]
            ]
            if not held:
                continue
            copy = held[0]
            row = self.rows[report.host]
            if copy["state"] == "present" and copy["digest"] == self.task["digest"]:
                holders.add(report.host)
                row.state, row.bytes = HELD, copy["bytes"]
            elif (
                copy["state"] == "mismatch"
                or (
                    copy["state"] == "present" and copy["digest"] not in (None, self.task["digest"])
                )
            ) and not self.restage:
                row.state = MISMATCH
                row.error = (
                    f"its copy differs ({copy['error'] or 'another digest'}): --restage replaces it"
                )
                self._line(report.host, row.error)
        if self.origin.is_host and self.origin.target.name in self.rows:
            holders.add(self.origin.target.name)
            self.rows[self.origin.target.name].state = HELD
        return holders

    def _fetch_body(self, copy: Copy) -> dict[str, Any]:
        sender = self.origin.target if copy.sender == ORIGIN else self.by_name[copy.sender]
        receiver = self.by_name[copy.receiver]
        address = (
            self.origin.address_for(receiver)
            if sender is self.origin.target and not self.origin.is_host
            else sender.address
        )
        return {
            "model": self.model,
            "revision": self.task["revision"],
            "digest": self.task["digest"],
            "size": self.task["total"],
            "source": address,
            "source_key": sender.server_key,
            "restage": self.restage,
        }


class StageRun(StageSetup):
    """Stage `model` (`ORG/NAME[@REV]`, its repository `name`) from `origin` to `hosts`;
    `watch` hears every StageEvent. run() returns the result or raises StageRefused."""

    # --- the run ---------------------------------------------------------------------------

    def run(self) -> StageResult:
        began = time.monotonic()
        origin_name = self.origin.target.name
        interrupted = False
        try:
            for target in [*self.hosts, *([] if self.origin.is_host else [self.origin.target])]:
                worker = HostWorker(
                    self.ctx, target, self.settings, self.reports, self.stop, POLL_S
                )
                self.workers[target.name] = worker
                worker.start()
            for name in self.rows:  # asked while the origin prepares the model
                self.workers[name].ask("models.list", {}, tag="list", timeout=LIST_TIMEOUT_S)
            self._prepare()
            self._fan_out(self._holders())
        except KeyboardInterrupt:
            interrupted = True
            self._cancel_fetches()
        finally:
            self.stop.set()
            for worker in self.workers.values():
                worker.join(timeout=1.0)
            self.ctx.destroy(linger=0)
        return StageResult(
            self.model,
            self.task.get("revision"),
            self.task.get("digest"),
            self.task.get("total"),
            origin_name,
            list(self.rows.values()),
            interrupted,
            time.monotonic() - began,
            self.fan_out_s,
        )

    # --- 3. the tree -----------------------------------------------------------------------

    def _fan_out(self, holders: set[str]) -> None:
        names = [name for name, row in self.rows.items() if row.state in (WAITING, HELD)]
        origin = ORIGIN if not self.origin.is_host else self.origin.target.name + " (origin)"
        tree = Tree.start(origin, names, holders=holders & set(names))
        began = time.monotonic()
        while not tree.done:
            started = []
            for copy in tree.next_copies():
                if copy.sender == origin and self.origin.is_host:
                    tree = tree.fail(copy.receiver)
                    self._fail(copy.receiver, "no host holds the model any more")
                else:
                    started.append(copy)
            tree = tree.begin(started)
            self.pending += [(copy, 0.0) for copy in started]
            self.tree = tree
            report = self._next(POLL_S / 2)
            if report is not None:
                tree = self._heard(tree, report)
            self._ask_due(tree)
        self.fan_out_s = time.monotonic() - began

    def _ask_due(self, tree: Tree) -> None:
        """Ask each pending copy whose time has come: one still planned, whose sender answers
        (an unreachable one is waited for, or lost and re-planned), and, for a follower, whose
        seed has verified a chunk (so it has checked the manifest it then serves)."""
        now = time.monotonic()
        for copy, due in list(self.pending):
            sender = self.rows.get(copy.sender)
            if copy not in tree.running:
                self.pending.remove((copy, due))
            elif (
                now >= due
                and copy.sender not in self.unreachable
                and (not copy.follows or (sender is not None and sender.bytes > 0))
            ):
                self.pending.remove((copy, due))
                self._ask_fetch(copy)

    def _ask_fetch(self, copy: Copy) -> None:
        row = self.rows[copy.receiver]
        row.attempts += 1
        row.source = copy.sender
        self.asked[copy.receiver] = copy
        self.workers[copy.receiver].ask("stage.fetch", self._fetch_body(copy), tag=copy)

    def _still_fetching(self, copy: Copy, task: dict[str, Any]) -> bool:
        """The receiver answered our fetch with an earlier one that still runs (from another
        sender): it is cancelled and ours asked again in a moment, no attempt counted. After
        MAX_ATTEMPTS such answers that fetch is followed as ours (an agent that names another
        source whatever it is asked would be asked for ever; its digest is still checked)."""
        if task["source"] == self._fetch_body(copy)["source"] or task["state"] != "fetching":
            return False
        self.cancels[copy.receiver] = self.cancels.get(copy.receiver, 0) + 1
        if self.cancels[copy.receiver] > MAX_ATTEMPTS:
            return False
        self.workers[copy.receiver].ask("stage.cancel", {"model": self.name})
        self.rows[copy.receiver].attempts -= 1
        self.pending.append((copy, time.monotonic() + RETRY_S))
        return True

    def _heard(self, tree: Tree, report: HostReport) -> Tree:
        host = report.host
        if host not in self.rows:
            return tree
        if report.kind == UNREACHABLE:
            self.unreachable.add(host)
            self._line(host, f"unreachable ({report.error}); reconnecting")
            return tree
        if report.kind == RECONNECTED:
            self.unreachable.discard(host)
            self._line(host, "reconnected")
            return tree
        if report.kind == LOST:
            self._lose(host, report.error)
            for copy in tree.running:
                if copy.sender == host and copy.receiver in {**self.asked, **self.fetching}:
                    # its receivers take another source
                    self.workers[copy.receiver].ask("stage.cancel", {"model": self.name})
                    self.fetching.pop(copy.receiver, None)
                    self.asked.pop(copy.receiver, None)
            self.fetching.pop(host, None)
            self.asked.pop(host, None)
            return tree.fail(host)
        if report.kind == REFUSED and report.code == INVALID_REPLY:
            # a reply that failed its checks: the host is failed once, not asked again
            self.asked.pop(host, None)
            self.fetching.pop(host, None)
            self.workers[host].poll = None
            self._fail(host, report.error or INVALID_REPLY)
            return tree.fail(host)
        if report.kind == REFUSED and isinstance(report.tag, Copy):
            self.asked.pop(host, None)
            if report.code in REFUSALS:  # the host's own: refused before any byte moved
                row = self.rows[host]
                row.state, row.error, row.code = REFUSED_HOST, report.error, report.code
                if report.code not in BAD_INPUT:  # bad input is said once, at the end
                    self._line(host, report.error or "refused")
                return tree.fail(host)
            return self._failed_attempt(tree, report.tag, report.error or "refused")
        if report.kind != REPLY or report.body is None:
            return tree
        if isinstance(report.tag, Copy) and self.asked.get(host) == report.tag:
            del self.asked[host]
            if self._still_fetching(report.tag, report.body):
                return tree
            self.fetching[host] = report.tag
            self.workers[host].poll = ("stage.status", {"model": self.name})
        copy = self.fetching.get(host)
        task = model_task(report.body, self.name)
        if copy is None:
            return tree
        if task is None or task["digest"] != self.task["digest"]:
            if report.request != "stage.status":
                return tree
            # polled, and no task of ours: one the agent lost (it restarted), which no poll
            # brings back; asked again, the fetch resumes from what it verified
            del self.fetching[host]
            self.workers[host].poll = None
            gone = f"its fetch of {self.name} is gone (the agent restarted?)"
            return self._failed_attempt(tree, copy, gone)
        row = self.rows[host]
        row.bytes, row.resumed, row.rate = task["bytes"], task["resumed"], task["rate"]
        self.watch(StageEvent("fetch", host, task))
        if task["state"] == "ready":
            del self.fetching[host]
            self.workers[host].poll = None
            row.state = STAGED
            row.seconds = (task["finished"] or time.time()) - task["started"]  # the agent's
            row.error = None
            self.watch(StageEvent("done", host, task))
            return tree.finish(copy)
        if task["state"] in ("failed", "cancelled"):
            del self.fetching[host]
            self.workers[host].poll = None
            return self._failed_attempt(tree, copy, task["error"] or task["state"])
        return tree

    def _failed_attempt(self, tree: Tree, copy: Copy, error: str) -> Tree:
        """A fetch that failed is tried again from whichever sender the tree names, at most
        MAX_ATTEMPTS times; one whose sender has stopped answering is not counted (the sender
        is waited for, or lost and its receivers re-planned)."""
        row = self.rows[copy.receiver]
        row.error = f"from {copy.sender}: {error}"
        self._line(copy.receiver, row.error)
        if copy.sender in self.unreachable:
            row.attempts -= 1
        if row.attempts >= MAX_ATTEMPTS:
            row.state = FAILED
            return tree.fail(copy.receiver)
        return tree.drop(copy)

    def _cancel_fetches(self) -> None:
        """Ctrl-C: every fetch under way is cancelled (its verified chunks stay for the next
        stage, which resumes them) and given a moment to say so."""
        receivers = set(self.fetching) | set(self.asked)
        for host in receivers:
            self.workers[host].poll = None
            self.workers[host].ask("stage.cancel", {"model": self.name}, tag="cancel")
            self.rows[host].state = CANCELLED
        deadline = time.monotonic() + CANCEL_WAIT_S
        while receivers and time.monotonic() < deadline:
            report = self._next(0.1)
            if report is not None and report.tag == "cancel":
                receivers.discard(report.host)
