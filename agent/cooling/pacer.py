"""The pace tier's shell: duty-cycles CMD's process group (SIGSTOP/SIGCONT) in the wall-clock
slices shared.cooling.pace.slice_phase lays out, on a thread of its own so a slice's edges do
not wait for the supervisor's next poll.

The supervisor (agent.cooling.supervise) sets the duty after every poll (the rule's, or the
gang's: every rank sets the same duty and the slices are aligned on the wall clock, so the
ranks stop and run together). Every signal is sent under one lock that set() takes too: once
set(None) returns the pacer sends nothing more, so a pause's SIGSTOP or a stop's SIGTERM that
follows is never undone by a slice's SIGCONT.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from agent.cooling.process_group import CommandGroup
from agent.thermal import ThermalReading
from shared.cooling.clocks import ClockReading
from shared.cooling.pace import ClockReference, clock_ratio, slice_phase
from shared.cooling.policy import Action, CoolingGate, Decision, ThermalPolicy


class Pacer:
    """One job's duty cycle: set() the duty (None: not paced, the job left running) once CMD
    runs; close() at the end."""

    def __init__(self, group: CommandGroup) -> None:
        self.group = group
        self.told: tuple[float, float] | None = None
        """(duty, slice s) a job that paces itself is told in its state file; None otherwise."""
        self._clock = ClockReference()
        self._duty: float | None = None
        self._slice_s = 0.2
        self._stopped = False
        self._closed = False
        self._changed = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="supervise-pace", daemon=True)

    @property
    def paced(self) -> bool:
        """Whether the job is paced now, by signals or by itself."""
        return self._duty is not None or self.told is not None

    def set(self, duty: float | None, slice_s: float) -> None:
        """Pace at `duty` from the next slice edge; None ends pacing, continuing the job if a
        slice had stopped it. Nothing the pacer sends follows this call's return but for the
        new duty."""
        with self._changed:
            if duty is None or duty >= 1.0:
                duty = None
                self._run_job()
            if (duty, slice_s) != (self._duty, self._slice_s):
                self._duty, self._slice_s = duty, slice_s
                self._changed.notify()
            if duty is not None and not self._thread.is_alive() and not self._closed:
                self._thread.start()  # the first pace: a job never paced costs no thread

    def before(self, actions: Sequence[Action]) -> None:
        """Before a pause's or a stop's signals: pacing ends first, so no slice's SIGCONT
        undoes them."""
        if {Action.PAUSE, Action.STOP} & set(actions):
            self.set(None, 0.0)

    def steer(self, duty: float | None, slice_s: float, signals: bool) -> bool:
        """Pace at `duty` with signals, or leave it to the job (its step gate sleeps:
        agent.cooling.step_gate), which is then told (`told`); True when that changed."""
        if signals:
            self.set(duty, slice_s)
        pace = None if duty is None or signals else (round(duty, 3), slice_s)
        changed, self.told = pace != self.told, pace
        return changed

    def clock_ratio(self, clock: ClockReading | None) -> float | None:
        """The clock over the sustained one seen so far (None: unknown): the controller's
        second input."""
        gpu = (clock.gpu_hz, clock.gpu_active) if clock else (None, None)
        self._clock, ratio = clock_ratio(self._clock, *gpu)
        return ratio

    def close(self) -> None:
        with self._changed:
            self._closed = True
            self._duty = None
            self._stopped = False  # whoever closes us ends or continues the group itself
            self._changed.notify()
        if self._thread.is_alive():
            self._thread.join(timeout=2.0)

    def _run(self) -> None:
        with self._changed:
            while not self._closed:
                if self._duty is None:
                    self._changed.wait()
                    continue
                running, until = slice_phase(time.time(), self._slice_s, self._duty)
                if running:
                    self._run_job()
                elif not self._stopped:
                    self._stopped = self.group.signal(signal.SIGSTOP)
                self._changed.wait(max(0.0, until - time.time()))

    def _run_job(self) -> None:
        """SIGCONT the group if a slice stopped it (the lock held)."""
        if self._stopped:
            self.group.signal(signal.SIGCONT)
            self._stopped = False


class PaceFollower:
    """The pace side of `agent run`'s Supervisor (agent.cooling.supervise), a mixin like its
    gang side: after every poll its `pacer` duty-cycles the group at the rule's duty (or the
    gang's), or, for a cooperative rank of a gang, which paces itself at its step boundaries
    as it parks there (agent.cooling.step_gate), the state file tells the duty."""

    pacer: Pacer
    group: CommandGroup
    cooperative: bool
    gate: CoolingGate
    gang: Any
    _write_state: Callable[[Any, ThermalReading | None], None]
    _apply: Callable[..., None]

    def _follow_rule(
        self, decision: Decision, reading: ThermalReading | None, policy: ThermalPolicy
    ) -> None:
        """A job of its own (no gang): the rule's actions, then its duty."""
        if decision.actions:
            celsius = reading.celsius if reading else None
            self._apply(decision.actions, decision.cooling, reading, celsius, decision.reason)
        self._pace_at(self.gate.supervision.duty, policy.pace_slice, reading)

    def _pace_at(self, duty: float | None, slice_s: float, reading: ThermalReading | None) -> None:
        """Duty-cycle the job at `duty` (None: not paced), and tell a cooperative job when that
        changes (the state file)."""
        duty = None if self.group.terminating else duty
        parks_itself = self.cooperative and self.gang is not None  # as for a pause
        if self.pacer.steer(duty, slice_s, signals=not parks_itself):
            self._write_state(self.gate.state if self.gang is None else None, reading)
