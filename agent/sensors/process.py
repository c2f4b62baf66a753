"""A tool's output stream as readings (macmon, powermetrics): the process started, restarted
when it dies or goes silent, stale samples refused; and the tools' command lines.

One process per reading costs a second or more and a fork each time; a stream costs nothing
between samples. A reader thread parses lines as they come; read() hands out the latest sample and
supervises the process: one that exited or went silent is restarted after a backoff.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import threading
import time
from abc import abstractmethod
from collections import deque
from typing import Generic, Protocol, TypeVar

from agent.sensors.base import Backoff, SourceUnavailable
from shared.io.processes import end_process


class Timed(Protocol):
    time: float


R = TypeVar("R", bound=Timed)


class ToolStream(Generic[R]):
    """A tool on PATH streaming samples on stdout; subclasses say how to run it and parse a line
    into a reading R. Mixed into a source (a ThermalSource here, a PowerSource in agent.power),
    which gives it `name`, `last_error` and `_fail`."""

    tool: str
    install_hint: str
    name: str
    last_error: str | None

    def __init__(
        self,
        *,
        interval_s: float = 1.0,
        silence_s: float | None = None,
        stale_s: float | None = None,
        startup_s: float | None = None,
        backoff: Backoff | None = None,
    ) -> None:
        super().__init__()
        executable = shutil.which(self.tool)
        if executable is None:
            raise SourceUnavailable(f"{self.tool} not found on PATH ({self.install_hint})")
        self.executable = executable
        self.interval_s = interval_s
        # A tool that printed nothing for ~10 intervals is hung: kill and restart it.
        self.silence_s = silence_s if silence_s is not None else 10 * interval_s + 2.0
        self.stale_s = stale_s if stale_s is not None else stale_after(interval_s)
        self.startup_s = startup_s if startup_s is not None else 2 * interval_s + 3.0
        self._backoff = backoff or Backoff()
        self._lock = threading.Lock()
        self._sampled = threading.Condition(self._lock)
        self._proc: subprocess.Popen[str] | None = None
        self._latest: R | None = None
        self._last_output = 0.0
        self._next_start = 0.0
        self._restart_now = False
        self._closed = False
        self._tail: deque[str] = deque(maxlen=3)

    @property
    def interval_ms(self) -> int:
        return max(1, round(self.interval_s * 1000))

    @abstractmethod
    def command(self) -> list[str]:
        """The argv that starts the stream."""

    @abstractmethod
    def _parse_line(self, line: str) -> R | None:
        """A reading when this line completes a sample; may set last_error. Runs under the lock."""

    def _on_start(self) -> None:
        """Reset per-process parsing state. Called under the lock."""

    def read(self) -> R | None:
        with self._lock:
            if self._closed:
                return self._fail(f"{self.name}: source closed")
            if self._supervise():
                self._await_first_sample()
            if self._latest is None:
                return self._fail(self.last_error or f"{self.name}: no sample yet")
            if self._latest_is_stale():
                age = time.time() - self._latest.time
                return self._fail(self.last_error or f"{self.name}: last sample {age:.1f} s old")
            return self._latest

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._stop_process()

    def _await_first_sample(self) -> None:
        """Just (re)started: a one-shot caller needs the first sample, so wait for it, following an
        immediate restart (a refused sampler) but not a backoff."""
        deadline = time.monotonic() + self.startup_s
        while self._latest_is_stale():
            if not self._running() and not self._supervise():
                return
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            self._sampled.wait(min(remaining, 0.1))

    def _latest_is_stale(self) -> bool:
        return self._latest is None or time.time() - self._latest.time > self.stale_s

    def _running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def _supervise(self) -> bool:
        """Notice a dead or silent process, restart when its backoff allows; True if started."""
        now = time.monotonic()
        if self._proc is not None:
            code = self._proc.poll()
            if code is not None:
                tail = " | ".join(self._tail)
                self.last_error = f"{self.name}: {self.tool} exited with code {code}" + (
                    f": {tail}" if tail else ""
                )
                self._proc = None
                self._schedule_restart(now)
            elif now - self._last_output > self.silence_s:
                self._stop_process()
                self.last_error = (
                    f"{self.name}: {self.tool} silent for {self.silence_s:.1f} s; restarting it"
                )
                self._schedule_restart(now)
        if self._proc is None and now >= self._next_start:
            return self._start(now)
        return False

    def _schedule_restart(self, now: float) -> None:
        self._next_start = now if self._restart_now else now + self._backoff.next_delay()
        self._restart_now = False

    def _start(self, now: float) -> bool:
        argv = self.command()
        try:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                errors="replace",
                bufsize=1,
            )
        except OSError as exc:
            self.last_error = f"{self.name}: cannot start {argv[0]}: {exc}"
            self._next_start = now + self._backoff.next_delay()
            return False
        self._proc = proc
        self._last_output = time.monotonic()
        self._tail.clear()
        self._on_start()
        threading.Thread(
            target=self._pump, args=(proc,), name=f"{self.tool}-reader", daemon=True
        ).start()
        return True

    def _pump(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        with proc.stdout:
            for line in proc.stdout:
                with self._lock:
                    if proc is not self._proc:
                        break
                    self._last_output = time.monotonic()
                    if line.strip():
                        self._tail.append(line.strip()[:200])
                    reading = self._parse_line(line)
                    if reading is not None:
                        self._latest = reading
                        self._backoff.reset()
                        self._sampled.notify_all()
        with self._lock:
            self._sampled.notify_all()

    def _stop_process(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            end_process(proc)


def stale_after(interval_s: float) -> float:
    """Seconds after which a tool's sample is too old to hand out: three missed intervals."""
    return 3 * interval_s + 1.0


def macmon_command(executable: str, interval_ms: int) -> list[str]:
    """`-i` before the subcommand: global since macmon 0.5.0, and `macmon pipe -i MS` fails on
    0.4.2 and older, so this form works on every version (mac-desk-check.md, macmon)."""
    return [executable, "-i", str(interval_ms), "pipe"]


def sudo_for_root(use_sudo: bool | None) -> str | None:
    """The sudo to run a root-only tool with: None when we are root (or told not to use it);
    use_sudo None decides by our euid. SourceUnavailable when one is needed and there is none."""
    if use_sudo is None:
        use_sudo = os.geteuid() != 0
    if not use_sudo:
        return None
    sudo = shutil.which("sudo")
    if sudo is None:
        raise SourceUnavailable("powermetrics needs root, and sudo is not on PATH")
    return sudo


def powermetrics_command(
    executable: str, sampler: str, interval_ms: int, sudo: str | None
) -> list[str]:
    """The streaming argv; `sudo -n` fails at once instead of prompting when there is no sudoers
    entry, so a user agent never hangs on a password. `-b 1` line-buffers its output: into a
    pipe powermetrics otherwise buffers whole samples (mac-desk-check.md, powermetrics)."""
    argv = [executable, "--samplers", sampler, "-i", str(interval_ms), "-b", "1"]
    return [sudo, "-n", *argv] if sudo else argv


_UNRECOGNIZED_SAMPLER = re.compile(r"unrec\w*ized sampler:?\s*(?P<sampler>\w+)", re.IGNORECASE)


def unrecognized_sampler(line: str) -> str | None:
    """The sampler powermetrics refused (Apple Silicon has no `smc`), or None."""
    match = _UNRECOGNIZED_SAMPLER.search(line)
    return match["sampler"] if match else None
