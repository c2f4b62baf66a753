"""The kernel panic reports macOS leaves, by name and panic string: what ended a boot that a
run's boot times (agent.awake.boot, shared.benchmark.reboots) say ended.

macOS writes the report of a panic on the boot after it, as `*.panic` in
/Library/Logs/DiagnosticReports (older reports are moved to its Retired/; some versions use
~/Library/Logs/DiagnosticReports). Two layouts, read as osquery's kernel_panics table reads them
(osquery/osquery, osquery/tables/system/darwin/kernel_panics.cpp):

- macOS 10.15 and later: two JSON documents in series, a one-line header
  (`{"bug_type":"210","timestamp":"2026-04-24 10:15:03.00 -0700","os_version":...}`) and a body
  whose `panicString` (Apple Silicon) or `macOSPanicString` (an Intel Mac's, beside its T2's
  `panicString`) holds the old text, its first line `panic(cpu N caller 0x...): ...`;
- before: that text alone, with a ctime line (`Mon Nov 19 22:39:27 2018`, local time) and the
  `panic(cpu ...` line.

Only the first line is kept: it names the fault (`"completeMemory() prepare count underflow"
@IOGPUMemory.cpp:550`, `watchdog timeout: no checkins from watchdogd`); the rest is a backtrace
and, on Apple Silicon, a table of every process, so MAX_READ bytes at most are read. Files are
picked by modification time, as rtrouton/rtrouton_scripts' kernel_panic_detection.sh picks them
by their time on disk (`find /Library/Logs/DiagnosticReports -Btime -7 -name "*.panic"`).
"""

from __future__ import annotations

import json
import re
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from shared.benchmark.reboots import MAX_PANICS, PANIC_FILE_CAP, PANIC_TEXT_CAP

REPORTS = "Library/Logs/DiagnosticReports"
DIRECTORIES = (Path("/") / REPORTS, Path("/") / REPORTS / "Retired", Path.home() / REPORTS)
"""Where a Mac keeps its panic reports: read only on darwin unless directories are given."""
MAX_READ = 1 << 20
"""Bytes of one report read: the panic string comes before the process table, however long
that is."""
RECENT_S = 7 * 86400.0
"""What `agent doctor` and its capture call recent: a week, as kernel_panic_detection.sh."""
BOOT_SLACK_S = 60.0
"""A report written this long before the recorded boot time still counts as this boot's: the
boot time moves with clock corrections (shared.benchmark.reboots.TOLERANCE_S)."""
_PANIC_KEYS = ("macOSPanicString", "panicString")
_STRING = {key: re.compile(rf'"{key}"\s*:\s*("(?:[^"\\]|\\.)*")') for key in _PANIC_KEYS}
"""The panic string's literal, found without parsing the whole body: a report cut at MAX_READ
is not JSON any more, yet its panic string comes early."""
_STAMPS = ("%Y-%m-%d %H:%M:%S.%f %z", "%Y-%m-%d %H:%M:%S %z")
_CTIME = re.compile(r"^(Mon|Tue|Wed|Thu|Fri|Sat|Sun) \w{3} [ \d]\d \d\d:\d\d:\d\d \d{4}$")


def _first_line(text: str) -> str | None:
    """The first line that says something, cut to PANIC_TEXT_CAP characters."""
    for line in text.splitlines():
        if line.strip():
            return line.strip()[:PANIC_TEXT_CAP]
    return None


def _stamp(value: Any) -> float | None:
    """A report's `timestamp` or `date` (`2026-04-24 10:15:03.00 -0700`) -> epoch seconds."""
    if not isinstance(value, str):
        return None
    for layout in _STAMPS:
        try:
            return datetime.strptime(value.strip(), layout).timestamp()
        except ValueError:
            continue
    return None


def _body_string(body: str) -> str | None:
    """The body's panic string: from the JSON, or from its literal when the body was cut."""
    try:
        parsed = json.loads(body)
    except (ValueError, RecursionError):  # cut, or nested past the parser's depth
        parsed = None
    if isinstance(parsed, dict):
        for key in _PANIC_KEYS:
            if isinstance(parsed.get(key), str):
                return parsed[key]
        return None
    for key in _PANIC_KEYS:
        found = _STRING[key].search(body)
        if found:
            try:
                return str(json.loads(found[1]))
            except ValueError:
                continue
    return None


def parse(text: str) -> tuple[str | None, float | None]:
    """A panic report's text -> its panic string's first line and when it happened (epoch
    seconds); None for what the text does not hold."""
    header_text, _, body = text.lstrip().partition("\n")
    try:
        header = json.loads(header_text)
    except (ValueError, RecursionError):
        header = None
    if isinstance(header, dict):  # 10.15 and later: header, then the body
        panic = _body_string(body)
        when = _stamp(header.get("timestamp"))
        if when is None:
            with_date = re.search(r'"date"\s*:\s*"([^"]*)"', body[:4096])
            when = _stamp(with_date[1]) if with_date else None
        return (_first_line(panic) if panic else None), when
    panic = next((line for line in text.splitlines() if line.lstrip().startswith("panic(")), None)
    return (_first_line(panic) if panic else None), _ctime(text)


def _ctime(text: str) -> float | None:
    """The ctime line that heads an old report -> epoch seconds, read as the Mac's local time
    (it is read on that Mac)."""
    for line in text.splitlines()[:20]:
        if _CTIME.match(line.strip()):
            try:
                return time.mktime(time.strptime(line.strip(), "%a %b %d %H:%M:%S %Y"))
            except (ValueError, OverflowError):
                return None
    return None


def read(path: Path) -> tuple[str | None, float | None]:
    """parse() of a report's first MAX_READ bytes; (None, None) when this user may not read
    it: its name alone still says a panic happened."""
    try:
        with path.open("rb") as raw:
            data = raw.read(MAX_READ)
    except OSError:
        return None, None
    return parse(data.decode("utf-8", errors="replace"))


@dataclass(frozen=True)
class Scan:
    """The reports found, and each folder that is there but could not be listed ("PATH: why"):
    with one, "none found" is "cannot tell" (a service account outside the admin group, say:
    osquery's kernel_panics reads the folder only as root, rtrouton's kernel_panic_detection.sh
    runs as root)."""

    reports: list[dict[str, Any]]
    unreadable: list[str]

    def cannot_tell(self) -> str | None:
        """Why "no panics" cannot be said: the folders that could not be read; else None."""
        if not self.unreadable:
            return None
        return "cannot tell: cannot read " + "; ".join(self.unreadable)


def _listed(directory: Path, unreadable: list[str]) -> list[Path]:
    """The folder's entries; none for an absent folder (nothing written there), and none with
    the reason in `unreadable` for one that is there but this user may not list, or no folder."""
    try:
        return list(directory.iterdir())
    except FileNotFoundError:
        return []
    except OSError as exc:
        unreadable.append(f"{directory}: {exc.strerror or exc}")
        return []


def scan(since: float, directories: Sequence[Path] | None = None) -> Scan:
    """The `*.panic` reports modified at or after `since` (epoch seconds), oldest first, the
    newest MAX_PANICS: {file: its name, panic_string: its first line or None, time: when the
    panic happened or None}; and the folders it could not read. `directories`: DIRECTORIES on
    a Mac, none elsewhere."""
    if directories is None:
        directories = DIRECTORIES if sys.platform == "darwin" else ()
    found: list[tuple[float, Path]] = []
    unreadable: list[str] = []
    for directory in directories:
        for path in _listed(directory, unreadable):
            if not path.name.endswith(".panic"):
                continue
            try:
                stat = path.stat()
            except OSError as exc:  # a report whose time this user cannot learn
                unreadable.append(f"{path}: {exc.strerror or exc}")
                continue
            if stat.st_mtime >= since and path.is_file():
                found.append((stat.st_mtime, path))
    found.sort()
    reports = []
    for _, path in found[-MAX_PANICS:]:
        panic, when = read(path)
        reports.append({"file": path.name[:PANIC_FILE_CAP], "panic_string": panic, "time": when})
    return Scan(reports, unreadable)


def since_boot(
    boot: float | None, directories: Sequence[Path] | None = None
) -> list[dict[str, Any]] | None:
    """The reports written since this boot (BOOT_SLACK_S before it): the panic that ended the
    boot before. A list on a Mac, empty when none; elsewhere only when some were found (there is
    nowhere to look by default); None without a boot time to count from, and None ("cannot
    tell") when none was found but a folder could not be read."""
    if boot is None:
        return None
    found = scan(boot - BOOT_SLACK_S, directories)
    if not found.reports and found.unreadable:
        return None
    return found.reports if found.reports or sys.platform == "darwin" else None
