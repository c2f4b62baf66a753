"""Telemetry as data: one Sample and one Event type, each with its wire body (docs/protocol.md
§10) and its SQL row, so the agent's stores, the wire and the coordinator's store cannot
disagree on a field.

`seq` is the agent's cursor for each (docs/protocol.md §10, History): a number that only grows,
given by the agent's own store, which a subscriber keeps to ask for everything after it.
"""

from __future__ import annotations

import functools
import json
import operator
from collections.abc import Callable
from dataclasses import MISSING, asdict, dataclass, field, fields
from typing import Any, ClassVar

_NIL = type(None)
_NUMBER = (int, float)
Types = type | tuple[type, ...]


def _spec(
    wire: Types, sql: str, stored: str = "plain", default: Any = MISSING, optional: bool = False
) -> Any:
    """A field's wire types, its SQL column type, and how it is stored: plain, "bool" (0/1,
    NULL for nil), "json" (text) or "json-repeats" (text, for a value that repeats from one
    record to the next). `optional`: a peer that predates it may leave it out (nil)."""
    metadata = {"wire": wire, "sql": sql, "stored": stored, "optional": optional}
    return field(default=default, metadata=metadata)


class _Record:
    """What Sample and Event share: the wire schema, the body and the row, from the fields."""

    STORED_NOT: ClassVar[frozenset[str]] = frozenset({"seq"})
    """Fields that are not columns of the shared row (each store keys `seq` its own way)."""

    @classmethod
    def schema(cls) -> dict[str, tuple[Types, bool]]:
        """The body's fields as shared.wire.protocol.SCHEMAS spells them: `host` and every field,
        required (nil where the types allow it) but those added as optional."""
        return {"host": (str, True)} | {
            f.name: (f.metadata["wire"], not f.metadata["optional"]) for f in fields(cls)
        }

    @classmethod
    def columns(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls) if f.name not in cls.STORED_NOT)

    def body(self, host: str) -> dict[str, Any]:
        """`host` and every field. Nested lists and maps are the record's own, not copies: a
        record is never changed once made (the daemon makes one a second, and a deep copy
        of each was much of its Python time: docs/performance.md)."""
        return {"host": host, **vars(self)}

    def numbered(self, seq: int) -> Any:
        """This record with `seq`: a copy of its fields, without running the (frozen)
        __init__ again, a setattr per field, as dataclasses.replace would: the daemon numbers
        a sample each poll, and each line it runs then is a cold one (docs/performance.md)."""
        numbered = object.__new__(type(self))
        numbered.__dict__.update(vars(self), seq=seq)
        return numbered

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> Any:
        """From a validated body (a wire message's, or body() output); `host` is not kept."""
        body = cls.completed(body)
        return cls(**{f.name: body[f.name] for f in fields(cls)})

    @classmethod
    def completed(cls, body: dict[str, Any]) -> dict[str, Any]:
        """`body` with each optional field it lacks (an older agent's) at its default."""
        missing = {
            f.name: f.default for f in fields(cls) if f.metadata["optional"] and f.name not in body
        }
        return {**body, **missing} if missing else body

    def row(self) -> tuple[Any, ...]:
        """The values of columns(), as stored."""
        return self.body_row(vars(self))

    @classmethod
    def body_row(cls, body: dict[str, Any]) -> tuple[Any, ...]:
        """from_body(body).row() without making the record: a store's path for many bodies
        (a lab's telemetry), so the values are taken in one call and only those stored
        differently are converted."""
        take, converted = cls._row_plan()
        try:
            row = take(body)
        except KeyError:  # an older agent's body, without the optional fields
            row = take(cls.completed(body))
        if not converted:
            return row
        values = list(row)
        for index, kind in converted:
            values[index] = _store(kind, values[index])
        return tuple(values)

    @classmethod
    @functools.cache
    def _row_plan(cls) -> tuple[Callable[[dict[str, Any]], tuple[Any, ...]], tuple[Any, ...]]:
        """An itemgetter of the columns (always a tuple) and (index, kind) of each column not
        stored as it is."""
        stored = cls._stored()
        names = [name for name, _ in stored]
        getter = operator.itemgetter(*names)
        take = getter if len(names) > 1 else (lambda body: (getter(body),))
        converted = tuple((i, kind) for i, (_, kind) in enumerate(stored) if kind != "plain")
        return take, converted

    @classmethod
    @functools.cache
    def _stored(cls) -> tuple[tuple[str, str], ...]:
        """(name, how it is stored) of each column, looked up once per class."""
        return tuple(
            (f.name, f.metadata["stored"]) for f in fields(cls) if f.name not in cls.STORED_NOT
        )

    @classmethod
    def column_sql(cls, names: tuple[str, ...], renamed: dict[str, str] | None = None) -> str:
        """`names` as a CREATE TABLE spells them, each with its declared SQL type (`renamed`:
        the name a column had when a store first made it), one per line: every store makes its
        rows from this one declaration."""
        types = {f.name: f.metadata["sql"] for f in fields(cls)}
        return ",\n".join(f"    {(renamed or {}).get(name, name)} {types[name]}" for name in names)

    @classmethod
    def added_sql(cls, table: str, names: tuple[str, ...]) -> str:
        """The ALTER TABLE statements that add `names` to `table`, with their declared types."""
        types = {f.name: f.metadata["sql"] for f in fields(cls)}
        return ";\n".join(f"ALTER TABLE {table} ADD COLUMN {name} {types[name]}" for name in names)

    @classmethod
    def from_row(cls, row: Any, seq: int | None = None) -> Any:
        """From the values of columns() (a tuple or sqlite3.Row in that order)."""
        stored = [f for f in fields(cls) if f.name not in cls.STORED_NOT]
        values = {
            f.name: _load(f.metadata["stored"], value) for f, value in zip(stored, row, strict=True)
        }
        return cls(**values, seq=seq)


def _store(kind: str, value: Any) -> Any:
    if kind == "bool":
        return None if value is None else int(value)
    if kind == "json":
        return None if value is None else json.dumps(value)
    if kind == "json-repeats":
        return None if value is None else _repeated_json(value)
    return value


_last_repeated: tuple[Any, str] = (None, "null")


def _repeated_json(value: Any) -> str:
    """json.dumps, remembering the last value: a host's samples list the same jobs second
    after second, and comparing them costs a fraction of encoding them again (a lab's
    telemetry is stored at one coordinator). One (value, text) pair, replaced whole. Only for
    values whose equal ones encode alike: a job list's names, states and integer pids (1.0
    equals 1 but encodes otherwise)."""
    global _last_repeated
    last_value, last_text = _last_repeated
    if value == last_value:
        return last_text
    text = json.dumps(value)
    _last_repeated = (value, text)
    return text


def _load(kind: str, value: Any) -> Any:
    if kind == "bool":
        return None if value is None else bool(value)
    if kind in ("json", "json-repeats"):
        return None if value is None else json.loads(value)
    return value


@dataclass(frozen=True)
class Sample(_Record):
    """One poll of the agent's thermal source: what it read and what the policy says of it;
    and, when the agent has a power source, what it read at the same poll."""

    time: float = _spec(_NUMBER, "REAL NOT NULL")
    """When the reading was taken (epoch s); the poll's time when there was none."""
    celsius: float | None = _spec((*_NUMBER, _NIL), "REAL")
    pressure: str | None = _spec((str, _NIL), "TEXT")
    source: str = _spec(str, "TEXT NOT NULL")
    simulated: bool = _spec(bool, "INTEGER NOT NULL", "bool")
    state: str | None = _spec((str, _NIL), "TEXT")
    trend_c_per_min: float | None = _spec((*_NUMBER, _NIL), "REAL")
    pause_s_total: float = _spec(_NUMBER, "REAL NOT NULL")
    jobs: list[dict[str, Any]] = _spec(list, "TEXT NOT NULL", "json-repeats")
    storage_error: str | None = _spec((str, _NIL), "TEXT", default=None)
    """What the agent cannot write now (a full disk, say: agent.daemon.storage); None when all is
    written."""
    power_w: float | None = _spec((*_NUMBER, _NIL), "REAL", default=None)
    """The machine's watts over the last poll (shared.benchmark.energy.whole of the rails); None
    without a power source or a reading."""
    energy_j: float | None = _spec((*_NUMBER, _NIL), "REAL", default=None)
    """The machine's joules since the agent's power source opened (a counter: lower after an
    agent restart)."""
    power: dict[str, Any] | None = _spec((dict, _NIL), "TEXT", "json", default=None)
    """The power source's view: {"source", "simulated", "watts": {rail: W}, "joules": {rail:
    J}, "error"} (docs/protocol.md §10); None when the agent has no power source."""
    sensor: str | None = _spec((str, _NIL), "TEXT", default=None)
    """Which of the source's sensors `celsius` is (`TCMz`, `PMU TP1g`, `replay`, ...): readings
    of different sources or sensors differ by up to tens of °C. None without a reading, or
    from a source that names none (and in rows recorded before it was kept)."""
    throttling: bool | None = _spec((bool, _NIL), "INTEGER", "bool", None, optional=True)
    """Whether the Mac throttles under load by the throttle rule (shared.cooling.throttle): its
    GPU clock, or a supervised job's work rate; None without load or a signal (no verdict)."""
    throttle_evidence: str | None = _spec((str, _NIL), "TEXT", default=None, optional=True)
    """What the signals read (`GPU 1.10 GHz of 1.40 sustained`, `job 3f2a: 312 tok/s of
    402`), the throttling ones when it throttles; None without a verdict."""
    gpu_hz: float | None = _spec((*_NUMBER, _NIL), "REAL", default=None, optional=True)
    """The GPU's clock (Hz) averaged over its active time in the last poll (docs/thermal.md,
    Clocks); None: idle, or no clock source (`clock_note` says why)."""
    gpu_active: float | None = _spec((*_NUMBER, _NIL), "REAL", default=None, optional=True)
    """The share of the last poll the GPU was active, 0 to 1."""
    cpu_p_hz: float | None = _spec((*_NUMBER, _NIL), "REAL", default=None, optional=True)
    """The performance (M5: Super) cluster's clock (Hz) over its active time."""
    cpu_e_hz: float | None = _spec((*_NUMBER, _NIL), "REAL", default=None, optional=True)
    """The efficiency (M5 Pro/Max: Performance) cluster's clock (Hz)."""
    clock_source: str | None = _spec((str, _NIL), "TEXT", default=None, optional=True)
    """Where the clocks came from (`ioreport`, `cpufreq`, `capture`, the plant's, `none`)."""
    clock_simulated: bool | None = _spec((bool, _NIL), "INTEGER", "bool", None, optional=True)
    """The clocks are a model's (the thermal plant), not a machine's."""
    clock_note: str | None = _spec((str, _NIL), "TEXT", default=None, optional=True)
    """What the clocks mean on this machine (requested or granted state), or why there are
    none (`unavailable: ...`)."""
    started: float | None = _spec((*_NUMBER, _NIL), "REAL", default=None, optional=True)
    """When the agent that took it started (epoch s): `pause_s_total` and the joules count from
    then, so a client tells a restart by a new `started`, never by a counter that went down."""
    duty: float | None = _spec((*_NUMBER, _NIL), "REAL", default=None, optional=True)
    """While `state` is `pace`: the share of each slice a job runs (0 to 1, the pace tier's
    controller, shared.cooling.pace); None otherwise."""
    seq: int | None = _spec(int, "INTEGER", default=None)
    """None until the agent's store numbers it; always a number on the wire."""


CLOCK_COLUMNS = (
    "gpu_hz",
    "gpu_active",
    "cpu_p_hz",
    "cpu_e_hz",
    "clock_source",
    "clock_simulated",
    "clock_note",
)
"""The clock fields (issue 41), added to both stores in one migration."""

FIRST_SAMPLE_ROW = (
    "time",
    "celsius",
    "pressure",
    "source",
    "simulated",
    "state",
    "trend_c_per_min",
    "pause_s_total",
    "jobs",
)
"""The sample row both stores first made (the agent's history and the coordinator's telemetry
store, each with its `host`; `trend_c_per_min` then named `trend`): later columns came one
migration at a time, so a file made then is brought up to date by the same steps."""


@dataclass(frozen=True)
class Event(_Record):
    """What happened to a supervised job: `action` is start, pause, resume, reduce_batch,
    restore_batch, stop (thermal), forward (a signal to `agent run`), cleanup (what a finished
    CMD left behind), fallback (`agent run` lost its daemon and reads the sensor itself), rejoin
    (a daemon answers `agent run` again and its readings drive the job), kill or exit; or
    policy, the daemon's own record of a new policy (`job` None, `policy` the map). `celsius` is
    the reading that caused it, when one did."""

    time: float = _spec(_NUMBER, "REAL NOT NULL")
    job: str | None = _spec((str, _NIL), "TEXT")
    pid: int | None = _spec((int, _NIL), "INTEGER")
    action: str = _spec(str, "TEXT NOT NULL")
    source: str = _spec(str, "TEXT NOT NULL")
    simulated: bool = _spec(bool, "INTEGER NOT NULL", "bool", default=False)
    celsius: float | None = _spec((*_NUMBER, _NIL), "REAL", default=None)
    detail: str | None = _spec((str, _NIL), "TEXT", default=None)
    policy: dict[str, float] | None = _spec((dict, _NIL), "TEXT", "json", default=None)
    seq: int | None = _spec((int, _NIL), "INTEGER", default=None)

    @classmethod
    def job_schema(cls) -> dict[str, tuple[Types, bool]]:
        """shared.wire.protocol's `job.event` body: an event of a local job (no host; a job id).
        A field that may be nil may be omitted (it decodes as nil): `job`, `action`, `time`,
        `source` and `simulated` are required (docs/protocol.md §12)."""
        schema = {
            name: (types, _NIL not in (types if isinstance(types, tuple) else (types,)))
            for name, (types, _) in cls.schema().items()
            if name != "host"
        }
        return schema | {"job": (str, True)}

    def job_body(self) -> dict[str, Any]:
        """The job.event request body for this event."""
        return asdict(self)


@dataclass(frozen=True)
class Cursor:
    """Where a subscriber is in one agent's history: the agent's `history` id (info.ok) and the
    last sample and event `seq` it holds with nothing missing before them."""

    history: str
    samples: int = 0
    events: int = 0
