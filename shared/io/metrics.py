"""Prometheus metrics for thermal telemetry: one definition for both exporters.

`agent serve --prometheus HOST:PORT` feeds its own samples and events into a TelemetryMetrics;
`coordinator monitor --prometheus HOST:PORT` can feed every host's into one too. To reuse it:

    metrics = TelemetryMetrics()                 # its own CollectorRegistry, never the global one
    server = serve_metrics(metrics.registry, "127.0.0.1:9101")   # server.port, server.close()
    metrics.observe_sample(body)                 # every telemetry.sample body (docs/protocol.md)
    metrics.observe_event(body)                  # every telemetry.event body
    metrics.set_up(host, False)                  # a host went silent (an agent reports itself up)

Metrics, all labelled by `host` (the sample's hostname):
- mlx_fleet_soc_temperature_celsius{host,source}: gauge; absent while the host has no reading
  (never NaN, never a made-up number).
- mlx_fleet_cooling_state{host}: gauge, 0 ok, 1 reduce_batch, 2 pause, 3 stop; absent without a
  reading.
- mlx_fleet_pause_seconds_total{host}: counter of seconds supervised jobs spent paused (from the
  samples' pause_s_total; an agent restart, which resets that total, adds its new value).
- mlx_fleet_policy_actions_total{host,action}: counter of the actions the policy took on jobs
  (pause, resume, reduce_batch, restore_batch, stop).
- mlx_fleet_agent_up{host}: gauge, 1 while the host's telemetry arrives.
- mlx_fleet_storage_ok{host}: gauge, 1 while the host's agent writes everything it keeps, 0
  while its disk refuses a write (the samples' storage_error says which; it retries).
- mlx_fleet_power_watts{host,source,rail}: gauge, the watts of each rail the host's power source
  measures (cpu, gpu, ane, dram; system is the whole machine and holds the others) over its
  last poll; absent without a reading. The vendor's estimates (docs/energy.md).
- mlx_fleet_energy_joules_total{host,source,rail}: counter of the joules each rail used (from
  the samples' cumulative joules; an agent restart, which resets them, adds its new value).
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, Counter, Gauge, make_wsgi_app

from shared.policy import CoolingState

STATE_VALUES: dict[str, int] = {state.value: state.severity for state in CoolingState}
"""ok 0, reduce_batch 1, pause 2, stop 3: the order of CoolingState."""
POLICY_ACTIONS = frozenset({"pause", "resume", "reduce_batch", "restore_batch", "stop"})
"""Event actions the cooling policy takes; the others (start, exit, kill, ...) are not counted."""


class TelemetryMetrics:
    """The metrics above in a registry of their own, updated from telemetry bodies. Not
    thread-safe on its own bookkeeping: feed it from one thread."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.temperature = Gauge(
            "mlx_fleet_soc_temperature_celsius",
            "SoC temperature of the host's latest reading.",
            ["host", "source"],
            registry=self.registry,
        )
        self.cooling_state = Gauge(
            "mlx_fleet_cooling_state",
            "What the host's policy says now: 0 ok, 1 reduce_batch, 2 pause, 3 stop.",
            ["host"],
            registry=self.registry,
        )
        self.pause_seconds = Counter(
            "mlx_fleet_pause_seconds",
            "Seconds supervised jobs on the host spent paused.",
            ["host"],
            registry=self.registry,
        )
        self.policy_actions = Counter(
            "mlx_fleet_policy_actions",
            "Actions the cooling policy took on the host's jobs.",
            ["host", "action"],
            registry=self.registry,
        )
        self.agent_up = Gauge(
            "mlx_fleet_agent_up",
            "1 while the host's telemetry arrives.",
            ["host"],
            registry=self.registry,
        )
        self.storage_ok = Gauge(
            "mlx_fleet_storage_ok",
            "1 while the host's agent writes all it keeps, 0 while its disk refuses a write.",
            ["host"],
            registry=self.registry,
        )
        self.power = Gauge(
            "mlx_fleet_power_watts",
            "Watts per rail of the host's power source over its last poll (vendor estimates).",
            ["host", "source", "rail"],
            registry=self.registry,
        )
        self.energy = Counter(
            "mlx_fleet_energy_joules",
            "Joules per rail the host's power source counted (vendor estimates).",
            ["host", "source", "rail"],
            registry=self.registry,
        )
        self._sources: dict[str, str] = {}
        self._pause_seen: dict[str, float] = {}
        self._states: set[str] = set()
        self._power_shown: dict[str, set[tuple[str, str]]] = {}
        self._joules_seen: dict[tuple[str, str, str], float] = {}

    def observe_sample(self, sample: Mapping[str, Any]) -> None:
        host = sample["host"]
        previous = self._sources.pop(host, None)
        if previous is not None and (sample["celsius"] is None or previous != sample["source"]):
            self.temperature.remove(host, previous)
        if sample["celsius"] is not None:
            self.temperature.labels(host, sample["source"]).set(sample["celsius"])
            self._sources[host] = sample["source"]
        state = STATE_VALUES.get(sample["state"] or "")
        if state is None:
            if host in self._states:
                self.cooling_state.remove(host)
                self._states.discard(host)
        else:
            self.cooling_state.labels(host).set(state)
            self._states.add(host)
        total = float(sample["pause_s_total"])
        seen = self._pause_seen.get(host, 0.0)
        added = total - seen if total >= seen else total  # lower: the agent restarted
        if added > 0:
            self.pause_seconds.labels(host).inc(added)
        self._pause_seen[host] = total
        self.agent_up.labels(host).set(1)
        self.storage_ok.labels(host).set(0 if sample["storage_error"] else 1)
        self._observe_power(host, sample.get("power"))

    def _observe_power(self, host: str, power: Mapping[str, Any] | None) -> None:
        """Each rail's watts as a gauge (gone when a poll has none) and its joules added to the
        counter; cumulative joules lower than the last seen mean the agent restarted."""
        source = (power or {}).get("source") or ""
        watts = (power or {}).get("watts") or {}
        shown = {(source, rail) for rail in watts}
        for gone in self._power_shown.get(host, set()) - shown:
            self.power.remove(host, *gone)
        for rail, value in watts.items():
            self.power.labels(host, source, rail).set(value)
        self._power_shown[host] = shown
        for rail, total in ((power or {}).get("joules") or {}).items():
            key = (host, source, rail)
            seen = self._joules_seen.get(key, 0.0)
            added = total - seen if total >= seen else total
            if added > 0:
                self.energy.labels(host, source, rail).inc(added)
            self._joules_seen[key] = total

    def observe_event(self, event: Mapping[str, Any]) -> None:
        if event["action"] in POLICY_ACTIONS:
            self.policy_actions.labels(event["host"], event["action"]).inc()

    def set_up(self, host: str, up: bool) -> None:
        self.agent_up.labels(host).set(1 if up else 0)


def parse_address(text: str) -> tuple[str, int]:
    """'HOST:PORT' (IPv6 in brackets) -> (host, port); ValueError naming the expected form."""
    host, sep, port = text.strip().rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ValueError(
            f"bad address {text!r}: expected HOST:PORT, e.g. 127.0.0.1:9101 "
            "(port 0 picks a free one)"
        )
    return host.strip("[]"), int(port)


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _ThreadingServer6(_ThreadingServer):
    address_family = socket.AF_INET6


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Scrapes every few seconds would drown the log."""


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
    """Serve /metrics for `registry` at HOST:PORT on a daemon thread. Raises ValueError for a
    bad address, OSError when it cannot bind."""
    host, port = parse_address(address)
    server_class = _ThreadingServer6 if ":" in host else _ThreadingServer
    server = make_server(host, port, make_wsgi_app(registry), server_class, _QuietHandler)
    thread = threading.Thread(target=server.serve_forever, name="metrics", daemon=True)
    thread.start()
    return MetricsServer(server, thread)
