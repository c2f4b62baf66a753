"""RAPL energy counters on Linux through powercap: /sys/class/powercap/intel-rapl:* (AMD's RAPL
is there under the same name), or a fake tree for tests ($MLX_FLEET_SYSFS_ROOT).

Each zone has `name` (package-N, core, uncore, dram, psys), `energy_uj` (a counter that wraps back
to 0 at `max_energy_range_uj`) and the latter (Documentation/power/powercap/powercap.rst). Since
Linux 5.10 `energy_uj` is readable by root only (CVE-2020-8694, Platypus).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from agent.power.base import Integrator, PowerReading, PowerSource
from agent.power.decode import counter_delta, rapl_rail
from agent.sensors.base import SourceUnavailable
from agent.sensors.sysfs import LiveSysfs, SysfsView

RESOLUTION_S = 0.001
"""RAPL's counters are updated about every millisecond (Intel SDM vol. 3B, 15.10.1)."""


@dataclass
class Zone:
    path: str
    rail: str
    wraps_at: int
    last: int


POWERCAP_FILES = ("name", "energy_uj", "max_energy_range_uj")
ZONE_PATTERNS = ("class/powercap/intel-rapl:*", "class/powercap/intel-rapl:*:*")


def zone_dirs(sysfs: SysfsView) -> list[str]:
    return sorted({path for pattern in ZONE_PATTERNS for path in sysfs.glob(pattern)})


def find_zones(sysfs: SysfsView) -> list[Zone]:
    """Every zone whose rail counts (packages, dram, psys), with its counter read once; raises
    SourceUnavailable naming what is missing or unreadable."""
    zones: list[Zone] = []
    refused: list[str] = []
    for directory in zone_dirs(sysfs):
        try:
            rail = rapl_rail(sysfs.read(f"{directory}/name"))
        except OSError:
            continue
        if rail is None:
            continue
        try:
            wraps_at = int(sysfs.read(f"{directory}/max_energy_range_uj"))
            last = int(sysfs.read(f"{directory}/energy_uj"))
        except PermissionError:
            refused.append(str(sysfs.root / directory / "energy_uj"))
            continue
        except (OSError, ValueError):
            continue
        zones.append(Zone(directory, rail, wraps_at, last))
    if not zones and refused:
        raise SourceUnavailable(
            f"rapl: {refused[0]} is readable by root only (Linux >= 5.10, CVE-2020-8694): run "
            "the agent as root, or grant read access to energy_uj"
        )
    if not zones:
        raise SourceUnavailable(
            f"rapl: no powercap RAPL zone under {sysfs.root / 'class/powercap'}"
        )
    return zones


class RaplSource(PowerSource):
    """Cumulative joules per rail from RAPL's counters, wraparound included; several packages
    add up into `cpu`."""

    name = "rapl"
    resolution_s = RESOLUTION_S

    def __init__(self, root: Path | None = None, sysfs: SysfsView | None = None) -> None:
        """`sysfs`: the files to read (a capture's); else those under root (/sys by default)."""
        super().__init__()
        self._sysfs = sysfs or LiveSysfs(root)
        self.root = self._sysfs.root
        self._zones = find_zones(self._sysfs)
        self.rails = tuple(sorted({zone.rail for zone in self._zones}))
        self._energy = Integrator()
        self._last = time.monotonic()

    def read(self) -> PowerReading | None:
        values = []
        for zone in self._zones:
            try:
                values.append(int(self._sysfs.read(f"{zone.path}/energy_uj")))
            except (OSError, ValueError) as exc:
                where = self.root / zone.path / "energy_uj"
                return self._fail(f"rapl: cannot read {where}: {exc}")
        now_s = time.monotonic()
        counted: dict[str, float] = {}
        for zone, now in zip(self._zones, values, strict=True):
            added = counter_delta(zone.last, now, zone.wraps_at)
            zone.last = now
            counted[zone.rail] = counted.get(zone.rail, 0.0) + added / 1e6
        self._energy.add(counted, now_s - self._last)
        self._last = now_s
        return self._reading(self._energy.joules, self._energy.watts, at=now_s)
