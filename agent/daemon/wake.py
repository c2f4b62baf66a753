"""A wake-up pipe: how another thread, or a signal handler, wakes the daemon's loop out of its
poll. Its own class because the loop is woken two ways alike: by the monitor's thread with a
reading (agent.daemon.handoff) and by stop() (agent.daemon.loop)."""

from __future__ import annotations

import os


class WakePipe:
    """Poll `fd` readable; wake() from anywhere, take() on the loop's thread."""

    def __init__(self) -> None:
        self.fd, self._write = os.pipe()
        os.set_blocking(self._write, False)

    def wake(self) -> None:
        """Safe from any thread and from a signal handler; a full pipe is a wake-up pending."""
        try:  # noqa: SIM105 - contextlib.suppress is three Python calls more, every poll
            os.write(self._write, b"w")
        except BlockingIOError:
            pass  # a wake-up is pending already

    def take(self) -> None:
        """The loop polled `fd` readable: take the wake-ups."""
        os.read(self.fd, 4096)

    def close(self) -> None:
        os.close(self.fd)
        os.close(self._write)
