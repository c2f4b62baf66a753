"""This agent's staging tasks (docs/protocol.md §19): a source task resolves (or downloads) a
model and hashes it into its manifest; a receiver task (agent.staging.receiving) fetches one from
a peer. Every refusal that needs no network or hashing (bad-model, bad-store, no-space,
mismatch, busy, untrusted-peer) is made before a task starts, on the daemon's thread, so an
error reply never leaves anything behind."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agent.profiling.hf_models import ModelNotFound, offline, resolve
from agent.staging.fetch import Cancelled
from agent.staging.receiving import Receiving
from agent.staging.store import StoreError, hash_files
from agent.staging.task import DEFAULT_BUSY_RATE, Task, parse_model
from shared.benchmark.matrix import ModelId
from shared.staging import shapes as st
from shared.staging.manifest import (
    COMMIT,
    DEFAULT_CHUNK_SIZE,
    ManifestError,
    build,
    check_chunk_size,
)
from shared.wire import protocol as p

__all__ = ["DEFAULT_BUSY_RATE", "StageTasks", "parse_model"]


class StageTasks(Receiving):
    """Every staging task of this agent: a source's here, a receiver's in Receiving."""

    def prepare(
        self, model: str, download: bool, path: str | None, chunk_size: int | None
    ) -> dict[str, Any]:
        model_id = parse_model(model)
        chunk_size = chunk_size or DEFAULT_CHUNK_SIZE
        try:
            check_chunk_size(chunk_size)
        except ManifestError as exc:
            raise StoreError(p.BAD_BODY, f"stage.prepare: {exc}") from None
        running = self.running(model_id.repo)
        if running is not None:
            if running.role == st.SOURCE:
                return self.view(running)
            raise StoreError(p.BUSY, f"busy: {model_id.repo} is being fetched here")
        folder: Path | None = None
        if path is not None:
            folder = Path(path).expanduser()
            if not folder.is_dir():
                raise StoreError(p.BAD_MODEL, f"{path} is not a directory on this agent")
        elif not download or offline():
            folder = self._held(model_id)  # bad-model at once when not held
        asked = model_id.revision
        revision = asked if path is not None and asked and COMMIT.fullmatch(asked) else None
        task = Task(model_id.repo, st.SOURCE, st.HASHING if folder else st.RESOLVING)
        self.start(task, lambda t: self._prepare(t, model_id, folder, path, chunk_size, revision))
        return self.view(task)

    def _held(self, model_id: ModelId) -> Path:
        try:
            return resolve(model_id, download=False, cache_dir=self.store.root).path
        except ModelNotFound as exc:
            raise StoreError(p.BAD_MODEL, str(exc)) from None

    def _prepare(
        self,
        task: Task,
        model_id: ModelId,
        folder: Path | None,
        path: str | None,
        chunk_size: int,
        revision: str | None = None,
    ) -> None:
        if folder is None:
            task.state = st.DOWNLOADING
            folder = resolve(model_id, download=True, cache_dir=self.store.root).path
        task.state = st.HASHING

        def hashed(count: int) -> None:
            if task.cancelled.is_set():
                raise Cancelled()
            task.add(count)

        if path is not None:
            entries = hash_files(folder, chunk_size, hashed)
            manifest = build(model_id.repo, revision, chunk_size, entries)
        else:
            revision = folder.name
            task.revision = revision
            manifest, problem = self.store.snapshot_manifest(
                model_id.repo, revision, chunk_size, progress=hashed
            )
            if problem is not None:
                task.end(
                    st.FAILED,
                    f"mismatch: {model_id.repo}@{revision} differs from what was staged: {problem}",
                )
                return
        task.ready(manifest)
        self.server.add(manifest, folder)
