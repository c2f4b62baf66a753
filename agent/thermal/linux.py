"""Linux nodes: thermal zones and hwmon under /sys (or a fake tree for tests)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from agent.sensors.base import SourceUnavailable
from agent.sensors.sysfs import sysfs_root
from agent.thermal.base import ThermalReading, ThermalSource
from agent.thermal.parsers import linux_soc_celsius, parse_sysfs

_PATTERNS = (
    "class/thermal/thermal_zone*/type",
    "class/thermal/thermal_zone*/temp",
    "class/hwmon/hwmon*/name",
    "class/hwmon/hwmon*/temp*_input",
    "class/hwmon/hwmon*/temp*_label",
)


def collect_sysfs(root: Path) -> dict[str, str]:
    """The temperature-related files under root, by path relative to it."""
    files: dict[str, str] = {}
    for pattern in _PATTERNS:
        for path in root.glob(pattern):
            try:
                files[path.relative_to(root).as_posix()] = path.read_text()
            except OSError:
                continue  # some zones refuse reads (EIO) while the others work
    return files


class LinuxSysfsSource(ThermalSource):
    """The hottest CPU/SoC sensor under /sys; every sensor found is kept in the reading."""

    name = scale = "linux"

    def __init__(
        self, root: Path | None = None, files: Callable[[], dict[str, str]] | None = None
    ) -> None:
        """`files` lists the sysfs files by path (a capture's); else they are read under root."""
        super().__init__()
        self.root = root or sysfs_root()
        self._files = files or (lambda: collect_sysfs(self.root))
        if not parse_sysfs(self._files()):
            raise SourceUnavailable(f"linux: no thermal zone or hwmon reading under {self.root}")

    def read(self) -> ThermalReading | None:
        sensors = parse_sysfs(self._files())
        if not sensors:
            return self._fail(f"linux: no readable temperature under {self.root}")
        return self._reading(linux_soc_celsius(sensors), sensors)
