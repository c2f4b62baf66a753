"""Thermal sensing on every Mac (and Linux node): sources, readings and the ThermalMonitor.

`open_source(name)` opens a source by name; ThermalMonitor polls one with the seed's API.
"""

from agent.sensors.base import SourceUnavailable
from agent.sensors.replay import ReplayFormatError
from agent.thermal.base import ThermalReading, ThermalSource
from agent.thermal.monitor import ThermalMonitor, trend_slope
from agent.thermal.registry import open_source
from shared.cooling.sources import KNOWN_SOURCES, SourceSpecError, UnknownSourceError, auto_order

__all__ = [
    "KNOWN_SOURCES",
    "ReplayFormatError",
    "SourceSpecError",
    "SourceUnavailable",
    "ThermalMonitor",
    "ThermalReading",
    "ThermalSource",
    "UnknownSourceError",
    "auto_order",
    "open_source",
    "trend_slope",
]
