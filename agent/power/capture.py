"""`--power-source capture:FILE`: a capture's power inputs replayed through the live meters'
own decoding, each over the capture: IOReport's deltas through IOReportSource, macmon's and
powermetrics' lines through their parsers, RAPL's counters through RaplSource (the first the
capture holds, in `auto`'s order). Real readings, replayed: `source` is `capture`. Polls the
reader skipped are counted at its next read, and a poll read twice is counted once."""

from __future__ import annotations

import time
from abc import abstractmethod
from collections.abc import Callable
from dataclasses import replace

from agent.power.base import Integrator, PowerReading, PowerSource
from agent.power.decode import PowermetricsPowerAssembler
from agent.power.ioreport import IOReportSource
from agent.power.rapl import RaplSource
from agent.power.streams import macmon_watts
from agent.sensors.base import SourceUnavailable
from agent.sensors.capture import CapturedSysfs, CapturePlayer, read_capture, tool_interval_s


class CapturedReport:
    """IOReport's Energy Model channels as a capture recorded them (an EnergyReport)."""

    def __init__(self, player: CapturePlayer) -> None:
        self._player = player
        polls = player.capture.polls
        self.names = sorted({row[2] for poll in polls for row in poll.get("ioreport", [])})
        self._seen = player.index()

    def delta(self) -> list[tuple[str, str, int]]:
        polls, self._seen = self._player.since(self._seen)
        return [
            (str(row[2]), str(row[3]), int(row[4]))
            for poll in polls
            for row in poll.get("ioreport", [])
        ]

    def close(self) -> None:
        """Nothing to release."""


class ToolPowerLines(PowerSource):
    """A tool's lines in a capture, through its live parser: each sample's watts held over its
    seconds, every poll counted once."""

    def __init__(self, player: CapturePlayer) -> None:
        super().__init__()
        self._player = player
        self._seen = player.index()
        self._energy = Integrator()
        self.resolution_s = tool_interval_s(player.capture)

    @abstractmethod
    def _sample(self, line: str) -> tuple[dict[str, float], float] | None:
        """A line's (watts per rail, seconds) when it completes a sample."""

    def read(self) -> PowerReading | None:
        polls, self._seen = self._player.since(self._seen)
        for poll in polls:
            for line in poll.get("tools", {}).get(self.name, []):
                sample = self._sample(line)
                if sample is not None:
                    self._energy.add_watts(*sample)
                    self.rails = tuple(sorted({*self.rails, *sample[0]}))
        if not self._energy.joules:
            return self._fail(self.last_error or f"{self.name}: no sample in the capture yet")
        return self._reading(self._energy.joules, self._energy.watts)


class MacmonPowerLines(ToolPowerLines):
    """macmon's lines: each one's watts over macmon's interval (the header's
    `tools_interval_s`), as live."""

    name = "macmon"

    def _sample(self, line: str) -> tuple[dict[str, float], float] | None:
        watts = macmon_watts(self, line)
        return None if watts is None else (watts, self.resolution_s)


class PowermetricsPowerLines(ToolPowerLines):
    """powermetrics' lines, through its live power assembler: each sample's watts over the
    interval its header states."""

    name = "powermetrics"

    def __init__(self, player: CapturePlayer) -> None:
        super().__init__(player)
        self._assembler = PowermetricsPowerAssembler()

    def _sample(self, line: str) -> tuple[dict[str, float], float] | None:
        sample = self._assembler.feed(line)
        return None if sample is None else (sample.watts, sample.seconds)


class PowerCaptureSource(PowerSource):
    name = "capture"

    def __init__(self, path: str, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.path = path
        self.player = CapturePlayer(read_capture(path), clock)
        self.decoder = self._decoder()
        self.rails = self.decoder.rails
        self.resolution_s = self.decoder.resolution_s

    @property
    def spec(self) -> str:
        return f"capture:{self.path}"

    def _decoder(self) -> PowerSource:
        capture, player = self.player.capture, self.player
        if capture.has("ioreport"):
            return IOReportSource(CapturedReport(player))
        if capture.has_tool("macmon"):
            return MacmonPowerLines(player)
        if capture.has_tool("powermetrics"):
            return PowermetricsPowerLines(player)
        if any(
            path.startswith("class/powercap/") for p in capture.polls for path in p.get("sysfs", {})
        ):
            return RaplSource(sysfs=CapturedSysfs(player))
        raise SourceUnavailable(
            f"{capture.path}: no power in the capture (no ioreport, macmon, powermetrics or "
            "powercap input in any poll)"
        )

    def read(self) -> PowerReading | None:
        reading = self.decoder.read()
        self.last_error = self.decoder.last_error and f"capture: {self.decoder.last_error}"
        self.rails = self.decoder.rails
        return None if reading is None else replace(reading, source=self.name)

    def close(self) -> None:
        self.decoder.close()
