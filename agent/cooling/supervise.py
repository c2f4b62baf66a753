"""Supervising a command under the cooling policy: what `agent run -- CMD ARGS...` does.

The pure core, shared.cooling.policy's CoolingGate (the one cooling rule, which benchmark jobs
follow too), turns each poll into actions. A thin shell, `Supervisor`, runs CMD in its own process
group and applies the actions with signals to the whole group, so a trainer's worker processes pause
and stop with it: pause -> SIGSTOP, resume -> SIGCONT, stop -> SIGCONT + SIGTERM, then SIGKILL after
the grace.

Two seams keep the shell independent of where readings come from and where events go:
- a `Feed` yields samples (a reading and the policy to judge it by). `LocalFeed` polls this
  machine's ThermalMonitor; agent.cooling.feed.DaemonFeed passes on the agent daemon's (one sensor
  reader for every job, the policy the coordinator pushed) and falls back to a LocalFeed.
- `sinks` receive every Event (SQLite and stderr for `agent run`, and the daemon when it runs).

reduce_batch reaches cooperative jobs through a state file, never through a signal a job did not
ask for: CMD's environment carries MLX_FLEET_COOLING_STATE, the path of a JSON file rewritten
(atomically) on every action, whose "reduce_batch" says whether to shrink the batch now. A job that
also sets MLX_FLEET_COOPERATIVE=1 in the environment it is started with gets SIGUSR1 whenever
"reduce_batch" changes, so it need not poll the file; SIGUSR1's default action would kill a job
that did not opt in, hence the opt-in.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from queue import Empty, SimpleQueue
from types import FrameType
from typing import Any, Protocol

import psutil

from agent.cooling.accounting import SUMMARY_ACTION, Energy, RunAccounting
from agent.cooling.events import PREFIX
from agent.cooling.gang import PARK_TIMEOUT_S, GangRank
from agent.cooling.gang_follow import GangFollower
from agent.cooling.output_tee import environment
from agent.cooling.step_gate import GANG_ENV, STATE_FILE_ENV, stopped_path
from agent.thermal import ThermalMonitor, ThermalReading
from shared.cooling.job_account import THROTTLE_WINDOW_S
from shared.cooling.policy import Action, CoolingGate, CoolingState, ThermalPolicy
from shared.exit_codes import EXIT_CANNOT_EXECUTE, EXIT_NOT_FOUND, EXIT_THERMAL_STOP
from shared.io.files import replace_atomically
from shared.io.paths import data_subdir
from shared.wire.telemetry import Event

JOB_ENV = "MLX_FLEET_JOB"
COOPERATIVE_ENV = "MLX_FLEET_COOPERATIVE"

FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
LEFTOVER_POLL_S = 0.05  # how often to look for what a finished CMD left in its group
CLOSE_WAIT_S = 2.0


def shell_code(returncode: int) -> int:
    """Popen's returncode as shells report it: killed by signal N (-N) becomes 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


# --- where samples come from ------------------------------------------------------------------


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
            return Observation(self.monitor.read(), self.policy)

    def close(self) -> None:
        self._closed.set()
        with self._lock:  # never close the source under a read in flight
            self.monitor.close()


# --- the process group ------------------------------------------------------------------------


class Guardian:
    """agent/cooling/guardian.py, watching CMD's group for as long as `agent run` lives: if `agent
    run`
    is killed (SIGKILL included) the guardian ends the group. release() once the group is
    ended here."""

    def __init__(self, process: subprocess.Popen[bytes]) -> None:
        self.process = process

    @classmethod
    def start(cls, grace: float) -> Guardian | None:
        """None, with a warning, when it cannot be started: supervision goes on without it."""
        script = Path(__file__).with_name("guardian.py")
        try:
            process = subprocess.Popen(
                [sys.executable, "-I", str(script), repr(grace)],
                stdin=subprocess.PIPE,
                start_new_session=True,
                close_fds=True,
            )
        except OSError as exc:
            _warn(f"no guardian for CMD ({exc}): if agent run is killed, CMD runs on")
            return None
        return cls(process)

    def watch(self, pgid: int) -> None:
        self._tell(f"{pgid}\n")

    def release(self) -> None:
        self._tell("release\n")
        if self.process.stdin is not None:
            with contextlib.suppress(OSError):
                self.process.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=CLOSE_WAIT_S)

    def _tell(self, line: str) -> None:
        if self.process.stdin is None:
            return
        with contextlib.suppress(OSError):
            self.process.stdin.write(line.encode("ascii"))
            self.process.stdin.flush()


def signal_group(pgid: int, signum: int) -> bool:
    """Signal every process of the group; False when none is left."""
    try:
        os.killpg(pgid, signum)
    except ProcessLookupError:
        return False
    return True


def group_alive(pgid: int) -> bool:
    """Whether a process other than a zombie is left in the group. Zombies do not count: an orphan
    reparented to an init that never reaps would otherwise look alive for ever."""
    if not signal_group(pgid, 0):
        return False
    for proc in psutil.process_iter(["status"]):
        try:
            if proc.info["status"] != psutil.STATUS_ZOMBIE and os.getpgid(proc.pid) == pgid:
                return True
        except ProcessLookupError:
            continue
    return False


class LaunchError(RuntimeError):
    """CMD could not be started; `code` is what a shell would exit with (126 or 127)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


Sink = Callable[[Event], None]


class Supervisor(GangFollower):
    """Runs one command in its own process group and applies the policy's actions to the group.

    Everything that changes state runs on the calling (main) thread, fed by one queue: samples from
    a sampler thread, CMD's exit from a waiter thread, and signals to `agent run` itself from their
    handlers (SimpleQueue.put is reentrant, so a handler may call it). Decisions never race.
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
        if not command:
            raise ValueError("no command to run")
        self.command = list(command)
        self.grace = grace
        self.job = job or uuid.uuid4().hex[:8]
        # Taken before the caller opens the feed, so a replay's clock starts no earlier than this.
        self.started_at = time.time()
        self.accounting = RunAccounting(self.job, self.started_at, throttle_window_s)
        """The job's account (agent.cooling.accounting): fed every reading and event, and CMD's
        stdout through a tee; its summary is the `summary` event just before `exit`."""
        self.sinks = [*sinks, self.accounting.on_event]
        self.cooperative = os.environ.get(COOPERATIVE_ENV) == "1"
        self.state_file = data_subdir("jobs") / f"{self.job}.cooling.json"
        self.gate = CoolingGate()
        self.pid: int | None = None
        self._queue: SimpleQueue[tuple[str, Any]] = SimpleQueue()
        self._kill_at: float | None = None
        self._killed = False
        self._thermal_stop = False
        self._feed: Feed | None = None
        self.gang: GangRank | None = None
        """Set by `agent run` for a rank of a distributed job: the gang's verdict, not this
        Mac's alone, then drives the actions (agent.cooling.gang)."""
        self._stop_due: float | None = None
        self._park_due: float | None = None
        self._stop_left_to_cmd = False

    def run(self, feed: Feed) -> int:
        """Run CMD to its end under `feed`; returns `agent run`'s exit code (CMD's, or 75 after a
        thermal stop). Raises LaunchError when CMD cannot start. Whatever the way out, the feed
        is closed and no process of the group is left."""
        self._feed = feed
        previous = self._install_handlers()
        guardian = Guardian.start(self.grace)
        try:
            self._write_state(None, None)
            proc = self._spawn()
            self.pid = proc.pid
            if guardian is not None:
                guardian.watch(proc.pid)
            self._emit("start", detail=shlex.join(self.command), at=self.started_at)
            if self.gang is not None:
                self._emit("gang", detail=self.gang.identity.describe())
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
            feed.close()
            if self.gang is not None:
                self.gang.close()
            if self.pid is not None and group_alive(self.pid):  # only on an unexpected way out
                self._signal(signal.SIGCONT)
                self._signal(signal.SIGKILL)
            if guardian is not None:
                guardian.release()
            self.state_file.unlink(missing_ok=True)
            stopped_path(self.state_file).unlink(missing_ok=True)
            for signum, handler in previous.items():
                signal.signal(signum, handler)
        self._emit(SUMMARY_ACTION, detail=self.accounting.finish())
        detail = f"code {code}" + (", thermal stop" if self._thermal_stop else "")
        self._emit("exit", detail=detail)
        return code

    # --- the loop ---------------------------------------------------------------------------

    def _supervise(self, pgid: int) -> int:
        returncode: int | None = None
        while returncode is None or group_alive(pgid):
            if returncode is not None and not self._terminating:
                self._emit("cleanup", detail="terminating what CMD left in its group")
                self._terminate(signal.SIGTERM)
            try:
                kind, value = self._queue.get(timeout=self._timeout(returncode))
            except Empty:
                if self._kill_at is not None and time.monotonic() >= self._kill_at:
                    self._kill(f"still running {self.grace:g} s after SIGTERM")
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
            self._emit("gang", detail="the job ended itself at the gang's stop")
        return EXIT_THERMAL_STOP if self._thermal_stop else shell_code(returncode)

    def _timeout(self, returncode: int | None) -> float | None:
        """Until the grace ends, and short while CMD is gone but its group is not."""
        limits = [] if returncode is None else [LEFTOVER_POLL_S]
        for due in (self._kill_at, self._stop_due, self._park_due):
            if due is not None:
                limits.append(max(0.0, due - time.monotonic()))
        return min(limits, default=None)

    def _on_sample(self, sample: Observation) -> None:
        self.accounting.observe(sample.reading, sample.energy)  # first: a gang's rank returns
        if sample.note:
            self._emit(sample.note_action, detail=sample.note)
        if self._terminating:
            return
        reading = sample.reading
        decision = self.gate.observe(sample.policy, reading)
        if self.gang is not None:
            celsius, sensor = (reading.celsius, reading.sensor) if reading else (None, None)
            self.gang.own(self.gate.state, celsius, self._source, sensor)
            self._follow_gang(reading)
            return
        if decision.actions:
            celsius = reading.celsius if reading else None
            self._apply(decision.actions, decision.cooling, reading, celsius, decision.reason)

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
        for action in actions:
            if action is Action.PAUSE:
                if parks_itself:  # at its next step boundary (agent.cooling.step_gate)
                    self._park_due = time.monotonic() + PARK_TIMEOUT_S
                else:
                    self._signal(signal.SIGSTOP)
            elif action is Action.RESUME:
                self._park_due = None
                self._signal(signal.SIGCONT)
            elif action is Action.STOP:
                self._thermal_stop = True
                if self.gang is None:
                    self._terminate(signal.SIGTERM)
                else:
                    if not parks_itself:
                        self._signal(signal.SIGSTOP)
                    self._stop_due = time.monotonic() + self.gang.stop_ack_s
        self._write_state(cooling, reading)
        if self.cooperative and {Action.REDUCE_BATCH, Action.RESTORE_BATCH} & set(actions):
            self._signal(signal.SIGUSR1)
        for action in actions:
            detail = reason(action) if callable(reason) else reason
            self._emit(action.value, celsius=celsius, detail=detail)

    def _on_signal(self, signum: int) -> None:
        """Forward what `agent run` got; a second one (or one during a stop) kills at once."""
        name = signal.Signals(signum).name
        if self._terminating:
            self._kill(f"{name} while stopping")
            return
        self._emit("forward", detail=name)
        self._terminate(signum)

    @property
    def _terminating(self) -> bool:
        return self._kill_at is not None or self._killed

    def _terminate(self, signum: int) -> None:
        """SIGCONT first (a stopped process would hold the signal pending), then `signum`; the
        grace starts now."""
        self._signal(signal.SIGCONT)
        self._signal(signum)
        self._kill_at = time.monotonic() + self.grace

    def _signal(self, signum: int) -> bool:
        return self.pid is not None and signal_group(self.pid, signum)

    def _kill(self, why: str) -> None:
        self._kill_at, self._killed = None, True
        if self._signal(signal.SIGKILL):
            self._emit("kill", detail=why)

    # --- the threads and handlers -----------------------------------------------------------

    def _spawn(self) -> subprocess.Popen[bytes]:
        """CMD's stdout goes through the accounting's tee (agent.cooling.output_tee), with
        PYTHONUNBUFFERED=1 unless set, so its reports arrive as they are printed."""
        env = {**os.environ, JOB_ENV: self.job, STATE_FILE_ENV: str(self.state_file)}
        if self.gang is not None:
            env[GANG_ENV] = self.gang.identity.group
        stdout = self.accounting.output()
        try:
            process = subprocess.Popen(
                self.command, start_new_session=True, env=environment(env), stdout=stdout
            )
        except FileNotFoundError:
            raise LaunchError(EXIT_NOT_FOUND, f"command not found: {self.command[0]}") from None
        except OSError as exc:
            raise LaunchError(
                EXIT_CANNOT_EXECUTE, f"cannot execute {self.command[0]}: {exc.strerror}"
            ) from None
        finally:
            self.accounting.spawned()  # the tee's end closes here, whether CMD started or not
        return process

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

    # --- what leaves the supervisor ---------------------------------------------------------

    @property
    def _source(self) -> str:
        """Asked each time: a feed that falls back changes where its readings come from."""
        return self._feed.source if self._feed else "none"

    @property
    def _simulated(self) -> bool:
        return self._feed.simulated if self._feed else False

    def _write_state(self, cooling: CoolingState | None, reading: ThermalReading | None) -> None:
        """The cooperative jobs' view, replaced atomically so a reader never sees half of it."""
        data = {
            "job": self.job,
            "state": cooling.value if cooling else None,
            "reduce_batch": (self.gang.enforced if self.gang else self.gate.supervision).reduced,
            "celsius": reading.celsius if reading else None,
            "source": self._source,
            "simulated": self._simulated,
            "time": time.time(),
        }
        try:
            replace_atomically(self.state_file, json.dumps(data))
        except OSError as exc:  # enforcement must not depend on the disk
            _warn(f"cannot write {self.state_file}: {exc}")

    def _emit(
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
            pid=self.pid,
            action=action,
            source=self._source,
            simulated=self._simulated,
            celsius=celsius,
            detail=detail,
        )
        for sink in self.sinks:
            try:
                sink(event)
            except Exception as exc:  # enforcement must not depend on the log
                _warn(f"event {action} not recorded: {type(exc).__name__}: {exc}")


def _warn(message: str) -> None:
    print(f"{PREFIX} warning: {message}", file=sys.stderr, flush=True)
