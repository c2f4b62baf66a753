"""Thermal and power source names and their parser: what `--thermal-source` and
`--power-source` accept, checked without opening anything. Pure, so the agent (which opens
sources), the coordinator (which ships a name to a host's installer) and every option's help text
share one definition.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

from shared.cooling.plant import PlantParams, PlantSpecError, parse_plant_spec
from shared.cooling.spec_params import spec_numbers


class SourceSpecError(ValueError):
    """The user asked for a source in a way that cannot work: unknown name, bad parameters, a
    replay file that cannot be played. Bad input, unlike the agent's SourceUnavailable."""


KNOWN_SOURCES: tuple[str, ...] = (
    "auto",
    "none",
    "smc",
    "iohid",
    "macmon",
    "powermetrics",
    "linux",
    "sim",
    "sim:plant[:PRESET][,k=v...]",
    "replay:PATH",
    "capture:FILE",
)
"""Every source name; one that takes an argument shows its placeholder."""


def _source_help(known: tuple[str, ...], instrument: str) -> str:
    """The names for an option's help, sim's parameters shown, and what sim and replay are not."""
    names = ", ".join(known).replace("sim,", "sim[:k=v,...],")
    return (
        f"{names} (sim and replay are labelled as not a {instrument}; capture:FILE replays "
        "a Mac's `agent doctor --capture`)."
    )


SOURCE_HELP = _source_help(KNOWN_SOURCES, "sensor")
"""The help of every --thermal-source option, derived from KNOWN_SOURCES."""


def read_from(source: str, sensor: str | None) -> str:
    """`smc · TCMz`: where a reading came from, as every display names it; the source alone
    when it names no sensor (or the sensor was not recorded)."""
    return source if sensor is None else f"{source} · {sensor}"


def short_source(source: str) -> str:
    """A source as a narrow label names it: a replay by its file's name, not its whole path
    (`replay:curve.csv`); every other source as it is."""
    kind, colon, path = source.partition(":")
    if colon and kind == "replay":
        return f"{kind}:{path.replace(chr(92), '/').rsplit('/', 1)[-1]}"
    return source


DEFAULT_POLL_INTERVAL_S = 1.0
"""Seconds between two readings of a source, unless an option says otherwise."""


KNOWN_POWER_SOURCES: tuple[str, ...] = (
    "auto",
    "none",
    "ioreport",
    "smc",
    "macmon",
    "powermetrics",
    "rapl",
    "sim",
    "replay:CSV",
    "capture:FILE",
)
"""Every power source name (docs/energy.md); one that takes an argument shows its placeholder."""
POWER_SOURCE_HELP = _source_help(KNOWN_POWER_SOURCES, "meter")
"""The help of every --power-source option, derived from KNOWN_POWER_SOURCES."""


class UnknownSourceError(SourceSpecError):
    """A source name we do not know; the message lists the ones we do."""

    def __init__(
        self,
        name: str,
        what: str = "thermal",
        known: tuple[str, ...] = KNOWN_SOURCES,
        offered: bool = False,
    ) -> None:
        """`known` lists every name; with `offered`, the names that can work on this machine."""
        listed = "this machine offers" if offered else "known"
        super().__init__(f"unknown {what} source {name!r}; {listed}: {', '.join(known)}")
        self.source_name = name


def auto_order(system: str) -> tuple[str, ...]:
    """What `auto` tries, best first, for platform.system()'s answer. macOS: the SMC die
    temperature the policy's defaults are set for, then HID (reads ~8-30 °C lower), both
    in-process and rootless, then a helper tool, root last; Linux: sysfs. Anything else has no
    sensor we read."""
    return {
        "Darwin": ("smc", "iohid", "macmon", "powermetrics"),
        "Linux": ("linux",),
    }.get(system, ())


def offered_sources(system: str) -> tuple[str, ...]:
    """The names that can work on this OS (what a refusal lists)."""
    return (
        "auto",
        "none",
        *auto_order(system),
        "sim",
        "sim:plant[:PRESET]",
        "replay:PATH",
        "capture:FILE",
    )


def power_auto_order(system: str) -> tuple[str, ...]:
    """What `auto` tries for power, best first. macOS: IOReport's energy counters (per rail,
    rootless, in-process), then the SMC's whole-system PSTR, then macmon, root's powermetrics
    last; Linux: RAPL through powercap. Anything else has no meter we read."""
    return {
        "Darwin": ("ioreport", "smc", "macmon", "powermetrics"),
        "Linux": ("rapl",),
    }.get(system, ())


def offered_power_sources(system: str) -> tuple[str, ...]:
    """The power source names that can work on this OS (what a refusal lists)."""
    return ("auto", "none", *power_auto_order(system), "sim", "replay:CSV", "capture:FILE")


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

    def watts(self, load: float) -> float:
        """The model's power at `load` (0..1): what the `sim` power source reports."""
        load = min(max(load, 0.0), 1.0)
        return self.idle_w + (self.max_w - self.idle_w) * load

    def steady_c(self, load: float) -> float:
        """Where the temperature settles if `load` (0..1) is held."""
        return self.ambient_c + self.r_c_per_w * self.watts(load)


def parse_sim_params(spec: str) -> SimParams:
    """`ambient_c=30,tau_s=5` (the text after `sim:`) -> SimParams; empty gives the defaults."""
    known = sorted(f.name for f in fields(SimParams))
    values = spec_numbers(spec, known, "sim", SourceSpecError)
    return replace(SimParams(), **values)


PLANT = "plant"
"""`sim:plant[:PRESET][,k=v...]`: the thermal plant (shared.cooling.plant) instead of sim's
first-order model."""


def parse_sim_spec(spec: str) -> SimParams | PlantParams:
    """What follows `sim:` -> the plant's constants for `plant[...]`, else sim's parameters.
    Raises SourceSpecError naming what is wrong."""
    if spec.strip().lower().startswith(PLANT):
        try:
            return parse_plant_spec(spec.strip()[len(PLANT) :])
        except PlantSpecError as exc:
            raise SourceSpecError(str(exc)) from None
    return parse_sim_params(spec)


def parse_source_name(name: str) -> tuple[str, str]:
    """A source name as (kind, argument), checked without opening anything, so an installer can
    refuse a name `agent serve` would refuse before a service crash-loops on it.

    Raises UnknownSourceError / SourceSpecError for a bad name or spec.
    """
    return _parse_name(name, "thermal", KNOWN_SOURCES, "replay:PATH")


def parse_power_source_name(name: str) -> tuple[str, str]:
    """A power source name as (kind, argument), checked without opening anything: `sim` takes
    the thermal model's parameters (its watts are the model's idle_w..max_w), `replay:CSV` a
    `seconds,watts` file.

    Raises UnknownSourceError / SourceSpecError for a bad name or spec.
    """
    return _parse_name(name, "power", KNOWN_POWER_SOURCES, "replay:CSV")


def _parse_name(name: str, what: str, known: tuple[str, ...], replay: str) -> tuple[str, str]:
    kind, sep, argument = name.strip().partition(":")
    kind = kind.lower()
    if kind == "sim":
        parse_sim_spec(argument) if what == "thermal" else parse_sim_params(argument)
    elif kind in ("replay", "capture") and kind in {entry.partition(":")[0] for entry in known}:
        if not argument:
            placeholder = replay if kind == "replay" else "capture:FILE"
            raise SourceSpecError(f"{kind} needs a file: {placeholder}")
    elif sep or kind not in {entry.partition(":")[0] for entry in known}:
        raise UnknownSourceError(name, what, known)
    return kind, argument
