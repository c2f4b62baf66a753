"""What every power source gives: cumulative joules per rail since it opened, or None with a
reason. A counter (IOReport, RAPL) is read as it is; a source that gives watts (the SMC's PSTR,
macmon, powermetrics, sim, replay) is integrated over time, so every source reads the same way
and any two readings make an energy window (shared.benchmark.energy.between)."""

from __future__ import annotations

import time
from abc import abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from agent.sensors.base import NoSource, Source
from shared.benchmark.energy import MeterInfo, whole

_wall_clock, _monotonic = time.time, time.monotonic


@dataclass(frozen=True)
class PowerReading:
    """One observation: `joules` per rail since the source opened, `watts` per rail over the
    interval before it (empty until a source has two points). `monotonic` times windows;
    `time` is the wall clock telemetry carries."""

    joules: Mapping[str, float]
    watts: Mapping[str, float]
    source: str
    simulated: bool = False
    time: float = field(default_factory=_wall_clock)
    monotonic: float = field(default_factory=_monotonic)

    @property
    def total_j(self) -> float | None:
        return whole(self.joules)

    @property
    def total_w(self) -> float | None:
        return whole(self.watts)

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "simulated": self.simulated,
            "time": self.time,
            "watts": dict(self.watts),
            "joules": dict(self.joules),
            "total_w": self.total_w,
            "total_j": self.total_j,
        }


class PowerSource(Source):
    """A place energy comes from. `rails` are what it measures (shared.benchmark.energy.RAILS);
    `resolution_s` is the shortest window it tells apart: a counter's publication interval, a
    stream's sample interval, 0 for a model."""

    rails: tuple[str, ...] = ()
    resolution_s: float = 0.0

    @property
    def spec(self) -> str:
        """The name that opens this same source again (a job process opens its daemon's):
        `name`, unless the source was opened with parameters it does not show."""
        return self.name

    @abstractmethod
    def read(self) -> PowerReading | None:
        """The cumulative reading now, or None (see `last_error`)."""

    def info(self) -> MeterInfo:
        return MeterInfo(self.name, self.simulated, self.rails, self.resolution_s)

    def _reading(
        self, joules: Mapping[str, float], watts: Mapping[str, float], at: float | None = None
    ) -> PowerReading:
        """A reading; `at` is the monotonic time its joules are for (now when not given)."""
        self.last_error = None
        return PowerReading(
            dict(joules),
            dict(watts),
            self.name,
            self.simulated,
            monotonic=_monotonic() if at is None else at,
        )


class NoPowerSource(NoSource, PowerSource):
    """No meter: every read is None, with the reason nothing else worked."""

    def __init__(self, reason: str = "no power source selected") -> None:
        super().__init__(reason)


class Integrator:
    """Cumulative joules per rail from what a source gives: counter deltas (`add`) or watts held
    over an interval (`add_watts`); `watts` is the latest interval's power per rail."""

    def __init__(self) -> None:
        self.joules: dict[str, float] = {}
        self.watts: dict[str, float] = {}

    def add(self, joules: Mapping[str, float], seconds: float) -> None:
        for rail, value in joules.items():
            self.joules[rail] = self.joules.get(rail, 0.0) + value
        if seconds > 0:
            self.watts = {rail: value / seconds for rail, value in joules.items()}

    def add_watts(self, watts: Mapping[str, float], seconds: float) -> None:
        for rail, value in watts.items():
            self.joules[rail] = self.joules.get(rail, 0.0) + value * max(seconds, 0.0)
        self.watts = dict(watts)
