"""One rank this agent started for a job across several Macs: its process (in a session of
its own, so every thread and child it has ends with it), the files mlx.launch would have
written for it, its output, and the bound past which the agent ends it even with no
coordinator left to ask."""

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
from shared.rank_env import RankLaunch

RUNNING, OK, FAILED, STOPPED = "running", "ok", "failed", "stopped"
REPORT_MAX_BYTES = 1024 * 1024
"""The most of a rank's stdout read back as its report."""
ERROR_MAX_CHARS = 300
STOP_GRACE_S = 3.0


class RankProcess:
    """start() once; poll() as often as the agent's loop wakes; stop() to end it early."""

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

    @property
    def rank(self) -> int:
        return self.launch.rank

    def start(self) -> None:
        """Write the launch files (0600) and start the rank; OSError when it cannot."""
        self.workdir.mkdir(mode=0o700, parents=True, exist_ok=True)
        env = {**os.environ, **self.launch.env, LIFELINE: "1"}
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
        self._started = self.clock()

    def elapsed_s(self) -> float:
        """Seconds it ran: until now while it runs, until its end after."""
        if self._process is None:
            return 0.0
        return (self._ended if self._ended is not None else self.clock()) - self._started

    def poll(self) -> str:
        """The state now; a rank past its bound is ended and failed, naming the bound."""
        if self.state != RUNNING or self._process is None:
            return self.state
        code = self._process.poll()
        if code is None:
            if self.elapsed_s() > self.bound_s:
                self._end()
                self.state = FAILED
                self.error = f"rank {self.rank} ran past its bound of {self.bound_s:g} s"
            return self.state
        self._finished(code)
        return self.state

    def stop(self, why: str) -> None:
        """End the rank now (the job was cancelled, or another rank failed)."""
        if self.poll() != RUNNING:
            return
        if self._process is not None:  # else never started: nothing to end
            self._end()
        self.state, self.error = STOPPED, why

    def _end(self) -> None:
        """SIGTERM the rank's session, SIGKILL after STOP_GRACE_S: the daemon's loop waits that
        long at most (a rank blocked in a collective dies at SIGTERM: it has no handler)."""
        self._ended = self.clock()
        process = self._process
        assert process is not None
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)  # what it left behind in its session
        if process.stdin is not None:
            process.stdin.close()

    def _finished(self, code: int) -> None:
        assert self._process is not None and self._process.stdin is not None
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
