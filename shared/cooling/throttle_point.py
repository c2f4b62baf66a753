"""A Mac's throttle point, learned: what `agent calibrate` makes of a sustained MLX load run from
cold and then held below the point where the firmware started to throttle (docs/thermal.md,
Calibrating a Mac). Pure: samples in, a ThrottlePoint out; the load, the sensors and the clock
are agent.cooling.calibrate's.

The onset is where the speed signal (the GPU clock, else the load's own work rate: issue 41's
second signal, the only one on a Mac whose clock channel is missing) first drops and stays down,
by the throttle rule every display applies (shared.cooling.throttle: its margin, for its
polls), read on every sensor. The duty cycle is the share of time the load ran while the Mac
was held at the onset; with the work rate at both operating points (throttled by the firmware,
held below onset) it says what preventing throttling costs on this Mac."""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from shared import shapes as s
from shared.cooling.throttle import (
    EARLY_READINGS,
    POLLS,
    ThrottlePoll,
    first_throttled,
    judge,
    throttled_evidence,
)

SETTLE_SHARE = 0.5
"""The share of each operating phase left out before its steady figures are taken (the
firmware settling after onset, the hold's first approach to its cap)."""
HOLD_BELOW_C = 1.0
"""The hold's cap below the onset: the load runs while the reading is under it. A poll of load
heats the die some tenths of a degree near the onset (the fanless plant, a poll of 6 s of its
time: 0.5 °C); a cap closer than that lets it cross the onset, the firmware lowers the clock,
and the hold measures a duty at a lowered clock."""
RECOVER_BELOW_C = 5.0
"""Before the hold, the load rests until the reading is this far below the onset: a firmware
restores its clock only some degrees below where it lowered it (hysteresis), and a hold at a
lowered clock would measure a duty the full clock cannot sustain."""

PHASES = ("idle", "sustained", "recovering", "held")
"""A calibration's phases in order: idle from cold, flat out until the firmware throttles (and
a while after, for its operating point), recovering (resting until the clock can recover, then
warming back to the cap), held below the onset (hold_step)."""

SIGNALS = ("gpu clock", "work rate")
"""The speed signals, in the order one is picked: the first every loaded poll has."""
WORK_UNIT = "work/s"


@dataclass(frozen=True)
class CalibrationSample:
    """One poll of a calibration. `time` is seconds since it began (the thermal source's own
    time: a plant's, where a plant runs faster than the wall clock); `running` the share of
    the interval since the previous poll that the load ran (0 idle, 1 flat out); `work` the
    load's work units done in that interval; `phase` one of PHASES."""

    time: float
    phase: str
    celsius: float | None
    sensor: str | None = None
    sensors: Mapping[str, float] = field(default_factory=dict)
    gpu_hz: float | None = None
    gpu_active: float | None = None
    work: float = 0.0
    running: float = 0.0


@dataclass(frozen=True)
class OperatingPoint:
    """Steady figures of one way of running the Mac: `work_rate` is work per second of wall
    time (pauses included), `duty` the share of that time the load ran (the GPU's active share
    where the Mac reads one)."""

    work_rate: float
    duty: float
    celsius: float | None
    clock_hz: float | None
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "work_rate": self.work_rate,
            "duty": self.duty,
            "celsius": self.celsius,
            "clock_hz": self.clock_hz,
            "seconds": self.seconds,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> OperatingPoint:
        return cls(
            work_rate=_number(data, "work_rate", low=0.0),
            duty=_number(data, "duty", low=0.0, high=1.0),
            celsius=_number(data, "celsius", optional=True),
            clock_hz=_number(data, "clock_hz", low=0.0, optional=True),
            seconds=_number(data, "seconds", low=0.0),
        )


@dataclass(frozen=True)
class ThrottlePoint:
    """What a calibration found. `onset_c` is the source's own reading (`celsius`, what the
    policy's thresholds compare with) at the onset, `sensor` the sensor it was; `sensor_onsets`
    every sensor's reading there. `throttled` is the firmware's operating point (flat out after
    onset), `held` the one below onset and `duty_cycle` its duty (each None when its phase did
    not run long enough to say)."""

    source: str
    simulated: bool
    calibrated_at: float
    onset_c: float
    sensor: str | None
    sensor_onsets: Mapping[str, float]
    time_to_throttle_s: float
    signal: str
    reference: float
    throttled: OperatingPoint | None
    held: OperatingPoint | None
    duty_cycle: float | None
    start_c: float | None
    evidence: str | None = None

    @property
    def sustained_hz(self) -> float | None:
        """The GPU clock this Mac sustains before it throttles (the throttle rule's reference,
        shared.cooling.throttle); None when the onset was read on the work rate."""
        return self.reference if self.signal == "gpu clock" else None

    def origin(self) -> str:
        """`calibrated on this Mac 2026-12-06: onset 101.5 °C (smc · Tg0k)`: where a calibrated
        policy's numbers came from, as every display names it (a simulated source says so)."""
        day = datetime.fromtimestamp(self.calibrated_at, UTC).strftime("%Y-%m-%d")
        where = self.source if self.sensor is None else f"{self.source} · {self.sensor}"
        simulated = ", simulated" if self.simulated else ""
        return f"calibrated on this Mac {day}: onset {self.onset_c:.1f} °C ({where}{simulated})"

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "simulated": self.simulated,
            "calibrated_at": self.calibrated_at,
            "onset_c": self.onset_c,
            "sensor": self.sensor,
            "sensor_onsets": dict(self.sensor_onsets),
            "time_to_throttle_s": self.time_to_throttle_s,
            "signal": self.signal,
            "reference": self.reference,
            "throttled": None if self.throttled is None else self.throttled.to_dict(),
            "held": None if self.held is None else self.held.to_dict(),
            "duty_cycle": self.duty_cycle,
            "start_c": self.start_c,
            "evidence": self.evidence,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ThrottlePoint:
        """ValueError naming the first field that is missing or not what to_dict() writes."""
        if not isinstance(data, Mapping):
            raise ValueError("not a map")
        if unknown := s.unknown_keys(data, cls.__dataclass_fields__):
            raise ValueError(f"unknown fields: {', '.join(unknown)}")
        onsets = data.get("sensor_onsets")
        if not isinstance(onsets, Mapping) or not all(
            isinstance(k, str) and _finite(v) for k, v in onsets.items()
        ):
            raise ValueError("sensor_onsets must map sensor names to finite numbers")
        throttled, held = data.get("throttled"), data.get("held")
        if not all(point is None or isinstance(point, Mapping) for point in (throttled, held)):
            raise ValueError("throttled and held must be maps or null")
        signal = data.get("signal")
        if signal not in SIGNALS:
            raise ValueError(f"signal must be one of {', '.join(SIGNALS)}")
        return cls(
            source=_text(data, "source"),
            simulated=_flag(data, "simulated"),
            calibrated_at=_number(data, "calibrated_at", low=0.0),
            onset_c=_number(data, "onset_c", low=-273.15),
            sensor=_text(data, "sensor", optional=True),
            sensor_onsets={k: float(v) for k, v in onsets.items()},
            time_to_throttle_s=_number(data, "time_to_throttle_s", low=0.0),
            signal=signal,
            reference=_number(data, "reference", low=0.0),
            throttled=None if throttled is None else OperatingPoint.from_dict(throttled),
            held=None if held is None else OperatingPoint.from_dict(held),
            duty_cycle=_number(data, "duty_cycle", low=0.0, high=1.0, optional=True),
            start_c=_number(data, "start_c", optional=True),
            evidence=_text(data, "evidence", optional=True),
        )


CALIBRATION_STATES = ("none", "running", "ok", "failed", "refused", "stopped", "interrupted")
"""What calibrate.get says of the last calibration an agent ran (docs/protocol.md §18)."""
_maybe_celsius = s.nil_or(s.number(-273.15))
calibrate_progress = s.fields(
    {"phase": s.one_of(PHASES), "elapsed_s": s.number(0), "total_s": s.number(0)}
    | {"celsius": _maybe_celsius, "onset_c": _maybe_celsius, "gpu_hz": s.nil_or(s.number(0))}
    | {"sensor": s.nil_or(s.text(200))}
)
"""A calibration's progress on the wire (agent.cooling.calibrate's Progress)."""


def calibration(value: Any) -> None:
    """A check (shared.shapes) of a calibration on the wire: what ThrottlePoint.to_dict()
    writes, each field as from_dict() takes it."""
    try:
        ThrottlePoint.from_dict(value)
    except (ValueError, TypeError) as exc:
        raise s.Invalid("", f"is not a calibration: {exc}") from None


class NoThrottle(ValueError):
    """The load ran and the speed signal never dropped and stayed down: no onset to learn."""


def speed_signal(samples: Sequence[CalibrationSample]) -> str:
    """The signal the onset is read on: the GPU clock when every loaded poll has one, else the
    work rate (which every loaded poll has). One signal, not both: a rate on a shared machine
    moves with its neighbours' work, a clock does not."""
    loaded = [s for s in samples if s.phase == "sustained"]
    return "gpu clock" if loaded and all(s.gpu_hz for s in loaded) else "work rate"


def throttle_poll(
    sample: CalibrationSample, previous: CalibrationSample, signal: str
) -> ThrottlePoll:
    """The poll the throttle rule judges: the clock (the GPU's active share as read, else the
    load's own share of the interval), or the work per second over the interval."""
    if signal == "gpu clock":
        active = sample.running if sample.gpu_active is None else sample.gpu_active
        return ThrottlePoll(gpu_hz=sample.gpu_hz, gpu_active=active)
    interval = sample.time - previous.time
    rate = sample.work / interval if interval > 0 else None
    return ThrottlePoll(rate=rate, rate_unit=WORK_UNIT)


def find_throttle_point(
    samples: Sequence[CalibrationSample], source: str, simulated: bool, calibrated_at: float
) -> ThrottlePoint:
    """The throttle point in a calibration's samples (PHASES in time order). NoThrottle when
    the sustained load never throttled; ValueError when the samples cannot say (too few polls
    under load, no temperature at the onset)."""
    sustained = [i for i, s in enumerate(samples) if s.phase == "sustained" and i > 0]
    if len(sustained) < EARLY_READINGS + POLLS:
        raise ValueError(f"{len(sustained)} polls under load: too few to find a throttle point")
    signal = speed_signal(samples)
    polls = [throttle_poll(samples[i], samples[i - 1], signal) for i in sustained]
    verdicts = judge(polls)
    first = first_throttled(verdicts)
    if first is None:
        hottest = max((s.celsius for s in samples if s.celsius is not None), default=None)
        seen = "no reading" if hottest is None else f"{hottest:.1f} °C at the hottest"
        raise NoThrottle(f"the {signal} never dropped and stayed down ({seen})")
    at = sustained[first]
    before, after = samples[at - 1], samples[at]
    if before.celsius is None or after.celsius is None:
        raise ValueError("no temperature reading at the throttle onset")
    onset_time = (before.time + after.time) / 2
    tail = [(samples[i - 1], samples[i]) for i in sustained if samples[i].time >= onset_time]
    idle = [s.celsius for s in samples if s.phase == "idle" and s.celsius is not None]
    held = operating_point(samples, "held", signal)
    return ThrottlePoint(
        source=source,
        simulated=simulated,
        calibrated_at=calibrated_at,
        onset_c=_midpoint(before.celsius, after.celsius),
        sensor=after.sensor,
        sensor_onsets=sensor_onsets(before, after),
        time_to_throttle_s=max(0.0, onset_time - samples[sustained[0] - 1].time),
        signal=signal,
        reference=reference(polls[:first], signal),
        throttled=steady_point(tail, signal),
        held=held,
        duty_cycle=None if held is None else held.duty,
        start_c=idle[-1] if idle else samples[sustained[0]].celsius,
        evidence=throttled_evidence(verdicts[first:]),
    )


def sensor_onsets(before: CalibrationSample, after: CalibrationSample) -> dict[str, float]:
    """Every sensor's reading at the onset (between the two polls); a source that names only
    the sensor its reading is gives that one."""
    found = {
        name: _midpoint(before.sensors[name], value)
        for name, value in after.sensors.items()
        if name in before.sensors
    }
    if not found and after.sensor and before.celsius is not None and after.celsius is not None:
        found[after.sensor] = _midpoint(before.celsius, after.celsius)
    return found


def reference(before: Sequence[ThrottlePoll], signal: str) -> float:
    """What the rule measured the drop against (shared.cooling.throttle): the highest clock
    under load, or the best of the first EARLY_READINGS rates, before the onset; 0 when the
    load throttled from its first poll."""
    if signal == "gpu clock":
        return max((p.gpu_hz or 0.0 for p in before if p.clock_loaded), default=0.0)
    return max((p.rate or 0.0 for p in before[:EARLY_READINGS]), default=0.0)


def operating_point(
    samples: Sequence[CalibrationSample], phase: str, signal: str
) -> OperatingPoint | None:
    """The steady figures of one phase's polls (each with the interval before it, so a phase
    broken by another, a hold that rested to let the clock recover, counts only its own
    intervals); None when it has too few."""
    pairs = [(samples[i - 1], samples[i]) for i in range(1, len(samples))]
    return steady_point([(a, b) for a, b in pairs if b.phase == phase], signal)


def steady_point(
    intervals: Sequence[tuple[CalibrationSample, CalibrationSample]], signal: str
) -> OperatingPoint | None:
    """Work per wall second, duty, mean °C and clock over the intervals (each a poll and the
    one before it) that end in the last (1 - SETTLE_SHARE) of their time; None with fewer than
    POLLS there."""
    if not intervals:
        return None
    first, last = intervals[0][0].time, intervals[-1][1].time
    cut = first + (last - first) * SETTLE_SHARE
    steady = [(a, b) for a, b in intervals if a.time >= cut]
    seconds = sum(b.time - a.time for a, b in steady)
    if len(steady) < POLLS or seconds <= 0:
        return None
    temps = [b.celsius for _, b in steady if b.celsius is not None]
    clocks = [b.gpu_hz for _, b in steady if signal == "gpu clock" and b.running and b.gpu_hz]
    return OperatingPoint(
        work_rate=sum(b.work for _, b in steady) / seconds,
        duty=min(1.0, sum(_duty(b) * (b.time - a.time) for a, b in steady) / seconds),
        celsius=statistics.fmean(temps) if temps else None,
        clock_hz=statistics.fmean(clocks) if clocks else None,
        seconds=seconds,
    )


def hold_step(
    celsius: float | None, onset_c: float, recovered: bool, throttled: bool = False
) -> tuple[bool, bool]:
    """(run the load this poll, recovered) for the hold after the onset: rest until the reading
    falls RECOVER_BELOW_C under the onset, then run while it is under the cap (onset less
    HOLD_BELOW_C). No reading: rest (nothing says it is safe to heat). `throttled` (the last
    loaded poll read a lowered clock: a late poll let the die cross the onset) rests it until
    it recovers again: a hold at a lowered clock would measure a duty the full clock cannot
    sustain."""
    if throttled:
        return False, False
    if celsius is None:
        return False, recovered
    recovered = recovered or celsius <= onset_c - RECOVER_BELOW_C
    return recovered and celsius < onset_c - HOLD_BELOW_C, recovered


STALE_MARGIN_C = 2.0
"""Throttling that begins this far under a calibration's onset says the calibration no longer
holds (a dustier fan, a warmer room, a macOS update): a drop the rule sees starts at or above
the onset, since it needs POLLS low polls before it calls one."""
STALE_SEEN = 2
"""How many such beginnings make a calibration look stale: one could be a neighbour's heat."""


def passive_onsets(polls: Iterable[tuple[float | None, bool | None]]) -> list[float]:
    """Where throttling began in ordinary work, learned from the agent's samples ((°C,
    throttling) in time order): the reading of each poll the throttle rule first calls
    throttling after one it did not. A poll without a verdict (no load) ends a stretch."""
    onsets, before = [], False
    for celsius, throttling in polls:
        if throttling and not before and celsius is not None:
            onsets.append(celsius)
        before = bool(throttling)
    return onsets


def stale_note(onset_c: float, seen: Sequence[float]) -> str | None:
    """`looks stale: throttling began at 97.1 °C (3 times since)` (the median), when STALE_SEEN
    or more of the passive onsets `seen` since the calibration are STALE_MARGIN_C under its
    onset; None while it holds. Short: it ends the policy's origin, which displays cap."""
    below = [c for c in seen if c < onset_c - STALE_MARGIN_C]
    if len(below) < STALE_SEEN:
        return None
    median = statistics.median(below)
    return f"looks stale: throttling began at {median:.1f} °C ({len(below)} times since)"


def _duty(sample: CalibrationSample) -> float:
    """The share of its interval the work ran: the GPU's active share where the Mac reads it
    (the time the load occupied the GPU, whatever the CPU side did), else the share the load
    was let run."""
    return sample.running if sample.gpu_active is None else sample.gpu_active


def calibrated_thresholds(point: ThrottlePoint, stop_temp: float) -> dict[str, float]:
    """The thresholds a calibration sets: pause at the onset (the Mac held below where its
    firmware throttles), reduce the batch REDUCE_BELOW_ONSET_C under it; the stop stays the
    source's own (`stop_temp`), a safety limit no load run measures, unless the onset is at or
    above it."""
    onset = round(point.onset_c, 1)
    return {
        "max_speed_temp": onset - REDUCE_BELOW_ONSET_C,
        "pause_temp": onset,
        "stop_temp": max(stop_temp, onset + STOP_ABOVE_ONSET_C),
    }


REDUCE_BELOW_ONSET_C = 5.0
"""The reduce-batch tier's distance below the onset: a smaller batch while the Mac nears it."""
STOP_ABOVE_ONSET_C = 5.0
"""Where an onset reads at or above the source's stop, the stop is this far above it."""


def _midpoint(a: float, b: float) -> float:
    """The reading between two polls: the onset fell between them."""
    return (a + b) / 2


def _finite(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _number(
    data: Mapping[str, Any],
    key: str,
    low: float | None = None,
    high: float | None = None,
    optional: bool = False,
) -> Any:
    value = data.get(key)
    if value is None and optional:
        return None
    if (
        not _finite(value)
        or (low is not None and value < low)
        or (high is not None and value > high)
    ):
        raise ValueError(f"{key} must be a finite number in range, got {value!r}")
    return float(value)


def _text(data: Mapping[str, Any], key: str, optional: bool = False) -> Any:
    value = data.get(key)
    if value is None and optional:
        return None
    if not isinstance(value, str) or not value or len(value) > 200 or not value.isprintable():
        raise ValueError(f"{key} must be one line of text, got {value!r}")
    return value


def _flag(data: Mapping[str, Any], key: str) -> bool:
    value = data.get(key)
    if not isinstance(value, bool):
        raise ValueError(f"{key} must be true or false, got {value!r}")
    return value
