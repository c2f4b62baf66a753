"""CMD's process group, as `agent run` holds it: CMD started in a group of its own, every signal
sent to the whole group (so a trainer's worker processes pause and stop with it), a stop that
grows from SIGTERM to SIGKILL after the grace, and a guardian that ends the group if `agent run`
itself is killed. Its own module because holding a process group is one thing and deciding
what to do to it (agent.cooling.supervise's Supervisor, under the cooling policy) another."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import psutil

from agent.cooling.events import warn
from shared.exit_codes import EXIT_CANNOT_EXECUTE, EXIT_NOT_FOUND

CLOSE_WAIT_S = 2.0


def shell_code(returncode: int) -> int:
    """Popen's returncode as shells report it: killed by signal N (-N) becomes 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


class Guardian:
    """agent/cooling/guardian.py, watching CMD's group for as long as `agent run` lives: if
    `agent run` is killed (SIGKILL included) the guardian ends the group. release() once the
    group is ended here."""

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
            warn(f"no guardian for CMD ({exc}): if agent run is killed, CMD runs on")
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


class CommandGroup:
    """CMD in its own process group: spawn() it, signal() the whole group, terminate() it with
    a grace, then kill() it. `pid` is CMD's, and the group's id."""

    def __init__(self, command: Sequence[str], grace: float) -> None:
        if not command:
            raise ValueError("no command to run")
        self.command = list(command)
        self.grace = grace
        self.pid: int | None = None
        self.kill_at: float | None = None
        """When the grace after a terminate() ends."""
        self.killed = False

    def spawn(self, env: Mapping[str, str], stdout: int | None) -> subprocess.Popen[bytes]:
        """Start CMD in a new session (its own group); LaunchError when it cannot start."""
        try:
            process = subprocess.Popen(self.command, start_new_session=True, env=env, stdout=stdout)
        except FileNotFoundError:
            raise LaunchError(EXIT_NOT_FOUND, f"command not found: {self.command[0]}") from None
        except OSError as exc:
            raise LaunchError(
                EXIT_CANNOT_EXECUTE, f"cannot execute {self.command[0]}: {exc.strerror}"
            ) from None
        self.pid = process.pid
        return process

    @property
    def terminating(self) -> bool:
        return self.kill_at is not None or self.killed

    def signal(self, signum: int) -> bool:
        """Signal every process of the group; False when none is left (or none started)."""
        return self.pid is not None and signal_group(self.pid, signum)

    def terminate(self, signum: int) -> None:
        """SIGCONT first (a stopped process would hold the signal pending), then `signum`; the
        grace starts now."""
        self.signal(signal.SIGCONT)
        self.signal(signum)
        self.kill_at = time.monotonic() + self.grace

    def kill(self) -> bool:
        """SIGKILL the group; whether any process was left to kill."""
        self.kill_at, self.killed = None, True
        return self.signal(signal.SIGKILL)

    def alive(self) -> bool:
        """Whether CMD started and a process of its group is left (group_alive)."""
        return self.pid is not None and group_alive(self.pid)
