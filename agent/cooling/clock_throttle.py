"""The throttle rule on the GPU clock the agent reads (shared.cooling.throttle), poll after poll:
against the sustained clock of this Mac's calibration made with the thermal source it reads
(`agent calibrate`, re-read when a new one is written), else the highest GPU clock seen under
load since it started. Its own module because it reads the calibration's file. The agent's
hub (agent.daemon.hub) combines its verdict with the supervised jobs' work rates; `agent temp
--watch` shows it; `agent bench` hands each poll's clock to its cells (follow_clock)."""

from __future__ import annotations

from typing import Any

from agent.clocks.base import ClockSource
from agent.clocks.registry import open_clock_source
from agent.cooling.calibration_file import calibration_stamp, load_calibration
from agent.cooling.scheduler import ThermalGuard
from agent.thermal import ThermalMonitor
from shared.cooling.clocks import ClockReading
from shared.cooling.throttle import ThrottlePoll, ThrottleVerdict, ThrottleWatch


class ClockThrottle:
    """observe() each poll's clock reading; `last_clock` is that poll's clock as a benchmark
    job takes it (docs/protocol.md §13), None when the poll read none."""

    def __init__(self, source: str) -> None:
        self.source = source
        """The thermal source's name: a calibration made with another is not this one's."""
        self.calibrated_hz: float | None = None
        self.watch = ThrottleWatch.start()
        self.last_clock: dict[str, Any] | None = None
        self._stamp: int | None = None

    def calibrate(self, calibrated_hz: float | None) -> None:
        """A new calibrated sustained clock (or none): the reference starts over from it."""
        if calibrated_hz != self.calibrated_hz:
            self.calibrated_hz = calibrated_hz
            self.watch = ThrottleWatch.start(calibrated_hz)

    def observe(self, reading: ClockReading | None) -> ThrottleVerdict:
        stamp = calibration_stamp()  # a stat: cheap at every poll
        if stamp != self._stamp:
            self._stamp = stamp
            point = load_calibration()
            mine = point is not None and point.source == self.source
            self.calibrate(point.sustained_hz if point is not None and mine else None)
        gpu_hz = reading.gpu_hz if reading else None
        gpu_active = reading.gpu_active if reading else None
        self.watch, verdict = self.watch.observe(ThrottlePoll(gpu_hz, gpu_active))
        self.last_clock = None
        if gpu_hz is not None or gpu_active is not None:
            self.last_clock = {"gpu_hz": gpu_hz, "gpu_active": gpu_active}
            self.last_clock["sustained_hz"] = self.watch.sustained_hz
        return verdict


def follow_clock(monitor: ThermalMonitor, guard: ThermalGuard) -> ClockSource:
    """`agent bench`'s cells get the GPU clock at each of the monitor's polls (its source's own
    clock, else this machine's), judged, as the agent's benchmark jobs get the agent's
    (docs/protocol.md §13): their records' `gpu_clock`. Returns the clock source, for the
    caller to close."""
    clock = open_clock_source(monitor.source)
    throttle = ClockThrottle(monitor.source.name)

    def on_poll(_reading: object) -> None:  # on the monitor's thread: its only clock reader
        throttle.observe(clock.read())
        if throttle.last_clock is not None:
            guard.record_clock(throttle.last_clock)

    monitor.add_listener(on_poll)
    return clock
