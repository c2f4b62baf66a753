"""The thermal plant: a model of a Mac under load that a cooling policy is proven against
(`--thermal-source sim:plant[:PRESET][,k=v...]`; docs/thermal.md, The thermal plant).

Physics, in the order it acts:
- the die is one thermal RC to ambient: C dT/dt = P - (T - ambient) / R, so tau = R C and a
  constant P settles at ambient + R P;
- P = static + duty * dynamic(state): dynamic power is the CMOS switching power
  alpha C V^2 f (Weste & Harris, CMOS VLSI Design, ch. 5 "Power"), scaled so the top DVFS
  state at full duty draws `dynamic_w`; each state's voltage comes from the chip's DVFS table, so
  a lower clock also runs at a lower voltage and power falls faster than the clock;
- a firmware looks every `step_s` (plant time): above `limit_c` it steps the clock down one DVFS
  state, below `limit_c - hysteresis_c` up one, in between it holds;
- work is done at duty * f / f_top per plant second: a stopped job (duty 0) does none.
Static power is held constant whatever the state and duty: stopping saves only dynamic power,
so the model never flatters stopping over throttling, nor the reverse.

Pure: `Plant` advances by plant seconds and a duty the caller measured (agent.thermal.plant
measures it from the job's processes); the analytic optima are closed forms of the same model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace

from shared.cooling.spec_params import spec_numbers


class PlantSpecError(ValueError):
    """A preset that does not exist, or a parameter out of range or not a number."""


@dataclass(frozen=True)
class DvfsState:
    """One operating point of the chip's DVFS table."""

    hz: float
    volts: float


M2_GPU_STATES = tuple(
    DvfsState(mhz * 1e6, uv / 1e6)
    for mhz, uv in (
        (444, 603_000),
        (612, 675_000),
        (808, 710_000),
        (968, 775_000),
        (1110, 820_000),
        (1236, 875_000),
        (1338, 915_000),
        (1398, 950_000),
    )
)
"""The M2 GPU's DVFS table, clock and voltage (AsahiLinux/linux arch/arm64/boot/dts/apple/
t8112.dtsi, gpu_opp: 444-1398 MHz at 0.603-0.950 V). MLX's work is GPU work, so the plant's
clock is the GPU's."""


@dataclass(frozen=True)
class PlantParams:
    """A plant's constants; `preset` names where they came from (docs/thermal.md lists each
    figure's source). Times are plant seconds; `speed` is how many plant seconds pass per
    wall second (speed=60: an hour of a Mac in a minute), labelled wherever the plant is shown."""

    preset: str
    ambient_c: float
    r_c_per_w: float
    tau_s: float
    static_w: float
    dynamic_w: float
    limit_c: float
    hysteresis_c: float
    step_s: float = 1.0
    speed: float = 1.0
    start_c: float | None = None
    """None: the idle steady state (ambient + R * static)."""
    states: tuple[DvfsState, ...] = field(default=M2_GPU_STATES, repr=False)

    def __post_init__(self) -> None:
        checks = {
            "r_c_per_w": self.r_c_per_w > 0,
            "tau_s": self.tau_s > 0,
            "static_w": self.static_w >= 0,
            "dynamic_w": self.dynamic_w > 0,
            "hysteresis_c": self.hysteresis_c >= 0,
            "step_s": self.step_s > 0,
            "speed": 0 < self.speed <= 10_000,
            "ambient_c": -40 <= self.ambient_c < self.limit_c,
            "limit_c": self.limit_c <= 150,
        }
        for name, ok in checks.items():
            if not ok:
                raise PlantSpecError(
                    f"plant: {name}={getattr(self, name)} is out of range ({RANGES[name]})"
                )
        if self.start_c is not None and not -40 <= self.start_c <= 150:
            raise PlantSpecError(f"plant: start_c={self.start_c} is out of range (-40..150 °C)")
        if not self.states or any(
            a.hz >= b.hz for a, b in zip(self.states, self.states[1:], strict=False)
        ):
            raise PlantSpecError("plant: the DVFS states must rise in frequency")

    @property
    def top(self) -> DvfsState:
        return self.states[-1]

    def clock_factor(self, level: int) -> float:
        """The clock of DVFS state `level` as a share of the top state's: the work rate."""
        return self.states[level].hz / self.top.hz

    def dynamic_at(self, level: int) -> float:
        """Watts of switching power at full duty in state `level`: dynamic_w * f V^2 / f_top
        V_top^2."""
        state, top = self.states[level], self.top
        return self.dynamic_w * (state.hz * state.volts**2) / (top.hz * top.volts**2)

    def power(self, level: int, duty: float) -> float:
        return self.static_w + min(max(duty, 0.0), 1.0) * self.dynamic_at(level)

    def steady_c(self, level: int, duty: float) -> float:
        """Where the die settles with `level` and `duty` held."""
        return self.ambient_c + self.r_c_per_w * self.power(level, duty)

    def budget_w(self, cap_c: float) -> float:
        """The dynamic watts that hold the die at `cap_c` in steady state (may be negative)."""
        return (cap_c - self.ambient_c) / self.r_c_per_w - self.static_w


RANGES = {
    "r_c_per_w": "> 0 °C/W",
    "tau_s": "> 0 s",
    "static_w": ">= 0 W",
    "dynamic_w": "> 0 W",
    "hysteresis_c": ">= 0 °C",
    "step_s": "> 0 s",
    "speed": "0 < speed <= 10000",
    "ambient_c": "-40 °C up to below limit_c",
    "limit_c": "above ambient_c, <= 150 °C",
}


PRESETS: dict[str, PlantParams] = {
    # A fanless M2 MacBook Air (docs/thermal.md, The thermal plant, gives each figure's source):
    # the GPU's own DVFS table and its top state's 22.8 W; throttles at 105 °C (M1/M2 hold
    # 105-108 °C); its sustained GPU work settles near 0.73 of its first minutes'; throttling
    # starts about 10 minutes into a sustained load.
    "air": PlantParams(
        preset="air",
        ambient_c=25.0,
        r_c_per_w=5.9,
        tau_s=860.0,
        static_w=2.0,
        dynamic_w=22.8,
        limit_c=105.0,
        hysteresis_c=2.0,
    ),
    # An M2 Mac mini, fan-cooled: the same GPU table; 7 W idle and 50 W at most for the whole
    # machine; under a sustained GPU load it stays far below its limit and never throttles.
    "mini": PlantParams(
        preset="mini",
        ambient_c=25.0,
        r_c_per_w=1.9,
        tau_s=120.0,
        static_w=5.0,
        dynamic_w=22.8,
        limit_c=105.0,
        hysteresis_c=2.0,
    ),
}
DEFAULT_PRESET = "air"
TUNABLE = tuple(f.name for f in fields(PlantParams) if f.name not in ("preset", "states"))
"""The constants a spec may override (`sim:plant:air,speed=60,ambient_c=30`)."""


def plant_spec(params: PlantParams) -> str:
    """The name that opens `params` again: `sim:plant:air`, with every constant that differs
    from the preset's (`sim:plant:air,speed=60`), so the time scale is shown wherever the
    source's name is."""
    preset = PRESETS.get(params.preset)
    changed = [
        f"{name}={getattr(params, name):g}"
        for name in TUNABLE
        if preset is None or getattr(params, name) != getattr(preset, name)
        if getattr(params, name) is not None
    ]
    return ",".join([f"sim:plant:{params.preset}", *changed])


def parse_plant_spec(spec: str) -> PlantParams:
    """`[:PRESET][,k=v...]` (what follows `sim:plant`) -> PlantParams. PlantSpecError names a
    preset that does not exist, an unknown key, or a value out of range or not a number."""
    head, _, rest = spec.partition(",")
    if head and not head.startswith(":"):
        raise PlantSpecError(f"plant: expected sim:plant[:PRESET][,k=v...], got {'plant' + spec!r}")
    preset = head[1:].strip().lower() or DEFAULT_PRESET
    if preset not in PRESETS:
        raise PlantSpecError(f"plant: no preset {preset!r}; presets: {', '.join(sorted(PRESETS))}")
    values = spec_numbers(rest, TUNABLE, "plant", PlantSpecError)
    return replace(PRESETS[preset], **values)


class Plant:
    """The model's state: die temperature, the firmware's DVFS state, and what the job got done.
    `advance` integrates exactly (the exponential solution) between firmware ticks."""

    def __init__(self, params: PlantParams) -> None:
        self.params = params
        top = len(params.states) - 1
        self.celsius = params.steady_c(top, 0.0) if params.start_c is None else params.start_c
        self.level = top
        self.time_s = 0.0
        self.work = 0.0
        """Work done, in top-clock plant seconds at full duty."""
        self.throttled_s = 0.0
        """Plant seconds spent below the top state."""
        self.duty = 0.0
        self._since_tick = 0.0
        self._last_tick_c = self.celsius

    @property
    def clock_factor(self) -> float:
        return self.params.clock_factor(self.level)

    @property
    def clock_hz(self) -> float:
        return self.params.states[self.level].hz

    @property
    def throttled(self) -> bool:
        return self.level < len(self.params.states) - 1

    @property
    def power_w(self) -> float:
        return self.params.power(self.level, self.duty)

    def advance(self, seconds: float, duty: float) -> None:
        """`seconds` of plant time with the job at `duty` (0..1: its share of the time it ran)."""
        params = self.params
        self.duty = min(max(duty, 0.0), 1.0)
        left = max(seconds, 0.0)
        while left > 0:
            span = min(left, params.step_s - self._since_tick)
            target = params.steady_c(self.level, self.duty)
            self.celsius = target + (self.celsius - target) * math.exp(-span / params.tau_s)
            self.work += span * self.duty * self.clock_factor
            if self.throttled:
                self.throttled_s += span
            self.time_s += span
            self._since_tick += span
            left -= span
            if self._since_tick >= params.step_s - 1e-12:
                self._since_tick = 0.0
                self._firmware()

    def _firmware(self) -> None:
        """One step at a time, and only while the die still moves the wrong way: a state's
        effect on the die takes tau to show, and a firmware that stepped on regardless would
        swing the clock through the whole table."""
        params, previous = self.params, self._last_tick_c
        self._last_tick_c = self.celsius
        if self.celsius > params.limit_c and self.celsius >= previous and self.level > 0:
            self.level -= 1
        elif (
            self.celsius < params.limit_c - params.hysteresis_c
            and self.celsius <= previous
            and self.throttled
        ):
            self.level += 1


def unthrottled_optimum(params: PlantParams, cap_c: float) -> float:
    """The best steady work rate (share of the top clock at full duty) that holds the die at or
    below `cap_c` with the clock never lowered: the job duty-cycled at the top state. The
    firmware throttles above limit_c, so a cap above it holds at limit_c. What a policy that
    only stops and continues the job can reach at best."""
    budget = params.budget_w(min(cap_c, params.limit_c))
    return min(max(budget / params.dynamic_at(len(params.states) - 1), 0.0), 1.0)


def best_work_rate(params: PlantParams, cap_c: float) -> tuple[float, float]:
    """(work rate, clock factor): the best steady work rate under `cap_c` over every mix of DVFS
    states and duty. Work per dynamic watt, f / (f V^2) = 1 / V^2, is highest in the lowest
    state, so the optimum runs at full duty in the state the budget affords, time-shared with
    the next one up (the firmware's dither at its limit), or duty-cycles the lowest state when
    even that is too hot. The clock factor is the mix's mean clock."""
    budget = params.budget_w(min(cap_c, params.limit_c))
    if budget <= 0:
        return 0.0, params.clock_factor(0)
    lowest = params.dynamic_at(0)
    if budget <= lowest:
        return budget / lowest * params.clock_factor(0), params.clock_factor(0)
    top = len(params.states) - 1
    if budget >= params.dynamic_at(top):
        return 1.0, 1.0
    for level in range(top):
        low, high = params.dynamic_at(level), params.dynamic_at(level + 1)
        if low <= budget <= high:
            share = (budget - low) / (high - low)
            rate = (1 - share) * params.clock_factor(level) + share * params.clock_factor(level + 1)
            return rate, rate
    raise AssertionError("unreachable: the budget lies between the lowest and top states")


def time_to_limit(params: PlantParams, duty: float = 1.0) -> float | None:
    """Plant seconds from the start temperature to limit_c at the top clock and `duty`; None
    when the die settles below the limit (never throttles)."""
    top = len(params.states) - 1
    start = params.steady_c(top, 0.0) if params.start_c is None else params.start_c
    target = params.steady_c(top, duty)
    if target <= params.limit_c:
        return None
    if start >= params.limit_c:
        return 0.0
    return params.tau_s * math.log((target - start) / (target - params.limit_c))
