"""The guardian of an `agent run` command: a tiny process that ends the command's process group
when `agent run` dies, however it dies (SIGKILL, the out-of-memory killer), so a supervised
command never runs on unsupervised.

It runs as `python -I guardian.py GRACE` (by path, standard library only: nothing of mlx-fleet
is imported, so it starts at once), in a session of its own so the terminal's signals leave it
alone. Its stdin is a pipe only `agent run` holds open. `agent run` writes the group's id, one
line, once CMD is started; "release", one line, when it ended the group itself. The kernel closes
the pipe when `agent run` dies: end of file without "release" makes the guardian send SIGCONT
(a paused group holds its signals) and SIGTERM to the group, then SIGKILL after GRACE seconds if
any of it is left. Works the same on macOS and Linux: it needs only a pipe, killpg(2) and kill(2)
with signal 0 (which also reports a group whose members are all zombies as alive: they are gone
at once, reaped by their new parent).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time

POLL_S = 0.05
RELEASE = "release"


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def end_group(pgid: int, grace: float) -> None:
    """SIGCONT + SIGTERM to the group, SIGKILL after `grace` if any of it is left."""
    for signum in (signal.SIGCONT, signal.SIGTERM):
        try:
            os.killpg(pgid, signum)
        except ProcessLookupError:
            return
    deadline = time.monotonic() + grace
    while group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(POLL_S)
    if group_alive(pgid):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)


def watch(lines: list[str] | None = None, grace: float = 0.0) -> None:
    """Read stdin to its end; end the group it named unless it was released."""
    pgid: int | None = None
    for line in lines if lines is not None else sys.stdin:
        text = line.strip()
        if text == RELEASE:
            return
        if text.isdigit():
            pgid = int(text)
    if pgid is not None and pgid > 1:
        print(
            f"[mlx-fleet] agent run is gone: ending its command (process group {pgid})",
            file=sys.stderr,
            flush=True,
        )
        end_group(pgid, grace)


def main() -> None:
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)  # only agent run's end ends us
    watch(grace=float(sys.argv[1]) if len(sys.argv) > 1 else 0.0)


if __name__ == "__main__":
    main()
