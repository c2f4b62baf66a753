"""The supervisor's side of per-job accounting (shared.cooling.job_account): what `agent run` feeds
it and when. Kept out of agent.cooling.supervise, which only calls it at four points: CMD's spawn
(its stdout through an OutputTee), each sample, each event (a sink) and the end of the run.

Readings and events come on the supervisor's thread, report lines on the tee's: one lock keeps
the account whole. Energy comes from the agent daemon's samples (its power meter's cumulative
joules: the whole Mac's, labelled with the meter's name); `agent run` opens no meter of its own,
so without a daemon that has one the summary says energy is unavailable and why.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from typing import Any, NamedTuple

from agent.cooling.output_tee import OutputTee
from agent.thermal import ThermalReading
from shared.cooling.job_account import THROTTLE_WINDOW_S, JobAccount, parse_report
from shared.wire.telemetry import Event

SUMMARY_ACTION = "summary"


class Energy(NamedTuple):
    """What an agent daemon's sample says of its power meter: the cumulative joules (None:
    none now, `note` says why) and the meter's name, `simulated` in it when it is not a meter."""

    joules: float | None
    source: str
    note: str | None


def sample_energy(body: Mapping[str, Any]) -> Energy:
    """The Energy of a telemetry.sample body (docs/protocol.md §10)."""
    power = body.get("power") or {}
    source = str(power.get("source") or "none")
    if power.get("simulated"):
        source += ", simulated: not a meter"
    note = power.get("error") or ("the agent has no power meter" if source == "none" else None)
    return Energy(body.get("energy_j"), source, note)


class RunAccounting:
    """One job's account, fed by the supervisor; finish() gives the summary event's detail."""

    def __init__(self, job: str, started_at: float, window_s: float = THROTTLE_WINDOW_S) -> None:
        self.account = JobAccount(job, started_at, window_s)
        self.tee: OutputTee | None = None
        self._lock = threading.Lock()
        self._fresh_rate: float | None = None

    def output(self) -> int | None:
        """CMD's stdout for Popen: the tee's end, or None (inherit agent run's) without one."""
        self.tee = OutputTee.open(self._line)
        return self.tee.child_fd if self.tee else None

    def spawned(self) -> None:
        """After Popen, whether it started CMD or not: the tee copies until its end closes."""
        if self.tee is not None:
            self.tee.start()

    def observe(self, reading: ThermalReading | None, energy: Energy | None = None) -> None:
        """Each sample's reading (None: the poll had none) and, when the agent daemon's sample
        carried one, its meter's counter; timed when the supervisor got them."""
        now = time.time()
        with self._lock:
            if energy is not None:
                self.account.meter(now, energy.joules, energy.note, energy.source)
            if reading is None:
                self.account.reading(now, None)
                return
            self.account.reading(
                now, reading.celsius, reading.source, reading.sensor, reading.pressure
            )

    def on_event(self, event: Event) -> None:
        """A sink: the supervisor's actions, with their celsius and reason."""
        if event.action == SUMMARY_ACTION:
            return
        with self._lock:
            self.account.action(event.action, event.time, event.celsius, event.detail)

    def finish(self) -> str:
        """Once CMD's group is gone: the tee drained and closed, the account closed; the
        summary as the compact JSON a `summary` event carries."""
        if self.tee is not None:
            self.tee.close()
        with self._lock:
            self.account.finish(time.time())
            return self.account.detail()

    def reported_rate(self) -> float | None:
        """The tok/s of the latest train report since the last call; None without one."""
        with self._lock:
            rate, self._fresh_rate = self._fresh_rate, None
            return rate

    def _line(self, line: str, at: float) -> None:
        """On the tee's thread: parsed outside the lock, so the supervisor never waits on it."""
        report = parse_report(line)
        if report is not None:
            with self._lock:
                self.account.report(report, at)
                if report.kind == "train":
                    self._fresh_rate = report.tokens_per_s
