"""Sources that are not sensors: a thermal model driven by this machine's load, and a replayed
curve. Both set `simulated`, and every display labels their readings as such."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path

from agent.sensors.load import CpuLoad
from agent.sensors.replay import read_replay_csv, replay_value
from agent.thermal.base import ThermalReading, ThermalSource
from shared.cooling.sources import SimParams


def sim_step(celsius: float, load: float, dt: float, params: SimParams) -> float:
    """The model's exact solution over dt seconds with the load held constant."""
    target = params.steady_c(load)
    return target + (celsius - target) * math.exp(-dt / params.tau_s)


class SimSource(ThermalSource):
    """The thermal model, stepped at each read with the load measured since the previous one."""

    name = "sim"
    simulated = True

    def __init__(
        self, params: SimParams | None = None, load: Callable[[], float] | None = None
    ) -> None:
        """`load` gives the load since its previous call; this machine's CPU load by default."""
        super().__init__()
        self.params = params or SimParams()
        self._load = load or CpuLoad()
        self._load()  # the first load sample only starts the interval
        start = self.params.start_c
        self._celsius = self.params.steady_c(0.0) if start is None else start
        self._last = time.monotonic()

    def read(self) -> ThermalReading | None:
        now = time.monotonic()
        self._celsius = sim_step(self._celsius, self._load(), now - self._last, self.params)
        self._last = now
        return self._reading(self._celsius)


class ReplaySource(ThermalSource):
    """A `seconds,celsius` CSV played back in real time from the moment the source opens. Its
    readings name the sensor `replay`: whatever the curve was recorded from, what it gives is
    a replay, and a sensor label shown alone (a Prometheus series') must say so."""

    SENSOR = "replay"

    simulated = True

    def __init__(self, path: str | Path) -> None:
        super().__init__()
        self.name = f"replay:{path}"
        self._rows = read_replay_csv(path)
        self._opened = time.monotonic()

    def read(self) -> ThermalReading | None:
        elapsed = time.monotonic() - self._opened
        celsius = replay_value(self._rows, elapsed)
        if celsius is None:
            return self._fail(f"{self.name}: no value at {elapsed:.1f} s")
        return self._reading(celsius, sensor=self.SENSOR)
