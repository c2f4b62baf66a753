"""A capture's clocks, replayed (`--thermal-source capture:FILE` carries them as its own
`clock_source`): the IOReport residency counters `agent doctor --capture` recorded
(`ioreport_states`, with the pmgr DVFS tables and the chip in the header) through the live
decoding (agent.clocks.decode), or Linux's cpufreq files through CpufreqSource. Readings say
`source: capture`: a real machine's clocks, replayed. A capture with neither gives no clock,
never this machine's (they would be another machine's clocks beside its temperatures)."""

from __future__ import annotations

from dataclasses import replace

from agent.clocks.base import ClockSource, NoClockSource
from agent.clocks.cpufreq import CPU_DIRS, CURRENT, CpufreqSource
from agent.clocks.decode import (
    Channel,
    Residencies,
    clocks_between,
    ioreport_note,
    pmgr_tables,
)
from agent.sensors.base import SourceUnavailable
from agent.sensors.capture import CapturedSysfs, CaptureFormatError, CapturePlayer, Poll
from shared.cooling.clocks import REPLAYED_SOURCE, ClockReading

STATES = "ioreport_states"


def poll_states(poll: Poll) -> dict[Channel, Residencies]:
    """One poll's cumulative residencies by channel (the capture's rows, checked on reading)."""
    return {
        (row[0], row[1] or "", row[2]): [(name, ticks) for name, ticks in row[3]]
        for row in poll.get(STATES, [])
    }


def pmgr_properties(machine: dict, origin: str) -> dict[str, bytes]:
    """The header's `pmgr` {key: hex} as bytes; CaptureFormatError naming what is wrong."""
    pmgr = machine.get("pmgr")
    if not isinstance(pmgr, dict) or not pmgr:
        raise CaptureFormatError(f"{origin}: {STATES} without the header's `pmgr` tables")
    try:
        return {str(key): bytes.fromhex(value) for key, value in pmgr.items()}
    except (TypeError, ValueError):
        raise CaptureFormatError(f"{origin}: the header's `pmgr` must map keys to hex") from None


class CapturedIOReportClocks(ClockSource):
    """The interval ending at the latest poll in force that holds residencies, from the one
    before it: what the live source reads between two of its reads."""

    name = REPLAYED_SOURCE

    def __init__(self, player: CapturePlayer) -> None:
        super().__init__()
        capture = player.capture
        self._player = player
        self.tables = pmgr_tables(pmgr_properties(capture.machine, capture.path))
        chip = capture.machine.get("chip")
        self.note = f"{ioreport_note(chip if isinstance(chip, str) else '')} (replayed)"

    def read(self) -> ClockReading | None:
        polls = self._player.capture.polls[: self._player.index() + 1]
        held = [poll for poll in polls if STATES in poll]
        if len(held) < 2:
            return self._fail("capture: no interval of residencies yet (two polls hold one)")
        clocks = clocks_between(poll_states(held[-2]), poll_states(held[-1]), self.tables)
        return self._from_clocks(clocks, "capture")


class ReplayedCpufreq(ClockSource):
    """A capture's cpufreq files through the live source, its readings labelled replayed."""

    name = REPLAYED_SOURCE

    def __init__(self, player: CapturePlayer) -> None:
        super().__init__()
        self._decoder = CpufreqSource(CapturedSysfs(player))
        self.note = f"{self._decoder.note} (replayed)"

    def read(self) -> ClockReading | None:
        reading = self._decoder.read()
        self.last_error = self._decoder.last_error and f"capture: {self._decoder.last_error}"
        return None if reading is None else replace(reading, source=self.name, note=self.note)


def capture_clock_source(player: CapturePlayer) -> ClockSource:
    """The capture's clocks: its residencies, else its cpufreq files, else none with why."""
    capture = player.capture
    if capture.has(STATES):
        return CapturedIOReportClocks(player)
    cpufreq = f"{CPU_DIRS}/{CURRENT}"
    if CapturedSysfs(player).glob(cpufreq):
        try:
            return ReplayedCpufreq(player)
        except SourceUnavailable as exc:
            return NoClockSource(f"unavailable: capture: {exc}")
    return NoClockSource(
        f"unavailable: {capture.path} holds no clock input ({STATES} or cpufreq files)"
    )
