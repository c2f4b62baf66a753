"""The commands' way to open a sensor from their options: a usage error naming the problem for
a bad source name, else the monitor or meter."""

from __future__ import annotations

from agent.power.meter import EnergyMeter
from agent.power.registry import open_power_source
from agent.sensors.base import SourceUnavailable
from agent.thermal.monitor import ThermalMonitor
from shared.cooling.sources import SourceSpecError, UnknownSourceError
from shared.io.cli import fail, usage_error
from shared.io.options import PowerOptions, ThermalOptions


def open_monitor(thermal: ThermalOptions, unavailable: int) -> ThermalMonitor:
    """A monitor over the source `thermal` names; exit 2 for a name that cannot work anywhere,
    `unavailable` (each command documents its code) for one that cannot work on this machine."""
    try:
        return ThermalMonitor(poll_interval=thermal.poll_interval, source=thermal.thermal_source)
    except SourceSpecError as exc:
        raise usage_error(str(exc)) from None
    except SourceUnavailable as exc:
        raise fail(str(exc), unavailable) from None


def open_meter(power: PowerOptions, interval_s: float) -> EnergyMeter:
    """The meter over the source `power` names (interval_s paces a streaming tool); exit 2 for
    a name unknown, malformed or unsupported here."""
    try:
        source = open_power_source(power.power_source, interval_s=interval_s)
    except UnknownSourceError as exc:
        raise usage_error(str(exc)) from None
    except (SourceSpecError, SourceUnavailable) as exc:
        raise usage_error(f"power source: {exc}") from None
    return EnergyMeter(source, power.idle_baseline)
