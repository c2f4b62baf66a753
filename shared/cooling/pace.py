"""The pace tier's controller: the duty cycle that holds a Mac just under a temperature cap,
and the slices it is applied in (docs/thermal.md, "The pace tier").

Between reduce-batch and pause. A pause stops a job for as long as the Mac takes to cool
(seconds); pacing instead lets it run `duty` of every slice of `slice_s` (well under a second)
and stops it for the rest, so the heat it makes matches what the Mac sheds at the cap. The duty
comes from a PI controller on the error between the set point (the cap less PACE_MARGIN_C) and
the temperature, with anti-windup (the integral is clamped to what the duty can express and
does not grow while the output is saturated the same way); the clock is a second input where a
reading has one: a clock below the sustained one means the firmware throttles already, which
the controller treats as heat above the set point. When even the minimum duty cannot hold the
cap (PACE_HOLD_POLLS polls above it at the minimum) the rule pauses, until the set point is
reached again.

Slices are aligned on the wall clock (slice k runs from k·slice_s, the job first, then the stop),
so every rank of a gang that agrees on the duty stops and runs in the same slice with no
message per slice: their skew is their clocks' offset plus a signal's latency.

Pure: numbers in, numbers out; the supervisor (agent.cooling.pacer) sends the signals.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

PACE_SLICE_S = 0.2
"""Default slice: five a second. Short enough that a stop (at most slice·(1 − min duty)) is a
small fraction of Metal's ~5 s command-buffer watchdog and of the die's thermal time constant
(tens of seconds), so the die sees the average power; long enough that SIGSTOP/SIGCONT's cost
(microseconds) and a Python supervisor's timer jitter (about a millisecond) stay under 1 %."""
SLICE_RANGE_S = (0.05, 0.5)
"""The slices a policy may ask for: 50 ms (timer jitter becomes a few % of the slice) to 0.5 s
("well under a second": a longer stop is what a pause is)."""

PACE_MIN_DUTY = 0.2
"""Default lowest duty: the job keeps at least a fifth of its speed while paced. Below that a
pause does the same for the heat, and pacing that far down means the cap is close to idle."""
MIN_DUTY_RANGE = (0.05, 0.9)

PACE_MARGIN_C = 2.0
"""The set point sits this far under the cap. A firmware that throttled at its limit restores
the clock only once the die is back under the limit less its hysteresis (2 °C in the plant's
model, shared.cooling.plant), so a cap at the throttle onset must be held below that, and the
controller's overshoot on a step of load (under a degree at a 1 s poll) stays under the cap.
On the fanless plant it costs 3 % of the work the cap itself would allow (docs/thermal.md)."""
PACE_GAIN_P = 0.5
"""Duty per °C of error: a degree over the set point halves the duty at once. Strong, because
a job of several busy threads (MLX's CPU stream beside its main thread) heats alike until its
duty is under 1/threads: the controller must get there within a degree or two."""
PACE_GAIN_I = 0.05
"""Duty per °C·s of error: a degree over the set point for 10 s cuts another half. The die's
time constant is minutes (the fanless plant's is 860 s), so the integral finds the steady duty
well inside it without oscillating: closed-loop runs against the plant settle at the set point
with at most a degree of overshoot for up to 15 plant seconds a poll (docs/thermal.md)."""
CLOCK_MARGIN = 0.03
"""A clock more than 3 % under the sustained one counts as throttling (DVFS steps on Apple
GPUs are 5–10 % apart, so a smaller dip is averaging noise)."""
CLOCK_ERROR_C = 50.0
"""°C of error per unit of clock lost when throttling: 10 % below the sustained clock acts
like 5 °C over the set point."""
PACE_HOLD_POLLS = 30
"""Polls at the minimum duty above the cap after which pacing gives way to a pause (30 s at
the default 1 s poll): the Mac heats even at a fifth of the work, so something else heats it."""
MAX_STEP_S = 10.0
"""The longest gap between two readings integrated as one: a longer one (a sensor that came
back) counts as this, so a gap never winds the integral."""


@dataclass(frozen=True)
class PaceSettings:
    """A policy's pace tier: the cap (°C), the slice (s), the lowest duty."""

    cap: float
    slice_s: float = PACE_SLICE_S
    min_duty: float = PACE_MIN_DUTY

    @property
    def set_point(self) -> float:
        return self.cap - PACE_MARGIN_C


def check_pace(
    cap: float | None,
    slice_s: float,
    min_duty: float,
    pause_temp: float,
    name: Callable[[str], str] = str,
) -> None:
    """ValueError naming the first pace parameter out of range (by `name` of its key: a
    policy's key, or a command's option)."""
    if cap is not None and not (math.isfinite(cap) and PACE_MARGIN_C < cap <= pause_temp):
        raise ValueError(
            f"{name('pace_temp')} must be above {PACE_MARGIN_C:g} °C and at most "
            f"{name('pause_temp')} {pause_temp:g} °C (pacing holds below the pause), got {cap:g}"
        )
    low, high = SLICE_RANGE_S
    if not (math.isfinite(slice_s) and low <= slice_s <= high):
        raise ValueError(
            f"{name('pace_slice')} must be {low:g} to {high:g} seconds, got {slice_s:g}"
        )
    low, high = MIN_DUTY_RANGE
    if not (math.isfinite(min_duty) and low <= min_duty <= high):
        raise ValueError(f"{name('pace_min_duty')} must be {low:g} to {high:g}, got {min_duty:g}")


@dataclass(frozen=True)
class Pacing:
    """The controller's state: the duty now (1: full speed, not paced), its integral term,
    the time of the reading it last used, how many polls in a row the minimum duty has not
    held the cap (`over`), and whether that handed over to a pause (`holding`)."""

    duty: float = 1.0
    integral: float = 0.0
    at: float | None = None
    over: int = 0
    holding: bool = False

    @property
    def paced(self) -> bool:
        return self.duty < 1.0


def clock_error(clock_ratio: float | None) -> float | None:
    """The error (°C, negative) a clock below the sustained one stands for; None when the clock
    is unknown or within CLOCK_MARGIN of it."""
    if clock_ratio is None or not math.isfinite(clock_ratio) or clock_ratio >= 1 - CLOCK_MARGIN:
        return None
    return -(1.0 - max(0.0, clock_ratio)) * CLOCK_ERROR_C


def advance(
    pacing: Pacing,
    settings: PaceSettings,
    celsius: float,
    at: float,
    clock_ratio: float | None = None,
    paused: bool = False,
) -> Pacing:
    """The controller after one reading taken at `at` (s, any clock that only goes forward).
    While the job is paused the integral is frozen (the duty is not what runs then) and only
    the hand-over to and from the pause is tracked."""
    error = settings.set_point - celsius
    by_clock = clock_error(clock_ratio)
    if by_clock is not None:
        error = min(error, by_clock)
    dt = 0.0 if pacing.at is None else min(max(0.0, at - pacing.at), MAX_STEP_S)
    over = pacing.over + 1 if pacing.duty <= settings.min_duty and celsius > settings.cap else 0
    holding = pacing.holding or over >= PACE_HOLD_POLLS
    if holding and celsius <= settings.set_point:
        holding, over = False, 0
    if paused:
        return replace(pacing, at=at, over=over, holding=holding)
    proportional = PACE_GAIN_P * error
    integral = pacing.integral + PACE_GAIN_I * error * dt
    # anti-windup: the integral goes no further than what brings the duty to its bound (a
    # whole poll's step may overshoot it: refusing the step would leave the error standing)
    if error < 0:
        integral = max(integral, min(pacing.integral, settings.min_duty - 1.0 - proportional))
    elif error > 0:
        integral = min(integral, max(pacing.integral, -proportional))
    integral = min(0.0, max(settings.min_duty - 1.0, integral))
    duty = min(1.0, max(settings.min_duty, 1.0 + proportional + integral))
    return Pacing(duty, integral, at, over, holding)


def slice_phase(now: float, slice_s: float, duty: float) -> tuple[bool, float]:
    """Whether the job runs at wall-clock time `now` under `duty`, and when that next changes:
    slice k is [k·slice_s, (k+1)·slice_s), the job running for its first duty·slice_s."""
    start = math.floor(now / slice_s) * slice_s
    run_until = start + duty * slice_s
    if now < run_until:
        return True, run_until
    return False, start + slice_s


def pace_text(duty: float | None) -> str:
    """`pace 62 %`: a paced state as tables show it."""
    return "pace" if duty is None else f"pace {duty * 100:.0f} %"


@dataclass(frozen=True)
class ClockReference:
    """The sustained GPU clock a clock reading is compared with: the highest seen while the GPU
    was active for at least MIN_ACTIVE of the interval (a paced job keeps it active for about
    its duty), or a calibrated one given at the start."""

    sustained_hz: float | None = None


MIN_ACTIVE = 0.05
"""An idle GPU sits in a low state by choice: below this active share its clock says nothing."""


def clock_ratio(
    reference: ClockReference, gpu_hz: float | None, gpu_active: float | None
) -> tuple[ClockReference, float | None]:
    """The reference after this reading, and the clock over the sustained one (None when
    either is unknown, or the GPU was idle)."""
    if gpu_hz is None or gpu_active is None or not gpu_hz > 0 or not gpu_active >= MIN_ACTIVE:
        return reference, None
    sustained = max(reference.sustained_hz or 0.0, gpu_hz)
    return ClockReference(sustained), gpu_hz / sustained
