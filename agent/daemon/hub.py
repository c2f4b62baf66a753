"""The daemon's telemetry hub: ONE ThermalMonitor read all the time (agent.daemon.instruments),
each reading judged by the policy in force, published, stored and counted; the supervised jobs'
events likewise; and the policy itself (agent.daemon.policy: persisted, changed by policy.set).
docs/protocol.md §10-§12.

The monitor's thread only hands readings over (agent.daemon.handoff: a queue and a wake-up
pipe the daemon's loop polls); everything stateful happens on the daemon's main thread, so
nothing here needs a lock. The monitor's thread reads the power meter with each reading, so a
sample's figures are its poll's. While nothing needs each reading as it is taken (no
subscriber, job, /metrics, deferred reply or refused write), that thread wakes the loop only
when the history's next write is due: the loop takes every reading taken so far whenever
anything else wakes it, so nobody sees the difference but the CPU (docs/performance.md, The
idle daemon).
"""

from __future__ import annotations

import logging
import socket
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from agent.cooling.clock_throttle import ClockThrottle
from agent.cooling.events import EventLog
from agent.cooling.job_speed import stated_work
from agent.daemon.handoff import ReadingHandoff
from agent.daemon.history import WRITE_EVERY, TelemetryHistory
from agent.daemon.instruments import Instruments
from agent.daemon.policy import EnforcedPolicy, policy_event
from agent.daemon.storage import StorageHealth
from agent.daemon.telemetry import (
    TREND_WINDOW,
    ClockPoll,
    JobTable,
    PowerPoll,
    retention_cutoff,
    sample,
    trend_c_per_min,
)
from agent.daemon_address import pid_alive
from agent.power.meter import EnergyMeter
from agent.thermal import ThermalMonitor, ThermalReading, ThermalSource
from shared.cooling.policy import CoolingState, Supervision, ThermalPolicy, host_state
from shared.io.paths import data_subdir
from shared.wire import protocol as p
from shared.wire.telemetry import Event

if TYPE_CHECKING:
    from shared.io.metrics import MetricsServer, TelemetryMetrics

log = logging.getLogger("agent.hub")

PRUNE_EVERY_S = 300.0
"""History is pruned this often, or ten times per retention period when that is shorter."""

Publish = Callable[[str, dict[str, Any]], None]


def reading_sensors(reading: ThermalReading | None) -> dict[str, float | None]:
    """Each sensor of a reading by name; a source that names none gives its one figure under
    its sensor's (or its own) name."""
    if reading is None:
        return {}
    if reading.sensors:
        return dict(reading.sensors)
    if reading.celsius is None:
        return {}
    return {reading.sensor or reading.source: reading.celsius}


class TelemetryHub:
    """start(source) begins monitoring; the daemon's loop calls drain() when `wake_fd` is
    readable; every sample and event goes to `publish`."""

    def __init__(
        self,
        publish: Publish,
        poll_interval: float,
        retention_days: float,
        storage: StorageHealth,
        name: str | None = None,
    ) -> None:
        """Opens the history and event stores: raises StoreError or OSError when they cannot
        be (the daemon does not start). `name` is the agent's (`host` in every sample, event
        and metric), its hostname by default."""
        self.publish_message = publish
        self.poll_interval = poll_interval
        self.retention_days = retention_days
        self.storage = storage
        self.host = name or socket.gethostname()
        self.started = time.time()
        """When this agent started: every sample says so, a client's restart of its counters."""
        self._policy = EnforcedPolicy(storage)
        self.jobs = JobTable()
        events = EventLog()
        try:
            self.history = TelemetryHistory(self.host, events, storage=storage)
        except BaseException:
            events.close()
            raise
        self.instruments = Instruments(poll_interval)
        self.metrics: TelemetryMetrics | None = None
        self.last_reading: ThermalReading | None = None
        self._metrics_server: MetricsServer | None = None
        self.handoff = ReadingHandoff(lambda: self.history.unwritten_samples, WRITE_EVERY)
        """Each poll's time, reading and power, from the monitor's thread."""
        self.wake_fd = self.handoff.fd
        """The loop polls it: woken(), then drain()."""
        self._state: CoolingState | None = None
        self._host = Supervision()
        """The host as the rule sees it, poll after poll (its samples' state)."""
        self._temperatures: deque[float] = deque(maxlen=TREND_WINDOW)
        self._next_prune = 0.0
        self.jobs_dir = data_subdir("jobs")
        """Where `agent run` keeps each job's state, its work rate in it (§12)."""
        self.clock_throttle = ClockThrottle("none")  # the rule on the GPU clock read

    def start(self, source: ThermalSource, meter: EnergyMeter | None = None) -> None:
        """Poll `source` (the hub owns it from now on) every poll interval, in the background,
        and read `meter` (owned too) at each poll when it measures anything."""
        self._policy.on_scale(source.scale, source.name)
        self._policy.learn_from(self.history)
        self.clock_throttle.source = source.name
        self.instruments.start(source, meter, self._tap)
        in_force = self._policy.in_force
        log.info(
            "monitoring %s every %g s; %s",
            self.instruments.source.name,
            self.poll_interval,
            in_force,
        )

    def serve_metrics(self, address: str, version: str, machine: dict[str, Any]) -> int:
        """Prometheus /metrics at HOST:PORT, every series of this host there from the start;
        returns the bound port. Raises ValueError or OSError."""
        from shared.io.metrics import TelemetryMetrics, serve_metrics  # only with --prometheus

        metrics = TelemetryMetrics()
        self._metrics_server = serve_metrics(metrics.registry, address)
        metrics.host_up(
            self.host,
            version=version,
            machine=machine,
            policy=self.policy.to_dict(),
            policy_origin=self.policy_origin,
        )
        self.metrics = metrics
        return self._metrics_server.port

    def close(self) -> None:
        """Stop monitoring; store the readings still waiting, then close."""
        try:
            if self.instruments.stop():
                self.drain()
        finally:
            self.instruments.close_meter()
            if self._metrics_server is not None:
                self._metrics_server.close()
            self.history.close()
            self.history.events.close()
            self.handoff.close()

    @property
    def monitor(self) -> ThermalMonitor | None:
        return self.instruments.monitor

    # --- readings -------------------------------------------------------------------------------

    def _tap(self, reading: ThermalReading | None) -> None:
        """On the monitor's thread: hand the reading and the power of the moment to the main
        loop (the handoff wakes it when due; a deque's len is safe to read from here)."""
        instruments = self.instruments
        self.handoff.put(
            (time.time(), reading, instruments.read_power(), instruments.read_clocks())
        )

    def woken(self) -> None:
        """The loop polled `wake_fd` readable: take the wake-up (drain() takes the readings)."""
        self.handoff.pipe.take()

    def drain(self) -> list[tuple[ThermalReading | None, dict[str, Any] | None]]:
        """Every reading taken since the last drain, each published and stored, oldest first,
        with its poll's GPU clock for a benchmark job (None: none read): the loop calls it
        whenever it wakes, so whatever woke it sees every reading taken."""
        readings = []
        while taken := self.handoff.take():  # and any taken meanwhile
            for taken_at, reading, power, clocks in taken:
                self._on_reading(taken_at, reading, power, clocks)
                readings.append((reading, self.clock_throttle.last_clock))
        return readings

    def pace(self, watched: bool) -> None:
        """Wake the loop at every reading while something needs each one as it is taken or
        needs the loop soon: a subscriber, a benchmark job or a deferred reply (`watched`, the
        daemon knows), a supervised job, /metrics or a write the disk refused (the hub knows:
        writes are retried at each poll). Otherwise only when the history's next write is due,
        so a SIGKILL loses no more than it did (WRITE_EVERY), and a daemon nobody watches wakes
        its loop once every WRITE_EVERY polls instead of every poll."""
        self.handoff.each_reading = bool(
            watched or self.jobs.jobs or self.metrics is not None or self.storage.failing
        )

    @property
    def each_reading(self) -> bool:
        """Whether the monitor's thread wakes the loop at every reading (see pace())."""
        return self.handoff.each_reading

    def retry_writes(self) -> None:
        """Write what the disk refused before (events, the policy; the samples' history asks
        again with each sample)."""
        self.history.flush()
        self._policy.retry()
        if self._policy.recalibrated():
            self._policy.learn_from(self.history)
            self._announce_policy()

    def _on_reading(
        self,
        now: float,
        reading: ThermalReading | None,
        power: PowerPoll | None,
        clocks: ClockPoll | None = None,
    ) -> None:
        """One poll, taken at `now`: judge, store, publish, prune. A sample is published
        only once the history numbered it (a number set aside on disk before: it is never
        given twice); /metrics sees it either way."""
        self.retry_writes()
        if power is not None:
            self.instruments.last_power = power
        self.last_reading = reading
        self._host, self._state = host_state(self.policy, reading, self._host)
        if reading is not None and reading.celsius is not None:
            self._temperatures.append(reading.celsius)
        if self.jobs.jobs:  # (an idle daemon's polls skip the job table's upkeep)
            for event in self.jobs.vanished(lambda pgid: pid_alive(-pgid), now):  # any in group
                self.event(event)
            self.jobs.expire(now)
            self.jobs.read_work(lambda job: stated_work(self.jobs_dir, job))
        throttle = self.jobs.throttle(self.clock_throttle.observe(clocks and clocks.reading))
        taken = sample(
            now,
            reading,
            self.instruments.source,
            self._state,
            trend_c_per_min(list(self._temperatures), self.poll_interval),
            self.jobs.pause_s_total(now),
            self.jobs.listed(),
            self.storage.error,
            power,
            throttle,
            clocks,
            self.started,
            self._host.duty if self._state is not None else None,
        )
        if self._policy.observe(taken.celsius, taken.throttling):
            self._announce_policy()  # the calibration looks stale: every display says so
        added = self.history.add_sample(taken)
        if self.history.late:  # taken while the disk refused to set numbers aside
            for late in self.history.take_late():
                self.publish_message("telemetry.sample", late.body(self.host))
        body = added.body(self.host)
        if added.seq is not None:  # unnumbered: a number now could repeat after a crash
            self.publish_message("telemetry.sample", body)
        if self.metrics is not None:
            self.metrics.observe_sample(body)
            self.metrics.observe_sensors(self.host, reading_sensors(reading))
        if now >= self._next_prune:
            self.history.prune(retention_cutoff(now, self.retention_days))
            self._next_prune = now + min(PRUNE_EVERY_S, self.retention_days * 86400.0 / 10)

    # --- events and the policy ------------------------------------------------------------------

    def event(self, event: Event, kind: str = p.KIND_RUN) -> None:
        """Keep the job table current (`kind` is what a `start` lists), record it unless it
        comes numbered by the agent's event log (`agent run` recorded it there), and publish:
        numbered once recorded (synced), nil while the disk refuses it."""
        self.jobs.apply(event, kind)
        event = self.history.add_event(event)
        body = event.body(self.host)
        self.publish_message("telemetry.event", body)
        if self.metrics is not None:
            self.metrics.observe_event(body)

    def observe_cell(self, record: dict[str, Any]) -> None:
        """A benchmark cell this agent measured, with the verdict it gave it, for /metrics."""
        if self.metrics is not None:
            self.metrics.observe_cell(self.host, record)

    @property
    def policy(self) -> ThermalPolicy:
        return self._policy.policy

    @property
    def policy_origin(self) -> str:
        """Where the numbers in force came from: a coordinator, a calibration, or the source's
        defaults."""
        return self._policy.origin

    def set_policy(self, changes: dict[str, Any]) -> ThermalPolicy:
        """Validate, persist, apply (EnforcedPolicy.change), announce; returns the policy in
        force. ValueError naming the problem leaves the old policy in force."""
        if self._policy.change(changes):
            self._announce_policy()
        return self.policy

    def _announce_policy(self) -> None:
        """A new policy in force (set by a coordinator, or a calibration): logged, a `policy`
        event, /metrics."""
        in_force = self._policy.in_force
        if self.metrics is not None:
            self.metrics.set_policy(self.host, in_force.policy.to_dict(), origin=in_force.origin)
        log.info("new %s", in_force)
        self.event(policy_event(in_force, self.instruments.source))
