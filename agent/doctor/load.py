"""`agent doctor --load`'s verdicts: did a source's readings move between idle and a load? Pure:
plain numbers in, a verdict out; the sampling is agent.doctor.load_checks.

A source that reads the same under load as at idle gives figures that mean nothing about the
work (OpenJarvis PR #904 found it in every Apple energy figure it had), so it fails. A source
without readings fails too, saying so, and is never given a number (docs/deploy.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from statistics import fmean

CANNOT_TELL = "this source cannot tell load from idle"
THERMAL_RISE_C = 1.0
"""Many sensors step in whole degrees, and a sustained load warms a die by more: a smaller
rise may be rounding, not the load."""
POWER_MARGIN_W = 0.5
POWER_MARGIN_SHARE = 0.10
"""Load watts must beat idle by the larger of these: above a meter's rounding and an idle
machine's own drift, far below what a matmul loop adds to a CPU or GPU."""


@dataclass(frozen=True)
class Verdict:
    """What one source's check says: moved (ok), or why not."""

    ok: bool
    detail: str


def thermal_verdict(
    idle: Sequence[float], load: Sequence[float], reason: str | None = None
) -> Verdict:
    """°C at idle and under load -> moved when the load's peak rises THERMAL_RISE_C above
    idle's mean and beyond idle's own spread (a jittery sensor does not pass by noise).
    `reason`: why readings are missing, when a window has none."""
    if not (idle and load):
        return Verdict(False, _missing(bool(idle), bool(load), reason))
    baseline, end, peak = fmean(idle), load[-1], max(load)
    rise, spread = peak - baseline, max(idle) - min(idle)
    detail = f"idle {baseline:.1f} °C -> end {end:.1f} °C, peak {peak:.1f} °C: {rise:+.1f} °C"
    if rise >= THERMAL_RISE_C and rise > spread:
        return Verdict(True, detail)
    bound = (
        f"under {THERMAL_RISE_C:g} °C" if rise < THERMAL_RISE_C else f"within idle's {spread:.1f}"
    )
    return Verdict(False, f"{detail} ({bound}): {CANNOT_TELL}")


def power_verdict(idle_w: float | None, load_w: float | None, reason: str | None = None) -> Verdict:
    """Mean watts at idle and under load -> moved when load beats idle by the larger of
    POWER_MARGIN_W and POWER_MARGIN_SHARE of idle."""
    if idle_w is None or load_w is None:
        return Verdict(False, _missing(idle_w is not None, load_w is not None, reason))
    margin = max(POWER_MARGIN_W, POWER_MARGIN_SHARE * idle_w)
    added = load_w - idle_w
    detail = f"idle {idle_w:.2f} W -> load {load_w:.2f} W: {added:+.2f} W"
    if added >= margin:
        return Verdict(True, detail)
    return Verdict(False, f"{detail} (under the {margin:.2f} W margin): {CANNOT_TELL}")


def window_watts(samples: Sequence[tuple[float, float | None]]) -> float | None:
    """Mean watts over a window from (monotonic seconds, cumulative joules) samples: the energy
    between its first and last reading with joules, over the time between; None without two
    such readings apart in time."""
    counted = [(at, joules) for at, joules in samples if joules is not None]
    if len(counted) < 2 or counted[-1][0] <= counted[0][0]:
        return None
    (start, first), (end, last) = counted[0], counted[-1]
    return (last - first) / (end - start)


def _missing(idle: bool, load: bool, reason: str | None) -> str:
    """Which window had no reading, and why."""
    where = (
        "at idle or under load" if not (idle or load) else "at idle" if not idle else "under load"
    )
    return f"no reading {where}: {reason or 'the source gave none'}"
