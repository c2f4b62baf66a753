"""Source names -> sources, and how `auto` picks one per OS."""

from __future__ import annotations

import platform
from collections.abc import Callable

from agent.thermal.base import NoneSource, SourceSpecError, SourceUnavailable, ThermalSource
from agent.thermal.iohid import IOHIDSource
from agent.thermal.linux import LinuxSysfsSource
from agent.thermal.process import MacmonSource, PowermetricsSource
from agent.thermal.synthetic import ReplaySource, SimSource, parse_sim_params

KNOWN_SOURCES: tuple[str, ...] = (
    "auto",
    "none",
    "iohid",
    "macmon",
    "powermetrics",
    "linux",
    "sim",
    "replay:PATH",
)


class UnknownSourceError(SourceSpecError):
    """A source name we do not know; the message lists the ones we do."""

    def __init__(self, name: str) -> None:
        super().__init__(f"unknown thermal source {name!r}; known: {', '.join(KNOWN_SOURCES)}")
        self.source_name = name


def auto_order(system: str) -> tuple[str, ...]:
    """What `auto` tries, best first. macOS: in-process and rootless before a helper tool, root
    last; Linux: sysfs. Anything else has no sensor we can read."""
    return {
        "Darwin": ("iohid", "macmon", "powermetrics"),
        "Linux": ("linux",),
    }.get(system, ())


KNOWN_KINDS = frozenset(known.partition(":")[0] for known in KNOWN_SOURCES)


def parse_source_name(name: str) -> tuple[str, str]:
    """A source name as (kind, argument), checked without opening anything, so an installer can
    refuse a name `agent serve` would refuse before a service crash-loops on it.

    Raises UnknownSourceError / SourceSpecError for a bad name or spec.
    """
    kind, sep, argument = name.strip().partition(":")
    kind = kind.lower()
    if kind == "sim":
        parse_sim_params(argument)
    elif kind == "replay":
        if not argument:
            raise SourceSpecError("replay needs a file: replay:PATH")
    elif sep or kind not in KNOWN_KINDS:
        raise UnknownSourceError(name)
    return kind, argument


def open_source(name: str, *, interval_s: float = 1.0) -> ThermalSource:
    """Open a source by name: auto, none, iohid, macmon, powermetrics, linux, sim[:k=v,...],
    replay:PATH. interval_s paces the streaming tools (macmon, powermetrics).

    Raises UnknownSourceError / SourceSpecError for a bad name or spec, SourceUnavailable when the
    source cannot work on this machine.
    """
    kind, argument = parse_source_name(name)
    openers: dict[str, Callable[[], ThermalSource]] = {
        "sim": lambda: SimSource(parse_sim_params(argument)),
        "replay": lambda: ReplaySource(argument),
        "auto": lambda: _open_auto(interval_s),
        "none": NoneSource,
        "iohid": IOHIDSource,
        "macmon": lambda: MacmonSource(interval_s=interval_s),
        "powermetrics": lambda: PowermetricsSource(interval_s=interval_s),
        "linux": LinuxSysfsSource,
    }
    return openers[kind]()


def _open_auto(interval_s: float) -> ThermalSource:
    """The first source in auto_order that opens and gives a reading; `none` with every reason."""
    reasons: list[str] = []
    for candidate in auto_order(platform.system()):
        try:
            source = open_source(candidate, interval_s=interval_s)
        except SourceUnavailable as exc:
            reasons.append(str(exc))
            continue
        if source.read() is not None:
            return source
        reasons.append(source.last_error or f"{candidate}: no reading")
        source.close()
    detail = "; ".join(reasons) or f"no source known for {platform.system()}"
    return NoneSource(f"no thermal sensor found: {detail}")
