"""What leaves `agent run`'s supervisor (agent.cooling.supervise): every event of the job, to
its sinks (SQLite and stderr, and the daemon when it runs), and the cooperative jobs' state
file (MLX_FLEET_COOLING_STATE, rewritten atomically on every action). Its own module because
enforcement must not depend on either: a sink that fails or a disk that refuses is warned of
on stderr, never raised into the supervisor's loop, which stays about deciding."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from agent.cooling.events import warn
from agent.cooling.local_feed import Feed
from agent.thermal import ThermalReading
from shared.cooling.policy import CoolingState
from shared.io.files import replace_atomically
from shared.wire.telemetry import Event

Sink = Callable[[Event], None]


class RunOutputs:
    """emit() an event, write_state() the state file. `pid` says CMD's pid at each event."""

    def __init__(
        self, job: str, sinks: Sequence[Sink], state_file: Path, pid: Callable[[], int | None]
    ) -> None:
        self.job = job
        self.sinks = list(sinks)
        self.state_file = state_file
        self._pid = pid
        self.feed: Feed | None = None
        """The feed being supervised (from run()); it labels every event."""

    @property
    def source(self) -> str:
        """Asked each time: a feed that falls back changes where its readings come from."""
        return self.feed.source if self.feed else "none"

    @property
    def simulated(self) -> bool:
        return self.feed.simulated if self.feed else False

    def write_state(
        self,
        cooling: CoolingState | None,
        reading: ThermalReading | None,
        reduced: bool,
        work: dict[str, Any] | None = None,
        pace: tuple[float, float] | None = None,
    ) -> None:
        """The cooperative jobs' view, replaced atomically so a reader never sees half of it;
        `work`: the job's speed and throttle verdict (agent.cooling.job_speed), which the agent
        reads for its samples; `pace` (duty, slice s) while the job paces itself
        (agent.cooling.step_gate reads it)."""
        data = {
            "job": self.job,
            "state": cooling.value if cooling else None,
            "reduce_batch": reduced,
            "duty": pace[0] if pace else None,
            "slice_s": pace[1] if pace else None,
            "celsius": reading.celsius if reading else None,
            "source": self.source,
            "simulated": self.simulated,
            "time": time.time(),
            "work": work,
        }
        try:
            replace_atomically(self.state_file, json.dumps(data))
        except OSError as exc:  # enforcement must not depend on the disk
            warn(f"cannot write {self.state_file}: {exc}")

    def emit(
        self,
        action: str,
        *,
        celsius: float | None = None,
        detail: str | None = None,
        at: float | None = None,
    ) -> None:
        event = Event(
            time=time.time() if at is None else at,
            job=self.job,
            pid=self._pid(),
            action=action,
            source=self.source,
            simulated=self.simulated,
            celsius=celsius,
            detail=detail,
        )
        for sink in self.sinks:
            try:
                sink(event)
            except Exception as exc:  # enforcement must not depend on the log
                warn(f"event {action} not recorded: {type(exc).__name__}: {exc}")
