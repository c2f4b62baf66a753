"""The daemon's writes, watched: which of its files it could not write, since when and why.

A full disk, a read-only remount or a permission changed under it must not stop the agent: it
keeps serving, monitoring and enforcing; what it could not write stays in memory and is written
again when the disk takes it (each store retries on its own). This is where the failures are
told: logged once per kind (agent.daemon.throttle), in `info.ok`'s `storage`, in every sample's
`storage_error` (and so in Prometheus), and a line when writes resume.

Only the daemon's main thread uses it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agent.daemon.throttle import LogThrottle

log = logging.getLogger("agent.storage")

HISTORY = "history"
EVENTS = "events"
JOURNAL = "journal"
POLICY = "policy"
STATE = "state file"
JOB_LOGS = "job logs"


@dataclass
class Failing:
    """One kind of write that fails now."""

    what: str
    path: str
    error: str
    since: float
    failures: int = 1

    def to_wire(self) -> dict[str, Any]:
        return {
            "what": self.what,
            "path": self.path,
            "error": self.error,
            "since": self.since,
            "failures": self.failures,
        }


def describe(exc: BaseException) -> str:
    """An OSError's or sqlite3 error's text, without the class name a user does not need."""
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__


class StorageHealth:
    """failed() and written() from every store; `error` for the samples, report() for info."""

    def __init__(self, throttle: LogThrottle, clock: Callable[[], float] = time.time) -> None:
        self.throttle = throttle
        self.clock = clock
        self.failing: dict[str, Failing] = {}

    def failed(self, what: str, path: object, exc: BaseException) -> None:
        """A write of `what` (to `path`) failed with `exc`: it will be retried."""
        error = describe(exc)
        known = self.failing.get(what)
        if known is None or known.error != error:
            self.failing[what] = Failing(what, str(path), error, self.clock())
        else:
            known.failures += 1
        self.throttle.log(
            f"failed writes ({what}: {error})",
            logging.ERROR,
            "cannot write the %s (%s): %s; kept in memory and retried, the agent goes on",
            what,
            path,
            error,
        )

    def written(self, what: str) -> None:
        """A write of `what` succeeded: whatever failed before is written now."""
        known = self.failing.pop(what, None)
        if known is not None:
            log.warning(
                "writing the %s works again after %d failed attempt(s) since %s",
                what,
                known.failures,
                time.strftime("%H:%M:%S", time.localtime(known.since)),
            )

    @property
    def error(self) -> str | None:
        """A sample's `storage_error`: every failing kind in one line, None when all is well."""
        if not self.failing:
            return None
        return "; ".join(f"{f.what}: {f.error} ({f.path})" for f in self.failing.values())

    def report(self) -> dict[str, Any]:
        """info.ok's `storage`."""
        return {"ok": not self.failing, "failing": [f.to_wire() for f in self.failing.values()]}
