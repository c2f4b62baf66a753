"""Where Linux's sysfs is: /sys, or a directory tree standing in for it (tests, captures)."""

from __future__ import annotations

import os
from pathlib import Path

SYSFS_ROOT_ENV = "MLX_FLEET_SYSFS_ROOT"


def sysfs_root() -> Path:
    """`$MLX_FLEET_SYSFS_ROOT` stands in for /sys when set."""
    return Path(os.environ.get(SYSFS_ROOT_ENV) or "/sys")
