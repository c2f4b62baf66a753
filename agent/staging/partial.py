"""A transfer under way, on disk, so that a cut one resumes (docs/protocol.md §19, The transfer):

    partial-REV/manifest.json        the manifest being fetched (its digest names the transfer)
    partial-REV/files/PATH           each file, written chunk by chunk at its offset
    partial-REV/records/PATH         the record of PATH's verified chunks: one index per line

A chunk's index is appended to its record only after its bytes were checked and written, so
whatever the record lists is on disk; a line cut by a kill is not a line. On a restart only the
chunks the record does not list are fetched again: at most the one that was in flight.

Thread-safe: the fetch writes while the chunk server reads what a follower asks for, waiting on
`changed` for a chunk not verified yet.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
from pathlib import Path

from shared.staging.manifest import (
    FileHasher,
    Manifest,
    ManifestError,
    chunk_hash,
    manifest_from_wire,
)

MANIFEST = "manifest.json"
FILES = "files"
RECORDS = "records"


class PartialTransfer:
    """The files of one manifest being fetched into `folder`, with what is verified of each."""

    def __init__(self, folder: Path, manifest: Manifest) -> None:
        self.folder = folder
        self.manifest = manifest
        self.changed = threading.Condition()
        """Notified with every chunk verified (and when the transfer ends)."""
        self.verified: dict[str, set[int]] = {}
        self.closed = False
        """The transfer ended (placed, failed or cancelled): a follower waits no more."""
        self.placed_at: Path | None = None
        """Where the files went once placed: a follower's next chunk is read from there."""

    @property
    def files(self) -> Path:
        return self.folder / FILES

    @classmethod
    def open(cls, folder: Path, manifest: Manifest) -> PartialTransfer:
        """The transfer of `manifest` in `folder`: resumed when the folder holds the same
        manifest, started afresh (whatever was there removed) otherwise."""
        if cls.saved_manifest(folder) != manifest:
            shutil.rmtree(folder, ignore_errors=True)
            (folder / FILES).mkdir(parents=True)
            (folder / RECORDS).mkdir()
            temporary = folder / f".{MANIFEST}.tmp"
            temporary.write_text(json.dumps(manifest.to_dict()), encoding="utf-8")
            os.replace(temporary, folder / MANIFEST)
        transfer = cls(folder, manifest)
        for entry in manifest.files:
            transfer.verified[entry.path] = read_record(folder, entry.path, len(entry.chunks))
        return transfer

    @staticmethod
    def saved_manifest(folder: Path) -> Manifest | None:
        try:
            raw = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
            return manifest_from_wire(raw)
        except (OSError, ValueError, ManifestError):
            return None

    @staticmethod
    def verified_bytes(folder: Path, manifest: Manifest) -> int:
        """Bytes the records of `folder` list as verified (for `agent models`)."""
        total = 0
        for entry in manifest.files:
            for index in read_record(folder, entry.path, len(entry.chunks)):
                total += manifest.chunk_span(entry.path, index)[1]
        return total

    def held_bytes(self) -> int:
        with self.changed:
            return sum(
                self.manifest.chunk_span(path, index)[1]
                for path, indices in self.verified.items()
                for index in indices
            )

    def has(self, path: str, index: int) -> bool:
        with self.changed:
            return index in self.verified.get(path, ())

    def complete(self, path: str) -> bool:
        entry = self.manifest.by_path[path]
        with self.changed:
            return len(self.verified[path]) == len(entry.chunks)

    def resume(self, path: str) -> tuple[FileHasher, int]:
        """The file's hasher fed its verified prefix read back from disk, and the index of the
        first chunk to fetch. A listed chunk that no longer matches its hash (the disk lost it)
        is fetched again, with every chunk after it."""
        entry = self.manifest.by_path[path]
        hasher = FileHasher(self.manifest.chunk_size)
        target = self.files / path
        if not entry.chunks:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.touch()
            return hasher, 0
        index = 0
        with self.changed:
            listed = set(self.verified[path])
        if listed and target.exists():
            with open(target, "rb") as handle:
                while index in listed:
                    data = handle.read(self.manifest.chunk_span(path, index)[1])
                    if chunk_hash(data) != entry.chunks[index]:
                        break
                    hasher.update(data)
                    index += 1
        with self.changed:
            self.verified[path] = set(range(index))
        rewrite_record(self.folder, path, index)
        return hasher, index

    def write(self, path: str, index: int, data: bytes) -> None:
        """Write a chunk whose hash the caller checked, then record it verified."""
        offset, _ = self.manifest.chunk_span(path, index)
        target = self.files / path
        target.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(target, os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            os.pwrite(fd, data, offset)
        finally:
            os.close(fd)
        record = self.folder / RECORDS / path
        record.parent.mkdir(parents=True, exist_ok=True)
        with open(record, "a", encoding="ascii") as handle:
            handle.write(f"{index}\n")
        with self.changed:
            self.verified[path].add(index)
            self.changed.notify_all()

    def forget(self, path: str) -> None:
        """Drop a file that failed its whole-file check: it is fetched again from its start."""
        (self.files / path).unlink(missing_ok=True)
        rewrite_record(self.folder, path, 0)
        with self.changed:
            self.verified[path] = set()

    def read(self, path: str, index: int) -> bytes:
        """A verified chunk's bytes (for a follower), from wherever the file is now."""
        offset, length = self.manifest.chunk_span(path, index)
        with self.changed:
            folder = self.placed_at or self.files
            with open(folder / path, "rb") as handle:
                handle.seek(offset)
                return handle.read(length)

    def end(self, placed_at: Path | None) -> None:
        with self.changed:
            self.placed_at = placed_at
            self.closed = True
            self.changed.notify_all()


def read_record(folder: Path, path: str, chunks: int) -> set[int]:
    """The indices a record lists (whole lines only: a kill may cut the last)."""
    try:
        text = (folder / RECORDS / path).read_text(encoding="ascii", errors="replace")
    except OSError:
        return set()
    lines = text.split("\n")[:-1]  # what follows the last newline was cut
    return {int(line) for line in lines if line.isdigit() and int(line) < chunks}


def rewrite_record(folder: Path, path: str, count: int) -> None:
    """The record of a file whose first `count` chunks are verified, written whole."""
    record = folder / RECORDS / path
    record.parent.mkdir(parents=True, exist_ok=True)
    temporary = record.with_name(f".{record.name}.tmp")
    temporary.write_text("".join(f"{index}\n" for index in range(count)), encoding="ascii")
    os.replace(temporary, record)
