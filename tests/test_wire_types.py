"""What an agent sends, decoded and checked by msgspec types (shared.wire.agent_types), refused in
shared.shapes' words (shared.wire.typed): the hot path a monitor takes for telemetry, and the
check every reply gets."""

from __future__ import annotations

import math
from typing import Any

import msgpack
import msgspec
import pytest

from shared.shapes import Invalid
from shared.wire import protocol as p
from shared.wire.agent_shapes import check_agent_body, salvaged_record
from shared.wire.agent_types import decode_agent_telemetry
from shared.wire.telemetry import Sample
from tests.test_agent_shapes import RECORD, SAMPLE, cell

JOB = SAMPLE["jobs"][0]
EVENT: dict[str, Any] = {
    "host": "mac1",
    "seq": 3,
    "time": 1796185515.6,
    "job": None,
    "pid": None,
    "action": "policy",
    "source": "sim",
    "simulated": True,
    "celsius": None,
    "detail": None,
    "policy": {
        "max_speed_temp": 75.0,
        "pause_temp": 85.0,
        "stop_temp": 95.0,
        "pause_duration": 0.5,
        "hysteresis": 0.0,
    },
}


def frames(body: dict[str, Any], type_: str = "telemetry.sample", **envelope: Any) -> list[bytes]:
    message = {"v": p.PROTOCOL_VERSION, "id": "ab12", "type": type_, "re": None, "body": body}
    return [p.TOPICS[type_], msgpack.packb(message | envelope)]


def test_a_sample_decodes_with_every_field_and_nested_optional_ones_left_out() -> None:
    message = decode_agent_telemetry(frames(SAMPLE))
    assert message.type == "telemetry.sample" and message.id == "ab12" and message.re is None
    assert message.body == SAMPLE | {name: None for name in Sample.columns() if name not in SAMPLE}
    assert message.body["jobs"] == [JOB], "a job's gang and work, left out, stay out"
    event = decode_agent_telemetry(frames(EVENT, "telemetry.event"))
    assert event.body == EVENT


BAD_SAMPLES = [
    (SAMPLE | {"seq": 2**63}, "seq is 9223372036854775808, above 9223372036854775807"),
    (SAMPLE | {"seq": 0}, "seq is 0, below 1"),
    (SAMPLE | {"state": "melting"}, "state is 'melting', not one of ok, pace, pause,"),
    (SAMPLE | {"celsius": math.nan}, "celsius is nan, not a finite number"),
    (SAMPLE | {"power_w": -math.inf}, "power_w is -inf, not a finite number"),
    (SAMPLE | {"jobs": [None]}, "jobs[0] is nil, not a map"),
    (SAMPLE | {"jobs": [JOB | {"pid": 1.5}]}, "jobs[0].pid is a float, not an int"),
    (SAMPLE | {"jobs": [JOB | {"gang": {"group": "g"}}]}, "jobs[0].gang.rank is missing"),
    (SAMPLE | {"jobs": [JOB] * 1025}, "jobs has 1025 items, more than 1024"),
    (SAMPLE | {"host": ""}, "host has 0 characters, fewer than 1"),
    (SAMPLE | {"source": "x" * 16_385}, "source has 16385 characters, more than 16384"),
    (SAMPLE | {"power": {"watts": {}}}, "power.source is missing"),
    (
        SAMPLE | {"power": SAMPLE["power"] | {"joules": {"gpu": 1.0, "cpu": math.nan}}},
        "power.joules.cpu is nan, not a finite number",
    ),
    (SAMPLE | {"power": SAMPLE["power"] | {"extra": 1}}, "power has an unknown field 'extra'"),
    (SAMPLE | {"duty": 1.5}, "duty is 1.5, above 1.0"),
]


@pytest.mark.parametrize(("body", "problem"), BAD_SAMPLES)
def test_a_refusal_names_the_field_and_its_problem(body: dict[str, Any], problem: str) -> None:
    """The same line on the hot path (bytes off a SUB) and for a map already decoded (a
    history page's samples): the field's path, what it holds, what it should."""
    with pytest.raises(p.ProtocolError) as refused:
        decode_agent_telemetry(frames(body))
    assert refused.value.code == p.BAD_BODY and refused.value.re == "ab12"
    assert refused.value.message.startswith(f"telemetry.sample: {problem}")
    with pytest.raises(Invalid) as checked:
        check_agent_body("telemetry.sample", body)
    assert str(checked.value).startswith(problem)


def test_an_events_policy_is_checked_beyond_its_types() -> None:
    backwards = EVENT | {"policy": EVENT["policy"] | {"pause_temp": 99.0}}
    with pytest.raises(p.ProtocolError, match="policy is not a policy: .*order"):
        decode_agent_telemetry(frames(backwards, "telemetry.event"))
    paced = EVENT | {"policy": EVENT["policy"] | {"pace_temp": 80.0}}
    assert decode_agent_telemetry(frames(paced, "telemetry.event")).body == paced
    with pytest.raises(p.ProtocolError, match="policy.pace_slice is nil, not a number"):
        decode_agent_telemetry(
            frames(EVENT | {"policy": EVENT["policy"] | {"pace_slice": None}}, "telemetry.event")
        )


@pytest.mark.parametrize(
    ("sent", "code", "problem"),
    [
        (frames(SAMPLE, v=3), p.BAD_VERSION, "protocol version 3 is not spoken here"),
        (frames(SAMPLE, id=""), p.MALFORMED, "id must be a string of 1 to 64"),
        (frames(SAMPLE, extra=1), p.MALFORMED, "bad envelope: unknown key(s) ['extra']"),
        ([b"event", frames(SAMPLE)[1]], p.MALFORMED, "topic b'event' does not match"),
        ([b"sample", b"\xc1"], p.MALFORMED, "not msgpack"),
        (frames(SAMPLE)[1:], p.MALFORMED, "telemetry is two frames"),
        (frames({**SAMPLE, "seq": "7"}), p.BAD_BODY, "field 'seq' has the wrong type (str)"),
    ],
)
def test_an_envelope_problem_is_the_protocols(sent: list[bytes], code: str, problem: str) -> None:
    """What p.decode_telemetry refuses is refused in its words, checked in its order
    (docs/protocol.md §4)."""
    with pytest.raises(p.ProtocolError) as refused:
        decode_agent_telemetry(sent)
    assert refused.value.code == code
    assert problem in refused.value.message


def test_a_key_sent_twice_is_its_last_value_checked() -> None:
    """As msgpack reads such a map (the protocol's decode): the last value counts."""
    body = msgpack.packb(SAMPLE)
    assert body[:3] == b"\xde\x00\x10"  # a map of 16
    twice = b"\xde\x00\x11" + body[3:] + msgpack.packb("seq") + msgpack.packb(8)
    envelope = msgpack.packb({"v": p.PROTOCOL_VERSION, "id": "ab12", "type": "telemetry.sample"})
    data = b"\x85" + envelope[1:] + msgpack.packb("re") + b"\xc0" + msgpack.packb("body") + twice
    assert decode_agent_telemetry([b"sample", data]).body["seq"] == 8


MACHINE = {"hostname": "mac1", "chip": "Apple M4", "memory_gb": 32.0, "cpu_count": 10}
REPORT: dict[str, Any] = {
    "host": "mac1",
    "ok": True,
    "checks": [{"name": "sensor", "ok": True, "detail": "TCMz", "fix": None}],
    "machine": MACHINE | {"a_newer_fact": [1, 2]},
    "uptime_s": 12.0,
}


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        ({"report": REPORT}, None),
        ({"report": REPORT | {"machine": None}}, None),
        (
            {"report": REPORT | {"machine": MACHINE | {"cpu_count": -1}}},
            "report.machine.cpu_count is -1, below 0",
        ),
        (
            {"report": REPORT | {"machine": MACHINE | {"newer": {"deep": [1]}}}},
            "report.machine.newer.deep is a list, not a bool, a number, a str or nil",
        ),
        ({"report": {k: v for k, v in REPORT.items() if k != "ok"}}, "report.ok is missing"),
        ({"report": REPORT | {"checks": [{"name": "x"}]}}, "report.checks[0].ok is missing"),
        (
            {"report": REPORT | {f"k{i}": i for i in range(1025)}},
            "report has 1026 unknown fields",
        ),
        ({"report": REPORT | {"bandwidth": {"error": "no GPU"}}}, None),
        ({"report": REPORT | {"bandwidth": 5}}, "report.bandwidth is a int, not a map or nil"),
    ],
)
def test_an_open_map_types_what_is_documented_and_takes_open_values(
    body: dict[str, Any], problem: str | None
) -> None:
    """A doctor report: its documented keys typed (its machine's too), the others any scalar, or
    a list or map of them (docs/protocol.md §4, What a coordinator accepts); its `bandwidth`
    checked by hand after the types (shared.benchmark.bandwidth)."""
    if problem is None:
        check_agent_body("doctor.ok", body)
        return
    with pytest.raises(Invalid) as refused:
        check_agent_body("doctor.ok", body)
    assert str(refused.value) == problem


def test_a_history_page_is_checked_sample_by_sample() -> None:
    page = {"history": "h", "samples": [SAMPLE] * 3, "events": [EVENT], "truncated": False}
    check_agent_body("history.get.ok", page)
    page["samples"] = [SAMPLE, SAMPLE | {"jobs": [JOB | {"state": "sleeping"}]}]
    with pytest.raises(Invalid, match=r"^samples\[1\]\.jobs\[0\]\.state is 'sleeping', not one"):
        check_agent_body("history.get.ok", page)


@pytest.mark.parametrize(
    ("changes", "problem"),
    [
        ({"sustain": {"duration_s": 1.0}}, "record.sustain.window_s is missing"),
        ({"panics": [{"file": ""}]}, "record.panics[0].file has 0 characters, fewer than 1"),
        ({"gpu_clock": {"sustained_hz": 2e10, "samples": []}}, "record.gpu_clock.sustained_hz"),
        ({"probe": None}, "record.probe is nil, not a map"),
        ({"probe": {"compute_s": [0.01]}}, "record.probe.wait_s is missing"),
        ({"settings": {"a": [1]}}, "record.settings.a is a list, not a bool, a number"),
        ({"tokens_per_sec": 1e308}, "record.tokens_per_sec is 1e+308, faster than its fastest"),
        ({"status": "failed", "tokens_per_sec": 1e308}, None),
        ({"peak_memory_gb": None, "active_memory_gb": None}, None),  # a cell served over HTTP
    ],
)
def test_a_records_fields_typed_and_by_hand_are_named_alike(
    changes: dict[str, Any], problem: str | None
) -> None:
    """A record's own fields are types; the stragglers' `probe` is still a shape written by
    hand (shared.distributed.stragglers), run after them; both name the field the same way,
    and a measured record's figures must agree (a failed one's need not)."""
    body = cell(**changes)
    if problem is None:
        check_agent_body("bench.cell", body)
        return
    with pytest.raises(Invalid) as refused:
        check_agent_body("bench.cell", body)
    assert str(refused.value).startswith(problem)


def test_a_stored_record_keeps_each_field_its_type_accepts() -> None:
    kept = salvaged_record(RECORD | {"host": "mac1", "bits": "sixteen", "flags": [""]})
    assert kept["bits"] is None and kept["flags"] is None and kept["status"] == "failed"
    assert kept["invalid"] == [
        "bits is a str, not an int or nil",
        "flags[0] has 0 characters, fewer than 1",
    ]
    assert kept["tokens_per_sec"] == RECORD["tokens_per_sec"]


def test_each_types_fields_are_the_ones_the_protocol_lists() -> None:
    """A body's msgspec type and shared.wire.protocol.SCHEMAS (for telemetry: the Sample and
    Event records of shared.wire.telemetry) name the same fields, the same ones optional: a
    field added to one and not the other fails here, not on the wire."""
    from shared.wire.agent_shapes import TYPES

    for type_, body in TYPES.items():
        schema = p.SCHEMAS[type_]
        fields = {f.encode_name: f.required for f in msgspec.structs.fields(body)}
        assert set(fields) == set(schema), type_
        optional = {name for name, (_, required) in schema.items() if not required}
        assert {name for name, required in fields.items() if not required} == optional, type_


def test_a_number_keeps_its_kind_and_an_int_its_64_bits() -> None:
    """docs/protocol.md §4: numbers finite, integers within 64 bits, whatever the field."""
    body = decode_agent_telemetry(frames(SAMPLE | {"pause_s_total": 3, "power_w": 4.5})).body
    assert type(body["pause_s_total"]) is int and body["power_w"] == 4.5
    with pytest.raises(p.ProtocolError, match=r"time is 9223372036854775808, above 92233"):
        decode_agent_telemetry(frames(SAMPLE | {"time": 2**63}))
    with pytest.raises(p.ProtocolError, match="power.watts.gpu is a bool, not a number$"):
        decode_agent_telemetry(
            frames(SAMPLE | {"power": SAMPLE["power"] | {"watts": {"gpu": True}}})
        )
    with pytest.raises(Invalid, match="^power_w is a bool, not a number or nil$"):
        check_agent_body("telemetry.sample", SAMPLE | {"power_w": True})
