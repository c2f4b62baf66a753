"""Where mlx-fleet keeps its data: one directory for results, logs and keys."""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

HOME_ENV = "MLX_FLEET_HOME"


def data_dir(create: bool = True) -> Path:
    """`$MLX_FLEET_HOME` when set, else the platform's user data dir; created on first use,
    private to this user (0700): it holds keys, journals and logs."""
    configured = os.environ.get(HOME_ENV)
    if configured:
        path = Path(configured).expanduser()
    else:
        path = Path(platformdirs.user_data_dir("mlx-fleet"))
    if create:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


def data_subdir(name: str) -> Path:
    path = data_dir() / name
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path
