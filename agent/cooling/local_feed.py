"""Where `agent run`'s samples come from: a Feed (what the supervisor, agent.cooling.supervise,
reads), one sample of it (Observation), and this machine's own sensor as a feed (LocalFeed).
agent.cooling.feed.DaemonFeed passes on the agent daemon's instead, and falls back to a
LocalFeed. Its own module because where readings come from is no concern of the supervisor:
it judges whatever a feed yields."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Protocol

from agent.cooling.accounting import Energy
from agent.thermal import ThermalMonitor, ThermalReading
from shared.cooling.clocks import ClockReading
from shared.cooling.policy import ThermalPolicy


@dataclass(frozen=True)
class Observation:
    """One reading (None: the source had none) and the policy in force when it was taken; `note`
    says the feed changed where its readings come from, recorded as a `note_action` event
    (`fallback`: the daemon went away; `rejoin`: a daemon answers again)."""

    reading: ThermalReading | None
    policy: ThermalPolicy
    note: str | None = None
    note_action: str = "fallback"
    energy: Energy | None = None
    """The agent daemon's power meter at this sample (None: readings from this machine's own
    source, which has no meter)."""
    clock: ClockReading | None = None
    """The clocks read with it, where the source carries its own (the thermal plant's): the
    pace tier's second input."""


class Feed(Protocol):
    """The sensing side of supervision. `source` and `simulated` label every event."""

    @property
    def source(self) -> str: ...

    @property
    def simulated(self) -> bool: ...

    def next(self) -> Observation | None:
        """Block until the next sample is due; None once closed."""

    def close(self) -> None:
        """Stop sampling and release the sensor; wakes a blocked next()."""


class LocalFeed:
    """This machine's sensor, read every poll interval on a fixed grid (a slow read does not push
    the next one back), judged by a fixed policy. Needs no daemon and no network."""

    def __init__(self, monitor: ThermalMonitor, policy: ThermalPolicy) -> None:
        self.monitor = monitor
        self.policy = policy
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._due = time.monotonic()

    @property
    def source(self) -> str:
        return self.monitor.source.name

    @property
    def simulated(self) -> bool:
        return self.monitor.source.simulated

    def next(self) -> Observation | None:
        if self._closed.wait(max(0.0, self._due - time.monotonic())):
            return None
        self._due = max(self._due + self.monitor.poll_interval, time.monotonic())
        with self._lock:
            if self._closed.is_set():
                return None
            return Observation(self.monitor.read(), self.policy, clock=self._clock())

    def _clock(self) -> ClockReading | None:
        """The source's own clock, read right after its temperature (None without one)."""
        clocks = getattr(self.monitor.source, "clock_source", None)
        reading = clocks.read() if clocks is not None else None
        return reading if isinstance(reading, ClockReading) else None

    def close(self) -> None:
        self._closed.set()
        with self._lock:  # never close the source under a read in flight
            self.monitor.close()
