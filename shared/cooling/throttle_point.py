"""A Mac's throttle point, learned: what `agent calibrate` makes of a sustained MLX load run from
cold and then held below the point where the firmware started to throttle (docs/thermal.md,
Calibrating a Mac). Pure: samples in, a ThrottlePoint out; the load, the sensors and the clock
are agent.cooling.calibrate's.

The onset is where the speed signal (the GPU clock, else the CPU's P-cluster clock, else the
load's own work rate: issue 41's second signal, the only one on a Mac whose clock channel is
missing) first drops below its early level by DROP_MARGIN and stays down for DROP_POLLS polls,
read on every sensor. The duty cycle is the share of time the load ran while the Mac was held
at the onset; with the work rate at both operating points (throttled by the firmware, held
below onset) it says what preventing throttling costs on this Mac."""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

DROP_MARGIN = 0.05
"""A drop is the signal below (1 - DROP_MARGIN) of its early level: above the polls' own
jitter (an idle GPU's clock reads a few per cent apart interval to interval), well below the
15-65 % the firmware takes off a throttled GPU (issue 41's evidence)."""
DROP_POLLS = 3
"""Polls in a row the drop must last: a one-poll dip is a scheduling hiccup, not a throttle."""
REFERENCE_POLLS = 5
"""Polls under load, after the first (which began idle), whose median is the early level."""
SETTLE_SHARE = 0.5
"""The share of each operating phase left out before its steady figures are taken (the
firmware settling after onset, the hold's first approach to its cap)."""

HOLD_BELOW_C = 0.5
"""The hold's cap below the onset: the load runs while the reading is under it."""
RECOVER_BELOW_C = 5.0
"""Before the hold, the load rests until the reading is this far below the onset: a firmware
restores its clock only some degrees below where it lowered it (hysteresis), and a hold at a
lowered clock would measure a duty the full clock cannot sustain."""

PHASES = ("idle", "sustained", "recovering", "held")
"""A calibration's phases in order: idle from cold, flat out until the firmware throttles (and
a while after, for its operating point), resting until the clock can recover, held below the
onset (hold_step)."""

SIGNALS = ("gpu clock", "cpu clock", "work rate")
"""The speed signals, in the order one is picked: the first every loaded poll has."""


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
    cpu_hz: float | None = None
    work: float = 0.0
    running: float = 0.0


@dataclass(frozen=True)
class OperatingPoint:
    """Steady figures of one way of running the Mac: `work_rate` is work per second of wall
    time (pauses included), `duty` the share of that time the load ran."""

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
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ThrottlePoint:
        """ValueError naming the first field that is missing or not what to_dict() writes."""
        if not isinstance(data, Mapping):
            raise ValueError("not a map")
        known = set(cls.__dataclass_fields__)
        unknown = sorted(map(str, set(data) - known))
        if unknown:
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
        )


class NoThrottle(ValueError):
    """The load ran and the speed signal never dropped and stayed down: no onset to learn."""


def speed_signal(samples: Sequence[CalibrationSample]) -> str:
    """The signal the onset is read on: the GPU clock when every loaded poll has one, else the
    CPU's, else the work rate (which every loaded poll has)."""
    loaded = [s for s in samples if s.phase == "sustained"]
    if loaded and all(s.gpu_hz is not None for s in loaded):
        return "gpu clock"
    if loaded and all(s.cpu_hz is not None for s in loaded):
        return "cpu clock"
    return "work rate"


def signal_value(sample: CalibrationSample, previous: CalibrationSample, signal: str) -> float:
    """The sample's value of `signal` over its interval (work per second for the work rate)."""
    if signal == "gpu clock" and sample.gpu_hz is not None:
        return sample.gpu_hz
    if signal == "cpu clock" and sample.cpu_hz is not None:
        return sample.cpu_hz
    interval = sample.time - previous.time
    return sample.work / interval if interval > 0 else 0.0


def lasting_drop(values: Sequence[float], reference: float) -> int | None:
    """The index of the first value below (1 - DROP_MARGIN) of the reference that starts
    DROP_POLLS values whose mean is below it too (a firmware that steps its clock down and up
    around its limit stays down on average); None when none does."""
    floor = reference * (1.0 - DROP_MARGIN)
    for index in range(len(values) - DROP_POLLS + 1):
        if values[index] < floor and statistics.fmean(values[index : index + DROP_POLLS]) < floor:
            return index
    return None


def find_throttle_point(
    samples: Sequence[CalibrationSample], source: str, simulated: bool, calibrated_at: float
) -> ThrottlePoint:
    """The throttle point in a calibration's samples (idle, then sustained, then held, in time
    order). NoThrottle when the sustained load never throttled; ValueError when the samples
    cannot say (too few polls under load, no temperature at the onset)."""
    sustained = [i for i, s in enumerate(samples) if s.phase == "sustained" and i > 0]
    if len(sustained) < REFERENCE_POLLS + 1 + DROP_POLLS:
        raise ValueError(f"{len(sustained)} polls under load: too few to find a throttle point")
    signal = speed_signal(samples)
    values = [signal_value(samples[i], samples[i - 1], signal) for i in sustained]
    reference = statistics.median(values[1 : 1 + REFERENCE_POLLS])
    if not reference > 0:
        raise ValueError(f"the {signal} read {reference:g} under load: it cannot show a throttle")
    first = lasting_drop(values[1 + REFERENCE_POLLS :], reference)
    if first is None:
        hottest = max((s.celsius for s in samples if s.celsius is not None), default=None)
        seen = "no reading" if hottest is None else f"{hottest:.1f} °C at the hottest"
        raise NoThrottle(f"the {signal} never dropped and stayed down ({seen})")
    at = sustained[first + 1 + REFERENCE_POLLS]
    before, after = samples[at - 1], samples[at]
    if before.celsius is None or after.celsius is None:
        raise ValueError("no temperature reading at the throttle onset")
    load_start = samples[sustained[0] - 1].time
    onset_time = (before.time + after.time) / 2
    tail = [samples[i] for i in sustained if samples[i].time >= onset_time]
    idle = [s.celsius for s in samples if s.phase == "idle" and s.celsius is not None]
    held = operating_point(samples, "held", signal)
    return ThrottlePoint(
        source=source,
        simulated=simulated,
        calibrated_at=calibrated_at,
        onset_c=_midpoint(before.celsius, after.celsius),
        sensor=after.sensor,
        sensor_onsets={
            name: _midpoint(before.sensors[name], value)
            for name, value in after.sensors.items()
            if name in before.sensors
        },
        time_to_throttle_s=max(0.0, onset_time - load_start),
        signal=signal,
        reference=reference,
        throttled=steady_point(tail, signal),
        held=held,
        duty_cycle=None if held is None else held.duty,
        start_c=idle[-1] if idle else samples[sustained[0]].celsius,
    )


def operating_point(
    samples: Sequence[CalibrationSample], phase: str, signal: str
) -> OperatingPoint | None:
    """The steady figures of one phase's polls; None when it has too few."""
    return steady_point([s for s in samples if s.phase == phase], signal)


def steady_point(polls: Sequence[CalibrationSample], signal: str) -> OperatingPoint | None:
    """Work per wall second, duty, mean °C and clock over the intervals in the last
    (1 - SETTLE_SHARE) of the polls' time; None with fewer than DROP_POLLS intervals there."""
    if len(polls) < 2:
        return None
    cut = polls[0].time + (polls[-1].time - polls[0].time) * SETTLE_SHARE
    steady = [(a, b) for a, b in zip(polls, polls[1:], strict=False) if a.time >= cut]
    seconds = sum(b.time - a.time for a, b in steady)
    if len(steady) < DROP_POLLS or seconds <= 0:
        return None
    temps = [b.celsius for _, b in steady if b.celsius is not None]
    clock = {"gpu clock": "gpu_hz", "cpu clock": "cpu_hz"}.get(signal)
    clocks = [v for _, b in steady if clock and b.running > 0 and (v := getattr(b, clock))]
    return OperatingPoint(
        work_rate=sum(b.work for _, b in steady) / seconds,
        duty=min(1.0, sum(b.running * (b.time - a.time) for a, b in steady) / seconds),
        celsius=statistics.fmean(temps) if temps else None,
        clock_hz=statistics.fmean(clocks) if clocks else None,
        seconds=seconds,
    )


def hold_step(celsius: float | None, onset_c: float, recovered: bool) -> tuple[bool, bool]:
    """(run the load this poll, recovered) for the hold after the onset: rest until the reading
    falls RECOVER_BELOW_C under the onset, then run while it is under the cap (onset less
    HOLD_BELOW_C). No reading: rest (nothing says it is safe to heat)."""
    if celsius is None:
        return False, recovered
    recovered = recovered or celsius <= onset_c - RECOVER_BELOW_C
    return recovered and celsius < onset_c - HOLD_BELOW_C, recovered


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
