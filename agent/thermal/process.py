"""Thermal sources fed by one long-lived tool process (macmon, powermetrics), over the stream
agent.sensors.process keeps alive."""

from __future__ import annotations

import platform
from typing import Any

from agent.sensors.process import (
    ToolStream,
    macmon_command,
    powermetrics_command,
    sudo_for_root,
    unrecognized_sampler,
)
from agent.thermal.base import ThermalReading, ThermalSource
from agent.thermal.parsers import PowermetricsAssembler, hottest, parse_macmon_line


class StreamingSource(ToolStream[ThermalReading], ThermalSource):
    """A thermal source fed by a tool's stream."""


class MacmonSource(StreamingSource):
    """`macmon pipe`: no root, one JSON object per line; the hotter of CPU and GPU averages."""

    name = scale = "macmon"
    tool = "macmon"
    install_hint = "brew install macmon"

    def command(self) -> list[str]:
        return macmon_command(self.executable, self.interval_ms)

    def _parse_line(self, line: str) -> ThermalReading | None:
        return macmon_reading(self, line)


def macmon_reading(source: ThermalSource, line: str) -> ThermalReading | None:
    """One `macmon pipe` line as `source`'s reading: the hotter of its CPU and GPU averages;
    None (the reason in `last_error`) for a line that is not a sample or holds no plausible
    temperature, and for a blank one."""
    line = line.strip()
    if not line:
        return None
    try:
        sensors = parse_macmon_line(line)
    except ValueError as exc:
        return source._fail(f"macmon printed a line that is not a sample ({exc}): {line[:80]!r}")
    if not sensors:
        return source._fail(f"macmon sample holds no plausible temperature: {line[:80]!r}")
    return source._reading(hottest(sensors), sensors)


def powermetrics_samplers(machine: str) -> tuple[str, ...]:
    """Samplers to try in order: Intel has die degrees in `smc`; Apple Silicon has no `smc` sampler
    and only a pressure level in `thermal` (an x86 Python under Rosetta falls back at runtime)."""
    return ("thermal",) if machine.lower() in {"arm64", "aarch64"} else ("smc", "thermal")


class PowermetricsSource(StreamingSource):
    """`powermetrics` (root): die degrees on Intel, the pressure level on Apple Silicon."""

    name = scale = "powermetrics"
    tool = "powermetrics"
    install_hint = "ships with macOS in /usr/bin"

    def __init__(
        self, *, use_sudo: bool | None = None, machine: str | None = None, **stream: Any
    ) -> None:
        """use_sudo: None runs `sudo -n` unless root; machine: platform.machine() unless given;
        `stream` takes StreamingSource's timing arguments."""
        super().__init__(**stream)
        self._sudo = sudo_for_root(use_sudo)
        self._samplers = list(powermetrics_samplers(machine or platform.machine()))
        self._assembler = PowermetricsAssembler()

    @property
    def sampler(self) -> str:
        return self._samplers[0]

    def command(self) -> list[str]:
        return powermetrics_command(self.executable, self.sampler, self.interval_ms, self._sudo)

    def _on_start(self) -> None:
        self._assembler = PowermetricsAssembler()

    def _parse_line(self, line: str) -> ThermalReading | None:
        refused = unrecognized_sampler(line)
        if refused is not None:
            if len(self._samplers) > 1:
                self._samplers.pop(0)
                self._restart_now = True
                return self._fail(f"powermetrics has no {refused} sampler; trying {self.sampler}")
            return self._fail(f"powermetrics has no {refused} sampler")
        sample = self._assembler.feed(line)
        if sample is None:
            return None
        return self._reading(hottest(sample.sensors), sample.sensors, sample.pressure)
