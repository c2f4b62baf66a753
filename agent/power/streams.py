"""Power from a tool's stream (macmon, powermetrics): watts per rail over each of its intervals,
integrated into joules as samples arrive. The process handling is the one the thermal sources
use too (agent.sensors.process.ToolStream: restarted when it dies or goes silent, stale samples
refused).

A window shorter than the tool's interval holds no new sample: its energy is whole samples' or
none (`resolution_s` is the interval).
"""

from __future__ import annotations

from typing import Any

from agent.power.base import Integrator, PowerReading, PowerSource
from agent.power.decode import PowermetricsPowerAssembler, parse_macmon_power
from agent.sensors.process import (
    ToolStream,
    macmon_command,
    powermetrics_command,
    sudo_for_root,
    unrecognized_sampler,
)

POWERMETRICS_SAMPLERS = "cpu_power,gpu_power,ane_power"
"""Apple Silicon's power samplers (mac-desk-check.md; tlkh/asitop utils.py runs them)."""


class StreamingPowerSource(ToolStream[PowerReading], PowerSource):
    """Joules per rail: each sample's watts held over its interval."""

    def __init__(self, **stream: Any) -> None:
        super().__init__(**stream)
        self.resolution_s = self.interval_s
        self._energy = Integrator()

    def _integrate(self, watts: dict[str, float], seconds: float) -> PowerReading:
        self._energy.add_watts(watts, seconds)
        self.rails = tuple(sorted({*self.rails, *watts}))
        return self._reading(self._energy.joules, self._energy.watts)


class MacmonPowerSource(StreamingPowerSource):
    """`macmon pipe` (no root): cpu, gpu, ane, dram and system (PSTR) watts per interval."""

    name = "macmon"
    tool = "macmon"
    install_hint = "brew install macmon"

    def command(self) -> list[str]:
        return macmon_command(self.executable, self.interval_ms)

    def _parse_line(self, line: str) -> PowerReading | None:
        watts = macmon_watts(self, line)
        return None if watts is None else self._integrate(watts, self.interval_s)


def macmon_watts(source: PowerSource, line: str) -> dict[str, float] | None:
    """One `macmon pipe` line's watts per rail; None (the reason in `source.last_error`) for a
    line that is not a sample, and for a blank one."""
    line = line.strip()
    if not line:
        return None
    try:
        return parse_macmon_power(line)
    except ValueError as exc:
        source._fail(f"macmon printed a line that is not a sample ({exc}): {line[:80]!r}")
        return None


class PowermetricsPowerSource(StreamingPowerSource):
    """`powermetrics --samplers cpu_power,gpu_power,ane_power` (root): cpu, gpu and ane watts,
    each sample over the interval its header states."""

    name = "powermetrics"
    tool = "powermetrics"
    install_hint = "ships with macOS in /usr/bin"

    def __init__(self, *, use_sudo: bool | None = None, **stream: Any) -> None:
        super().__init__(**stream)
        self._sudo = sudo_for_root(use_sudo)
        self._assembler = PowermetricsPowerAssembler()

    def command(self) -> list[str]:
        return powermetrics_command(
            self.executable, POWERMETRICS_SAMPLERS, self.interval_ms, self._sudo
        )

    def _on_start(self) -> None:
        self._assembler = PowermetricsPowerAssembler()

    def _parse_line(self, line: str) -> PowerReading | None:
        refused = unrecognized_sampler(line)
        if refused is not None:
            return self._fail(f"powermetrics has no {refused} sampler (power needs Apple Silicon)")
        sample = self._assembler.feed(line)
        if sample is None:
            return None
        return self._integrate(sample.watts, sample.seconds)
