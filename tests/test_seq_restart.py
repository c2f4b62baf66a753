"""No sample or event number is ever given twice by one history (docs/protocol.md §10, History;
issue 24): a real agent SIGKILLed 0.5 s, 2 s, 5 s and 15 s after it got ready, restarted on the
same data directory each time, watched live (a SUB on its telemetry socket) and through
history.get; its events come from policy.set and from job.event with its own key (one sent
without a number, one `agent run` recorded in its event log, one carrying a number another file
gave). Then the rule for a disk that refuses to set numbers aside, on a real full tmpfs."""

from __future__ import annotations

import logging
import os
import signal
import sqlite3
import time
from collections.abc import Iterator
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack
import pytest
import zmq

from agent.cooling.events import EventLog
from agent.daemon import history
from agent.daemon.history import TelemetryHistory
from agent.daemon.hub import TelemetryHub
from agent.daemon.storage import StorageHealth
from agent.daemon.throttle import LogThrottle
from agent.thermal import open_source
from shared.io.keys import own_keypair
from shared.io.transport import AgentClient
from shared.io.trust import trust
from shared.wire import protocol as p
from shared.wire.telemetry import Event, Sample
from tests.disk_support import fill, mounted_tmpfs
from tests.fleet_support import AgentPool, AgentProcess, connect, raw_dealer, subscriber

pytestmark = pytest.mark.timeout(300)

KILL_AFTER_S = (0.5, 2.0, 5.0, 15.0)
"""Each life is SIGKILLed this long after it got ready: before its first write of samples,
after a few, and well after."""
OPTIONS = ["--poll-interval", "0.1"]
"""Five samples before the first kill: fewer than one write of them (WRITE_EVERY)."""
HISTORY_EVERY_S = 1.0
"""How often a life's history is read while it runs (and once more just before its end)."""
DEADLINE_S = 90.0


@dataclass
class Ledger:
    """Every number the agent published or served, what it named, and who gave it when."""

    history: str | None = None
    named: dict[tuple[str, int], tuple[tuple[Any, ...], str]] = field(default_factory=dict)
    live: dict[int, dict[str, list[int]]] = field(default_factory=dict)
    """Per life, per kind, the numbers published, in the order they came."""

    def saw(self, kind: str, body: dict[str, Any], how: str, life: int) -> None:
        seq = body["seq"]
        assert seq is not None or kind == "event", f"a sample {how} without a number"
        if seq is None:  # an event the disk refused: no number given
            return
        identity = (
            (body["time"], body["celsius"])
            if kind == "sample"
            else (body["time"], body["action"], body["job"], body["pid"], body["detail"])
        )
        known = self.named.setdefault((kind, seq), (identity, f"{how} in life {life}"))
        assert known[0] == identity, (
            f"{kind} {seq} given twice: {known[0]} ({known[1]}), then {identity} "
            f"({how} in life {life})"
        )

    def receive(self, sub: zmq.Socket, life: int, timeout_ms: float, then_ms: float = 0) -> None:
        """What the SUB holds, waiting up to `timeout_ms` for the first message and `then_ms`
        for each next one."""
        while sub.poll(timeout_ms):
            message = p.decode_telemetry(sub.recv_multipart())
            kind = "sample" if message.type == "telemetry.sample" else "event"
            self.saw(kind, message.body, "published", life)
            if message.body["seq"] is not None:
                self.live.setdefault(life, {}).setdefault(kind, []).append(message.body["seq"])
            timeout_ms = then_ms

    def read_history(self, client: AgentClient, life: int) -> int:
        """Everything history.get serves, every page; returns how many samples."""
        cursors = {"samples_after": 0, "events_after": 0}
        served = 0
        while True:
            page = client.request("history.get", cursors | {"limit": 10000})
            if self.history is None:
                self.history = page["history"]
            assert page["history"] == self.history, "the same data directory, another history"
            for kind, items, cursor in (
                ("sample", page["samples"], "samples_after"),
                ("event", page["events"], "events_after"),
            ):
                for item in items:
                    self.saw(kind, item, "served", life)
                if items:
                    cursors[cursor] = items[-1]["seq"]
            served += len(page["samples"])
            if not page["truncated"]:
                return served

    def numbers(self, kind: str, lives: range) -> list[int]:
        return [n for life in lives for n in self.live.get(life, {}).get(kind, [])]


def job_event(action: str, job: str, **fields: Any) -> dict[str, Any]:
    """A job.event body, as `agent run` sends one."""
    return {
        "job": job,
        "pid": os.getpgrp(),  # a live process group: the agent never marks the job vanished
        "action": action,
        "time": time.time(),
        "celsius": None,
        "source": "sim",
        "simulated": True,
        "detail": None,
        "policy": None,
        "seq": None,
    } | fields


def own_socket(ctx: zmq.Context, agent: AgentProcess) -> zmq.Socket:
    """A DEALER holding the agent's own key, as `agent run`'s: the one job.event is taken from."""
    return raw_dealer(ctx, agent, own_keypair(agent.home / "keys"))


def send_job_event(sock: zmq.Socket, body: dict[str, Any]) -> None:
    envelope = {"v": p.PROTOCOL_VERSION, "id": p.new_id(), "type": "job.event", "re": None}
    sock.send(msgpack.packb(envelope | {"body": body}))
    assert sock.poll(30_000), "no reply to job.event"
    reply = p.decode(sock.recv())
    assert reply.type == "job.event.ok", reply


def make_events(agent: AgentProcess, client: AgentClient, ctx: zmq.Context, life: int) -> None:
    """A policy event, and three job events: one the agent numbers, one `agent run` recorded
    (its number is the log's), and one carrying number 1, which this log gave the first
    policy event: it must be numbered anew, not published under 1."""
    client.request("policy.set", {"policy": {"pause_temp": 80.0 + life}})
    own = own_socket(ctx, agent)
    try:
        job = f"job-{life}"
        send_job_event(own, job_event("start", job, detail="sleep 1"))
        with closing(EventLog(agent.home / "agent-events.sqlite")) as log:  # as agent run does
            recorded = log.record(Event.from_body(job_event("pause", job, celsius=86.0)))
        send_job_event(own, recorded.job_body())
        send_job_event(own, job_event("resume", job, detail="elsewhere", seq=1))
    finally:
        own.close()


def run_life(
    agents: AgentPool, home: Path, ctx: zmq.Context, ledger: Ledger, life: int, kill_after: float
) -> None:
    """Start the agent, make events, watch it until `kill_after` s after it got ready (its
    history read once more just before), SIGKILL it, and take what it published before."""
    agent = agents.start(f"life-{life}", thermal="sim", options=OPTIONS, home=home)
    ready = time.monotonic()
    if life == 0:
        trust(own_keypair().public, "test", directory=home / "keys" / "trusted")
    sub = subscriber(ctx, agent)
    client = connect(ctx, agent, timeout=10.0)
    try:
        make_events(agent, client, ctx, life)
        next_read = 0.0
        while (left := ready + kill_after - time.monotonic()) > 0:
            if time.monotonic() >= next_read:
                ledger.read_history(client, life)
                next_read = time.monotonic() + HISTORY_EVERY_S
            ledger.receive(sub, life, min(left, 0.05) * 1000)
        ledger.read_history(client, life)  # every number given so far, the unpublished too
        agent.kill()
        ledger.receive(sub, life, 500, 200)  # what it published before the end
    finally:
        client.close()
        sub.close()


@pytest.mark.slow
def test_no_number_is_given_twice_by_an_agent_killed_again_and_again(
    ctx: zmq.Context, agents: AgentPool, tmp_path: Path
) -> None:
    home = tmp_path / "agent-home"
    ledger = Ledger()
    for life, kill_after in enumerate(KILL_AFTER_S):
        run_life(agents, home, ctx, ledger, life, kill_after)
    last = len(KILL_AFTER_S)
    agent = agents.start(f"life-{last}", thermal="sim", options=OPTIONS, home=home)
    sub = subscriber(ctx, agent)
    client = connect(ctx, agent, timeout=10.0)
    make_events(agent, client, ctx, last)
    deadline = time.monotonic() + DEADLINE_S
    while len(ledger.numbers("sample", range(last, last + 1))) < 40:
        assert time.monotonic() < deadline, "the last life published too little in time"
        ledger.receive(sub, last, 100)
    assert ledger.read_history(client, last) > 0
    client.close()
    sub.close()
    agent.process.send_signal(signal.SIGTERM)
    assert agent.process.wait(timeout=30) == 0

    for kind in ("sample", "event"):  # numbers only grow: each life's past every earlier one's
        for life in range(1, last + 1):
            given = ledger.numbers(kind, range(life, life + 1))
            assert given == sorted(set(given)), f"life {life} published {kind}s out of order"
            before = ledger.numbers(kind, range(life))
            if given and before:
                assert given[0] > max(before), f"life {life} numbered {kind}s below earlier ones"
    for life, kill_after in enumerate(KILL_AFTER_S):
        if kill_after >= 2.0:
            assert ledger.numbers("sample", range(life, life + 1)), f"life {life} published none"
    for kind, table in (("sample", "agent-telemetry.sqlite"), ("event", "agent-events.sqlite")):
        stored = stored_rows(home / table, kind)  # what the files keep names what was given
        assert stored, f"no {kind} was written"
        for body in stored.values():
            ledger.saw(kind, body, "stored", last)
    events = {seq: named for (kind, seq), (named, _) in ledger.named.items() if kind == "event"}
    assert len(events) >= 4 * (last + 1), "each life's four events, numbered"
    elsewhere = [seq for seq, named in events.items() if named[4] == "elsewhere"]
    assert len(elsewhere) == last + 1 and 1 not in elsewhere, "a number from elsewhere was kept"


def stored_rows(path: Path, kind: str) -> dict[int, dict[str, Any]]:
    """Each row of the samples or events table, as the bodies ledger.saw reads."""
    columns = "seq, time, celsius" if kind == "sample" else "seq, time, action, job, pid, detail"
    table = "samples" if kind == "sample" else "events"
    with closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10)) as conn:
        conn.row_factory = sqlite3.Row
        rows = conn.execute(f"SELECT {columns} FROM {table} ORDER BY seq").fetchall()
    return {row["seq"]: dict(row) for row in rows}


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs, mounted for the test (root only), unmounted after."""
    with mounted_tmpfs(tmp_path / "small-disk", "size=4m,mode=0700") as mount:
        yield mount


def test_a_sample_no_number_can_be_set_aside_for_is_published_once_one_can(
    small_disk: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The disk full past the numbers set aside: samples are numbered up to the mark on disk
    and no further (a number past it could be given again after a crash), the rest are neither
    published nor served; once the disk takes a new mark they are numbered in order, published
    late, this poll's last, and a clean stop leaves no gap. A real hub on a real tmpfs; the
    reservation made small (40 numbers) so the test reaches its end in a few polls."""
    monkeypatch.setenv("MLX_FLEET_HOME", str(small_disk / "home"))
    monkeypatch.setattr(history, "RESERVED_SEQS", 40)
    monkeypatch.setattr(history, "RENEW_BELOW", 20)
    published: list[dict[str, Any]] = []
    hub = TelemetryHub(
        lambda type_, body: published.append(body) if type_ == "telemetry.sample" else None,
        3600.0,  # the monitor's thread takes none: the test takes each reading
        7.0,
        StorageHealth(LogThrottle(logging.getLogger("test"))),
        "host",
    )

    def take(count: int) -> None:
        assert hub.monitor is not None
        for _ in range(count):
            hub.monitor.read()
            hub.drain()

    try:
        hub.start(open_source("sim"))  # its first reading
        take(history.WRITE_EVERY - 1)  # one write: the disk holds the mark, 40
        filler = fill(small_disk)
        take(60)
        seqs = [body["seq"] for body in published]
        assert seqs == list(range(1, 41)), "a number past the mark on disk was given"
        served, _, _ = hub.history.page(0, 0, 0.0, 1000, 10**7)
        assert [s["seq"] for s in served] == seqs, "an unnumbered sample was served"
        assert "history" in (hub.storage.error or "")
        filler.unlink()
        take(1)
        seqs = [body["seq"] for body in published]
        assert seqs == list(range(1, 72)), "the waiting samples, numbered in order, then this"
        times = [body["time"] for body in published]
        assert times == sorted(times), "numbered out of the order they were taken"
        served, _, _ = hub.history.page(0, 0, 0.0, 1000, 10**7)
        assert [s["seq"] for s in served] == seqs
    finally:
        hub.close()
    events = EventLog(small_disk / "home" / "agent-events.sqlite")
    reopened = TelemetryHistory("host", events, small_disk / "home" / "agent-telemetry.sqlite")
    again = reopened.add_sample(Sample(time.time(), 70.0, None, "sim", True, "ok", None, 0.0, []))
    assert again.seq == 72, "a clean stop leaves no gap"
    reopened.close()
    events.close()
