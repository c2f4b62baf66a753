"""A cell's verdict: `valid`, or `invalid` with every reason it cannot be published as a speed.

Pure: the verdict is a function of the record's own fields, so an agent, a coordinator that
trusts no agent (it judges every record again), a stored run read back and a test all reach the
same one. The reasons and the thresholds are documented in docs/performance.md (Verdicts);
INFORMATIONAL flags are shown beside the figures but never make a cell invalid.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from shared.cooling.throttle import ThrottlePoll, throttled_evidence
from shared.cooling.throttle import judge as judge_throttle

VALID = "valid"
INVALID = "invalid"
VERDICTS = (VALID, INVALID)

COLD = "cold"
"""No untimed iteration ran before the timed ones (-w 0): kernels compiled inside the clock."""
NOISY = "noisy"
"""The 95 % confidence interval of the mean tok/s is wider than the allowed share, or n = 1."""
SLEPT = "slept"
"""The sleep-inclusive and sleep-exclusive clocks disagreed over a timed window."""
PAUSED = "paused"
HOT = "hot"
HOT_START = "hot-start"
"""The cell started above the reduce threshold (or pressure not Nominal) after the cool-start
wait ran out."""
THROTTLED = "throttled"
"""The cell was measured while the Mac throttled (shared.cooling.throttle's rule): the GPU clock
the agent read during the cell fell below the sustained one by the rule's margin for its number
of polls."""
SLOWED = "slowed"
"""The cell's timed iterations slowed below the cell's own early best by the throttle rule's
margin for its number of iterations, and no clock said the Mac throttled: a throttle the clock
could not see (a Mac without its clock channel), or another load beside the cell. Either way
its figures mix two speeds; which it was, the rate alone cannot tell, so it is not called
throttling."""
SATURATED = "saturated"
"""A serving cell's open loop outran its engine (shared.benchmark.serving.saturated): its
latencies are a growing queue's, not the offered rate's."""
LOW_POWER = "low-power"
ON_BATTERY = "on-battery"
GPU_ERROR = "gpu-error"
FAILED = "failed"
UNVERIFIED = "unverified"
"""Recorded by an agent that predates verdicts: what a verdict needs is not in the record."""
REASONS = (
    COLD,
    NOISY,
    SLEPT,
    PAUSED,
    HOT,
    HOT_START,
    THROTTLED,
    SLOWED,
    SATURATED,
    LOW_POWER,
    ON_BATTERY,
    GPU_ERROR,
    FAILED,
    UNVERIFIED,
)
INVALIDATING_FLAGS = (PAUSED, HOT, HOT_START, SLEPT)
"""Cell flags that are also reasons."""
INFORMATIONAL = ("simulated", "short-energy-window", "rewarmed", "injected")
"""Flags that say how a figure was obtained without making it invalid: simulated or injected
readings (labelled wherever shown), energy windows shorter than the meter's resolution, and
untimed re-warm iterations after a gap."""

NOISY_SHARE = 0.05
"""A cell is noisy when the half-width of its mean's 95 % interval exceeds 5 % of the mean
(or, under `-r auto`, the precision asked for)."""
SLEPT_TOLERANCE_S = 0.25
"""Seconds the two clocks may drift apart over a cell's timed windows before it `slept`."""
LOW_POWER_MODES = ("low",)
BATTERY_SOURCES = ("battery",)


def interval(record: Mapping[str, Any]) -> tuple[float, float] | None:
    """The record's tok/s 95 % interval (low, high), None where it has none."""
    mean = record.get("tokens_per_sec")
    half = record.get("ci95_tokens_per_sec")
    if mean is None or half is None:
        return None
    return mean - half, mean + half


def separated(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Whether the two records' intervals do not overlap: a difference beyond the noise."""
    first, second = interval(a), interval(b)
    if first is None or second is None:
        return False
    return first[1] < second[0] or second[1] < first[0]


def noise_limit(record: Mapping[str, Any]) -> float:
    """The share of the mean a cell's interval half-width may reach."""
    return record.get("precision_target") or NOISY_SHARE


def is_noisy(record: Mapping[str, Any]) -> bool:
    mean = record.get("tokens_per_sec")
    half = record.get("ci95_tokens_per_sec")
    if not mean or half is None:
        return True
    return half > noise_limit(record) * mean


def reasons(record: Mapping[str, Any]) -> list[str]:
    """Every reason the record cannot be published as a speed, in REASONS order."""
    found: set[str] = set()
    if record.get("status") != "ok":  # a group's cell: any rank's Metal error (its `ranks`)
        errors = [record.get("error")] + [rank.get("error") for rank in record.get("ranks") or ()]
        gpu = any((error or "").startswith(GPU_ERROR) for error in errors)
        found.add(GPU_ERROR if gpu else FAILED)
    elif "warmup_iterations" not in record:
        found.add(UNVERIFIED)
    else:
        if not record.get("warmup_iterations"):
            found.add(COLD)
        if is_noisy(record):
            found.add(NOISY)
        if (record.get("slept_s") or 0.0) > SLEPT_TOLERANCE_S:
            found.add(SLEPT)
        clock, rate = throttle_evidence(record), slowdown_evidence(record)
        if clock is not None:
            found.add(THROTTLED)
        elif rate is not None:
            found.add(SLOWED)
        if (record.get("serving") or {}).get("saturated"):
            found.add(SATURATED)
    found.update(flag for flag in record.get("flags") or () if flag in INVALIDATING_FLAGS)
    settings = record.get("settings") or {}
    if settings.get("power_mode") in LOW_POWER_MODES:
        found.add(LOW_POWER)
    if settings.get("power_source") in BATTERY_SOURCES:
        found.add(ON_BATTERY)
    return [reason for reason in REASONS if reason in found]


def _numbers(values: Any) -> list[Any]:
    return list(values) if isinstance(values, (list, tuple)) else []


def throttle_evidence(record: Mapping[str, Any]) -> str | None:
    """Why the cell was measured throttling (`GPU 1.10 GHz of 1.40 sustained`), None when it
    was not or cannot be told: the GPU clock the agent read during the cell (`gpu_clock`: its
    `samples` as [hz, active share] and the sustained clock the agent knew then), judged by
    the rule. A sustained cell is left out: its throttling is what it measures (its windows'
    curve, shared.benchmark.sustain)."""
    if record.get("sustain"):
        return None
    clock = record.get("gpu_clock")
    clock = clock if isinstance(clock, Mapping) else {}
    clocks = [
        ThrottlePoll(gpu_hz=pair[0], gpu_active=pair[1])
        for pair in _numbers(clock.get("samples"))
        if isinstance(pair, (list, tuple)) and len(pair) == 2
    ]
    sustained = clock.get("sustained_hz")
    known = sustained if isinstance(sustained, (int, float)) else None
    return throttled_evidence(judge_throttle(clocks, known))


def slowdown_evidence(record: Mapping[str, Any]) -> str | None:
    """How the cell's timed iterations slowed by the rule (`256 tok/s of 322`), None when they
    did not: the rate signal alone, which a throttle and a competing load both give."""
    if record.get("sustain"):
        return None
    rates = [ThrottlePoll(rate=rate) for rate in _numbers(record.get("samples_tokens_per_sec"))]
    return throttled_evidence(judge_throttle(rates))


def judge(record: dict[str, Any]) -> dict[str, Any]:
    """The record with its verdict and reasons set from its own fields (replacing any it came
    with: a peer's verdict is never taken on trust)."""
    found = reasons(record)
    record["verdict"] = INVALID if found else VALID
    record["verdict_reasons"] = found
    return record


def verdict_text(record: Mapping[str, Any]) -> str:
    """`valid`, or `invalid: cold, noisy`: how every table and format spells a verdict."""
    found = record.get("verdict_reasons") or []
    if record.get("verdict") == VALID and not found:
        return VALID
    return f"{INVALID}: {', '.join(found)}" if found else INVALID


def noisy_hint(records: list[Mapping[str, Any]]) -> str | None:
    """A pointer for cells judged noisy (their 95 % interval wider than the target): to -r auto
    when they ran a fixed count, to more repetitions when -r auto ran out of them."""
    noisy = [r for r in records if NOISY in (r.get("verdict_reasons") or [])]
    if not noisy:
        return None
    said = f"{len(noisy)} of {len(records)} cells are invalid: noisy (run-to-run spread too wide)"
    if all(r.get("precision_target") is None for r in noisy):
        return f"{said}: `-r auto` repeats each cell until its interval is tight"
    return f"{said} after the most repetitions -r auto may run: raise --max-repetitions"
