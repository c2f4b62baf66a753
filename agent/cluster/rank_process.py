"""One rank this agent started for a job across several Macs: its process (in a session of
its own, so every thread and child it has ends with it), the files mlx.launch would have
written for it, its output, its progress (the heartbeat a coordinator fails a blocked run by),
and the bound past which the agent ends it even with no coordinator left to ask."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from agent.cluster.lifeline import LIFELINE
from shared.distributed.netbench import past_bound
from shared.distributed.rank_env import RankLaunch
from shared.distributed.rank_shapes import MAX_BOUND_S

RUNNING, OK, FAILED, STOPPED = "running", "ok", "failed", "stopped"
REPORT_MAX_BYTES = 1024 * 1024
"""The most of a rank's stdout read back as its report."""
ERROR_MAX_CHARS = 300
STOP_GRACE_S = 3.0
"""From SIGTERM to SIGKILL when a rank is ended (the daemon's loop escalates, never waits)."""
PROGRESS = "MLX_FLEET_PROGRESS"
"""The file a rank writes its units of progress done to (agent.cluster.netbench.Progress)."""
PROGRESS_FILE = "progress"
PROGRESS_MOST = 10**12
"""A count past this is not a count a rank wrote."""


class RankProcess:
    """start() once; poll() as often as the agent's loop wakes (it reads the rank's progress,
    ends it at its bound, or past it once neither its progress moves nor a coordinator asks,
    and escalates an ending rank to SIGKILL); stop() to end it early; settle() when the agent
    itself stops."""

    def __init__(
        self,
        job: str,
        launch: RankLaunch,
        argv: Sequence[str],
        workdir: Path,
        bound_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.job, self.launch, self.argv = job, launch, list(argv)
        self.workdir, self.bound_s, self.clock = workdir, bound_s, clock
        self.state = RUNNING
        self.error: str | None = None
        self.report: Any = None
        self._process: subprocess.Popen[bytes] | None = None
        self._started = 0.0
        self._ended: float | None = None
        self._kill_at: float | None = None
        self.progress = 0
        self._progress_at = 0.0
        self._asked_at: float | None = None

    def asked(self) -> None:
        """A coordinator asked about this rank (rank.get): past its bound it runs on while one
        keeps asking, since that coordinator fails the run itself when no rank moves."""
        self._asked_at = self.clock()

    @property
    def rank(self) -> int:
        return self.launch.rank

    @property
    def alive(self) -> bool:
        """Its process may still run: running, or ended and not yet gone (SIGTERM sent)."""
        return self._process is not None and (self.state == RUNNING or self._kill_at is not None)

    def start(self) -> None:
        """Write the launch files (0600) and start the rank; OSError when it cannot."""
        self.workdir.mkdir(mode=0o700, parents=True, exist_ok=True)
        progress = self.workdir / PROGRESS_FILE
        progress.unlink(missing_ok=True)
        env = {**os.environ, **self.launch.env, LIFELINE: "1", PROGRESS: str(progress)}
        for variable, content in self.launch.files.items():
            path = self.workdir / f"{variable.lower()}.json"
            descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(descriptor, "w", encoding="utf-8") as out:
                out.write(content)
            env[variable] = str(path)
        with open(self.workdir / "stdout", "wb") as out, open(self.workdir / "stderr", "wb") as err:
            self._process = subprocess.Popen(
                self.argv,
                env=env,
                stdin=subprocess.PIPE,
                stdout=out,
                stderr=err,
                start_new_session=True,
            )
        self._started = self._progress_at = self.clock()

    def elapsed_s(self) -> float:
        """Seconds it ran: until now while it runs, until its end after."""
        if self._process is None:
            return 0.0
        return (self._ended if self._ended is not None else self.clock()) - self._started

    def progress_age_s(self) -> float:
        """Seconds since its progress last moved (since it started, before any): until now
        while it runs, until its end after."""
        if self._process is None:
            return 0.0
        return (self._ended if self._ended is not None else self.clock()) - self._progress_at

    def poll(self) -> str:
        """The state now, its progress read; a rank past its bound is ended and failed, naming
        the bound; an ending rank is SIGKILLed once past STOP_GRACE_S, and reaped."""
        if self._process is None:
            return self.state
        if self.state != RUNNING:
            self.settle()
            return self.state
        self._read_progress()
        code = self._process.poll()
        if code is None:
            watched = None if self._asked_at is None else self.clock() - self._asked_at
            why = past_bound(
                self.rank, self.elapsed_s(), self.bound_s, self.progress, self.progress_age_s(),
                MAX_BOUND_S, watched,
            )  # fmt: skip
            if why is not None:
                self._end()
                self.state, self.error = FAILED, why
            return self.state
        self._finished(code)
        return self.state

    def stop(self, why: str) -> None:
        """End the rank (the job was cancelled, or another rank failed): SIGTERM now, SIGKILL
        from poll() past STOP_GRACE_S; returns at once, so the agent's loop never stalls."""
        if self.poll() != RUNNING:
            return
        if self._process is not None:  # else never started: nothing to end
            self._end()
        self.state, self.error = STOPPED, why

    def settle(self, wait: bool = False) -> None:
        """An ending rank: SIGKILL its session once STOP_GRACE_S has passed since its SIGTERM
        (at once with `wait`, after waiting out the grace: the agent is stopping), and once it
        is gone, whatever it left behind in its session."""
        process = self._process
        if process is None or self._kill_at is None:
            return
        if wait:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(max(0.0, self._kill_at - self.clock()))
        if process.poll() is None:
            if not wait and self.clock() < self._kill_at:
                return
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
            if not wait:
                return  # reaped at a later poll
            process.wait()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)  # what it left behind in its session
        if process.stdin is not None:
            process.stdin.close()
        self._kill_at = None

    def _end(self) -> None:
        """SIGTERM the rank's session (a rank blocked in a collective dies at it: it has no
        handler); settle() escalates after STOP_GRACE_S."""
        self._ended = self.clock()
        process = self._process
        assert process is not None
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGTERM)
        self._kill_at = self._ended + STOP_GRACE_S

    def _read_progress(self) -> None:
        """The units the rank reports done; a change restarts progress_age_s. A file not yet
        written, or caught mid-write, is read again at the next poll."""
        try:
            done = int((self.workdir / PROGRESS_FILE).read_bytes()[:64])
        except (OSError, ValueError):
            return
        if 0 <= done <= PROGRESS_MOST and done != self.progress:
            self.progress, self._progress_at = done, self.clock()

    def _finished(self, code: int) -> None:
        assert self._process is not None and self._process.stdin is not None
        self._read_progress()  # its last units
        self._ended = self.clock()
        self._process.stdin.close()
        if code != 0:
            self.state = FAILED
            said = last_line(self.workdir / "stderr")[:ERROR_MAX_CHARS]
            how = f"signal {-code}" if code < 0 else f"exit {code}"
            self.error = f"rank {self.rank} ended with {how}" + (f": {said}" if said else "")
            return
        if self.rank == 0:
            text = last_line(self.workdir / "stdout", REPORT_MAX_BYTES)
            try:
                self.report = json.loads(text)
            except ValueError:
                self.state, self.error = FAILED, f"rank 0's report is not JSON: {text[:80]!r}"
                return
        self.state = OK


def last_line(path: Path, most: int = 8192) -> str:
    """The last non-empty line of a file, read from its last `most` bytes: a rank's report
    (the one line it prints last, whatever a library printed before it), or what a failed
    rank said last (cut to ERROR_MAX_CHARS)."""
    with contextlib.suppress(OSError), open(path, "rb") as file:
        file.seek(0, os.SEEK_END)
        file.seek(max(0, file.tell() - most))
        lines = file.read().decode("utf-8", "replace").strip().splitlines()
        if lines:
            return lines[-1]
    return ""


def python_module(module: str, *args: str) -> list[str]:
    """The argv that runs one of agent.cluster's rank modules in this agent's Python."""
    return [sys.executable, "-m", module, *args]
