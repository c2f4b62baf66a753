"""calibrate.start and calibrate.get (docs/protocol.md §18): a coordinator has this Mac learn its
throttle point. The daemon runs `agent calibrate` itself as a child process, on the daemon's own
thermal source, with its progress in a file the child rewrites each second and its output in
calibrate.log, so that nothing the daemon does (or does not) read can stall it; the daemon reads
both when asked. The calibration the child stores is the policy the daemon enforces from its
next poll (agent.daemon.policy, EnforcedPolicy.recalibrated)."""

from __future__ import annotations

import contextlib
import ctypes
import json
import math
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from agent.cooling.calibration_file import load_calibration
from agent.daemon.benchmark.jobs import BenchJobs
from agent.daemon.handling import Reply, Request, handles
from agent.daemon.hub import TelemetryHub
from agent.daemon.ranks import RankJobs
from shared.bounds import MAX_CALIBRATE_MINUTES
from shared.exit_codes import (
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_TERMINATED,
    EXIT_THERMAL_STOP,
    EXIT_USAGE,
)
from shared.io.paths import data_dir
from shared.wire import protocol as p

PROGRESS_FILE = "calibrate-progress.json"
LOG_FILE = "calibrate.log"
NONE, RUNNING = "none", "running"
OUTCOMES = {
    EXIT_OK: "ok",
    EXIT_USAGE: "refused",
    EXIT_THERMAL_STOP: "stopped",
    EXIT_INTERRUPTED: "interrupted",
    EXIT_TERMINATED: "interrupted",
}
"""`agent calibrate`'s exit code -> the state calibrate.get says; any other is `failed`."""
PR_SET_PDEATHSIG = 1


def _interrupt_with_parent() -> None:
    """In the child before it runs (Linux): SIGTERM, which it takes as an interrupt (nothing
    stored), the moment the daemon dies (prctl(2) PR_SET_PDEATHSIG)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


class CalibrationChild:
    """One `agent calibrate` the daemon started; its state from its exit code, its progress
    file and the last line of its log."""

    def __init__(self, minutes: float, source: str) -> None:
        self.minutes = minutes
        self.source = source
        self.started = time.time()
        home = data_dir()
        self.progress_path = home / PROGRESS_FILE
        self.progress_path.unlink(missing_ok=True)
        self.log_path = home / LOG_FILE
        with open(self.log_path, "w", encoding="utf-8") as log:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "agent",
                    "calibrate",
                    "--minutes",
                    repr(minutes),
                    "--thermal-source",
                    source,
                    "--progress-file",
                    str(self.progress_path),
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=_interrupt_with_parent if sys.platform.startswith("linux") else None,  # noqa: PLW1509
            )

    @property
    def state(self) -> str:
        code = self.process.poll()
        if code is None:
            return RUNNING
        return OUTCOMES.get(code, "failed")

    def progress(self) -> dict[str, Any] | None:
        try:
            found = json.loads(self.progress_path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return found if isinstance(found, dict) else None

    def error(self) -> str | None:
        """What the child said last, when it did not calibrate."""
        if self.state in (RUNNING, "ok"):
            return None
        return _last_line(self.log_path) or f"agent calibrate exited {self.process.returncode}"

    def close(self) -> None:
        """Interrupt it (it keeps the previous policy) and wait; SIGKILL past 10 s."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def _last_line(path: Path) -> str | None:
    try:
        lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    except OSError:
        return None
    return lines[-1][:1000] if lines else None


class CalibrationRequests:
    """The handlers of calibrate.start and calibrate.get."""

    hub: TelemetryHub
    jobs: BenchJobs
    ranks: RankJobs
    calibration: CalibrationChild | None = None

    @handles("calibrate.start")
    def calibrate_start(self, request: Request) -> Reply:
        minutes = request.body["minutes"]
        if not (math.isfinite(minutes) and 0 < minutes <= MAX_CALIBRATE_MINUTES):
            raise request.refuse(
                p.BAD_BODY,
                f"calibrate.start: minutes must be above 0 and at most "
                f"{MAX_CALIBRATE_MINUTES:g}, got {minutes}",
            )
        busy = self.calibration_busy()
        if busy is not None:
            raise request.refuse(p.BUSY, f"cannot calibrate now: {busy}")
        source = self.hub.instruments.source.name
        self.calibration = CalibrationChild(float(minutes), source)
        return Reply("calibrate.start.ok", {"minutes": float(minutes), "source": source})

    def calibration_busy(self) -> str | None:
        """Why a calibration cannot start: a job or another calibration runs here."""
        if self.calibration is not None and self.calibration.state == RUNNING:
            return "a calibration is already running"
        if self.jobs.running is not None:
            return f"benchmark job {self.jobs.running.id} is running"
        if self.hub.jobs.jobs:
            return f"agent run job {next(iter(self.hub.jobs.jobs))} is running"
        if self.ranks.running is not None:
            return f"rank {self.ranks.running.rank} of job {self.ranks.running.job} is running"
        return None

    @handles("calibrate.get")
    def calibrate_get(self, request: Request) -> Reply:
        child = self.calibration
        stored = load_calibration()
        return Reply(
            "calibrate.get.ok",
            {
                "state": NONE if child is None else child.state,
                "minutes": None if child is None else child.minutes,
                "source": None if child is None else child.source,
                "progress": None if child is None else child.progress(),
                "error": None if child is None else child.error(),
                "calibration": None if stored is None else stored.to_dict(),
                "origin": None if stored is None else stored.origin(),
                "policy": self.hub.policy.to_dict(),
                "policy_origin": self.hub.policy_origin,
            },
        )
