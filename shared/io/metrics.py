"""Prometheus metrics for thermal telemetry and benchmark cells: one definition for both
exporters.

`agent serve --prometheus HOST:PORT` feeds its own samples and events into a TelemetryMetrics;
`coordinator monitor --prometheus HOST:PORT` feeds every host's into a FleetMetrics (one with
`instance`, which also counts the messages it refused). To reuse it:

    metrics = TelemetryMetrics()                 # its own CollectorRegistry, never the global one
    server = serve_metrics(metrics.registry, "127.0.0.1:9101")   # server.port, server.close()
    metrics.host_up(host, build={...}, policy={...})   # every series of the host, counters at 0
    metrics.observe_sample(body)                 # every telemetry.sample body (docs/protocol.md)
    metrics.observe_event(body)                  # every telemetry.event body
    metrics.observe_cell(host, record)           # every cell record (docs/protocol.md §5)
    metrics.host_down(host)                      # a host went silent: agent_up 0, nothing else

The server answers /metrics and /healthz, and 404 anywhere else.

Every series is labelled `host`: the agent's name (`agent serve --name`, by default its
hostname), the same on both exporters so their series join; the coordinator's also carry
`instance`, the agent's HOST:PORT as monitored (until a host is first reached, its `host` is that
HOST:PORT too). Metrics (docs/monitoring.md):
- mlx_fleet_soc_temperature_celsius{host,source}: gauge; absent while the host has no reading
  (never NaN, never a made-up number).
- mlx_fleet_sensor_temperature_celsius{host,sensor}: gauge, each sensor of the latest reading
  (the agent's exporter: the wire carries the SoC figure alone).
- mlx_fleet_cooling_state{host}: gauge, 0 ok, 1 reduce_batch, 1.5 pace, 2 pause, 3 stop; absent
  without a reading.
- mlx_fleet_throttling{host}: gauge, 1 while the host throttles under load by the throttle rule
  (its GPU clock or a supervised job's work rate: docs/thermal.md, Throttling as a state), 0
  under load without it; absent with no verdict (no load, no signal).
- mlx_fleet_policy_threshold_celsius{host,level}: gauge, the policy in force: the °C at which
  the host reaches `level` (reduce_batch, pace with a pace tier, pause, stop).
- mlx_fleet_policy_info{host,origin}: gauge, 1: where the thresholds' numbers came from
  (`defaults for smc`, `set by coordinator policy`, ...); absent while the agent has not said.
- mlx_fleet_pause_seconds_total{host}: counter of seconds supervised jobs spent paused (from the
  samples' pause_s_total; an agent restart, told by a new `started` in its samples, adds the new
  total; a total that goes down otherwise adds nothing).
- mlx_fleet_policy_actions_total{host,action}: counter of the actions the policy took on jobs
  (pause, resume, reduce_batch, restore_batch, stop), each at 0 from the host's start.
- mlx_fleet_invalid_messages_total{host}: counter of the host's messages (telemetry and
  replies) the coordinator refused as invalid and dropped (docs/protocol.md §4); the
  coordinator's exporter only.
- mlx_fleet_agent_up{host}: gauge, 1 while the host's telemetry arrives; 0 for a host that is
  down, whose other series are removed until it returns.
- mlx_fleet_storage_ok{host}: gauge, 1 while the host's agent writes everything it keeps, 0
  while its disk refuses a write (the samples' storage_error says which; it retries).
- mlx_fleet_build_info{host,version,mlx_version,chip}: gauge, 1: the agent's mlx-fleet and MLX
  versions and its chip.
- mlx_fleet_power_watts{host,source,rail}: gauge, the watts of each rail the host's power source
  measures (cpu, gpu, ane, dram; system is the whole machine and holds the others) over its
  last poll; absent without a reading. The vendor's estimates (docs/energy.md).
- mlx_fleet_energy_joules_total{host,source,rail}: counter of the joules each rail used (from
  the samples' cumulative joules; an agent restart, which resets them, adds its new value).
- mlx_fleet_gpu_frequency_hertz{host,source,kind}: gauge, the GPU's clock averaged over its
  active time in the last poll (docs/thermal.md, Clocks); `kind` is `measured`, `simulated` (the
  thermal plant's) or `replayed` (a capture's); absent while the GPU was idle or the host reads
  no clock.
- mlx_fleet_gpu_active_ratio{host,source,kind}: gauge, the share of the last poll the GPU was
  active (0 to 1); absent without a clock.
- mlx_fleet_cpu_frequency_hertz{host,source,kind,cluster}: gauge, the P and E clusters' clocks
  (cpufreq on Linux: the fastest and slowest kind of CPU); absent without a clock.
- mlx_fleet_gang_state{host,job,group,rank,world,backend}: gauge, for each rank of a
  distributed job the host runs, the state all the job's ranks live under (0 ok ... 3 stop, as
  cooling_state); gone when the rank exits.
- mlx_fleet_pace_duty_ratio{host}: gauge, while the host's state is pace, the share of each
  slice its jobs run (the pace tier's duty, 0 to 1); absent otherwise.
- mlx_fleet_benchmark_tokens_per_second{host,model,bits,batch,depth,test}: gauge, the mean
  tok/s of the latest record of each benchmark cell (`test` is llama-bench's name without its
  ` @ d<D>`, which is `depth`; `bits` is `none` for a directory's stored weights); absent for
  a cell that failed.
- mlx_fleet_benchmark_valid{same labels}: gauge, 1 when that record's verdict is `valid`, 0
  when `invalid`.
- mlx_fleet_benchmark_invalid_reason{same labels,reason}: gauge, 1 for each reason of an
  invalid verdict (shared.benchmark.verdict.REASONS; anything else is `other`), gone when the cell
  is measured again. Only the agent's exporter has benchmark series: records travel to the
  coordinator that started the job, never on the telemetry stream the monitor reads. The
  BENCH_CELLS_MAX cells measured last are kept per host.
"""

from __future__ import annotations

import math
import socket
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, Counter, Gauge, make_wsgi_app
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics import MetricWrapperBase

from shared.benchmark.verdict import REASONS, VALID, VERDICTS, judge
from shared.cooling.clocks import clock_label
from shared.cooling.policy import CoolingState
from shared.io.address import host_port
from shared.safe_text import shown

STATE_VALUES: dict[str, float] = {"ok": 0, "reduce_batch": 1, "pace": 1.5, "pause": 2, "stop": 3}
"""The order of CoolingState; pace, which came later, sits between reduce_batch and pause so the
values dashboards already compare keep their meaning."""
POLICY_ACTIONS = ("pause", "resume", "reduce_batch", "restore_batch", "pace", "pace_end", "stop")
"""Event actions the cooling policy takes; the others (start, exit, kill, ...) are not counted."""
THRESHOLD_LEVELS = {
    "max_speed_temp": CoolingState.REDUCE_BATCH.value,
    "pace_temp": CoolingState.PACE.value,
    "pause_temp": CoolingState.PAUSE.value,
    "stop_temp": CoolingState.STOP.value,
}
"""A policy's thresholds by the state each one starts."""
BUILD_LABELS = ("version", "mlx_version", "chip")
CELL_LABELS = ("model", "bits", "batch", "depth", "test")
"""What names a benchmark cell: the same cell measured again replaces its series."""
OTHER_REASON = "other"
"""A reason outside shared.benchmark.verdict.REASONS (a newer agent's, say): label values stay a
bounded set."""
BENCH_CELLS_MAX = 1024
"""Cells kept per host, the least recently measured dropped first: a long-lived agent running
many matrices must not grow its exposition without end."""


def cell_labels(record: Mapping[str, Any]) -> tuple[str, ...]:
    """A cell record's CELL_LABELS values: depth apart from the test's name, so each label
    varies alone."""
    bits = record.get("bits")
    return (
        str(record["model"]),
        "none" if bits is None else str(bits),
        str(record["batch_size"]),
        str(record.get("n_depth") or 0),
        str(record["test"]).partition(" @ ")[0],
    )


def cell_verdict(record: Mapping[str, Any]) -> tuple[bool, list[str]]:
    """Whether the record is valid and its reasons (bounded: unknown ones are OTHER_REASON),
    from its own verdict; a record without one is judged by the same rule that gives it."""
    if record.get("verdict") not in VERDICTS:
        record = judge(dict(record))
    found = {r if r in REASONS else OTHER_REASON for r in record.get("verdict_reasons") or ()}
    reasons = [reason for reason in (*REASONS, OTHER_REASON) if reason in found]
    return record["verdict"] == VALID and not reasons, reasons


def build_labels(version: str | None, machine: Mapping[str, Any]) -> dict[str, str]:
    """build_info's labels from an agent's version and machine facts ('unknown' when unsaid)."""
    return {
        "version": version or "unknown",
        "mlx_version": machine.get("mlx_version") or "unknown",
        "chip": machine.get("chip") or "unknown",
    }


@dataclass
class _Host:
    """What the metrics hold of one host: its labels, what it declared, what it exports."""

    host: str
    instance: str | None
    build: dict[str, str] | None = None
    policy: dict[str, float] | None = None
    policy_origin: str | None = None
    up: bool = False
    series: set[tuple[MetricWrapperBase, tuple[str, ...]]] = field(default_factory=set)
    source: str | None = None
    sensors: set[str] = field(default_factory=set)
    pause_seen: float = 0.0
    started: float | None = None
    """When the agent started, as its samples say (None: not said yet, or an older agent)."""
    power_shown: set[tuple[str, str]] = field(default_factory=set)
    joules_seen: dict[tuple[str, str], float] = field(default_factory=dict)
    gangs_shown: set[tuple[str, ...]] = field(default_factory=set)
    clocks_shown: set[tuple[Gauge, tuple[str, ...]]] = field(default_factory=set)
    cells: OrderedDict[tuple[str, ...], list[tuple[Gauge, tuple[str, ...]]]] = field(
        default_factory=OrderedDict
    )
    """Each cell's series (metric, extra labels), least recently measured first."""


class MetricFamilies:
    """Every metric both exporters expose (the module's docstring lists them), declared once in a
    registry of its own: name, help and labels. Apart from TelemetryMetrics, which feeds them from
    telemetry bodies, so that what is exposed reads in one place. With `instance`, every metric
    also carries the host's HOST:PORT (the coordinator's exporter)."""

    def __init__(self, registry: CollectorRegistry | None = None, instance: bool = False) -> None:
        self.registry = registry or CollectorRegistry()
        self.instance = instance
        base = ["host", "instance"] if instance else ["host"]

        def gauge(name: str, text: str, *labels: str) -> Gauge:
            return Gauge(name, text, [*base, *labels], registry=self.registry)

        self.temperature = gauge(
            "mlx_fleet_soc_temperature_celsius",
            "SoC temperature of the host's latest reading.",
            "source",
        )
        self.sensor_temperature = gauge(
            "mlx_fleet_sensor_temperature_celsius",
            "Each sensor of the host's latest reading, °C.",
            "sensor",
        )
        self.cooling_state = gauge(
            "mlx_fleet_cooling_state",
            "What the host's policy says now: 0 ok, 1 reduce_batch, 1.5 pace, 2 pause, 3 stop.",
        )
        self.throttling = gauge(
            "mlx_fleet_throttling",
            "1 while the host throttles under load (the throttle rule), 0 without; absent with no"
            " verdict.",
        )
        self.pace_duty = gauge("mlx_fleet_pace_duty_ratio", "While paced: each slice's share run.")
        self.threshold = gauge(
            "mlx_fleet_policy_threshold_celsius",
            "The policy in force: °C at which the host reaches `level`.",
            "level",
        )
        self.policy_info = gauge(
            "mlx_fleet_policy_info",
            "Where the policy's numbers came from (always 1).",
            "origin",
        )
        self.pause_seconds = Counter(
            "mlx_fleet_pause_seconds",
            "Seconds supervised jobs on the host spent paused.",
            base,
            registry=self.registry,
        )
        self.policy_actions = Counter(
            "mlx_fleet_policy_actions",
            "Actions the cooling policy took on the host's jobs.",
            [*base, "action"],
            registry=self.registry,
        )
        self.invalid_messages = Counter(
            "mlx_fleet_invalid_messages",
            "Messages from the host this coordinator refused as invalid (dropped).",
            base,
            registry=self.registry,
        )
        self.agent_up = gauge("mlx_fleet_agent_up", "1 while the host's telemetry arrives.")
        self.storage_ok = gauge(
            "mlx_fleet_storage_ok",
            "1 while the host's agent writes all it keeps, 0 while its disk refuses a write.",
        )
        self.build_info = gauge(
            "mlx_fleet_build_info", "The agent's versions and chip (always 1).", *BUILD_LABELS
        )
        self.power = gauge(
            "mlx_fleet_power_watts",
            "Watts per rail of the host's power source over its last poll (vendor estimates).",
            "source",
            "rail",
        )
        self.energy = Counter(
            "mlx_fleet_energy_joules",
            "Joules per rail the host's power source counted (vendor estimates).",
            [*base, "source", "rail"],
            registry=self.registry,
        )
        self.gpu_frequency = gauge(
            "mlx_fleet_gpu_frequency_hertz",
            "The GPU's clock over its active time in the host's last poll.",
            "source",
            "kind",
        )
        self.gpu_active = gauge(
            "mlx_fleet_gpu_active_ratio",
            "The share of the host's last poll its GPU was active, 0 to 1.",
            "source",
            "kind",
        )
        self.cpu_frequency = gauge(
            "mlx_fleet_cpu_frequency_hertz",
            "Each CPU cluster's clock (P, E) over its active time in the host's last poll.",
            "source",
            "kind",
            "cluster",
        )
        self.gang_state = gauge(
            "mlx_fleet_gang_state",
            "A rank of a distributed job: the state all its ranks live under, 0 ok, 1 "
            "reduce_batch, 1.5 pace, 2 pause, 3 stop.",
            "job",
            "group",
            "rank",
            "world",
            "backend",
        )
        self.bench_tokens = gauge(
            "mlx_fleet_benchmark_tokens_per_second",
            "Mean tok/s of the latest record of a benchmark cell.",
            *CELL_LABELS,
        )
        self.bench_valid = gauge(
            "mlx_fleet_benchmark_valid",
            "1 when the latest record of a benchmark cell is valid, 0 when invalid.",
            *CELL_LABELS,
        )
        self.bench_reason = gauge(
            "mlx_fleet_benchmark_invalid_reason",
            "1 for each reason the latest record of a benchmark cell is invalid.",
            *CELL_LABELS,
            "reason",
        )


class TelemetryMetrics(MetricFamilies):
    """The metrics (MetricFamilies) updated from telemetry bodies, host by host. Not thread-safe
    on its own bookkeeping: feed it from one thread. With `instance`, a host is keyed by its
    HOST:PORT (the coordinator's exporter), which every series also carries."""

    def __init__(self, registry: CollectorRegistry | None = None, instance: bool = False) -> None:
        super().__init__(registry, instance)
        self._hosts: dict[str, _Host] = {}

    # --- hosts ------------------------------------------------------------------------------

    def _host(self, host: str, instance: str | None) -> _Host:
        """The host's bookkeeping, keyed by its instance (the coordinator) or its name; a host
        whose name changed loses its old series first."""
        key = instance if self.instance and instance is not None else host
        known = self._hosts.get(key)
        if known is not None and known.host != host:
            self._remove(known, keep_up=False)
            known = None
        if known is None:
            known = self._hosts[key] = _Host(host, instance if self.instance else None)
        return known

    def _labels(self, state: _Host, *extra: str) -> tuple[str, ...]:
        base = (state.host, state.instance or state.host) if self.instance else (state.host,)
        return tuple(shown(value) for value in (*base, *extra))  # agents name most of them

    def _set(self, state: _Host, metric: Gauge, value: float, *extra: str) -> None:
        labels = self._labels(state, *extra)
        metric.labels(*labels).set(value)
        state.series.add((metric, labels))

    def _set_known(self, state: _Host, metric: Gauge, value: float | None, *extra: str) -> None:
        """Set `metric`, or drop it while its value is unknown (never a made-up number)."""
        if value is None:
            self._drop(state, metric, *extra)
        else:
            self._set(state, metric, float(value), *extra)

    def _drop(self, state: _Host, metric: MetricWrapperBase, *extra: str) -> None:
        labels = self._labels(state, *extra)
        if (metric, labels) in state.series:
            metric.remove(*labels)
            state.series.discard((metric, labels))

    def _remove(self, state: _Host, keep_up: bool) -> None:
        for metric, labels in list(state.series):
            if keep_up and metric is self.agent_up:
                continue
            metric.remove(*labels)
            state.series.discard((metric, labels))
        state.source, state.sensors, state.power_shown = None, set(), set()
        state.gangs_shown, state.cells, state.clocks_shown = set(), OrderedDict(), set()

    def host_up(
        self,
        host: str,
        instance: str | None = None,
        *,
        version: str | None = None,
        machine: Mapping[str, Any] | None = None,
        policy: Mapping[str, float] | None = None,
        policy_origin: str | None = None,
    ) -> None:
        """The host is up: agent_up 1, its build info (from its mlx-fleet `version` and its
        `machine` facts, when given), thresholds and their origin, and every counter at 0 from
        now on (Prometheus's increase() sees the first action only if a 0 came before it)."""
        state = self._host(host, instance)
        if machine is not None:
            state.build = build_labels(version, machine)
        if policy is not None:
            state.policy = dict(policy)
        state.up = True
        self._set(state, self.agent_up, 1)
        counters = [(self.pause_seconds, ())] + [
            (self.policy_actions, (action,)) for action in POLICY_ACTIONS
        ]
        for counter, extra in counters:
            labels = self._labels(state, *extra)
            counter.labels(*labels)  # created at 0, or kept as it is
            state.series.add((counter, labels))
        if state.build is not None:
            current = self._labels(state, *(state.build[k] for k in BUILD_LABELS))
            for metric, labels in list(state.series):
                if metric is self.build_info and labels != current:  # upgraded meanwhile
                    metric.remove(*labels)
                    state.series.discard((metric, labels))
            self._set(state, self.build_info, 1, *(state.build[k] for k in BUILD_LABELS))
        if state.policy is not None:
            self.set_policy(host, state.policy, instance, policy_origin or state.policy_origin)

    def host_down(self, host: str, instance: str | None = None) -> None:
        """The host is down: mlx_fleet_agent_up 0 and nothing else of it until host_up."""
        state = self._host(host, instance)
        self._remove(state, keep_up=True)
        state.up = False
        self._set(state, self.agent_up, 0)

    def set_policy(
        self,
        host: str,
        policy: Mapping[str, float],
        instance: str | None = None,
        origin: str | None = None,
    ) -> None:
        """The thresholds in force, and where they came from (None: not said)."""
        state = self._host(host, instance)
        if state.policy_origin is not None and state.policy_origin != origin:
            self._drop(state, self.policy_info, state.policy_origin)
        state.policy, state.policy_origin = dict(policy), origin
        if state.up:
            for key, level in THRESHOLD_LEVELS.items():
                self._set_known(state, self.threshold, policy.get(key), level)  # pace: optional
            if origin is not None:
                self._set(state, self.policy_info, 1, origin)

    # --- telemetry --------------------------------------------------------------------------

    def observe_sample(self, sample: Mapping[str, Any], instance: str | None = None) -> None:
        state = self._host(sample["host"], instance)
        if not state.up:
            self.host_up(sample["host"], instance)
        if state.source is not None and (
            sample["celsius"] is None or state.source != sample["source"]
        ):
            self._drop(state, self.temperature, state.source)
            state.source = None
        if sample["celsius"] is not None:
            self._set(state, self.temperature, sample["celsius"], sample["source"])
            state.source = sample["source"]
        self._set_known(state, self.cooling_state, STATE_VALUES.get(sample["state"] or ""))
        self._set_known(state, self.pace_duty, sample.get("duty"))
        throttling = sample.get("throttling")
        self._set_known(state, self.throttling, None if throttling is None else int(throttling))
        total = float(sample["pause_s_total"])
        restarted = _restarted(state, sample.get("started"), total)
        if restarted:
            state.joules_seen.clear()
        seen = 0.0 if restarted else state.pause_seen
        if total > seen:
            self.pause_seconds.labels(*self._labels(state)).inc(total - seen)
        state.pause_seen = max(seen, total)  # a total that went down was counted already
        self._set(state, self.storage_ok, 0 if sample["storage_error"] else 1)
        self._observe_power(state, sample.get("power"))
        self._observe_clocks(state, sample)
        self._observe_gangs(state, sample.get("jobs") or [])

    def _observe_clocks(self, state: _Host, sample: Mapping[str, Any]) -> None:
        """The clocks of the sample's poll, each labelled with its source and kind; a clock the
        poll lacks (idle GPU, no source, an older agent) is gone, never a stale value."""
        source = sample.get("clock_source") or ""
        kind = clock_label(source, sample.get("clock_simulated")) or "measured"
        wanted = {
            (self.gpu_frequency, (source, kind)): sample.get("gpu_hz"),
            (self.gpu_active, (source, kind)): sample.get("gpu_active"),
            (self.cpu_frequency, (source, kind, "P")): sample.get("cpu_p_hz"),
            (self.cpu_frequency, (source, kind, "E")): sample.get("cpu_e_hz"),
        }
        shown_now = {key for key, value in wanted.items() if value is not None}
        for metric, extra in state.clocks_shown - shown_now:
            self._drop(state, metric, *extra)
        for (metric, extra), value in wanted.items():
            if value is not None:
                self._set(state, metric, float(value), *extra)
        state.clocks_shown = shown_now

    def _observe_gangs(self, state: _Host, jobs: list[Mapping[str, Any]]) -> None:
        """One series per rank of a distributed job the host runs; gone with the rank."""
        shown_now = set()
        for job in jobs:
            gang = job.get("gang")
            if not gang or job["state"] == "exited":
                continue
            labels = (job["job"], gang["group"], str(gang["rank"]), str(gang["world"]),
                      gang["backend"])  # fmt: skip
            shown_now.add(labels)
            self._set(state, self.gang_state, STATE_VALUES[gang["state"]], *labels)
        for gone in state.gangs_shown - shown_now:
            self._drop(state, self.gang_state, *gone)
        state.gangs_shown = shown_now

    def _observe_power(self, state: _Host, power: Mapping[str, Any] | None) -> None:
        """Each rail's watts as a gauge (gone when a poll has none) and its joules added to the
        counter; cumulative joules lower than the last seen mean the agent restarted."""
        source = (power or {}).get("source") or ""
        watts = (power or {}).get("watts") or {}
        shown = {(source, rail) for rail in watts}
        for gone in state.power_shown - shown:
            self._drop(state, self.power, *gone)
        for rail, value in watts.items():
            self._set(state, self.power, float(value), source, rail)
        state.power_shown = shown
        for rail, total in ((power or {}).get("joules") or {}).items():
            seen = state.joules_seen.get((source, rail), 0.0)
            added = total - seen if total >= seen else total
            labels = self._labels(state, source, rail)
            if added > 0:
                self.energy.labels(*labels).inc(added)
                state.series.add((self.energy, labels))
            state.joules_seen[(source, rail)] = total

    def observe_sensors(
        self, host: str, sensors: Mapping[str, float | None], instance: str | None = None
    ) -> None:
        """Each sensor's °C of the latest reading; a sensor that stopped answering disappears."""
        state = self._host(host, instance)
        readable = {name: value for name, value in sensors.items() if value is not None}
        for gone in state.sensors - set(readable):
            self._drop(state, self.sensor_temperature, gone)
        for name, value in readable.items():
            self._set(state, self.sensor_temperature, float(value), name)
        state.sensors = set(readable)

    def observe_event(self, event: Mapping[str, Any], instance: str | None = None) -> None:
        if event["action"] in POLICY_ACTIONS:
            state = self._host(event["host"], instance)
            if not state.up:
                self.host_up(event["host"], instance)
            self.policy_actions.labels(*self._labels(state, event["action"])).inc()

    def observe_cell(
        self, host: str, record: Mapping[str, Any], instance: str | None = None
    ) -> None:
        """A benchmark cell's record: its tok/s (none for a failed cell, never NaN), verdict and
        reasons replace those of its previous measurement (set before the old ones go, so a
        scrape meanwhile never misses the cell)."""
        state = self._host(host, instance)
        if not state.up:
            self.host_up(host, instance)
        key = cell_labels(record)
        valid, reasons = cell_verdict(record)
        values: list[tuple[Gauge, float, tuple[str, ...]]] = [
            (self.bench_valid, 1.0 if valid else 0.0, key)
        ]
        speed = record.get("tokens_per_sec")
        if record.get("status") == "ok" and isinstance(speed, int | float) and math.isfinite(speed):
            values.append((self.bench_tokens, float(speed), key))
        values += [(self.bench_reason, 1.0, (*key, reason)) for reason in reasons]
        for metric, value, extra in values:
            self._set(state, metric, value, *extra)
        now = [(metric, extra) for metric, _, extra in values]
        for metric, extra in state.cells.pop(key, []):
            if (metric, extra) not in now:
                self._drop(state, metric, *extra)
        state.cells[key] = now
        while len(state.cells) > BENCH_CELLS_MAX:
            for metric, extra in state.cells.popitem(last=False)[1]:
                self._drop(state, metric, *extra)


class FleetMetrics(TelemetryMetrics):
    """The coordinator's exporter: every host's series with its HOST:PORT (`instance`), and
    the messages it refused from each (an agent's own exporter refuses none)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        super().__init__(registry, instance=True)

    def host_up(self, host: str, instance: str | None = None, **facts: Any) -> None:
        """As TelemetryMetrics.host_up, mlx_fleet_invalid_messages_total at 0 too."""
        super().host_up(host, instance, **facts)
        state = self._host(host, instance)
        labels = self._labels(state)
        self.invalid_messages.labels(*labels)  # created at 0, or kept as it is
        state.series.add((self.invalid_messages, labels))

    def observe_invalid(self, host: str, count: int, instance: str | None = None) -> None:
        """`count` messages from the host were refused as invalid."""
        state = self._host(host, instance)
        labels = self._labels(state)
        self.invalid_messages.labels(*labels).inc(count)
        state.series.add((self.invalid_messages, labels))


class ConditionsCollector:
    """`mlx_fleet_host_condition{host, condition}` 1 for each condition the run store holds
    (coordinator health, doctor --level 2), read by `read` at each scrape: host -> names."""

    def __init__(self, read: Callable[[], Mapping[str, list[str]]]) -> None:
        self.read = read

    def collect(self) -> Iterable[Any]:
        family = GaugeMetricFamily(
            "mlx_fleet_host_condition",
            "1 for each named condition that cordons the host (docs/performance.md, Fleet health).",
            labels=["host", "condition"],
        )
        for host, names in self.read().items():
            for name in names:
                family.add_metric([host, name], 1.0)
        yield family


def parse_address(text: str) -> tuple[str, int]:
    """'HOST:PORT' (IPv6 in brackets) -> (host, port); ValueError naming the expected form."""
    host, port = host_port(text, "address", "127.0.0.1:9101 (port 0 picks a free one)")
    return host.strip("[]"), port


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _ThreadingServer6(_ThreadingServer):
    address_family = socket.AF_INET6


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Scrapes every few seconds would drown the log."""


Wsgi = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


def metrics_app(registry: CollectorRegistry) -> Wsgi:
    """/metrics (Prometheus's text format), /healthz ("ok"), and 404 for any other path."""
    metrics = make_wsgi_app(registry)

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO") or "/"
        if path == "/metrics":
            return metrics(environ, start_response)
        plain = [("Content-Type", "text/plain; charset=utf-8")]
        if path == "/healthz":
            start_response("200 OK", plain)
            return [b"ok\n"]
        start_response("404 Not Found", plain)
        return [b"not found: this exporter serves /metrics and /healthz\n"]

    return app


@dataclass
class MetricsServer:
    server: WSGIServer
    thread: threading.Thread

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


def serve_metrics(registry: CollectorRegistry, address: str) -> MetricsServer:
    """Serve /metrics and /healthz for `registry` at HOST:PORT on a daemon thread. Raises
    ValueError for a bad address, OSError when it cannot bind."""
    host, port = parse_address(address)
    server_class = _ThreadingServer6 if ":" in host else _ThreadingServer
    server = make_server(host, port, metrics_app(registry), server_class, _QuietHandler)
    thread = threading.Thread(target=server.serve_forever, name="metrics", daemon=True)
    thread.start()
    return MetricsServer(server, thread)


def _restarted(state: _Host, started: Any, pause_total: float) -> bool:
    """Whether the agent restarted since its last sample seen: told by a new `started` (when
    its samples say it), never by a counter that went down, which a late-stamped resume or a
    replayed sample also makes (issue 42: a 120 s pause counted twice). An older agent that
    says no `started` falls back to its pause total going down."""
    if isinstance(started, (int, float)) and not isinstance(started, bool):
        before, state.started = state.started, float(started)
        return before is not None and before != state.started
    if state.started is not None:
        return False  # a sample without it (a row stored before) from an agent that says it
    return pause_total < state.pause_seen
