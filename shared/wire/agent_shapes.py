"""What an agent may send, checked as strictly as the agent checks what it receives.

shared.wire.protocol checks a body's top level (its fields and their types); BODIES checks the
whole of it against docs/protocol.md §5 and §10: types, required keys, enums, finite numbers,
integers a store can hold, counts within the spec's limits. A coordinator checks every reply,
stream message and telemetry message with check_agent_body before it shows or stores anything:
a hostile or broken agent (docs/security.md) gets its message refused by name, never a crash and
never a value nobody checked.

The bodies are msgspec types (shared.wire.agent_types: telemetry; shared.wire.reply_types: the
replies; shared.wire.record_types: a cell record), checked in one pass in C; what a type cannot
say is checked by hand beside it (shared.wire.typed: after(), open_map(), a Struct's
__post_init__). A rank's state and the staging replies are still shapes (shared.shapes) written
by hand. A new message type is best a Struct, entered in TYPES; a shape written by hand goes in
BODIES as it is.
"""

from __future__ import annotations

from typing import Any

from msgspec import Struct

from shared import shapes as s
from shared.benchmark.verdict import judge
from shared.distributed.rank_shapes import RANK_GOT
from shared.staging.shapes import BODIES as STAGING_BODIES
from shared.wire import agent_types, typed
from shared.wire import record_types as records
from shared.wire import reply_types as replies

RECORD_FIELDS = typed.field_checks(records.Record)
"""Each of a record's fields as a check of its own (salvaged)."""
MACHINE_FIELDS = typed.field_checks(replies.Machine)
MODEL_FIELDS = typed.field_checks(replies.Model)
record = typed.shape(records.CheckedRecord)
gang_request = typed.shape(agent_types.GangRequest)
"""gang.state, which agents (and `agent run`) send each other: checked by the agent."""
TYPES: dict[str, type[Struct]] = {
    "hello.ok": replies.Hello,
    "ping.ok": replies.Ping,
    "info.ok": replies.Info,
    "bench.start.ok": replies.Started,
    "bench.check.ok": replies.Checked,
    "bench.progress": replies.Progress,
    "bench.cell": records.Cell,
    "bench.done": replies.Done,
    "bench.cancel.ok": replies.JobNamed,
    "job.get.ok": records.JobPage,
    "job.list.ok": replies.JobList,
    "history.get.ok": replies.HistoryPage,
    "policy.get.ok": replies.PolicyInForce,
    "policy.set.ok": replies.PolicyInForce,
    "job.event.ok": replies.JobNamed,
    "gang.state.ok": agent_types.GangState,
    "doctor.ok": replies.Doctor,
    "rank.start.ok": replies.RankStarted,
    "calibrate.start.ok": replies.CalibrationStarted,
    "calibrate.get.ok": replies.CalibrationState,
    "error": replies.Error,
    "telemetry.sample": agent_types.SampleBody,
    "telemetry.event": agent_types.EventBody,
}
"""The bodies spelt as msgspec types: a new message type is best one, entered here."""
BODIES: dict[str, s.Check] = (
    {type_: typed.shape(body) for type_, body in TYPES.items()}
    | {
        "rank.get.ok": RANK_GOT,
        "rank.stop.ok": RANK_GOT,
    }
    | STAGING_BODIES
)
"""Every type an agent sends: replies, the job stream and telemetry (§5, §10)."""


def check_agent_body(type_: str, body: dict[str, Any]) -> None:
    """Invalid naming the first problem of an agent's `type_` message body (top level already
    checked by shared.wire.protocol); a type an agent never sends is one."""
    shape = BODIES.get(type_)
    if shape is None:
        raise s.Invalid("", f"{type_} is not a message an agent sends")
    shape(body)


INVALID_TEXT = "(invalid)"
"""What a stored text field that fails its check shows instead."""
TEXT_FIELDS = ("model", "test", "name", "mode", "status")


def salvaged(value: Any, checks: dict[str, s.Check]) -> tuple[dict[str, Any], list[str]]:
    """A copy of a stored map whose fields that fail their check are nil (TEXT_FIELDS:
    INVALID_TEXT), and the problems: a run stored before its agent's messages were checked
    still shows and exports, its bad values named, never shown as numbers."""
    if not isinstance(value, dict):
        return {}, [f"is {s.kind_of(value)}, not a map"]
    kept, problems = {}, []
    for key, entry in value.items():
        check = checks.get(key) if isinstance(key, str) else None
        if check is None:
            if isinstance(key, str) and _fits(replies.OpenValue, entry):
                kept[key] = entry
            continue
        try:
            check(entry)
        except s.Invalid as exc:
            problems.append(str(exc.within(key)))
            kept[key] = INVALID_TEXT if key in TEXT_FIELDS else None
        else:
            kept[key] = entry
    return kept, problems


def salvaged_record(value: Any) -> dict[str, Any]:
    """A stored cell record as salvaged() keeps it, judged again (shared.benchmark.verdict); a
    record with problems is `failed` and lists them in `invalid`, so every format says so."""
    record, problems = salvaged(value, RECORD_FIELDS)
    for key in TEXT_FIELDS:
        record.setdefault(key, INVALID_TEXT)
    if problems:
        record["status"] = "failed"
        record["invalid"] = problems
        record["error"] = "invalid values stored: " + "; ".join(problems)
    return judge(record)  # the verdict from the record's own fields, never the agent's


def _fits(type_: Any, value: Any) -> bool:
    try:
        typed.check(value, type_)
    except s.Invalid:
        return False
    return True
