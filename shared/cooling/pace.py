"""The pace tier's controller: the duty cycle that holds a Mac just under a temperature cap,
and the slices it is applied in (docs/thermal.md, "The pace tier").

Between reduce-batch and pause. A pause stops a job for as long as the Mac takes to cool
(seconds); pacing instead lets it run `duty` of every slice of `slice_s` (well under a second)
and stops it for the rest, so the heat it makes matches what the Mac sheds at the cap. The duty
comes from a PI controller on the error between the set point and the temperature, counted in
margins: the set point sits one margin under the cap, and the margin is what the die rose in
one poll at full speed (learned from the readings) plus a spare PACE_SPARE_C, at most
PACE_MARGIN_C: a die that heats a tenth of a degree a poll is held 0.4 °C under the cap, one
that heats a degree a poll 1.3 °C under it, with the same loop behaviour. Anti-windup: the
integral is clamped to what the duty can express and does not grow while the output is saturated
the same way. The clock is a second input where a reading has one: a clock below the sustained
one means the firmware throttles already, which the controller treats as heat above the set
point. When even the minimum duty cannot hold the cap (PACE_HOLD_POLLS polls above it at the
minimum) the rule pauses, until the set point is reached again.

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
"""The widest margin, and the margin before the die's rise per poll is known: the set point then
sits 2 °C under the cap. A rise learned larger than this (a poll far longer than the die's
reaction) still counts as this."""
PACE_SPARE_C = 0.3
"""Added to the rise per poll in the margin. A job of several busy threads heats alike until its
duty is under 1/threads, so its first poll over the set point need not cool it; and a reading
resolves a tenth of a degree at best. Closed-loop against the fanless plant (one and two busy
threads, 1 to 15 plant seconds a poll) the die then stays under the cap (docs/thermal.md, The
pace tier); without it a two-thread job crossed it at 3-5 plant seconds a poll."""
PACE_GAIN_P = 1.0
"""Duty per margin of error: at the cap (one margin over the set point) the proportional term
alone takes the duty to its minimum, so the next poll's rise does not carry the die over it."""
PACE_GAIN_I = 0.1
"""Duty per margin·s of error. The die's time constant is minutes (the fanless plant's 860 s),
so the integral finds the steady duty well inside it without oscillating."""
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

    def set_point(self, pacing: Pacing) -> float:
        """The temperature the controller holds: the cap less `pacing`'s margin."""
        return self.cap - pacing.margin


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
    held the cap (`over`), whether that handed over to a pause (`holding`), the last reading
    (°C) and the die's rise over one poll at full speed (°C, None until seen)."""

    duty: float = 1.0
    integral: float = 0.0
    at: float | None = None
    over: int = 0
    holding: bool = False
    celsius: float | None = None
    rise: float | None = None

    @property
    def paced(self) -> bool:
        return self.duty < 1.0

    @property
    def margin(self) -> float:
        """How far under the cap the set point sits: the rise per poll at full speed plus
        PACE_SPARE_C, at most PACE_MARGIN_C (also the margin until a rise is seen)."""
        if self.rise is None:
            return PACE_MARGIN_C
        return min(self.rise + PACE_SPARE_C, PACE_MARGIN_C)


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
    rise = learned_rise(pacing, celsius, paused)
    learned = replace(pacing, rise=rise, celsius=celsius)
    set_point, margin = settings.set_point(learned), learned.margin
    error = set_point - celsius
    by_clock = clock_error(clock_ratio)
    if by_clock is not None:
        error = min(error, by_clock)
    error /= margin
    dt = 0.0 if pacing.at is None else min(max(0.0, at - pacing.at), MAX_STEP_S)
    over = pacing.over + 1 if pacing.duty <= settings.min_duty and celsius > settings.cap else 0
    holding = pacing.holding or over >= PACE_HOLD_POLLS
    if holding and celsius <= set_point:
        holding, over = False, 0
    if paused:
        return replace(learned, at=at, over=over, holding=holding)
    proportional = PACE_GAIN_P * error
    integral = pacing.integral + PACE_GAIN_I * error * dt
    unclamped = 1.0 + proportional + integral
    if (unclamped < settings.min_duty and error < 0) or (unclamped > 1.0 and error > 0):
        integral = pacing.integral  # saturated: integrating further would only wind up
    integral = min(0.0, max(settings.min_duty - 1.0, integral))
    duty = min(1.0, max(settings.min_duty, 1.0 + proportional + integral))
    return Pacing(duty, integral, at, over, holding, celsius, rise)


RISE_WEIGHT = 0.5
"""The newest poll's share of the learned rise: the polls just before the set point (where the
die heats slowest, nearest its steady state) soon outweigh the colder ones before them."""


def learned_rise(pacing: Pacing, celsius: float, paused: bool) -> float | None:
    """The die's rise over one poll at full speed, updated when the last poll ran unpaced
    and the die rose."""
    if paused or pacing.paced or pacing.holding or pacing.celsius is None:
        return pacing.rise
    step = celsius - pacing.celsius
    if step <= 0:
        return pacing.rise
    return step if pacing.rise is None else RISE_WEIGHT * step + (1 - RISE_WEIGHT) * pacing.rise


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
