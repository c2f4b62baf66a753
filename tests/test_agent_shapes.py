"""What an agent sends, checked to its last field (shared.wire.agent_shapes), and what a stored run
that predates the checks still shows (salvaged_record, the report's formats)."""

from __future__ import annotations

import copy
import json
import math
from typing import Any

import pytest

from coordinator.runs.driver import HostJob
from shared.reports.benchmark import render_text
from shared.shapes import Invalid
from shared.wire.agent_shapes import check_agent_body, salvaged_record

RECORD: dict[str, Any] = {
    "model": "small",
    "bits": 16,
    "n_prompt": 8,
    "n_gen": 0,
    "n_depth": 0,
    "batch_size": 1,
    "mode": "prefill",
    "test": "pp8",
    "name": "small/f16 pp8 b1",
    "status": "ok",
    "error": None,
    "tokens_per_sec": 140.0,
    "std_tokens_per_sec": 2.0,
    "latency_ms": 57.0,
    "std_latency_ms": 1.0,
    "min_latency_ms": 55.5,
    "median_latency_ms": 57.0,
    "samples_ms": [55.5, 58.5],
    "samples_tokens_per_sec": [144.1, 136.8],
    "peak_memory_gb": 0.0086,
    "active_memory_gb": 0.0085,
    "seq_len": 8,
    "prefill_step_size": 2048,
    "soc_temp_start_c": 35.5,
    "soc_temp_end_c": 36.9,
    "soc_temp_c": 36.9,
    "pressure_start": None,
    "pressure_end": None,
    "pause_s": 0.0,
    "flags": ["simulated"],
    "thermal_source": "sim",
    "energy_source": None,
    "energy_simulated": False,
    "energy_rails": [],
    "energy_j": None,
    "energy_note": "no power meter: none",
    "test_time": "2026-12-02T04:25:19+00:00",
    "wired_limit_bytes": None,
}
SAMPLE: dict[str, Any] = {
    "host": "mac1",
    "seq": 7,
    "time": 1796185515.6,
    "celsius": 35.0,
    "pressure": None,
    "source": "sim",
    "simulated": True,
    "state": "ok",
    "trend_c_per_min": None,
    "pause_s_total": 0.0,
    "jobs": [{"job": "j-1", "pid": 42, "command": "bench", "state": "running", "kind": "bench"}],
    "storage_error": None,
    "power_w": 4.0,
    "energy_j": 0.5,
    "power": {
        "source": "sim",
        "simulated": True,
        "watts": {"system": 4.0},
        "joules": {"system": 0.5},
        "error": None,
    },
    "sensor": None,
}


def cell(**changes: Any) -> dict[str, Any]:
    record = copy.deepcopy(RECORD) | changes
    return {"job": "j-1", "index": 0, "record": record}


def test_what_a_real_agent_sends_is_valid() -> None:
    check_agent_body("bench.cell", cell())
    check_agent_body("telemetry.sample", SAMPLE)
    check_agent_body(
        "history.get.ok", {"history": "h", "samples": [SAMPLE], "events": [], "truncated": False}
    )


@pytest.mark.parametrize(
    ("type_", "body", "problem"),
    [
        ("bench.cell", cell(tokens_per_sec="fast"), "record.tokens_per_sec is a str, not a number"),
        ("bench.cell", cell(tokens_per_sec=math.nan), "record.tokens_per_sec is nan"),
        ("bench.cell", cell(latency_ms=math.inf), "record.latency_ms is inf"),
        ("bench.cell", cell(tokens_per_sec=1e308), "faster than its fastest iteration"),
        ("bench.cell", cell(min_latency_ms=1e-9), "below a microsecond"),
        ("bench.cell", cell(status="not run"), "record.status is 'not run'"),
        ("bench.cell", cell(surprise=1), "unknown field 'surprise'"),
        ("bench.cell", cell(batch_size=True), "record.batch_size is a bool"),
        (
            "bench.cell",
            {"job": "j-1", "index": 2**63, "record": RECORD},
            "index is 9223372036854775808",
        ),
        ("bench.cell", {"job": "j-1", "index": -1, "record": RECORD}, "index is -1"),
        ("telemetry.sample", SAMPLE | {"seq": 2**63}, "seq is 9223372036854775808"),
        ("telemetry.sample", SAMPLE | {"state": "melting"}, "state is 'melting'"),
        ("telemetry.sample", SAMPLE | {"celsius": math.nan}, "celsius is nan"),
        ("telemetry.sample", SAMPLE | {"jobs": [None]}, "jobs[0] is nil, not a map"),
        ("telemetry.sample", SAMPLE | {"power": {"watts": {}}}, "power.source is missing"),
        (
            "history.get.ok",
            {"history": "h", "samples": [None], "events": [], "truncated": False},
            "samples[0] is nil",
        ),
        (
            "policy.get.ok",
            {
                "policy": {
                    "max_speed_temp": 90,
                    "pause_temp": 80,
                    "stop_temp": 95,
                    "pause_duration": 1,
                    "hysteresis": 0,
                }
            },
            "policy is not a policy: thresholds out of order",
        ),  # fmt: skip
        ("bench.done", {"job": "j-1", "status": "exploded", "error": None, "cells": 1}, "status"),
        ("hello", {}, "hello is not a message an agent sends"),
    ],
)
def test_every_problem_is_named_by_its_path(type_: str, body: dict[str, Any], problem: str) -> None:
    with pytest.raises(Invalid) as refused:
        check_agent_body(type_, body)
    assert problem in str(refused.value)


def test_a_record_is_kept_once_and_only_for_a_cell_of_the_job() -> None:
    job = HostJob("j-1", cells=["small/f16 pp8 b1", "small/f16 tg4 b1"])
    assert job.accept(0, RECORD)
    assert not job.accept(0, copy.deepcopy(RECORD)), "the same record again is a duplicate"
    with pytest.raises(Invalid, match="second record for cell 0, unlike the first"):
        job.accept(0, RECORD | {"tokens_per_sec": 141.0})
    with pytest.raises(Invalid, match="index 7, but the job has 2 cells"):
        job.accept(7, RECORD)
    with pytest.raises(Invalid, match="cell 1 named 'small/f16 pp8 b1'"):
        job.accept(1, RECORD)
    assert job.records[0]["tokens_per_sec"] == 140.0


def report_of(records: list[dict[str, Any]]) -> dict[str, Any]:
    return {"title": "stored", "hosts": [{"host": "mac1", "machine": None}], "cells": records}


@pytest.mark.parametrize("fmt", ["table", "md", "csv", "json", "jsonl", "sql"])
def test_a_stored_run_with_bad_values_still_shows_and_exports(fmt: str) -> None:
    """Stored before agents' messages were checked: a str speed, an inf latency, a NaN."""
    bad = RECORD | {"tokens_per_sec": "fast", "latency_ms": math.inf, "peak_memory_gb": math.nan}
    records = [salvaged_record(bad | {"host": "mac1"}), salvaged_record(RECORD | {"host": "mac2"})]
    assert records[0]["status"] == "failed"
    assert records[0]["tokens_per_sec"] is None
    assert any("tokens_per_sec is a str" in problem for problem in records[0]["invalid"])
    text = render_text(report_of(records), fmt)
    if fmt in ("json", "jsonl"):
        for line in [text] if fmt == "json" else text.splitlines():
            json.loads(line, parse_constant=lambda word: pytest.fail(f"{word} in JSON"))
    assert "140.00" in text or "140.0" in text, "the good record is whole"
    if fmt in ("table", "md"):
        assert "INVALID" in text


def test_agent_strings_are_escaped_in_every_text_format() -> None:
    hostile = "\x1b]52;c;SGVsbG8=\x07[link=file:///etc/passwd]x[/link]\u202e\u200b\nFAKE ROW"
    record = RECORD | {
        "host": "mac1",
        "model": hostile,
        "error": hostile,
        "thermal_source": hostile,
    }
    report = report_of([record])
    for fmt in ("table", "md", "csv", "sql", "json", "jsonl"):
        text = render_text(report, fmt)
        for raw in ("\x1b", "\x07", "\u202e", "\u200b"):
            assert raw not in text, (fmt, raw)
        assert not any(line.startswith("FAKE ROW") for line in text.splitlines()), fmt
    assert "[link=" in render_text(report, "table"), "markup shown as text, never parsed"
    assert "[link=file:///etc/passwd]x[/link]" in render_text(report, "md")


def test_every_type_an_agent_sends_has_a_shape() -> None:
    from shared.wire import protocol as p
    from shared.wire.agent_shapes import BODIES

    assert set(p.SCHEMAS) - p.REQUESTS == set(BODIES)
