"""Replies that take seconds (the `doctor` report): computed on one worker thread, sent by the
daemon's loop when ready, so the loop keeps answering pings and feeding the job meanwhile (the
sockets belong to the loop's thread alone)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Pending:
    identity: bytes
    re: str
    type: str
    future: Future[dict[str, Any]]


class DeferredReplies:
    """submit() work for a reply; finished() hands back, once, every reply whose work is done."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="deferred-reply")
        self._pending: list[Pending] = []

    def submit(
        self, identity: bytes, re: str, type_: str, work: Callable[[], dict[str, Any]]
    ) -> None:
        self._pending.append(Pending(identity, re, type_, self._pool.submit(work)))

    @property
    def waiting(self) -> bool:
        """Whether a reply is still to be sent: the daemon's loop then wakes at every poll
        to look (serve.py), as nothing else would wake it when the work is done."""
        return bool(self._pending)

    def finished(self) -> Iterator[Pending]:
        if not self._pending:
            return  # the daemon asks after every request
        done: list[Pending] = []
        waiting: list[Pending] = []
        for pending in self._pending:  # done() asked once: one finishing now is in one list
            (done if pending.future.done() else waiting).append(pending)
        self._pending = waiting
        yield from done

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
