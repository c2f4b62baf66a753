"""`sim:plant[:PRESET][,k=v...]`: the thermal plant (shared.cooling.plant) as a thermal source,
heated by the job's real duty cycle (agent.sensors.job_load: the processes it counts and how).

Each read advances the plant by the wall time since the previous read times `speed`, at the duty
the job's processes showed over that time, and returns the die temperature (simulated, like
`sim`). The plant's clock is published two ways:
- `clock_source.read()` gives a shared.cooling.clocks.ClockReading (the GPU clock the firmware
  left, and the duty as the GPU's active share), simulated, source `plant:PRESET`;
- a small JSON state file, rewritten atomically at every read, for a load that must follow the
  clock (a job doing work at `clock_factor` times its full rate): its path is the environment's
  MLX_FLEET_PLANT_STATE when set, else one of the plant's own which the source then sets in
  this process's environment, so every process it starts (`agent run`'s CMD) inherits it.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import replace
from pathlib import Path

from agent.clocks.base import ClockSource
from agent.sensors.job_load import JobLoad
from agent.thermal.base import ThermalReading, ThermalSource
from shared.cooling.clocks import ClockReading
from shared.cooling.plant import Plant, PlantParams, plant_spec
from shared.io.files import replace_atomically
from shared.io.paths import data_subdir

PLANT_STATE_ENV = "MLX_FLEET_PLANT_STATE"
SENSOR = "plant die"
"""The plant's one sensor: its die temperature."""


def scale_label(params: PlantParams) -> str:
    """How the plant's time relates to the wall's, as every display of it says."""
    return "plant time = wall time" if params.speed == 1 else f"plant time x{params.speed:g}"


class PlantClocks(ClockSource):
    """The plant's clock as a clock source (what the clocks work reads into samples: a
    ClockSource, so agent.clocks.registry.open_clock_source takes it as the plant's own)."""

    simulated = True

    def __init__(self, source: PlantSource) -> None:
        super().__init__()
        self._source = source
        self.name = f"plant:{source.plant.params.preset}"

    def read(self) -> ClockReading:
        plant = self._source.plant
        return ClockReading(
            time=time.time(),
            gpu_hz=plant.clock_hz,
            gpu_active=plant.duty,
            cpu_p_hz=None,
            cpu_e_hz=None,
            source=self.name,
            simulated=True,
            note=f"simulated GPU clock ({scale_label(plant.params)})",
        )


class PlantSource(ThermalSource):
    """The plant, stepped at each read by the job's demand since the previous one."""

    simulated = True

    def __init__(
        self,
        params: PlantParams,
        *,
        roots: Callable[[], Iterable[int]] = tuple,
        state_path: Path | None = None,
        load: Callable[[], float] | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        """`roots` names more job process trees than the opener's descendants (the daemon's
        supervised jobs); `load` replaces the measured demand (CPU-seconds since its previous
        call) and `monotonic` the wall clock, for a caller that drives the plant itself."""
        super().__init__()
        self.plant = Plant(params)
        self.name = plant_spec(params)
        self.clock_source = PlantClocks(self)
        self._job = JobLoad(roots)
        self._load = load or self._job
        self._load()  # the first call only starts the interval
        self._monotonic = monotonic
        self._last = monotonic()
        self._owns_state = state_path is None and not os.environ.get(PLANT_STATE_ENV)
        self.state_path = state_path or _state_path()
        self._write_state()

    def read(self) -> ThermalReading | None:
        demand = self._load()
        # the wall interval ends where the demand's does, after the sampling (listing the job's
        # processes takes milliseconds on a crowded machine): taken before it, a sampling slower
        # than the last one gave a busy job's poll more demand than wall time, clipped to duty 1,
        # and a job run at full speed for whole polls (a pause tier) did work the die never felt
        now = self._monotonic()
        wall = max(now - self._last, 0.0)
        self._last = now
        duty = min(demand / wall, 1.0) if wall > 0 else self.plant.duty
        self.plant.advance(wall * self.plant.params.speed, duty)
        self._write_state()
        reading = self._reading(self.plant.celsius, sensor=SENSOR)
        return replace(reading, die_time=self.plant.time_s)

    def heat_from(self, roots: Callable[[], Iterable[int]]) -> None:
        """Count the process trees rooted at `roots()` too (asked at every read): the agent
        daemon names the process groups of the jobs `agent run` supervises with its readings."""
        self._job.roots = roots

    def close(self) -> None:
        """Removes the state file unless a caller named it (they read it after)."""
        if self._owns_state:
            self.state_path.unlink(missing_ok=True)

    def _write_state(self) -> None:
        plant = self.plant
        state = {
            "preset": plant.params.preset,
            "simulated": True,
            "speed": plant.params.speed,
            "celsius": plant.celsius,
            "clock_hz": plant.clock_hz,
            "clock_factor": plant.clock_factor,
            "throttled": plant.throttled,
            "duty": plant.duty,
            "plant_time_s": plant.time_s,
            "work": plant.work,
            "throttled_s": plant.throttled_s,
            "time": time.time(),
        }
        try:
            replace_atomically(self.state_path, json.dumps(state))
        except OSError as exc:
            self.last_error = f"{self.name}: cannot write {self.state_path}: {exc}"


def _state_path() -> Path:
    """MLX_FLEET_PLANT_STATE, else a file of this process's own, then named in the environment
    its children inherit."""
    named = os.environ.get(PLANT_STATE_ENV)
    if named:
        return Path(named)
    path = data_subdir("plant") / f"{os.getpid()}.json"
    os.environ[PLANT_STATE_ENV] = str(path)
    return path


def read_plant_state(path: str | Path | None = None) -> dict[str, object] | None:
    """A load's view of the plant: the state file's contents (the environment's path by
    default); None while there is none or it cannot be read."""
    path = path or os.environ.get(PLANT_STATE_ENV)
    if not path:
        return None
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
