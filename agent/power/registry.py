"""Power source names -> open sources, and `auto`'s pick (the names themselves:
shared.source_names)."""

from __future__ import annotations

import platform
from collections.abc import Callable

from agent.power.base import NoPowerSource, PowerSource
from agent.power.ioreport import IOReportSource
from agent.power.rapl import RaplSource
from agent.power.smc import SMCPowerSource
from agent.power.streams import MacmonPowerSource, PowermetricsPowerSource
from agent.power.synthetic import PowerReplaySource, PowerSimSource
from agent.thermal.base import SourceUnavailable, first_reading
from shared.source_names import (
    offered_power_sources,
    parse_power_source_name,
    parse_sim_params,
    power_auto_order,
)


def open_power_source(name: str, *, interval_s: float = 1.0) -> PowerSource:
    """Open a power source by name: auto, none, ioreport, smc, macmon, powermetrics, rapl,
    sim[:k=v,...], replay:CSV. interval_s paces the streaming tools (macmon, powermetrics).

    Raises UnknownSourceError / SourceSpecError for a bad name or spec, SourceUnavailable when the
    source cannot work on this machine (its message lists what this machine offers).
    """
    try:
        return _open(name, interval_s)
    except SourceUnavailable as exc:
        offered = ", ".join(offered_power_sources(platform.system()))
        raise SourceUnavailable(f"{exc}; this machine offers: {offered}") from exc


def _open(name: str, interval_s: float) -> PowerSource:
    kind, argument = parse_power_source_name(name)
    openers: dict[str, Callable[[], PowerSource]] = {
        "sim": lambda: PowerSimSource(parse_sim_params(argument)),
        "replay": lambda: PowerReplaySource(argument),
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
    source, reasons = first_reading(
        power_auto_order(platform.system()), lambda candidate: _open(candidate, interval_s)
    )
    if source is not None:
        return source
    detail = "; ".join(reasons) or f"no power meter known for {platform.system()}"
    return NoPowerSource(f"no power meter found: {detail}")
