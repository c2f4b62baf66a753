"""`capture:FILE`: a capture (agent.sensors.capture) replayed through the live sources' own
decoding and selection, each over the capture instead of this machine: the SMC keys through
SMCSource, the HID sensors through IOHIDSource, macmon's and powermetrics' lines through their
parsers, Linux's files through LinuxSysfsSource; the first the capture holds, in `auto`'s
order. Its readings are real readings, replayed: `source` is `capture`, `scale` the decoder's,
the pressure the capture's."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace

from agent.clocks.capture import capture_clock_source
from agent.sensors.base import SourceUnavailable
from agent.sensors.capture import (
    CapturedSMC,
    CapturePlayer,
    read_capture,
    tool_interval_s,
)
from agent.sensors.process import stale_after
from agent.thermal.base import ThermalReading, ThermalSource
from agent.thermal.iohid import IOHIDSource
from agent.thermal.linux import LinuxSysfsSource
from agent.thermal.parsers import PowermetricsAssembler, hottest
from agent.thermal.pressure import pressure_level
from agent.thermal.process import macmon_reading
from agent.thermal.smc import SMCSource

DECODERS = ("smc", "iohid", "macmon", "sysfs")


class CapturedHID:
    """The HID sensors as one poll of the capture saw them."""

    def __init__(self, player: CapturePlayer) -> None:
        self._player = player
        names = {name for poll in player.capture.polls for name in poll.get("iohid", {})}
        self.sensors = [(0, name) for name in sorted(names)]

    def read(self) -> list[tuple[str, float]]:
        return list(self._player.poll().get("iohid", {}).items())

    def close(self) -> None:
        """Nothing to release."""


class MacmonLines(ThermalSource):
    """macmon's latest line up to the poll in force, through its live parser."""

    name = scale = "macmon"

    def __init__(self, player: CapturePlayer) -> None:
        super().__init__()
        self._player = player
        self._stale_s = stale_after(tool_interval_s(player.capture))

    def read(self) -> ThermalReading | None:
        polls = self._player.capture.polls[: self._player.index() + 1]
        held = [poll for poll in polls if poll.get("tools", {}).get("macmon")]
        if not held:
            return self._fail("macmon: no line yet in the capture")
        age = polls[-1]["t"] - held[-1]["t"]
        if age > self._stale_s:  # as the live stream refuses a sample this old
            return self._fail(f"macmon: last sample {age:.1f} s old in the capture")
        return macmon_reading(self, held[-1]["tools"]["macmon"][-1])


class PowermetricsLines(ThermalSource):
    """powermetrics' lines in a capture, through its live assembler and selection: die degrees
    (Intel), the pressure level (Apple Silicon); the latest sample up to the poll in force."""

    name = scale = "powermetrics"

    def __init__(self, player: CapturePlayer) -> None:
        super().__init__()
        self._player = player
        self._assembler = PowermetricsAssembler()
        self._seen = -1
        self._latest: ThermalReading | None = None

    def read(self) -> ThermalReading | None:
        polls, self._seen = self._player.since(self._seen)
        for poll in polls:
            for line in poll.get("tools", {}).get("powermetrics", []):
                sample = self._assembler.feed(line)
                if sample is not None:
                    self._latest = self._reading(
                        hottest(sample.sensors), sample.sensors, sample.pressure
                    )
        if self._latest is None:
            return self._fail("powermetrics: no sample yet in the capture")
        return replace(self._latest, time=time.time())


class CaptureSource(ThermalSource):
    name = "capture"

    def __init__(self, path: str, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        capture = read_capture(path)
        self.path = path
        self.player = CapturePlayer(capture, clock)
        self.decoder = self._decoder()
        self.scale = self.decoder.scale
        self.clock_source = capture_clock_source(self.player)
        """The capture's own clocks, replayed (agent.clocks.registry.open_clock_source)."""

    def _decoder(self) -> ThermalSource:
        capture, player = self.player.capture, self.player
        if capture.has("smc"):
            hid = capture.has("iohid")
            return SMCSource(CapturedSMC(player), (lambda: CapturedHID(player)) if hid else None)
        if capture.has("iohid"):
            return IOHIDSource(lambda: CapturedHID(player))
        if capture.has_tool("macmon"):
            return MacmonLines(player)
        if capture.has_tool("powermetrics"):
            return PowermetricsLines(player)
        if capture.has("sysfs"):
            return LinuxSysfsSource(files=lambda: dict(player.poll().get("sysfs", {})))
        raise SourceUnavailable(
            f"{capture.path}: no temperature in the capture (no smc, iohid, macmon, "
            "powermetrics or sysfs input in any poll)"
        )

    def read(self) -> ThermalReading | None:
        state = self.player.poll().get("pressure")
        pressure = None if state is None else pressure_level(state)
        reading = self.decoder.read()
        if reading is None:  # as WithPressure does live: no degrees, no reading
            return self._fail(f"capture: {self.decoder.last_error}")
        self.last_error = None
        return replace(reading, source=self.name, pressure=pressure or reading.pressure)

    def close(self) -> None:
        self.decoder.close()
