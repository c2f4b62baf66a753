"""The coordinator <-> agent wire protocol (docs/protocol.md): pure encode, decode and validation.

Every message is one msgpack map {"v", "id", "type", "re", "body"}. Nothing here touches a
socket, so the agent, the coordinator and the tests share one definition of what is valid, and
every refusal is a ProtocolError whose code and message can be sent back as an `error` reply.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any, NamedTuple

import msgpack

from shared.wire.telemetry import Event, Sample

PROTOCOL_VERSION = 4
DEFAULT_PORT = 5555
TELEMETRY_PORT_OFFSET = 1
"""The telemetry PUB socket binds at the command port + this by default (5556 for 5555)."""
MAX_MESSAGE_SIZE = 4 * 1024 * 1024
"""Every socket's `maxmsgsize`: ZeroMQ drops a peer whose message is larger on the wire."""
CURVE_MESSAGE_OVERHEAD = 33
"""Bytes CURVE adds to each message on the wire (its MESSAGE command: name, nonce, MAC, flags),
which count against `maxmsgsize`: tests/test_protocol_limits.py measures it."""
MAX_ENVELOPE_SIZE = MAX_MESSAGE_SIZE - CURVE_MESSAGE_OVERHEAD
"""Bytes per encoded envelope: the largest message that arrives under CURVE (4 MiB - 33).
encode() refuses to build more, decode() refuses more."""
MAX_ID_LENGTH = 64
MAX_WIRE_INT = 2**63 - 1
"""Offsets and cursors are at most this: what SQLite and a C int64 hold."""

# Error codes (the `code` of an error body).
MALFORMED = "malformed"
BAD_VERSION = "bad-version"
UNKNOWN_TYPE = "unknown-type"
BAD_BODY = "bad-body"
TOO_LARGE = "too-large"
NOT_A_REQUEST = "not-a-request"
BUSY = "busy"
BAD_MATRIX = "bad-matrix"
UNKNOWN_JOB = "unknown-job"
NOT_RUNNING = "not-running"
BAD_POLICY = "bad-policy"
FORBIDDEN = "forbidden"
INTERNAL = "internal"
CANNOT_LISTEN = "cannot-listen"
BAD_MODEL = "bad-model"
BAD_STORE = "bad-store"
NO_SPACE = "no-space"
NOT_HELD = "not-held"
NOT_YET = "not-yet"
UNTRUSTED_PEER = "untrusted-peer"

# Job and host outcomes carried by bench.done and job.get.ok.
JOB_RUNNING = "running"
JOB_OK = "ok"
JOB_FAILED = "failed"
JOB_CANCELLED = "cancelled"
JOB_STATES = (JOB_RUNNING, JOB_OK, JOB_FAILED, JOB_CANCELLED)

# Supervised jobs as telemetry and info list them: their state and what runs them.
SUPERVISED_RUNNING = "running"
SUPERVISED_PAUSED = "paused"
SUPERVISED_STOPPED = "stopped"
SUPERVISED_EXITED = "exited"
SUPERVISED_STATES = (SUPERVISED_RUNNING, SUPERVISED_PAUSED, SUPERVISED_STOPPED, SUPERVISED_EXITED)
KIND_BENCH = "bench"
KIND_RUN = "run"

# Telemetry: [topic, envelope] on the agent's PUB socket; the topic names the envelope's type.
TOPICS: dict[str, bytes] = {"telemetry.sample": b"sample", "telemetry.event": b"event"}

NONE = type(None)
Types = type | tuple[type, ...]
NUMBER = (int, float)

RANK_STATE: dict[str, tuple[Types, bool]] = {
    "job": (str, True),
    "rank": (int, True),
    "state": (str, True),
    "elapsed_s": (NUMBER, True),
    "error": ((str, NONE), True),
    "report": ((dict, NONE), True),
    "progress": ((int, NONE), False),
    "progress_age_s": ((*NUMBER, NONE), False),
}
"""rank.get.ok's and rank.stop.ok's body: a rank's state (shared.distributed.rank_shapes checks it
whole)."""

STAGE_TASK: dict[str, tuple[Types, bool]] = {
    "model": (str, True),
    "revision": ((str, NONE), True),
    "role": (str, True),
    "state": (str, True),
    "digest": ((str, NONE), True),
    "bytes": (int, True),
    "total": ((int, NONE), True),
    "resumed": (int, True),
    "rate": ((*NUMBER, NONE), True),
    "capped": (bool, True),
    "source": ((str, NONE), True),
    "served": (int, True),
    "files": (int, True),
    "files_done": (int, True),
    "error": ((str, NONE), True),
    "started": (NUMBER, True),
    "finished": ((*NUMBER, NONE), True),
}
"""A staging task: the reply to stage.prepare, stage.fetch and stage.cancel (§19; the whole map
is checked by shared.staging.shapes.TASK)."""

# type -> {field: (accepted types, required)}; a missing optional field decodes as None.
SCHEMAS: dict[str, dict[str, tuple[Types, bool]]] = {
    # requests, coordinator -> agent
    "hello": {"client": (str, False), "version": (str, False)},
    "ping": {},
    "info": {},
    "bench.start": {
        "matrix": (dict, True),
        "sustain": ((dict, NONE), False),
        "progress": ((list, NONE), False),
        "group": ((dict, NONE), False),
        "check_tokens": ((int, NONE), False),
    },
    "bench.check": {
        "matrix": (dict, True),
        "sustain": ((dict, NONE), False),
        "progress": ((list, NONE), False),
        "group": ((dict, NONE), False),
        "check_tokens": ((int, NONE), False),
    },
    "bench.cancel": {"job": (str, True)},
    "job.get": {"job": (str, True), "offset": (int, False)},
    "job.list": {"limit": (int, False)},
    "history.get": {
        "samples_after": (int, True),
        "events_after": (int, True),
        "since": (NUMBER, False),
        "limit": (int, False),
    },
    "policy.get": {},
    "policy.set": {"policy": (dict, True)},
    "job.event": Event.job_schema(),
    "doctor": {"bandwidth": ((bool, NONE), False)},
    "gang.state": {"gang": (dict, True), "member": (dict, True)},
    "rank.start": {
        "job": (str, True),
        "kind": (str, True),
        "rank": (int, True),
        "members": (list, True),
        "backend": (str, True),
        "port": (int, True),
        "spec": (dict, True),
        "bound_s": (NUMBER, True),
    },
    "rank.get": {"job": (str, True)},
    "rank.stop": {"job": (str, True), "why": (str, False)},
    "calibrate.start": {"minutes": (NUMBER, True)},
    "calibrate.get": {},
    "stage.prepare": {
        "model": (str, True),
        "download": (bool, False),
        "path": (str, False),
        "chunk_size": (int, False),
    },
    "stage.fetch": {
        "model": (str, True),
        "revision": (str, True),
        "digest": (str, True),
        "size": (int, True),
        "source": (str, True),
        "source_key": (str, False),
        "restage": (bool, False),
    },
    "stage.status": {"model": (str, False)},
    "stage.cancel": {"model": (str, True)},
    "models.list": {"verify": (bool, False)},
    "models.remove": {"model": (str, True), "partial": (bool, False)},
    "stage.manifest": {"digest": (str, True), "offset": (int, False)},
    "stage.chunk": {"digest": (str, True), "path": (str, True), "index": (int, True)},
    # replies and the job stream, agent -> coordinator
    "hello.ok": {
        "agent": (str, True),
        "protocol": (int, True),
        "hostname": (str, True),
        "secure": (bool, True),
    },
    "ping.ok": {"job": ((str, NONE), True), "time": (NUMBER, True)},
    "info.ok": {
        "agent": (str, True),
        "protocol": (int, True),
        "name": (str, True),
        "machine": (dict, True),
        "thermal": (dict, True),
        "power": (dict, True),
        "job": ((dict, NONE), True),
        "telemetry_port": (int, True),
        "poll_interval": (NUMBER, True),
        "policy": (dict, True),
        "policy_origin": (str, False),
        "jobs": (list, True),
        "history": (str, True),
        "storage": (dict, True),
    },
    "bench.start.ok": {"job": (str, True), "cells": (list, True)},
    "bench.check.ok": {"cells": (list, True), "models": (dict, False)},
    "bench.progress": {
        "job": (str, True),
        "done": (int, True),
        "total": (int, True),
        "model": ((dict, NONE), False),
        "cooling": ((dict, NONE), False),
        "pause": ((dict, NONE), False),
        "phase": ((dict, NONE), False),
    },
    "bench.cell": {"job": (str, True), "index": (int, True), "record": (dict, True)},
    "bench.done": {
        "job": (str, True),
        "status": (str, True),
        "error": ((str, NONE), True),
        "cells": (int, True),
    },
    "bench.cancel.ok": {"job": (str, True)},
    "job.get.ok": {
        "job": (str, True),
        "state": (str, True),
        "error": ((str, NONE), True),
        "spec": (dict, True),
        "models": (list, True),
        "records": (list, True),
        "offset": (int, True),
        "next": ((int, NONE), True),
        "started": (str, True),
        "finished": ((str, NONE), True),
    },
    "history.get.ok": {
        "history": (str, True),
        "samples": (list, True),
        "events": (list, True),
        "truncated": (bool, True),
    },
    "policy.get.ok": {"policy": (dict, True), "origin": (str, False)},
    "policy.set.ok": {"policy": (dict, True), "origin": (str, False)},
    "job.event.ok": {"job": (str, True)},
    "job.list.ok": {"jobs": (list, True)},
    "gang.state.ok": {"group": (str, True), "members": (list, True)},
    "doctor.ok": {"report": (dict, True)},
    "rank.start.ok": {"job": (str, True), "rank": (int, True)},
    "rank.get.ok": RANK_STATE,
    "rank.stop.ok": RANK_STATE,
    "calibrate.start.ok": {"minutes": (NUMBER, True), "source": (str, True)},
    "calibrate.get.ok": {
        "state": (str, True),
        "minutes": ((NUMBER, NONE), True),
        "source": ((str, NONE), True),
        "progress": ((dict, NONE), True),
        "error": ((str, NONE), True),
        "calibration": ((dict, NONE), True),
        "origin": ((str, NONE), True),
        "policy": (dict, True),
        "policy_origin": (str, True),
    },
    "stage.prepare.ok": STAGE_TASK,
    "stage.fetch.ok": STAGE_TASK,
    "stage.cancel.ok": STAGE_TASK,
    "stage.status.ok": {"tasks": (list, True)},
    "models.list.ok": {"store": (str, True), "models": (list, True)},
    "models.remove.ok": {"removed": (list, True)},
    "stage.manifest.ok": {
        "format": (int, True),
        "model": (str, True),
        "revision": (str, True),
        "chunk_size": (int, True),
        "files": (list, True),
        "offset": (int, True),
        "next": ((int, NONE), True),
        "digest": (str, True),
    },
    "stage.chunk.ok": {
        "digest": (str, True),
        "path": (str, True),
        "index": (int, True),
        "data": (bytes, True),
    },
    "error": {"code": (str, True), "message": (str, True)},
    # telemetry, published by the agent (never requests, never replies)
    "telemetry.sample": Sample.schema(),
    "telemetry.event": Event.schema(),
}
REQUESTS = frozenset(
    {
        "hello",
        "ping",
        "info",
        "bench.start",
        "bench.check",
        "bench.cancel",
        "job.get",
        "job.list",
        "history.get",
        "policy.get",
        "policy.set",
        "job.event",
        "doctor",
        "gang.state",
        "rank.start",
        "rank.get",
        "rank.stop",
        "calibrate.start",
        "calibrate.get",
        "stage.prepare",
        "stage.fetch",
        "stage.status",
        "stage.cancel",
        "models.list",
        "models.remove",
        "stage.manifest",
        "stage.chunk",
    }
)
ENVELOPE_KEYS = frozenset({"v", "id", "type", "re", "body"})
PEER_REQUESTS = frozenset({"hello", "ping", "info", "gang.state", "stage.manifest", "stage.chunk"})
"""All a key trusted as a peer agent (`agent keys trust KEY --peer HOST`) may send: it is
another Mac's agent key, which every process of that Mac's user holds, so it must not drive this
agent (set its policy, run or cancel jobs, stage or remove models), only exchange gang states
and read a model's bytes (§19); anything else from it is `forbidden`."""
OWN_KEY_ONLY = frozenset({"job.event"})
"""Requests an agent takes only from a peer holding its own key (docs/protocol.md §12); any
other peer's is refused `forbidden` as soon as its type is read, before its body is."""


class ProtocolError(ValueError):
    """A message that cannot be accepted; `code` is one of the error codes above and `re` the
    offending message's id when it could be read, so the refusal can be answered."""

    def __init__(self, code: str, message: str, re: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.re = re


class Message(NamedTuple):
    """One decoded envelope; make() builds one to send. A NamedTuple, immutable like a frozen
    dataclass at half the cost to build: every request, reply and telemetry sample makes one."""

    type: str
    body: dict[str, Any]
    id: str
    re: str | None = None
    v: int = PROTOCOL_VERSION


def new_id() -> str:
    """16 hex digits: unique enough to correlate replies without a shared counter."""
    return os.urandom(8).hex()


def make(type_: str, body: dict[str, Any] | None = None, re: str | None = None) -> Message:
    """A message whose body is checked now, so a bug shows where it is made, not at the peer."""
    body = dict(body or {})
    check_body(type_, body)
    return Message(type_, body, new_id(), re)


def error(code: str, message: str, re: str | None = None) -> Message:
    return make("error", {"code": code, "message": message}, re=re)


def error_for(exc: ProtocolError) -> Message:
    return error(exc.code, exc.message, re=exc.re)


def encode(message: Message) -> bytes:
    data = msgpack.packb(
        {
            "v": message.v,
            "id": message.id,
            "type": message.type,
            "re": message.re,
            "body": message.body,
        }
    )
    if len(data) > MAX_ENVELOPE_SIZE:
        raise ProtocolError(
            TOO_LARGE,
            f"{message.type} would be {len(data)} bytes; the limit is {MAX_ENVELOPE_SIZE}",
            re=message.re,
        )
    return data


def decode(data: bytes, own_key: Callable[[], bool] | None = None) -> Message:
    """Parse and validate one message; raise ProtocolError naming the first problem, checked in
    the order docs/protocol.md §4 gives: size, msgpack, a map, `id`, `v`, the envelope's keys,
    `re`, `type`, then (given `own_key`, which says whether the sender holds the agent's own
    key: the agent's socket asks it) `forbidden` for an OWN_KEY_ONLY type from another key,
    and last `body`: a peer refused so learns nothing of what the body would have been."""
    if len(data) > MAX_ENVELOPE_SIZE:
        raise ProtocolError(
            TOO_LARGE, f"message of {len(data)} bytes; the limit is {MAX_ENVELOPE_SIZE}"
        )
    try:
        raw = msgpack.unpackb(data, raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises several unrelated types for bad input
        why = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        raise ProtocolError(MALFORMED, f"not msgpack: {why}") from None
    if not isinstance(raw, dict):
        raise ProtocolError(MALFORMED, f"a message is a map, got {type(raw).__name__}")
    msg_id = raw.get("id")
    if not isinstance(msg_id, str) or not 0 < len(msg_id) <= MAX_ID_LENGTH:
        raise ProtocolError(
            MALFORMED, f"id must be a string of 1 to {MAX_ID_LENGTH} characters, got {msg_id!r}"
        )
    version = raw.get("v")
    if type(version) is not int or version != PROTOCOL_VERSION:  # 3.0 and True are not 3
        raise ProtocolError(
            BAD_VERSION,
            f"protocol version {version!r} is not spoken here; this side speaks {PROTOCOL_VERSION}",
            re=msg_id,
        )
    if raw.keys() != ENVELOPE_KEYS:
        unknown = sorted(set(raw) - ENVELOPE_KEYS, key=repr)  # keys may be str or bytes
        missing = sorted(ENVELOPE_KEYS - set(raw))
        problem = f"unknown key(s) {unknown}" if unknown else f"missing key(s) {missing}"
        raise ProtocolError(MALFORMED, f"bad envelope: {problem}", re=msg_id)
    re = raw.get("re")
    if re is not None and (not isinstance(re, str) or not 0 < len(re) <= MAX_ID_LENGTH):
        raise ProtocolError(
            MALFORMED,
            f"re must be nil or a message id of 1 to {MAX_ID_LENGTH} characters, got {re!r}",
            re=msg_id,
        )
    type_, body = raw["type"], raw["body"]
    if not isinstance(type_, str) or type_ not in SCHEMAS:
        raise ProtocolError(UNKNOWN_TYPE, f"unknown message type {type_!r}", re=msg_id)
    if own_key is not None and type_ in OWN_KEY_ONLY and not own_key():
        raise ProtocolError(
            FORBIDDEN,
            f"{type_} is accepted only from this agent's own key (agent run on its machine), "
            "not from a coordinator",
            re=msg_id,
        )
    if not isinstance(body, dict):
        raise ProtocolError(BAD_BODY, f"{type_}: body must be a map", re=msg_id)
    try:
        check_body(type_, body)
    except ProtocolError as exc:
        raise ProtocolError(exc.code, exc.message, re=msg_id) from None
    return Message(type_, body, msg_id, re, version)


def check_body(type_: str, body: dict[str, Any]) -> None:
    """Every required field present with its type, no unknown field, optional ones filled."""
    if type_ not in SCHEMAS:
        raise ProtocolError(UNKNOWN_TYPE, f"unknown message type {type_!r}")
    names, checks = _field_checks(type_)
    if not names.issuperset(body):
        unknown = sorted(set(body) - names, key=str)
        raise ProtocolError(BAD_BODY, f"{type_}: unknown field(s) {', '.join(map(str, unknown))}")
    for name, types, required, takes_bool in checks:
        if name not in body:
            if required:
                raise ProtocolError(BAD_BODY, f"{type_}: missing field {name!r}")
            body[name] = None
            continue
        value = body[name]
        if value is None and not required:
            continue
        # bool is an int in Python, never on the wire
        if (type(value) is bool and not takes_bool) or not isinstance(value, types):
            raise ProtocolError(
                BAD_BODY, f"{type_}: field {name!r} has the wrong type ({type(value).__name__})"
            )


@functools.cache
def _field_checks(
    type_: str,
) -> tuple[frozenset[str], tuple[tuple[str, tuple[type, ...], bool, bool], ...]]:
    """A schema as check_body walks it, made once per type: every message is checked, and the
    telemetry of a whole lab arrives at one coordinator."""
    schema = SCHEMAS[type_]
    checks = tuple(
        (name, _as_tuple(types), required, bool in _as_tuple(types))
        for name, (types, required) in schema.items()
    )
    return frozenset(schema), checks


def _as_tuple(types: Types) -> tuple[type, ...]:
    return types if isinstance(types, tuple) else (types,)


def telemetry_frames(message: Message) -> list[bytes]:
    """[topic, envelope] for the PUB socket; the topic lets a subscriber filter by type."""
    return [TOPICS[message.type], encode(message)]


def decode_telemetry(frames: list[bytes]) -> Message:
    """One telemetry message off a SUB socket: two frames whose topic matches the type."""
    if len(frames) != 2:
        raise ProtocolError(
            MALFORMED, f"telemetry is two frames [topic, envelope], got {len(frames)}"
        )
    message = decode(frames[1])
    if TOPICS.get(message.type) != frames[0]:
        raise ProtocolError(
            MALFORMED, f"topic {frames[0]!r} does not match type {message.type}", re=message.id
        )
    return message


def require_request(message: Message) -> None:
    """The agent answers requests only; a reply type sent to it is refused by name."""
    if message.type not in REQUESTS:
        raise ProtocolError(
            NOT_A_REQUEST,
            f"{message.type} is not a request; requests are {', '.join(sorted(REQUESTS))}",
            re=message.id,
        )
