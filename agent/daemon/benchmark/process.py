"""One job process (`python -m agent.daemon.benchmark.child`, agent/daemon/benchmark/child.py)
seen from the daemon: started with its request on stdin, its msgpack stream read off a pipe, its
stdout and stderr in a log file, and its end told in words (an exit code, or the signal that
killed it, and its last lines).

Only the daemon's main thread uses it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgpack

from shared.benchmark import gpu_errors
from shared.io.signals import signal_name

TAIL_LINES = 5
TAIL_CHARS = 8000
"""How much of a dead process's log is read; TAIL_LINES of it are quoted."""
FATAL = "Fatal Python error"
"""How faulthandler's report of a crash starts (each thread's frames follow it)."""
MATRIX_FRAME = "in run_matrix"


class JobProcess:
    """spawn() it; read() what it wrote; send() it updates; reap() its exit code."""

    def __init__(
        self, process: subprocess.Popen[bytes], fd: int, log: Path | None, log_start: int = 0
    ) -> None:
        self.process = process
        self.fd = fd
        """The pipe the process writes its stream to: poll it, then read()."""
        self.log = log
        self.log_start = log_start
        """Where this process's output begins in `log`: the processes of one job (a new one
        after a crash) append to one log."""
        self._unpacker = msgpack.Unpacker(raw=False)

    @classmethod
    def spawn(cls, request: dict[str, Any], log: Path | None) -> JobProcess:
        """Start `python -m agent.daemon.benchmark.child` with `request` as its first input. Its
        output goes to `log` (appended, mode 0600), or nowhere when None. Raises OSError."""
        read_fd, write_fd = os.pipe()
        log_fd = (
            os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            if log is not None
            else subprocess.DEVNULL
        )
        log_start = os.fstat(log_fd).st_size if log is not None else 0
        try:
            process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "agent.daemon.benchmark.child",
                    "--fd",
                    str(write_fd),
                    "--parent",
                    str(os.getpid()),
                ],
                stdin=subprocess.PIPE,
                stdout=log_fd,
                stderr=log_fd,
                pass_fds=(write_fd,),
                close_fds=True,
            )
        except BaseException:
            os.close(read_fd)
            raise
        finally:
            os.close(write_fd)
            if log is not None:
                os.close(log_fd)  # type: ignore[arg-type]
        assert process.stdin is not None
        process.stdin.write(msgpack.packb(request))
        process.stdin.flush()
        os.set_blocking(process.stdin.fileno(), False)
        return cls(process, read_fd, log, log_start)

    @property
    def pid(self) -> int:
        return self.process.pid

    def read(self) -> list[dict[str, Any]] | None:
        """The items written since the last read; None once the process closed its end."""
        data = os.read(self.fd, 65536)
        if not data:
            return None
        self._unpacker.feed(data)
        return list(self._unpacker)

    def send(self, update: dict[str, Any]) -> None:
        """Never blocks: an update the pipe has no room for (a process that stopped reading)
        is dropped."""
        if self.process.stdin is None or self.process.stdin.closed:
            return
        with contextlib.suppress(BlockingIOError, BrokenPipeError):
            os.write(self.process.stdin.fileno(), msgpack.packb(update))

    def terminate(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.process.kill()

    def reap(self, timeout: float) -> int:
        """Close our ends and wait for the exit (killing it after `timeout`); its returncode."""
        os.close(self.fd)
        try:
            code = self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            code = self.process.wait()
        assert self.process.stdin is not None
        with contextlib.suppress(OSError):
            self.process.stdin.close()
        return code

    def last_lines(self) -> str:
        """What this process wrote, for the error of the cell it died on: output_said()."""
        return output_said(self.log, self.log_start)

    def gpu_error(self) -> tuple[str, str] | None:
        """The Metal command-buffer error (kind, line) the tail of its output reports, if any
        (shared.benchmark.gpu_errors): what killed it when Metal's uncaught exception aborted it."""
        if self.log is None:
            return None
        try:
            with open(self.log, "rb") as handle:
                end = handle.seek(0, os.SEEK_END)
                handle.seek(max(self.log_start, end - TAIL_CHARS))
                text = handle.read().decode("utf-8", "replace")
        except OSError:
            return None
        return gpu_errors.find(text)


def output_said(log: Path | None, start: int = 0) -> str:
    """The end of a dead job process's error (docs/protocol.md §5, The job stream), always one
    form, `WHAT (log: PATH)`: WHAT is its last lines (quote(), joined by ' | ') of what it
    wrote to `log` from `start`, or `it wrote nothing`, or `its log could not be read: ERROR`;
    without a log (the disk refused the folder) `its output was not kept (no log: the agent
    could not create job-logs)`."""
    if log is None:
        return "its output was not kept (no log: the agent could not create job-logs)"
    try:
        with open(log, "rb") as handle:
            end = handle.seek(0, os.SEEK_END)
            handle.seek(max(start, end - TAIL_CHARS))
            text = handle.read().decode("utf-8", "replace")
    except OSError as exc:
        return f"its log could not be read: {exc.strerror or exc} (log: {log})"
    quoted = quote(text)
    return f"{' | '.join(quoted) if quoted else 'it wrote nothing'} (log: {log})"


def quote(text: str) -> list[str]:
    """The lines of a log's tail that say why the process died: after a crash, faulthandler's
    verdict and the innermost frames of the thread that was running the matrix (the crash
    itself is often in one of MLX's own threads, which has no Python frames); else its last
    lines."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    fatal = [i for i, line in enumerate(lines) if line.startswith(FATAL)]
    if not fatal:
        return lines[-TAIL_LINES:]
    blocks: list[list[str]] = []
    for line in lines[fatal[-1] + 1 :]:
        if line.startswith(("Thread 0x", "Current thread 0x")):
            blocks.append([])
        elif line.startswith("File ") and blocks:
            blocks[-1].append(line)
    running = [b for b in blocks if any(MATRIX_FRAME in line for line in b)] or blocks or [[]]
    return [lines[fatal[-1]], *running[0][: TAIL_LINES - 1]]


def exit_text(code: int) -> str:
    return f"killed by {signal_name(-code)}" if code < 0 else f"exit code {code}"
