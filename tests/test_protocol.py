"""The wire protocol's pure core: envelopes, bodies, refusals, and handshake diagnoses."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
import zmq

from shared.io.transport import handshake_diagnosis, timeout_diagnosis
from shared.wire import protocol as p

GANG_MEMBER = {
    "rank": 1,
    "host": "mac2",
    "state": "pause",
    "applied": "pause",
    "celsius": 86.5,
    "source": "smc",
    "sensor": "TCMz",
    "time": 1764547200.0,
    "job": "3f2a",
    "age_s": 0.0,
}
RANK_STATE = {
    "job": "n-1",
    "rank": 0,
    "state": "ok",
    "elapsed_s": 2.5,
    "error": None,
    "report": {"all_sum": {}, "send_recv": {}},
}
CALIBRATION = {
    "source": "smc",
    "simulated": False,
    "calibrated_at": 1796515200.0,
    "onset_c": 101.5,
    "sensor": "Tg0k",
    "sensor_onsets": {"Tg0k": 101.5, "TCMz": 97.0},
    "time_to_throttle_s": 540.0,
    "signal": "gpu clock",
    "reference": 1.398e9,
    "throttled": {
        "work_rate": 40.0,
        "duty": 1.0,
        "celsius": 101.2,
        "clock_hz": 1.1e9,
        "seconds": 300.0,
    },
    "held": {
        "work_rate": 31.0,
        "duty": 0.55,
        "celsius": 100.3,
        "clock_hz": 1.398e9,
        "seconds": 400.0,
    },
    "duty_cycle": 0.55,
    "start_c": 41.0,
    "evidence": "GPU 1.11 GHz of 1.40 sustained",
}
STAGE_TASK = {
    "model": "mlx-community/tiny",
    "revision": "0123456789abcdef0123456789abcdef01234567",
    "role": "receiver",
    "state": "fetching",
    "digest": "ab" * 32,
    "bytes": 1024,
    "total": 4096,
    "resumed": 0,
    "rate": 512.0,
    "capped": False,
    "source": "10.0.0.2:5555",
    "served": 0,
    "files": 3,
    "files_done": 1,
    "error": None,
    "started": 1.7e9,
    "finished": None,
}
STAGED_FILE = {"path": "config.json", "size": 2, "sha256": "cd" * 32, "chunks": ["cd" * 32]}
VALID_BODIES: dict[str, dict[str, Any]] = {
    "stage.prepare": {"model": "mlx-community/tiny@main", "download": True},
    "stage.fetch": {
        "model": "mlx-community/tiny",
        "revision": STAGE_TASK["revision"],
        "digest": STAGE_TASK["digest"],
        "size": 4096,
        "source": "10.0.0.2:5555",
    },
    "stage.status": {},
    "stage.cancel": {"model": "mlx-community/tiny"},
    "models.list": {"verify": True},
    "models.remove": {"model": "mlx-community/tiny", "partial": True},
    "stage.manifest": {"digest": STAGE_TASK["digest"], "offset": 0},
    "stage.chunk": {"digest": STAGE_TASK["digest"], "path": "config.json", "index": 0},
    "stage.prepare.ok": STAGE_TASK,
    "stage.fetch.ok": STAGE_TASK,
    "stage.cancel.ok": STAGE_TASK | {"state": "cancelled", "finished": 1.7e9 + 5},
    "stage.status.ok": {"tasks": [STAGE_TASK]},
    "models.list.ok": {
        "store": "/Users/lab/.cache/huggingface/hub",
        "models": [
            {
                "model": "mlx-community/tiny",
                "revision": STAGE_TASK["revision"],
                "refs": ["main"],
                "state": "partial",
                "digest": STAGE_TASK["digest"],
                "size": 4096,
                "bytes": 1024,
                "files": 3,
                "error": None,
            }
        ],
    },
    "models.remove.ok": {"removed": ["mlx-community/tiny@" + str(STAGE_TASK["revision"])]},
    "stage.manifest.ok": {
        "format": 1,
        "model": "mlx-community/tiny",
        "revision": STAGE_TASK["revision"],
        "chunk_size": 1024,
        "files": [STAGED_FILE],
        "offset": 0,
        "next": None,
        "digest": STAGE_TASK["digest"],
    },
    "stage.chunk.ok": {
        "digest": STAGE_TASK["digest"],
        "path": "config.json",
        "index": 0,
        "data": b"{}",
    },
    "calibrate.start": {"minutes": 30},
    "calibrate.get": {},
    "calibrate.start.ok": {"minutes": 30.0, "source": "smc"},
    "calibrate.get.ok": {
        "state": "running",
        "minutes": 30.0,
        "source": "smc",
        "progress": {
            "phase": "sustained",
            "elapsed_s": 120.0,
            "total_s": 1800.0,
            "celsius": 88.5,
            "sensor": "Tg0k",
            "gpu_hz": 1.398e9,
            "onset_c": None,
        },
        "error": None,
        "calibration": CALIBRATION,
        "origin": "calibrated on this Mac 2026-12-06: onset 101.5 °C (smc · Tg0k)",
        "policy": {
            "max_speed_temp": 96.5,
            "pause_temp": 101.5,
            "stop_temp": 120.0,
            "pause_duration": 0.5,
            "hysteresis": 0.0,
        },
        "policy_origin": "calibrated on this Mac 2026-12-06: onset 101.5 °C (smc · Tg0k)",
    },
    "gang.state": {
        "gang": {
            "group": "ring-0123456789ab",
            "rank": 1,
            "world": 2,
            "hosts": ["10.0.0.1", "10.0.0.2"],
            "backend": "ring",
        },
        "member": GANG_MEMBER,
    },
    "rank.start": {
        "job": "n-1",
        "kind": "netbench",
        "rank": 1,
        "members": [{"name": "mac1", "ips": ["10.0.0.1"]}, {"name": "mac2", "ips": ["10.0.0.2"]}],
        "backend": "ring",
        "port": 32323,
        "spec": {"sizes": [1024], "repetitions": 3, "warmup": 1},
        "bound_s": 600.0,
    },
    "rank.get": {"job": "n-1"},
    "rank.stop": {"job": "n-1", "why": "rank 0 failed"},
    "rank.start.ok": {"job": "n-1", "rank": 1},
    "rank.get.ok": RANK_STATE,
    "rank.stop.ok": {**RANK_STATE, "state": "stopped", "error": "rank 0 failed"},
    "hello": {"client": "coordinator"},
    "ping": {},
    "info": {},
    "bench.start": {"matrix": {"n_prompt": [16], "models": ["small"]}},
    "bench.check": {"matrix": {"n_prompt": [16], "models": ["small"]}, "check_tokens": 8},
    "bench.cancel": {"job": "j-1"},
    "job.get": {"job": "j-1", "offset": 3},
    "job.list": {"limit": 5},
    "history.get": {"samples_after": 0, "events_after": 12, "since": 0, "limit": 100},
    "policy.get": {},
    "policy.set": {"policy": {"pause_temp": 80.0}},
    "job.event": {
        "job": "3f2a",
        "pid": 42,
        "action": "pause",
        "time": 1.5,
        "celsius": 86.0,
        "source": "sim",
        "simulated": True,
        "detail": None,
        "policy": None,
        "seq": 7,
    },
    "hello.ok": {"agent": "0.1.0", "protocol": 4, "hostname": "mac1", "secure": True},
    "ping.ok": {"job": None, "time": 1.5},
    "info.ok": {
        "agent": "0.1.0",
        "protocol": 4,
        "name": "mac1",
        "machine": {},
        "thermal": {},
        "power": {},
        "job": None,
        "telemetry_port": 5556,
        "poll_interval": 1.0,
        "policy": {},
        "jobs": [],
        "history": "3f2a9c1d04e5b6a7.0b1c2d3e4f5a6b7c",
        "storage": {"ok": True, "failing": []},
    },
    "bench.start.ok": {"job": "j-1", "cells": ["small/f16 pp16 b1"]},
    "bench.check.ok": {"cells": ["small/f16 pp16 b1"]},
    "bench.progress": {"job": "j-1", "done": 0, "total": 2, "model": None},
    "bench.cell": {"job": "j-1", "index": 0, "record": {"name": "x", "tokens_per_sec": 1.0}},
    "bench.done": {"job": "j-1", "status": "ok", "error": None, "cells": 2},
    "bench.cancel.ok": {"job": "j-1"},
    "job.get.ok": {
        "job": "j-1",
        "state": "ok",
        "error": None,
        "spec": {},
        "models": [],
        "records": [],
        "offset": 0,
        "next": None,
        "started": "t",
        "finished": None,
    },
    "history.get.ok": {"history": "h", "samples": [], "events": [], "truncated": False},
    "policy.get.ok": {"policy": {"pause_temp": 85.0}},
    "policy.set.ok": {"policy": {"pause_temp": 85.0}},
    "job.event.ok": {"job": "3f2a"},
    "gang.state.ok": {"group": "ring-0123456789ab", "members": [GANG_MEMBER]},
    "job.list.ok": {
        "jobs": [
            {
                "job": "j-1",
                "request": "0f1e2d3c4b5a6978",
                "state": "running",
                "total": 4,
                "done": 1,
                "error": None,
                "started": "2026-11-30T20:06:00+00:00",
                "finished": None,
            }
        ]
    },
    "doctor": {},
    "doctor.ok": {"report": {"host": "mac1", "ok": True, "checks": [], "machine": None}},
    "error": {"code": "busy", "message": "busy: job j-1 is running"},
    "telemetry.sample": {
        "host": "mac1",
        "time": 1.5,
        "celsius": 71.5,
        "pressure": None,
        "source": "iohid",
        "sensor": "PMU tdie1",
        "simulated": False,
        "state": "ok",
        "trend_c_per_min": 0.4,
        "pause_s_total": 0.0,
        "storage_error": None,
        "power_w": None,
        "energy_j": None,
        "power": None,
        "seq": 41,
        "jobs": [
            {
                "job": "3f2a",
                "pid": 42,
                "command": "python train.py",
                "state": "running",
                "kind": "run",
            }
        ],
    },
    "telemetry.event": {
        "host": "mac1",
        "time": 1.5,
        "celsius": None,
        "action": "policy",
        "pid": None,
        "job": None,
        "source": "iohid",
        "simulated": False,
        "detail": "pause_temp=80",
        "policy": {"pause_temp": 80.0},
        "seq": 12,
    },
}


def raw(**overrides: Any) -> bytes:
    envelope = {
        "v": p.PROTOCOL_VERSION,
        "id": "abc",
        "type": "ping",
        "re": None,
        "body": {},
    } | overrides
    return msgpack.packb({k: v for k, v in envelope.items() if v is not ...})


def test_every_type_has_a_valid_example() -> None:
    assert set(VALID_BODIES) == set(p.SCHEMAS)


@pytest.mark.parametrize("type_", sorted(VALID_BODIES))
def test_round_trip(type_: str) -> None:
    message = p.make(type_, VALID_BODIES[type_], re="req-1")
    decoded = p.decode(p.encode(message))
    assert decoded == message
    assert decoded.re == "req-1" and len(decoded.id) == 16


def test_optional_fields_decode_as_none() -> None:
    decoded = p.decode(raw(type="job.get", body={"job": "j-1"}))
    assert decoded.body == {"job": "j-1", "offset": None}


@pytest.mark.parametrize(
    ("data", "code", "needle"),
    [
        (b"\xc1 not msgpack", p.MALFORMED, "not msgpack"),
        (msgpack.packb([1, 2]), p.MALFORMED, "a message is a map"),
        (raw(id=""), p.MALFORMED, "id must be"),
        (raw(id=7), p.MALFORMED, "id must be"),
        (raw(v=1), p.BAD_VERSION, "speaks 4"),
        (raw(v=...), p.BAD_VERSION, "None"),
        (raw(extra=1), p.MALFORMED, "unknown key(s) ['extra']"),
        (raw(body=...), p.MALFORMED, "missing key(s) ['body']"),
        (raw(re=5), p.MALFORMED, "re must be"),
        (raw(re=""), p.MALFORMED, "re must be nil or a message id of 1 to 64"),
        (raw(re="r" * 65), p.MALFORMED, "re must be"),
        (raw(re=...), p.MALFORMED, "missing key(s) ['re']"),
        (raw(v=4.0), p.BAD_VERSION, "4.0"),
        (raw(v=True), p.BAD_VERSION, "True"),
        (raw(v="4"), p.BAD_VERSION, "'4'"),
        (msgpack.packb({"v": 4, "id": "a", b"x": 1, "y": 2}), p.MALFORMED, "unknown key(s)"),
        (raw(type="teleport"), p.UNKNOWN_TYPE, "'teleport'"),
        (raw(body=[1]), p.BAD_BODY, "body must be a map"),
        (raw(type="bench.start", body={}), p.BAD_BODY, "missing field 'matrix'"),
        (
            raw(type="bench.start", body={"matrix": "all"}),
            p.BAD_BODY,
            "'matrix' has the wrong type",
        ),
        (raw(type="ping", body={"x": 1}), p.BAD_BODY, "unknown field(s) x"),
        (raw(type="job.get", body={"job": "j", "offset": True}), p.BAD_BODY, "'offset'"),
    ],
)
def test_refusals_name_the_problem(data: bytes, code: str, needle: str) -> None:
    with pytest.raises(p.ProtocolError) as caught:
        p.decode(data)
    assert caught.value.code == code
    assert needle in caught.value.message


def test_a_sample_names_its_sensor_or_nil() -> None:
    """`sensor` is always there, like every sample field: a string, or nil where the source
    names none (docs/protocol.md §10)."""
    body = VALID_BODIES["telemetry.sample"]
    assert p.make("telemetry.sample", body | {"sensor": None}).body["sensor"] is None
    with pytest.raises(p.ProtocolError, match="'sensor' has the wrong type"):
        p.make("telemetry.sample", body | {"sensor": 7})
    with pytest.raises(p.ProtocolError, match="missing field 'sensor'"):
        p.make("telemetry.sample", {k: v for k, v in body.items() if k != "sensor"})


JOB_EVENT_REQUIRED = ("job", "action", "time", "source", "simulated")
"""docs/protocol.md §12: every other job.event field may be omitted (it is then nil)."""


def test_a_job_event_may_omit_every_field_that_may_be_nil() -> None:
    least = {key: VALID_BODIES["job.event"][key] for key in JOB_EVENT_REQUIRED}
    decoded = p.decode(raw(type="job.event", body=least))
    assert decoded.body == least | dict.fromkeys(("pid", "celsius", "detail", "policy", "seq"))
    for key in JOB_EVENT_REQUIRED:
        missing = {k: v for k, v in least.items() if k != key}
        with pytest.raises(p.ProtocolError) as caught:
            p.decode(raw(type="job.event", body=missing))
        assert (caught.value.code, caught.value.message) == (
            p.BAD_BODY,
            f"job.event: missing field {key!r}",
        )
    with pytest.raises(p.ProtocolError, match="'simulated' has the wrong type"):
        p.decode(raw(type="job.event", body=least | {"simulated": None}))
    telemetry = {k: v for k, v in VALID_BODIES["telemetry.event"].items() if k != "detail"}
    with pytest.raises(p.ProtocolError, match="missing field 'detail'"):
        p.decode(raw(type="telemetry.event", body=telemetry))  # published: every field


@pytest.mark.parametrize(
    "body", [{}, [1], {"job": 7}, {"nonsense": 1}, VALID_BODIES["job.event"] | {"time": "x"}]
)
def test_a_job_event_from_another_key_is_forbidden_before_its_body_is_read(body: Any) -> None:
    """§4: `forbidden` comes right after the type: a coordinator learns nothing of the body it
    may not send. Only the own-key types ask whose key sent them."""
    with pytest.raises(p.ProtocolError) as caught:
        p.decode(raw(id="e-1", type="job.event", body=body), lambda: False)
    assert (caught.value.code, caught.value.re) == (p.FORBIDDEN, "e-1")
    with pytest.raises(p.ProtocolError) as own:
        p.decode(raw(type="job.event", body=body), lambda: True)
    assert own.value.code == p.BAD_BODY
    with pytest.raises(p.ProtocolError) as unauthenticated:
        p.decode(raw(type="job.event", body=body))  # no CURVE: no key to tell peers apart
    assert unauthenticated.value.code == p.BAD_BODY
    for earlier, code in (
        (raw(v=3, type="job.event"), p.BAD_VERSION),
        (raw(re=5, type="job.event"), p.MALFORMED),
    ):
        with pytest.raises(p.ProtocolError) as caught:
            p.decode(earlier, lambda: False)
        assert caught.value.code == code

    def never() -> bool:
        raise AssertionError("asked whose key sent a ping")

    assert p.decode(raw(), never).type == "ping"


def test_a_refusal_remembers_the_id_it_can_answer() -> None:
    with pytest.raises(p.ProtocolError) as caught:
        p.decode(raw(id="req-9", type="teleport"))
    reply = p.error_for(caught.value)
    assert reply.re == "req-9"
    assert p.decode(p.encode(reply)).body["code"] == p.UNKNOWN_TYPE


def test_size_limit_both_ways() -> None:
    with pytest.raises(p.ProtocolError) as caught:
        p.decode(b"\x00" * (p.MAX_MESSAGE_SIZE + 1))
    assert caught.value.code == p.TOO_LARGE
    with pytest.raises(p.ProtocolError) as caught:
        p.decode(b"\x00" * (p.MAX_ENVELOPE_SIZE + 1))
    assert caught.value.code == p.TOO_LARGE
    huge = p.make(
        "bench.cell", {"job": "j", "index": 0, "record": {"blob": "x" * p.MAX_MESSAGE_SIZE}}
    )
    with pytest.raises(p.ProtocolError, match="limit"):
        p.encode(huge)


def test_make_checks_bodies_where_they_are_built() -> None:
    with pytest.raises(p.ProtocolError, match="missing field 'job'"):
        p.make("bench.cancel", {})


def sample_frames() -> list[bytes]:
    return p.telemetry_frames(p.make("telemetry.sample", VALID_BODIES["telemetry.sample"]))


def test_telemetry_is_topic_then_envelope() -> None:
    sample = p.make("telemetry.sample", VALID_BODIES["telemetry.sample"])
    frames = p.telemetry_frames(sample)
    assert frames[0] == b"sample" and p.decode_telemetry(frames) == sample
    event = p.make("telemetry.event", VALID_BODIES["telemetry.event"])
    assert p.telemetry_frames(event)[0] == b"event"


def test_the_telemetry_topic_must_match_the_envelope() -> None:
    with pytest.raises(p.ProtocolError, match="does not match"):
        p.decode_telemetry([b"event", sample_frames()[1]])


def test_telemetry_needs_two_frames() -> None:
    with pytest.raises(p.ProtocolError, match="two frames"):
        p.decode_telemetry(sample_frames()[1:])


def test_telemetry_is_not_a_request() -> None:
    with pytest.raises(p.ProtocolError) as caught:
        p.require_request(p.make("telemetry.event", VALID_BODIES["telemetry.event"]))
    assert caught.value.code == p.NOT_A_REQUEST


def test_only_requests_reach_the_agent() -> None:
    p.require_request(p.make("ping"))
    with pytest.raises(p.ProtocolError) as caught:
        p.require_request(p.make("ping.ok", {"job": None, "time": 0.0}))
    assert caught.value.code == p.NOT_A_REQUEST


@pytest.mark.parametrize(
    ("events", "needle"),
    [
        (
            [(zmq.EVENT_CONNECTED, 0), (zmq.EVENT_HANDSHAKE_FAILED_AUTH, 400)],
            "refused our key (ZAP status 400)",
        ),
        (
            [(zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL, zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH)],
            "--insecure",
        ),
        (
            [(zmq.EVENT_CONNECTED, 0), (zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL, 32)] * 10,
            "server key we hold",
        ),
        (
            [
                (zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL, 32),
                (zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL, zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH),
            ],
            "security mismatch",
        ),
    ],
)
def test_handshake_diagnosis(events: list[tuple[int, int]], needle: str) -> None:
    why = handshake_diagnosis(events, "KEY")
    assert why is not None and needle in why


def test_the_fix_for_a_refused_key_is_quoted_for_the_shell() -> None:
    why = handshake_diagnosis([(zmq.EVENT_HANDSHAKE_FAILED_AUTH, 400)], "a$b")
    assert why is not None and "agent keys trust 'a$b'" in why


@pytest.mark.parametrize(
    "events",
    [
        [(zmq.EVENT_CONNECT_DELAYED, 0)],
        [(zmq.EVENT_CONNECTED, 0), (zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL, 32)] * 9,
    ],
)
def test_nothing_conclusive_yet(events: list[tuple[int, int]]) -> None:
    assert handshake_diagnosis(events, "KEY") is None


@pytest.mark.parametrize(
    ("events", "needle"),
    [
        ([(zmq.EVENT_CONNECT_DELAYED, 0), (zmq.EVENT_CONNECT_RETRIED, 100)], "connection refused"),
        ([(zmq.EVENT_CONNECT_DELAYED, 0)], "unreachable"),
        ([(zmq.EVENT_CONNECTED, 0)], "handshake did not complete"),
        ([(zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL, 32)], "server key we hold"),
        ([(zmq.EVENT_CONNECTED, 0), (zmq.EVENT_HANDSHAKE_SUCCEEDED, 0)], "did not answer"),
    ],
)
def test_timeout_diagnosis(events: list[tuple[int, int]], needle: str) -> None:
    assert needle in timeout_diagnosis(events, 5.0)


def test_the_agent_handles_exactly_the_protocols_requests() -> None:
    """agent.daemon.requests.HANDLERS is the daemon's list of what it answers: it cannot drift from
    the protocol's (a request without a handler would be an `internal` error, a handler without a
    request unreachable)."""
    from agent.daemon.requests import HANDLERS

    assert set(HANDLERS) == p.REQUESTS


def cell_with_blob(length: int) -> p.Message:
    return p.make("bench.cell", {"job": "j", "index": 0, "record": {"blob": "x" * length}}, re="r")


def padded(size: int) -> p.Message:
    """A valid bench.cell whose envelope encodes to exactly `size` bytes (its blob is long
    enough for msgpack's 5-byte str header, where the empty one has a 1-byte header)."""
    message = cell_with_blob(size - len(p.encode(cell_with_blob(0))) - 4)
    assert len(p.encode(message)) == size
    return message


def test_encode_builds_exactly_up_to_the_usable_size() -> None:
    """The largest envelope is the largest message that arrives under CURVE (measured by
    tests/test_protocol_limits.py): 4 MiB - 33."""
    assert p.MAX_ENVELOPE_SIZE == 4 * 1024 * 1024 - 33
    largest = padded(p.MAX_ENVELOPE_SIZE)
    assert p.decode(p.encode(largest)) == largest
    with pytest.raises(p.ProtocolError) as caught:
        p.encode(cell_with_blob(len(largest.body["record"]["blob"]) + 1))
    assert caught.value.code == p.TOO_LARGE
