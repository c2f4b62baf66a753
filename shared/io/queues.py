"""Taking what a thread has handed over: every item a queue holds now, without waiting (the
agent's staging answers and polls, a tool's lines in a capture, the coordinator's link reports)."""

from __future__ import annotations

import queue
from typing import TypeVar

T = TypeVar("T")


def drained(source: queue.Queue[T] | queue.SimpleQueue[T]) -> list[T]:
    """Every item in `source` now, oldest first; what is put meanwhile may come too (a queue
    with one reader: nothing else takes from it)."""
    taken = []
    while True:
        try:
            taken.append(source.get_nowait())
        except queue.Empty:
            return taken
