"""Where Linux's sysfs is: /sys, or a directory tree standing in for it (tests), or the files a
capture holds (agent.sensors.capture): a source reads it through a SysfsView, paths relative to
its root."""

from __future__ import annotations

import os
from pathlib import Path, PurePath
from typing import Protocol

SYSFS_ROOT_ENV = "MLX_FLEET_SYSFS_ROOT"


def sysfs_root() -> Path:
    """`$MLX_FLEET_SYSFS_ROOT` stands in for /sys when set."""
    return Path(os.environ.get(SYSFS_ROOT_ENV) or "/sys")


class SysfsView(Protocol):
    @property
    def root(self) -> PurePath: ...

    def glob(self, pattern: str) -> list[str]:
        """The paths matching `pattern`, relative to the root, sorted."""
        ...

    def read(self, path: str) -> str:
        """A file's text; OSError (PermissionError for a root-only file) as the file gives."""
        ...


class LiveSysfs:
    """The files of this machine (or of a tree standing in for /sys)."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = root or sysfs_root()

    def glob(self, pattern: str) -> list[str]:
        return sorted(path.relative_to(self.root).as_posix() for path in self.root.glob(pattern))

    def read(self, path: str) -> str:
        return (self.root / path).read_text()
