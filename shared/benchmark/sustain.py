"""Sustained runs as data: the plan (`--sustain DURATION --sustain-window W`), one row per window
and what a run's windows say (first and steady-state speed, throttle ratio, time to throttle,
temperature rise, mean power). Pure, shared by the agent that measures and every report.

A sustained cell runs its iterations back to back for DURATION (wall clock, from its first timed
iteration); each window of W seconds reports the tokens its timed iterations processed over
their timed seconds, so a cooling pause, which is never timed, is kept out of tok/s and only
flags its window.
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from shared.bounds import MAX_SUSTAIN_S, MAX_SUSTAIN_WINDOW_S, duration_text
from shared.cooling.throttle import ThrottlePoll, first_throttled, judge
from shared.stats import ci95_half_width

DEFAULT_WINDOW_S = 10.0
STEADY_WINDOWS = 3
"""Steady state is the mean tok/s of the last this many full windows after the first (which
warms up: caches, clocks); with fewer than this many after it, steady is N/A and says why."""
SUSTAIN_EARLY_WINDOWS = 1
"""The throttle rule's early best for a sustained run (shared.cooling.throttle, its margin and
polls): the first full window's tok/s, each window being seconds of work already."""
FULL_WINDOW_SHARE = 0.5
"""A window counts for first, steady and throttled speed only when its timed iterations cover at
least this share of a window: a sliver (one iteration just after a pause, the run's last
moments) is shown but would judge the run by a single sample."""
_DURATION = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|min|h)?\s*", re.IGNORECASE)
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}


CLI_NAMES = ("--sustain", "--sustain-window")
WIRE_NAMES = ("duration_s", "window_s")
"""What SustainPlan.check's messages call the duration and the window: the options, or
bench.start's `sustain` fields (docs/protocol.md §5, Energy and sustained jobs)."""


class SustainError(ValueError):
    """A sustained run that cannot be measured as asked; the message names the option."""


def parse_duration(text: str, flag: str) -> float:
    """`30s`, `5m`, `1.5h`, `500ms` or plain seconds -> seconds (> 0); SustainError naming
    `flag` otherwise."""
    match = _DURATION.fullmatch(text)
    if not match:
        raise SustainError(f"{flag}: expected a duration such as 30s, 5m or 1h, got {text!r}")
    seconds = float(match.group(1)) * _UNITS[(match.group(2) or "s").lower()]
    if not (math.isfinite(seconds) and seconds > 0):
        raise SustainError(f"{flag} must be longer than 0 s, got {text!r}")
    return seconds


@dataclass(frozen=True)
class SustainPlan:
    """Run each cell for `duration_s`, reporting every `window_s`."""

    duration_s: float
    window_s: float = DEFAULT_WINDOW_S

    @property
    def windows(self) -> int:
        """How many windows the duration holds (the last one may be shorter)."""
        return max(1, math.ceil(self.duration_s / self.window_s - 1e-9))

    def check(
        self,
        meter_interval_s: float = 0.0,
        meter: str = "the meter",
        names: tuple[str, str] = CLI_NAMES,
    ) -> None:
        """SustainError unless the duration holds at least two windows and a window is no
        shorter than the meter's interval (its readings would not change within one). The
        message calls the duration and the window by `names`: the options, or on the wire
        (WIRE_NAMES) bench.start's fields."""
        duration, window = names
        if not (math.isfinite(self.duration_s) and math.isfinite(self.window_s)):
            raise SustainError(f"{duration} and {window} must be finite")
        if self.window_s <= 0:
            raise SustainError(f"{window} must be longer than 0 s, got {self.window_s:g}")
        for name, value, most in (
            (duration, self.duration_s, MAX_SUSTAIN_S),
            (window, self.window_s, MAX_SUSTAIN_WINDOW_S),
        ):
            if value > most:
                raise SustainError(
                    f"{name} must be at most {duration_text(most)} ({most:g} s), got {value:g} s"
                )
        if self.duration_s < 2 * self.window_s:
            raise SustainError(
                f"{duration} {self.duration_s:g} s is shorter than two windows of "
                f"{self.window_s:g} s: give a longer {duration} or a shorter {window}"
            )
        if self.window_s < meter_interval_s:
            raise SustainError(
                f"{window} {self.window_s:g} s is shorter than {meter}'s interval "
                f"({meter_interval_s:g} s): its readings would not change within a window"
            )

    def to_dict(self) -> dict[str, float]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SustainPlan:
        """From the wire (bench.start's `sustain`); SustainError for anything else."""
        if not isinstance(data, Mapping) or set(data) != {"duration_s", "window_s"}:
            raise SustainError("sustain must be a map of duration_s and window_s")
        values = [data["duration_s"], data["window_s"]]
        if any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in values):
            raise SustainError("sustain: duration_s and window_s must be numbers")
        plan = cls(float(data["duration_s"]), float(data["window_s"]))
        plan.check(names=WIRE_NAMES)
        return plan


@dataclass
class SustainWindow:
    """One window of a sustained cell. Times are seconds since its first timed iteration;
    `celsius` and `state` are the thermal reading and the policy's state as it closed, `watts`
    the mean power over it (None without a meter), `pause_s` the cooling pause in it."""

    index: int
    start_s: float
    end_s: float
    iterations: int = 0
    tokens: int = 0
    timed_s: float = 0.0
    celsius: float | None = None
    state: str | None = None
    watts: float | None = None
    joules: float | None = None
    pause_s: float = 0.0

    @property
    def tokens_per_sec(self) -> float | None:
        return self.tokens / self.timed_s if self.timed_s > 0 else None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {
            "tokens_per_sec": self.tokens_per_sec,
            "paused": self.pause_s > 0,
        }


def full_windows(windows: Sequence[Mapping[str, Any]], window_s: float) -> list[Mapping[str, Any]]:
    """The windows timed for FULL_WINDOW_SHARE of `window_s` or more (all windows with a speed
    when none is)."""
    speeds = [w for w in windows if w["tokens_per_sec"] is not None]
    return [w for w in speeds if w["timed_s"] >= FULL_WINDOW_SHARE * window_s] or speeds


def sustained_speed(sustain: Mapping[str, Any]) -> dict[str, float | None]:
    """A sustained cell's tok/s as every table, plot and export shows it (its record's
    `tokens_per_sec`): all its tokens over all its timed seconds, the quantity its windows
    show, where a mean of per-iteration rates would let fast iterations outweigh slow ones.
    Its spread and 95 % interval are those of its full windows' tok/s. `sustain`: the record's
    `sustain` field (its windows and window_s)."""
    windows = sustain["windows"]
    seconds = sum(w["timed_s"] for w in windows)
    rates = [w["tokens_per_sec"] for w in full_windows(windows, sustain["window_s"])]
    return {
        "tokens_per_sec": sum(w["tokens"] for w in windows) / seconds if seconds > 0 else None,
        "std_tokens_per_sec": statistics.stdev(rates) if len(rates) > 1 else None,
        "ci95_tokens_per_sec": ci95_half_width(rates),
    }


def summarize(
    windows: Sequence[Mapping[str, Any]], start_celsius: float | None, window_s: float
) -> dict[str, Any]:
    """What a run's windows (SustainWindow.to_dict) say: first-window and steady-state tok/s
    (the mean of the last STEADY_WINDOWS full windows after the first; None with fewer:
    steady_unknown says why), their ratio, when the run first throttled by the throttle rule
    over its full windows' tok/s (the start of the first low window; None: never), the
    temperature rise from the start
    to the last window, and the mean watts over the windows metered."""
    speeds = full_windows(windows, window_s)
    first = speeds[0]["tokens_per_sec"] if speeds else None
    later = speeds[1:]
    steady = None
    if len(later) >= STEADY_WINDOWS:
        steady = statistics.fmean(w["tokens_per_sec"] for w in later[-STEADY_WINDOWS:])
    verdicts = judge(
        [ThrottlePoll(rate=w["tokens_per_sec"]) for w in speeds],
        early_readings=SUSTAIN_EARLY_WINDOWS,
    )
    onset = first_throttled(verdicts)
    throttled_at = None if onset is None else speeds[onset]["start_s"]
    temperatures = [w["celsius"] for w in windows if w["celsius"] is not None]
    start = start_celsius if start_celsius is not None else (temperatures or [None])[0]
    metered = [w for w in windows if w["joules"] is not None]
    seconds = sum(w["end_s"] - w["start_s"] for w in metered)
    return {
        "first_tokens_per_sec": first,
        "steady_tokens_per_sec": steady,
        "throttle_ratio": steady / first if first and steady is not None else None,
        "time_to_throttle_s": throttled_at,
        "start_celsius": start,
        "end_celsius": temperatures[-1] if temperatures else None,
        "temp_rise_c": temperatures[-1] - start if temperatures and start is not None else None,
        "mean_power_w": sum(w["joules"] for w in metered) / seconds if seconds > 0 else None,
        "pause_s": sum(w["pause_s"] for w in windows),
        "paused_windows": sum(1 for w in windows if w["paused"]),
    }


def steady_unknown(sustain: Mapping[str, Any]) -> str | None:
    """Why a sustained cell (its record's `sustain` field) has no steady tok/s; None when it
    has one."""
    if sustain.get("steady_tokens_per_sec") is not None:
        return None
    after = max(0, len(full_windows(sustain["windows"], sustain["window_s"])) - 1)
    return (
        f"steady needs {STEADY_WINDOWS} full windows after the first, this run has {after}: "
        "a longer --sustain or a shorter --sustain-window"
    )
