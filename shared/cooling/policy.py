"""The cooling policy as data, one pure decision function (`decide`: what a reading asks for),
and the one rule for a supervised job (`react`, applied poll after poll by `CoolingGate`: what
is done about it, a missing reading included).

Pure on purpose: the agent applies it locally, the coordinator ships it to agents (msgpack), and
tests exercise every state without a sensor, a thread or a clock.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields, replace
from enum import Enum
from typing import Any, Protocol

from shared.cooling.pace import (
    PACE_MIN_DUTY,
    PACE_SLICE_S,
    PaceSettings,
    Pacing,
    advance,
    check_pace,
)


class CoolingState(str, Enum):
    """What the policy asks for, ordered from harmless to fatal."""

    OK = "ok"
    REDUCE_BATCH = "reduce_batch"
    PACE = "pace"
    PAUSE = "pause"
    STOP = "stop"

    @property
    def severity(self) -> int:
        return _SEVERITY[self]


_SEVERITY = {state: rank for rank, state in enumerate(CoolingState)}
THRESHOLD_RANGE_C = (-50.0, 200.0)
"""Where a threshold may lie: no Mac runs outside it, so one beyond it is a typo (10**9 never
stops; issue 42: every number of the Python API bounded)."""
MOST_PAUSE_DURATION_S = 3600.0
"""A paused job reads the temperature again at least this often."""

# Sources without degrees (powermetrics' thermal sampler on Apple Silicon, NSProcessInfo) only give
# a level. powermetrics says Nominal/Moderate/Heavy/Trapping/Sleeping; NSProcessInfo says
# Nominal/Fair/Serious/Critical. Moderate sits between nominal and heavy, hence reduce_batch.
PRESSURE_STATES: dict[str, CoolingState] = {
    "nominal": CoolingState.OK,
    "fair": CoolingState.OK,
    "moderate": CoolingState.REDUCE_BATCH,
    "heavy": CoolingState.PAUSE,
    "serious": CoolingState.PAUSE,
    "trapping": CoolingState.STOP,
    "sleeping": CoolingState.STOP,
    "critical": CoolingState.STOP,
}


@dataclass(frozen=True)
class ThermalPolicy:
    """The seed's thresholds (°C) and pause step (s), plus an optional resume hysteresis (°C)
    and an optional pace tier (shared.cooling.pace).

    Above max_speed_temp the trainer should shrink its batch; at pause_temp it pauses; at stop_temp
    it stops. A pause ends below pause_temp - hysteresis (0 keeps the seed's behaviour). With a
    pace_temp (a cap under pause_temp: the Mac's calibrated throttle onset, or an operator's) a
    supervised job is duty-cycled in slices of pace_slice seconds, never below pace_min_duty, to
    hold the Mac under it. None (the default) leaves throttling to the firmware: holding below
    the onset costs throughput, so preventing throttling is the lab's choice (docs/thermal.md).
    """

    max_speed_temp: float = 75.0
    pause_temp: float = 85.0
    stop_temp: float = 95.0
    pause_duration: float = 0.5
    hysteresis: float = 0.0
    pace_temp: float | None = None
    pace_slice: float = PACE_SLICE_S
    pace_min_duty: float = PACE_MIN_DUTY

    def __post_init__(self) -> None:
        for name in ("max_speed_temp", "pause_temp", "stop_temp"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"{name} must be a number (°C), got {value!r}")
            if not math.isfinite(value):  # NaN is never "out of order": it compares false
                raise ValueError(f"{name} must be a finite number (°C), got {value}")
            if not THRESHOLD_RANGE_C[0] <= value <= THRESHOLD_RANGE_C[1]:
                low, high = THRESHOLD_RANGE_C
                raise ValueError(f"{name} must be {low:g} to {high:g} °C, got {value:g}")
        if not self.max_speed_temp < self.pause_temp < self.stop_temp:
            raise ValueError(
                "thresholds out of order: need max_speed_temp < pause_temp < stop_temp, got "
                f"max_speed_temp={self.max_speed_temp}, pause_temp={self.pause_temp}, "
                f"stop_temp={self.stop_temp}"
            )
        if not (0 < self.pause_duration <= MOST_PAUSE_DURATION_S):  # NaN compares false
            raise ValueError(
                f"pause_duration must be > 0 and at most {MOST_PAUSE_DURATION_S:g} seconds, "
                f"got {self.pause_duration:g}"
            )
        if not (math.isfinite(self.hysteresis) and self.hysteresis >= 0):
            raise ValueError(f"hysteresis must be >= 0 °C, got {self.hysteresis}")
        if self.hysteresis >= self.pause_temp:
            raise ValueError(
                f"hysteresis {self.hysteresis} °C must be below pause_temp "
                f"{self.pause_temp} °C, or a pause could never end"
            )
        check_pace(self.pace_temp, self.pace_slice, self.pace_min_duty, self.pause_temp)

    @property
    def pace(self) -> PaceSettings | None:
        """The pace tier, when the policy has one."""
        if self.pace_temp is None:
            return None
        return PaceSettings(self.pace_temp, self.pace_slice, self.pace_min_duty)

    @property
    def resume_temp(self) -> float:
        """Below this a pause ends."""
        return self.pause_temp - self.hysteresis

    def to_dict(self) -> dict[str, float]:
        """Every number; a pace key only where it is not its default, so a policy without
        pacing is the same map an older peer knows (docs/protocol.md §11)."""
        data = asdict(self)
        for key in PACE_KEYS:
            if data[key] == PACE_DEFAULTS[key]:
                del data[key]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ThermalPolicy:
        """Missing keys take the defaults; unknown keys are an error, not silently dropped; a
        nil pace_temp is no pace tier."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(map(str, set(data) - known))  # a key may be anything on the wire
        if unknown:
            raise ValueError(f"unknown ThermalPolicy keys: {', '.join(unknown)}")
        return cls(**{key: _number(key, value) for key, value in data.items()})


def _number(key: str, value: Any) -> float | None:
    if value is None and key == "pace_temp":
        return None
    try:
        return float(value)
    except TypeError:
        raise ValueError(f"{key} must be a number, got {value!r}") from None


PACE_DEFAULTS: dict[str, float | None] = {
    "pace_temp": None,
    "pace_slice": PACE_SLICE_S,
    "pace_min_duty": PACE_MIN_DUTY,
}
"""The policy's optional keys, the pace tier's, and their defaults (sent only when not)."""
PACE_KEYS = tuple(PACE_DEFAULTS)


def pressure_state(pressure: str | None) -> CoolingState | None:
    """The state a pressure level asks for; None when there is no level or it is not one we know."""
    if pressure is None:
        return None
    return PRESSURE_STATES.get(pressure.strip().lower())


def temperature_state(
    policy: ThermalPolicy, celsius: float | None, currently_paused: bool = False
) -> CoolingState | None:
    """The state a temperature asks for; None without a temperature."""
    if celsius is None:
        return None
    if celsius >= policy.stop_temp:
        return CoolingState.STOP
    if celsius >= policy.pause_temp or (currently_paused and celsius >= policy.resume_temp):
        return CoolingState.PAUSE
    if celsius >= policy.max_speed_temp:
        return CoolingState.REDUCE_BATCH
    return CoolingState.OK


def decide(
    policy: ThermalPolicy,
    celsius: float | None,
    pressure: str | None = None,
    currently_paused: bool = False,
) -> CoolingState:
    """The more severe of what the temperature and the pressure level ask for.

    Nothing known (no degrees, no recognised level) is OK: without a reading the seed does nothing,
    and inventing a state would be worse.
    """
    by_degrees = temperature_state(policy, celsius, currently_paused)
    by_pressure = pressure_state(pressure)
    if by_pressure is None:
        return CoolingState.OK if by_degrees is None else by_degrees
    if by_degrees is None:
        return by_pressure
    return max(by_degrees, by_pressure, key=_SEVERITY.__getitem__)


# --- the one cooling rule for a supervised job ------------------------------------------------

MISSING_POLLS_TO_RESUME = 10
"""Consecutive polls without a reading after which a paused job resumes (10 s at the default
1 s poll). A missing reading holds a pause until then, so a sensor hiccup never lets a hot job
run; a sensor that stays dead never parks a job for ever, and the resume says why. Outside a
pause a missing reading changes nothing."""

HOT_POLLS_TO_STOP = 3
"""Consecutive polls at or above stop_temp that stop a job; fewer pause it. The hottest key of a
die jumps for one poll under a burst of work: a spike is a reason to pause, not to end a
fine-tune."""

STUCK_POLLS_TO_STOP = 120
"""Consecutive polls of a pause at or above pause_temp that stop a job (2 min at the default
1 s poll): pausing the job has not cooled the machine, so it is in danger from something the
pause cannot help, and the job must go."""


class JobState(str, Enum):
    RUNNING = "running"
    PAUSED = "paused"
    STOPPING = "stopping"


class Action(str, Enum):
    PAUSE = "pause"
    RESUME = "resume"
    STOP = "stop"
    REDUCE_BATCH = "reduce_batch"
    RESTORE_BATCH = "restore_batch"
    PACE = "pace"
    PACE_END = "pace_end"


@dataclass(frozen=True)
class Supervision:
    """What has been done to a job so far: its state, whether it was told to reduce, how many
    polls in a row have had no reading, how many have read at or above stop_temp (`hot`), and
    how many of its pause have read at or above pause_temp (`stuck`). A poll without a reading
    leaves `hot` and `stuck` as they were: it says nothing of the heat. `paced`: the job runs
    duty-cycled at `pacing.duty` (the pace tier's controller, kept through a pause)."""

    job: JobState = JobState.RUNNING
    reduced: bool = False
    missing: int = 0
    hot: int = 0
    stuck: int = 0
    paced: bool = False
    pacing: Pacing = Pacing()

    @property
    def duty(self) -> float | None:
        """The share of each slice the job runs, while it is paced."""
        return self.pacing.duty if self.paced else None


@dataclass(frozen=True)
class Decision:
    """The supervision after one poll, what the rule made of the reading (None: no reading,
    nothing decided; a spike above stop_temp is `pause`), the actions that take the job there,
    and why when the reading alone does not say (a stop, a resume without a sensor)."""

    state: Supervision
    cooling: CoolingState | None
    actions: tuple[Action, ...] = ()
    reason: str | None = None


def knows_nothing(celsius: float | None, pressure: str | None) -> bool:
    """No degrees and no pressure level we know: decide() would call that OK."""
    return celsius is None and pressure_state(pressure) is None


def stop_reason(
    policy: ThermalPolicy, celsius: float | None, pressure: str | None, hot: int, stuck: int
) -> str | None:
    """Why this poll stops the job, or None: pressure Trapping/Sleeping/Critical at once, degrees
    only when they persist (HOT_POLLS_TO_STOP at or above stop_temp, or STUCK_POLLS_TO_STOP of a
    pause at or above pause_temp)."""
    if pressure_state(pressure) is CoolingState.STOP:
        return f"thermal pressure {pressure}"
    if hot >= HOT_POLLS_TO_STOP:
        return f"{celsius:.1f} °C, at or above stop_temp {policy.stop_temp:g} °C for {hot} polls"
    if stuck >= STUCK_POLLS_TO_STOP:
        return (
            f"{celsius:.1f} °C, still at or above pause_temp {policy.pause_temp:g} °C after "
            f"{stuck} polls of pause"
        )
    return None


POLL_S = 1.0
"""The gap react() assumes between two readings given without a time: the default poll."""


def pace_reading(
    current: Supervision,
    policy: ThermalPolicy,
    celsius: float | None,
    at: float | None,
    clock_ratio: float | None,
) -> Pacing:
    """The pace tier's controller after this poll (shared.cooling.pace): reset without a pace
    tier, unchanged without degrees."""
    settings = policy.pace
    if settings is None:
        return Pacing()
    if celsius is None:
        return current.pacing
    if at is None:
        at = (current.pacing.at or 0.0) + POLL_S
    paused = current.job is JobState.PAUSED
    return advance(current.pacing, settings, celsius, at, clock_ratio, paused)


def pace_reason(policy: ThermalPolicy, pacing: Pacing, celsius: float | None) -> str:
    """Why the job is paced, or why pacing gave way to a pause."""
    assert policy.pace_temp is not None
    degrees = "no reading" if celsius is None else f"{celsius:.1f} °C"
    if pacing.holding:
        return (
            f"pacing cannot hold {policy.pace_temp:g} °C: {degrees} at the lowest duty "
            f"{policy.pace_min_duty:.0%} for {pacing.over} polls"
        )
    return (
        f"{degrees}, cap {policy.pace_temp:g} °C: running {pacing.duty:.0%} of every "
        f"{policy.pace_slice:g} s"
    )


def react(
    current: Supervision,
    policy: ThermalPolicy,
    celsius: float | None,
    pressure: str | None = None,
    at: float | None = None,
    clock_ratio: float | None = None,
) -> Decision:
    """The next supervision after one poll (`celsius` and `pressure` both None: no reading), and
    its actions. A stop is final and needs stop_reason(); a reading at or above stop_temp
    short of it pauses. A pause ends when decide() (with the hysteresis of a paused job) asks
    for less, or after MISSING_POLLS_TO_RESUME polls without a reading; reduce/restore and
    pace/pace_end are told once per change. With a pace tier, `at` (the reading's time, s)
    and `clock_ratio` (the clock over the sustained one, None when unknown) feed its controller;
    a pace that cannot hold pauses."""
    if current.job is JobState.STOPPING:
        return Decision(current, None)
    paused = current.job is JobState.PAUSED
    if knows_nothing(celsius, pressure):
        missing = current.missing + 1
        if paused and missing >= MISSING_POLLS_TO_RESUME:
            reason = f"no reading for {missing} polls: resuming without a sensor"
            resumed = replace(current, job=JobState.RUNNING, missing=0, stuck=0)
            actions = (Action.RESUME, Action.PACE) if current.pacing.paced else (Action.RESUME,)
            return Decision(replace(resumed, paced=current.pacing.paced), None, actions, reason)
        return Decision(replace(current, missing=missing), None)
    hot, stuck = current.hot, current.stuck  # a level without degrees says nothing of them
    if celsius is not None:
        hot = hot + 1 if celsius >= policy.stop_temp else 0
        stuck = stuck + 1 if paused and celsius >= policy.pause_temp else 0
    pacing = pace_reading(current, policy, celsius, at, clock_ratio)
    reason = stop_reason(policy, celsius, pressure, hot, stuck)
    if reason is not None:
        stopping = Supervision(JobState.STOPPING, current.reduced, hot=hot, stuck=stuck)
        return Decision(stopping, CoolingState.STOP, (Action.STOP,), reason)
    cooling = decide(policy, celsius, pressure, currently_paused=paused)
    if cooling in (CoolingState.PAUSE, CoolingState.STOP) or pacing.holding:
        pausing = Supervision(JobState.PAUSED, current.reduced, hot=hot, stuck=stuck, pacing=pacing)
        by_pace = cooling not in (CoolingState.PAUSE, CoolingState.STOP)
        why = pace_reason(policy, pacing, celsius) if by_pace else None
        actions = () if paused else (Action.PAUSE,)
        return Decision(pausing, CoolingState.PAUSE, actions, why if actions else None)
    actions = [Action.RESUME] if paused else []
    reduce = cooling is CoolingState.REDUCE_BATCH
    if reduce != current.reduced:
        actions.append(Action.REDUCE_BATCH if reduce else Action.RESTORE_BATCH)
    if pacing.paced != current.paced:
        actions.append(Action.PACE if pacing.paced else Action.PACE_END)
    why = pace_reason(policy, pacing, celsius) if Action.PACE in actions else None
    state = Supervision(JobState.RUNNING, reduce, hot=hot, paced=pacing.paced, pacing=pacing)
    return Decision(state, CoolingState.PACE if pacing.paced else cooling, tuple(actions), why)


class Reading(Protocol):
    """What the rule reads of a poll (the agent's ThermalReading has it)."""

    @property
    def celsius(self) -> float | None: ...

    @property
    def pressure(self) -> str | None: ...

    @property
    def time(self) -> float: ...

    @property
    def die_time(self) -> float | None:
        """The die's own clock where it runs apart from the wall's (a simulated plant's)."""


class CoolingGate:
    """The rule applied poll after poll: one per supervised job, fed every poll (None when the
    poll had no reading). Not thread-safe by itself; its users lock around it where threads
    share it."""

    def __init__(self) -> None:
        self.supervision = Supervision()

    def observe(
        self, policy: ThermalPolicy, reading: Reading | None, clock_ratio: float | None = None
    ) -> Decision:
        decision = react(self.supervision, policy, *_inputs(reading), clock_ratio)
        self.supervision = decision.state
        return decision

    @property
    def state(self) -> CoolingState:
        """What the job lives under now: stop, pause, pace, reduce_batch or ok."""
        return supervision_state(self.supervision)


def _inputs(reading: Reading | None) -> tuple[float | None, str | None, float | None]:
    if reading is None:
        return None, None, None
    at = reading.time if reading.die_time is None else reading.die_time
    return reading.celsius, reading.pressure, at


def supervision_state(supervision: Supervision) -> CoolingState:
    """What a job under this supervision lives under: stop, pause, pace, reduce_batch or ok."""
    if supervision.job is JobState.STOPPING:
        return CoolingState.STOP
    if supervision.job is JobState.PAUSED:
        return CoolingState.PAUSE
    if supervision.paced:
        return CoolingState.PACE
    return CoolingState.REDUCE_BATCH if supervision.reduced else CoolingState.OK


def host_react(
    current: Supervision,
    policy: ThermalPolicy,
    celsius: float | None,
    pressure: str | None,
    at: float | None = None,
) -> Supervision:
    """The rule for a host, as if one job ran on it (what its samples' `state` says): the same
    as react(), except that a stop is not final, since there is no job to end: the poll after
    one starts from a pause with the counts kept, so a lasting heat stays `stop`."""
    if current.job is JobState.STOPPING:
        current = replace(current, job=JobState.PAUSED)
    return react(current, policy, celsius, pressure, at).state


def host_state(
    policy: ThermalPolicy, reading: Reading | None, previous: Supervision
) -> tuple[Supervision, CoolingState | None]:
    """What the rule says of a host now (host_react: a spike pauses, a stop needs the heat to
    last), and the supervision to carry to its next poll; the state is None without a reading.
    What a daemon's samples and `agent temp` show; a paced host's duty is the supervision's."""
    celsius, pressure, at = _inputs(reading)
    supervision = host_react(previous, policy, celsius, pressure, at)
    if knows_nothing(celsius, pressure):
        return supervision, None
    return supervision, supervision_state(supervision)


def policy_text(policy: ThermalPolicy) -> str:
    """`max_speed_temp=75 pause_temp=85 ...`: the detail of a `policy` event (the pace keys
    only with a pace tier)."""
    return " ".join(f"{key}={value:g}" for key, value in policy.to_dict().items())


PACE_AT_ONSET = "pace_at_onset"
"""A change's setting beside the numbers: true paces at this Mac's calibrated onset
(shared.cooling.calibration.paced_at_onset), false no longer does."""


def check_changes(changes: Mapping[str, Any]) -> None:
    """ValueError naming a key ThermalPolicy has not (nor PACE_AT_ONSET), or a value that is not
    a finite number (pace_temp may be None: no pace tier; PACE_AT_ONSET is a boolean); the order
    of the thresholds depends on those not given, and is checked with them."""
    known = {f.name for f in fields(ThermalPolicy)} | {PACE_AT_ONSET}
    unknown = sorted(map(str, set(changes) - known))
    if unknown:
        raise ValueError(f"unknown ThermalPolicy keys: {', '.join(unknown)}")
    for key, value in changes.items():
        if key == PACE_AT_ONSET:
            if not isinstance(value, bool):
                raise ValueError(f"{PACE_AT_ONSET} must be true or false, got {value!r}")
            continue
        if key == "pace_temp" and value is None:
            continue  # nil: no pace tier
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not math.isfinite(value)
        ):
            raise ValueError(f"{key} must be a finite number, got {value!r}")


def given_numbers(changes: Mapping[str, Any]) -> dict[str, float | None]:
    """Changes check_changes() passed, as kept: each a float, a nil pace_temp kept (it turns a
    pace tier off over one a calibration or an earlier change set), PACE_AT_ONSET a boolean."""
    return {
        key: value if value is None or key == PACE_AT_ONSET else float(value)
        for key, value in changes.items()
    }


def updated_policy(current: ThermalPolicy, changes: Mapping[str, Any]) -> ThermalPolicy:
    """`current` with `changes` applied; ValueError naming the problem (an unknown key, a value
    that is not a finite number, thresholds out of order), in which case nothing changes."""
    check_changes(changes)
    return ThermalPolicy.from_dict({**current.to_dict(), **changes})
