"""Opening the meter a command's --power-source names: every refusal is one line, exit 2, that
names what this machine offers."""

from __future__ import annotations

from agent.power.meter import EnergyMeter
from agent.power.registry import open_power_source
from agent.thermal.base import SourceUnavailable
from shared.io.cli import usage_error
from shared.io.options import PowerOptions
from shared.source_names import SourceSpecError, UnknownSourceError


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
