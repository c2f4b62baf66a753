"""Reboots during a run, from its cells' `boot_time` (agent.awake.boot), and the kernel panic
reports a Mac's cells carry (`panics`, agent.awake.panics): pure.

A machine's boot time is fixed until it reboots, so two cells of one host that recorded
different boot times (more than a clock step apart: Linux's btime moves with NTP corrections)
had a reboot between them. macOS writes the report of a panic on the boot after it, so the
reports that the cells after a reboot carry and the cells before it did not are that reboot's.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

TOLERANCE_S = 60.0
"""Boot times closer than this are one boot (a wall-clock correction moves a computed one)."""
MAX_PANICS = 16
"""Panic reports one record carries: the newest, a Mac that panics more often says so anyway."""
PANIC_FILE_CAP = 255
"""Characters of a report's file name (a macOS file name's limit)."""
PANIC_TEXT_CAP = 200
"""Characters of a panic string's first line kept: it names the fault, the rest is a trace."""


def rebooted_hosts(records: Iterable[Mapping[str, Any]]) -> list[str]:
    """The hosts (sorted; "" for records without one) whose cells recorded boot times that
    differ."""
    times: dict[str, list[float]] = {}
    for record in records:
        boot = record.get("boot_time")
        if isinstance(boot, (int, float)) and not isinstance(boot, bool):
            times.setdefault(str(record.get("host") or ""), []).append(float(boot))
    return sorted(h for h, t in times.items() if max(t) - min(t) > TOLERANCE_S)


def rebooted(records: Iterable[Mapping[str, Any]]) -> bool:
    """Whether any host rebooted between the cells of these records."""
    return bool(rebooted_hosts(records))


def reboot_panics(
    records: Iterable[Mapping[str, Any]], host: str
) -> list[Mapping[str, Any]] | None:
    """The panic reports `host`'s cells after its first boot carry and the cells of that boot
    did not, each once, in order; None when none of those later cells looked (`panics` absent:
    not a Mac, or an older agent)."""
    boots = [
        (float(r["boot_time"]), r)
        for r in records
        if str(r.get("host") or "") == host
        and isinstance(r.get("boot_time"), (int, float))
        and not isinstance(r.get("boot_time"), bool)
    ]
    if not boots:
        return None
    first = min(boot for boot, _ in boots)
    seen = {
        str(panic.get("file"))
        for boot, record in boots
        if boot - first <= TOLERANCE_S
        for panic in _panics(record) or ()
    }
    found: list[Mapping[str, Any]] | None = None
    for boot, record in boots:
        panics = _panics(record)
        if boot - first <= TOLERANCE_S or panics is None:
            continue
        found = found if found is not None else []
        for panic in panics:
            if str(panic.get("file")) not in seen:
                seen.add(str(panic.get("file")))
                found.append(panic)
    return found


def _panics(record: Mapping[str, Any]) -> list[Mapping[str, Any]] | None:
    value = record.get("panics")
    if not isinstance(value, list):
        return None
    return [panic for panic in value if isinstance(panic, Mapping)]
