"""A clock reading: how fast the GPU and the CPU clusters actually ran over the last interval.

Throttling lowers the clock before any temperature threshold or the thermal pressure level says
so (docs/thermal.md, Clocks), so the clock is the direct throttle signal. On Apple Silicon it
comes from IOReport's performance-state residencies weighted by the pmgr DVFS tables, as
macmon reads it; on Linux from cpufreq; from the thermal plant (simulated) or a capture
(replayed) where those stand in for a Mac. A field this machine cannot read is None, never a
guess."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ClockReading:
    """One interval's clocks. `gpu_hz` is the GPU's frequency averaged over its active
    residency (idle time excluded), `gpu_active` the share of the interval it was active
    (0…1); `cpu_p_hz` / `cpu_e_hz` the performance and efficiency clusters' average active
    frequency. `source` names where they came from; `note` says what they mean where that
    differs by machine (a requested rather than a granted state)."""

    time: float
    gpu_hz: float | None
    gpu_active: float | None
    cpu_p_hz: float | None
    cpu_e_hz: float | None
    source: str
    simulated: bool = False
    note: str | None = None
