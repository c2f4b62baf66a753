"""Energy per cell as data: rails, windows and what a cell reports from them. Pure, so the agent
(which reads the meter), the reports and the coordinator share one definition (docs/energy.md).

Every figure here is the vendor's estimate, machine-wide: IOReport's energy model, the SMC's PSTR,
RAPL. A window is one timed iteration: the meter read after the inputs are ready and the gate has
passed, just before the clock starts, and again after `mx.eval` has returned and the clock has
stopped, so the reads stay out of the timed region.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

CPU, GPU, ANE, DRAM, SYSTEM = "cpu", "gpu", "ane", "dram", "system"
RAILS = (CPU, GPU, ANE, DRAM, SYSTEM)
"""The rails a meter may give. `system` is the whole machine (the SMC's PSTR, RAPL's psys,
macmon's sys_power); the others are parts of it."""
SHORT_WINDOW_FLAG = "short-energy-window"
"""A cell flag: some of its windows were shorter than the meter's resolution."""
NO_METER = "no power meter"
DEFAULT_BASELINE_S = 3.0
"""Seconds of idle power measured before a matrix unless --idle-baseline says otherwise (never
less than two of the meter's intervals: docs/energy.md)."""


def whole(per_rail: Mapping[str, float]) -> float | None:
    """The machine's figure from a meter's rails: `system` when it is measured (it holds the
    others), else the sum of the rails measured; None when there are none."""
    if not per_rail:
        return None
    if SYSTEM in per_rail:
        return per_rail[SYSTEM]
    return sum(per_rail.values())


@dataclass(frozen=True)
class MeterInfo:
    """What measured: the source's name, whether it is a meter at all (sim and replay are not),
    its rails and the shortest window it can tell apart (seconds; 0 for a model)."""

    source: str
    simulated: bool
    rails: tuple[str, ...]
    resolution_s: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "simulated": self.simulated,
            "rails": list(self.rails),
            "resolution_s": self.resolution_s,
        }


@dataclass(frozen=True)
class Window:
    """Energy over one stretch of time: its seconds and joules per rail."""

    seconds: float
    joules: Mapping[str, float] = field(default_factory=dict)

    @property
    def total_j(self) -> float | None:
        return whole(self.joules)


def between(start: Mapping[str, float], end: Mapping[str, float], seconds: float) -> Window:
    """The window between two cumulative readings (joules per rail since the meter opened)."""
    return Window(seconds, {rail: end[rail] - start.get(rail, 0.0) for rail in end})


def idle_power(window: Window) -> float | None:
    """Watts of an idle window (the baseline), None when it measured nothing."""
    total = window.total_j
    if total is None or window.seconds <= 0:
        return None
    return total / window.seconds


def unmeasured(reason: str, meter: MeterInfo | None = None) -> dict[str, Any]:
    """A cell's energy fields when there is no figure: every number None, the reason said."""
    return {
        "energy_source": meter.source if meter else None,
        "energy_simulated": bool(meter and meter.simulated),
        "energy_rails": list(meter.rails) if meter else [],
        "energy_j": None,
        "energy_net_j": None,
        "energy_window_s": None,
        "power_w": None,
        "idle_power_w": None,
        "tokens_per_joule": None,
        "joules_per_token": None,
        "energy_by_rail_j": None,
        "energy_short_windows": None,
        "energy_note": reason,
    }


def cell_energy(
    windows: Sequence[Window], tokens_per_window: int, meter: MeterInfo, idle_w: float | None
) -> dict[str, Any]:
    """A cell's energy fields from its timed windows: joules gross and net of the idle baseline
    (idle_w x the windows' seconds), mean watts, tokens per joule and joules per token (gross),
    joules per rail, and a note when windows were shorter than the meter's resolution."""
    if not windows:
        return unmeasured("no timed iteration was metered", meter)
    seconds = sum(window.seconds for window in windows)
    by_rail: dict[str, float] = {}
    for window in windows:
        for rail, joules in window.joules.items():
            by_rail[rail] = by_rail.get(rail, 0.0) + joules
    gross = whole(by_rail)
    if gross is None:
        return unmeasured(f"{meter.source} measured no rail", meter)
    tokens = tokens_per_window * len(windows)
    short = sum(1 for window in windows if window.seconds < meter.resolution_s)
    note = None
    if short:
        note = (
            f"{short} of {len(windows)} windows shorter than the meter's resolution "
            f"({meter.resolution_s:g} s): the joules add up its counter steps, an estimate"
        )
    return {
        "energy_source": meter.source,
        "energy_simulated": meter.simulated,
        "energy_rails": sorted(by_rail),
        "energy_j": gross,
        "energy_net_j": None if idle_w is None else gross - idle_w * seconds,
        "energy_window_s": seconds,
        "power_w": gross / seconds if seconds > 0 else None,
        "idle_power_w": idle_w,
        "tokens_per_joule": tokens / gross if gross > 0 else None,
        "joules_per_token": gross / tokens if tokens > 0 else None,
        "energy_by_rail_j": by_rail,
        "energy_short_windows": short,
        "energy_note": note,
    }


def not_a_meter(text: str, record: Mapping[str, Any]) -> str:
    """A cell's energy figure as shown: marked `sim` when its source is not a meter (sim,
    replay), so a model's watts never pass for a measurement."""
    return f"{text} sim" if record.get("energy_simulated") else text


def energy_flags(fields: Mapping[str, Any]) -> list[str]:
    """The cell flags its energy fields call for."""
    return [SHORT_WINDOW_FLAG] if fields.get("energy_short_windows") else []
