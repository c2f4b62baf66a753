"""The per-Mac side of mlx-fleet: local MLX benchmarks, thermal sensing and cooling.

`RemoteMonitor` (for cooperative training loops: `CoolingScheduler(RemoteMonitor())`) reads the
local agent daemon's monitor, or this machine's sensor when no daemon runs.
"""

from agent.remote import RemoteMonitor

__all__ = ["RemoteMonitor"]
