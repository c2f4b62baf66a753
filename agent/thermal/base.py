"""What every thermal source gives: a reading, or None with a reason; and what every source
(thermal or power, agent.power) shares."""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from typing_extensions import Self


class SourceUnavailable(RuntimeError):
    """A source cannot work on this machine (wrong OS, tool missing, no sensors)."""


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

    def to_dict(self) -> dict[str, Any]:
        return {
            "celsius": self.celsius,
            "source": self.source,
            "sensor": self.sensor,
            "time": self.time,
            "sensors": dict(self.sensors),
            "pressure": self.pressure,
            "simulated": self.simulated,
        }


class Source(ABC):
    """Something read in a loop that must never take the loop down: a thermal source, a power
    meter. A hiccup is a None reading with the reason in `last_error`, never an exception."""

    name: str = "source"
    simulated: bool = False

    def __init__(self) -> None:
        self.last_error: str | None = None

    @abstractmethod
    def read(self) -> Any:
        """The current reading, or None (see `last_error`)."""

    def close(self) -> None:  # noqa: B027 - a hook: most sources hold nothing to release
        """Release processes and handles; safe to call twice."""

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _fail(self, reason: str) -> None:
        """Record why there is no reading; returns None so `return self._fail(...)` reads well."""
        self.last_error = reason


S = TypeVar("S", bound=Source)


def first_reading(
    candidates: Iterable[str], open_one: Callable[[str], S]
) -> tuple[S | None, list[str]]:
    """The first candidate that opens and gives a reading (what `auto` picks), and why each one
    before it did not; (None, every reason) when none does."""
    reasons: list[str] = []
    for candidate in candidates:
        try:
            source = open_one(candidate)
        except SourceUnavailable as exc:
            reasons.append(str(exc))
            continue
        if source.read() is not None:
            return source, reasons
        reasons.append(source.last_error or f"{candidate}: no reading")
        source.close()
    return None, reasons


class ThermalSource(Source):
    """A place temperatures come from. read() never raises for a sensor hiccup: it returns None and
    says why in `last_error`, so one bad sample cannot take a training run down."""

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
        )


class NoneSource(ThermalSource):
    """No sensor: every read is None, with the reason nothing else worked."""

    name = "none"

    def __init__(self, reason: str = "no thermal source selected") -> None:
        super().__init__()
        self.last_error = reason

    def read(self) -> ThermalReading | None:
        return None


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


class Backoff:
    """Exponential delays for retrying something that keeps failing; reset after a success."""

    def __init__(self, initial: float = 0.5, maximum: float = 30.0, factor: float = 2.0) -> None:
        self.initial = initial
        self.maximum = maximum
        self.factor = factor
        self._next = initial

    def next_delay(self) -> float:
        delay = self._next
        self._next = min(self._next * self.factor, self.maximum)
        return delay

    def reset(self) -> None:
        self._next = self.initial
