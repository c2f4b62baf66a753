"""Captures: every raw input of every source, poll by poll, as JSON Lines (docs/thermal.md,
"Captures"), so what a real Mac said is replayed through the same decoders in CI.

The first line is `{"format": "mlx-fleet-capture", "version": 1, "machine": {...}}`; each
later line is one poll: `t` (seconds from the start) and, for each input that was read, its raw
form. A key absent from a poll was not read in it.
"""

from __future__ import annotations

import bisect
import json
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path, PurePosixPath
from typing import Any, TypeGuard

from agent.sensors.smc import SMCError
from shared.cooling.sources import SourceSpecError

CAPTURE_FORMAT = "mlx-fleet-capture"
CAPTURE_VERSION = 1
INPUTS = ("smc", "iohid", "pressure", "ioreport", "ioreport_states", "tools", "sysfs")
"""What a poll may hold: SMC keys {key: [type, hex bytes]}, HID sensors {product: °C}, the
notify pressure state (0-4), IOReport deltas [[group, subgroup, channel, unit, value]], the
clock channels' cumulative residencies [[group, subgroup, channel, [[state, ticks], ...]]]
(agent.clocks: the header then holds the pmgr DVFS tables, `pmgr` {key: hex}, and `chip`), tool
lines {"macmon": [...], "powermetrics": [...]}, Linux files {path under /sys: text}."""


class CaptureFormatError(SourceSpecError):
    """A capture that cannot be replayed; the message names the file and the line."""


Poll = dict[str, Any]


@dataclass(frozen=True)
class Capture:
    path: str
    machine: dict[str, Any]
    polls: list[Poll]

    def has(self, name: str) -> bool:
        """Whether any poll holds input `name` (`smc`, `iohid`, ...)."""
        return any(name in poll for poll in self.polls)

    def has_tool(self, tool: str) -> bool:
        """Whether any poll holds a line of `tool` (`macmon`, `powermetrics`)."""
        return any(poll.get("tools", {}).get(tool) for poll in self.polls)


def header_line(machine: Mapping[str, Any]) -> str:
    return json.dumps({"format": CAPTURE_FORMAT, "version": CAPTURE_VERSION, "machine": machine})


def poll_line(poll: Mapping[str, Any]) -> str:
    return json.dumps(poll, separators=(",", ":"))


def parse_capture(text: str, origin: str) -> Capture:
    """A capture's header and polls, each poll checked; CaptureFormatError naming the line."""
    lines = [(number, line) for number, line in enumerate(text.splitlines(), 1) if line.strip()]
    if not lines:
        raise CaptureFormatError(f"{origin}: empty, not an {CAPTURE_FORMAT} file")
    number, first = lines[0]
    head = _object(first, f"{origin}:{number}")
    if head.get("format") != CAPTURE_FORMAT:
        raise CaptureFormatError(f"{origin}:{number}: not an {CAPTURE_FORMAT} file")
    version = head.get("version")
    if isinstance(version, bool) or version != CAPTURE_VERSION:
        raise CaptureFormatError(
            f"{origin}:{number}: {CAPTURE_FORMAT} version {version!r}; "
            f"this agent reads version {CAPTURE_VERSION}"
        )
    machine = head.get("machine")
    if not isinstance(machine, dict):
        raise CaptureFormatError(f"{origin}:{number}: `machine` must be an object")
    polls: list[Poll] = []
    for number, line in lines[1:]:
        where = f"{origin}:{number}"
        poll = _object(line, where)
        try:
            check_poll(poll, polls[-1]["t"] if polls else None)
        except ValueError as exc:
            raise CaptureFormatError(f"{where}: {exc}") from None
        polls.append(poll)
    if not polls:
        raise CaptureFormatError(f"{origin}: a header and no poll")
    return Capture(origin, machine, polls)


def _object(line: str, where: str) -> dict[str, Any]:
    try:
        value = json.loads(line)
    except (ValueError, RecursionError) as exc:
        raise CaptureFormatError(f"{where}: not JSON ({exc})") from None
    if not isinstance(value, dict):
        raise CaptureFormatError(f"{where}: a line must be a JSON object")
    return value


def check_poll(poll: Mapping[str, Any], previous_t: float | None) -> None:
    """ValueError naming what is wrong with one poll: every input of the type and range the
    format says, so no decoder meets a value it cannot take."""
    t = poll.get("t")
    if not _finite(t) or t < 0:
        raise ValueError(f"`t` must be a number of seconds >= 0, got {t!r}")
    if previous_t is not None and t < previous_t:
        raise ValueError(f"`t` must not go back ({t} after {previous_t})")
    unknown = sorted(map(str, set(poll) - {"t", *INPUTS}))
    if unknown:
        raise ValueError(f"unknown inputs {', '.join(map(repr, unknown))}")
    for name in ("smc", "iohid", "tools", "sysfs"):
        if not isinstance(poll.get(name, {}), dict):
            raise ValueError(f"`{name}` must be an object")
    for name in ("ioreport", "ioreport_states"):
        if not isinstance(poll.get(name, []), list):
            raise ValueError(f"`{name}` must be a list of rows")
    for row in poll.get("ioreport_states", []):
        if not _state_row(row):
            raise ValueError(
                "ioreport_states: expected [group, subgroup or null, channel, [[state, a count "
                f">= 0], ...]], got {row!r}"
            )
    for key, entry in poll.get("smc", {}).items():
        if not (
            isinstance(entry, list)
            and len(entry) == 2
            and isinstance(entry[0], str)
            and len(entry[0]) == 4
            and _is_hex(entry[1])
        ):
            raise ValueError(f"smc {key!r}: expected [4-character type, hex bytes], got {entry!r}")
    for name, celsius in poll.get("iohid", {}).items():
        if not _finite(celsius):
            raise ValueError(f"iohid {name!r}: expected a finite °C, got {celsius!r}")
    pressure = poll.get("pressure")
    if pressure is not None and not (
        isinstance(pressure, int) and not isinstance(pressure, bool) and 0 <= pressure <= 4
    ):
        raise ValueError(f"pressure must be the notify state, 0 to 4, got {pressure!r}")
    for tool, lines in poll.get("tools", {}).items():
        if not (isinstance(lines, list) and all(isinstance(line, str) for line in lines)):
            raise ValueError(f"tools {tool!r}: expected a list of lines")
    for path, text in poll.get("sysfs", {}).items():
        if not isinstance(text, str):
            raise ValueError(f"sysfs {path!r}: expected the file's text")
    for row in poll.get("ioreport", []):
        if not (
            isinstance(row, list)
            and len(row) == 5
            and all(isinstance(part, str) for part in (row[0], row[2], row[3]))
            and (row[1] is None or isinstance(row[1], str))
            and isinstance(row[4], int)
            and not isinstance(row[4], bool)
            and row[4] >= 0
        ):
            raise ValueError(
                "ioreport: expected [group, subgroup or null, channel, unit, a count >= 0], "
                f"got {row!r}"
            )


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _state_row(row: object) -> bool:
    """[group, subgroup or null, channel, [[state, ticks >= 0], ...]] (a clock channel)."""
    return (
        isinstance(row, list)
        and len(row) == 4
        and isinstance(row[0], str)
        and (row[1] is None or isinstance(row[1], str))
        and isinstance(row[2], str)
        and isinstance(row[3], list)
        and all(
            isinstance(state, list)
            and len(state) == 2
            and isinstance(state[0], str)
            and _count(state[1])
            for state in row[3]
        )
    )


def _finite(value: object) -> TypeGuard[float]:
    """A JSON number a float holds (an integer of 400 digits does not)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def _is_hex(text: object) -> bool:
    if not isinstance(text, str) or len(text) % 2:
        return False
    try:
        bytes.fromhex(text)
    except ValueError:
        return False
    return True


def read_capture(path: str | Path) -> Capture:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise CaptureFormatError(f"{path}: cannot read the capture: {exc.strerror}") from exc
    except UnicodeDecodeError:
        raise CaptureFormatError(f"{path}: not text, not an {CAPTURE_FORMAT} file") from None
    return parse_capture(text, str(path))


TOOL_INTERVAL_S = 1.0
"""A tool's sample interval in a capture whose header does not say (`tools_interval_s`):
macmon's own default, -i 1000."""


def tool_interval_s(capture: Capture) -> float:
    interval = capture.machine.get("tools_interval_s")
    return float(interval) if _finite(interval) and interval > 0 else TOOL_INTERVAL_S


class CapturePlayer:
    """A capture at its own pace from the moment it is made: `poll()` is the one in force (each
    holds until the next, the last for ever)."""

    def __init__(self, capture: Capture, clock: Callable[[], float] = time.monotonic) -> None:
        """`clock` paces it (seconds); a test steps it poll by poll."""
        self.capture = capture
        self._clock = clock
        self._times = [poll["t"] for poll in capture.polls]
        self._started = clock()

    def index(self) -> int:
        """The number of the poll in force."""
        elapsed = self._clock() - self._started
        return max(0, bisect.bisect_right(self._times, elapsed) - 1)

    def poll(self) -> Poll:
        return self.capture.polls[self.index()]

    def since(self, seen: int) -> tuple[list[Poll], int]:
        """The polls after number `seen` up to the one in force, and its number: what a
        counting reader has not counted yet (none when the capture has not moved on)."""
        now = self.index()
        return self.capture.polls[seen + 1 : now + 1], now


class CapturedSMC:
    """The SMC as a capture saw it: the keys any poll read, each read the poll's bytes."""

    def __init__(self, player: CapturePlayer) -> None:
        self._player = player
        self._keys = sorted({key for poll in player.capture.polls for key in poll.get("smc", {})})

    def keys(self) -> list[str]:
        return list(self._keys)

    def read(self, key: str) -> tuple[str, bytes]:
        entry = self._player.poll().get("smc", {}).get(key)
        if entry is None:
            raise SMCError(f"{key} was not read in this poll of the capture")
        return entry[0], bytes.fromhex(entry[1])

    def close(self) -> None:
        """Nothing to release: the capture is in memory."""


class CapturedSysfs:
    """Linux's files as one poll of a capture saw them (a SysfsView): a path the poll does not
    hold was not read, and reads as missing."""

    root = PurePosixPath("/sys")

    def __init__(self, player: CapturePlayer) -> None:
        self._player = player

    def files(self) -> dict[str, str]:
        return dict(self._player.poll().get("sysfs", {}))

    def glob(self, pattern: str) -> list[str]:
        wanted = pattern.split("/")
        found = set()
        for path in self.files():
            parts = path.split("/")
            for depth in range(1, len(parts) + 1):
                head = parts[:depth]
                if len(head) == len(wanted) and all(map(fnmatchcase, head, wanted)):
                    found.add("/".join(head))
        return sorted(found)

    def read(self, path: str) -> str:
        text = self.files().get(path)
        if text is None:
            raise FileNotFoundError(f"{path} was not read in this poll of the capture")
        return text
