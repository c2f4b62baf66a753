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

Each rank also tells the others, in the same collective, how long its last step computed and
how long it waited in collectives (agent.cluster.collective_clock, timing the job's own
collectives); every STRAGGLER_WINDOW steps it writes the window of every rank's figures beside
the state file (`.stragglers`), where `agent run` names a rank the others wait on
(shared.distributed.stragglers). MLX_FLEET_INJECT=step-delay:S in a rank's environment sleeps S
at the start of each of its steps: a straggler, said to be injected.

Under the pace tier the state file carries the duty (shared.cooling.pace) and the gate paces the
loop itself, never stopped mid-step: after a step of w seconds it rests w·(1 − duty)/duty, the
ranks agreeing in the same collective on the longest rest, so they rest alike and meet at the
next step together. The slice is then the step: for steps well under a second.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent.cooling.guard import RunStopped
from agent.cooling.work_report import WorkReport
from shared.benchmark import faults
from shared.cooling.gang import GangSpecError, from_environment
from shared.cooling.policy import CoolingState
from shared.io.files import replace_atomically

if TYPE_CHECKING:
    import mlx.core as mx

    from agent.cluster.collective_clock import CollectiveClock

STATE_FILE_ENV = "MLX_FLEET_COOLING_STATE"
GANG_ENV = "MLX_FLEET_GANG"
"""Set by `agent run` for a rank of a gang: the group's name."""
PARKED_SUFFIX = ".parked"
STRAGGLERS_SUFFIX = ".stragglers"
STRAGGLER_WINDOW = 8
"""Steps per window of every rank's compute and wait figures."""
MOST_MICROSECONDS = 2**31 - 1
"""A step's figure as the int32 the ranks share it in: 35 minutes at most."""
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
        self.clock = _installed_clock() if self.state_file and self.group.size() > 1 else None
        self.delay_s = float(step_delays().get("step-delay") or 0.0)
        self.window: list[list[int]] = []
        """Each step's shared figures since the last written window."""
        self._timed = False
        """Whether a step has run since the gang agreed: there is a step's figure to share."""

    @classmethod
    def wanted(cls) -> bool:
        """Whether this process is a rank of a gang under `agent run`."""
        return bool(os.environ.get(GANG_ENV) and os.environ.get(STATE_FILE_ENV))

    def check_before_step(self, step: int) -> None:
        if self.state_file is None:
            return
        local, rest = self._local(), self._rest()
        decision, rest = self._agreed(local, rest, self._step_figures())
        if decision == RUN:
            if rest > 0:  # paced: every rank rests as long, and they meet at the next step
                time.sleep(rest)
            self._started_step()
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
            self._started_step()
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

    def _started_step(self) -> None:
        """A step starts now: its clock, and the injected delay inside it (its own compute)."""
        self._ran_from = time.monotonic()
        if self.clock is not None:
            self.clock.wait_s, self.clock.untimed = 0.0, 0
            self._timed = True
        if self.delay_s:
            time.sleep(self.delay_s)

    def _step_figures(self) -> tuple[int, int] | None:
        """The step just ended: its compute and its wait in collectives, in microseconds."""
        if self.clock is None or not self._timed:
            return None
        self._timed = False
        if self.clock.untimed:  # a compiled step's collectives: its wait cannot be told apart
            return None
        wait = self.clock.wait_s
        compute = max(0.0, time.monotonic() - self._ran_from - wait)
        return _microseconds(compute), _microseconds(wait)

    def _agreed(
        self, local: int, rest: float, figures: tuple[int, int] | None = None
    ) -> tuple[int, float]:
        """The most severe decision of any rank, and the longest rest: one CPU-stream
        collective of integers, which no GPU command buffer waits on; with `figures`, every
        rank's (each fills its own slots, the others' are 0) into the window."""
        if self.group.size() == 1:
            return local, rest
        mx, world, rank = self.mx, self.group.size(), self.group.rank()
        mine = [local, round(rest * 1000), int(figures is not None)] + [0] * (3 * world)
        if figures is not None:
            mine[3 + rank], mine[3 + world + rank] = figures
            mine[3 + 2 * world + rank] = int(self.delay_s > 0)
        all_max = self.clock.originals["all_max"] if self.clock else mx.distributed.all_max
        agreed = all_max(mx.array(mine), group=self.group, stream=mx.cpu).tolist()
        if agreed[2]:
            self._keep(agreed[3:], world)
        return int(agreed[0]), agreed[1] / 1000

    def _keep(self, shared: list[int], world: int) -> None:
        """One step's figures of every rank; every STRAGGLER_WINDOW steps the window, written
        beside the state file for `agent run` (replaced whole)."""
        self.window.append(shared)
        if len(self.window) < STRAGGLER_WINDOW or self.state_file is None:
            return
        steps, self.window = self.window, []
        body = {
            "hosts": gang_hosts(world),
            "compute_s": [[step[r] / 1e6 for step in steps] for r in range(world)],
            "wait_s": [[step[world + r] / 1e6 for step in steps] for r in range(world)],
            "injected": [any(step[2 * world + r] for step in steps) for r in range(world)],
            "time": time.time(),
        }
        with contextlib.suppress(OSError):  # the training goes on; agent run names nobody
            replace_atomically(stragglers_path(self.state_file), json.dumps(body))

    def _shutdown(self, step: int) -> GangStopped:
        assert self.state_file is not None
        stopped_path(self.state_file).write_text(json.dumps({"step": step, "time": time.time()}))
        return GangStopped(f"thermal stop of every rank at step {step} (agent run says why)")


def stragglers_path(state_file: Path) -> Path:
    return state_file.with_name(state_file.name + STRAGGLERS_SUFFIX)


def _installed_clock() -> CollectiveClock:
    from agent.cluster.collective_clock import CollectiveClock  # here: it imports MLX

    clock = CollectiveClock()
    clock.install()
    return clock


def _microseconds(seconds: float) -> int:
    return min(round(seconds * 1e6), MOST_MICROSECONDS)


def step_delays() -> dict[str, str | None]:
    """MLX_FLEET_INJECT's faults that hold for every step (no @CELL: a job has no cells)."""
    try:
        return {f.kind: f.value for f in faults.from_environ() if f.cell is None}
    except ValueError as exc:
        print(f"step gate: {exc}; nothing injected", file=sys.stderr, flush=True)
        return {}


def gang_hosts(world: int) -> list[str]:
    """Each rank's host as mlx.launch's environment names it; `rank R` where it does not."""
    try:
        gang = from_environment(os.environ, lambda path: Path(path).read_text(encoding="utf-8"))
    except (GangSpecError, OSError):
        gang = None
    if gang is None or len(gang.hosts) != world or not all(gang.hosts):
        return [f"rank {rank}" for rank in range(world)]
    return list(gang.hosts)
