"""What an agent may send, checked as strictly as the agent checks what it receives.

shared.wire.protocol checks a body's top level (its fields and their types); BODIES checks the
whole of it against docs/protocol.md §5 and §10: types, required keys, enums, finite numbers,
integers a store can hold, counts within the spec's limits. A coordinator checks every reply,
stream message and telemetry message with check_agent_body before it shows or stores anything:
a hostile or broken agent (docs/security.md) gets its message refused by name, never a crash and
never a value nobody checked.

Most bodies are msgspec types (shared.wire.agent_types: telemetry; shared.wire.reply_types: the
replies), checked in one pass in C; a cell record, a rank's state, a calibration and the
staging replies are still shapes (shared.shapes) written by hand. A new message type is best a
Struct, entered here as `typed.shape(TheStruct)`; a shape written by hand is entered as it is.
"""

from __future__ import annotations

from typing import Any

from shared import shapes as s
from shared.benchmark.energy import RAILS
from shared.benchmark.matrix import MAX_CELLS
from shared.benchmark.reboots import MAX_PANICS, PANIC_FILE_CAP, PANIC_TEXT_CAP
from shared.benchmark.verdict import VERDICTS, judge
from shared.cooling.clocks import MAX_CLOCK_HZ
from shared.cooling.throttle_point import CALIBRATION_STATES, calibrate_progress, calibration
from shared.distributed.group import CHECK_PROMPT_LENGTH, MAX_CHECK_TOKENS, SHARDINGS
from shared.distributed.rank_env import JACCL, RING
from shared.distributed.rank_shapes import MAX_MEMBERS, RANK_GOT
from shared.distributed.stragglers import RECORD_FIELDS as STRAGGLER_FIELDS
from shared.staging.shapes import BODIES as STAGING_BODIES
from shared.wire import agent_types, typed
from shared.wire import reply_types as replies
from shared.wire.agent_types import MAX_ID, MAX_TEXT, POLICY_STATES
from shared.wire.serving_shapes import MODES, SERVED, iteration_tokens

MAX_FLAGS = 64
CELL_STATUSES = ("ok", "failed")
"""`not run` is the coordinator's word for a cell no record came for: never the agent's."""
MAX_CELL_CLOCK_SAMPLES = 20_000
"""A cell's clock readings, one per poll (5.5 hours at 1 Hz); a job keeps no more (a sustained
cell keeps none: its windows are its curve)."""
text = s.text(MAX_TEXT)
name = s.text(MAX_TEXT, least=1)
ident = s.text(MAX_ID, least=1)
maybe_text = s.nil_or(text)
count = s.integer(0)
real = s.number()
maybe_real = s.nil_or(real)
amount = s.number(0)
"""A measured quantity that cannot be negative: seconds, bytes, watts, joules, tok/s."""
maybe_amount = s.nil_or(amount)
epoch = s.number(0)
celsius = s.nil_or(s.number(-273.15))
scalar = s.either(maybe_text, s.flag, real)
"""A fact a map may hold beyond its documented keys (an older or newer agent's)."""
open_value = s.either(scalar, s.list_of(scalar, 1024), s.map_of(scalar))
rails = s.list_of(s.one_of(RAILS), len(RAILS))
by_rail = s.map_of(real, len(RAILS) + 8)


window = s.fields(
    {
        "index": count,
        "start_s": amount,
        "end_s": amount,
        "iterations": count,
        "tokens": count,
        "timed_s": amount,
        "tokens_per_sec": maybe_amount,
        "celsius": celsius,
        "state": s.nil_or(s.one_of(POLICY_STATES)),
        "watts": maybe_real,
        "joules": maybe_real,
        "pause_s": amount,
        "paused": s.flag,
    }
)
sustain = s.fields(
    {"duration_s": amount, "window_s": amount, "windows": s.list_of(window, 1_000_000)},
    {
        "first_tokens_per_sec": maybe_amount,
        "steady_tokens_per_sec": maybe_amount,
        "throttle_ratio": maybe_amount,
        "time_to_throttle_s": maybe_amount,
        "start_celsius": celsius,
        "end_celsius": celsius,
        "temp_rise_c": maybe_real,
        "mean_power_w": maybe_real,
        "pause_s": amount,
        "paused_windows": count,
        "stopped": maybe_text,
    },
)
MEASURED = {
    "cool_wait_s": amount,
    "test_time": text,
    "tokens_per_sec": amount,
    "std_tokens_per_sec": maybe_amount,
    "latency_ms": amount,
    "std_latency_ms": maybe_amount,
    "min_latency_ms": amount,
    "median_latency_ms": amount,
    "samples_ms": s.nil_or(s.list_of(amount, 100_000)),
    "samples_tokens_per_sec": s.nil_or(s.list_of(amount, 100_000)),
    "mean_per_token_ms": maybe_amount,
    "peak_memory_gb": amount,
    "active_memory_gb": amount,
    "seq_len": count,
    "decode_tokens": count,
    "prefill_step_size": count,
    "model_revision": text,
    "wired_limit_bytes": s.nil_or(count),
    "energy_source": maybe_text,
    "energy_simulated": s.flag,
    "energy_rails": rails,
    "energy_j": maybe_real,
    "energy_net_j": maybe_real,
    "energy_window_s": maybe_amount,
    "power_w": maybe_real,
    "idle_power_w": maybe_real,
    "tokens_per_joule": maybe_real,
    "joules_per_token": maybe_real,
    "energy_by_rail_j": s.nil_or(by_rail),
    "energy_short_windows": s.nil_or(count),
    "energy_note": maybe_text,
    "sustain": sustain,
    "ci95_tokens_per_sec": maybe_amount,
    "warmup_iterations": count,
    "rewarm_iterations": count,
    "precision_target": s.nil_or(s.number(0, 1)),
    "slept_s": maybe_amount,
    "sleep_clock": maybe_text,
}
"""A record's fields that a measured cell has (§5 Cell records): absent from a cell that failed
unmeasured."""
COORDINATES = {
    "model": name,
    "bits": s.nil_or(s.integer(1, 64)),
    "n_prompt": count,
    "n_gen": count,
    "n_depth": count,
    "batch_size": s.integer(1),
    "mode": s.one_of(MODES),
    "test": name,
    "name": name,
    "status": s.one_of(CELL_STATUSES),
    "error": maybe_text,
    "soc_temp_start_c": celsius,
    "soc_temp_end_c": celsius,
    "soc_temp_c": celsius,
    "pressure_start": maybe_text,
    "pressure_end": maybe_text,
    "pause_s": amount,
    "flags": s.list_of(s.text(64, least=1), MAX_FLAGS),
    "thermal_source": maybe_text,
}
"""What every record carries, measured or not."""
panic_report = s.fields(
    {
        "file": s.text(PANIC_FILE_CAP, least=1),
        "panic_string": s.nil_or(s.text(PANIC_TEXT_CAP)),
        "time": s.nil_or(epoch),
    }
)
"""One kernel panic report a Mac's cell carries (agent.awake.panics): its name, the first line
of its panic string, when it happened."""
JUDGED = {
    "verdict": s.one_of(VERDICTS),
    "verdict_reasons": s.list_of(s.text(64, least=1), MAX_FLAGS),
    "settings": s.map_of(s.either(scalar, s.map_of(scalar)), 64),
    "boot_time": s.nil_or(epoch),
    "panics": s.list_of(panic_report, MAX_PANICS),
    "injected": s.list_of(s.text(64, least=1), MAX_FLAGS),
    "gpu_clock": s.fields(
        {
            "sustained_hz": s.nil_or(s.number(0, MAX_CLOCK_HZ)),
            "samples": s.list_of(
                s.list_of(s.nil_or(s.number(0, MAX_CLOCK_HZ)), 2), MAX_CELL_CLOCK_SAMPLES
            ),
        }
    ),
}
"""What a record says about its own worth (§5 Verdicts), optional so an older agent's records
still read: a coordinator judges every record again from its fields (shared.benchmark.verdict)."""
SHARDED_BACKENDS = (RING, JACCL)
_group_of = {
    "members": s.list_of(name, MAX_MEMBERS),
    "backend": s.one_of(SHARDED_BACKENDS),
    "sharding": s.one_of(SHARDINGS),
}
rank_of_record = s.fields({"rank": s.integer(0, MAX_MEMBERS - 1), "host": name, **_group_of})
rank_entry = s.fields(
    {"rank": s.integer(0, MAX_MEMBERS - 1), "host": name},
    {
        "weight_memory_bytes": s.nil_or(count),
        "status": s.one_of(CELL_STATUSES),
        "error": maybe_text,
        "tokens_per_sec": maybe_amount,
        "peak_memory_gb": maybe_amount,
        "active_memory_gb": maybe_amount,
        "energy_j": maybe_real,
        "power_w": maybe_real,
        "energy_source": maybe_text,
        "energy_simulated": s.nil_or(s.flag),
        "energy_note": maybe_text,
        "soc_temp_c": celsius,
        "thermal_source": maybe_text,
        "pause_s": maybe_amount,
        "flags": s.nil_or(s.list_of(s.text(64, least=1), MAX_FLAGS)),
        "verdict_reasons": s.nil_or(s.list_of(s.text(64, least=1), MAX_FLAGS)),
    },
)
GROUPED = STRAGGLER_FIELDS | {
    "greedy_tokens": s.list_of(count, CHECK_PROMPT_LENGTH + MAX_CHECK_TOKENS),
    "rank": rank_of_record,
    "group": s.fields({"ranks": s.integer(2, MAX_MEMBERS), **_group_of}),
    "ranks": s.list_of(rank_entry, MAX_MEMBERS),
    "greedy_tokens_agree": s.nil_or(s.flag),
}
"""A distributed cell's fields (§17): a rank's record says which rank it is and the greedy
tokens its model decoded; the coordinator's record of the group's cell (shared.reports.group_cells)
carries the group and every rank's figures (`probe`, `stragglers`: distributed.stragglers)."""
RECORD_FIELDS = COORDINATES | MEASURED | JUDGED | GROUPED | SERVED | {"host": name}
_record_shape = s.fields(COORDINATES, MEASURED | JUDGED | GROUPED | SERVED | {"host": name})
"""A coordinator's stored records add `host` (the host as it names it)."""
SPEED_SLACK = 1e-6
"""Relative rounding a mean rate may sit above the best iteration's by."""
FASTEST_ITERATION_MS = 1e-3
"""No timed iteration of an MLX cell takes less than a microsecond (one mx.eval costs more)."""


def record(value: Any) -> None:
    """One cell record (§5 Cell records); a measured one's figures must agree with each other:
    its mean rate cannot beat its fastest iteration, which took at least a microsecond."""
    _record_shape(value)
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


MACHINE_FIELDS = typed.field_checks(replies.Machine)
MODEL_FIELDS = typed.field_checks(replies.Model)
model_info = typed.shape(replies.OpenModel)
gang_request = typed.shape(agent_types.GangRequest)
"""gang.state, which agents (and `agent run`) send each other: checked by the agent."""
BODIES: dict[str, s.Check] = {
    "hello.ok": typed.shape(replies.Hello),
    "ping.ok": typed.shape(replies.Ping),
    "info.ok": typed.shape(replies.Info),
    "bench.start.ok": typed.shape(replies.Started),
    "bench.check.ok": typed.shape(replies.Checked),
    "bench.progress": typed.shape(replies.Progress),
    "bench.cell": s.fields({"job": ident, "index": s.integer(0, MAX_CELLS - 1), "record": record}),
    "bench.done": typed.shape(replies.Done),
    "bench.cancel.ok": typed.shape(replies.JobNamed),
    "job.get.ok": s.fields(
        {
            "job": ident,
            "state": s.one_of(replies.JOB_STATES),
            "error": maybe_text,
            "spec": s.map_of(open_value, 64),
            "models": s.list_of(model_info, MAX_CELLS),
            "records": s.list_of(record, MAX_CELLS),
            "offset": s.integer(0, MAX_CELLS),
            "next": s.nil_or(s.integer(1, MAX_CELLS)),
            "started": text,
            "finished": maybe_text,
        }
    ),
    "job.list.ok": typed.shape(replies.JobList),
    "history.get.ok": typed.shape(replies.HistoryPage),
    "policy.get.ok": typed.shape(replies.PolicyInForce),
    "policy.set.ok": typed.shape(replies.PolicyInForce),
    "job.event.ok": typed.shape(replies.JobNamed),
    "gang.state.ok": typed.shape(agent_types.GangState),
    "doctor.ok": typed.shape(replies.Doctor),
    "rank.start.ok": typed.shape(replies.RankStarted),
    "rank.get.ok": RANK_GOT,
    "rank.stop.ok": RANK_GOT,
    "calibrate.start.ok": typed.shape(replies.CalibrationStarted),
    "calibrate.get.ok": s.fields(
        {"state": s.one_of(CALIBRATION_STATES), "minutes": typed.shape(replies.Minutes | None)}
        | {"progress": s.nil_or(calibrate_progress), "calibration": s.nil_or(calibration)}
        | {key: maybe_text for key in ("source", "error", "origin")}
        | {"policy": typed.shape(agent_types.Policy), "policy_origin": text}
    ),
    "error": typed.shape(replies.Error),
    "telemetry.sample": typed.shape(agent_types.SampleBody),
    "telemetry.event": typed.shape(agent_types.EventBody),
} | STAGING_BODIES
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
            if isinstance(key, str) and _fits(open_value, entry):
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


def _fits(check: s.Check, value: Any) -> bool:
    try:
        check(value)
    except s.Invalid:
        return False
    return True
