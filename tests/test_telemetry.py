"""The daemon's telemetry: the pure core (samples, job table, policy updates, history pages),
and real `agent serve` processes publishing to real CURVE subscribers, backfilling through
history.get, pruning to a retention, and gating their benchmark jobs with their own readings."""

from __future__ import annotations

import json
import logging
import math
import os
import select
import signal
import socket
import sqlite3
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import msgpack
import pytest
import zmq

from agent.daemon.endpoints import AgentSockets, Subscriptions, local_address, telemetry_endpoint
from agent.daemon.history import WRITE_EVERY
from agent.daemon.hub import TelemetryHub
from agent.daemon.storage import StorageHealth
from agent.daemon.telemetry import (
    EXITED_LINGER_S,
    VANISHED_AFTER_S,
    JobTable,
    page_history,
    retention_cutoff,
    sample,
    trend_c_per_min,
)
from agent.daemon.throttle import LogThrottle
from agent.power.base import PowerReading, PowerSource
from agent.power.meter import EnergyMeter
from agent.sensors.base import SourceInfo
from agent.thermal import ThermalReading, open_source
from shared.benchmark.energy import SYSTEM
from shared.cooling.policy import (
    MISSING_POLLS_TO_RESUME,
    CoolingState,
    JobState,
    Supervision,
    ThermalPolicy,
    host_state,
    updated_policy,
)
from shared.io.transport import AgentError
from shared.wire import protocol as p
from shared.wire.telemetry import Event
from tests.fleet_support import (
    AgentPool,
    connect,
    receive,
    subscriber,
    trusted_agent,
)
from tests.test_run_cli import write_curve

POLICY = ThermalPolicy()
EVERYTHING = {"samples_after": 0, "events_after": 0}
"""A history.get body asking for all the agent keeps."""


# --- the pure core ----------------------------------------------------------------------------


def reading(celsius: float | None, pressure: str | None = None) -> ThermalReading:
    return ThermalReading(
        celsius=celsius, source="sim", time=100.0, pressure=pressure, simulated=True
    )


@pytest.mark.parametrize(
    ("celsius", "pressure", "previous", "expected"),
    [
        (70.0, None, None, CoolingState.OK),
        (80.0, None, CoolingState.OK, CoolingState.REDUCE_BATCH),
        (86.0, None, CoolingState.OK, CoolingState.PAUSE),
        (84.0, None, CoolingState.PAUSE, CoolingState.REDUCE_BATCH),
        (None, "heavy", None, CoolingState.PAUSE),
        (None, None, CoolingState.PAUSE, None),
        (None, "unheard-of", None, None),
    ],
)
def test_host_state(
    celsius: float | None,
    pressure: str | None,
    previous: CoolingState | None,
    expected: CoolingState | None,
) -> None:
    assert host_state(POLICY, reading(celsius, pressure), was(previous))[1] is expected


def was(state: CoolingState | None) -> Supervision:
    """The supervision a host in `state` carries (None: a running one, nothing known)."""
    if state is CoolingState.PAUSE:
        return Supervision(JobState.PAUSED)
    return Supervision(reduced=state is CoolingState.REDUCE_BATCH)


def test_a_pause_holds_until_below_the_hysteresis() -> None:
    policy = ThermalPolicy(hysteresis=3.0)
    paused, running = was(CoolingState.PAUSE), was(CoolingState.OK)
    assert host_state(policy, reading(83.0), paused)[1] is CoolingState.PAUSE
    assert host_state(policy, reading(83.0), running)[1] is CoolingState.REDUCE_BATCH
    assert host_state(policy, None, paused)[1] is None


def test_the_hosts_state_is_the_rules_a_spike_pauses_and_lasting_heat_stops_then_recovers() -> None:
    """The dashboard alerts on `stop`: one poll above stop_temp is a pause, three are a stop,
    and a host (unlike a job) comes back from it when it cools."""
    supervision, states = Supervision(), []
    for celsius in (96.0, 80.0, 96.0, 96.0, 96.0, 96.0, 70.0):
        supervision, state = host_state(POLICY, reading(celsius), supervision)
        states.append(state)
    pause, stop, reduce = CoolingState.PAUSE, CoolingState.STOP, CoolingState.REDUCE_BATCH
    assert states == [pause, reduce, pause, pause, stop, stop, CoolingState.OK]


def test_trend_is_degrees_per_minute_over_the_last_five() -> None:
    assert trend_c_per_min([50.0, 60.0, 61.0, 62.0, 63.0, 64.0], 1.0) == pytest.approx(60.0)
    assert trend_c_per_min([70.0] * 5, 0.5) == 0.0
    # Fewer than the seed's window: no trend (two readings 1 s apart once made +105.7 °C/min).
    assert trend_c_per_min([50.0, 51.76], 1.0) is None
    assert trend_c_per_min([70.0], 1.0) is None


def test_a_sample_without_a_reading_says_so() -> None:
    source = SourceInfo("none", False)
    body = replace(sample(123.0, None, source, None, None, 0.0, []), seq=1).body("mac1")
    assert body["time"] == 123.0 and body["celsius"] is None and body["state"] is None
    assert body["sensor"] is None
    p.make("telemetry.sample", body)  # and is a valid telemetry.sample


def test_a_sample_with_a_reading_is_stamped_with_the_readings_time() -> None:
    hot = sample(123.0, reading(86.0), SourceInfo("sim", True), CoolingState.PAUSE, 1.5, 2.0, [])
    body = replace(hot, seq=2).body("mac1")
    assert body["time"] == 100.0 and body["state"] == "pause" and body["simulated"] is True
    p.make("telemetry.sample", body)


def test_a_sample_names_the_sensor_its_reading_is() -> None:
    die = ThermalReading(celsius=91.0, source="smc", time=100.0, sensor="TCMz")
    taken = sample(123.0, die, SourceInfo("smc", False), CoolingState.PAUSE, None, 0.0, [])
    body = replace(taken, seq=3).body("mac1")
    assert (body["source"], body["sensor"], body["celsius"]) == ("smc", "TCMz", 91.0)
    p.make("telemetry.sample", body)


def test_a_sample_goes_on_the_wire_only_numbered() -> None:
    unnumbered = sample(1.0, None, SourceInfo("none", False), None, None, 0.0, []).body("mac1")
    with pytest.raises(p.ProtocolError, match="seq"):
        p.make("telemetry.sample", unnumbered)


def test_a_policy_update_keeps_what_is_not_given() -> None:
    assert updated_policy(POLICY, {"pause_temp": 80}).to_dict() == {
        **POLICY.to_dict(),
        "pause_temp": 80.0,
    }


@pytest.mark.parametrize(
    ("bad", "needle"),
    [
        ({"pause_temp": 99}, "out of order"),
        ({"pause_temp": True}, "number"),
        ({"pause_temp": "hot"}, "number"),
        ({"pause_temp": math.nan}, "finite"),
        ({"pause": 80}, "unknown"),
        ({"hysteresis": -1}, "hysteresis"),
    ],
)
def test_a_policy_update_refuses_a_bad_value(bad: dict[str, object], needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        updated_policy(POLICY, bad)


def event(at: float, action: str, job: str = "j1", detail: str | None = None) -> Event:
    return Event(time=at, job=job, pid=42, action=action, source="sim", detail=detail)


JOB_EVENTS = [
    event(0.0, "start", detail="python train.py"),
    event(1.0, "reduce_batch"),
    event(2.0, "pause"),
    event(6.0, "resume"),
    event(7.0, "pause"),
    event(8.0, "stop"),  # a stop ends the pause
    event(9.0, "exit"),
    event(9.5, "pause"),  # nothing moves an exited job
]


def job_table_until(until: float) -> JobTable:
    """A table fed JOB_EVENTS up to `until`."""
    table = JobTable()
    for body in JOB_EVENTS:
        if body.time <= until:
            table.apply(body, p.KIND_RUN)
    return table


def test_the_job_table_follows_events() -> None:
    assert job_table_until(1.0).listed() == [
        {"job": "j1", "pid": 42, "command": "python train.py", "state": "running", "kind": "run"}
    ]
    assert job_table_until(2.0).listed()[0]["state"] == "paused"
    assert job_table_until(8.0).listed()[0]["state"] == "stopped"
    table = job_table_until(9.5)
    assert table.listed()[0]["state"] == "exited"
    table.expire(9.0 + EXITED_LINGER_S)
    assert table.listed()
    table.expire(9.1 + EXITED_LINGER_S)
    assert table.listed() == []


def test_the_job_table_counts_pause_time() -> None:
    assert job_table_until(2.0).pause_s_total(5.0) == 3.0  # a pause going on counts
    assert job_table_until(8.0).pause_s_total(100.0) == 5.0
    table = job_table_until(9.5)
    table.expire(9.1 + EXITED_LINGER_S)
    assert table.pause_s_total(200.0) == 5.0  # an expired job's pauses still count


def test_a_run_job_whose_group_vanished_exits_after_a_grace() -> None:
    table = JobTable()
    table.apply(event(0.0, "start", job="run"), p.KIND_RUN)
    table.apply(event(0.0, "start", job="bench"), p.KIND_BENCH)
    alive = {42: True}
    assert table.vanished(alive.__getitem__, 1.0) == []
    alive[42] = False
    assert table.vanished(alive.__getitem__, 2.0) == []  # its agent run may be about to say
    (gone,) = table.vanished(alive.__getitem__, 2.0 + VANISHED_AFTER_S)
    assert gone.job == "run" and gone.action == "exit" and "never said" in (gone.detail or "")


def numbered(first: int, count: int) -> list[dict[str, int]]:
    return [{"seq": seq} for seq in range(first, first + count)]


def test_history_pages_cut_each_list_by_its_limit() -> None:
    samples, events = numbered(1, 4), numbered(1, 2)
    assert page_history(samples, events, 10, 10**6) == (samples, events, False)
    # limit 2: the samples stop at 2 and say more remain; the events fit
    assert page_history(samples[:3], events, 2, 10**6) == (numbered(1, 2), events, True)


def test_history_pages_cut_each_list_by_its_half_of_the_byte_budget() -> None:
    samples, events = numbered(1, 4), numbered(1, 2)
    # the byte budget: half for each list, and each keeps at least one item
    budget = 2 * 2 * len(msgpack.packb({"seq": 1}))
    assert page_history(samples, events, 10, budget) == (numbered(1, 2), events, True)
    assert page_history(samples, events, 10, 2) == (numbered(1, 1), numbered(1, 1), True)


@pytest.mark.parametrize(
    ("endpoint", "port", "expected"),
    [
        ("tcp://0.0.0.0:5555", None, "tcp://0.0.0.0:5556"),
        ("tcp://127.0.0.1:*", None, "tcp://127.0.0.1:*"),
        ("tcp://[::]:7000", 9000, "tcp://[::]:9000"),
        ("tcp://0.0.0.0:5555", 0, "tcp://0.0.0.0:*"),
    ],
)
def test_the_telemetry_port_is_the_command_port_plus_one_by_default(
    endpoint: str, port: int | None, expected: str
) -> None:
    assert telemetry_endpoint(endpoint, port) == expected


@pytest.mark.parametrize(
    ("bound", "local"),
    [
        ("tcp://0.0.0.0:5555", "127.0.0.1:5555"),
        ("tcp://[::]:5555", "[::1]:5555"),
        ("tcp://10.0.0.2:5555", "10.0.0.2:5555"),
    ],
)
def test_local_clients_reach_a_wildcard_bind_on_loopback(bound: str, local: str) -> None:
    assert local_address(bound) == local


def test_subscriptions_follow_what_the_xpub_hands_up() -> None:
    subscriptions = Subscriptions()
    assert not subscriptions.wants(b"sample")  # nobody yet
    subscriptions.apply(b"\x01sam")
    assert subscriptions.wants(b"sample") and not subscriptions.wants(b"event")  # a prefix
    subscriptions.apply(b"\x01")
    assert subscriptions.wants(b"event")  # everything
    subscriptions.apply(b"\x00")
    subscriptions.apply(b"hello")  # what an XSUB may send besides: not a subscription
    assert subscriptions.wants(b"sample") and not subscriptions.wants(b"event")
    subscriptions.apply(b"\x00sam")
    assert not subscriptions.wants(b"sample")


def test_retention_cutoff() -> None:
    assert retention_cutoff(1_000_000.0, 7) == 1_000_000.0 - 7 * 86400


# --- real agents ------------------------------------------------------------------------------


def test_samples_reach_a_curve_subscriber_and_history_backfills_in_pages(
    ctx: zmq.Context, agents: AgentPool, tmp_path: Path
) -> None:
    source = write_curve(tmp_path / "curve.csv", [(0, 60.0), (0.5, 80.0)])
    agent = trusted_agent(agents, thermal=source, options=["--poll-interval", "0.1"])
    sub = subscriber(ctx, agent)
    first = receive(sub, lambda m: m.type == "telemetry.sample")
    hot = receive(sub, lambda m: m.type == "telemetry.sample" and m.body["celsius"] == 80.0)
    assert first.re is None and first.body["host"] == socket.gethostname()
    body = hot.body
    assert body["source"] == source and body["simulated"] is True
    assert body["sensor"] == "replay"  # the replay's sensor, labelled as a replay
    assert body["state"] == "reduce_batch" and body["pressure"] is None
    assert body["pause_s_total"] == 0.0 and body["jobs"] == []
    assert isinstance(body["trend_c_per_min"], float)

    client = connect(ctx, agent)
    info = client.request("info")
    assert agent.telemetry == f"127.0.0.1:{info['telemetry_port']}"
    assert info["poll_interval"] == 0.1 and info["policy"] == ThermalPolicy().to_dict()
    assert info["thermal"]["simulated"] is True and info["jobs"] == []
    everything = client.request("history.get", EVERYTHING)
    assert not everything["truncated"] and everything["events"] == []
    assert everything["history"] == info["history"]
    numbers = [s["seq"] for s in everything["samples"]]
    assert numbers == list(range(1, len(numbers) + 1)) and first.body in everything["samples"]
    # a late coordinator pages through the same history, three samples at a time
    paged, after = [], 0
    while True:
        page = client.request(
            "history.get", {"samples_after": after, "events_after": 0, "limit": 3}
        )
        paged += page["samples"]
        if not page["truncated"]:
            break
        after = page["samples"][-1]["seq"]
    assert paged[: len(numbers)] == everything["samples"]
    recent = client.request("history.get", {**EVERYTHING, "since": hot.body["time"] - 1e-6})
    assert recent["samples"][0] == hot.body  # `since` keeps what was stamped after it
    with pytest.raises(AgentError, match="limit must be 1 to 10000, got 0"):
        client.request("history.get", {**EVERYTHING, "limit": 0})
    client.close()


def test_telemetry_is_encoded_only_while_someone_subscribes(
    ctx: zmq.Context, caplog: pytest.LogCaptureFixture
) -> None:
    """Real sockets: a message no one would receive is never encoded (one that cannot be
    encoded says so only once someone subscribes), a subscriber gets what is published after
    its subscription arrived, and leaving unsubscribes it."""
    sockets = AgentSockets("127.0.0.1:0", False, 0, LogThrottle(logging.getLogger("test")))
    sockets.bind()
    body = replace(
        sample(100.0, reading(60.0), SourceInfo("sim", True), CoolingState.OK, 0.0, 0.0, []),
        seq=1,
    ).body("host")
    unencodable = {**body, "celsius": "hot"}
    try:
        sockets.publish("telemetry.sample", unencodable)
        assert "cannot publish" not in caplog.text  # not even tried: nobody listens

        def until(condition: Callable[[], bool]) -> None:
            deadline = time.monotonic() + 10.0
            while not condition():
                assert time.monotonic() < deadline, "the (un)subscription never arrived"
                sockets.publisher.poll(100)
                sockets.read_subscriptions()

        sub = ctx.socket(zmq.SUB)
        sub.subscribe(b"sample")
        sub.connect(sockets.telemetry)
        until(lambda: sockets.subscriptions.wants(b"sample"))
        assert not sockets.subscriptions.wants(b"event")
        sockets.publish("telemetry.sample", unencodable)
        assert "cannot publish telemetry.sample" in caplog.text
        sockets.publish("telemetry.sample", body)
        assert receive(sub, lambda m: True).body == body
        sub.close(linger=0)
        until(lambda: not sockets.subscriptions.wants(b"sample"))
    finally:
        sockets.close()


def test_a_subscriber_after_another_left_gets_samples(ctx: zmq.Context, agents: AgentPool) -> None:
    agent = agents.start("plain", insecure=True, options=["--poll-interval", "0.1"])
    first = subscriber(ctx, agent)
    receive(first, lambda m: m.type == "telemetry.sample")
    first.close(linger=0)  # the agent stops encoding samples for nobody ...
    again = receive(subscriber(ctx, agent), lambda m: m.type == "telemetry.sample")
    assert again.body["seq"] > 1  # ... and starts again for the next subscriber


@pytest.mark.slow
def test_telemetry_refuses_an_untrusted_subscriber(ctx: zmq.Context, agents: AgentPool) -> None:
    agent = agents.start("strict", options=["--poll-interval", "0.1"])  # trusts nobody
    sub = subscriber(ctx, agent)
    assert not sub.poll(1500), "an untrusted key got telemetry"
    assert "refused a coordinator" in agent.log_text()


def test_telemetry_is_plain_when_insecure(ctx: zmq.Context, agents: AgentPool) -> None:
    plain = agents.start("plain", insecure=True, options=["--poll-interval", "0.1"])
    sample = receive(subscriber(ctx, plain), lambda m: m.type == "telemetry.sample")
    assert sample.body["source"] == "none" and sample.body["state"] is None


@pytest.mark.slow
def test_history_is_pruned_to_the_retention(ctx: zmq.Context, agents: AgentPool) -> None:
    retention_s = 2.0
    agent = trusted_agent(
        agents, options=["--poll-interval", "0.1", "--retention-days", str(retention_s / 86400)]
    )
    client = connect(ctx, agent)
    client.request("policy.set", {"policy": {"pause_temp": 80}})  # an event to prune too
    started = time.time()
    assert client.request("history.get", EVERYTHING)["events"]
    time.sleep(retention_s + 1.0)
    history = client.request("history.get", EVERYTHING)
    oldest = history["samples"][0]["time"]
    assert started < oldest  # older ones went (the first sample came before the policy)
    assert oldest >= time.time() - retention_s - 1.0
    assert history["events"] == []
    with sqlite3.connect(agent.home / "agent-telemetry.sqlite") as conn:
        on_disk = conn.execute("SELECT MIN(time) FROM samples").fetchone()[0]
    assert on_disk > started
    client.close()


def stored_sample_seqs(home: Path) -> list[int]:
    """The sample numbers the agent has written to its history file (read-only)."""
    path = home / "agent-telemetry.sqlite"
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5) as conn:
        return [row[0] for row in conn.execute("SELECT seq FROM samples ORDER BY seq")]


def live_seqs(sock: zmq.Socket, until: Callable[[list[int]], bool]) -> list[int]:
    """The numbers of the samples published from now until `until(numbers so far)`."""
    seen: list[int] = []
    while not until(seen):
        sample = receive(sock, lambda m: m.type == "telemetry.sample")
        seen.append(sample.body["seq"])
    return seen


@pytest.mark.parametrize("stop", ["SIGKILL", "SIGTERM"])
@pytest.mark.slow
def test_what_a_stopped_agents_history_keeps_and_that_no_number_is_given_twice(
    ctx: zmq.Context, agents: AgentPool, stop: str
) -> None:
    """Samples are written WRITE_EVERY at a time: until then history.get serves them from
    memory; SIGKILL loses at most the last WRITE_EVERY (docs/reliability.md), SIGTERM none;
    and the restarted agent numbers its samples after every number given before."""
    options = ["--poll-interval", "0.05"]
    agent = trusted_agent(agents, options=options)
    sub = subscriber(ctx, agent)
    seen = live_seqs(sub, lambda seen: len(seen) > 3 * WRITE_EVERY)
    client = connect(ctx, agent)
    served = [s["seq"] for s in client.request("history.get", EVERYTHING)["samples"]]
    assert served == list(range(1, len(served) + 1)) and served[-1] >= seen[-1]
    client.close()
    if stop == "SIGKILL":
        agent.kill()
    else:
        agent.process.send_signal(signal.SIGTERM)
        assert agent.process.wait(timeout=15) == 0
    while sub.poll(200):  # what was published before the end
        message = p.decode_telemetry(sub.recv_multipart())
        if message.type == "telemetry.sample":
            seen.append(message.body["seq"])
    stored = stored_sample_seqs(agent.home)
    assert stored == list(range(1, len(stored) + 1)), "a written sample is missing"
    if stop == "SIGKILL":
        assert len(stored) >= served[-1] - WRITE_EVERY + 1, "more than WRITE_EVERY were lost"
    else:
        assert stored[-1] >= seen[-1], "a clean stop writes every sample it published"
    sub.close()

    again = trusted_agent(agents, options=options)  # the same name: the same data directory
    client = connect(ctx, again)
    deadline = time.monotonic() + 30
    while len(kept := client.request("history.get", EVERYTHING)["samples"]) <= len(stored):
        assert time.monotonic() < deadline, "the restarted agent took no sample"
        time.sleep(0.05)
    numbers = [s["seq"] for s in kept]
    assert numbers[: len(stored)] == stored
    assert numbers[len(stored)] > max(seen), "a number given before the stop was given again"
    if stop == "SIGTERM":
        assert numbers == list(range(1, len(numbers) + 1)), "a gap after a clean stop"
    client.close()


class PollCountingPower(PowerSource):
    """A meter whose watts, at each read, are the number of thermal polls taken so far
    (`polls()`): a sample's power says whether it was read with its poll or later."""

    name = "poll-counting"
    simulated = True
    rails = (SYSTEM,)

    def __init__(self, polls: Callable[[], int]) -> None:
        super().__init__()
        self.polls = polls

    def read(self) -> PowerReading | None:
        watts = {SYSTEM: float(self.polls())}
        return self._reading(watts, watts)


def test_a_hub_nobody_watches_wakes_the_loop_when_the_history_write_is_due() -> None:
    """hub.pace(): while nothing needs each reading as it is taken, the monitor's thread wakes
    the daemon's loop only when the readings waiting and the samples unwritten fill the
    history's next write, at every reading otherwise (a subscriber or benchmark job, a
    supervised job); a drain takes every reading waiting, each with the power read at its
    poll, and close() stores those still waiting. Real pipe, real SQLite; the test takes each
    reading through the monitor (an hour's poll interval keeps its thread from taking any)."""
    published: list[tuple[str, dict[str, object]]] = []
    hub = TelemetryHub(
        lambda type_, body: published.append((type_, body)),
        3600.0,
        7.0,
        StorageHealth(LogThrottle(logging.getLogger("test"))),
        "host",
    )
    polls = [1]  # the first is taken by start()

    def woken() -> bool:
        if not select.select([hub.wake_fd], [], [], 0)[0]:
            return False
        hub.woken()
        return True

    def taken(count: int) -> None:
        assert hub.monitor is not None
        for _ in range(count):
            polls[0] += 1
            hub.monitor.read()

    try:
        hub.start(open_source("sim"), EnergyMeter(PollCountingPower(lambda: polls[0])))
        assert woken() and len(hub.drain()) == 1  # the first one wakes the loop at once
        hub.pace(watched=False)
        taken(WRITE_EVERY - 2)  # one sample already waits to be written
        assert not woken()
        taken(1)
        assert woken() and len(hub.drain()) == WRITE_EVERY - 1
        assert len(stored_samples(hub)) == WRITE_EVERY  # the drain filled a write
        taken(3)
        assert not woken() and len(hub.drain()) == 3  # a request woke the loop: it takes all
        taken(WRITE_EVERY - 3 - 1)
        assert not woken()
        taken(1)
        assert woken() and len(hub.drain()) == WRITE_EVERY - 3
        assert len(stored_samples(hub)) == 2 * WRITE_EVERY

        hub.pace(watched=True)  # a subscriber, a benchmark job, a deferred reply
        taken(1)
        assert woken() and len(hub.drain()) == 1
        hub.event(replace(event(time.time(), "start"), pid=os.getpgrp()))  # a supervised job
        hub.pace(watched=False)
        taken(1)
        assert woken() and len(hub.drain()) == 1
        hub.event(replace(event(time.time(), "exit"), pid=os.getpgrp()))
        hub.pace(watched=False)  # it stays listed a while after its exit
        assert hub.each_reading
        taken(2)  # waiting when the daemon stops
    finally:
        hub.close()
    samples = [body for type_, body in published if type_ == "telemetry.sample"]
    seqs = [body["seq"] for body in samples]
    assert seqs == list(range(1, polls[0] + 1)), "a reading was not taken, or twice"
    assert [body["power_w"] for body in samples] == seqs, "power not read with its poll"
    assert stored_samples(hub) == seqs, "close() did not store the readings still waiting"


def stored_samples(hub: TelemetryHub) -> list[int]:
    with sqlite3.connect(f"file:{hub.history.path}?mode=ro", uri=True) as conn:
        return [row[0] for row in conn.execute("SELECT seq FROM samples ORDER BY seq")]


def main_thread_wakeups(pid: int) -> int:
    """How often the process's main thread has gone to sleep (Linux: voluntary switches)."""
    status = Path(f"/proc/{pid}/task/{pid}/status").read_text()
    return int(status.split("voluntary_ctxt_switches:")[1].split()[0])


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux's /proc")
@pytest.mark.slow
def test_an_agent_nobody_watches_sleeps_through_most_polls_yet_answers_with_every_reading(
    ctx: zmq.Context, agents: AgentPool
) -> None:
    """With no subscriber and no job, the daemon's loop sleeps through WRITE_EVERY - 1 polls
    of every WRITE_EVERY (its main thread's wake-ups counted by the kernel, while the written
    history grows), and a request still sees every reading taken before it."""
    agent = trusted_agent(agents, thermal="sim", options=["--poll-interval", "0.05"])
    pid = agent.process.pid
    deadline = time.monotonic() + 60
    while not (agent.home / "agent-telemetry.sqlite").exists() or not stored_sample_seqs(
        agent.home
    ):
        assert time.monotonic() < deadline, "the agent wrote no sample"
        time.sleep(0.05)
    first_written, wakeups = len(stored_sample_seqs(agent.home)), main_thread_wakeups(pid)
    while (written := len(stored_sample_seqs(agent.home))) < first_written + 4 * WRITE_EVERY:
        assert time.monotonic() < deadline, "the agent stopped writing samples"
        time.sleep(0.05)
    polls, woke = written - first_written, main_thread_wakeups(pid) - wakeups
    assert woke < polls / 2, f"the loop woke {woke} times in {polls} polls"

    client = connect(ctx, agent)
    for _ in range(3):
        latest = client.request("info")["thermal"]["reading"]["time"]  # the monitor's own
        since = client.request("history.get", {**EVERYTHING, "since": latest - 1e-6})
        assert since["samples"] and since["samples"][0]["time"] == latest
    client.close()


def journal_models(home: Path) -> int:
    """Models the agent's running job has built so far (its journal, read-only)."""
    with sqlite3.connect(f"file:{home / 'agent-jobs.sqlite'}?mode=ro", uri=True) as conn:
        row = conn.execute("SELECT models FROM jobs").fetchone()
    return len(json.loads(row[0])) if row else 0


@pytest.mark.slow
def test_a_benchmark_job_is_gated_by_the_daemons_readings_with_no_coordinator_there(
    ctx: zmq.Context, agents: AgentPool, tmp_path: Path
) -> None:
    """The agent keeps enforcing its policy when the coordinator is unreachable: the coordinator
    starts a job and goes; the job pauses at 90 °C (the daemon's replayed reading; the replay
    file is gone, so the job process cannot have opened a source of its own) and finishes no
    cell until a coordinator comes back and pushes a policy under which 90 °C is no pause."""
    curve = tmp_path / "hot.csv"
    source = write_curve(curve, [(0, 90.0)])
    agent = trusted_agent(agents, thermal=source, options=["--poll-interval", "0.1"])
    curve.unlink()
    coordinator = connect(ctx, agent)
    started = coordinator.request(
        "bench.start",
        {
            "matrix": {
                "n_prompt": [16],
                "models": ["small"],
                "n_gen": [4],
                "warmup": 0,
                "iterations": 1,
            }
        },
    )
    coordinator.close()  # unreachable from now on
    deadline = time.monotonic() + 60
    while journal_models(agent.home) == 0:
        assert time.monotonic() < deadline, agent.log_text()
        time.sleep(0.1)
    time.sleep(2.0)  # the two cells take well under a second each when not paused
    assert agent.journal_cells() == 0, "a cell finished at 90 °C: the job was not paused"

    returning = connect(ctx, agent)
    sub = subscriber(ctx, agent)
    returning.request("policy.set", {"policy": {"pause_temp": 92, "stop_temp": 96}})
    job_id = started["job"]
    deadline = time.monotonic() + 60
    while (job := returning.request("job.get", {"job": job_id}))["state"] == p.JOB_RUNNING:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert job["state"] == p.JOB_OK, job["error"]
    first_cell = job["records"][0]
    assert first_cell["thermal_source"] == source
    assert {"paused", "hot", "simulated"} <= set(first_cell["flags"])
    assert first_cell["soc_temp_start_c"] == 90.0
    history = returning.request("history.get", EVERYTHING)["events"]
    assert [e["action"] for e in history if e["job"] == job_id] == [
        "start",
        "pause",
        "resume",
        "reduce_batch",
        "exit",
    ]
    assert [e["action"] for e in history if e["job"] is None] == ["policy"]
    exited = receive(sub, lambda m: m.type == "telemetry.event" and m.body["action"] == "exit")
    assert exited.body["job"] == job_id and exited.body["detail"] == "ok"
    returning.close()


@pytest.mark.slow
def test_the_daemons_view_of_a_benchmark_job_is_the_jobs_own_gate(
    ctx: zmq.Context, agents: AgentPool, tmp_path: Path
) -> None:
    """One cooling rule: the job's gate decides on every poll the daemon takes (queued in its
    pipe from its first moment, so its start-up time does not matter), and the daemon publishes
    exactly those actions. Through a pause, a few missing readings (the pause holds), many
    missing readings (it resumes, saying why), a second pause and a resume (unless the job ends
    inside that pause). The job starts well within the curve's first 3 s at 90 °C."""
    curve = tmp_path / "gaps.csv"
    curve.write_text(  # empty: no reading; 0.4 s is 4 polls, 2 s is 20
        "seconds,celsius\n0,90\n3.0,\n3.4,90\n4.0,\n6.0,70\n7.0,90\n8.0,70\n"
    )
    agent = trusted_agent(agents, thermal=f"replay:{curve}", options=["--poll-interval", "0.1"])
    client = connect(ctx, agent)
    matrix = {
        "n_prompt": [16, 32, 48, 64],
        "models": ["small"],
        "n_gen": [8],
        "warmup": 0,
        "iterations": 3,
    }
    job_id = client.request("bench.start", {"matrix": matrix})["job"]
    deadline = time.monotonic() + 120
    while (job := client.request("job.get", {"job": job_id}))["state"] == p.JOB_RUNNING:
        assert time.monotonic() < deadline, agent.log_text()
        time.sleep(0.2)
    assert job["state"] == p.JOB_OK, job["error"]
    events = [e for e in client.request("history.get", EVERYTHING)["events"] if e["job"] == job_id]
    actions = [e["action"] for e in events]
    assert actions[:3] == ["start", "pause", "resume"], actions
    blind = events[2]
    assert blind["celsius"] is None
    # the first resume is the one for the long gap: the short one held the pause
    assert f"no reading for {MISSING_POLLS_TO_RESUME} polls" in blind["detail"]
    # pauses and resumes alternate to the exit; a job fast enough to finish its last iteration
    # before the curve's last 70 °C exits inside the second pause, with no resume to say
    middle = actions[1:-1]
    alternating = (["pause", "resume"] * len(middle))[: len(middle)]
    assert actions[-1] == "exit" and middle == alternating, actions
    # the job lived the same pauses: its first cell waited them out and says so
    first = job["records"][0]
    assert "paused" in first["flags"] and first["soc_temp_start_c"] == 90.0
    paused_s = sum(r["pause_s"] for r in job["records"])
    pauses = list(zip(events[1::2], events[2::2], strict=False))
    assert 0 < paused_s <= sum(end["time"] - begin["time"] for begin, end in pauses) + 0.5
    client.close()
