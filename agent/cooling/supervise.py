"""Supervising a command under the cooling policy: what `agent run -- CMD ARGS...` does.

The pure core, shared.cooling.policy's CoolingGate (the one cooling rule, which benchmark jobs
follow too), turns each poll into actions. A thin shell, `Supervisor`, runs CMD in its own
process group (agent.cooling.process_group) and applies the actions with signals to the whole
group, so a trainer's worker processes pause and stop with it: pause -> SIGSTOP, resume ->
SIGCONT, stop -> SIGCONT + SIGTERM, then SIGKILL after the grace.

Two seams keep the shell independent of where readings come from and where events go:
- a `Feed` yields samples (a reading and the policy to judge it by; agent.cooling.local_feed).
  `LocalFeed` polls this machine's ThermalMonitor; agent.cooling.feed.DaemonFeed passes on the
  agent daemon's (one sensor reader for every job, the policy the coordinator pushed) and falls
  back to a LocalFeed.
- `sinks` receive every Event (SQLite and stderr for `agent run`, and the daemon when it runs;
  agent.cooling.run_outputs).

reduce_batch reaches cooperative jobs through a state file, never through a signal a job did
not ask for: CMD's environment carries MLX_FLEET_COOLING_STATE, the path of a JSON file
rewritten (atomically) on every action, whose "reduce_batch" says whether to shrink the batch
now. A job that also sets MLX_FLEET_COOPERATIVE=1 in the environment it is started with gets
SIGUSR1 whenever "reduce_batch" changes, so it need not poll the file; SIGUSR1's default action
would kill a job that did not opt in, hence the opt-in.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from queue import Empty, SimpleQueue
from types import FrameType
from typing import Any

from agent.cooling.accounting import SUMMARY_ACTION, RunAccounting
from agent.cooling.gang import PARK_TIMEOUT_S, GangRank
from agent.cooling.gang_follow import GangFollower
from agent.cooling.job_speed import JobSpeed
from agent.cooling.local_feed import Feed, LocalFeed, Observation
from agent.cooling.output_tee import environment
from agent.cooling.pacer import PaceFollower, Pacer
from agent.cooling.process_group import (
    CommandGroup,
    Guardian,
    LaunchError,
    group_alive,
    shell_code,
    signal_group,
)
from agent.cooling.run_outputs import RunOutputs, Sink
from agent.cooling.step_gate import GANG_ENV, STATE_FILE_ENV, stopped_path
from agent.thermal import ThermalReading
from shared.cooling.job_account import THROTTLE_WINDOW_S
from shared.cooling.policy import Action, CoolingGate, CoolingState, JobState
from shared.exit_codes import EXIT_THERMAL_STOP
from shared.io.paths import data_subdir

__all__ = [
    "COOPERATIVE_ENV",
    "JOB_ENV",
    "Feed",
    "LaunchError",
    "LocalFeed",
    "Observation",
    "Sink",
    "Supervisor",
    "group_alive",
    "shell_code",
    "signal_group",
]
"""What `agent run`, its tests and its benchmark take from here; the feed, the process group
and the outputs are their own modules (local_feed.py, process_group.py, run_outputs.py)."""

JOB_ENV = "MLX_FLEET_JOB"
COOPERATIVE_ENV = "MLX_FLEET_COOPERATIVE"

FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
LEFTOVER_POLL_S = 0.05  # how often to look for what a finished CMD left in its group


class Supervisor(GangFollower, PaceFollower):
    """Runs one command in its own process group and applies the policy's actions to the
    group.

    Everything that changes state runs on the calling (main) thread, fed by one queue: samples
    from a sampler thread, CMD's exit from a waiter thread, and signals to `agent run` itself
    from their handlers (SimpleQueue.put is reentrant, so a handler may call it). Decisions
    never race.
    """

    def __init__(
        self,
        command: Sequence[str],
        *,
        grace: float = 30.0,
        job: str | None = None,
        sinks: Sequence[Sink] = (),
        throttle_window_s: float = THROTTLE_WINDOW_S,
    ) -> None:
        self.group = CommandGroup(command, grace)
        self.job = job or uuid.uuid4().hex[:8]
        # Taken before the caller opens the feed, so a replay's clock starts no earlier than this.
        self.started_at = time.time()
        self.accounting = RunAccounting(self.job, self.started_at, throttle_window_s)
        """The job's account (agent.cooling.accounting): fed every reading and event, and CMD's
        stdout through a tee; its summary is the `summary` event just before `exit`."""
        self.cooperative = os.environ.get(COOPERATIVE_ENV) == "1"
        self.state_file = data_subdir("jobs") / f"{self.job}.cooling.json"
        self.outputs = RunOutputs(
            self.job, [*sinks, self.accounting.on_event], self.state_file, lambda: self.pid
        )
        self.gate = CoolingGate()
        self.speed = JobSpeed(self.state_file, self.accounting.reported_rate)
        """The job's work rate and throttle verdict, in the state file each poll it changes."""
        self._state_written: tuple[CoolingState | None, ThermalReading | None] = (None, None)
        self._queue: SimpleQueue[tuple[str, Any]] = SimpleQueue()
        self._thermal_stop = False
        self.gang: GangRank | None = None
        """Set by `agent run` for a rank of a distributed job: the gang's verdict, not this
        Mac's alone, then drives the actions (agent.cooling.gang)."""
        self._stop_due: float | None = None
        self._park_due: float | None = None
        self._stop_left_to_cmd = False
        self.pacer = Pacer(self.group)

    def run(self, feed: Feed) -> int:
        """Run CMD to its end under `feed`; returns `agent run`'s exit code (CMD's, or 75 after a
        thermal stop). Raises LaunchError when CMD cannot start. Whatever the way out, the feed
        is closed and no process of the group is left."""
        self.outputs.feed = feed
        previous = self._install_handlers()
        guardian = Guardian.start(self.group.grace)
        try:
            self._write_state(None, None)
            proc = self._spawn()
            if guardian is not None:
                guardian.watch(proc.pid)
            self.outputs.emit("start", detail=shlex.join(self.group.command), at=self.started_at)
            if self.gang is not None:
                self.outputs.emit("gang", detail=self.gang.identity.describe())
                self.gang.start()
            threading.Thread(
                target=lambda: self._queue.put(("exit", proc.wait())),
                name="supervise-wait",
                daemon=True,
            ).start()
            threading.Thread(
                target=self._sample, args=(feed,), name="supervise-sample", daemon=True
            ).start()
            code = self._supervise(proc.pid)
        finally:
            self.pacer.close()
            feed.close()
            if self.gang is not None:
                self.gang.close()
            if self.group.alive():  # only on an unexpected way out
                self.group.signal(signal.SIGCONT)
                self.group.signal(signal.SIGKILL)
            if guardian is not None:
                guardian.release()
            self.state_file.unlink(missing_ok=True)
            stopped_path(self.state_file).unlink(missing_ok=True)
            self.speed.close()
            for signum, handler in previous.items():
                signal.signal(signum, handler)
        self.outputs.emit(SUMMARY_ACTION, detail=self.accounting.finish())
        detail = f"code {code}" + (", thermal stop" if self._thermal_stop else "")
        self.outputs.emit("exit", detail=detail)
        return code

    # --- the loop ---------------------------------------------------------------------------

    def _supervise(self, pgid: int) -> int:
        returncode: int | None = None
        while returncode is None or group_alive(pgid):
            if returncode is not None and not self.group.terminating:
                self.outputs.emit("cleanup", detail="terminating what CMD left in its group")
                self.group.terminate(signal.SIGTERM)
            try:
                kind, value = self._queue.get(timeout=self._timeout(returncode))
            except Empty:
                kill_at = self.group.kill_at
                if kill_at is not None and time.monotonic() >= kill_at:
                    self._kill(f"still running {self.group.grace:g} s after SIGTERM")
                kind, value = "due", None
            if kind == "exit":
                returncode = value
            elif kind == "signal":
                self._on_signal(value)
            elif kind == "gang":
                self._on_gang_news(*value)
            elif kind == "sample":
                self._on_sample(value)
            self._stop_when_acknowledged()  # on every turn: a due time passes with no news too
            self._park_when_overdue()
        if not self._thermal_stop and stopped_path(self.state_file).exists():
            self._thermal_stop = True  # CMD ended itself at the gang's stop before we heard it
            self.outputs.emit("gang", detail="the job ended itself at the gang's stop")
        return EXIT_THERMAL_STOP if self._thermal_stop else shell_code(returncode)

    def _timeout(self, returncode: int | None) -> float | None:
        """Until the grace ends, and short while CMD is gone but its group is not."""
        limits = [] if returncode is None else [LEFTOVER_POLL_S]
        for due in (self.group.kill_at, self._stop_due, self._park_due):
            if due is not None:
                limits.append(max(0.0, due - time.monotonic()))
        return min(limits, default=None)

    def _on_sample(self, sample: Observation) -> None:
        self.accounting.observe(sample.reading, sample.energy)  # first: a gang's rank returns
        if sample.note:
            self.outputs.emit(sample.note_action, detail=sample.note)
        if self.group.terminating:
            return
        reading = sample.reading
        decision = self.gate.observe(sample.policy, reading, self.pacer.clock_ratio(sample.clock))
        if self.gang is not None:
            self._tell_gang(reading, sample.policy)
            self._follow_gang(reading)
        else:
            self._follow_rule(decision, reading, sample.policy)
        self._judge_speed()

    def _judge_speed(self) -> None:
        """The job's work rate this poll, judged (agent.cooling.job_speed; not while paced: the
        rate is then the duty's share): into the state file when it changed, an event when the
        verdict did."""
        before = self.speed.work
        if self.gang is not None:
            running = not (self.gang.enforced.paused or self.gang.enforced.stopped)
        else:
            running = self.gate.supervision.job is JobState.RUNNING
        change = self.speed.poll(running and not self.pacer.paced and not self.group.terminating)
        if self.speed.work != before:
            self._write_state(*self._state_written)
        if change is not None:
            self.outputs.emit(change[0], detail=change[1])

    def _apply(
        self,
        actions: Sequence[Action],
        cooling: CoolingState | None,
        reading: ThermalReading | None,
        celsius: float | None,
        reason: str | Callable[[Action], str] | None,
    ) -> None:
        """Signals first (they are what must be prompt), then the state file, then the events.
        A rank of a gang is parked at a stop and ended once every rank applies it."""
        parks_itself = self.gang is not None and self.cooperative
        self.pacer.before(actions)
        for action in actions:
            if action is Action.PAUSE:
                if parks_itself:  # at its next step boundary (agent.cooling.step_gate)
                    self._park_due = time.monotonic() + PARK_TIMEOUT_S
                else:
                    self.group.signal(signal.SIGSTOP)
            elif action is Action.RESUME:
                self._park_due = None
                self.group.signal(signal.SIGCONT)
            elif action is Action.STOP:
                self._thermal_stop = True
                if self.gang is None:
                    self.group.terminate(signal.SIGTERM)
                else:
                    if not parks_itself:
                        self.group.signal(signal.SIGSTOP)
                    self._stop_due = time.monotonic() + self.gang.stop_ack_s
        self._write_state(cooling, reading)
        if self.cooperative and {Action.REDUCE_BATCH, Action.RESTORE_BATCH} & set(actions):
            self.group.signal(signal.SIGUSR1)
        for action in actions:
            detail = reason(action) if callable(reason) else reason
            self.outputs.emit(action.value, celsius=celsius, detail=detail)

    def _on_signal(self, signum: int) -> None:
        """Forward what `agent run` got; a second one (or one during a stop) kills at once."""
        name = signal.Signals(signum).name
        self.pacer.set(None, 0.0)
        if self.group.terminating:
            self._kill(f"{name} while stopping")
            return
        self.outputs.emit("forward", detail=name)
        self.group.terminate(signum)

    def _kill(self, why: str) -> None:
        if self.group.kill():
            self.outputs.emit("kill", detail=why)

    # --- the threads and handlers -----------------------------------------------------------

    def _spawn(self) -> subprocess.Popen[bytes]:
        """CMD's stdout goes through the accounting's tee (agent.cooling.output_tee), with
        PYTHONUNBUFFERED=1 unless set, so its reports arrive as they are printed."""
        env = {**os.environ, JOB_ENV: self.job, STATE_FILE_ENV: str(self.state_file)}
        if self.gang is not None:
            env[GANG_ENV] = self.gang.identity.group
        stdout = self.accounting.output()
        try:
            return self.group.spawn(environment(env), stdout)
        finally:
            self.accounting.spawned()  # the tee's end closes here, whether CMD started or not

    def _sample(self, feed: Feed) -> None:
        while (sample := feed.next()) is not None:
            self._queue.put(("sample", sample))

    def _install_handlers(self) -> dict[int, Any]:
        """Handlers for the forwarded signals, except those we were started ignoring (nohup, a
        background job): those stay ignored. Returns the previous handlers."""
        previous = {}
        for signum in FORWARDED_SIGNALS:
            if signal.getsignal(signum) is not signal.SIG_IGN:
                previous[signum] = signal.signal(signum, self._enqueue_signal)
        return previous

    def _enqueue_signal(self, signum: int, frame: FrameType | None) -> None:
        self._queue.put(("signal", signum))

    # --- what leaves the supervisor (RunOutputs) ----------------------------------------------

    @property
    def pid(self) -> int | None:
        """CMD's, and its group's id; None until it started."""
        return self.group.pid

    def _write_state(self, cooling: CoolingState | None, reading: ThermalReading | None) -> None:
        self._state_written = (cooling, reading)
        reduced = (self.gang.enforced if self.gang else self.gate.supervision).reduced
        self.outputs.write_state(cooling, reading, reduced, self.speed.work, self.pacer.told)
