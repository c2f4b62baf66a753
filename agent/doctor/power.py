"""`agent doctor`'s power rows: every power source this OS may have, side by side with what it
reads over a short interval (so IOReport's rails, the SMC's PSTR and macmon can be compared on
this very Mac), and what `auto` picks. None is required: a benchmark without a meter says N/A."""

from __future__ import annotations

import platform
import time

from shared.benchmark.energy import SYSTEM
from shared.cooling.sources import power_auto_order

POWER_READ_S = 0.5
"""The shortest window between a source's two reads: watts need an interval (a counter's first
read has none)."""
RESOLUTIONS_READ = 2
"""A window holds this many of the source's update intervals: IOReport publishes its energy
counters every ~2.3 s (agent/power/ioreport.py), so half a second often held no update at all
(issue 42) and one interval may hold one update or two."""
MOST_POWER_READ_S = 10.0
"""However slow a source says it is, doctor waits no longer than this on it."""


def read_window(resolution_s: float, least: float = POWER_READ_S) -> float:
    """How long doctor reads a source whose updates are `resolution_s` apart."""
    return min(MOST_POWER_READ_S, max(least, RESOLUTIONS_READ * resolution_s))


def power_checks(interval_s: float = POWER_READ_S) -> list[tuple[str, bool, str]]:
    """(name, ok, what it read or why not) per source, then `auto`."""
    from agent.power.registry import open_power_source
    from agent.sensors.base import SourceUnavailable

    rows = []
    for name in (*power_auto_order(platform.system()), "auto"):
        try:
            with open_power_source(name, interval_s=interval_s) as source:
                window = read_window(source.resolution_s, interval_s)
                source.read()
                time.sleep(window)
                reading = source.read()
                reason, picked = source.last_error, source.name
                resolution, simulated = source.resolution_s, source.simulated
        except SourceUnavailable as exc:
            rows.append((f"power: {name}", False, str(exc).split("; this machine")[0]))
            continue
        if reading is None or reading.total_w is None:
            rows.append((f"power: {name}", False, f"no reading: {reason}"))
            continue
        parts = ", ".join(f"{rail} {watts:.2f}" for rail, watts in sorted(reading.watts.items()))
        whole = "the system rail" if SYSTEM in reading.watts else "the rails' sum"
        detail = (
            f"{reading.total_w:.2f} W over {window:g} s ({parts}; total is {whole}), resolution "
            f"{resolution:g} s"
        )
        if simulated:
            detail += ", SIMULATED: not a meter"
        if name == "auto":
            detail += f" -> {picked}"
        rows.append((f"power: {name}", True, detail))
    return rows
