"""Reboots during a run, from its cells' `boot_time` (agent.awake.boot): pure.

A machine's boot time is fixed until it reboots, so two cells of one host that recorded
different boot times (more than a clock step apart: Linux's btime moves with NTP corrections)
had a reboot between them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

TOLERANCE_S = 60.0
"""Boot times closer than this are one boot (a wall-clock correction moves a computed one)."""


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
