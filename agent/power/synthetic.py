"""Power sources that are not meters: the thermal model's power, driven by this machine's load,
and a replayed `seconds,watts` curve. Both set `simulated`, and every display labels their figures
as such."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from agent.power.base import Integrator, PowerReading, PowerSource
from agent.power.decode import replay_energy
from agent.sensors.load import CpuLoad
from agent.sensors.replay import read_replay_csv, replay_value
from shared.benchmark.energy import SYSTEM
from shared.cooling.sources import SimParams


class PowerSimSource(PowerSource):
    """The sim thermal source's power model, P = idle_w + (max_w - idle_w) x CPU load, integrated
    exactly between reads with the load measured since the previous one."""

    name = "sim"
    simulated = True
    rails = (SYSTEM,)

    def __init__(
        self,
        params: SimParams | None = None,
        load: Callable[[], float] | None = None,
        spec: str = "sim",
    ) -> None:
        """`spec` is the name it was opened with (`sim:idle_w=5,max_w=30`): a job process opens
        the same model with it."""
        super().__init__()
        self.params = params or SimParams()
        self._spec = spec
        self._load = load or CpuLoad()
        self._load()  # the first load sample only starts the interval
        self._energy = Integrator()
        self._last = time.monotonic()

    @property
    def spec(self) -> str:
        return self._spec

    def read(self) -> PowerReading | None:
        now = time.monotonic()
        self._energy.add_watts({SYSTEM: self.params.watts(self._load())}, now - self._last)
        self._last = now
        return self._reading(self._energy.joules, self._energy.watts, at=now)


class PowerReplaySource(PowerSource):
    """A `seconds,watts` CSV played back in real time from the moment the source opens; its
    energy is the exact integral of the curve."""

    simulated = True
    rails = (SYSTEM,)

    def __init__(self, path: str | Path) -> None:
        super().__init__()
        self.name = f"replay:{path}"
        self._rows = read_replay_csv(path, unit="watts")
        self._opened = time.monotonic()

    def read(self) -> PowerReading | None:
        now = time.monotonic()
        elapsed = now - self._opened
        joules = replay_energy(self._rows, elapsed)
        watts = replay_value(self._rows, elapsed)
        if joules is None or watts is None:
            return self._fail(f"{self.name}: no watts at {elapsed:.1f} s")
        return self._reading({SYSTEM: joules}, {SYSTEM: watts}, at=now)
