"""The gang side of `agent run`'s Supervisor (agent.cooling.supervise): how a rank of a
distributed job follows its gang's verdict (agent.cooling.gang.GangRank), kept apart so the
supervisor itself stays one concept. A mixin: it uses the supervisor's process group
(agent.cooling.process_group), its outputs (agent.cooling.run_outputs) and _apply, and adds
the gang's deadlines (a stop's acks, a cooperative rank's park)."""

from __future__ import annotations

import signal
import time
from queue import SimpleQueue
from typing import Any

from agent.cooling.gang import PARK_TIMEOUT_S, GangRank
from agent.cooling.process_group import CommandGroup
from agent.cooling.run_outputs import RunOutputs
from agent.cooling.step_gate import parked_path
from agent.thermal import ThermalReading
from shared.cooling.gang import MemberState
from shared.cooling.pace import PACE_SLICE_S
from shared.cooling.policy import CoolingGate, CoolingState, ThermalPolicy


class GangFollower:
    """What a Supervisor does as a rank of a gang (`gang` set); nothing while `gang` is None."""

    gang: GangRank | None
    group: CommandGroup
    outputs: RunOutputs
    cooperative: bool
    gate: CoolingGate
    state_file: Any
    _queue: SimpleQueue[tuple[str, Any]]
    _stop_due: float | None
    _park_due: float | None
    _stop_left_to_cmd: bool

    def post_gang_news(self, news: tuple[list[MemberState], str, str | None]) -> None:
        """From a gang channel's thread: what one agent said (agent.cooling.gang.News)."""
        self._queue.put(("gang", news))

    def _tell_gang(self, reading: ThermalReading | None, policy: ThermalPolicy) -> None:
        """This Mac's own wish after a poll, to every member (with its duty while it paces)."""
        assert self.gang is not None
        celsius, sensor = (reading.celsius, reading.sensor) if reading else (None, None)
        duty = self.gate.supervision.duty
        pace = None if duty is None else (duty, policy.pace_slice)
        self.gang.own(self.gate.state, celsius, self.outputs.source, sensor, pace)

    def _on_gang_news(self, members: list[MemberState], name: str, problem: str | None) -> None:
        assert self.gang is not None
        self.gang.hear(members)
        said = self.gang.reachability(name, problem)
        if said is not None:
            self.outputs.emit("gang", detail=said)
        if not self.group.terminating:
            self._follow_gang(None)

    def _follow_gang(self, reading: ThermalReading | None) -> None:
        """Bring this rank to the gang's verdict (agent.cooling.gang.GangRank.decide)."""
        assert self.gang is not None
        decided, actions, notes = self.gang.decide()
        for note in notes:
            self.outputs.emit("gang", detail=note)
        if actions:
            cause = decided.cause
            celsius = cause.celsius if cause is not None else None
            self._apply(actions, decided.state, reading, celsius,
                        lambda action: self.gang.reason(action, decided))  # type: ignore[union-attr]  # fmt: skip
        paced = decided.state is CoolingState.PACE and decided.duty is not None
        self._pace_at(decided.duty if paced else None, decided.slice_s or PACE_SLICE_S, reading)

    def _park_when_overdue(self) -> None:
        """A cooperative rank that has not parked at a step boundary within PARK_TIMEOUT_S is
        paused with SIGSTOP (its step is longer than a cooling pause may wait)."""
        if self._park_due is None or time.monotonic() < self._park_due:
            return
        self._park_due = None
        if not parked_path(self.state_file).exists():
            self.group.signal(signal.SIGSTOP)
            self.outputs.emit(
                "gang", detail=f"no step boundary within {PARK_TIMEOUT_S:g} s: paused with SIGSTOP"
            )

    def _stop_when_acknowledged(self) -> None:
        """End a stopped rank once every rank applies the stop (or GangRank.stop_ack_s passed);
        a cooperative one first gets PARK_TIMEOUT_S to end itself at its next step boundary
        (agent.cooling.step_gate raises there), never killed mid-step."""
        if self._stop_due is None or self.group.terminating:
            return
        assert self.gang is not None
        due = time.monotonic() >= self._stop_due
        if not (due or self.gang.stop_applied_everywhere()):
            return
        if self.cooperative and not self._stop_left_to_cmd:
            self._stop_left_to_cmd = True
            self._stop_due = time.monotonic() + PARK_TIMEOUT_S
            return
        if self._stop_left_to_cmd and not due:
            return
        self._stop_due = None
        self.group.terminate(signal.SIGTERM)
