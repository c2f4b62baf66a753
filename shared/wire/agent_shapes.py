"""What an agent may send, checked as strictly as the agent checks what it receives.

shared.wire.protocol checks a body's top level (its fields and their types); these shapes check what
lies inside (a cell record, a sample's power map, every page of history) against docs/protocol.md
§5 and §10: types, required keys, enums, finite numbers, integers a store can hold, counts within
the spec's limits. A coordinator checks every reply, stream message and telemetry message with
check_agent_body before it shows or stores anything: a hostile or broken agent (docs/security.md)
gets its message refused by name, never a crash and never a value nobody checked.
"""

from __future__ import annotations

from typing import Any

from shared import shapes as s
from shared.benchmark.bandwidth import RAW as BANDWIDTH
from shared.benchmark.energy import RAILS
from shared.benchmark.matrix import MAX_CELLS, MAX_COOL_START_S
from shared.benchmark.reboots import MAX_PANICS, PANIC_FILE_CAP, PANIC_TEXT_CAP
from shared.benchmark.verdict import VERDICTS, judge
from shared.bounds import MAX_CALIBRATE_MINUTES
from shared.cooling.clocks import MAX_CLOCK_HZ
from shared.cooling.throttle_point import CALIBRATION_STATES, calibrate_progress, calibration
from shared.distributed.group import CHECK_PROMPT_LENGTH, MAX_CHECK_TOKENS, SHARDINGS
from shared.distributed.rank_env import JACCL, RING
from shared.distributed.rank_shapes import MAX_MEMBERS, RANK_GOT
from shared.distributed.stragglers import RECORD_FIELDS as STRAGGLER_FIELDS
from shared.staging.shapes import BODIES as STAGING_BODIES
from shared.wire import agent_types, typed
from shared.wire.agent_types import MAX_ID, MAX_TEXT, POLICY_STATES
from shared.wire.serving_shapes import MODES, SERVED, iteration_tokens

MAX_HISTORY_ITEMS = 10_000
"""Samples, and events, in one history.get page (the `limit` an agent takes, §10)."""
MAX_JOBS_LISTED = 100
MAX_CHECKS = 256
MAX_FLAGS = 64
MAX_SOURCE = 256
"""A thermal source's name (`replay:PATH` names a path) or a sensor's."""
JOB_STATES = ("running", "ok", "failed", "cancelled")
DONE_STATES = ("ok", "failed", "cancelled")
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
seq = s.integer(1)
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


calibrate_minutes = s.number(0, MAX_CALIBRATE_MINUTES)
_policy = typed.shape(agent_types.Policy)


MACHINE_FIELDS: dict[str, s.Check] = {
    "hostname": maybe_text,
    "chip": maybe_text,
    "device": maybe_text,
    "backend": maybe_text,
    "hw_model": maybe_text,
    "os": maybe_text,
    "memory_gb": maybe_amount,
    "memory_gib": maybe_amount,
    "gpu_cores": s.nil_or(count),
    "metal_working_set_bytes": s.nil_or(count),
    "cpu_count": s.nil_or(count),
}
machine = s.fields({}, MACHINE_FIELDS, others=open_value)
reading = s.fields(
    {"celsius": celsius, "source": text, "time": epoch, "simulated": s.flag},
    {
        "sensor": maybe_text,
        "pressure": maybe_text,
        "sensors": s.nil_or(s.map_of(celsius)),
        "note": maybe_text,
    },
)
thermal = s.fields(
    {"source": text, "simulated": s.flag, "reading": s.nil_or(reading), "error": maybe_text}
)
power_reading = s.fields(
    {"source": text, "simulated": s.flag, "time": epoch, "watts": by_rail, "joules": by_rail},
    {"total_w": maybe_real, "total_j": maybe_real},
)
power = s.fields(
    {
        "source": text,
        "simulated": s.flag,
        "rails": rails,
        "resolution_s": maybe_amount,
        "reading": s.nil_or(power_reading),
        "error": maybe_text,
    }
)
gang_request = typed.shape(agent_types.GangRequest)
"""gang.state, which agents (and `agent run`) send each other: checked by the agent."""
supervised_jobs = typed.shape(agent_types.SupervisedJobs)
storage = s.fields(
    {
        "ok": s.flag,
        "failing": s.list_of(
            s.fields(
                {"what": text, "path": text, "error": text, "since": epoch, "failures": count}
            ),
            64,
        ),
    }
)
running_job = s.fields(
    {"id": ident, "done": count, "total": count}, {"started": s.either(maybe_text, epoch)}
)
MODEL_FIELDS: dict[str, s.Check] = {
    "model": text,
    "label": text,
    "bits": s.nil_or(s.integer(1, 64)),
    "param_count": s.nil_or(count),
    "weight_memory_bytes": s.nil_or(count),
    "weight_memory_gb": maybe_amount,
    "kv_bytes_per_position": s.nil_or(count),
    "num_arrays": s.nil_or(count),
    "kind": maybe_text,
    "model_type": maybe_text,
    "revision": maybe_text,
    "greedy_tokens": s.list_of(count, CHECK_PROMPT_LENGTH + MAX_CHECK_TOKENS),
    "ranks": s.list_of(
        s.fields(
            {"host": name},
            {"param_count": s.nil_or(count), "weight_memory_bytes": s.nil_or(count)},
        ),
        MAX_MEMBERS,
    ),
}
"""A model's info (§5 bench.progress): `greedy_tokens` its correctness check; `ranks` (a
coordinator's record of a group's model) what each rank holds of it."""
cool_wait = s.fields(
    {
        "celsius": celsius,
        "pressure": maybe_text,
        "target_c": s.number(-273.15),
        "waited_s": s.number(0, MAX_COOL_START_S * 2),
        "limit_s": s.number(0, MAX_COOL_START_S),
        "done": s.flag,
        "hot": s.flag,
        "injected": s.flag,
    }
)
pause_view = s.fields(
    {
        "celsius": celsius,
        "pressure": maybe_text,
        "source": text,
        "sensor": maybe_text,
        "paused_s": s.number(0, 7 * 86_400),
        "done": s.flag,
    }
)
phase = s.fields(
    {"kind": s.one_of(("build", "baseline"))},
    {
        "model": text,
        "label": text,
        "bits": s.nil_or(s.integer(1, 64)),
        "param_count": s.nil_or(s.integer(0, 10**15)),
        "seconds": s.number(0, 86_400),
    },
)
model_info = s.fields(
    {"model": text, "label": text},
    {k: v for k, v in MODEL_FIELDS.items() if k not in ("model", "label")},
    others=open_value,
)
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


sample = typed.shape(agent_types.SampleBody)
event = typed.shape(agent_types.EventBody)
listed_job = s.fields(
    {
        "job": ident,
        "request": s.nil_or(ident),
        "state": s.one_of(JOB_STATES),
        "total": s.integer(0, MAX_CELLS),
        "done": s.integer(0, MAX_CELLS),
        "error": maybe_text,
        "started": text,
        "finished": maybe_text,
    }
)
doctor_check = s.fields(
    {"name": text, "ok": s.flag, "detail": text, "fix": maybe_text}, {"required": s.flag}
)
report = s.fields(
    {"host": text, "ok": s.flag, "checks": s.list_of(doctor_check, MAX_CHECKS)},
    {"machine": s.nil_or(machine), "bandwidth": s.nil_or(BANDWIDTH)},
    others=open_value,
)

BODIES: dict[str, s.Check] = {
    "hello.ok": s.fields(
        {"agent": text, "protocol": s.integer(0), "hostname": text, "secure": s.flag}
    ),
    "ping.ok": s.fields({"job": s.nil_or(ident), "time": epoch}),
    "info.ok": s.fields(
        {
            "agent": text,
            "protocol": s.integer(0),
            "name": name,
            "machine": machine,
            "thermal": thermal,
            "power": power,
            "job": s.nil_or(running_job),
            "telemetry_port": s.integer(1, 65535),
            "poll_interval": s.number(1e-3, 86_400),
            "policy": _policy,
            "jobs": supervised_jobs,
            "history": name,
            "storage": storage,
        },
        {"policy_origin": maybe_text},
    ),
    "bench.start.ok": s.fields({"job": ident, "cells": s.list_of(name, MAX_CELLS)}),
    "bench.check.ok": s.fields(
        {"cells": s.list_of(name, MAX_CELLS)}, {"models": s.map_of(maybe_text, MAX_CELLS)}
    ),
    "bench.progress": s.fields(
        {"job": ident, "done": s.integer(0, MAX_CELLS), "total": s.integer(0, MAX_CELLS)},
        {
            "model": s.nil_or(model_info),
            "cooling": s.nil_or(cool_wait),
            "pause": s.nil_or(pause_view),
            "phase": s.nil_or(phase),
        },
    ),
    "bench.cell": s.fields({"job": ident, "index": s.integer(0, MAX_CELLS - 1), "record": record}),
    "bench.done": s.fields(
        {
            "job": ident,
            "status": s.one_of(DONE_STATES),
            "error": maybe_text,
            "cells": s.integer(0, MAX_CELLS),
        }
    ),
    "bench.cancel.ok": s.fields({"job": ident}),
    "job.get.ok": s.fields(
        {
            "job": ident,
            "state": s.one_of(JOB_STATES),
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
    "job.list.ok": s.fields({"jobs": s.list_of(listed_job, MAX_JOBS_LISTED)}),
    "history.get.ok": s.fields(
        {
            "history": name,
            "samples": s.list_of(sample, MAX_HISTORY_ITEMS),
            "events": s.list_of(event, MAX_HISTORY_ITEMS),
            "truncated": s.flag,
        }
    ),
    "policy.get.ok": s.fields({"policy": _policy}, {"origin": maybe_text}),
    "policy.set.ok": s.fields({"policy": _policy}, {"origin": maybe_text}),
    "job.event.ok": s.fields({"job": ident}),
    "gang.state.ok": typed.shape(agent_types.GangState),
    "doctor.ok": s.fields({"report": report}),
    "rank.start.ok": s.fields({"job": ident, "rank": s.integer(0, MAX_MEMBERS - 1)}),
    "rank.get.ok": RANK_GOT,
    "rank.stop.ok": RANK_GOT,
    "calibrate.start.ok": s.fields({"minutes": calibrate_minutes, "source": name}),
    "calibrate.get.ok": s.fields(
        {"state": s.one_of(CALIBRATION_STATES), "minutes": s.nil_or(calibrate_minutes)}
        | {"progress": s.nil_or(calibrate_progress), "calibration": s.nil_or(calibration)}
        | {key: maybe_text for key in ("source", "error", "origin")}
        | {"policy": _policy, "policy_origin": text}
    ),
    "error": s.fields({"code": text, "message": text}),
    "telemetry.sample": sample,
    "telemetry.event": event,
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
