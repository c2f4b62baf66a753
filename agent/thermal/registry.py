"""Source names -> open sources, and `auto`'s pick (the names themselves: shared.cooling.sources).

On macOS every hardware source's readings also carry the thermal pressure level from the notify
API (agent.thermal.pressure), whatever gives the degrees.
"""

from __future__ import annotations

import platform
from collections.abc import Callable

from agent.sensors.base import SourceUnavailable, auto_pick
from agent.thermal.base import NoneSource, ThermalSource
from agent.thermal.capture import CaptureSource
from agent.thermal.iohid import IOHIDSource
from agent.thermal.linux import LinuxSysfsSource
from agent.thermal.plant import PlantSource
from agent.thermal.pressure import with_pressure
from agent.thermal.process import MacmonSource, PowermetricsSource
from agent.thermal.smc import SMCSource
from agent.thermal.synthetic import ReplaySource, SimSource
from shared.cooling.plant import PlantParams
from shared.cooling.sources import auto_order, offered_sources, parse_sim_spec, parse_source_name

MAC_SOURCES = frozenset({"smc", "iohid", "macmon", "powermetrics"})


def open_source(name: str, *, interval_s: float = 1.0) -> ThermalSource:
    """Open a source by name: auto, none, smc, iohid, macmon, powermetrics, linux,
    sim[:k=v,...], sim:plant[:PRESET][,k=v...], replay:PATH, capture:FILE. interval_s paces
    the streaming tools (macmon, powermetrics).

    Raises UnknownSourceError / SourceSpecError for a bad name or spec, SourceUnavailable when the
    source cannot work on this machine (its message lists what this machine offers).
    """
    try:
        return _open(name, interval_s)
    except SourceUnavailable as exc:
        offered = ", ".join(offered_sources(platform.system()))
        raise SourceUnavailable(f"{exc}; this machine offers: {offered}") from exc


def _open(name: str, interval_s: float) -> ThermalSource:
    kind, argument = parse_source_name(name)
    openers: dict[str, Callable[[], ThermalSource]] = {
        "sim": lambda: _open_sim(argument),
        "replay": lambda: ReplaySource(argument),
        "capture": lambda: CaptureSource(argument),
        "auto": lambda: _open_auto(interval_s),
        "none": NoneSource,
        "smc": SMCSource,
        "iohid": IOHIDSource,
        "macmon": lambda: MacmonSource(interval_s=interval_s),
        "powermetrics": lambda: PowermetricsSource(interval_s=interval_s),
        "linux": LinuxSysfsSource,
    }
    source = openers[kind]()
    return with_pressure(source) if kind in MAC_SOURCES else source


def _open_sim(argument: str) -> ThermalSource:
    """sim's first-order model, or the thermal plant for `sim:plant...`."""
    params = parse_sim_spec(argument)
    return PlantSource(params) if isinstance(params, PlantParams) else SimSource(params)


def _open_auto(interval_s: float) -> ThermalSource:
    """The first source in auto_order that opens and gives a reading; `none` with every reason."""
    return auto_pick(
        auto_order(platform.system()),
        lambda candidate: _open(candidate, interval_s),
        NoneSource,
        "thermal sensor",
    )
