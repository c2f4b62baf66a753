"""Log lines that cannot flood: the first of each kind is written at once, the ones that follow
within a window are counted, and one line then says how many there were.

A log flood is a fault of its own (a full disk, a lost needle in a haystack): a peer that sends
thousands of malformed messages, a scanner cycling keys, or a disk that refuses every sample
must each cost a few lines a minute, never one per occurrence.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

WINDOW_S = 60.0
"""After a kind's line, more of that kind are counted for this long, then summed up in one."""


@dataclass
class _Window:
    ends: float
    level: int
    suppressed: int = 0


class LogThrottle:
    """log(kind, ...) writes the first line of a kind and counts the rest for WINDOW_S;
    flush() (called often, e.g. by the daemon's loop) writes the count of each window that
    ended. Thread-safe: the ZAP handler's thread logs through it too."""

    def __init__(
        self,
        logger: logging.Logger,
        window_s: float = WINDOW_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.logger = logger
        self.window_s = window_s
        self.clock = clock
        self.totals: dict[str, int] = {}
        """How many of each kind were seen since the start, logged or not."""
        self._windows: dict[str, _Window] = {}
        self._lock = threading.Lock()

    def log(self, kind: str, level: int, message: str, *args: object) -> None:
        with self._lock:
            self.totals[kind] = self.totals.get(kind, 0) + 1
            now = self.clock()
            window = self._windows.get(kind)
            if window is not None and now < window.ends:
                window.suppressed += 1
                return
            if window is not None:
                self._summarize(kind, window)
            self._windows[kind] = _Window(now + self.window_s, level)
        self.logger.log(level, message, *args)

    def flush(self) -> None:
        """Sum up every window that ended: `N more <kind> in the last 60 s`."""
        if not self._windows:
            return  # the usual case, asked after every request: no lock (a window another
            # thread opens now is summed up by a later flush)
        now = self.clock()
        with self._lock:
            ended = [(k, w) for k, w in self._windows.items() if now >= w.ends]
            for kind, window in ended:
                del self._windows[kind]
                self._summarize(kind, window)

    def _summarize(self, kind: str, window: _Window) -> None:
        if window.suppressed:
            self.logger.log(
                window.level,
                "%d more %s in the last %.0f s (%d since the start)",
                window.suppressed,
                kind,
                self.window_s,
                self.totals[kind],
            )
