"""A thermal source whose readings someone else hands over: a benchmark job process gets the
daemon's on its stdin, RemoteMonitor gets them off the telemetry socket."""

from __future__ import annotations

from agent.sensors.base import SourceInfo
from agent.thermal import ThermalReading, ThermalSource


class FedSource(ThermalSource):
    """Readings that another process took: read() returns the latest one handed over, never
    touching a sensor. Named after the source that took them. `pushed`: the monitor over it
    records each as it is handed over, and polls nothing itself."""

    pushed = True

    def __init__(self, info: SourceInfo) -> None:
        super().__init__()
        self.name = info.name
        self.simulated = info.simulated
        self._latest: ThermalReading | None = None
        self.last_error = "no reading from the agent yet"

    def feed(self, reading: ThermalReading | None) -> None:
        self._latest = reading
        self.last_error = None if reading else "the agent has no reading"

    def end(self, why: str) -> None:
        self._latest = None
        self.last_error = why

    def read(self) -> ThermalReading | None:
        return self._latest
