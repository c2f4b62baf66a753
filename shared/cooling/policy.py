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


class CoolingState(str, Enum):
    """What the policy asks for, ordered from harmless to fatal."""

    OK = "ok"
    REDUCE_BATCH = "reduce_batch"
    PAUSE = "pause"
    STOP = "stop"

    @property
    def severity(self) -> int:
        return _SEVERITY[self]


_SEVERITY = {state: rank for rank, state in enumerate(CoolingState)}

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
    """The seed's thresholds (°C) and pause step (s), plus an optional resume hysteresis (°C).

    Above max_speed_temp the trainer should shrink its batch; at pause_temp it pauses; at stop_temp
    it stops. A pause ends below pause_temp - hysteresis (0 keeps the seed's behaviour).
    """

    max_speed_temp: float = 75.0
    pause_temp: float = 85.0
    stop_temp: float = 95.0
    pause_duration: float = 0.5
    hysteresis: float = 0.0

    def __post_init__(self) -> None:
        if not self.max_speed_temp < self.pause_temp < self.stop_temp:
            raise ValueError(
                "thresholds out of order: need max_speed_temp < pause_temp < stop_temp, got "
                f"max_speed_temp={self.max_speed_temp}, pause_temp={self.pause_temp}, "
                f"stop_temp={self.stop_temp}"
            )
        if not (math.isfinite(self.pause_duration) and self.pause_duration > 0):
            raise ValueError(f"pause_duration must be > 0 seconds, got {self.pause_duration}")
        if not (math.isfinite(self.hysteresis) and self.hysteresis >= 0):
            raise ValueError(f"hysteresis must be >= 0 °C, got {self.hysteresis}")
        if self.hysteresis >= self.pause_temp:
            raise ValueError(
                f"hysteresis {self.hysteresis} °C must be below pause_temp "
                f"{self.pause_temp} °C, or a pause could never end"
            )

    @property
    def resume_temp(self) -> float:
        """Below this a pause ends."""
        return self.pause_temp - self.hysteresis

    def to_dict(self) -> dict[str, float]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ThermalPolicy:
        """Missing keys take the defaults; unknown keys are an error, not silently dropped."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(map(str, set(data) - known))  # a key may be anything on the wire
        if unknown:
            raise ValueError(f"unknown ThermalPolicy keys: {', '.join(unknown)}")
        return cls(**{key: float(value) for key, value in data.items()})


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


@dataclass(frozen=True)
class Supervision:
    """What has been done to a job so far: its state, whether it was told to reduce, how many
    polls in a row have had no reading, how many have read at or above stop_temp (`hot`), and
    how many of its pause have read at or above pause_temp (`stuck`). A poll without a reading
    leaves `hot` and `stuck` as they were: it says nothing of the heat."""

    job: JobState = JobState.RUNNING
    reduced: bool = False
    missing: int = 0
    hot: int = 0
    stuck: int = 0


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


def react(
    current: Supervision,
    policy: ThermalPolicy,
    celsius: float | None,
    pressure: str | None = None,
) -> Decision:
    """The next supervision after one poll (`celsius` and `pressure` both None: no reading), and
    its actions. A stop is final and needs stop_reason(); a reading at or above stop_temp
    short of it pauses. A pause ends when decide() (with the hysteresis of a paused job) asks
    for less, or after MISSING_POLLS_TO_RESUME polls without a reading; reduce/restore are told
    once per change."""
    if current.job is JobState.STOPPING:
        return Decision(current, None)
    paused = current.job is JobState.PAUSED
    if knows_nothing(celsius, pressure):
        missing = current.missing + 1
        if paused and missing >= MISSING_POLLS_TO_RESUME:
            reason = f"no reading for {missing} polls: resuming without a sensor"
            resumed = replace(current, job=JobState.RUNNING, missing=0, stuck=0)
            return Decision(resumed, None, (Action.RESUME,), reason)
        return Decision(replace(current, missing=missing), None)
    hot, stuck = current.hot, current.stuck  # a level without degrees says nothing of them
    if celsius is not None:
        hot = hot + 1 if celsius >= policy.stop_temp else 0
        stuck = stuck + 1 if paused and celsius >= policy.pause_temp else 0
    reason = stop_reason(policy, celsius, pressure, hot, stuck)
    if reason is not None:
        stopping = Supervision(JobState.STOPPING, current.reduced, hot=hot, stuck=stuck)
        return Decision(stopping, CoolingState.STOP, (Action.STOP,), reason)
    cooling = decide(policy, celsius, pressure, currently_paused=paused)
    if cooling in (CoolingState.PAUSE, CoolingState.STOP):
        pausing = Supervision(JobState.PAUSED, current.reduced, hot=hot, stuck=stuck)
        return Decision(pausing, CoolingState.PAUSE, () if paused else (Action.PAUSE,))
    actions = [Action.RESUME] if paused else []
    reduce = cooling is CoolingState.REDUCE_BATCH
    if reduce != current.reduced:
        actions.append(Action.REDUCE_BATCH if reduce else Action.RESTORE_BATCH)
    return Decision(Supervision(JobState.RUNNING, reduce, hot=hot), cooling, tuple(actions))


class Reading(Protocol):
    """What the rule reads of a poll (the agent's ThermalReading has it)."""

    @property
    def celsius(self) -> float | None: ...

    @property
    def pressure(self) -> str | None: ...


class CoolingGate:
    """The rule applied poll after poll: one per supervised job, fed every poll (None when the
    poll had no reading). Not thread-safe by itself; its users lock around it where threads
    share it."""

    def __init__(self) -> None:
        self.supervision = Supervision()

    def observe(self, policy: ThermalPolicy, reading: Reading | None) -> Decision:
        celsius, pressure = (reading.celsius, reading.pressure) if reading else (None, None)
        decision = react(self.supervision, policy, celsius, pressure)
        self.supervision = decision.state
        return decision

    @property
    def state(self) -> CoolingState:
        """What the job lives under now: stop, pause, reduce_batch or ok."""
        return supervision_state(self.supervision)


def supervision_state(supervision: Supervision) -> CoolingState:
    """What a job under this supervision lives under: stop, pause, reduce_batch or ok."""
    if supervision.job is JobState.STOPPING:
        return CoolingState.STOP
    if supervision.job is JobState.PAUSED:
        return CoolingState.PAUSE
    return CoolingState.REDUCE_BATCH if supervision.reduced else CoolingState.OK


def host_react(
    current: Supervision, policy: ThermalPolicy, celsius: float | None, pressure: str | None
) -> Supervision:
    """The rule for a host, as if one job ran on it (what its samples' `state` says): the same
    as react(), except that a stop is not final, since there is no job to end: the poll after
    one starts from a pause with the counts kept, so a lasting heat stays `stop`."""
    if current.job is JobState.STOPPING:
        current = replace(current, job=JobState.PAUSED)
    return react(current, policy, celsius, pressure).state


def host_state(
    policy: ThermalPolicy, reading: Reading | None, previous: Supervision
) -> tuple[Supervision, CoolingState | None]:
    """What the rule says of a host now (host_react: a spike pauses, a stop needs the heat to
    last), and the supervision to carry to its next poll; the state is None without a reading.
    What a daemon's samples and `agent temp` show."""
    celsius, pressure = (reading.celsius, reading.pressure) if reading else (None, None)
    supervision = host_react(previous, policy, celsius, pressure)
    if knows_nothing(celsius, pressure):
        return supervision, None
    return supervision, supervision_state(supervision)


def policy_text(policy: ThermalPolicy) -> str:
    """`max_speed_temp=75 pause_temp=85 ...`: the detail of a `policy` event."""
    return " ".join(f"{key}={value:g}" for key, value in policy.to_dict().items())


def check_changes(changes: Mapping[str, Any]) -> None:
    """ValueError naming a key ThermalPolicy has not, or a value that is not a finite number;
    the order of the thresholds depends on those not given, and is checked with them."""
    unknown = sorted(map(str, set(changes) - {f.name for f in fields(ThermalPolicy)}))
    if unknown:
        raise ValueError(f"unknown ThermalPolicy keys: {', '.join(unknown)}")
    for key, value in changes.items():
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not math.isfinite(value)
        ):
            raise ValueError(f"{key} must be a finite number, got {value!r}")


def updated_policy(current: ThermalPolicy, changes: Mapping[str, Any]) -> ThermalPolicy:
    """`current` with `changes` applied; ValueError naming the problem (an unknown key, a value
    that is not a finite number, thresholds out of order), in which case nothing changes."""
    check_changes(changes)
    return ThermalPolicy.from_dict({**current.to_dict(), **changes})
