"""The receiving side of staging (docs/protocol.md §19, What the agent does): every check a
stage.fetch makes before any byte moves, then the transfer on the task's thread, resumed from
what an earlier one verified, and the model placed. A base of agent.staging.tasks.StageTasks."""

from __future__ import annotations

import shutil
from typing import Any

from agent.staging.fetch import Pacer, Progress, Transfer, TransferFailed, connect, read_manifest
from agent.staging.partial import PartialTransfer
from agent.staging.store import StoreError
from agent.staging.task import Task, TaskTable, asked_ref, parse_model
from shared.io.trust import peer_key, split_peer
from shared.staging import shapes as st
from shared.staging.manifest import COMMIT, HEX64, Manifest, first_difference
from shared.wire import protocol as p


class Receiving(TaskTable):
    """stage.fetch: a receiver's task."""

    def fetch(self, body: dict[str, Any]) -> dict[str, Any]:
        model_id = parse_model(body["model"])
        repo, revision, digest = model_id.repo, body["revision"], body["digest"]
        if not COMMIT.fullmatch(revision):
            raise StoreError(p.BAD_MODEL, f"revision {revision!r} is not a 40-hex-digit commit")
        asked_ref(model_id, revision)  # bad-model before anything else
        if not HEX64.fullmatch(digest):
            raise StoreError(p.BAD_BODY, f"stage.fetch: digest {digest!r} is not 64 hex digits")
        if not 0 <= body["size"] <= p.MAX_WIRE_INT:
            raise StoreError(p.BAD_BODY, f"stage.fetch: size must be 0 or more, got {body['size']}")
        source, key = body["source"], body["source_key"]
        host, port = split_peer(source)
        if port is None:
            raise StoreError(p.BAD_BODY, f"stage.fetch: source {source!r} is not HOST:PORT")
        if key is None and self.keypair is not None:
            trusted = peer_key(host, port=port)
            if trusted is None:
                raise StoreError(
                    p.UNTRUSTED_PEER,
                    f"the source {source} is not trusted here as a peer: run agent keys trust "
                    f"KEY --peer {source} (KEY: its `agent keys show`)",
                )
            key = trusted.key
        running = self.running(repo)
        if running is not None:
            if running.role == st.RECEIVER and running.digest == digest:
                return self.view(running)
            raise StoreError(p.BUSY, f"busy: {repo} is being staged here ({running.state})")
        record = self.store.recorded(repo, revision)
        if (
            record is not None
            and record.manifest.digest == digest
            and self.store.unchanged(record, repo, revision)
        ):
            return self._held_copy(repo, record.manifest)
        self.store.check_writable()
        self._check_room(repo, revision, digest, body["size"])
        task = Task(repo, st.RECEIVER, st.FETCHING)
        task.revision, task.digest, task.total, task.source = revision, digest, body["size"], source
        ref = asked_ref(model_id, revision)
        self.start(task, lambda t: self._fetch(t, key, ref, bool(body["restage"])))
        return self.view(task)

    def _check_room(self, repo: str, revision: str, digest: str, size: int) -> None:
        """StoreError(no-space) unless the store holds `size` bytes, less what a partial
        transfer of this digest verified already, plus the margin."""
        folder = self.store.partial_dir(repo, revision)
        partial = PartialTransfer.saved_manifest(folder)
        verified = 0
        if partial is not None and partial.digest == digest:
            verified = PartialTransfer.verified_bytes(folder, partial)
        self.store.check_room(repo, max(0, size - verified), size)

    def _held_copy(self, repo: str, manifest: Manifest) -> dict[str, Any]:
        """A copy held with the digest asked, its files as they were staged: ready at once (a
        file that changed since is hashed again on the task's thread, _replace_held)."""
        task = Task(repo, st.RECEIVER, st.READY)
        task.ready(manifest)
        self.tasks[repo] = task
        self.server.add(manifest, self.store.snapshot(repo, manifest.revision))
        return self.view(task)

    def _fetch(self, task: Task, key: str | None, ref: str | None, restage: bool) -> None:
        assert task.source is not None and task.digest is not None and task.revision is not None
        if self.keypair is None and key is not None:
            raise TransferFailed("this agent runs --insecure: it has no key to fetch with")
        with self.store.lock(task.repo):
            client = connect(self._ctx, task.source, key, self.keypair)
            try:
                manifest = read_manifest(client, task.digest, task.cancelled)
                if (manifest.model, manifest.revision) != (task.repo, task.revision):
                    raise TransferFailed(
                        f"source {task.source} serves {manifest.model}@{manifest.revision} "
                        f"under that digest, not {task.repo}@{task.revision}"
                    )
                if manifest.total != task.total:  # the size asked was not the manifest's
                    self._check_room(task.repo, task.revision, task.digest, manifest.total)
                task.total, task.files = manifest.total, len(manifest.files)
                if not self._replace_held(task, manifest, restage):
                    return
                self._transfer(task, client, manifest, ref)
            finally:
                client.close()

    def _replace_held(self, task: Task, manifest: Manifest, restage: bool) -> bool:
        """A snapshot of this revision held already (a download's, or one staged or hashed at
        another chunk size, or changed since): hashed at the manifest's chunk size, kept when
        its bytes are the manifest's (no byte moves), failed naming the first file that differs
        or, with `restage`, fetched again (True: fetch)."""
        repo, revision = task.repo, manifest.revision
        if not self.store.snapshot(repo, revision).is_dir():
            return True
        held, _ = self.store.snapshot_manifest(repo, revision, manifest.chunk_size, restage)
        problem = first_difference(held, manifest)
        if problem is None:
            self.store.write_record(manifest, self.store.snapshot(repo, revision))
            task.ready(manifest)
            self.server.add(manifest, self.store.snapshot(repo, revision))
            return False
        if not restage:
            task.end(
                st.FAILED,
                f"mismatch: {repo}@{revision} held here differs: {problem}; stage it again "
                "with restage to replace it",
            )
            return False
        return True

    def _transfer(self, task: Task, client: Any, manifest: Manifest, ref: str | None) -> None:
        folder = self.store.partial_dir(task.repo, manifest.revision)
        partial = PartialTransfer.open(folder, manifest)
        task.resumed = partial.held_bytes()
        task.bytes = task.resumed
        self.server.add(manifest, partial=partial)
        progress = Progress(task.add, lambda: _count_file(task), lambda on: _cap(task, on))
        pacer = Pacer(self.busy, self.busy_rate)
        try:
            Transfer(client, partial, pacer, progress, task.cancelled).run()
            placed = self.store.place(manifest, partial.files, ref)
        except BaseException:
            partial.end(None)
            raise
        partial.end(placed)
        shutil.rmtree(folder, ignore_errors=True)
        self.server.add(manifest, placed)
        task.ready(manifest)


def _count_file(task: Task) -> None:
    task.files_done += 1


def _cap(task: Task, on: bool) -> None:
    task.capped = on
