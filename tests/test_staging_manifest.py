"""shared.staging.manifest: hashing in any slices, the digest's canonical form, and every rule a
received manifest is checked against (docs/protocol.md §19, The manifest)."""

from __future__ import annotations

import copy
import hashlib
import json
from typing import Any

import pytest

from shared.staging.manifest import (
    COMMIT,
    MIN_CHUNK_SIZE,
    FileEntry,
    FileHasher,
    ManifestError,
    build,
    check_path,
    chunk_hash,
    first_difference,
    manifest_from_wire,
)

CHUNK = MIN_CHUNK_SIZE
REVISION = "0123456789abcdef0123456789abcdef01234567"


def hashed(path: str, data: bytes, slices: int = 1) -> FileEntry:
    hasher = FileHasher(CHUNK)
    step = max(1, len(data) // slices)
    for start in range(0, len(data), step):
        hasher.update(data[start : start + step])
    return hasher.finish(path)


def sample() -> dict[str, Any]:
    files = [
        hashed("model.safetensors", bytes(range(256)) * 10),  # 2,560 bytes: 3 chunks
        hashed("config.json", b'{"model_type": "llama"}'),
        hashed("empty.txt", b""),
    ]
    return build("org/tiny", REVISION, CHUNK, files).to_dict()


def test_hashing_in_any_slices_gives_the_same_entry() -> None:
    data = bytes(range(256)) * 10
    whole = hashed("w", data)
    assert whole == hashed("w", data, slices=7) == hashed("w", data, slices=len(data))
    assert whole.size == 2560
    assert whole.sha256 == hashlib.sha256(data).hexdigest()
    assert whole.chunks == tuple(chunk_hash(data[i : i + CHUNK]) for i in (0, CHUNK, 2 * CHUNK))
    assert hashed("e", b"").chunks == ()
    assert len(hashed("x", bytes(CHUNK)).chunks) == 1  # exactly one chunk: no empty second


def test_the_digest_is_the_sha256_of_the_canonical_json() -> None:
    raw = sample()
    manifest = manifest_from_wire(raw)
    canonical = json.dumps(raw, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    assert manifest.digest == hashlib.sha256(canonical.encode()).hexdigest()
    assert [entry.path for entry in manifest.files] == [
        "config.json",
        "empty.txt",
        "model.safetensors",
    ]
    assert manifest.total == 2560 + 23
    assert manifest.chunk_span("model.safetensors", 2) == (2048, 512)
    with pytest.raises(ManifestError, match="no chunk 3"):
        manifest.chunk_span("model.safetensors", 3)


def test_a_directory_without_a_commit_is_named_by_its_bytes() -> None:
    files = [hashed("a.json", b"{}")]
    first = build("org/dir", None, CHUNK, files)
    assert COMMIT.fullmatch(first.revision)
    assert build("org/dir", None, CHUNK, files).revision == first.revision
    assert build("org/dir", None, CHUNK, [hashed("a.json", b"[]")]).revision != first.revision
    coarser = FileHasher(2 * CHUNK)
    coarser.update(b"{}")
    assert build("org/dir", None, 2 * CHUNK, [coarser.finish("a.json")]).revision == first.revision


def broken(change: str) -> dict[str, Any]:
    raw = copy.deepcopy(sample())
    files = raw["files"]
    if change == "order":
        files[0], files[1] = files[1], files[0]
    elif change == "repeat":
        files[1] = dict(files[0])
    elif change == "chunks":
        files[2]["chunks"].pop()
    elif change == "hash":
        files[0]["sha256"] = files[0]["sha256"].upper()
    elif change == "escape":
        files[0]["path"] = "../config.json"
    elif change == "inside":
        files.insert(1, dict(files[0], path="config.json/x"))
    elif change == "revision":
        raw["revision"] = "main"
    elif change == "model":
        raw["model"] = "not an id"
    elif change == "chunk_size":
        raw["chunk_size"] = 10
    elif change == "field":
        raw["extra"] = 1
    return raw


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ("order", "out of order or repeated"),
        ("repeat", "out of order or repeated"),
        ("chunks", "files[2].chunks has 2 hashes, a 2560-byte file at 1024 per chunk has 3"),
        ("hash", "is not 64 lowercase hex digits"),
        ("escape", "has an empty, '.' or '..' part"),
        ("inside", "is inside another file"),
        ("revision", "revision"),
        ("model", "is not a Hugging Face id ORG/NAME"),
        ("chunk_size", "chunk_size"),
        ("field", "unknown field 'extra'"),
    ],
)
def test_a_received_manifest_is_refused_naming_its_first_problem(change: str, problem: str) -> None:
    with pytest.raises(ManifestError, match="manifest") as caught:
        manifest_from_wire(broken(change))
    assert problem in str(caught.value)


def test_a_manifest_must_be_the_one_asked_for() -> None:
    raw = sample()
    digest = manifest_from_wire(raw).digest
    assert manifest_from_wire(raw, digest).digest == digest
    with pytest.raises(ManifestError, match="not 0{64} as asked"):
        manifest_from_wire(raw, "0" * 64)


@pytest.mark.parametrize(
    "path",
    [
        "/etc/passwd",
        "a//b",
        "a/./b",
        "a\\b",
        "a\nb",
        "",
        "x" * 513,
        ".mlx-fleet/r.json",
        "a/",
        ".git/x",
    ],
)
def test_paths_that_could_leave_the_folder_are_refused(path: str) -> None:
    with pytest.raises(ManifestError):
        check_path(path)


def test_plain_paths_pass() -> None:
    for path in ("config.json", "sub/dir/tokenizer.model", "a..b", "a/b.c"):
        check_path(path)


def test_first_difference_names_the_file() -> None:
    held = manifest_from_wire(sample())
    assert first_difference(held, held) is None
    changed = [hashed("config.json", b'{"model_type": "llamb"}'), *held.files[1:]]
    wanted = build("org/tiny", REVISION, CHUNK, changed)
    assert first_difference(held, wanted) == (
        f"config.json differs (sha256 {held.files[0].sha256[:12]}…, "
        f"not {wanted.files[0].sha256[:12]}…)"
    )
    fewer = build("org/tiny", REVISION, CHUNK, held.files[:2])
    assert first_difference(held, fewer) == "model.safetensors is not in the manifest"
    assert first_difference(fewer, held) == "model.safetensors is missing"
