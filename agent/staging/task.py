"""A staging task (docs/protocol.md §19, A task) and the table of them: one per model on this
agent, the latest kept, each on its own thread. Every failure of a task's work ends it
`failed` with one line; a bug fails the task, never the daemon."""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import zmq

from agent.profiling.hf_models import ModelNotFound
from agent.staging.fetch import Cancelled, TransferFailed
from agent.staging.serving import ChunkServer
from agent.staging.store import ModelStore, StoreError
from shared.benchmark.matrix import ModelId, hf_model_id
from shared.io.keys import Keypair
from shared.safe_text import DETAIL_CAP, shown
from shared.staging import shapes as st
from shared.staging.manifest import COMMIT, Manifest, ManifestError
from shared.wire import protocol as p

log = logging.getLogger("agent.staging")
RATE_WINDOW_S = 5.0
DEFAULT_BUSY_RATE = 20e6
"""Bytes/s a receiver fetches at, at most, while a job runs on it (`--stage-busy-rate`, MB/s)."""


class Task:
    """One model's staging on this agent, as `stage.*` replies show it."""

    def __init__(self, repo: str, role: str, state: str) -> None:
        self.repo = repo
        self.role = role
        self.state = state
        self.revision: str | None = None
        self.digest: str | None = None
        self.bytes = 0
        self.total: int | None = None
        self.resumed = 0
        self.capped = False
        self.source: str | None = None
        self.files = 0
        self.files_done = 0
        self.error: str | None = None
        self.started = time.time()
        self.started_monotonic = time.monotonic()
        self.finished: float | None = None
        self.cancelled = threading.Event()
        self.thread: threading.Thread | None = None
        self._window: collections.deque[tuple[float, int]] = collections.deque()
        self._lock = threading.Lock()

    @property
    def under_way(self) -> bool:
        return self.state in st.UNDER_WAY

    def add(self, count: int) -> None:
        with self._lock:
            self.bytes += count
            now = time.monotonic()
            self._window.append((now, count))
            while self._window and self._window[0][0] < now - RATE_WINDOW_S:
                self._window.popleft()

    def rate(self) -> float | None:
        """Bytes/s over the last RATE_WINDOW_S seconds; None when it moves nothing, or before
        two seconds of it (a rate of a few chunks is noise)."""
        with self._lock:
            if self.state not in (st.FETCHING, st.HASHING, st.DOWNLOADING):
                return None
            now = time.monotonic()
            elapsed = now - self.started_monotonic
            if elapsed < 2.0:
                return None
            while self._window and self._window[0][0] < now - RATE_WINDOW_S:
                self._window.popleft()
            return sum(count for _, count in self._window) / min(elapsed, RATE_WINDOW_S)

    def end(self, state: str, error: str | None = None) -> None:
        self.state = state
        self.error = None if error is None else shown(error, DETAIL_CAP)
        self.finished = time.time()
        self.capped = False

    def ready(self, manifest: Manifest) -> None:
        """Held whole (a source hashed it, a receiver placed it): the manifest's figures."""
        self.revision, self.digest = manifest.revision, manifest.digest
        self.total, self.files = manifest.total, len(manifest.files)
        self.files_done = self.files
        self.bytes = manifest.total
        self.end(st.READY)

    def to_dict(self, served: int) -> dict[str, Any]:
        return {
            "model": self.repo,
            "revision": self.revision,
            "role": self.role,
            "state": self.state,
            "digest": self.digest,
            "bytes": self.bytes,
            "total": self.total,
            "resumed": self.resumed,
            "rate": self.rate(),
            "capped": self.capped,
            "source": self.source,
            "served": served,
            "files": self.files,
            "files_done": self.files_done,
            "error": self.error,
            "started": self.started,
            "finished": self.finished,
        }


def asked_ref(model_id: ModelId, revision: str) -> str | None:
    """The ref a staged revision is named by: the branch or tag asked (`@v1`), `main` for an id
    asked without one, none for one asked by its commit. StoreError(bad-model) for an id asked
    by another commit than the one staged."""
    asked = model_id.revision
    if asked is None:
        return "main"
    if asked == revision:
        return None
    if COMMIT.fullmatch(asked):
        raise StoreError(
            p.BAD_MODEL, f"{model_id.repo}@{asked} asks commit {asked}, not {revision} as staged"
        )
    return asked


def parse_model(model: str) -> ModelId:
    found = hf_model_id(model)
    if found is None:
        raise StoreError(p.BAD_MODEL, f"model {model!r} is not a Hugging Face id ORG/NAME[@REV]")
    return found


class TaskTable:
    """The tasks by model, over the store, the chunk server and the daemon's own keypair; each
    runs on its own thread (start)."""

    def __init__(
        self,
        store: ModelStore,
        server: ChunkServer,
        keypair: Keypair | None,
        busy: Callable[[], bool],
        busy_rate: float = DEFAULT_BUSY_RATE,
    ) -> None:
        self.store = store
        self.server = server
        self.keypair = keypair
        self.busy = busy
        self.busy_rate = busy_rate
        self.tasks: dict[str, Task] = {}
        self._ctx = zmq.Context.instance()

    def status(self, repo: str | None = None) -> list[dict[str, Any]]:
        tasks = [t for t in self.tasks.values() if repo is None or t.repo == repo]
        return [task.to_dict(self.server.served(task.digest)) for task in tasks]

    def view(self, task: Task) -> dict[str, Any]:
        return task.to_dict(self.server.served(task.digest))

    def start(self, task: Task, work: Callable[[Task], None]) -> None:
        self.tasks[task.repo] = task

        def run() -> None:
            try:
                work(task)
            except Cancelled:
                task.end(st.CANCELLED, "cancelled")
            except (TransferFailed, StoreError, ModelNotFound, ManifestError) as exc:
                task.end(st.FAILED, str(exc))
            except OSError as exc:
                task.end(st.FAILED, f"{exc.filename or 'the store'}: {exc.strerror or exc}")
            except Exception as exc:  # a bug fails one task, never the daemon
                log.exception("staging %s", task.repo)
                task.end(st.FAILED, f"internal error: {type(exc).__name__}: {exc}")
            else:
                return
            log.info("staging %s: %s", task.repo, task.error)

        task.thread = threading.Thread(target=run, name=f"stage {task.repo}", daemon=True)
        task.thread.start()

    def running(self, repo: str) -> Task | None:
        task = self.tasks.get(repo)
        return task if task is not None and task.under_way else None

    def cancel(self, model: str) -> dict[str, Any]:
        repo = parse_model(model).repo
        task = self.tasks.get(repo)
        if task is None:
            raise StoreError(p.NOT_HELD, f"no staging of {repo} here")
        task.cancelled.set()
        if task.thread is not None:
            task.thread.join(timeout=0.5)  # its state says `cancelled` once it has stopped
        return self.view(task)

    def close(self) -> None:
        for task in self.tasks.values():
            task.cancelled.set()
        self.server.close()
