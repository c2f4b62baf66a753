"""What every thermal source gives: a reading, or None with a reason (the Source protocol below
it, shared with the power meters, is agent.sensors.base); and a reading's form on the wire."""

from __future__ import annotations

import time
from abc import abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from agent.sensors.base import NoSource, Source


@dataclass(frozen=True)
class ThermalReading:
    """One observation. `simulated` marks sim/replay values so nobody mistakes them for a sensor;
    `sensor` names the one `celsius` is (`TCMz`, `PMU TP1g`, `cpu_temp_avg`, ...): readings of
    different sources or sensors differ by up to tens of °C and must never be mixed unsaid."""

    celsius: float | None
    source: str
    time: float = field(default_factory=time.time)
    sensors: Mapping[str, float] = field(default_factory=dict)
    pressure: str | None = None
    simulated: bool = False
    sensor: str | None = None
    note: str | None = None
    """What a reader must know about this reading: that a part is not covered, or covered by
    another sensor (the smc source's GPU keys: agent.thermal.smc_die.GpuWatch)."""
    die_time: float | None = None
    """The die's own clock (s, only forward) where it runs apart from the wall's: a simulated
    plant's time, `speed` times the wall's. The pace controller integrates in it, so a plant
    run faster than a Mac is paced as the Mac would be (shared.cooling.policy). Not sent."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "celsius": self.celsius,
            "source": self.source,
            "sensor": self.sensor,
            "time": self.time,
            "sensors": dict(self.sensors),
            "pressure": self.pressure,
            "simulated": self.simulated,
            "note": self.note,
        }


class ThermalSource(Source):
    """A place temperatures come from. read() never raises for a sensor hiccup: it returns None and
    says why in `last_error`, so one bad sample cannot take a training run down."""

    scale: str | None = None
    """The kind of sensor `celsius` is on (`smc`, `iohid`, ...): the policy's defaults are set
    per scale (shared.cooling.calibration). None: no Mac calibrates it (sim, replay, a callable)."""

    pushed: bool = False
    """Its readings are handed to the monitor (ThermalMonitor.record) as they arrive, never
    polled: the monitor starts no thread of its own for it."""

    @abstractmethod
    def read(self) -> ThermalReading | None:
        """The current reading, or None (see `last_error`)."""

    def _reading(
        self,
        celsius: float | None,
        sensors: Mapping[str, float] | None = None,
        pressure: str | None = None,
        sensor: str | None = None,
        note: str | None = None,
    ) -> ThermalReading:
        """A reading; its `sensor` is the one given, else the sensor whose value `celsius` is."""
        self.last_error = None
        sensors = dict(sensors) if sensors else {}
        if sensor is None and celsius is not None and sensors:
            sensor = next((name for name, value in sensors.items() if value == celsius), None)
        return ThermalReading(
            celsius=celsius,
            source=self.name,
            sensors=sensors,
            pressure=pressure,
            simulated=self.simulated,
            sensor=sensor,
            note=note,
        )


class OverSource(ThermalSource):
    """A source over another (`inner`): it reads through it, under its name, its simulated mark
    and its scale, so nothing downstream can tell the two apart by their labels."""

    def __init__(self, inner: ThermalSource) -> None:
        super().__init__()
        self.inner = inner
        self.name = inner.name
        self.simulated = inner.simulated
        self.scale = inner.scale


class NoneSource(NoSource, ThermalSource):
    """No sensor: every read is None, with the reason nothing else worked."""

    def __init__(self, reason: str = "no thermal source selected") -> None:
        super().__init__(reason)


class CallableSource(ThermalSource):
    """Wraps a zero-argument function returning °C or None (the seed's `read_fn` style)."""

    def __init__(self, fn: Callable[[], float | None]) -> None:
        super().__init__()
        self._fn = fn
        self.name = f"callable:{getattr(fn, '__name__', type(fn).__name__)}"

    def read(self) -> ThermalReading | None:
        celsius = self._fn()
        if celsius is None:
            return self._fail(f"{self.name} returned None")
        return self._reading(float(celsius))


def reading_wire(reading: ThermalReading | None) -> dict[str, Any] | None:
    """The fields of a reading that travel to a job process (sensors stay home: small items)."""
    if reading is None:
        return None
    return {
        "celsius": reading.celsius,
        "pressure": reading.pressure,
        "time": reading.time,
        "source": reading.source,
        "simulated": reading.simulated,
        "sensor": reading.sensor,
    }


def reading_from_wire(data: Mapping[str, Any] | None) -> ThermalReading | None:
    """A reading from reading_wire() or from a telemetry.sample body; None for nil or a sample
    without degrees or pressure."""
    if data is None or (data["celsius"] is None and data["pressure"] is None):
        return None
    return ThermalReading(
        celsius=data["celsius"],
        source=data["source"],
        time=data["time"],
        pressure=data["pressure"],
        simulated=data["simulated"],
        sensor=data.get("sensor"),
    )
