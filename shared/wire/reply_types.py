"""An agent's replies and job-stream messages as msgspec types (docs/protocol.md §5, §10-§15),
checked by shared.wire.typed.check: shared.wire.agent_shapes.TYPES maps each type to its body.

Extending: as shared.wire.agent_types says (a field added with a default, UNSET inside a nested
map, None at a body's top level, where shared.wire.protocol fills an omitted optional field
with nil). A reply's top-level fields are the ones shared.wire.protocol.SCHEMAS lists.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from msgspec import UNSET, Meta, UnsetType

from shared import shapes as s
from shared.benchmark.bandwidth import RAW as BANDWIDTH
from shared.benchmark.energy import RAILS
from shared.bounds import MAX_CALIBRATE_MINUTES, MAX_CELLS, MAX_COOL_START_S
from shared.cooling.throttle_point import CALIBRATION_STATES, calibrate_progress, calibration
from shared.distributed.group import CHECK_PROMPT_LENGTH, MAX_CHECK_TOKENS
from shared.distributed.rank_shapes import MAX_MEMBERS
from shared.wire.agent_types import (
    Amount,
    ByRail,
    Celsius,
    Count,
    Epoch,
    EventBody,
    Ident,
    Name,
    Policy,
    Real,
    SampleBody,
    SupervisedJobs,
    Text,
    WireMap,
    number,
)
from shared.wire.typed import after, open_map

MAX_HISTORY_ITEMS = 10_000
"""Samples, and events, in one history.get page (the `limit` an agent takes, §10)."""
MAX_JOBS_LISTED = 100
MAX_CHECKS = 256
JOB_STATES = ("running", "ok", "failed", "cancelled")
DONE_STATES = ("ok", "failed", "cancelled")

Scalar = Text | None | bool | Real
"""A fact a map may hold beyond its documented keys (an older or newer agent's)."""
OpenValue = (
    Scalar
    | Annotated[list[Scalar], Meta(max_length=1024)]
    | Annotated[dict[str, Scalar], Meta(max_length=1024)]
)
CellCount = Annotated[int, Meta(ge=0, le=MAX_CELLS)]
Bits = Annotated[int, Meta(ge=1, le=64)]
CellNames = Annotated[list[Name], Meta(max_length=MAX_CELLS)]
Minutes = number(0, MAX_CALIBRATE_MINUTES)
PollInterval = number(1e-3, 86_400)
CoolWaited = number(0, MAX_COOL_START_S * 2)
CoolLimit = number(0, MAX_COOL_START_S)
PausedFor = number(0, 7 * 86_400)
PhaseSeconds = number(0, 86_400)


class Machine(WireMap):
    """What §5 documents of a machine; its other keys are open (OpenMachine)."""

    hostname: Text | None | UnsetType = UNSET
    chip: Text | None | UnsetType = UNSET
    device: Text | None | UnsetType = UNSET
    backend: Text | None | UnsetType = UNSET
    hw_model: Text | None | UnsetType = UNSET
    os: Text | None | UnsetType = UNSET
    memory_gb: Amount | None | UnsetType = UNSET
    memory_gib: Amount | None | UnsetType = UNSET
    gpu_cores: Count | None | UnsetType = UNSET
    metal_working_set_bytes: Count | None | UnsetType = UNSET
    cpu_count: Count | None | UnsetType = UNSET


OpenMachine = open_map(Machine, OpenValue)


class RankHolding(WireMap):
    host: Name
    param_count: Count | None | UnsetType = UNSET
    weight_memory_bytes: Count | None | UnsetType = UNSET


class Model(WireMap):
    """A model's info (§5 bench.progress): `greedy_tokens` its correctness check; `ranks` (a
    coordinator's record of a group's model) what each rank holds of it. Its other keys are
    open (OpenModel)."""

    model: Text
    label: Text
    bits: Bits | None | UnsetType = UNSET
    param_count: Count | None | UnsetType = UNSET
    weight_memory_bytes: Count | None | UnsetType = UNSET
    weight_memory_gb: Amount | None | UnsetType = UNSET
    kv_bytes_per_position: Count | None | UnsetType = UNSET
    num_arrays: Count | None | UnsetType = UNSET
    kind: Text | None | UnsetType = UNSET
    model_type: Text | None | UnsetType = UNSET
    revision: Text | None | UnsetType = UNSET
    greedy_tokens: (
        Annotated[list[Count], Meta(max_length=CHECK_PROMPT_LENGTH + MAX_CHECK_TOKENS)] | UnsetType
    ) = UNSET
    ranks: Annotated[list[RankHolding], Meta(max_length=MAX_MEMBERS)] | UnsetType = UNSET


OpenModel = open_map(Model, OpenValue)


class Reading(WireMap):
    celsius: Celsius | None
    source: Text
    time: Epoch
    simulated: bool
    sensor: Text | None | UnsetType = UNSET
    pressure: Text | None | UnsetType = UNSET
    sensors: Annotated[dict[str, Celsius | None], Meta(max_length=1024)] | None | UnsetType = UNSET
    note: Text | None | UnsetType = UNSET


class Thermal(WireMap):
    source: Text
    simulated: bool
    reading: Reading | None
    error: Text | None


class PowerReading(WireMap):
    source: Text
    simulated: bool
    time: Epoch
    watts: ByRail
    joules: ByRail
    total_w: Real | None | UnsetType = UNSET
    total_j: Real | None | UnsetType = UNSET


class Power(WireMap):
    source: Text
    simulated: bool
    rails: Annotated[list[Literal[RAILS]], Meta(max_length=len(RAILS))]  # type: ignore[valid-type]
    resolution_s: Amount | None
    reading: PowerReading | None
    error: Text | None


class Failing(WireMap):
    what: Text
    path: Text
    error: Text
    since: Epoch
    failures: Count


class Storage(WireMap):
    ok: bool
    failing: Annotated[list[Failing], Meta(max_length=64)]


class RunningJob(WireMap):
    id: Ident
    done: Count
    total: Count
    started: Text | Epoch | None | UnsetType = UNSET


class Hello(WireMap):
    agent: Text
    protocol: Count
    hostname: Text
    secure: bool


class Ping(WireMap):
    job: Ident | None
    time: Epoch


class Info(WireMap):
    agent: Text
    protocol: Count
    name: Name
    machine: OpenMachine  # type: ignore[valid-type]
    thermal: Thermal
    power: Power
    job: RunningJob | None
    telemetry_port: Annotated[int, Meta(ge=1, le=65535)]
    poll_interval: PollInterval
    policy: Policy  # type: ignore[valid-type]
    jobs: SupervisedJobs
    history: Name
    storage: Storage
    policy_origin: Text | None = None


class Started(WireMap):
    job: Ident
    cells: CellNames


class Checked(WireMap):
    cells: CellNames
    models: Annotated[dict[str, Text | None], Meta(max_length=MAX_CELLS)] | None = None


class CoolWait(WireMap):
    celsius: Celsius | None
    pressure: Text | None
    target_c: Celsius
    waited_s: CoolWaited
    limit_s: CoolLimit
    done: bool
    hot: bool
    injected: bool


class PauseView(WireMap):
    celsius: Celsius | None
    pressure: Text | None
    source: Text
    sensor: Text | None
    paused_s: PausedFor
    done: bool


class Phase(WireMap):
    kind: Literal["build", "baseline"]
    model: Text | UnsetType = UNSET
    label: Text | UnsetType = UNSET
    bits: Bits | None | UnsetType = UNSET
    param_count: Annotated[int, Meta(ge=0, le=10**15)] | None | UnsetType = UNSET
    seconds: PhaseSeconds | UnsetType = UNSET


class Progress(WireMap):
    job: Ident
    done: CellCount
    total: CellCount
    model: OpenModel | None = None  # type: ignore[valid-type]
    cooling: CoolWait | None = None
    pause: PauseView | None = None
    phase: Phase | None = None


class Done(WireMap):
    job: Ident
    status: Literal[DONE_STATES]  # type: ignore[valid-type]
    error: Text | None
    cells: CellCount


class JobNamed(WireMap):
    """bench.cancel.ok, job.event.ok: the job the request named."""

    job: Ident


class ListedJob(WireMap):
    job: Ident
    request: Ident | None
    state: Literal[JOB_STATES]  # type: ignore[valid-type]
    total: CellCount
    done: CellCount
    error: Text | None
    started: Text
    finished: Text | None


class JobList(WireMap):
    jobs: Annotated[list[ListedJob], Meta(max_length=MAX_JOBS_LISTED)]


class HistoryPage(WireMap):
    history: Name
    samples: Annotated[list[SampleBody], Meta(max_length=MAX_HISTORY_ITEMS)]
    events: Annotated[list[EventBody], Meta(max_length=MAX_HISTORY_ITEMS)]
    truncated: bool


class PolicyInForce(WireMap):
    """policy.get.ok, policy.set.ok."""

    policy: Policy  # type: ignore[valid-type]
    origin: Text | None = None


class DoctorCheck(WireMap):
    name: Text
    ok: bool
    detail: Text
    fix: Text | None
    required: bool | UnsetType = UNSET


Bandwidth = after(BANDWIDTH, dict[str, Any])
"""doctor --level 2's memory-bandwidth probe (shared.benchmark.bandwidth)."""


class DoctorReport(WireMap):
    """`agent doctor`'s report; its other keys are open."""

    host: Text
    ok: bool
    checks: Annotated[list[DoctorCheck], Meta(max_length=MAX_CHECKS)]
    machine: OpenMachine | None | UnsetType = UNSET  # type: ignore[valid-type]
    bandwidth: Bandwidth | None | UnsetType = UNSET  # type: ignore[valid-type]


class Doctor(WireMap):
    report: open_map(DoctorReport, OpenValue)  # type: ignore[valid-type]


class RankStarted(WireMap):
    job: Ident
    rank: Annotated[int, Meta(ge=0, le=MAX_MEMBERS - 1)]


class CalibrationStarted(WireMap):
    minutes: Minutes
    source: Name


class CalibrationState(WireMap):
    """calibrate.get.ok: a calibration's progress and result (shared.cooling.throttle_point
    checks those by hand)."""

    state: Literal[CALIBRATION_STATES]  # type: ignore[valid-type]
    minutes: Minutes | None
    progress: after(s.nil_or(calibrate_progress))  # type: ignore[valid-type]
    calibration: after(s.nil_or(calibration))  # type: ignore[valid-type]
    source: Text | None
    error: Text | None
    origin: Text | None
    policy: Policy  # type: ignore[valid-type]
    policy_origin: Text


class Error(WireMap):
    code: Text
    message: Text
