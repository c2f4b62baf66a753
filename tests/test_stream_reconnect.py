"""A job stream that survives a reconnect (docs/protocol.md §6): a link reset between a real
coordinator and a real agent, an agent whose ROUTER flaps 50 times, a stream that loses a cell
and its bench.done, and the no-progress bound (a stuck job fails its host, a paused one does not).

Bounds: a run that loses its stream ends within the time its job needs plus RESUME_SLACK_S; a
stuck job fails within its allowance (shared.benchmark.progress) plus STUCK_SLACK_S.
"""

from __future__ import annotations

import json
import math
import selectors
import socket
import struct
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import zmq

from coordinator.hosts.link import Settings, Target
from coordinator.runs.driver import CELL, DONE, HOST_FAILED, HOST_OK, HostEvent
from coordinator.runs.fleet import run_fleet
from coordinator.runs.store import RunStore
from shared.benchmark.progress import MODEL_BUILD_TIMEOUTS, ProgressClock, no_progress_allowance
from tests.conftest import console_script, piped
from tests.fakes.flapping_agent import FlappingAgent
from tests.fleet_support import LONG, AgentPool, AgentProcess, cli, connect, count_rows

pytestmark = pytest.mark.timeout(180)

RESUME_SLACK_S = 30.0
"""A lost stream is noticed at once and followed by job.get twice a second: the run ends well
within its job's own time plus this (the bug this guards against took ~125 s, or for ever)."""
STUCK_SLACK_S = 15.0
"""The allowance is checked every FOLLOW_EVERY_S, once the stream's heartbeat turns (1 s)."""
BLACKOUT_S = 0.5
"""How long the proxy refuses connections after its reset."""
LINGER_RST = struct.pack("ii", 1, 0)
"""SO_LINGER on, 0 s: close() sends RST, as a link reset does."""


class ResettingProxy:
    """A TCP proxy on loopback in front of an agent; reset() aborts every connection (RST both
    ways) and refuses new ones (accepted, then RST) for BLACKOUT_S. One thread does all the
    socket work; reset() only asks it to."""

    def __init__(self, upstream: str) -> None:
        host, port = upstream.rsplit(":", 1)
        self.upstream = (host, int(port))
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.listener, selectors.EVENT_READ)
        self.peers: dict[socket.socket, socket.socket] = {}
        self.refused = 0
        self.resets = 0
        self._refuse_until = 0.0
        self._reset = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="proxy", daemon=True)
        self._thread.start()

    def reset(self) -> None:
        self._reset.set()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)
        for sock in [*self.peers, self.listener]:
            sock.close()

    def _abort(self, sock: socket.socket) -> None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, LINGER_RST)
        if sock.fileno() in self.selector.get_map():
            self.selector.unregister(sock)
        self.peers.pop(sock, None)
        sock.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            if self._reset.is_set():
                self._reset.clear()
                for sock in list(self.peers):
                    self._abort(sock)
                self._refuse_until = time.monotonic() + BLACKOUT_S
                self.resets += 1
            for key, _ in self.selector.select(0.02):
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                if sock is self.listener:
                    self._accept()
                elif sock in self.peers:
                    self._relay(sock)

    def _accept(self) -> None:
        client, _ = self.listener.accept()
        if time.monotonic() < self._refuse_until:
            self.refused += 1
            self._abort(client)
            return
        try:
            agent = socket.create_connection(self.upstream, timeout=5)
        except OSError:
            self._abort(client)
            return
        self.peers[client], self.peers[agent] = agent, client
        self.selector.register(client, selectors.EVENT_READ)
        self.selector.register(agent, selectors.EVENT_READ)

    def _relay(self, sock: socket.socket) -> None:
        peer = self.peers[sock]
        try:
            data = sock.recv(65536)
            if data:
                peer.sendall(data)
                return
        except OSError:
            pass
        self._abort(sock)
        self._abort(peer)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[RunStore]:
    with RunStore(tmp_path / "store.sqlite") as run_store:
        yield run_store


@pytest.fixture
def fake() -> Iterator[list[FlappingAgent]]:
    """Fake agents started by a test (append them), stopped after it."""
    started: list[FlappingAgent] = []
    yield started
    for agent in started:
        agent.stop()


@dataclass
class Seen:
    """A run's events, each with the time.monotonic() it reached the observer."""

    events: list[tuple[float, HostEvent]] = field(default_factory=list)

    def __call__(self, event: HostEvent) -> None:
        self.events.append((time.monotonic(), event))

    def cells(self, before: float = math.inf) -> Counter[int]:
        """How many times each cell index arrived (before `before`)."""
        return Counter(e.data["index"] for t, e in self.events if e.kind == CELL and t < before)

    def done(self) -> dict[str, Any]:
        (last,) = [e.data for _, e in self.events if e.kind == DONE]
        return last


def run_against(
    agent: FlappingAgent, store: RunStore, host_timeout: float, cells: int
) -> tuple[Seen, float]:
    """run_fleet on one fake agent (insecure), in this thread: what it saw and its seconds."""
    fake_started = agent.start()
    events = Seen()
    spec = {"models": ["small"], "n_prompt": list(range(1, cells + 1)), "n_gen": [0]}
    spec |= {"warmup": 0, "iterations": 1}
    began = time.monotonic()
    run_fleet(
        [Target("fake", fake_started.address, None)],
        spec,
        store,
        Settings(None, connect_timeout=5.0, host_timeout=host_timeout),
        events,
    )
    return events, time.monotonic() - began


def stored_cells(path: Path, host: str) -> tuple[int, int]:
    """(cells kept for `host`, (host, index) pairs kept twice) in a coordinator's store."""
    total = count_rows(path, "SELECT COUNT(*) FROM cells WHERE host = ?", (host,))
    twice = count_rows(
        path,
        "SELECT COUNT(*) FROM (SELECT 1 FROM cells WHERE host = ? "
        "GROUP BY run_id, host, idx HAVING COUNT(*) > 1)",
        (host,),
    )
    return total, twice


def test_the_allowance_adds_a_model_build_and_scales_the_slowest_cell() -> None:
    # Before a model's first cell: the host timeout, the planned time and the build allowance.
    assert no_progress_allowance(10.0, planned_s=2.0) == 10.0 + 2.0 + MODEL_BUILD_TIMEOUTS * 10.0
    # After: three times the slowest cell, or its time per unit of work times the next cell's.
    assert no_progress_allowance(10.0, 0.0, 4.0, 0.001, 1000.0, False) == 10.0 + 12.0
    assert no_progress_allowance(10.0, 0.0, 4.0, 0.01, 1000.0, False) == 10.0 + 30.0


def test_the_clock_times_cells_and_gives_each_new_model_its_build() -> None:
    clock = ProgressClock(10.0, since=0.0)
    assert clock.overdue(49.0, "a", 1.0) is None  # 10 s + 4 x 10 s to build model a
    assert clock.overdue(51.0, "a", 1.0) == 51.0
    clock.progressed(52.0)  # a model built: the clock starts again, nothing timed
    clock.progressed(54.0, [("a", 100.0), ("a", 100.0)])  # two cells, a second each
    assert clock.allowance("a", 100.0) == 10.0 + 3 * 1.0
    assert clock.allowance("a", 1000.0) == 10.0 + 3 * 10.0  # ten times the work
    assert clock.allowance("b", 100.0) == 10.0 + 40.0 + 3 * 1.0  # model b is built first
    sustained = ProgressClock(10.0, since=0.0, planned_s=60.0, sustained=True)
    sustained.progressed(61.0, [("a", 100.0)])
    assert sustained.allowance("a", 1e6) == 10.0 + 60.0 + 3 * 61.0  # its duration, not work


@pytest.mark.slow
def test_a_link_reset_mid_job_loses_no_cell_and_ends_in_time(
    agents: AgentPool, fleet_home: Path, ctx: zmq.Context
) -> None:
    """The reported bug: a 0.5 s reset of the link hung `coordinator benchmark`."""
    agent = agents.start("mac1")
    proxy = ResettingProxy(agent.address)
    try:
        coordinator_key = cli("coordinator", "keys", "show").stdout.strip()
        assert cli("agent", "keys", "trust", coordinator_key, home=agent.home).returncode == 0
        assert cli("coordinator", "keys", "add", proxy.address, str(agent.key)).returncode == 0
        began = time.monotonic()
        coordinator = piped(
            [
                console_script("coordinator"),
                "benchmark",
                "--hosts",
                proxy.address,
                *LONG,
                "--delay",
                "0.5",
                "--format",
                "json",
            ],
        )
        store = fleet_home / "coordinator.sqlite"
        try:
            deadline = time.monotonic() + 90
            while stored_cells(store, proxy.address)[0] < 2:
                assert time.monotonic() < deadline, "no cell stored in time"
                assert coordinator.poll() is None, coordinator.stderr.read()  # type: ignore[union-attr]
                time.sleep(0.05)
            kept = stored_cells(store, proxy.address)[0]
            assert agent.journal_cells() < 8  # the reset comes mid-job
            proxy.reset()
            # Followed while the job runs, not only once it ended (a ping.ok naming no job):
            # a cell measured after the reset is kept before the agent journals its last.
            followed = False
            while not followed and coordinator.poll() is None:
                followed = stored_cells(store, proxy.address)[0] > kept
                followed = followed and agent.journal_cells() < 8
                time.sleep(0.05)
            out, err = coordinator.communicate(timeout=120)
        finally:
            coordinator.kill()
        elapsed = time.monotonic() - began
    finally:
        proxy.close()
    assert coordinator.returncode == 0, err
    assert followed, "the run only caught up once the job had ended"
    assert proxy.resets == 1 and proxy.refused >= 1  # the coordinator did meet the blackout
    report = json.loads(out)
    (host,) = report["hosts"]
    assert host["status"] == HOST_OK, host
    cells = [c for c in report["cells"] if c["host"] == proxy.address]
    assert len(cells) == 8 and all(c["status"] == "ok" for c in cells)
    assert max(Counter(c["name"] for c in cells).values()) == 1
    assert stored_cells(store, proxy.address) == (8, 0)
    job_s = job_seconds(ctx, agent)
    assert elapsed < job_s + RESUME_SLACK_S, (elapsed, job_s)


def job_seconds(ctx: zmq.Context, agent: AgentProcess) -> float:
    """How long the agent's one job ran, by its job.list (whole seconds: one more)."""
    with connect(ctx, agent) as client:
        (job,) = client.request("job.list", {})["jobs"]
    span = datetime.fromisoformat(job["finished"]) - datetime.fromisoformat(job["started"])
    return span.total_seconds() + 1.0


@pytest.mark.slow
def test_fifty_router_flaps_lose_no_cell(store: RunStore, fake: list[FlappingAgent]) -> None:
    cells, cell_s = 50, 0.2
    agent = FlappingAgent(cell_s=cell_s, flaps=50, flap_s=8.0, flap_after=2)
    fake.append(agent)
    events, elapsed = run_against(agent, store, host_timeout=60.0, cells=cells)
    assert events.done() == {"status": HOST_OK, "error": None}
    assert agent.flapped == 50
    assert events.cells() == Counter(range(cells))  # every cell, each once
    assert stored_cells(store.path, "fake") == (cells, 0)
    assert agent.requests["job.get"] >= 1  # the stream was lost: its journal filled the run
    assert elapsed < cells * cell_s + RESUME_SLACK_S
    # Followed while the job ran, not only once it ended (ping.ok naming no job): the first
    # flap cut the stream after cell flap_after - 1.
    assert agent.ended_at is not None
    assert len(events.cells(before=agent.ended_at)) >= cells // 4


@pytest.mark.slow
def test_a_lost_cell_and_a_lost_bench_done_are_fetched(
    store: RunStore, fake: list[FlappingAgent]
) -> None:
    """A gap in the stream's cells, then a ping.ok naming no job (its bench.done never came)."""
    cells, cell_s = 10, 0.25
    agent = FlappingAgent(cell_s=cell_s, drop_cells={1}, drop_done=True)
    fake.append(agent)
    # A host timeout longer than the bound: only the stream's own checks can end it in time.
    events, elapsed = run_against(agent, store, host_timeout=60.0, cells=cells)
    assert events.done() == {"status": HOST_OK, "error": None}
    assert events.cells() == Counter(range(cells))
    assert agent.requests["job.get"] >= 1
    assert agent.ended_at is not None
    assert events.cells(before=agent.ended_at)[1] == 1  # fetched at the gap, not at the end
    assert elapsed < cells * cell_s + RESUME_SLACK_S


@pytest.mark.slow
def test_a_job_that_never_progresses_fails_its_host(
    store: RunStore, fake: list[FlappingAgent]
) -> None:
    host_timeout = 1.0
    agent = FlappingAgent(stall_after=0)
    fake.append(agent)
    events, elapsed = run_against(agent, store, host_timeout=host_timeout, cells=4)
    outcome = events.done()
    assert outcome["status"] == HOST_FAILED
    assert "made no progress for" in outcome["error"], outcome
    assert "looks stuck" in outcome["error"]
    assert agent.requests["info"] >= 2  # the machine's, then the paused check before failing
    assert not events.cells()
    allowance = no_progress_allowance(host_timeout)
    assert allowance < elapsed < allowance + STUCK_SLACK_S


@pytest.mark.slow
def test_a_paused_job_is_not_failed(store: RunStore, fake: list[FlappingAgent]) -> None:
    host_timeout, cells, cell_s = 1.0, 6, 0.2
    # Paused after two cells for several times what the allowance grants then.
    allowance = no_progress_allowance(host_timeout, 0.0, 0.5, 0.0, 1.0, False)
    agent = FlappingAgent(cell_s=cell_s, pause_after=2, pause_s=2 * allowance + 1)
    fake.append(agent)
    events, elapsed = run_against(agent, store, host_timeout=host_timeout, cells=cells)
    assert events.done() == {"status": HOST_OK, "error": None}
    assert events.cells() == Counter(range(cells))
    assert agent.infos_while_paused >= 1  # asked, told paused, went on
    assert elapsed < cells * cell_s + agent.pause_s + RESUME_SLACK_S
