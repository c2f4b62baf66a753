"""What recorded telemetry says about a stretch of time: pure functions over sample and event
bodies, shared by `coordinator history`'s table and its plot so both tell the same story.

Every sample stands for the time until the next one, but never for more than GAP_FACTOR times
the host's usual spacing: when a host went silent, nobody knows its temperature, and a silence
must not count as time spent at the last reading (the plot breaks its line there, too).
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

THRESHOLDS = ("max_speed_temp", "pause_temp", "stop_temp")
GAP_FACTOR = 3.0
_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_AGO = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([smhd])\s*", re.IGNORECASE)

Policies = list[tuple[float, dict[str, Any]]]


def parse_since(text: str, now: float) -> float:
    """`30m`, `2h`, `1d` before `now`, or an ISO time (local time when it names no zone), as
    epoch seconds; ValueError saying what is accepted."""
    match = _AGO.fullmatch(text)
    if match:
        return now - float(match.group(1)) * _UNITS[match.group(2).lower()]
    stripped = text.strip()
    try:
        # Python 3.10's fromisoformat does not take a trailing Z.
        moment = datetime.fromisoformat(
            stripped[:-1] + "+00:00" if stripped.endswith("Z") else stripped
        )
    except ValueError:
        raise ValueError(
            f"bad --since {text!r}: expected a duration such as 30m, 2h or 1d, or "
            "an ISO time such as 2026-05-01T14:00"
        ) from None
    return (moment if moment.tzinfo else moment.astimezone()).timestamp()


def sample_spans(times: list[float]) -> list[float]:
    """Seconds each sample stands for: until the next, capped at GAP_FACTOR x the median spacing;
    the last one stands for the median spacing (its poll interval, near enough)."""
    gaps = [later - earlier for earlier, later in zip(times, times[1:], strict=False)]
    if not gaps:
        return [0.0] * len(times)
    cap = GAP_FACTOR * statistics.median(gaps)
    return [min(gap, cap) for gap in gaps] + [statistics.median(gaps)]


def policy_at(policies: Policies, at: float) -> dict[str, Any] | None:
    """The policy learned last at or before `at`. Before the first one learned, that first one:
    the agent persists its policy, so it most likely enforced it already."""
    current = policies[0][1] if policies else None
    for learned, policy in policies:
        if learned > at:
            break
        current = policy
    return current


def _is_paused(sample: dict[str, Any]) -> bool:
    return any(job["state"] == "paused" for job in sample["jobs"])


def paused_intervals(
    samples: list[dict[str, Any]], spans: list[float]
) -> list[tuple[float, float]]:
    """The stretches when at least one supervised job was paused, from the samples' job states
    (so a pause that began before the window is still drawn from its start)."""
    intervals: list[tuple[float, float]] = []
    for sample, span in zip(samples, spans, strict=True):
        if not _is_paused(sample):
            continue
        start, end = sample["time"], sample["time"] + span
        if intervals and intervals[-1][1] >= start:
            intervals[-1] = (intervals[-1][0], end)
        else:
            intervals.append((start, end))
    return intervals


@dataclass
class HostHistory:
    """One host's recorded telemetry in a window, oldest first, and every policy learned."""

    host: str
    samples: list[dict[str, Any]]
    events: list[dict[str, Any]] = field(default_factory=list)
    policies: Policies = field(default_factory=list)

    @property
    def spans(self) -> list[float]:
        return sample_spans([sample["time"] for sample in self.samples])


def host_stats(history: HostHistory) -> dict[str, Any]:
    """Min / mean / max °C, seconds at or above each threshold of the policy in force at each
    sample, seconds with a job paused, and the pauses and stops its events count."""
    samples, spans = history.samples, history.spans
    readings = [s["celsius"] for s in samples if s["celsius"] is not None]
    above: dict[str, float | None] = dict.fromkeys(THRESHOLDS, None)
    for sample, span in zip(samples, spans, strict=True):
        policy = policy_at(history.policies, sample["time"])
        if policy is None:
            break  # no policy ever learned: thresholds unknown, say so rather than guess
        for name in THRESHOLDS:
            hit = sample["celsius"] is not None and sample["celsius"] >= policy[name]
            above[name] = (above[name] or 0.0) + (span if hit else 0.0)
    actions = [event["action"] for event in history.events]
    return {
        "host": history.host,
        "samples": len(samples),
        "first": samples[0]["time"] if samples else None,
        "last": samples[-1]["time"] if samples else None,
        "min_c": min(readings, default=None),
        "mean_c": statistics.fmean(readings) if readings else None,
        "max_c": max(readings, default=None),
        "seconds_above": above,
        "seconds_paused": sum(end - start for start, end in paused_intervals(samples, spans)),
        "pauses": actions.count("pause"),
        "stops": actions.count("stop"),
        "sources": sorted({s["source"] for s in samples}),
        "simulated": any(s["simulated"] for s in samples),
        "policy": policy_at(history.policies, samples[-1]["time"]) if samples else None,
    }
