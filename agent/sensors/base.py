"""What every source of readings shares, thermal or power: the Source protocol (a hiccup is a
None reading with a reason, never an exception), `auto`'s first working candidate, the retry
backoff, and the label every sample carries."""

from __future__ import annotations

import platform
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from typing_extensions import Self


@dataclass(frozen=True)
class SourceInfo:
    """Who took the readings: labels every sample and event."""

    name: str
    simulated: bool


class SourceUnavailable(RuntimeError):
    """A source cannot work on this machine (wrong OS, tool missing, no sensors)."""


class ClosedOnExit:
    """`with` hands the object itself and closes it on the way out, whatever ended the block:
    the one __enter__/__exit__ for a source and for the monitor that polls one."""

    def close(self) -> None:
        """What closing it does: each class says."""
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Source(ClosedOnExit, ABC):
    """Something read in a loop that must never take the loop down: a thermal source, a power
    meter. A hiccup is a None reading with the reason in `last_error`, never an exception."""

    name: str = "source"
    simulated: bool = False

    def __init__(self) -> None:
        self.last_error: str | None = None

    @abstractmethod
    def read(self) -> Any:
        """The current reading, or None (see `last_error`)."""

    def close(self) -> None:  # noqa: B027 - a hook: most sources hold nothing to release
        """Release processes and handles; safe to call twice."""

    def _fail(self, reason: str) -> None:
        """Record why there is no reading; returns None so `return self._fail(...)` reads well."""
        self.last_error = reason


class NoSource(Source):
    """No source of its kind (mixed in before the kind): every read is None, with the reason
    nothing else worked in `last_error`."""

    name = "none"

    def __init__(self, reason: str) -> None:
        super().__init__()
        self.last_error = reason

    def read(self) -> None:
        return None


S = TypeVar("S", bound=Source)


def auto_pick(
    candidates: Iterable[str], open_one: Callable[[str], S], none: Callable[[str], S], what: str
) -> S:
    """The first candidate that opens and gives a reading (what `auto` picks); when none does,
    `none` of every reason (`no WHAT found: ...`)."""
    reasons: list[str] = []
    for candidate in candidates:
        try:
            source = open_one(candidate)
        except SourceUnavailable as exc:
            reasons.append(str(exc))
            continue
        if source.read() is not None:
            return source
        reasons.append(source.last_error or f"{candidate}: no reading")
        source.close()
    detail = "; ".join(reasons) or f"no {what} known for {platform.system()}"
    return none(f"no {what} found: {detail}")


class Backoff:
    """Exponential delays for retrying something that keeps failing; reset after a success."""

    def __init__(self, initial: float = 0.5, maximum: float = 30.0, factor: float = 2.0) -> None:
        self.initial = initial
        self.maximum = maximum
        self.factor = factor
        self._next = initial

    def next_delay(self) -> float:
        delay = self._next
        self._next = min(self._next * self.factor, self.maximum)
        return delay

    def reset(self) -> None:
        self._next = self.initial
