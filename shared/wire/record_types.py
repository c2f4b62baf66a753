"""A cell record (docs/protocol.md §5 Cell records, §17) as msgspec types, checked by
shared.wire.typed.

Its fields are declared in groups, as dicts of field name to type (COORDINATES, MEASURED,
JUDGED, GROUPED here; distributed.stragglers and wire.serving_shapes declare theirs, still as
shared.shapes checks, which typed.struct runs after the types): a field added to a record is a
line in its group, optional but for COORDINATES, so an older agent's records still read.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from msgspec import UNSET, Meta, UnsetType

from shared import shapes as s
from shared.benchmark.energy import RAILS
from shared.benchmark.reboots import MAX_PANICS, PANIC_FILE_CAP, PANIC_TEXT_CAP
from shared.benchmark.verdict import VERDICTS
from shared.bounds import MAX_CELLS
from shared.cooling.clocks import MAX_CLOCK_HZ
from shared.distributed.group import CHECK_PROMPT_LENGTH, MAX_CHECK_TOKENS, SHARDINGS
from shared.distributed.rank_env import JACCL, RING
from shared.distributed.rank_shapes import MAX_MEMBERS
from shared.distributed.stragglers import RECORD_FIELDS as STRAGGLER_FIELDS
from shared.wire import typed
from shared.wire.agent_types import (
    MAX_ID,
    Amount,
    ByRail,
    Celsius,
    Count,
    Epoch,
    Name,
    PolicyState,
    Real,
    Share,
    Text,
    WireMap,
    number,
)
from shared.wire.reply_types import JOB_STATES, Bits, OpenModel, OpenValue, Scalar
from shared.wire.serving_shapes import MODES, SERVED, iteration_tokens

MAX_FLAGS = 64
CELL_STATUSES = ("ok", "failed")
"""`not run` is the coordinator's word for a cell no record came for: never the agent's."""
MAX_CELL_CLOCK_SAMPLES = 20_000
"""A cell's clock readings, one per poll (5.5 hours at 1 Hz); a job keeps no more (a sustained
cell keeps none: its windows are its curve)."""
SPEED_SLACK = 1e-6
"""Relative rounding a mean rate may sit above the best iteration's by."""
FASTEST_ITERATION_MS = 1e-3
"""No timed iteration of an MLX cell takes less than a microsecond (one mx.eval costs more)."""

Flags = Annotated[
    list[Annotated[str, Meta(min_length=1, max_length=64)]], Meta(max_length=MAX_FLAGS)
]
Amounts = Annotated[list[Amount], Meta(max_length=100_000)]
Status = Literal[CELL_STATUSES]  # type: ignore[valid-type]
Clock = number(0, MAX_CLOCK_HZ)
MemberRank = Annotated[int, Meta(ge=0, le=MAX_MEMBERS - 1)]
Members = Annotated[list[Name], Meta(max_length=MAX_MEMBERS)]
Backend = Literal[RING, JACCL]  # type: ignore[valid-type]
Sharding = Literal[SHARDINGS]  # type: ignore[valid-type]
GreedyTokens = Annotated[list[Count], Meta(max_length=CHECK_PROMPT_LENGTH + MAX_CHECK_TOKENS)]


class Window(WireMap):
    index: Count
    start_s: Amount
    end_s: Amount
    iterations: Count
    tokens: Count
    timed_s: Amount
    tokens_per_sec: Amount | None
    celsius: Celsius | None
    state: PolicyState | None
    watts: Real | None
    joules: Real | None
    pause_s: Amount
    paused: bool


class Sustain(WireMap):
    duration_s: Amount
    window_s: Amount
    windows: Annotated[list[Window], Meta(max_length=1_000_000)]
    first_tokens_per_sec: Amount | None | UnsetType = UNSET
    steady_tokens_per_sec: Amount | None | UnsetType = UNSET
    throttle_ratio: Amount | None | UnsetType = UNSET
    time_to_throttle_s: Amount | None | UnsetType = UNSET
    start_celsius: Celsius | None | UnsetType = UNSET
    end_celsius: Celsius | None | UnsetType = UNSET
    temp_rise_c: Real | None | UnsetType = UNSET
    mean_power_w: Real | None | UnsetType = UNSET
    pause_s: Amount | UnsetType = UNSET
    paused_windows: Count | UnsetType = UNSET
    stopped: Text | None | UnsetType = UNSET


class PanicReport(WireMap):
    """One kernel panic report a Mac's cell carries (agent.awake.panics): its name, the first
    line of its panic string, when it happened."""

    file: Annotated[str, Meta(min_length=1, max_length=PANIC_FILE_CAP)]
    panic_string: Annotated[str, Meta(max_length=PANIC_TEXT_CAP)] | None
    time: Epoch | None


class GpuClock(WireMap):
    sustained_hz: Clock | None
    samples: Annotated[
        list[Annotated[list[Clock | None], Meta(max_length=2)]],
        Meta(max_length=MAX_CELL_CLOCK_SAMPLES),
    ]


class RankOfRecord(WireMap):
    rank: MemberRank
    host: Name
    members: Members
    backend: Backend
    sharding: Sharding


class GroupOf(WireMap):
    ranks: Annotated[int, Meta(ge=2, le=MAX_MEMBERS)]
    members: Members
    backend: Backend
    sharding: Sharding


class RankEntry(WireMap):
    rank: MemberRank
    host: Name
    weight_memory_bytes: Count | None | UnsetType = UNSET
    status: Status | UnsetType = UNSET
    error: Text | None | UnsetType = UNSET
    tokens_per_sec: Amount | None | UnsetType = UNSET
    peak_memory_gb: Amount | None | UnsetType = UNSET
    active_memory_gb: Amount | None | UnsetType = UNSET
    energy_j: Real | None | UnsetType = UNSET
    power_w: Real | None | UnsetType = UNSET
    energy_source: Text | None | UnsetType = UNSET
    energy_simulated: bool | None | UnsetType = UNSET
    energy_note: Text | None | UnsetType = UNSET
    soc_temp_c: Celsius | None | UnsetType = UNSET
    thermal_source: Text | None | UnsetType = UNSET
    pause_s: Amount | None | UnsetType = UNSET
    flags: Flags | None | UnsetType = UNSET
    verdict_reasons: Flags | None | UnsetType = UNSET


MEASURED: dict[str, Any] = {
    "cool_wait_s": Amount,
    "test_time": Text,
    "tokens_per_sec": Amount,
    "std_tokens_per_sec": Amount | None,
    "latency_ms": Amount,
    "std_latency_ms": Amount | None,
    "min_latency_ms": Amount,
    "median_latency_ms": Amount,
    "samples_ms": Amounts | None,
    "samples_tokens_per_sec": Amounts | None,
    "mean_per_token_ms": Amount | None,
    "peak_memory_gb": Amount | None,  # None: a serving cell over HTTP (the server's memory)
    "active_memory_gb": Amount | None,
    "seq_len": Count,
    "decode_tokens": Count,
    "prefill_step_size": Count,
    "model_revision": Text,
    "wired_limit_bytes": Count | None,
    "energy_source": Text | None,
    "energy_simulated": bool,
    "energy_rails": Annotated[list[Literal[RAILS]], Meta(max_length=len(RAILS))],  # type: ignore[valid-type]
    "energy_j": Real | None,
    "energy_net_j": Real | None,
    "energy_window_s": Amount | None,
    "power_w": Real | None,
    "idle_power_w": Real | None,
    "tokens_per_joule": Real | None,
    "joules_per_token": Real | None,
    "energy_by_rail_j": ByRail | None,
    "energy_short_windows": Count | None,
    "energy_note": Text | None,
    "sustain": Sustain,
    "ci95_tokens_per_sec": Amount | None,
    "warmup_iterations": Count,
    "rewarm_iterations": Count,
    "precision_target": Share | None,
    "slept_s": Amount | None,
    "sleep_clock": Text | None,
}
"""A record's fields that a measured cell has (§5 Cell records): absent from a cell that failed
unmeasured."""
COORDINATES: dict[str, Any] = {
    "model": Name,
    "bits": Bits | None,
    "n_prompt": Count,
    "n_gen": Count,
    "n_depth": Count,
    "batch_size": Annotated[int, Meta(ge=1, le=s.INT64_MAX)],
    "mode": Literal[MODES],  # type: ignore[valid-type]
    "test": Name,
    "name": Name,
    "status": Status,
    "error": Text | None,
    "soc_temp_start_c": Celsius | None,
    "soc_temp_end_c": Celsius | None,
    "soc_temp_c": Celsius | None,
    "pressure_start": Text | None,
    "pressure_end": Text | None,
    "pause_s": Amount,
    "flags": Flags,
    "thermal_source": Text | None,
}
"""What every record carries, measured or not."""
JUDGED: dict[str, Any] = {
    "verdict": Literal[VERDICTS],  # type: ignore[valid-type]
    "verdict_reasons": Flags,
    "settings": Annotated[
        dict[str, Scalar | Annotated[dict[str, Scalar], Meta(max_length=1024)]],
        Meta(max_length=64),
    ],
    "boot_time": Epoch | None,
    "panics": Annotated[list[PanicReport], Meta(max_length=MAX_PANICS)],
    "injected": Flags,
    "gpu_clock": GpuClock,
}
"""What a record says about its own worth (§5 Verdicts), optional so an older agent's records
still read: a coordinator judges every record again from its fields (shared.benchmark.verdict)."""
GROUPED: dict[str, Any] = STRAGGLER_FIELDS | {
    "greedy_tokens": GreedyTokens,
    "rank": RankOfRecord,
    "group": GroupOf,
    "ranks": Annotated[list[RankEntry], Meta(max_length=MAX_MEMBERS)],
    "greedy_tokens_agree": bool | None,
}
"""A distributed cell's fields (§17): a rank's record says which rank it is and the greedy
tokens its model decoded; the coordinator's record of the group's cell (shared.reports.group_cells)
carries the group and every rank's figures (`probe`, `stragglers`: distributed.stragglers)."""
Record = typed.struct(
    "Record", COORDINATES, MEASURED | JUDGED | GROUPED | SERVED | {"host": Name}, __name__
)
"""A cell record; a coordinator's stored records add `host` (the host as it names it)."""


def _figures_agree(value: dict[str, Any]) -> None:
    """A measured record's figures must agree with each other: its mean rate cannot beat its
    fastest iteration, which took at least a microsecond."""
    if value["status"] != "ok":
        return
    for key in ("test_time", "tokens_per_sec", "latency_ms", "min_latency_ms"):
        if key not in value:
            raise s.Invalid(key, "is missing from a measured cell")
    fastest = value["min_latency_ms"]
    if fastest < FASTEST_ITERATION_MS:
        raise s.Invalid("min_latency_ms", f"is {fastest:g}, below a microsecond")
    tokens = iteration_tokens(value)
    best_rate = tokens / (fastest / 1000)
    if value["tokens_per_sec"] > best_rate * (1 + SPEED_SLACK):
        raise s.Invalid(
            "tokens_per_sec",
            f"is {value['tokens_per_sec']:g}, faster than its fastest iteration "
            f"({tokens} tokens in {fastest:g} ms: {best_rate:g} tok/s)",
        )


CheckedRecord = typed.after(_figures_agree, Record)
"""One cell record (§5 Cell records), its figures agreeing."""


class Cell(WireMap):
    """bench.cell: one cell's record as it lands."""

    job: Annotated[str, Meta(min_length=1, max_length=MAX_ID)]
    index: Annotated[int, Meta(ge=0, le=MAX_CELLS - 1)]
    record: CheckedRecord  # type: ignore[valid-type]


class JobPage(WireMap):
    """job.get.ok: a page of a job's records, from `offset`."""

    job: Annotated[str, Meta(min_length=1, max_length=MAX_ID)]
    state: Literal[JOB_STATES]  # type: ignore[valid-type]
    error: Text | None
    spec: Annotated[dict[str, OpenValue], Meta(max_length=64)]
    models: Annotated[list[OpenModel], Meta(max_length=MAX_CELLS)]  # type: ignore[valid-type]
    records: Annotated[list[CheckedRecord], Meta(max_length=MAX_CELLS)]  # type: ignore[valid-type]
    offset: Annotated[int, Meta(ge=0, le=MAX_CELLS)]
    next: Annotated[int, Meta(ge=1, le=MAX_CELLS)] | None
    started: Text
    finished: Text | None
