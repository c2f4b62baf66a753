"""CMD's stdout passed through `agent run`, so its training reports can be read while every byte
still reaches the user's stdout unchanged and at once.

CMD writes into a pseudo-terminal when `agent run`'s stdout is a terminal (so CMD still sees a
tty: line buffering, colours, progress bars, the terminal's width) and into a pipe otherwise. A
thread copies each chunk as it comes (a partial line, a progress bar's `\\r`, included) and then
hands the complete lines to `on_line` with their arrival time. Only stdout: mlx_lm prints its
reports there (print(), and rich's console for 0.32's TrainUI); CMD's stderr and stdin stay
`agent run`'s own.

A Python CMD writing to a pipe block-buffers print() (8 KiB), so its reports would arrive in
lumps, or only at its exit, and their arrival times would say nothing: CMD's environment gets
PYTHONUNBUFFERED=1 unless the user set it (see `environment`).

The tee never holds `agent run` up: close() drains what CMD's group left (it is all written by
then) and gives up on a pipe that something outside the group still holds open, or on a
stdout nobody reads, after a bounded wait; the thread is a daemon.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import select
import sys
import termios
import threading
import time
from collections.abc import Callable, Mapping

from agent.cooling.events import PREFIX

UNBUFFERED_ENV = "PYTHONUNBUFFERED"
CHUNK = 65536
MAX_LINE_BYTES = 65536
"""A longer line is not a report: what piles up without a newline beyond this is dropped from
the parsing (never from the copy)."""
POLL_S = 0.2
DRAIN_IDLE_S = 0.1
"""After CMD's group is gone, the tee stops once nothing more is readable for this long."""
CLOSE_WAIT_S = 5.0
"""close() waits at most this long for the copy to finish (a stdout nobody reads)."""

OnLine = Callable[[str, float], None]
_LINE_END = re.compile(rb"[\r\n]")


def environment(env: Mapping[str, str]) -> dict[str, str]:
    """`env` with PYTHONUNBUFFERED=1 unless it names PYTHONUNBUFFERED already (the user's
    choice, whatever its value, stays)."""
    return dict(env) if UNBUFFERED_ENV in env else {**env, UNBUFFERED_ENV: "1"}


class OutputTee:
    """One CMD's stdout: `child_fd` for Popen, start() once CMD runs, close() once its group is
    gone. `out` is where the copy goes (agent run's stdout)."""

    def __init__(self, on_line: OnLine, out: int, child_fd: int, read_fd: int, pty: bool):
        self.on_line = on_line
        self.out = out
        self.child_fd = child_fd
        self.pty = pty
        self._read_fd = read_fd
        self._draining = threading.Event()
        self._thread: threading.Thread | None = None
        self._pending = b""
        self._skipping = False

    @classmethod
    def open(cls, on_line: OnLine, out: int | None = None) -> OutputTee | None:
        """A pty when `out` (agent run's stdout by default) is a terminal, else a pipe; None
        when `out` is not open (CMD then inherits it as before) or no pty/pipe can be had."""
        if out is None:
            try:
                out = sys.stdout.fileno()
            except (AttributeError, OSError, ValueError):
                out = 1
        try:
            os.fstat(out)
        except OSError:
            return None
        try:
            if os.isatty(out):
                read_fd, child_fd = os.openpty()
                _like_terminal(out, child_fd)
                return cls(on_line, out, child_fd, read_fd, pty=True)
            read_fd, child_fd = os.pipe()
        except OSError:
            return None
        return cls(on_line, out, child_fd, read_fd, pty=False)

    def start(self) -> None:
        """After CMD's spawn: the child's end closes here, so CMD's group alone holds it."""
        with contextlib.suppress(OSError):
            os.close(self.child_fd)
        self._thread = threading.Thread(target=self._copy, name="output-tee", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Once CMD's group is gone: copy what is left, then stop (bounded: CLOSE_WAIT_S)."""
        self._draining.set()
        if self._thread is None:  # CMD never started
            for fd in (self.child_fd, self._read_fd):
                with contextlib.suppress(OSError):
                    os.close(fd)
            return
        self._thread.join(CLOSE_WAIT_S)

    # --- the thread ---------------------------------------------------------------------

    def _copy(self) -> None:
        try:
            while True:
                draining = self._draining.is_set()
                readable, _, _ = select.select(
                    [self._read_fd], [], [], DRAIN_IDLE_S if draining else POLL_S
                )
                if not readable:
                    if draining:
                        break
                    continue
                try:
                    chunk = os.read(self._read_fd, CHUNK)
                except OSError as exc:
                    if exc.errno == errno.EIO:  # a pty whose every holder has closed it
                        break
                    raise
                if not chunk:
                    break
                if not self._write(chunk):
                    break
                self._lines(chunk, time.time())
            if self._pending and not self._skipping:
                self._emit(self._pending, time.time())
        finally:
            with contextlib.suppress(OSError):
                os.close(self._read_fd)

    def _write(self, chunk: bytes) -> bool:
        """The whole chunk to `out`; False when `out` is gone (a closed pipe): the tee then
        closes CMD's end too, so CMD meets the broken pipe it would have met writing there."""
        view = memoryview(chunk)
        while view:
            try:
                written = os.write(self.out, view)
            except InterruptedError:
                continue
            except BlockingIOError:  # a stdout someone made non-blocking: wait for room
                select.select([], [self.out], [], POLL_S)
                continue
            except OSError:
                return False
            view = view[written:]
        return True

    def _lines(self, chunk: bytes, at: float) -> None:
        """Each complete line (ended by \\n or \\r: a progress bar redraws with \\r) to on_line."""
        *complete, self._pending = _LINE_END.split(self._pending + chunk)
        for line in complete:
            if line and not self._skipping and len(line) <= MAX_LINE_BYTES:
                self._emit(line, at)
            self._skipping = False
        if len(self._pending) > MAX_LINE_BYTES:
            self._pending, self._skipping = b"", True

    def _emit(self, line: bytes, at: float) -> None:
        try:
            self.on_line(line.decode("utf-8", "replace"), at)
        except Exception as exc:  # the copy must not depend on the accounting
            print(
                f"{PREFIX} warning: a line of CMD's output was not accounted: {exc}",
                file=sys.stderr,
            )


def _like_terminal(terminal: int, child: int) -> None:
    """The pty as CMD would have found `terminal`: its size and modes, but no output
    processing (the real terminal does it when the tee writes there: \\n -> \\r\\n once)."""
    with contextlib.suppress(OSError):
        size = fcntl.ioctl(terminal, termios.TIOCGWINSZ, b"\0" * 8)
        fcntl.ioctl(child, termios.TIOCSWINSZ, size)
    with contextlib.suppress(OSError, termios.error):
        attrs = termios.tcgetattr(terminal)
        attrs[1] &= ~termios.OPOST
        termios.tcsetattr(child, termios.TCSANOW, attrs)
