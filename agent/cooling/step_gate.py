"""Cooperative pausing of a distributed training loop: every rank parks at the same step
boundary, with no collective in flight.

SIGSTOP of a rank mid-step is unsafe on a Mac: MLX runs a collective on the CPU stream, and the
GPU command buffer that consumes its result waits on an MTLSharedEvent the rank's own CPU thread
signals (mlx/backend/metal/event.cpp, device.cpp `encodeWait`); a stopped thread never signals
it, and Metal's watchdog kills a command buffer that waits too long (ml-explore/mlx#4475,
docs/monitoring.md "Distributed fine-tunes"). So a cooperative job parks itself between steps:

    gate = StepGate()                  # under `agent run`, in a gang
    for step in range(steps):
        gate.check_before_step(step)   # returns at once unless the gang pauses or stops
        ...one training step, ending in mx.eval...
        gate.report_work(tokens)       # optional: the step's tokens, for the job's tok/s

Every rank asks `agent run`'s state file ($MLX_FLEET_COOLING_STATE) what the gang lives under,
and the ranks agree with one CPU-stream `all_max` of two integers, so all park at the same step
even though each heard the verdict at its own moment. A parked rank synchronizes its GPU work, tells
`agent run` it is parked (the state file's sibling `.parked`: then a SIGSTOP is safe as well),
and sleeps; every WAKE_EVERY_S the parked ranks agree again, so they leave together, once every
rank's `agent run` allows it.
At a stop it raises GangStopped at the same step on every rank.

Under the pace tier the state file carries the duty (shared.cooling.pace) and the gate paces the
loop itself, never stopped mid-step: after a step of w seconds it rests w·(1 − duty)/duty, the
ranks agreeing in the same collective on the longest rest, so they rest alike and meet at the
next step together. The slice is then the step: for steps well under a second.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent.cooling.guard import RunStopped
from agent.cooling.work_report import WorkReport
from shared.cooling.policy import CoolingState

if TYPE_CHECKING:
    import mlx.core as mx

STATE_FILE_ENV = "MLX_FLEET_COOLING_STATE"
GANG_ENV = "MLX_FLEET_GANG"
"""Set by `agent run` for a rank of a gang: the group's name."""
PARKED_SUFFIX = ".parked"
STOPPED_SUFFIX = ".stopped"
WAKE_EVERY_S = 0.1
"""How often parked ranks ask each other whether the gang resumed: a CPU-stream collective of
a scalar, every rank having slept the same time, so none spins long in it."""

RUN, PAUSE, STOP = 0, 1, 2
"""What the gang lives under, ordered so the ranks' all_max is the most severe."""
_CODES = {CoolingState.PAUSE.value: PAUSE, CoolingState.STOP.value: STOP}


class GangStopped(RunStopped):
    """The gang's cooling policy stopped the job: raised at the same step on every rank."""


def parked_path(state_file: Path) -> Path:
    return state_file.with_name(state_file.name + PARKED_SUFFIX)


def stopped_path(state_file: Path) -> Path:
    """Written by a rank that ends itself at the gang's stop: the agreement can reach it before
    its own `agent run` heard of the stop, which must still exit 75."""
    return state_file.with_name(state_file.name + STOPPED_SUFFIX)


class StepGate:
    """The step boundary of one rank (see the module's docstring). Outside `agent run`, or for a
    job of one rank, check_before_step() returns at once."""

    def __init__(self, group: mx.distributed.Group | None = None) -> None:
        import mlx.core as mx  # here: `agent run` and the scheduler's users need no MLX

        path = os.environ.get(STATE_FILE_ENV)
        self.state_file = Path(path) if path else None
        self.group = group if group is not None else mx.distributed.init()
        self.mx: Any = mx
        self.pauses = 0
        self.work = WorkReport(self.state_file)
        self._ran_from = time.monotonic()
        """When the step now ending began: the pace tier's rest is a share of it."""

    @classmethod
    def wanted(cls) -> bool:
        """Whether this process is a rank of a gang under `agent run`."""
        return bool(os.environ.get(GANG_ENV) and os.environ.get(STATE_FILE_ENV))

    def check_before_step(self, step: int) -> None:
        if self.state_file is None:
            return
        local, rest = self._local(), self._rest()
        decision, rest = self._agreed(local, rest)
        if decision == RUN:
            if rest > 0:  # paced: every rank rests as long, and they meet at the next step
                time.sleep(rest)
            self._ran_from = time.monotonic()
            return
        if decision == STOP:
            raise self._shutdown(step)
        # PAUSE: every rank is here, at this step.
        self.mx.synchronize()  # nothing of ours left in flight on the GPU
        self.pauses += 1
        parked = parked_path(self.state_file)
        parked.write_text(json.dumps({"step": step, "time": time.time(), "pid": os.getpid()}))
        try:
            while decision == PAUSE:  # every rank asks again each time: they leave together
                time.sleep(WAKE_EVERY_S)
                decision, _ = self._agreed(self._local(), 0.0)
        finally:
            parked.unlink(missing_ok=True)
            self._ran_from = time.monotonic()
        if decision == STOP:
            raise self._shutdown(step)

    def report_work(self, tokens: float) -> None:
        """The step just done processed `tokens` tokens: `agent run` shows the job's tokens/s
        and judges throttling by it (agent.cooling.work_report). ValueError, one line, for a
        negative or non-numeric count."""
        self.work.add(tokens)

    def _local(self) -> int:
        """What `agent run` says the gang lives under; RUN when its file cannot be read (it is
        replaced atomically, so a read sees a whole one or none)."""
        assert self.state_file is not None
        try:
            state = json.loads(self.state_file.read_text(encoding="utf-8")).get("state")
        except (OSError, ValueError, AttributeError):
            return RUN
        return _CODES.get(state, RUN)

    def _rest(self) -> float:
        """Under the pace tier (the state file's `duty`, written while the job paces itself):
        the rest after the step just done that makes the loop run `duty` of its time."""
        assert self.state_file is not None
        try:
            duty = json.loads(self.state_file.read_text(encoding="utf-8")).get("duty")
        except (OSError, ValueError, AttributeError):
            return 0.0
        if not isinstance(duty, (int, float)) or not 0 < duty < 1:
            return 0.0
        return (time.monotonic() - self._ran_from) * (1 - duty) / duty

    def _agreed(self, local: int, rest: float) -> tuple[int, float]:
        """The most severe decision of any rank, and the longest rest: one CPU-stream
        collective of two integers, which no GPU command buffer waits on."""
        if self.group.size() == 1:
            return local, rest
        mx = self.mx
        mine = mx.array([local, round(rest * 1000)])
        agreed = mx.distributed.all_max(mine, group=self.group, stream=mx.cpu).tolist()
        return int(agreed[0]), agreed[1] / 1000

    def _shutdown(self, step: int) -> GangStopped:
        assert self.state_file is not None
        stopped_path(self.state_file).write_text(json.dumps({"step": step, "time": time.time()}))
        return GangStopped(f"thermal stop of every rank at step {step} (agent run says why)")
