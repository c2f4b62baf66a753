"""The per-Mac side of mlx-fleet: local MLX benchmarks, thermal sensing and cooling.

`RemoteMonitor` (for cooperative training loops: `CoolingScheduler(RemoteMonitor())`) reads the
local agent daemon's monitor, or this machine's sensor when no daemon runs. It is imported on
first use, so that `agent --help` and every command not using it start without its imports.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agent.cooling.remote import RemoteMonitor

__all__ = ["RemoteMonitor"]


def __getattr__(name: str) -> Any:
    if name == "RemoteMonitor":
        from agent.cooling.remote import RemoteMonitor

        return RemoteMonitor
    raise AttributeError(f"module 'agent' has no attribute {name!r}")
