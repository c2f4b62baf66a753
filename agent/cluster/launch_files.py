"""The files mlx.launch writes for a rank (shared.distributed.rank_env's RankLaunch.files), written
where the rank's process will read them: 0600 in a 0700 folder, as they name every peer's
address."""

from __future__ import annotations

import os
from pathlib import Path

from shared.distributed.rank_env import RankLaunch


def write_launch_files(launch: RankLaunch, folder: Path) -> dict[str, str]:
    """The rank's whole environment: its plain variables, and each file variable naming the
    file just written for it."""
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    env = dict(launch.env)
    for variable, content in launch.files.items():
        path = folder / f"{variable.lower()}.json"
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "w", encoding="utf-8") as out:
            out.write(content)
        env[variable] = str(path)
    return env
