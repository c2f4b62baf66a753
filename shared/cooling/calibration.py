"""The policy a host applies when nobody set one: thresholds on the scale of the source that
reads them, since the same Mac reads tens of degrees apart by source (docs/thermal.md,
"Calibration", holds the evidence for each number). Pure: the agent picks by its source, the
coordinator shows where a host's numbers came from."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace

from shared.cooling.pace import PACE_MIN_DUTY, PACE_SLICE_S, check_pace
from shared.cooling.policy import PACE_AT_ONSET, ThermalPolicy, policy_text, updated_policy
from shared.cooling.throttle_point import ThrottlePoint, calibrated_thresholds

SEED_POLICY = ThermalPolicy()
"""The seed's 75/85/95 °C: for the sources no Mac calibrates (sim, replay, a callable)."""

SOURCE_POLICIES: dict[str, ThermalPolicy] = {
    "smc": ThermalPolicy(max_speed_temp=95.0, pause_temp=114.0, stop_temp=120.0),
    "iohid": ThermalPolicy(max_speed_temp=87.0, pause_temp=106.0, stop_temp=112.0),
    "macmon": ThermalPolicy(max_speed_temp=85.0, pause_temp=104.0, stop_temp=110.0),
    "powermetrics": ThermalPolicy(max_speed_temp=88.0, pause_temp=97.0, stop_temp=100.0),
    "linux": ThermalPolicy(max_speed_temp=85.0, pause_temp=95.0, stop_temp=100.0),
}
"""By source scale: `smc` the hotter of the CPU die maximum and the GPU, `iohid` 8 °C below it,
`macmon` (averages) 10 °C below; `powermetrics` the Intel CPU die (on Apple Silicon it reads
only pressure); `linux` an x86 package under its 100 °C junction limit."""

ORDERED = (
    ("max_speed_temp", "--max-speed-temp"),
    ("pause_temp", "--pause-temp"),
    ("stop_temp", "--stop-temp"),
)
"""The thresholds in their required order, with the options that set them."""

SET_BY_COORDINATOR = "set by coordinator policy"
SET_ON_COMMAND_LINE = "set on the command line"
CALIBRATED_ON = "calibrated on this Mac"
"""How a calibrated policy's origin begins (ThrottlePoint.origin())."""
NOT_PACED = "pace at onset: no calibration on this Mac (run agent calibrate)"
"""What a policy asked to pace at the onset says on a Mac with no calibration made with the
source it reads: not paced, and never silently."""
PACE_BELOW_PAUSE_C = 2.0
"""Pacing at the onset where an operator's pause_temp is at or below it: the cap sits this far
under the pause, so the pace tier holds the Mac before a pause would stop the job."""


@dataclass(frozen=True)
class PolicyInForce:
    """A policy and where its numbers came from (`defaults for smc`, `set by coordinator
    policy`, ...), as every display of a policy says it."""

    policy: ThermalPolicy
    origin: str
    onset_c: float | None = None
    """This Mac's calibrated onset, when the numbers stand on a calibration."""

    def __str__(self) -> str:
        p = self.policy
        pace = "" if p.pace_temp is None else f", paced under {p.pace_temp:g} °C"
        thresholds = f"{p.max_speed_temp:g}/{p.pause_temp:g}/{p.stop_temp:g} °C{pace}"
        return f"policy {thresholds} ({self.origin})"


def source_defaults(scale: str | None) -> PolicyInForce:
    """The defaults for a source's scale (its kind: `smc`, `iohid`, ...); the seed's for a
    source no Mac calibrates."""
    if scale in SOURCE_POLICIES:
        return PolicyInForce(SOURCE_POLICIES[scale], f"defaults for {scale}")
    return PolicyInForce(SEED_POLICY, "the seed's defaults")


def calibrated_defaults(
    scale: str | None, source: str | None, calibrated: ThrottlePoint | None
) -> PolicyInForce:
    """The policy under an operator's: this Mac's calibration when it was made with `source`
    (the source's name, as its readings carry it: a calibration on another sensor reads on
    another scale), else the table's defaults for the source's scale."""
    table = source_defaults(scale)
    if calibrated is None or calibrated.source != source:
        return table
    thresholds = calibrated_thresholds(calibrated, table.policy.stop_temp)
    policy = updated_policy(table.policy, thresholds)
    return PolicyInForce(policy, calibrated.origin(), thresholds["pause_temp"])


def with_given(
    scale: str | None,
    given: Mapping[str, float],
    origin: str,
    base: PolicyInForce | None = None,
) -> PolicyInForce:
    """The defaults (`base`: calibrated_defaults(); the source's table without it) with what an
    operator set on top (`given` wins); ValueError naming the problem when the result is out of
    order. Nothing given: the defaults, as they are. PACE_AT_ONSET true: paced_at_onset()."""
    defaults = base or source_defaults(scale)
    numbers = {key: value for key, value in given.items() if key != PACE_AT_ONSET}
    in_force = defaults
    if numbers:
        policy = updated_policy(defaults.policy, numbers)
        unset = [key for key in ("max_speed_temp", "pause_temp", "stop_temp") if key not in given]
        told = origin + (f", the rest {defaults.origin}" if unset else "")
        in_force = PolicyInForce(policy, told, defaults.onset_c)
    return paced_at_onset(in_force, origin) if given.get(PACE_AT_ONSET) else in_force


def paced_at_onset(in_force: PolicyInForce, origin: str) -> PolicyInForce:
    """`in_force` paced under this Mac's calibrated onset (`origin` set that), or under
    PACE_BELOW_PAUSE_C below a pause_temp at or below the onset (pacing holds below the pause);
    the origin says which. Without a calibration the policy is as it was and its origin says
    it is not paced (NOT_PACED)."""
    onset = in_force.onset_c
    if onset is None:
        return replace(in_force, origin=f"{in_force.origin}; {NOT_PACED}")
    pause = in_force.policy.pause_temp
    if onset <= pause:
        cap, why = onset, f"paced at its onset {onset:g} °C, {origin}"
    else:
        cap = pause - PACE_BELOW_PAUSE_C
        why = (
            f"paced at {cap:g} °C, {PACE_BELOW_PAUSE_C:g} °C under pause_temp (below its "
            f"onset {onset:g} °C), {origin}"
        )
    policy = updated_policy(in_force.policy, {"pace_temp": cap})
    return PolicyInForce(policy, f"{in_force.origin}; {why}", onset)


def merged_changes(given: Mapping[str, object], changes: Mapping[str, object]) -> dict:
    """`changes` over the settings `given` so far: a pace_temp (a number, or nil) and PACE_AT_ONSET
    replace each other, and PACE_AT_ONSET false is dropped (not paced at the onset); ValueError
    when one change asks for both a cap and the onset."""
    if changes.get(PACE_AT_ONSET) and changes.get("pace_temp") is not None:
        raise ValueError("give a pace cap or pace at the onset, not both")
    merged = {**given, **changes}
    if changes.get(PACE_AT_ONSET):
        merged.pop("pace_temp", None)
    elif "pace_temp" in changes:
        merged.pop(PACE_AT_ONSET, None)
    if merged.get(PACE_AT_ONSET) is False:
        del merged[PACE_AT_ONSET]
    return merged


def check_given(given: dict[str, float]) -> None:
    """ValueError naming the options when the thresholds given are out of order among
    themselves, or not finite, or the hysteresis is negative."""
    for key, value in given.items():
        if not math.isfinite(value):
            raise ValueError(f"--{key.replace('_', '-')} must be a finite number, got {value}")
    named = [(key, flag) for key, flag in ORDERED if key in given]
    for (low, low_flag), (high, high_flag) in zip(named, named[1:], strict=False):
        if not given[low] < given[high]:
            shown = " ".join(f"{flag} {given[key]:g}" for key, flag in named)
            raise ValueError(
                f"thresholds out of order: need {low_flag} < {high_flag} "
                f"(max speed < pause < stop), got {shown}"
            )
    if given.get(PACE_AT_ONSET) and given.get("pace_temp") is not None:
        raise ValueError("give --pace-temp or --pace-at-onset, not both")
    if given.get("hysteresis", 0.0) < 0:
        raise ValueError(f"--hysteresis must be >= 0 °C, got {given['hysteresis']:g}")
    check_pace(
        given.get("pace_temp"),
        given.get("pace_slice", PACE_SLICE_S),
        given.get("pace_min_duty", PACE_MIN_DUTY),
        given.get("pause_temp", math.inf),
        lambda key: f"--{key.replace('_', '-')}",
    )


def policy_event_detail(in_force: PolicyInForce) -> str:
    """A `policy` event's detail: `max_speed_temp=95 ... (set by coordinator policy, ...)`."""
    return f"{policy_text(in_force.policy)} ({in_force.origin})"


def origin_told(origin: object) -> str | None:
    """An agent's `policy_origin` / `origin`, when it is one: text, one line, of a sane length;
    None otherwise (the agent did not say, or said something no display can take)."""
    if not isinstance(origin, str) or not origin or len(origin) > 300 or not origin.isprintable():
        return None
    return origin


def origin_in_detail(detail: object) -> str | None:
    """Where a `policy` event's numbers came from, as policy_event_detail() wrote it; None for
    a detail that does not say (an older agent), or is not text."""
    if not isinstance(detail, str) or not detail.endswith(")") or " (" not in detail:
        return None
    depth = 0
    for index in range(len(detail) - 1, -1, -1):  # the parenthesis the last one closes
        depth += {")": 1, "(": -1}.get(detail[index], 0)
        if depth == 0:
            break
    if depth or detail[index - 1 : index] != " ":
        return None
    origin = origin_told(detail[index + 1 : -1])
    return origin if origin and origin.startswith((SET_BY_COORDINATOR, CALIBRATED_ON)) else None
