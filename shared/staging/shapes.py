"""What an agent may send about staging (docs/protocol.md §19), checked to the last field as
shared.wire.agent_shapes checks the rest: a stage task, a model it holds, a manifest page, a
chunk; and the states and limits the agent builds them with (agent.staging)."""

from __future__ import annotations

import re
from typing import Any

from shared import shapes as s
from shared.staging.manifest import (
    COMMIT,
    FILE,
    FORMAT,
    HEX64,
    MAX_CHUNK_SIZE,
    MAX_FILES,
    MIN_CHUNK_SIZE,
)

MAX_TEXT = 16_384
SOURCE = "source"
RECEIVER = "receiver"
ROLES = (SOURCE, RECEIVER)
RESOLVING, DOWNLOADING, HASHING, FETCHING = "resolving", "downloading", "hashing", "fetching"
READY, FAILED, CANCELLED = "ready", "failed", "cancelled"
TASK_STATES = (RESOLVING, DOWNLOADING, HASHING, FETCHING, READY, FAILED, CANCELLED)
UNDER_WAY = (RESOLVING, DOWNLOADING, HASHING, FETCHING)
PRESENT, PARTIAL, MISMATCH = "present", "partial", "mismatch"
MODEL_STATES = (PRESENT, PARTIAL, MISMATCH)
MAX_TASKS = 1024
MAX_MODELS = 10_000
MANIFEST_PAGE_BYTES = 1024 * 1024
"""The encoded files of one stage.manifest.ok page, at most (§19)."""

_text = s.text(MAX_TEXT)
_name = s.text(MAX_TEXT, least=1)
_maybe_text = s.nil_or(_text)
_count = s.integer(0)


def _hex(digits: re.Pattern[str], what: str) -> s.Check:
    """A str of lowercase hex digits (§19: a commit's 40, a SHA-256's 64): a coordinator shows
    parts of them, so nothing else may pass."""

    def check(value: Any) -> None:
        if type(value) is not str:
            raise s.Invalid("", f"is {s.kind_of(value)}, not a str")
        if not digits.fullmatch(value):
            raise s.Invalid("", f"is not {what}")

    return check


_sha256 = _hex(HEX64, "64 lowercase hex digits")
_commit = _hex(COMMIT, "40 lowercase hex digits")
_digest = s.nil_or(_sha256)
_revision = s.nil_or(_commit)

TASK = s.fields(
    {
        "model": _name,
        "revision": _revision,
        "role": s.one_of(ROLES),
        "state": s.one_of(TASK_STATES),
        "digest": _digest,
        "bytes": _count,
        "total": s.nil_or(_count),
        "resumed": _count,
        "rate": s.nil_or(s.number(0)),
        "capped": s.flag,
        "source": _maybe_text,
        "served": _count,
        "files": s.integer(0, MAX_FILES),
        "files_done": s.integer(0, MAX_FILES),
        "error": _maybe_text,
        "started": s.number(0),
        "finished": s.nil_or(s.number(0)),
    }
)
MODEL = s.fields(
    {
        "model": _name,
        "revision": s.text(MAX_TEXT, least=1),
        "refs": s.list_of(_name, 256),
        "state": s.one_of(MODEL_STATES),
        "digest": _digest,
        "size": _count,
        "bytes": _count,
        "files": s.integer(0, MAX_FILES),
        "error": _maybe_text,
    }
)


def _bin(most: int) -> s.Check:
    def check(value: Any) -> None:
        if type(value) is not bytes:
            raise s.Invalid("", f"is {s.kind_of(value)}, not bytes")
        if len(value) > most:
            raise s.Invalid("", f"has {len(value)} bytes, more than {most}")

    return check


BODIES: dict[str, s.Check] = {
    "stage.prepare.ok": TASK,
    "stage.fetch.ok": TASK,
    "stage.cancel.ok": TASK,
    "stage.status.ok": s.fields({"tasks": s.list_of(TASK, MAX_TASKS)}),
    "models.list.ok": s.fields({"store": _name, "models": s.list_of(MODEL, MAX_MODELS)}),
    "models.remove.ok": s.fields({"removed": s.list_of(_name, MAX_MODELS)}),
    "stage.manifest.ok": s.fields(
        {
            "format": s.integer(FORMAT, FORMAT),
            "model": _name,
            "revision": _commit,
            "chunk_size": s.integer(MIN_CHUNK_SIZE, MAX_CHUNK_SIZE),
            "files": s.list_of(FILE, MAX_FILES),
            "offset": s.integer(0, MAX_FILES),
            "next": s.nil_or(s.integer(1, MAX_FILES)),
            "digest": _sha256,
        }
    ),
    "stage.chunk.ok": s.fields(
        {
            "digest": _sha256,
            "path": _name,
            "index": _count,
            "data": _bin(MAX_CHUNK_SIZE),
        }
    ),
}
"""The staging replies an agent sends (shared.wire.agent_shapes.BODIES takes them in)."""
