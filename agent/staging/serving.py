"""What this agent serves to its peers (docs/protocol.md §19): the manifests it holds or is
fetching, by digest, a page at a time, and their chunks, read on worker threads so the daemon's
loop never waits on a disk; a chunk a fetch here has not verified yet is waited for (a
follower's), at most FOLLOW_WAIT_S. Replies are handed to the loop, which alone owns the socket,
through `finished()`, waking it when one is ready."""

from __future__ import annotations

import json
import logging
import queue
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.staging.partial import PartialTransfer
from agent.staging.store import ModelStore
from shared.io.queues import drained
from shared.staging.manifest import FORMAT, Manifest, ManifestError
from shared.staging.shapes import MANIFEST_PAGE_BYTES
from shared.wire import protocol as p

log = logging.getLogger("agent.staging")
FOLLOW_WAIT_S = 10.0
READERS = 4
MAX_PENDING = 8


@dataclass
class Served:
    """A manifest this agent serves: from `root` (a snapshot, a directory), or from the
    transfer fetching it."""

    manifest: Manifest
    root: Path | None = None
    partial: PartialTransfer | None = None
    served: int = 0
    """Chunks served, to every peer."""
    lock: threading.Lock = field(default_factory=threading.Lock)


Answer = tuple[bytes, p.Message]
"""The identity to send to, and the reply."""


class ChunkServer:
    def __init__(self, store: ModelStore, wake: Callable[[], None]) -> None:
        """`wake` wakes the daemon's loop (from any thread) to send what finished."""
        self.store = store
        self._served: dict[str, Served] = {}
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=READERS, thread_name_prefix="stage-chunk")
        self._answers: queue.SimpleQueue[Answer] = queue.SimpleQueue()
        self._wake = wake
        self._pending: dict[bytes, int] = {}
        """Chunks asked and not yet answered, by connection (submit())."""
        self._digests: dict[Path, tuple[int | None, str]] = {}
        """A record's mtime and the digest it holds (find())."""

    def add(
        self, manifest: Manifest, root: Path | None = None, partial: PartialTransfer | None = None
    ) -> Served:
        """Serve `manifest` from `root` or from `partial` (replacing how it was served: a
        finished transfer's snapshot takes over from it); the count served is kept."""
        with self._lock:
            held = self._served.get(manifest.digest)
            entry = Served(manifest, root, partial, held.served if held else 0)
            self._served[manifest.digest] = entry
            return entry

    def drop(self, digest: str) -> None:
        with self._lock:
            self._served.pop(digest, None)

    def forget(self, name: str) -> None:
        """Serve no more what `models.remove` removed (`ORG/NAME@REV`)."""
        with self._lock:
            for digest, entry in list(self._served.items()):
                if f"{entry.manifest.model}@{entry.manifest.revision}" == name:
                    del self._served[digest]

    def served(self, digest: str | None) -> int:
        with self._lock:
            entry = self._served.get(digest or "")
            return entry.served if entry else 0

    def find(self, digest: str) -> Served | None:
        """What serves `digest`: registered, or a snapshot of the store recorded with it (an
        agent restarted since it staged it)."""
        with self._lock:
            entry = self._served.get(digest)
        if entry is not None:
            return entry
        for record_path, (repo, revision) in self._records().items():
            if self._digests.get(record_path, (None, ""))[1] == digest:
                record = self.store.recorded(repo, revision)
                if record is not None and record.manifest.digest == digest:
                    return self.add(record.manifest, self.store.snapshot(repo, revision))
        return None

    def _records(self) -> dict[Path, tuple[str, str]]:
        """Every record of a snapshot in the store, each read once per change (its mtime) into
        `_digests`: a peer asking for digests this agent lacks costs a listing, not a read of
        every manifest."""
        found = {}
        for repo in self.store.repos():
            for revision in self.store.revisions(repo)[0]:
                path = self.store.record_path(repo, revision)
                try:
                    mtime = path.stat().st_mtime_ns
                except OSError:
                    continue
                found[path] = (repo, revision)
                if self._digests.get(path, (None, ""))[0] != mtime:
                    try:
                        digest = json.loads(path.read_text(encoding="utf-8")).get("digest")
                    except (OSError, ValueError, AttributeError):
                        digest = None
                    self._digests[path] = (mtime, digest if isinstance(digest, str) else "")
        return found

    def manifest_page(self, digest: str, offset: int | None) -> dict[str, Any]:
        """stage.manifest.ok's body; ProtocolError not-held or bad-body."""
        entry = self.find(digest)
        if entry is None:
            raise p.ProtocolError(p.NOT_HELD, f"stage.manifest: no model with digest {digest} here")
        files = entry.manifest.files
        start = offset or 0
        if not 0 <= start <= len(files):
            raise p.ProtocolError(
                p.BAD_BODY, f"stage.manifest: offset must be 0 to {len(files)}, got {start}"
            )
        page: list[dict[str, Any]] = []
        size = 0
        for item in files[start:]:
            encoded = item.to_dict()
            cost = 80 + len(item.path) + 67 * (len(item.chunks) + 1)
            if page and size + cost > MANIFEST_PAGE_BYTES:
                break
            page.append(encoded)
            size += cost
        following = start + len(page)
        return {
            "format": FORMAT,
            "model": entry.manifest.model,
            "revision": entry.manifest.revision,
            "chunk_size": entry.manifest.chunk_size,
            "files": page,
            "offset": start,
            "next": following if following < len(files) else None,
            "digest": digest,
        }

    def submit(self, identity: bytes, request: p.Message) -> None:
        """Read the chunk `request` (a stage.chunk) asks for on a worker; its reply (or error)
        comes out of finished(). A connection with MAX_PENDING chunks not yet answered is
        answered `busy` at once: a peer that asks without waiting cannot fill this agent's
        memory with chunks (an honest one has one in flight per file)."""
        with self._lock:
            pending = self._pending.get(identity, 0)
            if pending >= MAX_PENDING:
                busy = (
                    f"stage.chunk: {pending} chunks asked by this connection are not answered yet"
                )
                self._answers.put((identity, p.error(p.BUSY, busy, re=request.id)))
                self._wake()
                return
            self._pending[identity] = pending + 1
        self._pool.submit(self._answer, identity, request)

    def _answer(self, identity: bytes, request: p.Message) -> None:
        try:
            body = self._chunk(request.body["digest"], request.body["path"], request.body["index"])
            reply = p.make("stage.chunk.ok", body, re=request.id)
        except p.ProtocolError as exc:
            reply = p.error(exc.code, exc.message, re=request.id)
        except OSError as exc:
            reply = p.error(p.NOT_HELD, f"stage.chunk: cannot read it here: {exc}", re=request.id)
        except Exception as exc:  # a bug answers one request, never kills a reader
            log.exception("serving a chunk")
            reply = p.error(p.INTERNAL, f"{type(exc).__name__}: {exc}", re=request.id)
        with self._lock:
            left = self._pending.pop(identity, 1) - 1
            if left:
                self._pending[identity] = left
        self._answers.put((identity, reply))
        self._wake()

    def _chunk(self, digest: str, path: str, index: int) -> dict[str, Any]:
        entry = self.find(digest)
        if entry is None:
            raise p.ProtocolError(p.NOT_HELD, f"stage.chunk: no model with digest {digest} here")
        try:
            entry.manifest.chunk_span(path, index)
        except ManifestError as exc:
            raise p.ProtocolError(p.BAD_BODY, f"stage.chunk: {exc}") from None
        if entry.root is not None:
            data = read_chunk(entry.manifest, entry.root, path, index)
        else:
            assert entry.partial is not None
            data = self._followed(entry.partial, path, index)
        with entry.lock:
            entry.served += 1
        return {"digest": digest, "path": path, "index": index, "data": data}

    @staticmethod
    def _followed(partial: PartialTransfer, path: str, index: int) -> bytes:
        with partial.changed:
            ready = partial.changed.wait_for(
                lambda: index in partial.verified.get(path, ()) or partial.closed,
                FOLLOW_WAIT_S,
            )
            if partial.closed and partial.placed_at is None:
                raise p.ProtocolError(
                    p.NOT_HELD, "stage.chunk: the transfer here ended before it got that chunk"
                )
            if not ready:
                raise p.ProtocolError(
                    p.NOT_YET, f"stage.chunk: chunk {index} of {path} has not arrived here yet"
                )
        return partial.read(path, index)

    def finished(self) -> list[Answer]:
        """Every reply ready, once; the loop sends them."""
        return drained(self._answers)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def read_chunk(manifest: Manifest, root: Path, path: str, index: int) -> bytes:
    offset, length = manifest.chunk_span(path, index)
    with open(root / path, "rb") as handle:
        handle.seek(offset)
        return handle.read(length)
