"""A seeded fuzz of the agent's command socket through a real CURVE connection: a few thousand
malformed messages of every class docs/protocol.md §7 names, each answered with its error code,
the agent up at the end, no job left behind, and the log kept short."""

from __future__ import annotations

import random
import sqlite3
from collections.abc import Callable
from typing import Any

import msgpack
import pytest
import zmq

from shared.wire import protocol as p
from tests.fleet_support import AgentPool, AgentProcess, raw_dealer, trusted_agent
from tests.test_protocol import VALID_BODIES

pytestmark = pytest.mark.timeout(300)

SEED = 20240610
MESSAGES = 3000
WINDOW = 50
"""Messages in flight at once: one DEALER's replies come back in the order it sent."""

Case = tuple[list[bytes], str, str | None]
"""(frames, expected error code, expected `re`)."""


def envelope(
    rng: random.Random, changes: dict[Any, Any] | None = None, **fields: Any
) -> tuple[bytes, str]:
    """A ping envelope with `changes` and `fields` (... removes a key); and its id."""
    message_id = f"f{rng.getrandbits(48):x}"
    data = {"v": p.PROTOCOL_VERSION, "id": message_id, "type": "ping", "re": None, "body": {}}
    data |= (changes or {}) | fields
    return msgpack.packb({k: v for k, v in data.items() if v is not ...}), message_id


def junk(rng: random.Random) -> Any:
    return rng.choice(
        [
            None,
            True,
            -1,
            2**64 - 1,
            1.5,
            float("nan"),
            "",
            "x" * rng.randint(1, 200),
            b"\x00\xff",
            [1, "a"],
            {"k": 1},
            {b"bytes-key": 1},
        ]
    )


def not_msgpack(rng: random.Random) -> Case:
    return [b"\xc1" + rng.randbytes(rng.randint(0, 64))], p.MALFORMED, None


def not_a_map(rng: random.Random) -> Case:
    return [msgpack.packb(rng.choice([[1, 2], 7, "ping", None, 1.5]))], p.MALFORMED, None


def bad_id(rng: random.Random) -> Case:
    data, _ = envelope(rng, id=rng.choice(["", 7, None, "i" * 65, ..., b"id"]))
    return [data], p.MALFORMED, None


def bad_version(rng: random.Random) -> Case:
    data, message_id = envelope(rng, v=rng.choice([2, 3, 4.0, "4", True, None, ...]))
    return [data], p.BAD_VERSION, message_id


def bad_envelope_keys(rng: random.Random) -> Case:
    change = rng.choice([{"re": ...}, {"type": ...}, {"body": ...}, {"extra": 1}, {b"x": 1}])
    data, message_id = envelope(rng, change)
    return [data], p.MALFORMED, message_id


def bad_re(rng: random.Random) -> Case:
    data, message_id = envelope(rng, re=rng.choice(["", 5, "r" * 65, [1], b"re"]))
    return [data], p.MALFORMED, message_id


def wrong_frames(rng: random.Random) -> Case:
    data, _ = envelope(rng)
    return [data] * rng.randint(2, 4), p.MALFORMED, None


def unknown_type(rng: random.Random) -> Case:
    kind = rng.choice(["teleport", "", 7, None, "PING", "bench.start2"])
    data, message_id = envelope(rng, type=kind)
    return [data], p.UNKNOWN_TYPE, message_id


def not_a_request(rng: random.Random) -> Case:
    kind = rng.choice(sorted(set(VALID_BODIES) - p.REQUESTS))
    data, message_id = envelope(rng, type=kind, body=VALID_BODIES[kind])
    return [data], p.NOT_A_REQUEST, message_id


def bad_body(rng: random.Random) -> Case:
    kind = rng.choice(sorted(p.REQUESTS - p.OWN_KEY_ONLY))  # from a coordinator: forbidden
    body = dict(VALID_BODIES[kind])
    fields = p.SCHEMAS[kind]
    required = [name for name, (_, needed) in fields.items() if needed]
    choice = rng.random()
    if choice < 0.2:
        body = rng.choice([[1], "body", 3, None])
    elif choice < 0.5 or not fields:
        body[rng.choice(["extra", "x" * 30, "Job"])] = junk(rng)
    elif choice < 0.7 and required:
        del body[rng.choice(required)]
    else:
        name = rng.choice(sorted(fields))
        types = fields[name][0]
        wrong = [v for v in (True, "text", 1.5, [1], {"a": 1}, 7) if not _fits(v, types)]
        body[name] = rng.choice(wrong)
    data, message_id = envelope(rng, type=kind, body=body)
    return [data], p.BAD_BODY, message_id


def _fits(value: Any, types: Any) -> bool:
    accepted = types if isinstance(types, tuple) else (types,)
    if isinstance(value, bool):
        return bool in accepted
    return isinstance(value, accepted)


def bad_range(rng: random.Random) -> Case:
    kind, body = rng.choice(
        [
            ("job.get", {"job": "j-1", "offset": rng.choice([-1, -(2**63), 2**64 - 1])}),
            ("history.get", {"samples_after": -1, "events_after": 0}),
            ("history.get", {"samples_after": 0, "events_after": 2**64 - 1}),
            ("history.get", {"samples_after": 0, "events_after": 0, "limit": 0}),
            ("history.get", {"samples_after": 0, "events_after": 0, "limit": 10_001}),
            ("history.get", {"samples_after": 0, "events_after": 0, "limit": 2**63 - 1}),
            ("job.list", {"limit": rng.choice([0, -1, 101, 2**63 - 1, -(2**63)])}),
        ]
    )
    data, message_id = envelope(rng, type=kind, body=body)
    return [data], p.BAD_BODY, message_id


def bad_matrix(rng: random.Random) -> Case:
    good = {"models": ["small"], "n_prompt": [16], "n_gen": [0], "iterations": 1}
    field, value = rng.choice(
        [
            ("models", ...),
            ("models", []),
            ("models", ["/no/such/dir"]),
            ("models", ["/" + "m" * 5000]),
            ("models", ["/m/a\x00b"]),
            ("models", [7]),
            ("n_prompt", [0]),
            ("n_prompt", [2**40]),
            ("n_prompt", list(range(1, 2000))),
            ("batch_sizes", [10**6]),
            ("batch_sizes", "1"),
            ("bits", [3]),
            ("bits", [4.0]),
            ("iterations", 10**9),
            ("warmup", -1),
            ("n_gen", [10**6]),
            ("flavour", "x"),
            (b"n_prompt", [1]),
        ]
    )
    matrix = dict(good)
    if value is ...:
        del matrix[field]
    else:
        matrix[field] = value
    data, message_id = envelope(rng, type="bench.start", body={"matrix": matrix})
    return [data], p.BAD_MATRIX, message_id


def bad_policy(rng: random.Random) -> Case:
    policy = rng.choice(
        [
            {"pause_temp": 200.0},
            {"hysteresis": -1.0},
            {"hysteresis": 500.0},  # at or above pause_temp: a pause could never end
            {"turbo": 1},
            {"stop_temp": True},
            {b"pause_temp": 80.0},
            {"pause_temp": float("nan")},
        ]
    )
    data, message_id = envelope(rng, type="policy.set", body={"policy": policy})
    return [data], p.BAD_POLICY, message_id


def unknown_job(rng: random.Random) -> Case:
    kind = rng.choice(["job.get", "bench.cancel"])
    data, message_id = envelope(rng, type=kind, body={"job": f"j-{rng.getrandbits(40):x}"})
    return [data], p.UNKNOWN_JOB, message_id


def forbidden(rng: random.Random) -> Case:
    """A job.event from a coordinator's key: `forbidden` whatever its body (§4: before it)."""
    body = rng.choice(
        [
            dict(VALID_BODIES["job.event"]) | {"action": rng.choice(["start", "teleport"])},
            {"job": "fake", "action": "start", "time": 1.0, "source": "sim", "simulated": True},
            {},
            {"job": junk(rng)},
            [1],
            None,
        ]
    )
    data, message_id = envelope(rng, type="job.event", body=body)
    return [data], p.FORBIDDEN, message_id


CLASSES: list[Callable[[random.Random], Case]] = [
    not_msgpack,
    not_a_map,
    bad_id,
    bad_version,
    bad_envelope_keys,
    bad_re,
    wrong_frames,
    unknown_type,
    not_a_request,
    bad_body,
    bad_range,
    bad_matrix,
    bad_policy,
    unknown_job,
    forbidden,
]


def jobs_journaled(agent: AgentProcess) -> int:
    with sqlite3.connect(f"file:{agent.home / 'agent-jobs.sqlite'}?mode=ro", uri=True) as conn:
        return conn.execute("SELECT COUNT(*) FROM jobs").fetchone()[0]


@pytest.mark.slow
def test_thousands_of_malformed_messages_each_get_their_error(
    ctx: zmq.Context, agents: AgentPool
) -> None:
    rng = random.Random(SEED)
    cases = [CLASSES[i % len(CLASSES)](rng) for i in range(MESSAGES)]
    agent = trusted_agent(agents)
    sock = raw_dealer(ctx, agent)
    for start in range(0, len(cases), WINDOW):
        window = cases[start : start + WINDOW]
        for frames, _, _ in window:
            sock.send_multipart(frames)
        for index, (frames, code, re) in enumerate(window, start):
            assert sock.poll(30_000), f"no reply to message {index}: {frames[0][:80]!r}"
            reply = p.decode(sock.recv())
            assert reply.type == "error", (index, frames[0][:200], reply)
            assert (reply.body["code"], reply.re) == (code, re), (index, frames[0][:200], reply)
    assert agent.process.poll() is None
    sock.send(envelope(rng, id="last")[0])
    assert sock.poll(30_000) and p.decode(sock.recv()).type == "ping.ok"
    assert jobs_journaled(agent) == 0
    refusals = agent.log_text().count("refused a message")
    assert refusals < 50, f"{refusals} log lines for {MESSAGES} refusals: the log floods"
