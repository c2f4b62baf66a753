"""Acting on temperature: the seed's CoolingScheduler, and the ThermalGuard that gates benchmarks.

The rule itself is shared.cooling.policy's CoolingGate (pure, the same `agent run` applies); this
module only applies it to a polling ThermalMonitor: wait while it says pause, raise when it says
stop.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agent.cooling.guard import Conditions, GuardReport, RunStopped
from agent.cooling.step_gate import STATE_FILE_ENV, StepGate
from agent.thermal import ThermalMonitor, ThermalReading
from shared.benchmark.verdict import HOT_START
from shared.cooling.calibration import source_defaults
from shared.cooling.cool_start import CoolWait
from shared.cooling.policy import (
    Action,
    CoolingGate,
    CoolingState,
    JobState,
    ThermalPolicy,
    decide,
    pressure_state,
)
from shared.wire.record_types import MAX_CELL_CLOCK_SAMPLES

__all__ = [
    "CoolingScheduler",
    "PauseRecord",
    "ThermalGuard",
    "ThermalPolicy",
    "ThermalShutdownError",
]


class ThermalShutdownError(RunStopped):
    """The policy said stop: too hot to go on. The message names temperature, threshold, step
    and the rule's reason (how long it stayed hot, or the pressure level)."""

    def __init__(
        self,
        step: int,
        temperature: float | None,
        threshold: float,
        pressure: str | None = None,
        reason: str | None = None,
    ) -> None:
        self.step = step
        self.temperature = temperature
        self.threshold = threshold
        self.pressure = pressure
        self.reason = reason
        shown = "unknown" if temperature is None else f"{temperature:.1f} °C"
        if temperature is not None and temperature >= threshold:
            cause = f"SoC temperature {shown} reached the stop threshold {threshold:.1f} °C"
        elif pressure_state(pressure) is CoolingState.STOP:
            cause = (
                f"thermal pressure level {pressure!r} means stop (SoC temperature {shown}, "
                f"stop threshold {threshold:.1f} °C)"
            )
        else:
            cause = f"SoC temperature {shown} (stop threshold {threshold:.1f} °C)"
        super().__init__(
            f"thermal shutdown at step {step}: {cause}" + (f"; {reason}" if reason else "")
        )


@dataclass(frozen=True)
class PauseRecord:
    """One cooling pause: when it began and ended (wall clock) and the hottest reading in it."""

    step: int
    started_at: float
    ended_at: float
    peak_celsius: float | None

    @property
    def duration_s(self) -> float:
        return self.ended_at - self.started_at


def _celsius_max(a: float | None, b: float | None) -> float | None:
    values = [v for v in (a, b) if v is not None]
    return max(values) if values else None


ActionSink = Callable[[Action, ThermalReading | None, str | None], None]
"""Told each action of the rule as it is decided: the action, the poll's reading, and why when
the reading did not say (a pause ended without a sensor)."""
CoolWaitSink = Callable[[CoolWait], None]
"""Told when a cell starts waiting to cool, every COOL_WAIT_REPORT_S while it waits, and when
the wait ends."""
COOL_WAIT_REPORT_S = 5.0
INJECTED = "injected"


class CoolingScheduler:
    """Gates training steps (or benchmark iterations) by the one cooling rule
    (shared.cooling.policy's CoolingGate, as `agent run` applies it), fed every poll of the monitor:
    start() the monitor (or hand it readings). A check costs nothing when all is well.

    A missing reading holds a pause for up to MISSING_POLLS_TO_RESUME polls, then resumes; a stop is
    final. Without a policy of its own it follows the monitor's `policy` when the monitor has one (a
    RemoteMonitor carries the agent daemon's, pushed by a coordinator), else the defaults for the
    monitor's source (shared.cooling.calibration). `on_action` hears every action as the rule
    decides it.
    """

    def __init__(
        self,
        monitor: ThermalMonitor,
        policy: ThermalPolicy | None = None,
        on_action: ActionSink | None = None,
    ) -> None:
        if not isinstance(monitor, ThermalMonitor):
            raise TypeError(
                f"monitor must be a ThermalMonitor (or RemoteMonitor), got {type(monitor).__name__}"
            )
        if policy is not None and not isinstance(policy, ThermalPolicy):
            raise TypeError(f"policy must be a ThermalPolicy or None, got {type(policy).__name__}")
        self.monitor = monitor
        self._policy = policy
        self.on_action = on_action
        self.pauses: list[PauseRecord] = []
        self.gate = CoolingGate()
        self._changed = threading.Condition()
        self._peak: float | None = None
        self._stopped_by: ThermalReading | None = None
        self._stop_reason: str | None = None
        self._total_pause_time = 0.0
        self._ran_from: float | None = None
        """When the step now ending began (the pace tier's rest is a share of it)."""
        self.gang: StepGate | None = None
        """A rank of a gang under `agent run`: the gang decides, at step boundaries all ranks
        agree on (agent.cooling.step_gate); pausing this rank alone would park its peers in a
        collective."""
        if StepGate.wanted():
            self.gang = StepGate()
        if monitor.reading is not None:  # what the monitor read before we listened
            self.observe(monitor.reading)
        monitor.add_listener(self.observe)

    @property
    def policy(self) -> ThermalPolicy:
        return (
            self._policy
            or getattr(self.monitor, "policy", None)
            or source_defaults(self.monitor.source.scale).policy
        )

    @policy.setter
    def policy(self, policy: ThermalPolicy) -> None:
        self._policy = policy

    @property
    def state(self) -> CoolingState:
        """What the gated work lives under now: ok, reduce_batch, pause or stop."""
        return self.gate.state

    def observe(self, reading: ThermalReading | None) -> None:
        """One poll (None: no reading), on whatever thread polls: the rule decides, a waiting
        step wakes."""
        with self._changed:
            decision = self.gate.observe(self.policy, reading)
            celsius = reading.celsius if reading else None
            if Action.PAUSE in decision.actions:
                self._peak = celsius
            elif self.gate.supervision.job is JobState.PAUSED:
                self._peak = _celsius_max(self._peak, celsius)
            if Action.STOP in decision.actions:
                self._stopped_by = reading
                self._stop_reason = decision.reason
                self._peak = _celsius_max(self._peak, celsius)
            self._changed.notify_all()
        if self.on_action is not None:
            for action in decision.actions:
                self.on_action(action, reading, decision.reason)

    def _shutdown(self, step: int) -> ThermalShutdownError:
        reading = self._stopped_by
        return ThermalShutdownError(
            step,
            reading.celsius if reading else None,
            self.policy.stop_temp,
            reading.pressure if reading else None,
            self._stop_reason,
        )

    def check_before_step(self, step: int) -> None:
        """Return at once unless paused, paced or stopped; while paused, wait (waking at every
        poll, and every pause_duration at most) until the rule resumes; while paced, rest the
        duty's share (shared.cooling.pace); at stop, raise ThermalShutdownError. A stop reached
        during a pause raises too. A rank of a gang follows the gang instead (StepGate)."""
        if self.gang is not None:
            started = time.monotonic()
            pauses = self.gang.pauses
            self.gang.check_before_step(step)
            if self.gang.pauses != pauses:
                self._total_pause_time += time.monotonic() - started
            return
        with self._changed:
            if self.gate.supervision.job is JobState.STOPPING:
                raise self._shutdown(step)
            if self.gate.supervision.job is JobState.PAUSED:
                self._wait_out_pause(step)
                rest = 0.0
            else:
                rest = self._rest()
        time.sleep(rest)  # paced: the loop runs the duty's share of its time
        self._ran_from = time.monotonic()

    def _wait_out_pause(self, step: int) -> None:
        """Wait (the lock held but while waiting) until the rule resumes; a stop raises."""
        started_at, started = time.time(), time.monotonic()
        try:
            while self.gate.supervision.job is JobState.PAUSED:
                self._changed.wait(self.policy.pause_duration)
            if self.gate.supervision.job is JobState.STOPPING:
                raise self._shutdown(step)
        finally:
            self._total_pause_time += time.monotonic() - started
            self.pauses.append(PauseRecord(step, started_at, time.time(), self._peak))

    def _rest(self) -> float:
        """Under the pace tier, the rest after the step just done that makes the loop run the
        duty's share of its time (none under `agent run`, which paces its command itself)."""
        duty, ran_from = self.gate.supervision.duty, self._ran_from
        if duty is None or ran_from is None or os.environ.get(STATE_FILE_ENV):
            return 0.0
        return (time.monotonic() - ran_from) * (1 - duty) / duty

    def should_reduce_batch(self) -> bool:
        """Whether the rule asks for a smaller batch now (max_speed_temp <= T < pause_temp
        when it was last known)."""
        return self.gate.supervision.reduced

    @property
    def total_pause_time(self) -> float:
        """Seconds spent paused, all pauses together."""
        return self._total_pause_time


class ThermalGuard:
    """The CellGuard (agent.cooling.guard) that puts the cooling policy between benchmark
    iterations.

    Enabled, each iteration waits out a pause and a stop raises ThermalShutdownError; disabled
    (`--no-cooling`), it only observes. Either way the cell's report carries the SoC °C at its start
    and end, the pause time spent in it, its source, and the flags `paused` (a pause happened),
    `hot` (a reading in the cell made the policy ask for more than ok, i.e. at or above
    max_speed_temp or a pressure level that asks for action), `hot-start` (it waited its whole
    cool-start limit and was still hot) and `simulated` (sim/replay source).
    """

    def __init__(
        self,
        monitor: ThermalMonitor,
        policy: ThermalPolicy | None = None,
        enabled: bool = True,
        on_action: ActionSink | None = None,
        on_cool_wait: CoolWaitSink | None = None,
    ) -> None:
        self.monitor = monitor
        self.enabled = enabled
        self.on_cool_wait = on_cool_wait
        self.scheduler = CoolingScheduler(monitor, policy, on_action)
        self._start: ThermalReading | None = None
        self._pause_before = 0.0
        self._pauses_before = 0
        self._in_cell = False
        self._hot = False
        self._hot_start = False
        self._cool_wait_s = 0.0
        self._clock: dict[str, Any] | None = None
        self._polled = threading.Condition()
        monitor.add_listener(self._on_reading)

    @property
    def policy(self) -> ThermalPolicy:
        return self.scheduler.policy

    def begin_cell(self, cool_start_s: float = 0.0, injected_c: float | None = None) -> None:
        """Wait (up to `cool_start_s`, when enabled) for a cool start, then note the starting
        reading. Starts the monitor if nobody did: a gate that reads a monitor which never polls
        would silently never fire. `injected_c` (MLX_FLEET_INJECT=hot-start) stands in for
        every reading of the wait, so the wait runs to its limit."""
        self.monitor.start()
        waiting = time.monotonic()
        self._hot_start = (
            self.enabled and cool_start_s > 0 and self._cool_start(cool_start_s, injected_c)
        )
        self._cool_wait_s = time.monotonic() - waiting if self.enabled and cool_start_s > 0 else 0.0
        self._start = self.monitor.reading
        self._pause_before = self.scheduler.total_pause_time
        self._pauses_before = len(self.scheduler.pauses)
        self._hot = self._is_hot(self._start)
        self._clock = None
        self._in_cell = True

    def record_clock(self, clock: dict[str, Any]) -> None:
        """One of the agent's polls of the GPU clock ({gpu_hz, gpu_active, sustained_hz}), kept
        while a cell runs: its record's `gpu_clock`, which its verdict judges."""
        if not self._in_cell:
            return
        if self._clock is None:
            self._clock = {"sustained_hz": None, "samples": []}
        if len(self._clock["samples"]) >= MAX_CELL_CLOCK_SAMPLES:
            return  # what a record may carry
        self._clock["sustained_hz"] = clock.get("sustained_hz")
        self._clock["samples"].append([clock.get("gpu_hz"), clock.get("gpu_active")])

    def before_iteration(self, step: int) -> None:
        if self.enabled:
            self.scheduler.check_before_step(step)

    def now(self) -> Conditions:
        reading = self.monitor.reading
        return Conditions(
            reading.celsius if reading else None,
            self.scheduler.state.value if reading else None,
            self.scheduler.total_pause_time,
        )

    def end_cell(self) -> GuardReport:
        self._in_cell = False
        end = self.monitor.reading
        self._hot = self._hot or self._is_hot(end)
        paused_s = self.scheduler.total_pause_time - self._pause_before
        flags = [
            flag
            for flag, present in (
                ("paused", len(self.scheduler.pauses) > self._pauses_before),
                ("hot", self._hot),
                (HOT_START, self._hot_start),
                ("simulated", self.monitor.source.simulated),
            )
            if present
        ]
        return GuardReport(
            soc_temp_start_c=self._start.celsius if self._start else None,
            soc_temp_end_c=end.celsius if end else None,
            pressure_start=self._start.pressure if self._start else None,
            pressure_end=end.pressure if end else None,
            pause_s=paused_s,
            cool_wait_s=self._cool_wait_s,
            flags=flags,
            thermal_source=self.monitor.source.name,
            gpu_clock=self._clock,
        )

    def _cool_start(self, limit_s: float, injected_c: float | None) -> bool:
        """Wait until a reading is below the reduce threshold with nominal pressure (ok by the
        policy), a stop is decided, or `limit_s` has passed; True when it ends still hot. No
        reading: nothing to wait for (the cell's temperatures then say unknown)."""
        injected = None
        if injected_c is not None:
            injected = ThermalReading(injected_c, INJECTED, simulated=True, sensor=INJECTED)

        def latest() -> ThermalReading | None:
            return injected or self.monitor.reading

        reading = latest()
        if not self._is_hot(reading):
            return False
        started = time.monotonic()
        reported = started
        self._tell_wait(reading, 0.0, limit_s)
        with self._polled:
            while True:
                reading = latest()
                now = time.monotonic()
                if not self._is_hot(reading) or now - started >= limit_s or self._stopping():
                    break
                if now - reported >= COOL_WAIT_REPORT_S:
                    self._tell_wait(reading, now - started, limit_s)
                    reported = now
                self._polled.wait(min(COOL_WAIT_REPORT_S, limit_s - (now - started)))
        hot = self._is_hot(reading)
        self._tell_wait(reading, time.monotonic() - started, limit_s, done=True, hot=hot)
        return hot

    def _stopping(self) -> bool:
        return self.scheduler.gate.supervision.job is JobState.STOPPING

    def _tell_wait(
        self,
        reading: ThermalReading | None,
        waited_s: float,
        limit_s: float,
        done: bool = False,
        hot: bool = True,
    ) -> None:
        if self.on_cool_wait is None:
            return
        self.on_cool_wait(
            CoolWait(
                reading.celsius if reading else None,
                reading.pressure if reading else None,
                self.policy.max_speed_temp,
                waited_s,
                limit_s,
                done,
                hot,
                injected=reading is not None and reading.source == INJECTED,
            )
        )

    def _is_hot(self, reading: ThermalReading | None) -> bool:
        if reading is None:
            return False
        return decide(self.policy, reading.celsius, reading.pressure) is not CoolingState.OK

    def _on_reading(self, reading: ThermalReading | None) -> None:
        """Every poll, even mid-iteration: a short spike still marks the cell hot; a cell
        waiting to cool looks again."""
        if self._in_cell and self._is_hot(reading):
            self._hot = True
        with self._polled:
            self._polled.notify_all()
