"""Ending a child process: what the agent's tool streams, its mlx_lm.server and the
coordinator's embedded agent all do when they stop one."""

from __future__ import annotations

import subprocess
from typing import Any


def end_process(proc: subprocess.Popen[Any], grace_s: float = 2.0) -> None:
    """SIGTERM, then SIGKILL after `grace_s`; nothing for a process already gone."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
