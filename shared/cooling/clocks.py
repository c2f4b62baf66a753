"""A clock reading: how fast the GPU and the CPU clusters actually ran over the last interval.

Throttling lowers the clock before any temperature threshold or the thermal pressure level says
so (docs/thermal.md, Clocks), so the clock is the direct throttle signal. On Apple Silicon it
comes from IOReport's performance-state residencies weighted by the pmgr DVFS tables, as
macmon reads it; on Linux from cpufreq; from the thermal plant (simulated) or a capture
(replayed) where those stand in for a Mac. A field this machine cannot read is None, never a
guess."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

MAX_CLOCK_HZ = 10e9
"""No Apple Silicon or workstation clock comes near 10 GHz (the fastest DVFS entry published is
4.6 GHz, an M5 Max's P cluster: oshi/oshi#3673): a decoded frequency above it is a decoding fault,
and a peer's is refused (shared.wire.agent_shapes)."""


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


def implausible(reading: ClockReading) -> str | None:
    """What in a reading no machine gives (a frequency not finite, below 0 or past
    MAX_CLOCK_HZ, an active share outside 0…1), or None: a peer refuses such a sample whole."""
    for name in ("gpu_hz", "cpu_p_hz", "cpu_e_hz"):
        value = getattr(reading, name)
        if value is not None and not (math.isfinite(value) and 0.0 <= value <= MAX_CLOCK_HZ):
            return f"{name} {value!r} is no clock"
    active = reading.gpu_active
    if active is not None and not (math.isfinite(active) and 0.0 <= active <= 1.0):
        return f"gpu_active {active!r} is not a share of 0 to 1"
    return None


def sample_fields(
    reading: ClockReading | None, source: str, simulated: bool, error: str | None
) -> dict[str, Any]:
    """A telemetry sample's clock fields (shared.wire.telemetry.CLOCK_COLUMNS) from a clock
    source's reading, or from its name and why it has none (a reading with an implausible
    figure is none: it would cost the whole sample at the coordinator)."""
    if reading is not None and (wrong := implausible(reading)) is not None:
        reading, error = None, f"unavailable: {source}: {wrong}"
    return {
        "gpu_hz": reading.gpu_hz if reading else None,
        "gpu_active": reading.gpu_active if reading else None,
        "cpu_p_hz": reading.cpu_p_hz if reading else None,
        "cpu_e_hz": reading.cpu_e_hz if reading else None,
        "clock_source": reading.source if reading else source,
        "clock_simulated": reading.simulated if reading else simulated,
        "clock_note": reading.note if reading else error,
    }


REPLAYED_SOURCE = "capture"
"""A capture's clocks: a real Mac's, replayed."""


def clock_label(source: str | None, simulated: bool | None) -> str:
    """How clocks must be labelled wherever shown: `simulated` (a model's), `replayed` (a
    capture's), or nothing for a machine's own."""
    if simulated:
        return "simulated"
    return "replayed" if source == REPLAYED_SOURCE else ""


def ghz(hz: float | None) -> str:
    return "—" if hz is None else f"{hz / 1e9:.2f}"


def clock_summary(sample: Mapping[str, Any]) -> str:
    """One line of a sample's clocks (its gpu_hz ... clock_note fields, any missing as nil):
    `GPU 1.10 GHz 84 % · P 3.20 · E 2.06 GHz`, `GPU idle` when the GPU ran no clock, its
    label in parentheses, or `clocks unavailable: <why>`."""
    figures = [sample.get(key) for key in ("gpu_hz", "gpu_active", "cpu_p_hz", "cpu_e_hz")]
    if all(value is None for value in figures):
        why = sample.get("clock_note") or "no clock source"
        return why if why.startswith("unavailable") else f"unavailable: {why}"
    gpu_hz, gpu_active, p_hz, e_hz = figures
    if gpu_active is not None and gpu_hz is None:
        gpu = "GPU idle"
    elif gpu_hz is not None:
        share = "" if gpu_active is None else f" {gpu_active * 100:.0f} %"
        gpu = f"GPU {ghz(gpu_hz)} GHz{share}"
    else:
        gpu = "GPU —"
    label = clock_label(sample.get("clock_source"), sample.get("clock_simulated"))
    text = f"{gpu} · P {ghz(p_hz)} · E {ghz(e_hz)} GHz"
    return f"{text} ({label})" if label else text
