"""The cooling policy applied: CoolingScheduler for cooperative loops, the guard of benchmark
cells, `agent run`'s supervisor, guardian and events, and the local daemon's client side
(RemoteMonitor, the session and `agent run`'s feed)."""

from agent.cooling.scheduler import CoolingScheduler, ThermalShutdownError

__all__ = ["CoolingScheduler", "ThermalShutdownError"]
