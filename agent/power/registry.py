"""Power source names -> open sources, and `auto`'s pick (the names themselves:
shared.cooling.sources)."""

from __future__ import annotations

import platform
from collections.abc import Callable

from agent.power.base import NoPowerSource, PowerSource
from agent.power.capture import PowerCaptureSource
from agent.power.ioreport import IOReportSource
from agent.power.meter import EnergyMeter
from agent.power.rapl import RaplSource
from agent.power.smc import SMCPowerSource
from agent.power.streams import MacmonPowerSource, PowermetricsPowerSource
from agent.power.synthetic import PowerReplaySource, PowerSimSource
from agent.sensors.base import SourceUnavailable, auto_pick
from shared.cooling.sources import (
    SourceSpecError,
    UnknownSourceError,
    offered_power_sources,
    parse_power_source_name,
    parse_sim_params,
    power_auto_order,
)


def open_power_source(name: str, *, interval_s: float = 1.0) -> PowerSource:
    """Open a power source by name: auto, none, ioreport, smc, macmon, powermetrics, rapl,
    sim[:k=v,...], replay:CSV, capture:FILE. interval_s paces the streaming tools (macmon,
    powermetrics).

    Raises UnknownSourceError / SourceSpecError for a bad name or spec, SourceUnavailable when the
    source cannot work on this machine (its message lists what this machine offers).
    """
    offered = offered_power_sources(platform.system())
    try:
        return _open(name, interval_s)
    except UnknownSourceError as exc:
        raise UnknownSourceError(name, "power", offered, offered=True) from exc
    except SourceUnavailable as exc:
        raise SourceUnavailable(f"{exc}; this machine offers: {', '.join(offered)}") from exc


def _open(name: str, interval_s: float) -> PowerSource:
    kind, argument = parse_power_source_name(name)
    openers: dict[str, Callable[[], PowerSource]] = {
        "sim": lambda: PowerSimSource(parse_sim_params(argument), spec=name.strip()),
        "replay": lambda: PowerReplaySource(argument),
        "capture": lambda: PowerCaptureSource(argument),
        "auto": lambda: _open_auto(interval_s),
        "none": NoPowerSource,
        "ioreport": IOReportSource,
        "smc": SMCPowerSource,
        "macmon": lambda: MacmonPowerSource(interval_s=interval_s),
        "powermetrics": lambda: PowermetricsPowerSource(interval_s=interval_s),
        "rapl": RaplSource,
    }
    return openers[kind]()


def _open_auto(interval_s: float) -> PowerSource:
    """The first source in power_auto_order that opens and gives a reading; `none` with every
    reason."""
    return auto_pick(
        power_auto_order(platform.system()),
        lambda candidate: _open(candidate, interval_s),
        NoPowerSource,
        "power meter",
    )


def meter_or_reason(name: str, baseline_s: float, interval_s: float, why: str) -> EnergyMeter:
    """A meter over source `name` for a job process, which must run its cells whatever
    happens: a source that cannot be opened gives a meter of none that says why (`why` is the
    daemon's reason when it has no source at all)."""
    if name == "none":
        return EnergyMeter(NoPowerSource(why), baseline_s)
    try:
        return EnergyMeter(open_power_source(name, interval_s=interval_s), baseline_s)
    except (SourceSpecError, SourceUnavailable) as exc:
        return EnergyMeter(NoPowerSource(f"the job could not open {name}: {exc}"), baseline_s)
