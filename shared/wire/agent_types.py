"""What an agent sends, as msgspec types (shared.wire.typed): decoded and checked in one pass.

The telemetry stream is the hot path: a lab's samples all arrive at one coordinator, and
decode_agent_telemetry() takes a [topic, envelope] off a SUB to a checked Message at a fifth of
the cost of msgpack plus a walk of hand-written checks (docs/performance.md, Telemetry).

Extending (docs/protocol.md §3, versioning): a field added to a message is added here as an
attribute with a default, so an older agent that lacks it is still valid. At the top level of
a sample or event the default is None (every body the coordinator keeps has every field, nil
where the agent did not say); inside a nested map it is UNSET (absent stays absent, and nil is
accepted only where the type says `| None`). A new message type gets a Struct and an entry in
shared.wire.agent_shapes.TYPES. Unknown fields are refused (`forbid_unknown_fields`), as the
protocol says for every map but the few open ones (a machine's facts, a doctor report).
"""

from __future__ import annotations

import math
import sys
from typing import Annotated, Any, Literal

import msgspec
from msgspec import UNSET, Meta, Struct, UnsetType

from shared.benchmark.energy import RAILS
from shared.cooling.clocks import MAX_CLOCK_HZ
from shared.cooling.gang import BACKENDS, MAX_GROUP_LENGTH, MAX_WORLD
from shared.cooling.policy import PACE_DEFAULTS, CoolingState, ThermalPolicy
from shared.cooling.throttle import MAX_EVIDENCE as MAX_WORK_EVIDENCE
from shared.cooling.throttle import WORK_UNITS
from shared.shapes import INT64_MAX, INT64_MIN, Invalid
from shared.wire import protocol as p
from shared.wire import typed

MAX_TEXT = 16_384
"""Characters of any string an agent sends: its longest honest ones are a command line (cut to
16,384, docs/protocol.md §12) and a crashed job's last lines (at most 8,000)."""
MAX_ID = 64
MAX_SOURCE = 256
"""A thermal source's name (`replay:PATH` names a path) or a sensor's."""
MAX_SUPERVISED = 1024
"""Jobs one sample lists: far more than a Mac runs, few enough to show."""
MAX_EVIDENCE = 1024
"""Characters of a sample's throttle evidence: a few figures per signal, a job's id with each."""
POLICY_STATES = tuple(state.value for state in CoolingState)
SUPERVISED_STATES = ("running", "paused", "stopped", "exited")
RUN_ACTIONS = (
    "start",
    "pause",
    "resume",
    "reduce_batch",
    "restore_batch",
    "stop",
    "kill",
    "forward",
    "cleanup",
    "fallback",
    "rejoin",
    "gang",
    "pace",
    "pace_end",
    "throttling",
    "throttle_end",
    "summary",
    "exit",
)
"""The actions of a supervised job's events: what `job.event` may carry (§12)."""
EVENT_ACTIONS = (*RUN_ACTIONS, "policy")
"""A telemetry event's actions: a job's, and the agent's own `policy`."""

_LARGEST = sys.float_info.max


def number(least: float = -_LARGEST, most: float = _LARGEST) -> Any:
    """A finite int or float within [least, most], ints within 64 bits (never a bool), each kept
    as it came: the bounds refuse ±inf, and nan fails every bound."""
    whole = Meta(ge=max(math.ceil(least), INT64_MIN), le=min(math.floor(most), INT64_MAX))
    return Annotated[int, whole] | Annotated[float, Meta(ge=least, le=most)]


Text = Annotated[str, Meta(max_length=MAX_TEXT)]
Name = Annotated[str, Meta(min_length=1, max_length=MAX_TEXT)]
Ident = Annotated[str, Meta(min_length=1, max_length=MAX_ID)]
Count = Annotated[int, Meta(ge=0, le=INT64_MAX)]
Seq = Annotated[int, Meta(ge=1, le=INT64_MAX)]
Real = number()
Amount = number(0)
"""A measured quantity that cannot be negative: seconds, bytes, watts, joules, tok/s."""
Epoch = Amount
Celsius = number(-273.15)
Share = number(0, 1)
Hertz = number(0, MAX_CLOCK_HZ)
"""A clock: finite, 0 to MAX_CLOCK_HZ (a frequency beyond it is a decoding fault)."""
HeardAgo = number(0, 86400.0 * 366)
Rank = Annotated[int, Meta(ge=0, le=MAX_WORLD - 1)]
PolicyState = Literal[POLICY_STATES]  # type: ignore[valid-type]
ByRail = Annotated[dict[str, Real], Meta(max_length=len(RAILS) + 8)]


class WireMap(Struct, forbid_unknown_fields=True, omit_defaults=True):
    """A nested map: unknown keys refused, an optional key left out stays out."""


class _Policy(WireMap):
    """Hand-written below from ThermalPolicy's keys (Policy)."""

    def __post_init__(self) -> None:
        try:
            ThermalPolicy.from_dict(msgspec.to_builtins(self))
        except ValueError as exc:
            raise ValueError(f"is not a policy: {exc}") from None


Policy = msgspec.defstruct(
    "Policy",
    [(key, Real) for key in ThermalPolicy().to_dict()]
    + [
        (key, (Real | None if default is None else Real) | UnsetType, UNSET)
        for key, default in PACE_DEFAULTS.items()
    ],
    bases=(_Policy,),
    module=__name__,
)
"""Every ThermalPolicy key, each a finite number (pace keys optional), and thresholds the agent
could hold (ThermalPolicy.from_dict in __post_init__)."""


class SamplePower(WireMap):
    source: Text
    simulated: bool
    watts: ByRail
    joules: ByRail
    error: Text | None


class GangMember(WireMap):
    """One rank's report in a gang (docs/protocol.md §15): what its Mac asks for and why."""

    rank: Rank
    host: Ident
    state: PolicyState
    applied: PolicyState
    celsius: Celsius | None
    source: Annotated[str, Meta(min_length=1, max_length=MAX_SOURCE)]
    sensor: Annotated[str, Meta(max_length=MAX_SOURCE)] | None
    time: Epoch
    job: Annotated[str, Meta(max_length=MAX_ID)]
    age_s: HeardAgo
    duty: Share | None | UnsetType = UNSET
    slice_s: Share | None | UnsetType = UNSET


GroupName = Annotated[str, Meta(min_length=1, max_length=MAX_GROUP_LENGTH)]


class GangIdentity(WireMap):
    group: GroupName
    rank: Rank
    world: Annotated[int, Meta(ge=2, le=MAX_WORLD)]
    hosts: Annotated[list[Annotated[str, Meta(max_length=MAX_ID)]], Meta(max_length=MAX_WORLD)]
    backend: Literal[BACKENDS]  # type: ignore[valid-type]


class GangListed(GangIdentity):
    """A supervised job's gang as the agent lists it: who it is, and the state all its ranks
    live under with the rank that causes it."""

    state: PolicyState
    cause: GangMember | None
    duty: Share | None | UnsetType = UNSET


class GangRequest(WireMap):
    """gang.state, which agents (and `agent run`) send each other: checked by the agent."""

    gang: GangIdentity
    member: GangMember


class GangState(WireMap):
    """gang.state.ok: what the agent knows of each rank of a group."""

    group: GroupName
    members: Annotated[list[GangMember], Meta(max_length=MAX_WORLD)]


class JobWork(WireMap):
    """A `run` job's speed as its `agent run` states it (docs/protocol.md §10, §12)."""

    rate: Amount | None
    unit: Literal[WORK_UNITS]  # type: ignore[valid-type]
    time: Epoch | None
    throttling: bool | None
    evidence: Annotated[str, Meta(max_length=MAX_WORK_EVIDENCE)] | None


class SupervisedJob(WireMap):
    job: Name
    pid: Count
    command: Text
    state: Literal[SUPERVISED_STATES]  # type: ignore[valid-type]
    kind: Literal["bench", "run"]
    gang: GangListed | None | UnsetType = UNSET
    work: JobWork | None | UnsetType = UNSET


SupervisedJobs = Annotated[list[SupervisedJob], Meta(max_length=MAX_SUPERVISED)]


class SampleBody(Struct, forbid_unknown_fields=True):
    """telemetry.sample's body (docs/protocol.md §10); the fields with a default are optional:
    an older agent's samples lack them."""

    host: Name
    seq: Seq
    time: Epoch
    celsius: Celsius | None
    pressure: Text | None
    source: Text
    simulated: bool
    state: PolicyState | None
    trend_c_per_min: Real | None
    pause_s_total: Amount
    jobs: SupervisedJobs
    storage_error: Text | None
    power_w: Real | None
    energy_j: Real | None
    power: SamplePower | None
    sensor: Text | None
    throttling: bool | None = None
    throttle_evidence: Annotated[str, Meta(max_length=MAX_EVIDENCE)] | None = None
    gpu_hz: Hertz | None = None
    gpu_active: Share | None = None
    cpu_p_hz: Hertz | None = None
    cpu_e_hz: Hertz | None = None
    clock_source: Text | None = None
    clock_simulated: bool | None = None
    clock_note: Text | None = None
    started: Epoch | None = None
    duty: Share | None = None


class EventBody(Struct, forbid_unknown_fields=True):
    """telemetry.event's body (docs/protocol.md §10)."""

    host: Name
    seq: Seq | None
    time: Epoch
    job: Name | None
    pid: Count | None
    action: Literal[EVENT_ACTIONS]  # type: ignore[valid-type]
    source: Text
    simulated: bool
    celsius: Celsius | None
    detail: Text | None
    policy: Policy | None  # type: ignore[valid-type]


_Id = Annotated[str, Meta(min_length=1, max_length=p.MAX_ID_LENGTH)]


class _Envelope(Struct, forbid_unknown_fields=True):
    v: Literal[p.PROTOCOL_VERSION]  # type: ignore[valid-type]
    id: _Id
    re: _Id | None


class _SampleEnvelope(_Envelope):
    type: Literal["telemetry.sample"]
    body: SampleBody


class _EventEnvelope(_Envelope):
    type: Literal["telemetry.event"]
    body: EventBody


_DECODERS = {
    p.TOPICS["telemetry.sample"]: msgspec.msgpack.Decoder(_SampleEnvelope),
    p.TOPICS["telemetry.event"]: msgspec.msgpack.Decoder(_EventEnvelope),
}


def decode_agent_telemetry(frames: list[bytes]) -> p.Message:
    """One telemetry message off a SUB socket, valid to its last field, its body a map with
    every field (nil where an older agent did not say); ProtocolError naming the first problem,
    as p.decode_telemetry and shared.wire.agent_shapes say it (`telemetry.sample: seq is -1,
    below 1`). A valid message is decoded once, by its topic's typed decoder; only a refused
    one is decoded again, to name its problem."""
    decoder = _DECODERS.get(frames[0]) if len(frames) == 2 else None
    refused: Exception | None = None
    if decoder is not None and len(frames[1]) <= p.MAX_ENVELOPE_SIZE:
        try:
            envelope = decoder.decode(frames[1])
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            refused = exc
        else:
            body = msgspec.to_builtins(envelope.body)
            return p.Message(envelope.type, body, envelope.id, envelope.re, envelope.v)
    message = p.decode_telemetry(frames)  # the envelope's problem, in the protocol's words
    try:
        typed.check(message.body, SampleBody if message.type == "telemetry.sample" else EventBody)
    except Invalid as exc:
        raise p.ProtocolError(p.BAD_BODY, f"{message.type}: {exc}", re=message.id) from None
    # the protocol's checks and the types pass what the typed decoder refused: none is known
    raise p.ProtocolError(p.MALFORMED, f"{message.type}: {refused}", re=message.id)
