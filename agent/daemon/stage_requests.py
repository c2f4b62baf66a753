"""The staging requests (docs/protocol.md §19): a coordinator's stage.* and models.*, and a peer
agent's stage.manifest and stage.chunk. Every one is answered at once or on a worker: hashing,
downloads and transfers run on their tasks' threads (agent.staging.tasks), chunks are read on
the chunk server's (agent.staging.serving), and models.list, which may hash, is deferred. A
base of agent.daemon.requests.Requests."""

from __future__ import annotations

from agent.daemon.deferred import DeferredReplies
from agent.daemon.handling import Reply, Request, handles
from agent.staging.listing import held_models
from agent.staging.serving import ChunkServer
from agent.staging.store import ModelStore, StoreError
from agent.staging.tasks import StageTasks, parse_model
from shared.wire import protocol as p


class StageRequests:
    """The handlers of stage.* and models.*."""

    staging: StageTasks
    chunks: ChunkServer
    store: ModelStore
    deferred: DeferredReplies

    @handles("stage.prepare")
    def stage_prepare(self, request: Request) -> Reply:
        body = request.body
        try:
            task = self.staging.prepare(
                body["model"], bool(body["download"]), body["path"], body["chunk_size"]
            )
        except StoreError as exc:
            raise request.refuse(exc.code, exc.message) from None
        return Reply("stage.prepare.ok", task)

    @handles("stage.fetch")
    def stage_fetch(self, request: Request) -> Reply:
        try:
            task = self.staging.fetch(request.body)
        except StoreError as exc:
            raise request.refuse(exc.code, exc.message) from None
        return Reply("stage.fetch.ok", task)

    @handles("stage.status")
    def stage_status(self, request: Request) -> Reply:
        model = request.body["model"]
        try:
            repo = None if model is None else parse_model(model).repo
        except StoreError as exc:
            raise request.refuse(exc.code, exc.message) from None
        return Reply("stage.status.ok", {"tasks": self.staging.status(repo)})

    @handles("stage.cancel")
    def stage_cancel(self, request: Request) -> Reply:
        try:
            return Reply("stage.cancel.ok", self.staging.cancel(request.body["model"]))
        except StoreError as exc:
            raise request.refuse(exc.code, exc.message) from None

    @handles("models.list")
    def models_list(self, request: Request) -> None:
        verify = bool(request.body["verify"])
        self.deferred.submit(
            request.identity,
            request.message.id,
            "models.list.ok",
            lambda: {"store": str(self.store.root), "models": held_models(self.store, verify)},
        )

    @handles("models.remove")
    def models_remove(self, request: Request) -> Reply:
        try:
            model_id = parse_model(request.body["model"])
            if self.staging.running(model_id.repo):
                raise StoreError(p.BUSY, f"busy: {model_id.repo} is being staged here")
            removed = self.store.remove(
                model_id.repo, model_id.revision, bool(request.body["partial"])
            )
        except StoreError as exc:
            raise request.refuse(exc.code, exc.message) from None
        for name in removed:
            self.chunks.forget(name)
        return Reply("models.remove.ok", {"removed": removed})

    @handles("stage.manifest")
    def stage_manifest(self, request: Request) -> Reply:
        body = request.body
        try:
            page = self.chunks.manifest_page(body["digest"], body["offset"])
        except p.ProtocolError as exc:
            raise request.refuse(exc.code, exc.message) from None
        return Reply("stage.manifest.ok", page)

    @handles("stage.chunk")
    def stage_chunk(self, request: Request) -> None:
        """Read on the chunk server's workers: the loop sends the reply when it is ready."""
        self.chunks.submit(request.identity, request.message)
