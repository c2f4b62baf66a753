"""`agent calibrate`'s run: a sustained MLX load from cold in a child process, every sensor, the
clock and the load's work read at each poll, then the load held below the onset by running and
resting it; shared.cooling.throttle_point makes the throttle point of the polls (docs/thermal.md,
Calibrating a Mac).

The phases (throttle_point.PHASES): idle polls for the start temperature; flat out until the
throttle rule sees the clock (or, without one, the work rate) drop and stay down, and on for
THROTTLED_SHARE of the time left, for the firmware's operating point; then resting until the
firmware can restore its clock and held just under the onset for the rest of the time, for the
duty that holds it. A run that never throttles by NO_THROTTLE_SHARE of its time ends there."""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import zmq

from agent.cooling.calibrate_load import COUNTER
from agent.daemon_address import find_daemon
from agent.thermal.base import ThermalReading
from agent.thermal.monitor import ThermalMonitor
from shared.cooling.policy import HOT_POLLS_TO_STOP, CoolingState, pressure_state
from shared.cooling.throttle import ThrottleWatch
from shared.cooling.throttle_point import (
    CalibrationSample,
    ThrottlePoint,
    find_throttle_point,
    hold_step,
    throttle_poll,
)
from shared.io.keys import own_keypair
from shared.io.paths import data_dir
from shared.io.signals import signal_name
from shared.io.transport import AgentClient, HostError

IDLE_POLLS = 5
THROTTLED_SHARE = 0.4
"""After the onset, the share of the time left spent flat out: the firmware's operating point."""
NO_THROTTLE_SHARE = 0.75
"""A load that has not throttled by this share of the run's time ends it: the hold needs the
rest, and a Mac that does not throttle in that long has no onset to learn at this length."""
HOLD_CLOCK_MARGIN = 0.03
"""In the hold, a loaded poll whose clock reads this far under the sustained one has been
lowered by the firmware (a late poll let the die cross the onset): rest until it recovers. Far
tighter than the throttle rule's 10 %: one DVFS step down (4 % on the M2 GPU's top states)
already takes 11 % off its power (f·V²), so a hold at it measures a duty 12 % too high, and
the firmware's hysteresis keeps it there for as long as the hold stays near the onset."""
SLICE_POLLS = 1.5
"""In the hold, each run of the load lasts at most this many polls: a poll the machine makes
late (a busy CPU) cannot leave it heating past the onset."""
MIN_POLL_S = 0.05
"""The fastest poll (wall seconds), for a plant run faster than the wall clock."""
READY_TIMEOUT_S = 120.0
"""How long the load may take to start: importing MLX and its first matmul (a cold Mac's Metal
shader cache included)."""
PR_SET_PDEATHSIG = 1


class NoLoad(RuntimeError):
    """The load could not start: no MLX, or no device it can run on."""


class CalibrationStopped(RuntimeError):
    """The Mac grew too hot for the calibration to go on (a thermal stop)."""


LOCK_FILE = "calibrate.lock"


class Busy(RuntimeError):
    """A job or another calibration runs on this Mac: a calibration now would measure both."""


def busy_lock() -> int:
    """Hold the calibration lock (its descriptor; it lasts as long as the process holds it);
    Busy when another calibration holds it."""
    fd = os.open(data_dir() / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise Busy("another calibration is running on this Mac") from None
    return fd


def running_job(timeout_s: float = 5.0) -> str | None:
    """What this Mac's agent daemon runs now (`benchmark job j-1a2b`, `agent run job r-3c4d`),
    None when it runs nothing, or when no daemon answers (then there is no job it runs)."""
    address = find_daemon()
    if address is None:
        return None
    ctx = zmq.Context()
    keypair = own_keypair() if address.public_key else None
    client = AgentClient(ctx, address.endpoint, address.public_key, keypair, timeout_s)
    try:
        client.connect()
        info = client.request("info", timeout=timeout_s)
    except (HostError, zmq.ZMQError):
        return None
    finally:
        client.close()
        ctx.term()
    running = [f"benchmark job {info['job']['id']}"] if info.get("job") else []
    running += [f"agent run job {job['job']}" for job in info.get("jobs") or []]
    return ", ".join(running) or None


def time_scale(source: object) -> float:
    """Source seconds per wall second: a plant's speed (agent.thermal.plant), 1 for a Mac."""
    params = getattr(getattr(source, "plant", None), "params", None)
    speed = getattr(params, "speed", 1.0)
    return float(speed) if isinstance(speed, (int, float)) and speed > 0 else 1.0


def _die_with_parent() -> None:
    """In the load child before it starts (Linux): the kernel SIGKILLs it when `agent
    calibrate` dies, even while it is stopped (prctl(2) PR_SET_PDEATHSIG)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


class LoadChild:
    """The load (agent.cooling.calibrate_load), started running, then run and rested with
    SIGCONT / SIGSTOP; `work()` is its count so far."""

    def __init__(self) -> None:
        handle, path = tempfile.mkstemp(prefix="mlx-fleet-calibrate-")
        os.write(handle, bytes(COUNTER.size))
        os.close(handle)
        self._path = Path(path)
        env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "agent.cooling.calibrate_load", path],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,  # noqa: PLW1509
        )
        self.running = True
        self.device: str | None = None
        self._lock = threading.Lock()
        self._ran_s = 0.0
        self._on_since = time.monotonic()
        self._slice: threading.Timer | None = None

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> str:
        """The device the load runs on, once its first matmul is done; NoLoad saying why not."""
        assert self.process.stdout is not None
        line = ""
        deadline = time.monotonic() + timeout_s
        with contextlib.suppress(OSError, ValueError):
            os.set_blocking(self.process.stdout.fileno(), True)
        while time.monotonic() < deadline and not line:
            line = self.process.stdout.readline().decode(errors="replace").strip()
            if not line and self.process.poll() is not None:
                break
        told = _json(line)
        if isinstance(told.get("ready"), str):
            self.device = told["ready"]
            return self.device
        if isinstance(told.get("error"), str):
            raise NoLoad(f"no MLX load can run here: {told['error'][:300]}")
        code = self.process.poll()
        said = self._stderr_tail()
        how = "did not start in time" if code is None else _how(code)
        raise NoLoad(f"no MLX load can run here: the load {how}" + (f": {said}" if said else ""))

    def work(self) -> float:
        try:
            return COUNTER.unpack(self._path.read_bytes()[: COUNTER.size])[0]
        except (OSError, ValueError):  # struct.error is a ValueError
            return 0.0

    def run(self, on: bool, for_s: float | None = None) -> None:
        """Run or rest the load (no signal when it already is so); `for_s`: run it for at most
        that long (a slice: a late poll cannot leave it heating)."""
        if self._slice is not None:
            self._slice.cancel()
            self._slice = None
        self._switch(on)
        if on and for_s is not None:
            self._slice = threading.Timer(for_s, self._switch, (False,))
            self._slice.daemon = True
            self._slice.start()

    def _switch(self, on: bool) -> None:
        with self._lock:
            if on != self.running and self.process.poll() is None:
                self.process.send_signal(signal.SIGCONT if on else signal.SIGSTOP)
            now = time.monotonic()
            if self.running and not on:
                self._ran_s += now - self._on_since
            elif on and not self.running:
                self._on_since = now
            self.running = on

    def ran_s(self) -> float:
        """Seconds the load has run so far (since it started)."""
        with self._lock:
            return self._ran_s + (time.monotonic() - self._on_since if self.running else 0.0)

    def alive(self) -> bool:
        return self.process.poll() is None

    def close(self) -> None:
        if self._slice is not None:
            self._slice.cancel()
        if self.process.poll() is None:
            with contextlib.suppress(OSError):
                self.process.send_signal(signal.SIGKILL)
        self.process.wait()
        for stream in (self.process.stdout, self.process.stderr):
            if stream is not None:
                stream.close()
        self._path.unlink(missing_ok=True)

    def _stderr_tail(self) -> str | None:
        if self.process.poll() is None or self.process.stderr is None:
            return None
        lines = [s for s in self.process.stderr.read().decode(errors="replace").splitlines() if s]
        return lines[-1][:300] if lines else None


def _json(line: str) -> dict:
    try:
        found = json.loads(line)
    except ValueError:
        return {}
    return found if isinstance(found, dict) else {}


def _how(code: int) -> str:
    return f"died of {signal_name(-code)}" if code < 0 else f"exited {code}"


@dataclass(frozen=True)
class Progress:
    """What a calibration is doing now (each poll): its phase, wall seconds so far of the
    run's, the reading and the clock, and the onset once known."""

    phase: str
    elapsed_s: float
    total_s: float
    celsius: float | None
    sensor: str | None
    gpu_hz: float | None
    onset_c: float | None

    def to_dict(self) -> dict[str, object]:
        return {
            "phase": self.phase,
            "elapsed_s": self.elapsed_s,
            "total_s": self.total_s,
            "celsius": self.celsius,
            "sensor": self.sensor,
            "gpu_hz": self.gpu_hz,
            "onset_c": self.onset_c,
        }


class Calibration:
    """One run over a monitor (its source read at every poll, straight: a plant advances with
    each read) and a clock source; run() returns the ThrottlePoint. Not thread-safe."""

    def __init__(
        self,
        monitor: ThermalMonitor,
        clocks: object,
        minutes: float,
        poll_s: float,
        stop_temp: float | None,
        progress: Callable[[Progress], None] = lambda _: None,
    ) -> None:
        self.monitor = monitor
        self.clocks = clocks
        self.total_s = minutes * 60.0
        self.scale = time_scale(monitor.source)
        self.poll_s = max(MIN_POLL_S, poll_s / self.scale)
        self.stop_temp = stop_temp
        self.progress = progress
        self.samples: list[CalibrationSample] = []
        self._hot = 0
        self._onset_c: float | None = None

    def run(self, load: LoadChild) -> ThrottlePoint:
        """Raises NoThrottle, CalibrationStopped, ValueError (the polls cannot say)."""
        source = self.monitor.source
        load.run(False)
        start = time.monotonic()
        end = start + self.total_s
        self._polled_at, self._ran = start, load.ran_s()
        last_work = load.work()
        self._poll(start, "idle", 0.0, last_work)
        for _ in range(IDLE_POLLS):
            last_work = self._next(start, "idle", load, last_work)
        load.run(True)
        watch, throttled_at = ThrottleWatch.start(), None
        while (now := time.monotonic()) < end:
            if throttled_at is None and now >= start + NO_THROTTLE_SHARE * self.total_s:
                break
            if throttled_at is not None and now >= throttled_at + THROTTLED_SHARE * (
                end - throttled_at
            ):
                break
            last_work = self._next(start, "sustained", load, last_work)
            sample, previous = self.samples[-1], self.samples[-2]
            signal_name = "gpu clock" if self.samples[IDLE_POLLS + 1].gpu_hz else "work rate"
            watch, verdict = watch.observe(throttle_poll(sample, previous, signal_name))
            if verdict.throttling and throttled_at is None:
                throttled_at = time.monotonic()
        point = self._point(source)  # NoThrottle when it never did
        self._onset_c = point.onset_c
        recovered = holding = False
        while time.monotonic() < end:
            last = self.samples[-1]
            lowered = (
                point.sustained_hz is not None
                and last.running > 0.5
                and last.gpu_hz is not None
                and last.gpu_hz < (1 - HOLD_CLOCK_MARGIN) * point.sustained_hz
            )
            on, recovered = hold_step(last.celsius, point.onset_c, recovered, lowered)
            holding = recovered and (holding or not on)  # from the first rest at the cap
            load.run(on, for_s=SLICE_POLLS * self.poll_s)
            phase = "held" if holding else "recovering"  # warming back up is not the hold
            last_work = self._next(start, phase, load, last_work)
        load.run(False)
        return self._point(source)

    def _point(self, source: object) -> ThrottlePoint:
        return find_throttle_point(
            self.samples,
            getattr(source, "name", "unknown"),
            bool(getattr(source, "simulated", False)),
            time.time(),
        )

    def _next(self, start: float, phase: str, load: LoadChild, last_work: float) -> float:
        """Wait out the poll, then take one; returns the load's work count at it. The share
        of the interval the load ran is measured (its slices may end between polls)."""
        due = start + len(self.samples) * self.poll_s
        time.sleep(max(0.0, due - time.monotonic()))
        now, ran = time.monotonic(), load.ran_s()
        wall = now - self._polled_at
        running = min(1.0, (ran - self._ran) / wall) if wall > 0 else 0.0
        self._polled_at, self._ran = now, ran
        if not load.alive():
            raise NoLoad(f"the load {_how(load.process.returncode)} mid-run")
        work = load.work()
        self._poll(start, phase, running, work - last_work)
        return work

    def _poll(self, start: float, phase: str, running: float, work: float) -> None:
        reading = self.monitor.read()
        clock = self.clocks.read() if hasattr(self.clocks, "read") else None
        self._check_heat(reading)
        sample = CalibrationSample(
            time=(time.monotonic() - start) * self.scale,
            phase=phase,
            celsius=None if reading is None else reading.celsius,
            sensor=None if reading is None else reading.sensor,
            sensors={} if reading is None else dict(reading.sensors),
            gpu_hz=getattr(clock, "gpu_hz", None),
            gpu_active=getattr(clock, "gpu_active", None),
            work=work,
            running=running,
        )
        self.samples.append(sample)
        self.progress(
            Progress(
                phase,
                time.monotonic() - start,
                self.total_s,
                sample.celsius,
                sample.sensor,
                sample.gpu_hz,
                self._onset_c,
            )
        )

    def _check_heat(self, reading: ThermalReading | None) -> None:
        """CalibrationStopped at a pressure level that stops jobs, or HOT_POLLS_TO_STOP polls at
        or above the stop temperature (the rule every job lives under)."""
        if reading is None:
            return
        if pressure_state(reading.pressure) is CoolingState.STOP:
            raise CalibrationStopped(f"thermal pressure {reading.pressure}")
        hot = self.stop_temp is not None and (reading.celsius or -math.inf) >= self.stop_temp
        self._hot = self._hot + 1 if hot else 0
        if self._hot >= HOT_POLLS_TO_STOP:
            raise CalibrationStopped(
                f"{reading.celsius:.1f} °C, at or above {self.stop_temp:g} °C for {self._hot} polls"
            )
