"""A rank dies with the agent that started it: the agent holds the write end of the rank's
stdin, so its end of file (the agent exited, however it exited, on macOS as on Linux) ends the
rank at once rather than leaving it blocked in a collective for ever.

The watcher is a forked process, not a thread: a rank blocked inside MLX's ring setup holds
the interpreter's lock, which a watching thread would wait on for ever."""

from __future__ import annotations

import contextlib
import os
import signal

STDIN = 0
LIFELINE = "MLX_FLEET_LIFELINE"
"""Set (to 1) by the agent that starts a rank with its stdin as the lifeline; a rank started
by hand or by mlx.launch has no such stdin and runs without one."""


def exit_with_parent() -> None:
    """Under an agent (LIFELINE set), fork a watcher that SIGKILLs this process when stdin
    reaches its end; it leaves alone a rank that has already ended (its parent is no longer
    the rank)."""
    if os.environ.get(LIFELINE) != "1":
        return
    rank = os.getpid()
    if os.fork() != 0:
        return
    try:
        with contextlib.suppress(OSError):
            while os.read(STDIN, 4096):
                pass
        if os.getppid() == rank:
            os.kill(rank, signal.SIGKILL)
    finally:
        os._exit(0)
