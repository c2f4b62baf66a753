"""A model's manifest (docs/protocol.md §19, The manifest): every file's size and SHA-256 and the
SHA-256 of each fixed-size chunk of it, the revision, and the digest that names the whole.

Pure: the agent hashes files through FileHasher and checks what a peer sends with
manifest_from_wire; the coordinator compares digests across hosts. Two copies are the same bytes
exactly when their digests are equal.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from shared import shapes as s

FORMAT = 1
MIN_CHUNK_SIZE = 1024
MAX_CHUNK_SIZE = 2 * 1024 * 1024
"""A chunk and its envelope fit the protocol's 4 MiB message (§4) with room to spare."""
DEFAULT_CHUNK_SIZE = MAX_CHUNK_SIZE
MAX_FILES = 10_000
MAX_PATH = 512
RESERVED_PREFIX = ".mlx-fleet"
"""The agent's own folder in a model's store entry: never a file of a manifest."""
HEX64 = re.compile(r"[0-9a-f]{64}")
COMMIT = re.compile(r"[0-9a-f]{40}")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
REPO = re.compile(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*")
"""ORG/NAME: the repository part of shared.benchmark.matrix.HF_ID (this room imports no other)."""


class ManifestError(ValueError):
    """A manifest (or a part of one) that breaks a rule; the message names the first problem."""


@dataclass(frozen=True)
class FileEntry:
    path: str
    size: int
    sha256: str
    chunks: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "size": self.size,
            "sha256": self.sha256,
            "chunks": [*self.chunks],
        }


@dataclass(frozen=True)
class Manifest:
    model: str
    """ORG/NAME, without a revision."""
    revision: str
    """40 hex digits: the commit, or content_revision() for a directory that has none."""
    chunk_size: int
    files: tuple[FileEntry, ...]
    by_path: dict[str, FileEntry] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "by_path", {entry.path: entry for entry in self.files})

    @property
    def total(self) -> int:
        """Bytes of the whole model."""
        return sum(entry.size for entry in self.files)

    @property
    def chunk_count(self) -> int:
        return sum(len(entry.chunks) for entry in self.files)

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "model": self.model,
            "revision": self.revision,
            "chunk_size": self.chunk_size,
            "files": [entry.to_dict() for entry in self.files],
        }

    @property
    def digest(self) -> str:
        return canonical_digest(self.to_dict())

    def chunk_span(self, path: str, index: int) -> tuple[int, int]:
        """(offset, length) of chunk `index` of file `path`; ManifestError when there is none."""
        entry = self.by_path.get(path)
        if entry is None:
            raise ManifestError(f"no file {path!r} in model {self.model}@{self.revision}")
        if not 0 <= index < len(entry.chunks):
            raise ManifestError(f"{path} has {len(entry.chunks)} chunk(s): no chunk {index}")
        offset = index * self.chunk_size
        return offset, min(self.chunk_size, entry.size - offset)


def canonical_json(value: Any) -> bytes:
    """Keys sorted, no whitespace, ASCII only, UTF-8: the bytes a digest is taken of."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def canonical_digest(value: Any) -> str:
    return hashlib.sha256(canonical_json(value)).hexdigest()


def content_revision(files: Iterable[FileEntry]) -> str:
    """The revision of a directory that has no commit: named by its bytes (each file's path,
    size and sha256, not its chunks), alike on every host and at every chunk size."""
    named = [{"path": e.path, "size": e.size, "sha256": e.sha256} for e in files]
    return canonical_digest(named)[:40]


def chunk_count(size: int, chunk_size: int) -> int:
    return -(-size // chunk_size)


def check_chunk_size(chunk_size: int) -> None:
    if type(chunk_size) is not int or not MIN_CHUNK_SIZE <= chunk_size <= MAX_CHUNK_SIZE:
        raise ManifestError(
            f"chunk size must be {MIN_CHUNK_SIZE} to {MAX_CHUNK_SIZE} bytes, got {chunk_size!r}"
        )


def check_path(path: str) -> None:
    """A file's path inside a model: relative, '/'-separated, no way out of the model's folder
    and nothing hidden (the agent's own folder among them; a peer's path is joined onto a
    folder here)."""
    if not 1 <= len(path) <= MAX_PATH:
        raise ManifestError(f"a path is 1 to {MAX_PATH} characters, got {len(path)}")
    if path.startswith("/") or "\\" in path or _CONTROL.search(path):
        raise ManifestError(f"path {path!r} is not a plain relative path")
    parts = path.split("/")
    if any(part in ("", ".", "..") for part in parts):
        raise ManifestError(f"path {path!r} has an empty, '.' or '..' part")
    if any(part.startswith(".") for part in parts):
        raise ManifestError(
            f"path {path!r} is hidden: hidden files and folders ({RESERVED_PREFIX}, the agent's "
            "own, .git, .cache) are no part of a model"
        )


def check_model(model: str) -> None:
    """ORG/NAME, as the manifest holds it (no revision)."""
    if not isinstance(model, str) or not REPO.fullmatch(model):
        raise ManifestError(f"model {model!r} is not a Hugging Face id ORG/NAME")


class FileHasher:
    """A file's SHA-256 and its chunk hashes, fed its bytes in order in any slices."""

    def __init__(self, chunk_size: int) -> None:
        check_chunk_size(chunk_size)
        self.chunk_size = chunk_size
        self.size = 0
        self._whole = hashlib.sha256()
        self._chunk = hashlib.sha256()
        self._in_chunk = 0
        self.chunks: list[str] = []

    def update(self, data: bytes | memoryview) -> None:
        view = memoryview(data)
        self._whole.update(view)
        self.size += len(view)
        while view:
            take = min(len(view), self.chunk_size - self._in_chunk)
            self._chunk.update(view[:take])
            self._in_chunk += take
            view = view[take:]
            if self._in_chunk == self.chunk_size:
                self._close_chunk()

    def _close_chunk(self) -> None:
        self.chunks.append(self._chunk.hexdigest())
        self._chunk = hashlib.sha256()
        self._in_chunk = 0

    def finish(self, path: str) -> FileEntry:
        if self._in_chunk:
            self._close_chunk()
        return FileEntry(path, self.size, self._whole.hexdigest(), tuple(self.chunks))


def chunk_hash(data: bytes | memoryview) -> str:
    return hashlib.sha256(data).hexdigest()


def build(
    model: str, revision: str | None, chunk_size: int, files: Iterable[FileEntry]
) -> Manifest:
    """A manifest from hashed files (any order); `revision` None: the content's own. Checked as
    a received one is, so nothing invalid is ever served."""
    ordered = tuple(sorted(files, key=lambda entry: entry.path))
    manifest = Manifest(model, revision or content_revision(ordered), chunk_size, ordered)
    return manifest_from_wire(manifest.to_dict())


_HEX64 = s.text(64, least=64)
FILE = s.fields(
    {
        "path": s.text(MAX_PATH, least=1),
        "size": s.integer(0),
        "sha256": _HEX64,
        "chunks": s.list_of(_HEX64),
    }
)
MANIFEST = s.fields(
    {
        "format": s.integer(FORMAT, FORMAT),
        "model": s.text(256, least=3),
        "revision": s.text(40, least=40),
        "chunk_size": s.integer(MIN_CHUNK_SIZE, MAX_CHUNK_SIZE),
        "files": s.list_of(FILE, MAX_FILES),
    }
)


def manifest_from_wire(raw: Any, digest: str | None = None) -> Manifest:
    """A manifest as a peer (or a file) holds it, every rule of §19 checked, the first problem
    named (`files[3].chunks has 2 hashes, ...`); with `digest`, it must be that one's."""
    try:
        MANIFEST(raw)
    except s.Invalid as exc:
        raise ManifestError(f"manifest: {exc}") from None
    try:
        check_model(raw["model"])
    except ManifestError as exc:
        raise ManifestError(f"manifest: {exc}") from None
    if not COMMIT.fullmatch(raw["revision"]):
        raise ManifestError(f"manifest: revision {raw['revision']!r} is not 40 hex digits")
    chunk_size = raw["chunk_size"]
    files: list[FileEntry] = []
    seen: set[str] = set()
    for index, item in enumerate(raw["files"]):
        where = f"manifest: files[{index}]"
        try:
            check_path(item["path"])
        except ManifestError as exc:
            raise ManifestError(f"{where}: {exc}") from None
        if files and item["path"] <= files[-1].path:
            raise ManifestError(f"{where}.path {item['path']!r} is out of order or repeated")
        parts = item["path"].split("/")
        if any("/".join(parts[:end]) in seen for end in range(1, len(parts))):
            raise ManifestError(f"{where}.path {item['path']!r} is inside another file")
        bad = next((h for h in (item["sha256"], *item["chunks"]) if not HEX64.fullmatch(h)), None)
        if bad is not None:
            raise ManifestError(f"{where}: hash {bad!r} is not 64 lowercase hex digits")
        expected = chunk_count(item["size"], chunk_size)
        if len(item["chunks"]) != expected:
            raise ManifestError(
                f"{where}.chunks has {len(item['chunks'])} hashes, a {item['size']}-byte "
                f"file at {chunk_size} per chunk has {expected}"
            )
        seen.add(item["path"])
        files.append(FileEntry(item["path"], item["size"], item["sha256"], tuple(item["chunks"])))
    manifest = Manifest(raw["model"], raw["revision"], chunk_size, tuple(files))
    if digest is not None and manifest.digest != digest:
        raise ManifestError(f"manifest: its digest is {manifest.digest}, not {digest} as asked")
    return manifest


def first_difference(held: Manifest, wanted: Manifest) -> str | None:
    """One line naming the first file where two manifests of a model differ; None when equal."""
    if held.digest == wanted.digest:
        return None
    if held.chunk_size != wanted.chunk_size:
        return f"chunk size {held.chunk_size}, not {wanted.chunk_size}"
    for path in sorted(held.by_path.keys() | wanted.by_path.keys()):
        mine, theirs = held.by_path.get(path), wanted.by_path.get(path)
        if mine is None:
            return f"{path} is missing"
        if theirs is None:
            return f"{path} is not in the manifest"
        if mine.size != theirs.size:
            return f"{path} is {mine.size} bytes, not {theirs.size}"
        if mine.sha256 != theirs.sha256:
            return f"{path} differs (sha256 {mine.sha256[:12]}…, not {theirs.sha256[:12]}…)"
    return f"revision {held.revision}, not {wanted.revision}"
