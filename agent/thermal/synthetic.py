"""Sources that are not sensors: a thermal model driven by this machine's load, and a replayed
curve. Both set `simulated`, and every display labels their readings as such."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from pathlib import Path

import psutil

from agent.thermal.base import SourceSpecError, ThermalReading, ThermalSource
from agent.thermal.parsers import ReplayFormatError, parse_replay_csv, replay_value


@dataclass(frozen=True)
class SimParams:
    """A first-order model: dT/dt = (ambient + R * P(load) - T) / tau, P linear in CPU load.

    The defaults put an idle chip at 35 °C and a fully loaded one near 95 °C, the bands the seed
    docs quote for a fanless MacBook Air.
    """

    ambient_c: float = 25.0
    r_c_per_w: float = 2.5
    idle_w: float = 4.0
    max_w: float = 28.0
    tau_s: float = 30.0
    start_c: float | None = None  # None: the idle steady state

    def __post_init__(self) -> None:
        if not (self.tau_s > 0 and self.r_c_per_w > 0 and 0 <= self.idle_w <= self.max_w):
            raise SourceSpecError(
                "sim: need tau_s > 0, r_c_per_w > 0 and 0 <= idle_w <= max_w, got "
                f"tau_s={self.tau_s}, r_c_per_w={self.r_c_per_w}, idle_w={self.idle_w}, "
                f"max_w={self.max_w}"
            )

    def steady_c(self, load: float) -> float:
        """Where the temperature settles if `load` (0..1) is held."""
        load = min(max(load, 0.0), 1.0)
        return self.ambient_c + self.r_c_per_w * (self.idle_w + (self.max_w - self.idle_w) * load)


def sim_step(celsius: float, load: float, dt: float, params: SimParams) -> float:
    """The model's exact solution over dt seconds with the load held constant."""
    target = params.steady_c(load)
    return target + (celsius - target) * math.exp(-dt / params.tau_s)


def parse_sim_params(spec: str) -> SimParams:
    """`ambient_c=30,tau_s=5` (the text after `sim:`) -> SimParams; empty gives the defaults."""
    known = {f.name for f in fields(SimParams)}
    values: dict[str, float] = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        key, sep, value = (piece.strip() for piece in item.partition("="))
        if not sep or key not in known:
            raise SourceSpecError(
                f"sim: bad parameter {item!r}; known: {', '.join(sorted(known))} (as key=value)"
            )
        try:
            values[key] = float(value)
        except ValueError:
            raise SourceSpecError(f"sim: {key} must be a number, got {value!r}") from None
    return replace(SimParams(), **values)


def cpu_load() -> float:
    """This machine's CPU load (0..1) since the previous call."""
    return psutil.cpu_percent(interval=None) / 100.0


class SimSource(ThermalSource):
    """The thermal model, stepped at each read with the load measured since the previous one."""

    name = "sim"
    simulated = True

    def __init__(
        self, params: SimParams | None = None, load: Callable[[], float] = cpu_load
    ) -> None:
        super().__init__()
        self.params = params or SimParams()
        self._load = load
        self._load()  # the first load sample only starts psutil's interval
        start = self.params.start_c
        self._celsius = self.params.steady_c(0.0) if start is None else start
        self._last = time.monotonic()

    def read(self) -> ThermalReading | None:
        now = time.monotonic()
        self._celsius = sim_step(self._celsius, self._load(), now - self._last, self.params)
        self._last = now
        return self._reading(self._celsius)


class ReplaySource(ThermalSource):
    """A `seconds,celsius` CSV played back in real time from the moment the source opens."""

    simulated = True

    def __init__(self, path: str | Path) -> None:
        super().__init__()
        self.name = f"replay:{path}"
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise ReplayFormatError(f"{path}: cannot read replay file: {exc.strerror}") from exc
        self._rows = parse_replay_csv(text, str(path))
        self._opened = time.monotonic()

    def read(self) -> ThermalReading | None:
        elapsed = time.monotonic() - self._opened
        celsius = replay_value(self._rows, elapsed)
        if celsius is None:
            return self._fail(f"{self.name}: no value at {elapsed:.1f} s")
        return self._reading(celsius)
