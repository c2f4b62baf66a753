"""The instruments the daemon reads: ONE thermal source, polled by a ThermalMonitor in the
background, and the power meter and the clock source, read on the monitor's thread with each
reading so that a sample's figures are its poll's. Its own module because reading the
instruments is one thing and what the telemetry hub does with each poll (judge, store, publish,
agent.daemon.hub) another."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agent.clocks.base import ClockSource
from agent.clocks.registry import open_clock_source
from agent.daemon.handoff import TappedSource
from agent.daemon.telemetry import ClockPoll, PowerPoll
from agent.power.meter import EnergyMeter
from agent.sensors.base import SourceInfo
from agent.thermal import ThermalMonitor, ThermalReading, ThermalSource


class Instruments:
    """start() them; thermal() and power() describe them for info.ok; stop() the monitor, then
    close_meter()."""

    def __init__(self, poll_interval: float) -> None:
        self.poll_interval = poll_interval
        self.source = SourceInfo("none", False)
        self.monitor: ThermalMonitor | None = None
        self.meter: EnergyMeter | None = None
        """The power source read at each poll (owned from start()); None: no meter."""
        self.last_power: PowerPoll | None = None
        """The power of the latest poll the loop took."""
        self.clock: ClockSource | None = None
        """The clocks read at each poll (agent.clocks.registry: the thermal source's own, else
        this machine's, else none saying why); owned from start()."""

    def start(
        self,
        source: ThermalSource,
        meter: EnergyMeter | None,
        on_read: Callable[[ThermalReading | None], None],
    ) -> None:
        """Poll `source` (owned from now on) every poll interval, in the background, each
        outcome to `on_read` on the monitor's thread; `meter` is owned too."""
        self.meter = meter
        self.clock = open_clock_source(source)
        self.source = SourceInfo(source.name, source.simulated)
        self.monitor = ThermalMonitor(self.poll_interval, source=TappedSource(source, on_read))
        self.monitor.start()

    def read_power(self) -> PowerPoll | None:
        """On the monitor's thread, with each reading (the meter's only reader)."""
        meter = self.meter
        if meter is None or not meter.present:
            return None
        reading = meter.read()
        source = SourceInfo(meter.source.name, meter.source.simulated)
        return PowerPoll(source, reading, meter.last_error)

    def read_clocks(self) -> ClockPoll | None:
        """On the monitor's thread, with each reading (the clock source's only reader)."""
        clock = self.clock
        if clock is None:
            return None
        reading = clock.read()
        return ClockPoll(SourceInfo(clock.name, clock.simulated), reading, clock.last_error)

    def thermal(self) -> dict[str, Any]:
        """info.ok's `thermal`: the latest polled reading, never waiting on the sensor."""
        reading = self.monitor.reading if self.monitor else None
        return {
            "source": self.source.name,
            "simulated": self.source.simulated,
            "reading": reading.to_dict() if reading else None,
            "error": self.monitor.last_error if self.monitor else None,
        }

    def power(self) -> dict[str, Any]:
        """info.ok's `power`: the meter (or `none`, with why) and its latest reading."""
        meter = self.meter
        info = meter.info() if meter is not None else None
        poll = self.last_power
        return {
            "source": info.source if info else "none",
            "simulated": bool(info and info.simulated),
            "rails": list(info.rails) if info else [],
            "resolution_s": info.resolution_s if meter is not None and meter.present else None,
            "reading": poll.reading.to_dict() if poll and poll.reading else None,
            "error": meter.last_error if meter is not None else "no power source",
        }

    def stop(self) -> bool:
        """Stop monitoring and close the source; whether it had started (readings may wait)."""
        if self.monitor is None:
            return False
        self.monitor.close()
        self.monitor.source.close()  # the monitor leaves a source it was given open
        return True

    def close_meter(self) -> None:
        """Close the power meter and the clock source (a thermal source's own clock closes
        twice: a source's close is safe to repeat)."""
        if self.meter is not None:
            self.meter.close()
        if self.clock is not None:
            self.clock.close()
